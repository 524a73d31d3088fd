"""The vocabulary derivative rules are written in: tl ops, run now or emitted as graph nodes.

A rule calls `em.op(OpClass, parents, fields)` (or a helper built on it: `em.mul`, `em.reshape`,
`em.linear`...). `NumpyEmitter` evaluates each op at once with its reference rule
(`tlc.semantics.reference.REFERENCE`), so `tlc.vjp` is the reference denotation of exactly the
ops a gradient graph contains; `GraphEmitter` appends each op as a node to a `tl.graph` block and
records the payload of the nodes it creates (constants, transposed weights). One rule, two
interpretations, no drift between them (JAX's rules-as-primitives, in miniature).

Both kinds of value have a shape (`em.shape(v)`); every op's shape rule runs in both modes, so a
rule that would build an ill-shaped gradient graph fails the numeric tests too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import numpy as np
from xdsl.ir import Block

from tlc.core.payload import Payload, Record
from tlc.dialect import ops
from tlc.dialect.backward_ops import SignOp
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.reference import REFERENCE

V = TypeVar("V")


class Emitter(ABC, Generic[V]):
    """Builds values of type V from tl ops; the helpers below are the rules' vocabulary."""

    @abstractmethod
    def op(
        self,
        cls: type[NodeOp],
        parents: list[V],
        fields: dict[str, Any] | None = None,
        shape: Shape | None = None,
        record: Record | None = None,
    ) -> V:
        """Apply op `cls`; `shape` is needed only by ops with a declared shape (linear...)."""

    @abstractmethod
    def shape(self, value: V) -> Shape: ...

    # -- constants -------------------------------------------------------------------------

    def const(self, array: np.ndarray) -> V:
        array = np.asarray(array, dtype=np.float64)
        return self.op(ops.ConstOp, [], {"shape": array.shape}, array.shape, {"value": array})

    def full(self, shape: Shape, value: float) -> V:
        return self.const(np.full(shape, value, dtype=np.float64))

    def full_like(self, v: V, value: float) -> V:
        return self.full(self.shape(v), value)

    # -- elementwise -----------------------------------------------------------------------

    def unary(self, cls: type[NodeOp], a: V, **fields: Any) -> V:
        return self.op(cls, [a], fields or None)

    def add(self, a: V, b: V) -> V:
        return self.op(ops.AddOp, [a, b])

    def sub(self, a: V, b: V) -> V:
        return self.op(ops.SubOp, [a, b])

    def mul(self, a: V, b: V) -> V:
        return self.op(ops.MulElemOp, [a, b])

    def scale(self, a: V, k: float) -> V:
        return self.mul(a, self.full_like(a, k))

    def neg(self, a: V) -> V:
        return self.scale(a, -1.0)

    def one_minus(self, a: V) -> V:
        return self.sub(self.full_like(a, 1.0), a)

    def sign(self, a: V) -> V:
        return self.unary(SignOp, a)

    # -- layout ----------------------------------------------------------------------------

    def reshape(self, a: V, to: Shape) -> V:
        src = self.shape(a)
        if src == tuple(to):
            return a
        return self.op(ops.ReshapeOp, [a], {"from": src, "to": tuple(to)})

    def flatten(self, a: V) -> V:
        return self.op(ops.FlattenOp, [a], {"shape": self.shape(a)})

    def broadcast_to(self, a: V, to: Shape) -> V:
        src = self.shape(a)
        if src == tuple(to):
            return a
        return self.op(ops.BroadcastToOp, [a], {"from": src, "to": tuple(to)})

    def transpose(self, a: V, axis1: int, axis2: int) -> V:
        if axis1 == axis2:
            return a
        return self.op(ops.TransposeOp, [a], {"axis1": axis1, "axis2": axis2})

    def permute(self, a: V, perm: tuple[int, ...]) -> V:
        if tuple(perm) == tuple(range(len(perm))):
            return a
        return self.op(ops.PermuteOp, [a], {"perm": tuple(perm)})

    def swap_last(self, a: V) -> V:
        """Transpose the last two axes (matrix transpose, batched)."""
        r = len(self.shape(a))
        return self.transpose(a, r - 2, r - 1)

    # -- reductions ------------------------------------------------------------------------

    def reduce_sum(self, a: V, axis: int) -> V:
        return self.op(ops.ReduceSumOp, [a], {"axis": axis})

    def sum_all(self, a: V) -> V:
        return self.op(ops.SumOp, [a])

    def unreduce(self, a: V, axis: int, like: Shape) -> V:
        """Broadcast a value reduced along `axis` back to shape `like` (keepdims, then expand)."""
        kept = like[:axis] + (1,) + like[axis + 1 :]
        return self.broadcast_to(self.reshape(a, kept), like)

    def keep_sum(self, a: V, axis: int) -> V:
        """Sum along `axis`, broadcast back over it (softmax-style row sums)."""
        return self.unreduce(self.reduce_sum(a, axis), axis, self.shape(a))

    def keep_mean(self, a: V, axis: int) -> V:
        return self.scale(self.keep_sum(a, axis), 1.0 / self.shape(a)[axis])

    def sum_to(self, a: V, target: Shape) -> V:
        """The adjoint of `broadcast_to(target -> shape(a))`: sum the broadcast axes away."""
        shape = self.shape(a)
        extra = len(shape) - len(target)
        aligned = (1,) * extra + tuple(target)
        for axis in reversed(range(len(shape))):
            if aligned[axis] == 1 and shape[axis] != 1:
                a = self.reduce_sum(a, axis)
                shape = shape[:axis] + shape[axis + 1 :]
                aligned = aligned[:axis] + aligned[axis + 1 :]
        return self.reshape(a, target)

    def sum_except(self, a: V, keep: int) -> V:
        """Sum over every axis but `keep` (per-channel sums): shape [shape(a)[keep]]."""
        for axis in reversed(range(len(self.shape(a)))):
            if axis != keep:
                a = self.reduce_sum(a, axis)
        return a

    # -- contractions ----------------------------------------------------------------------

    def matmul(self, a: V, b: V) -> V:
        return self.op(ops.MatmulOp, [a, b])

    def linear(self, a: V, weight: np.ndarray) -> V:
        """x W^T at every leading index (no bias); `weight` is [out, in]."""
        shape = self.shape(a)[:-1] + (weight.shape[0],)
        return self.op(ops.LinearOp, [a], None, shape, {"weight": np.asarray(weight)})

    def rows(self, a: V) -> V:
        """View [..., n] as the matrix [prod(...), n]."""
        shape = self.shape(a)
        return self.reshape(a, (numel(shape[:-1]), shape[-1]))


