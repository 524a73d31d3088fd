"""Matrix products for linear and matmul: C[m, n] = A[m, k] B[k, n] (+ bias[n]).

A linear layer's weight is stored transposed, [n, k] (PyTorch's [out, in]): every output is a
dot product of two contiguous rows. `emit_dot_tiles` computes C in register tiles of MR rows of
A by NR rows of W: MR*NR vector accumulators run along k one vector at a time, each loaded
vector feeding MR or NR fused multiply-adds, and are reduced horizontally at the end. A's rows
are taken in blocks of ROW_BLOCK that stay in L2; within a block the tiles walk W (outer) and
A's rows (inner), so NR weight rows stay in L1. The reduction order (vector lanes, then a tree)
is reassociated: the llvm capsules' numerical policy is implementationDefined. Tile shapes and
the vector width come from the target (`KernelBuilder.info`), never from the build machine.

With B stored [k, n] (matmul, convolution's patch matrix) `emit_broadcast_tiles` is the classic
micro-kernel instead: one element of A broadcast against vectors of a row of B.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I1, I32, REASSOC, Buf, KernelBuilder
from tlc.codegen.target import TargetInfo

#: Rows of A per cache block: the block (64 x k) stays in L2 while W's tiles pass over it.
ROW_BLOCK = 64


@dataclass(frozen=True)
class Tiles:
    """Register tiles for a target. Dot tiles: MR rows of A by NR rows of W, MR*NR vector
    accumulators plus MR+NR loaded vectors. Broadcast tiles: MR_B rows of A by NV vectors of
    B's columns, MR_B*NV accumulators plus NV loads and one broadcast."""

    mr: int
    nr: int
    mr_b: int
    nv: int


#: 32 vector registers (AVX-512, NEON): 4x4 dot tiles (24 live), 6x2 broadcast tiles.
#: 16 (SSE, AVX2): 3x3 dot tiles (15 live) so nothing spills; 6x2 broadcast (15 live).
TILES = {32: Tiles(4, 4, 6, 2), 16: Tiles(3, 3, 6, 2)}


def tiles_for(k: KernelBuilder) -> tuple[Tiles, ir.VectorType]:
    """The register tiles and vector type the target of `k` calls for."""
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    return TILES[32 if k.info.vector_registers >= 32 else 16], ir.VectorType(k.T, lanes)


