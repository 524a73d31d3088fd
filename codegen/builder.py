"""What every lowering rule builds with: buffers, loops, math calls, constants and error exits.

A lowering rule emits LLVM IR into one function through a `KernelBuilder`. Values live in flat
row-major buffers of the scalar type (`Buf`: a pointer and a static shape); loops run over static
extents, so LLVM sees constant trip counts and vectorises. Scalar accumulators are stack slots
(`local`) that SROA promotes to registers. A rule that can fail at run time (raw `log`) records a
flag and calls `fail_if`, which branches to the function's single exit with a status code, so
cleanup (freeing the workspace) happens in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from llvmlite import ir

from tlc.codegen.target import TargetInfo
from tlc.dialect.shapes import Shape, numel

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)

#: Fast-math flags for reductions whose order the numerical policy leaves to the implementation:
#: reassociation lets LLVM split a sum into vector lanes.
REASSOC = ("reassoc", "contract")


class Status(IntEnum):
    """Return codes of generated entry points (the C ABI's TLC_* constants)."""

    OK = 0
    NULL_POINTER = 1
    LOG_DOMAIN = 2
    OUT_OF_MEMORY = 3
    #: The library was built for CPU features this machine lacks (nothing was executed).
    UNSUPPORTED_CPU = 4


def scalar_type(dtype: np.dtype | type) -> ir.Type:
    return ir.FloatType() if np.dtype(dtype) == np.float32 else ir.DoubleType()


@dataclass(frozen=True)
class Buf:
    """A row-major buffer of scalars with a static shape."""

    ptr: ir.Value
    shape: Shape

    @property
    def size(self) -> int:
        return numel(self.shape)


def strides(shape: Sequence[int]) -> list[int]:
    out, step = [], 1
    for extent in reversed(shape):
        out.append(step)
        step *= extent
    return out[::-1]


def bytes_literal(data: bytes) -> str:
    """`data` as an LLVM string constant, every byte as a `\\xx` escape: made by numpy at memory
    speed (llvmlite's own escaping runs a Python step per byte, most of the time of building a
    module with megabytes of baked weights)."""
    escaped = np.empty((len(data), 3), dtype=np.uint8)
    escaped[:, 0] = ord("\\")
    escaped[:, 1:] = np.frombuffer(data.hex().encode("ascii"), dtype=np.uint8).reshape(-1, 2)
    return 'c"' + escaped.tobytes().decode("ascii") + '"'


class KernelBuilder:
    """An IRBuilder positioned in a function returning an i32 status, plus helpers for rules."""

    def __init__(self, func: ir.Function, dtype: np.dtype | type, info: TargetInfo):
        self.func = func
        #: The target's vector width and register count, which shape the matrix kernels.
        self.info = info
        self.module: ir.Module = func.module
        self.dtype = np.dtype(dtype)
        self.T = scalar_type(dtype)
        self.alloca_block = func.append_basic_block("allocas")
        body = func.append_basic_block("body")
        #: Every way out of the function goes through here; `status` says why.
        self.exit_block = func.append_basic_block("exit")
        self.b = ir.IRBuilder(self.exit_block)
        self.status = self.b.phi(I32, name="status")
        self.b.position_at_end(body)
        self._body = body
        self._suffix = "f32" if self.dtype == np.float32 else "f64"

    # -- constants and memory ----------------------------------------------------------------

    def const(self, value: float) -> ir.Constant:
        return ir.Constant(self.T, float(value))

    @staticmethod
    def i64(value: int) -> ir.Constant:
        return ir.Constant(I64, value)

    def at(self, buf: Buf, offset: ir.Value | int) -> ir.Value:
        off = self.i64(offset) if isinstance(offset, int) else offset
        return self.b.gep(buf.ptr, [off], inbounds=True)

    def load(self, buf: Buf, offset: ir.Value | int) -> ir.Value:
        return self.b.load(self.at(buf, offset), align=self.dtype.itemsize)

    def store(self, value: ir.Value, buf: Buf, offset: ir.Value | int) -> None:
        self.b.store(value, self.at(buf, offset), align=self.dtype.itemsize)

    def local(self, init: ir.Value, name: str = "acc") -> ir.AllocaInstr:
        """A scalar stack slot (promoted to a register by SROA), initialised at this point."""
        with self.b.goto_block(self.alloca_block):
            slot = self.b.alloca(init.type, name=name)
        self.b.store(init, slot)
        return slot

    def kept_in_memory(self, pointer: ir.Value) -> None:
        """An empty inline asm that takes `pointer` and may read or write any memory, so that
        what lies behind it (a stack array of partial sums) is memory at this point: LLVM
        neither splits the array into values (SROA) nor carries it in registers across the
        enclosing loop (LICM's promotion), which takes the registers a tile's accumulators
        need. Without it, x86-64-v3 code (the default library's AVX2 variant) spilled an
        accumulator inside the chunked direct convolution's loop: 512 -> 512 on 7 x 7 ran at
        28.9 GFLOP/s, and at 64.0 with it, on a Zen 3."""
        barrier = ir.InlineAsm(
            ir.FunctionType(ir.VoidType(), [pointer.type]), "", "r,~{memory}", side_effect=True
        )
        self.b.call(barrier, [pointer])

    def global_constant(
        self, name: str, values: np.ndarray, elem: ir.Type | None = None
    ) -> ir.Value:
        """A private constant array holding `values` (flattened, as raw bytes: fast to build
        and to parse for large weights); returns a pointer to its first element."""
        elem = elem or self.T
        data = np.ascontiguousarray(values).reshape(-1).tobytes() or b"\0"
        array_type = ir.ArrayType(I8, len(data))
        gv = ir.GlobalVariable(self.module, array_type, self.module.get_unique_name(name))
        gv.global_constant = True
        gv.linkage = "private"
        gv.unnamed_addr = True
        gv.align = 64
        gv.initializer = ir.FormattedConstant(array_type, bytes_literal(data))
        return self.b.bitcast(gv, elem.as_pointer())

    def copy_run(self, dst: Buf, dst_at: ir.Value, src: Buf, src_at: ir.Value, count: int) -> None:
        """dst[dst_at:dst_at + count] = src[src_at:src_at + count] (not overlapping) as one
        `llvm.memcpy` of constant length, which LLVM lowers to a few vector moves: a loop
        of `count` copies could be unrolled and then vectorised across the outer loop."""
        i8p = I8.as_pointer()
        name = "llvm.memcpy.p0i8.p0i8.i64"
        func = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [i8p, i8p, I64, I1]), name
        )
        to = self.b.bitcast(self.at(dst, dst_at), i8p)
        source = self.b.bitcast(self.at(src, src_at), i8p)
        size = self.i64(count * self.dtype.itemsize)
        self.b.call(func, [to, source, size, ir.Constant(I1, 0)])

    def copy(self, dst: Buf, src: Buf) -> None:
        with self.loop(src.size) as i:
            self.store(self.load(src, i), dst, i)

    # -- loops -----------------------------------------------------------------------------

    @contextmanager
    def loop(
        self,
        count: int | ir.Value,
        name: str = "i",
        start: int | ir.Value = 0,
        step: int = 1,
        unroll: int = 0,
    ) -> Iterator[ir.Value]:
        """`for (i = start; i < count; i += step)`: yields the i64 index; the builder ends
        after the loop. Bounds are constants except in blocked loops (i64 values). `unroll`:
        LLVM unrolls the loop that many times (`llvm.loop.unroll.count`) on every target."""
        pre = self.b.block
        header = self.func.append_basic_block(f"{name}.header")
        body = self.func.append_basic_block(f"{name}.body")
        done = self.func.append_basic_block(f"{name}.done")
        self.b.branch(header)
        self.b.position_at_end(header)
        index = self.b.phi(I64, name=name)
        index.add_incoming(self.i64(start) if isinstance(start, int) else start, pre)
        limit = self.i64(count) if isinstance(count, int) else count
        self.b.cbranch(self.b.icmp_signed("<", index, limit), body, done)
        self.b.position_at_end(body)
        yield index
        following = self.b.add(index, self.i64(step), name=f"{name}.next", flags=("nuw", "nsw"))
        index.add_incoming(following, self.b.block)
        latch = self.b.branch(header)
        if unroll:
            latch.set_metadata("llvm.loop", self._unrolled(unroll))
        self.b.position_at_end(done)

    def _unrolled(self, count: int) -> ir.MDValue:
        """A loop's own `llvm.loop` node asking for `count` unrolled copies: a new node (not
        one `add_metadata` shares) whose first operand is itself, as LLVM requires of a loop
        ID."""
        hint = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.unroll.count"),
                                         ir.Constant(ir.IntType(32), count)])  # fmt: skip
        node = ir.values.MDValue(self.module, [hint], name=str(len(self.module.metadata)))
        node.operands = (node, hint)
        return node

    @contextmanager
    def nest(self, shape: Sequence[int], name: str = "i") -> Iterator[list[ir.Value]]:
        """Nested loops over `shape` (outermost first); yields the index of every axis."""
        if not shape:
            yield []
            return
        with self.loop(shape[0], f"{name}0") as first, self.nest(shape[1:], name + "_") as rest:
            yield [first, *rest]

    def linear_index(self, indices: Sequence[ir.Value], steps: Sequence[int]) -> ir.Value:
        """sum(index * step), skipping zero steps (broadcast axes)."""
        total: ir.Value = self.i64(0)
        for index, step in zip(indices, steps, strict=True):
            if step == 0:
                continue
            term = index if step == 1 else self.b.mul(index, self.i64(step), flags=("nsw",))
            total = self.b.add(total, term, flags=("nsw",))
        return total

    # -- math ------------------------------------------------------------------------------

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        """`llvm.<name>.f32|f64`, e.g. exp, log, sqrt, fabs, maximum, sin (`.v16f32` etc.
        on vectors)."""
        kind = args[0].type
        lanes = f"v{kind.count}" if isinstance(kind, ir.VectorType) else ""
        return self._call(f"llvm.{name}.{lanes}{self._suffix}", args)

    def like(self, value: float, x: ir.Value) -> ir.Constant:
        """`value` as a constant of x's type (a scalar, or a vector of it in every lane)."""
        if isinstance(x.type, ir.VectorType):
            return ir.Constant(x.type, [float(value)] * x.type.count)
        return self.const(value)

    def libm(self, name: str, *args: ir.Value) -> ir.Value:
        """A C math library function (`tanh`/`tanhf`); the JIT and `-lm` resolve it."""
        return self._call(name + ("f" if self.dtype == np.float32 else ""), args)

    def _call(self, symbol: str, args: Sequence[ir.Value]) -> ir.Value:
        func = self.module.globals.get(symbol)
        if func is None:
            kind = args[0].type
            func = ir.Function(self.module, ir.FunctionType(kind, [kind] * len(args)), symbol)
        return self.b.call(func, list(args))

    def sum_over(self, count: int, term: Callable[[ir.Value], ir.Value]) -> ir.Value:
        """sum(term(r) for r < count), reassociated (a vectorisable reduction)."""
        acc = self.local(self.const(0))
        with self.loop(count, "r") as r:
            self.b.store(self.fadd_r(self.b.load(acc), term(r)), acc)
        return self.b.load(acc)

    def fadd_r(self, a: ir.Value, b: ir.Value) -> ir.Value:
        """An addition inside a reduction the numerical policy allows to reassociate."""
        return self.b.fadd(a, b, flags=REASSOC)

    def fmul_r(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b, flags=REASSOC)

    def finish(self, cleanup: Callable[[], None] | None = None) -> None:
        """Close the function: the allocas fall through to the body; the exit block runs
        `cleanup` and returns the status. Every path must have reached `exit_with` before."""
        with self.b.goto_block(self.alloca_block):
            self.b.branch(self._body)
        self.b.position_at_end(self.exit_block)
        if cleanup is not None:
            cleanup()
        self.b.ret(self.status)

    # -- failure ---------------------------------------------------------------------------

    def fail_if(self, flag: ir.Value, status: Status | ir.Value) -> None:
        """Leave the function with `status` (a code or an i32 value) when `flag` is set."""
        cont = self.func.append_basic_block("ok")
        self.exit_with(status, flag, cont)
        self.b.position_at_end(cont)

    def exit_with(
        self,
        status: Status | ir.Value,
        flag: ir.Value | None = None,
        cont: ir.Block | None = None,
    ) -> None:
        """Branch to the exit block with `status` (if `flag` is given, only when it is set,
        otherwise on to `cont`)."""
        code = ir.Constant(I32, int(status)) if isinstance(status, Status) else status
        self.status.add_incoming(code, self.b.block)
        if flag is None:
            self.b.branch(self.exit_block)
        else:
            self.b.cbranch(flag, self.exit_block, cont)