class NumpyEmitter(Emitter[np.ndarray]):
    """Evaluates every op now, in float64, by its reference rule."""

    def op(
        self,
        cls: type[NodeOp],
        parents: list[np.ndarray],
        fields: dict[str, Any] | None = None,
        shape: Shape | None = None,
        record: Record | None = None,
    ) -> np.ndarray:
        node = cls(0, [], shape, fields)
        expected = node.infer([p.shape for p in parents])
        value = np.asarray(REFERENCE[cls](node, parents, record, np.float64))
        assert value.shape == expected, f"{cls.TAG}: produced {value.shape}, expected {expected}"
        return value

    def shape(self, value: np.ndarray) -> Shape:
        return value.shape


class GraphEmitter(Emitter[NodeOp]):
    """Appends each op as a node (ids continue the graph's) and keeps the new nodes' payload."""

    def __init__(self, block: Block, payload: Payload):
        self.block = block
        self.payload = payload
        self.next_id = sum(1 for op in block.ops if isinstance(op, NodeOp))

    def op(
        self,
        cls: type[NodeOp],
        parents: list[NodeOp],
        fields: dict[str, Any] | None = None,
        shape: Shape | None = None,
        record: Record | None = None,
    ) -> NodeOp:
        if shape is None:
            shape = cls(self.next_id, [], None, fields).infer([self.shape(p) for p in parents])
        node = cls(self.next_id, [p.result for p in parents], shape, fields)
        node.infer([self.shape(p) for p in parents])
        self.block.add_op(node)
        if record is not None:
            self.payload.records[node.id] = {k: np.asarray(v) for k, v in record.items()}
            self.payload.kinds[node.id] = cls.TAG
        self.next_id += 1
        return node

    def shape(self, value: NodeOp) -> Shape:
        shape = value.declared_shape
        assert shape is not None, "gradient graphs are built from shape-checked graphs"
        return shape
