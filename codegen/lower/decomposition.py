"""Ops without a rule of their own that state a decomposition (`NodeOp.decompose`): their
node's kernel runs the lowerings of the ops the decomposition emits, in order, on scratch;
the package gives every such op kind this rule once all the other rules are registered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.ir import Block

from tlc.codegen.builder import Buf, KernelBuilder
from tlc.codegen.lower.rules import LOWERINGS, Lowering, Step
from tlc.core.diagnostics import error
from tlc.core.limits import LimitError
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.emitter import GraphEmitter

#: A region of a node's scratch: (offset in elements, shape).
Slot = tuple[int, Shape]


@dataclass(frozen=True)
class Decomposition:
    """A node's decomposition on its parents' shapes: `parts` are the emitted nodes, whose
    parent ids count the node's parents first (ids 0..n-1) then the parts; `result` is the
    id holding the node's value; `payload` the parts' records (constants)."""

    parts: tuple[NodeOp, ...]
    result: int
    payload: Payload

    @staticmethod
    def of(node: NodeOp, parents: list[Shape]) -> Decomposition:
        block = Block([ops.InputOp(i, [], shape) for i, shape in enumerate(parents)])
        payload = Payload()
        try:
            result = node.decompose(GraphEmitter(block, payload), *block.ops)
        except LimitError as exc:  # a constant of the decomposition over the element budget
            raise error(f"codegen: node {node.id}: {exc}", node) from None
        parts = tuple(op for op in block.ops if isinstance(op, NodeOp))[len(parents) :]
        return Decomposition(parts, result.id, payload)

    def lowering(self, node: NodeOp, part: NodeOp) -> Lowering:
        cls = type(part)
        reason = LOWERINGS.unsupported.get(cls, None if cls in LOWERINGS else "no lowering")
        if reason is not None:
            raise error(
                f"codegen: cannot compile {node.TAG} node {node.id}: its decomposition uses "
                f"{part.TAG}: {reason}",
                node,
            )
        return LOWERINGS[cls]

    def layout(self, node: NodeOp, parents: list[Shape]) -> tuple[dict[int, Slot], int]:
        """Where the parts live in the node's scratch: the value of each part that computes
        into memory (but the result's, which goes to the node's output) under its id, its own
        scratch under -1 - id; with the total size."""
        shapes = [*parents, *(part.require_declared() for part in self.parts)]
        slots: dict[int, Slot] = {}
        total = 0

        def take(key: int, shape: Shape) -> None:
            nonlocal total
            slots[key] = (total, shape)
            total += numel(shape)

        for part in self.parts:
            lowering = self.lowering(node, part)
            if not lowering.view and part.id != self.result:
                take(part.id, shapes[part.id])
            extra = lowering.scratch(part, [shapes[p] for p in part.parent_ids()], shapes[part.id])
            if extra:
                take(-1 - part.id, (extra,))
        return slots, total


def _decomposition_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return Decomposition.of(node, parents).layout(node, parents)[1]


def _decomposed(k: KernelBuilder, s: Step) -> None:
    """Lower each part of the node's decomposition in order: intermediate values and the
    parts' own scratch live in the node's scratch, the result is written to the output, and
    the parts' payload fields (the decomposition's constants) are baked in."""
    d = Decomposition.of(s.node, [a.shape for a in s.args])
    slots, _ = d.layout(s.node, [a.shape for a in s.args])

    def scratch(key: int) -> Buf | None:
        if key not in slots:
            return None
        assert s.scratch is not None
        offset, shape = slots[key]
        return Buf(k.at(s.scratch, offset), shape)

    values = list(s.args)
    for part in d.parts:
        lowering = d.lowering(s.node, part)
        args = [values[p] for p in part.parent_ids()]
        shape = part.require_declared()
        record = d.payload.get(part.id) or {}
        params = {}
        for name, spec in lowering.params(part, [a.shape for a in args], shape).items():
            assert name in record or spec.default is not None, "emitted parts carry their payload"
            value = record[name] if name in record else np.full(spec.shape, spec.default)
            constant = np.asarray(value, dtype=k.dtype).reshape(spec.shape)
            if spec.pack is not None:
                constant = spec.pack(constant, k.info)
            params[name] = Buf(k.global_constant(f"{part.TAG}.{name}", constant), constant.shape)
        # A view's rule returns the buffer it aliases and writes nothing to `out`.
        out = s.out if part.id == d.result else scratch(part.id) or Buf(s.out.ptr, shape)
        value = lowering.emit(k, Step(part, args, params, out, scratch(-1 - part.id), True))
        values.append(value if lowering.view else out)
    if values[d.result].ptr is not s.out.ptr:
        k.copy(s.out, values[d.result])


def decomposition_lowering(op_class: type[NodeOp]) -> Lowering | None:
    """The rule of an op without a lowering of its own that states a decomposition."""
    if not op_class.defines("decompose"):
        return None
    return Lowering(_decomposed, scratch=_decomposition_scratch)
