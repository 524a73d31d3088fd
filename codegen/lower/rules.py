"""The lowering rule table and what a rule sees: `Lowering` (emit, payload layout, scratch,
fusion, parts), `Step` (one node being lowered) and `ParamSpec` (a payload field a node reads).

Every module of this package adds its rules to `LOWERINGS` with `register`; the table is the
one place the module builder (`tlc.codegen.module`) and the memory plan (`tlc.codegen.plan`)
look rules up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import Buf, KernelBuilder
from tlc.codegen.target import TargetInfo
from tlc.core.rule_table import RuleTable
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape

#: A field's value (cast to the compiled dtype, in `ParamSpec.shape`) rearranged into the
#: layout the kernels for a target read when it is known at compile time.
Pack = Callable[[np.ndarray, TargetInfo], np.ndarray]


@dataclass(frozen=True)
class ParamSpec:
    """A payload field a node reads: its shape, and its value when the record leaves it out
    (None: required). `pack`, when set, is the layout a baked (compile-time) value is stored
    in: a weight matrix in the micro-kernel's panels. Runtime payloads keep `shape`'s
    row-major layout (the C ABI's), and the rule then reads the field as it is."""

    shape: Shape
    default: float | None = None
    pack: Pack | None = None


@dataclass(frozen=True)
class Fused:
    """The elementwise nodes (of `EPILOGUES`) a producer's kernel applies to its values as it
    stores them, in order, each to the value so far (`tlc.codegen.module.fusions`): node i
    takes it as operand `slots[i]`; its other operands (a binary map's: values of the
    output's shape computed before the producer, such as a residual add's shortcut) are the
    kernel's last arguments, in order (`operands`)."""

    nodes: tuple[NodeOp, ...]
    slots: tuple[int, ...]

    @property
    def operands(self) -> list[int]:
        """The ids of the nodes' other operands, in the order the kernel takes them."""
        return [q for node, slot in zip(self.nodes, self.slots, strict=True)
                for j, q in enumerate(node.parent_ids()) if j != slot]  # fmt: skip

    def key(self) -> tuple:
        """What the fused code depends on (node functions that share it share code)."""
        return tuple((type(node), repr(node.metadata()), slot)
                     for node, slot in zip(self.nodes, self.slots, strict=True))  # fmt: skip


@dataclass
class Step:
    """One node being lowered: its parents' buffers, its payload fields, its destination."""

    node: NodeOp
    args: list[Buf]
    params: dict[str, Buf]
    out: Buf
    #: Temporary storage of `Lowering.scratch` elements (None when the lowering needs none).
    scratch: Buf | None = None
    #: The params are compile-time constants stored in their `ParamSpec.pack` layouts.
    packed: bool = False
    #: The elementwise nodes fused into the rule's stores (`Lowering.fuses`): the node writes
    #: the last one's value, not its own; their other operands are the last `args`.
    fused: Fused | None = None
    #: The kernel computes parts [`part`, `part_end`) (i64 values) of `parts` of the output
    #: (`Lowering.parts`): the parts are disjoint, fixed at compile time, and together the
    #: whole value; a task computes a range of them (the ranges the runtime's threads share
    #: out, `tlc_rt_parallel_parts`), a call on one thread all of them
    #: (`module._NodeEmitter.split_call`: one function for both).
    part: ir.Value | None = None
    parts: int = 1
    part_end: ir.Value | None = None
    #: Binary elementwise nodes whose second operand is one value per channel, applied in
    #: order to the rule's value before `fused` (`module.channel_maps`: batch norm, then a
    #: pre-activation's scale and shift); map i's second operand is param `map{i}`.
    maps: tuple[NodeOp, ...] = ()

    @property
    def inputs(self) -> list[Buf]:
        """The node's own operands: `args` without the fused nodes' operands."""
        extra = len(self.fused.operands) if self.fused is not None else 0
        return self.args[: len(self.args) - extra]

    def part_range(self, k: KernelBuilder, units: int | ir.Value) -> tuple[ir.Value, ir.Value]:
        """The units [lo, hi) of `units` (equal shares, the same split for any thread count)
        this call's parts compute: all of them when the kernel is not split."""
        if self.part is None or self.part_end is None or self.parts == 1:
            return k.i64(0), units if isinstance(units, ir.Value) else k.i64(units)
        b, count = k.b, units if isinstance(units, ir.Value) else k.i64(units)
        lo = b.udiv(b.mul(self.part, count), k.i64(self.parts))
        hi = b.udiv(b.mul(self.part_end, count), k.i64(self.parts))
        return lo, hi


def balanced_parts(units: int, most: int) -> int:
    """Into how many parts (at most `most` and `units`) to split `units` units of work that
    parts take in equal shares of whole units (`Step.part_range`): of the counts from half
    the most on (so a split keeps at least half its parts), the one two threads finish
    soonest (then three, then four; tasks taken in order, each by the first free thread),
    the most parts among equals. The largest count can balance badly: 8 units in 7 parts
    leave one of two threads 5 of them; in 5 (shares of 1 and 2) each takes 4, and each of
    three at most 3."""
    top = max(min(units, most), 1)

    def balance(parts: int) -> tuple[int, ...]:
        shares = [(part + 1) * units // parts - part * units // parts for part in range(parts)]
        return (*(busiest(shares, threads) for threads in (2, 3, 4)), -parts)

    return min(range(-(-top // 2), top + 1), key=balance)


def busiest(tasks: Sequence[float], threads: int) -> float:
    """The work of the busiest of `threads` threads when they take `tasks` (each task's work)
    in order, each the next task as soon as it is free (the pool's shared counter)."""
    busy = [0.0] * threads
    for work in tasks:
        busy[busy.index(min(busy))] += work
    return max(busy)


Emit = Callable[[KernelBuilder, Step], "Buf | None"]
ParamLayout = Callable[[NodeOp, list[Shape], Shape], dict[str, ParamSpec]]
ScratchSize = Callable[[NodeOp, list[Shape], Shape], int]
#: Into how many independent parts a kernel call for these shapes can be split at most.
PartCount = Callable[[NodeOp, list[Shape], Shape], int]


def _none(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    return {}


def _no_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return 0


def _whole(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return 1


@dataclass(frozen=True)
class Lowering:
    emit: Emit
    #: The value aliases a parent, a parameter or a constant: no storage, nothing computed.
    view: bool = False
    params: ParamLayout = _none
    #: Elements of temporary storage the emitted code needs (convolution's patch matrix).
    scratch: ScratchSize = _no_scratch
    #: The rule applies `Step.fused` to its values as it stores them (`epilogue`), so a chain
    #: of elementwise nodes of `EPILOGUES` after this node can be fused into it.
    fuses: bool = False
    #: How many parts (`Step.part`) the rule can split one call into, so that a call with a
    #: single leading row (batch 1) still runs on several threads; 1: never split.
    parts: PartCount = _whole

    @property
    def uses_scratch(self) -> bool:
        """Whether the rule reads `Step.scratch` (then it gets a buffer even of size 0)."""
        return self.scratch is not _no_scratch


LOWERINGS: RuleTable[Lowering] = RuleTable("llvm")


def register(
    *op_classes: type[NodeOp],
    view: bool = False,
    params: ParamLayout = _none,
    scratch: ScratchSize = _no_scratch,
    fuses: bool = False,
    parts: PartCount = _whole,
):
    """Decorator: `emit` lowers each of `op_classes`."""

    def add(emit: Emit) -> Emit:
        LOWERINGS.register(*op_classes)(Lowering(emit, view, params, scratch, fuses, parts))
        return emit

    return add