def emit_dot_tiles(
    k: KernelBuilder,
    a: Buf,
    w: Buf,
    out: Buf,
    *,
    m: int,
    n: int,
    kk: int,
    bias: Buf | None,
    share: Share | None = None,
) -> tuple[ir.Value | int, ir.Value | int]:
    """out[i, j] = sum_p a[i, p] * w[j, p] (+ bias[j]) for i < m, j < n (with `share`: only
    its tiles of NR columns, of ceil(n / NR)). Returns the columns [lo, hi) computed."""
    tiles, vec = tiles_for(k)
    MR, NR = tiles.mr, dot_columns(k.info, tiles, n)
    n_main, m_main = n - n % NR, m - m % MR
    units = n_main // NR + (n > n_main)
    cols = share(units) if share is not None else None
    done: tuple[ir.Value | int, ir.Value | int] = (0, n)
    if cols is not None:
        b = k.b
        done = (b.mul(cols[0], k.i64(NR)),
                b.select(b.icmp_signed("==", cols[1], k.i64(units)), k.i64(n),
                         b.mul(cols[1], k.i64(NR))))  # fmt: skip
    if m_main == 0 and cols is None and avx2_tiles(k.info):
        wide = row_columns(k.info, m, n)
        for j_lo, j_hi, nr in ((0, n - n % wide, wide), (n - n % wide, n, n % wide)):
            if j_hi > j_lo:
                with k.loop(j_hi, "j", start=j_lo, step=nr) as j0:
                    _tile(k, vec, a, w, out, k.i64(0), j0, m, nr, kk, n, bias)
        return done
    for j_lo, j_hi, nr in ((0, n_main, NR), (n_main, n, n % NR)):
        if j_hi <= j_lo:
            continue
        if cols is not None:  # units u_lo.. are the tiles of nr columns from j_lo on
            u_lo = j_lo // NR
            start, end = _clip(k, cols, u_lo, u_lo + -(-(j_hi - j_lo) // nr))
            first = k.i64(j_lo)
            j_lo = k.b.add(first, k.b.mul(k.b.sub(start, k.i64(u_lo)), k.i64(nr)))
            j_hi = k.b.add(first, k.b.mul(k.b.sub(end, k.i64(u_lo)), k.i64(nr)))
        if m_main:
            with k.loop(m_main, "ib", step=ROW_BLOCK) as ib:
                next_block = k.b.add(ib, k.i64(ROW_BLOCK))
                fits = k.b.icmp_signed("<", next_block, k.i64(m_main))
                end = k.b.select(fits, next_block, k.i64(m_main))
                with (
                    k.loop(j_hi, "j", start=j_lo, step=nr) as j0,
                    k.loop(end, "i", start=ib, step=MR) as i0,
                ):
                    _tile(k, vec, a, w, out, i0, j0, MR, nr, kk, n, bias)
        if m_main < m:
            with k.loop(j_hi, "j", start=j_lo, step=nr) as j0:
                _tile(k, vec, a, w, out, k.i64(m_main), j0, m - m_main, nr, kk, n, bias)
    return done


def row_columns(info: TargetInfo, m: int, n: int) -> int:
    """The rows of W a dot tile over all `m` rows of A (fewer than the tile's MR) takes in
    AVX2 code: the fewest passes over A the registers allow (m x NR accumulators, m rows of A
    and NR of W loaded), in equal tiles."""
    widest = max(1, (info.vector_registers - m) // (m + 1))
    return -(-n // -(-n // widest))


def dot_columns(info: TargetInfo, tiles: Tiles, n: int) -> int:
    """The dot tiles' rows of W: NR, or NR + 1 where its accumulators and loaded vectors fit
    the registers (AVX-512's 32: 4 x 5, 20 and 9) and it covers n in fewer passes over A's
    rows with no partial tile NR leaves out (n = 10: two tiles of 5 against two of 4 and one
    of 2; n = 32 keeps 8 of 4, not a tile of 2 more to compile). Each output is one
    accumulator whatever the tile, so the bits do not depend on it."""
    wider = tiles.nr + 1
    fits = tiles.mr * wider + tiles.mr + wider <= info.vector_registers
    fewer = -(-n // wider) < -(-n // tiles.nr) and (n % wider > 0) <= (n % tiles.nr > 0)
    return wider if fits and fewer else tiles.nr


def _tile(
    k: KernelBuilder,
    vec: ir.VectorType,
    a: Buf,
    w: Buf,
    out: Buf,
    i0: ir.Value,
    j0: ir.Value,
    mr: int,
    nr: int,
    kk: int,
    n: int,
    bias: Buf | None,
) -> None:
    b = k.b
    lanes = vec.count
    rows_a = [b.mul(b.add(i0, k.i64(r)), k.i64(kk)) for r in range(mr)]
    rows_w = [b.mul(b.add(j0, k.i64(c)), k.i64(kk)) for c in range(nr)]
    acc = [[k.local(ir.Constant(vec, [0.0] * lanes), "vacc") for _ in range(nr)] for _ in range(mr)]
    fma = _fma(k, vec)
    vptr = vec.as_pointer()
    with k.loop(kk // lanes, "kv") as kv:
        p = b.mul(kv, k.i64(lanes))
        xs = [b.load(b.bitcast(k.at(a, b.add(row, p)), vptr), align=k.dtype.itemsize)
              for row in rows_a]  # fmt: skip
        ws = [b.load(b.bitcast(k.at(w, b.add(row, p)), vptr), align=k.dtype.itemsize)
              for row in rows_w]  # fmt: skip
        for r in range(mr):
            for c in range(nr):
                b.store(b.call(fma, [xs[r], ws[c], b.load(acc[r][c])]), acc[r][c])
    reduce = _reduce(k, vec)
    tail = kk - kk % lanes
    for r in range(mr):
        for c in range(nr):
            total = b.call(reduce, [k.const(0), b.load(acc[r][c])], fastmath=REASSOC)
            for p in range(tail, kk):
                x = k.load(a, b.add(rows_a[r], k.i64(p)))
                total = multiply_add(k, x, k.load(w, b.add(rows_w[c], k.i64(p))), total)
            j = b.add(j0, k.i64(c))
            if bias is not None:
                total = b.fadd(total, k.load(bias, j))
            k.store(total, out, b.add(b.mul(b.add(i0, k.i64(r)), k.i64(n)), j))


def _fma(k: KernelBuilder, vec: ir.Type) -> ir.Function:
    """Multiply-add (of vectors, or of scalars) that fuses where the target has FMA (AVX2,
    AVX-512, NEON) and is a multiply and an add elsewhere: `llvm.fma` would become a libm call
    per element on x86-64-v2."""
    lanes = f"v{vec.count}" if isinstance(vec, ir.VectorType) else ""
    name = f"llvm.fmuladd.{lanes}{'f32' if k.dtype.itemsize == 4 else 'f64'}"
    func = k.module.globals.get(name)
    return func or ir.Function(k.module, ir.FunctionType(vec, [vec, vec, vec]), name)


def multiply_add(k: KernelBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    """acc + x * y (vectors or scalars) through `_fma`: one rounding wherever the target has
    FMA, whatever code surrounds it. A `contract` fadd of an fmul leaves the choice to the
    backend, which made it differently in two kernels around the same strip (a 1-ulp
    difference between a fused and an unfused depthwise convolution's output), and so it did
    in the dot tiles' scalar tails around a linear layer's store (a fused residual add)."""
    return k.b.call(_fma(k, acc.type), [x, y, acc])


def _reduce(k: KernelBuilder, vec: ir.VectorType) -> ir.Function:
    name = f"llvm.vector.reduce.fadd.v{vec.count}{'f32' if k.dtype.itemsize == 4 else 'f64'}"
    func = k.module.globals.get(name)
    return func or ir.Function(k.module, ir.FunctionType(k.T, [k.T, vec]), name)


def emit_broadcast_tiles(
    k: KernelBuilder,
    a: Buf,
    b_mat: Buf,
    out: Buf,
    *,
    m: int,
    n: int,
    kk: int,
    row_bias: Buf | None = None,
) -> None:
    """out[i, j] = sum_p a[i, p] * b[p, j] (+ row_bias[i]), B row-major [k, n].

    Register tiles of MR_B rows by NV vectors of columns: each step along k broadcasts one
    element of A per row and loads NV vectors of B's row, feeding MR_B * NV FMAs into
    accumulators that stay in registers. Columns past the last whole tile are done one by one.
    """
    tiles, vec = tiles_for(k)
    MR_B, lanes = tiles.mr_b, vec.count
    width = tiles.nv * lanes
    n_main, m_main = n - n % width, m - m % MR_B
    if n_main:
        with k.loop(n_main, "j", step=width) as j0:
            for i_lo, i_hi, mr in ((0, m_main, MR_B), (m_main, m, m % MR_B)):
                if i_hi > i_lo:
                    with k.loop(i_hi, "i", start=i_lo, step=mr) as i0:
                        _broadcast_tile(k, vec, a, b_mat, out, i0, j0, mr, tiles.nv, n, kk,
                                        row_bias)  # fmt: skip
    if n_main < n:
        with k.loop(m, "i") as i, k.loop(n, "j", start=n_main) as j:
            row = k.b.mul(i, k.i64(kk))
            total = k.sum_over(
                kk,
                lambda p: k.fmul_r(
                    k.load(a, k.b.add(row, p)), k.load(b_mat, k.b.add(k.b.mul(p, k.i64(n)), j))
                ),
            )
            if row_bias is not None:
                total = k.b.fadd(total, k.load(row_bias, i))
            k.store(total, out, k.b.add(k.b.mul(i, k.i64(n)), j))


def _broadcast_tile(
    k: KernelBuilder,
    vec: ir.VectorType,
    a: Buf,
    b_mat: Buf,
    out: Buf,
    i0: ir.Value,
    j0: ir.Value,
    mr: int,
    nv: int,
    n: int,
    kk: int,
    row_bias: Buf | None,
) -> None:
    b = k.b
    lanes = vec.count
    zero = ir.Constant(vec, [0.0] * lanes)
    acc = [[k.local(zero, "vacc") for _ in range(nv)] for _ in range(mr)]
    rows_a = [b.mul(b.add(i0, k.i64(r)), k.i64(kk)) for r in range(mr)]
    fma, vptr = _fma(k, vec), vec.as_pointer()
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)

    def splat(x: ir.Value) -> ir.Value:
        one = b.insert_element(ir.Constant(vec, ir.Undefined), x, k.i64(0))
        return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined), splat_mask)

    with k.loop(kk, "p") as p:
        row_b = b.add(b.mul(p, k.i64(n)), j0)
        bs = [
            b.load(b.bitcast(k.at(b_mat, b.add(row_b, k.i64(v * lanes))), vptr),
                   align=k.dtype.itemsize)
            for v in range(nv)
        ]  # fmt: skip
        for r in range(mr):
            x = splat(k.load(a, b.add(rows_a[r], p)))
            for v in range(nv):
                b.store(b.call(fma, [x, bs[v], b.load(acc[r][v])]), acc[r][v])
    for r in range(mr):
        row = b.add(b.mul(b.add(i0, k.i64(r)), k.i64(n)), j0)
        shift = splat(k.load(row_bias, b.add(i0, k.i64(r)))) if row_bias is not None else None
        for v in range(nv):
            value = b.load(acc[r][v])
            if shift is not None:
                value = b.fadd(value, shift)
            ptr = b.bitcast(k.at(out, b.add(row, k.i64(v * lanes))), vptr)
            b.store(value, ptr, align=k.dtype.itemsize)


# --------------------------------------------------------------------------------------------
# Packed products: B in panels of the micro-kernel's width, A broadcast one scalar at a time
# --------------------------------------------------------------------------------------------

#: The widest panel any target's micro-kernel uses (4 vectors of 16 lanes): the unit of
#: output columns a split linear layer or convolution hands each part.
MAX_PANEL = 64
#: Bytes of the slice of a B panel (kc rows of NR columns) one K block multiplies, at most
#: 1024 rows: on Zen 4, kc = 128 (a 16 KiB slice in L1) gave 92 GFLOP/s on a 256 x 784 x 1024
#: product, 512 gave 101-104 and 1024 gave 110: every K block but the last sends the partial
#: sums of C through memory, which costs more than B's L1 misses (L2 serves them in time).
PANEL_BYTES = 128 * 1024
#: Bytes of the packed rows of A (mc x kc) that stay in L2 while the panels pass by.
L2_BLOCK = 512 * 1024
#: The issue model the micro-kernel is chosen by: vector FMAs and loads a core starts per
#: cycle, and the cycles a step along k takes at least (each accumulator takes one FMA per
#: step: the FMA latency of 4, plus one cycle of slack, as a tile that only just covers the
#: latency stalls on any delay).
FMA_PER_CYCLE, LOADS_PER_CYCLE, MIN_STEP = 2, 2, 5

#: Where the lanes of a value being stored go: per store, the element offset in the
#: destination of the address lane 0 is stored at, and the mask of the lanes stored there
#: (None: every lane). The stores' lanes are disjoint; a scalar has one unmasked store.
Lanes = Sequence[tuple[ir.Value, ir.Value | None]]
#: The elementwise nodes fused into a producer's stores (`lower.rules.Fused`), applied to a
#: value (scalar or vector) about to be stored: epilogue(value, operand), where operand(buf)
#: reads a fused binary map's other operand (laid out like the destination) in the value's
#: lanes. Any store path builds `operand` for its layout; contiguous ones call `store_lanes`.
Epilogue = Callable[[ir.Value, Callable[[Buf], ir.Value]], ir.Value]
#: The units [lo, hi) of `units` one part of a split call computes (`Step.part_range`).
Share = Callable[[int], tuple[ir.Value, ir.Value]]


def _clip(
    k: KernelBuilder, share: tuple[ir.Value, ir.Value] | None, lo: int, hi: int
) -> tuple[ir.Value | int, ir.Value | int]:
    """[lo, hi) intersected with a part's `share` of units (the whole range without one)."""
    if share is None:
        return lo, hi
    b = k.b
    start = b.select(b.icmp_signed(">", share[0], k.i64(lo)), share[0], k.i64(lo))
    end = b.select(b.icmp_signed("<", share[1], k.i64(hi)), share[1], k.i64(hi))
    return start, end


@dataclass(frozen=True)
class MicroKernel:
    """The register tile of the packed products: MR rows, each one element of A broadcast per
    step along k, by NV vectors of LANES columns of B (NR = NV * LANES), so MR * NV
    accumulators, NV loaded vectors and one broadcast live in registers. `kc` is the K block
    (`PANEL_BYTES`)."""

    mr: int
    nv: int
    lanes: int
    kc: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def reserved_registers(nv: int) -> int:
    """Vector registers a tile of NV vectors of columns needs beside its accumulators: the NV
    loaded vectors and a broadcast; with a single vector, LLVM's unrolled loop keeps several
    broadcasts live (tiles of 10 or more rows spilled on 16 registers), so 7."""
    return nv + 1 if nv > 1 else 7


def avx2_tiles(info: TargetInfo) -> bool:
    """Whether the AVX2 code's tile rules apply (32-byte vectors in 16 registers, each
    broadcast an instruction of its own): convolution's `NARROW_DEPTH`, and here a product
    wider than one vector takes tiles of at least two vectors, as the single-vector tiles
    (MR x 1) run far below the issue model: LLVM keeps the unrolled loop's broadcasts live,
    spills an accumulator and moves the others between the FMAs (`vfmadd213ps`). Measured on
    Zen 4 (znver3 code, one thread, against the 5 x 2 and 6 x 2 tiles in the same process):
    resnet18's 256 -> 512 1x1 stride 2 on 14 x 14 (49 columns) 9 x 1 38.6 GFLOP/s, 8 x 1
    35.3, 7 x 1 45.6, 6 x 2 54.5, 5 x 2 59.7, C^T 61.0; mobilenet_v2's 160 -> 960 on 7 x 7
    9 x 1 40.2, 5 x 2 46.4, C^T 71.4 (the 9 x 1 tile's low model cycles had kept C there)."""
    return info.vector_bytes == 32 and info.vector_registers < 32


@cache
def micro_kernel(info: TargetInfo, itemsize: int, m: int, n: int) -> MicroKernel:
    """The tile for an m x n product on the target. Every MR x NV whose MR*NV accumulators
    and `reserved_registers` fit the target's registers (16 on AVX2/SSE, 32 on AVX-512) is
    scored by the cycles its tiles take per step along k to cover m x n (rows and columns past
    the edge included): max(FMAs / FMA_PER_CYCLE, loads / LOADS_PER_CYCLE, MIN_STEP) per tile; ties
    go to fewer rows past the edge, more accumulators, then more rows (on AVX2, a product
    wider than one vector takes no single-vector tile: `avx2_tiles`). For the wide layers
    that is 6 x 2 vectors (6x16 f32) or 4 x 3 on AVX2 and 8 x 2 vectors (8x32) on AVX-512;
    a single row (batch 1) gets 4 vectors."""
    lanes = max(info.vector_bytes // itemsize, 1)
    regs = info.vector_registers

    def cycles(mr: int, nv: int) -> float:
        return _cycles(mr, nv, lanes, m, n)

    least = 2 if avx2_tiles(info) and n > lanes else 1
    shapes = [(mr, nv) for nv in range(least, 5) for mr in range(1, regs)
              if mr * nv + reserved_registers(nv) <= regs]  # fmt: skip
    mr, nv = min(shapes, key=lambda s: (cycles(*s), -(-m // s[0]) * s[0], -s[0] * s[1], -s[0]))
    return tile_kernel(info, itemsize, mr, nv)


def tile_kernel(info: TargetInfo, itemsize: int, mr: int, nv: int) -> MicroKernel:
    """The MR x NV tile on the target, its K block from `PANEL_BYTES`."""
    lanes = max(info.vector_bytes // itemsize, 1)
    return MicroKernel(mr, nv, lanes, min(max(PANEL_BYTES // (nv * lanes * itemsize), 8), 1024))


def step_cycles(mr: int, nv: int, fmas: float = FMA_PER_CYCLE) -> float:
    """The issue model's cycles per step along k of one tile of MR broadcasts by NV vectors
    (the direct convolution's tiles are scored by it too, with `fmas` FMAs a cycle)."""
    return max(mr * nv / fmas, (mr + nv) / LOADS_PER_CYCLE, MIN_STEP)


def _cycles(mr: int, nv: int, lanes: int, m: int, n: int) -> float:
    """The issue model's cycles per step along k of MR x NV tiles covering m x n."""
    return math.ceil(m / mr) * math.ceil(n / (nv * lanes)) * step_cycles(mr, nv)


def product_cycles(info: TargetInfo, itemsize: int, m: int, n: int) -> float:
    """The cycles per step along k of an m x n product by its micro-kernel (`micro_kernel`):
    what choosing between C and C^T compares."""
    return kernel_cycles(micro_kernel(info, itemsize, m, n), m, n)


def kernel_cycles(mk: MicroKernel, m: int, n: int) -> float:
    """The issue model's cycles per step along k of `mk`'s tiles covering m x n."""
    return _cycles(mk.mr, mk.nv, mk.lanes, m, n)


def pack_panels(b: np.ndarray, width: int) -> np.ndarray:
    """B [k, n] as ceil(n / width) panels of [k, width] (columns past n are zero), one after
    the other: row p of panel j holds B[p, j*width : (j+1)*width] contiguously, the order
    the micro-kernel reads it in."""
    kk, n = b.shape
    panels = -(-n // width)
    padded = np.zeros((kk, panels * width), b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(kk, panels, width).transpose(1, 0, 2))


def pad_to(values: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, values.dtype)
    out[: values.size] = values.reshape(-1)
    return out


def splat(k: KernelBuilder, vec: ir.VectorType, x: ir.Value) -> ir.Value:
    """x in every lane of `vec`."""
    b = k.b
    one = b.insert_element(ir.Constant(vec, ir.Undefined), x, k.i64(0))
    mask = ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count)
    return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined), mask)


def stride_phase(k: KernelBuilder, inputs: ir.Value, stride: int, phase: int = 0) -> ir.Value:
    """Lanes phase, phase + stride, phase + 2 * stride, ... of `inputs` (a vector of lanes *
    stride consecutive elements): one stride phase of them, by one shuffle (LLVM leaves a
    strided scalar loop scalar)."""
    lanes = inputs.type.count // stride
    pick = ir.Constant(ir.VectorType(I32, lanes), [phase + stride * j for j in range(lanes)])
    return k.b.shuffle_vector(inputs, ir.Constant(inputs.type, ir.Undefined), pick)


def _masked(k: KernelBuilder, vec: ir.VectorType, store: bool) -> ir.Function:
    mask = ir.VectorType(I1, vec.count)
    kind = "store" if store else "load"
    name = f"llvm.masked.{kind}.v{vec.count}{'f32' if k.dtype.itemsize == 4 else 'f64'}.p0"
    args = [vec, vec.as_pointer(), I32, mask] if store else [vec.as_pointer(), I32, mask, vec]
    func = k.module.globals.get(name)
    result = ir.VoidType() if store else vec
    return func or ir.Function(k.module, ir.FunctionType(result, args), name)


def _prefix(vec: ir.VectorType, count: int) -> ir.Constant:
    """The mask of the first `count` lanes."""
    return ir.Constant(ir.VectorType(I1, vec.count), [lane < count for lane in range(vec.count)])


def lane_mask(k: KernelBuilder, vec: ir.VectorType, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """The <lanes x i1> mask of lanes l with lo <= l < hi (i32 bounds)."""
    b, lanes = k.b, vec.count
    iota = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
    ivec = ir.VectorType(I32, lanes)
    return b.and_(b.icmp_signed(">=", iota, splat(k, ivec, lo)),
                  b.icmp_signed("<", iota, splat(k, ivec, hi)))  # fmt: skip


#: The vector bytes whose masked stores are done as plain stores of pieces when their lanes
#: are one run known at compile time (`_store_pieces`): AVX2, whose masked store
#: (`vmaskmovps`) costs many times a plain one on AMD's cores (AVX-512 masks its stores with
#: mask registers at a plain store's cost; SSE has no masked store). Measured on Zen 4 (znver3
#: code, one thread, A/B in one process): squeezenet1_0's 32 -> 128 3x3 on 54 x 54, direct
#: tiles of 1 x 6 positions stored as 8 lanes under a mask, 62.3 -> 68.8 GFLOP/s.
PIECE_STORES = 32


def store_vector(
    k: KernelBuilder, value: ir.Value, ptr: ir.Value, count: int, mask: ir.Value | None = None
) -> None:
    """Store the first `count` lanes of `value` at `ptr` (a masked store when not all; or
    under `mask` when given; on AVX2 a run of lanes known at compile time as plain stores:
    `PIECE_STORES`)."""
    vec = value.type
    vptr = k.b.bitcast(ptr, vec.as_pointer())
    align = ir.Constant(I32, k.dtype.itemsize)
    if mask is None and count >= vec.count:
        k.b.store(value, vptr, align=k.dtype.itemsize)
        return
    run = _lane_run(mask, count, vec.count)
    if run is not None and k.info.vector_bytes == PIECE_STORES:
        _store_pieces(k, value, ptr, run)
        return
    k.b.call(_masked(k, vec, True), [value, vptr, align, mask or _prefix(vec, count)])


def _lane_run(mask: ir.Value | None, count: int, lanes: int) -> tuple[int, int] | None:
    """The lanes [lo, hi) a store writes when they are one run known at compile time (the
    first `count`, or a constant `mask` of one run), else None."""
    if mask is None:
        return 0, count
    if not isinstance(mask, ir.Constant) or not isinstance(mask.constant, list):
        return None
    bits = [bool(c.constant) for c in mask.constant]
    lo = bits.index(True) if any(bits) else 0
    hi = lo + bits[lo:].index(False) if False in bits[lo:] else lanes
    return (lo, hi) if not any(bits[hi:]) else None


def _store_pieces(k: KernelBuilder, value: ir.Value, ptr: ir.Value, run: tuple[int, int]) -> None:
    """Store lanes [lo, hi) of `value` at `ptr` (lane l at ptr + l) as plain stores of the
    largest power-of-two pieces that fit, lowest lanes first: the bytes a masked store
    writes, with no mask."""
    b, (at, hi) = k.b, run
    while at < hi:
        size = 1 << ((hi - at).bit_length() - 1)
        dest = b.gep(ptr, [k.i64(at)], inbounds=True)
        if size == 1:
            b.store(b.extract_element(value, ir.Constant(I32, at)), dest, align=k.dtype.itemsize)
        else:
            pick = ir.Constant(ir.VectorType(I32, size), list(range(at, at + size)))
            piece = b.shuffle_vector(value, ir.Constant(value.type, ir.Undefined), pick)
            b.store(piece, b.bitcast(dest, piece.type.as_pointer()), align=k.dtype.itemsize)
        at += size


def load_vector(
    k: KernelBuilder,
    vec: ir.VectorType,
    ptr: ir.Value,
    count: int,
    mask: ir.Value | None = None,
    passthru: ir.Value | None = None,
) -> ir.Value:
    """The first `count` lanes at `ptr` (or those under `mask` when given; the others zero,
    or `passthru`'s)."""
    vptr = k.b.bitcast(ptr, vec.as_pointer())
    if mask is None and count >= vec.count:
        return k.b.load(vptr, align=k.dtype.itemsize)
    rest = passthru if passthru is not None else ir.Constant(vec, [0.0] * vec.count)
    align = ir.Constant(I32, k.dtype.itemsize)
    return k.b.call(_masked(k, vec, False), [vptr, align, mask or _prefix(vec, count), rest])


def load_lanes(k: KernelBuilder, buf: Buf, like: ir.Type, lanes: Lanes) -> ir.Value:
    """What `buf` holds where stores at `lanes` (of a value of type `like`) would write, in
    the value's lanes (the lanes no store covers are zero)."""
    if not isinstance(like, ir.VectorType):
        ((at, _),) = lanes
        return k.load(buf, at)
    value = None
    for at, mask in lanes:
        value = load_vector(k, like, k.at(buf, at), like.count, mask, value)
    assert value is not None
    return value


def apply_epilogue(
    k: KernelBuilder, value: ir.Value, lanes: Lanes, epilogue: Epilogue | None
) -> ir.Value:
    """`value` through the fused `epilogue` (if any), its operands read at `lanes`."""
    if epilogue is None:
        return value
    like = value.type
    return epilogue(value, lambda buf: load_lanes(k, buf, like, lanes))


def store_lanes(
    k: KernelBuilder, value: ir.Value, out: Buf, lanes: Lanes, epilogue: Epilogue | None = None
) -> None:
    """Store `value` (a vector or a scalar) into `out` at `lanes`, the fused `epilogue`
    applied first, its operands read at the same lanes: the store a producer's kernel ends
    in (`Lowering.fuses`), so every fusion reaches every kernel that stores through it."""
    value = apply_epilogue(k, value, lanes, epilogue)
    if not isinstance(value.type, ir.VectorType):
        ((at, _),) = lanes
        k.store(value, out, at)
        return
    for at, mask in lanes:
        store_vector(k, value, k.at(out, at), value.type.count, mask)


def packed_tile(
    k: KernelBuilder,
    mk: MicroKernel,
    mr: int,
    a_at: Callable[[int, ir.Value], ir.Value],
    b_at: Callable[[int, ir.Value], ir.Value],
    klen: ir.Value,
    start: Callable[[int, int], ir.Value],
    finish: Callable[[int, int, ir.Value], None],
    b_mask: Callable[[int], ir.Value] | None = None,
) -> None:
    """The micro-kernel: acc[r][v] = start(r, v); for p < klen, acc[r][v] += A(r, p) * B(v, p)
    with A(r, p) the scalar at `a_at(r, p)` broadcast and B(v, p) the vector at `b_at(v, p)`
    (a packed panel row; with `b_mask`, only its lanes under b_mask(v), the others zero);
    then finish(r, v, acc[r][v]). The MR * NV accumulators are stack slots SROA keeps in
    registers. Loads claim only element alignment: a malloc'ed workspace is 16-byte aligned
    (unaligned vector loads of aligned data cost nothing extra)."""
    b = k.b
    vec = ir.VectorType(k.T, mk.lanes)
    acc = [[k.local(start(r, v), "vacc") for v in range(mk.nv)] for r in range(mr)]
    fma, vptr = _fma(k, vec), vec.as_pointer()
    align = k.dtype.itemsize
    masks = [b_mask(v) for v in range(mk.nv)] if b_mask is not None else None
    trips = klen.constant if isinstance(klen, ir.Constant) else None
    with k.loop(klen, "p", unroll=micro_unroll(k.info, mr * mk.nv, trips)) as p:
        if masks is None:
            bs = [b.load(b.bitcast(b_at(v, p), vptr), align=align) for v in range(mk.nv)]
        else:
            bs = [load_vector(k, vec, b_at(v, p), mk.lanes, masks[v]) for v in range(mk.nv)]
        for r in range(mr):
            x = splat(k, vec, b.load(a_at(r, p), align=k.dtype.itemsize))
            for v in range(mk.nv):
                b.store(b.call(fma, [x, bs[v], b.load(acc[r][v])]), acc[r][v])
    for r in range(mr):
        for v in range(mk.nv):
            finish(r, v, b.load(acc[r][v]))


#: The FMAs one iteration of a micro-kernel's loop over k holds at least, in AVX2 code
#: (`micro_unroll`).
UNROLLED_FMAS = 32


def micro_unroll(info: TargetInfo, fmas: int, trips: int | None) -> int:
    """Copies of a tile's loop over k (of `fmas` FMAs a step, `trips` steps, None when only
    known at run time) LLVM is asked to unroll into one iteration (`KernelBuilder.loop`'s
    `unroll`; 0: its own choice): enough for `UNROLLED_FMAS`; with `trips` known, the most
    up to that which divide it (so no copy but the last tests for the end; 0 if none from 2
    up does), else LLVM adds a remainder loop. LLVM unrolls such a loop itself only where
    the CPU's scheduling model has a large loop buffer: for znver3, 3 copies of a 12-FMA
    tile and 2 of a 16; for x86-64-v3 (the default library's AVX2 code), haswell or znver2,
    none, and there the loop's own instructions (the counter, the tap's offset) ran between
    too few FMAs. Measured on a Zen 3 (11 paired rounds against znver3
    code, which LLVM unrolls itself), x86-64-v3 code of resnet18's 3x3 layers: 64 -> 64 on
    56 x 56 0.92 without, 1.00 with; 256 -> 256 on 14 x 14 0.91 and 1.00; 512 -> 512 on
    7 x 7 0.99 and 1.01; znver3 code with and without within 2%. Only AVX2 code
    (`avx2_tiles`): AVX-512 tiles hold 16-28 FMAs a step, and SSE code, whose FMA is a
    multiply and an add, measured mixed (x86-64-v2 code with the copies: 256 -> 256 on
    14 x 14 1.6 times as fast, 256 -> 512 1x1 stride 2 0.88), so both are left to LLVM."""
    if not avx2_tiles(info) or fmas >= UNROLLED_FMAS:
        return 0
    copies = -(-UNROLLED_FMAS // fmas)
    if trips is None:
        return copies
    return next((c for c in range(copies, 1, -1) if trips % c == 0), 0)


def linear_scratch(m: int, kk: int) -> int:
    """Elements of scratch `emit_packed_linear` may need on any target, for m rows of k: the
    packed rows of A of one cache block (at most L2_BLOCK bytes of float32 plus one row
    tile of at most 32 rows; kc <= 1024)."""
    return min(L2_BLOCK // 4 + 32 * 1024, (m + 32) * min(kk, 1024))


def emit_packed_linear(
    k: KernelBuilder,
    x: Buf,
    panels: Buf,
    bias: Buf,
    out: Buf,
    scratch: Buf,
    *,
    m: int,
    n: int,
    kk: int,
    epilogue: Epilogue | None,
    share: Share | None = None,
    x_at: Callable[[ir.Value, ir.Value], ir.Value] | None = None,
    in_place: bool = False,
    consecutive: bool = False,
) -> None:
    """out[i, j] = epilogue(sum_p x[i, p] W[j, p] + bias[j]) with W^T packed at compile time
    (`pack_panels(W.T, NR)`, bias zero-padded to whole panels).

    Blocked for the caches: K in blocks of kc (the panel's kc x NR slice stays in L2 while
    every row tile of the block passes over it), rows in blocks of mc, packed into `scratch`
    as [tile][p][MR] (mc x kc, in L2) so that a tile's broadcasts read consecutive memory
    (x's rows are k apart: a power-of-two k puts every row of a tile in one L1 set); each
    K block but the first adds onto the partial sums in `out`, the last adds the bias and
    applies the epilogue as it stores. Rows past the last whole tile get a tile of their own
    height, columns past the last whole panel are computed on the zero padding and stored
    under a mask. With `share`, only its panels (of ceil(n / NR)) are computed; `x_at(i, p)`,
    when given, is the address of x[i, p] (x need not be a matrix in memory: convolution's
    patches), else x is row-major [m, k]; `consecutive`: the rows of every tile lie one after
    the other there (x_at(i + r, p) is x_at(i, p) + r: a 1x1 convolution's positions), so
    the packing copies a tile's step as one vector instead of element by element."""
    mk = micro_kernel(k.info, k.dtype.itemsize, m, n)
    b, lanes, nr, kc, MR = k.b, mk.lanes, mk.nr, min(mk.kc, kk), mk.mr
    vec = ir.VectorType(k.T, lanes)
    zero = ir.Constant(vec, [0.0] * lanes)
    full, tail = divmod(n, nr)
    m_main = m - m % MR
    mc = max(L2_BLOCK // (max(kc, 1) * k.dtype.itemsize) // MR, 1) * MR
    assert in_place or min(mc, -(-m // MR) * MR) * kc <= scratch.size <= linear_scratch(m, kk)
    blocked = kk > kc
    panel_share = share(full + (tail > 0)) if share is not None else None

    def k_block(pc: ir.Value, klen: ir.Value, first: ir.Value | None, last: ir.Value | None):
        def pack(i_lo: ir.Value, tiles: ir.Value, mr: int) -> None:
            """x[i_lo + t*MR + r, pc + p] -> scratch[(t * kc + p) * MR + r]."""
            run = ir.VectorType(k.T, mr).as_pointer()
            with k.loop(tiles, "t") as t, k.loop(klen, "p") as p:
                row = b.add(i_lo, b.mul(t, k.i64(MR)))
                dst = b.mul(b.add(b.mul(t, k.i64(kc)), p), k.i64(MR))
                if consecutive:  # the tile's step: mr elements one after the other
                    assert x_at is not None
                    src = b.bitcast(x_at(row, b.add(pc, p)), run)
                    value = b.load(src, align=k.dtype.itemsize)
                    b.store(value, b.bitcast(k.at(scratch, dst), run), align=k.dtype.itemsize)
                else:
                    for r in range(mr):
                        if x_at is not None:
                            value = b.load(x_at(b.add(row, k.i64(r)), b.add(pc, p)))
                        else:
                            src = b.add(b.mul(b.add(row, k.i64(r)), k.i64(kk)), b.add(pc, p))
                            value = k.load(x, src)
                        k.store(value, scratch, b.add(dst, k.i64(r)))

        def tile(i0: ir.Value, t: ir.Value, mr: int, jr: ir.Value, cols: int) -> None:
            def a_at(r: int, p: ir.Value) -> ir.Value:
                if in_place:
                    assert x_at is not None
                    return x_at(b.add(i0, k.i64(r)), b.add(pc, p))
                at = b.mul(b.add(b.mul(t, k.i64(kc)), p), k.i64(MR))
                return k.at(scratch, b.add(at, k.i64(r)))

            def b_at(v: int, p: ir.Value) -> ir.Value:
                row = b.add(b.mul(jr, k.i64(kk * nr)), b.mul(b.add(pc, p), k.i64(nr)))
                return k.at(panels, b.add(row, k.i64(v * lanes)))

            def c_offset(r: int, v: int) -> ir.Value:
                row = b.mul(b.add(i0, k.i64(r)), k.i64(n))
                return b.add(row, b.add(b.mul(jr, k.i64(nr)), k.i64(v * lanes)))

            def c_at(r: int, v: int) -> ir.Value:
                return k.at(out, c_offset(r, v))

            def start(r: int, v: int) -> ir.Value:
                if first is None or v * lanes >= cols:
                    return zero
                return b.select(first, zero, load_vector(k, vec, c_at(r, v), cols - v * lanes))

            def finish(r: int, v: int, acc: ir.Value) -> None:
                if v * lanes >= cols:
                    return
                at = b.add(b.mul(jr, k.i64(nr)), k.i64(v * lanes))
                done = b.fadd(acc, b.load(b.bitcast(k.at(bias, at), vec.as_pointer()),
                                          align=k.dtype.itemsize))  # fmt: skip
                count = cols - v * lanes
                lanes_at = [(c_offset(r, v), None if count >= lanes else _prefix(vec, count))]
                done = apply_epilogue(k, done, lanes_at, epilogue)
                store_lanes(k, done if last is None else b.select(last, done, acc), out, lanes_at)

            packed_tile(k, mk, mr, a_at, b_at, klen, start, finish)

        def row_block(i_lo: ir.Value, tiles: ir.Value, mr: int) -> None:
            """Rows [i_lo, i_lo + tiles * mr) (mr = MR, or one tile of the remainder)."""
            if not in_place:
                pack(i_lo, tiles, mr)
            for j_lo, j_hi, cols in ((0, full, nr), (full, full + (tail > 0), tail)):
                if j_hi > j_lo:
                    start, end = _clip(k, panel_share, j_lo, j_hi)
                    with k.loop(end, "jr", start=start) as jr, k.loop(tiles, "t") as t:
                        tile(b.add(i_lo, b.mul(t, k.i64(MR))), t, mr, jr, cols)

        if m_main:
            with k.loop(m_main, "ic", step=mc) as ic:
                rows = b.sub(k.i64(m_main), ic)
                rows = b.select(b.icmp_signed("<", rows, k.i64(mc)), rows, k.i64(mc))
                row_block(ic, b.udiv(rows, k.i64(MR)), MR)
        if m_main < m:
            row_block(k.i64(m_main), k.i64(1), m - m_main)

    if not blocked:
        k_block(k.i64(0), k.i64(kk), None, None)
        return
    with k.loop(kk, "pc", step=kc) as pc:
        rest = b.sub(k.i64(kk), pc)
        klen = b.select(b.icmp_signed("<", rest, k.i64(kc)), rest, k.i64(kc))
        first = b.icmp_signed("==", pc, k.i64(0))
        last = b.icmp_signed("<=", rest, k.i64(kc))
        k_block(pc, klen, first, last)


def prefetch_read(k: KernelBuilder, at: ir.Value) -> None:
    """A read prefetch of `at` into every cache level (it never faults: `at` may lie past
    the buffer, and is not claimed in bounds)."""
    name = "llvm.prefetch.p0"
    func = k.module.globals.get(name) or ir.Function(
        k.module, ir.FunctionType(ir.VoidType(), [at.type, I32, I32, I32]), name
    )
    k.b.call(func, [at, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def emit_packed_block(
    k: KernelBuilder,
    mk: MicroKernel,
    *,
    m: int,
    klen: ir.Value,
    a_at: Callable[[ir.Value, int, ir.Value], ir.Value],
    b_at: Callable[[ir.Value, int, ir.Value], ir.Value],
    panels: ir.Value,
    finish: Callable[[ir.Value, ir.Value, int, ir.Value], None],
    after: Callable[[ir.Value, ir.Value, int], None] | None = None,
    partial: Callable[[ir.Value, ir.Value, int], ir.Value] | None = None,
    first: ir.Value | None = None,
    last: ir.Value | None = None,
    tiles: tuple[ir.Value, ir.Value] | None = None,
    b_mask: Callable[[ir.Value, int], ir.Value] | None = None,
    b_whole: Callable[[ir.Value], ir.Value] | None = None,
    prefetch: int = 0,
    rows_outer: bool = False,
) -> None:
    """C = A B over `panels` panels of NR columns of B (filled at run time: convolution's
    patches), `klen` steps along k: for each panel, every tile of MR rows of A (the last one
    of its own height), A's element (i, p) at `a_at(tile, r, p)`, vector v of row p of panel
    j at `b_at(j, v, p)`; each finished accumulator goes to finish(row, panel, v, acc), then
    after(first row, panel, rows). With `partial` (the address of a vector of partial sums
    per row, panel and v), this is one K block: the tiles start from the partial sums unless
    `first`, keep them there, and are finished only when `last`. `tiles` = (lo, hi) limits
    the row tiles to [lo, hi) (of ceil(m / MR), the short one last): one part of a split
    call. With `b_mask`, vector v of panel j loads only the lanes under b_mask(j, v)
    (B read in place, whose last columns end with the buffer); with `b_whole` as well, the
    panels j where b_whole(j) holds (every lane of theirs under the mask) load B unmasked: on
    AVX2 a mask is a vector register per vector of B, which a tile of 12 accumulators does not
    have free, so LLVM reloaded the masks from the stack at every step. With `prefetch`, the
    first row tile of each panel (of the part's `tiles`) prefetches every vector of B it loads that
    many elements ahead (B read in place from long rows: the tiles read it from as many rows
    as k steps, more streams than the hardware prefetchers follow). With `rows_outer`, each
    row tile runs over every panel before the next tile starts (the tiles of A stay in L1 and A
    is read once; B is read again by every tile): for a product whose A is larger than B
    (`convolution._rows_outer`)."""
    b, lanes = k.b, mk.lanes
    vec = ir.VectorType(k.T, lanes)
    zero = ir.Constant(vec, [0.0] * lanes)
    whole, rest = divmod(m, mk.mr)

    def tile(jp: ir.Value, ib: ir.Value, mr: int, masked: bool) -> None:
        def row(r: int) -> ir.Value:
            return b.add(b.mul(ib, k.i64(mk.mr)), k.i64(r))

        def done(r: int, v: int, acc: ir.Value) -> None:
            finish(row(r), jp, v, acc)

        def a(r: int, p: ir.Value) -> ir.Value:
            return a_at(ib, r, p)

        def bv(v: int, p: ir.Value) -> ir.Value:
            at = b_at(jp, v, p)
            if prefetch:  # the other row tiles prefetch what they read (in L1 by then)
                lead = k.i64(0) if tiles is None else tiles[0]
                ahead = b.select(b.icmp_signed("==", ib, lead), k.i64(prefetch), k.i64(0))
                prefetch_read(k, b.gep(at, [ahead]))
            return at

        mask = None if b_mask is None or not masked else (lambda v: b_mask(jp, v))

        if partial is None:
            packed_tile(k, mk, mr, a, bv, klen, lambda r, v: zero, done, mask)
            if after is not None:
                after(row(0), jp, mr)
            return
        assert first is not None and last is not None

        def held(r: int, v: int) -> ir.Value:
            return b.bitcast(partial(row(r), jp, v), vec.as_pointer())

        def start(r: int, v: int) -> ir.Value:
            return b.select(first, zero, b.load(held(r, v), align=k.dtype.itemsize))

        def keep(r: int, v: int, acc: ir.Value) -> None:
            b.store(acc, held(r, v), align=k.dtype.itemsize)

        packed_tile(k, mk, mr, a, bv, klen, start, keep, mask)
        with b.if_then(last):
            for r in range(mr):
                for v in range(mk.nv):
                    done(r, v, b.load(held(r, v), align=k.dtype.itemsize))
            if after is not None:
                after(row(0), jp, mr)

    def each_tile(visit: Callable[[ir.Value, int], None]) -> None:
        """visit(tile, its rows) for every row tile (of the part's `tiles`), the short one last."""
        if tiles is None:
            if whole:
                with k.loop(whole, "ib") as ib:
                    visit(ib, mk.mr)
            if rest:
                visit(k.i64(whole), rest)
            return
        lo, hi = tiles
        if whole:
            end = b.select(b.icmp_signed("<", hi, k.i64(whole)), hi, k.i64(whole))
            with k.loop(end, "ib", start=lo) as ib:
                visit(ib, mk.mr)
        if rest:
            short = b.and_(b.icmp_signed("<=", lo, k.i64(whole)),
                           b.icmp_signed(">", hi, k.i64(whole)))  # fmt: skip
            with b.if_then(short):
                visit(k.i64(whole), rest)

    def by_mask(jp: ir.Value, run: Callable[[bool], None]) -> None:
        """run(masked) for panel jp: unmasked where `b_whole` says every lane is B's."""
        if b_mask is None or b_whole is None:
            run(b_mask is not None)
            return
        with b.if_else(b_whole(jp)) as (unmasked, cut):
            with unmasked:
                run(False)
            with cut:
                run(True)

    def each_panel(ib: ir.Value, mr: int) -> None:
        with k.loop(panels, "jp") as jp:
            by_mask(jp, lambda masked: tile(jp, ib, mr, masked))

    if rows_outer:
        each_tile(each_panel)
        return
    with k.loop(panels, "jp") as jp:
        by_mask(jp, lambda masked: each_tile(lambda ib, mr: tile(jp, ib, mr, masked)))
