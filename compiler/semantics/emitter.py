"""The one tracing vocabulary: `bind` an op kind to operands and attributes, in some interpretation.

Everything that writes tl ops from Python writes them through an `Emitter`: derivative rules
(tlc.semantics.autodiff.rules), op decompositions (`NodeOp.decompose` in tlc.dialect), the grad
pass. `em.bind(OpClass, operands, attributes)` builds the op's node, runs the op's shape rule on
the operands' shapes (so a rule that would build an ill-shaped graph fails in every
interpretation) and hands the node to the instance (`evaluate`):

- `NumpyEmitter(rules, dtype)` evaluates the node at once with its reference rule, in `dtype`;
- `IntervalEmitter(rules, outward)` evaluates it on boxes with its interval rule;
- `GraphEmitter(block, payload)` appends it as a node to a `tl.graph` block and records the
  payload of the nodes it creates (constants, transposed weights); it is the one way nodes join
  a graph: programs, `trace` and the importers build through it too (their
  `tlc.semantics.program.GraphBuilder` is the program interface over a `GraphEmitter`).

So a decomposition or a derivative is written once and means the same in each interpretation
(JAX's rules-as-primitives, in miniature). The helpers below the primitive (`em.mul`,
`em.reshape`, `em.linear`, ...) are the vocabulary's words; each is one `bind`.

The rule tables are parameters, not imports: this module sits below the tables (the reference
table's decomposition rule evaluates decompositions with a `NumpyEmitter`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
from xdsl.ir import Block

from tlc.core.limits import check_elements
from tlc.core.payload import Payload, Record
from tlc.dialect import ops
from tlc.dialect.backward_ops import SignOp
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, ShapeError, fmt_shape, numel
from tlc.semantics.interval_arith import Box, Outward, sanitize

V = TypeVar("V")


def fill_defaults(
    cls: type[NodeOp], given: Mapping[str, Any], shape: Shape | None
) -> dict[str, Any]:
    """The op's metadata: the `given` fields, and each omitted one that has a default from its
    default (which may read the fields before it and the declared `shape`)."""
    fields = dict(given)
    for f in cls.FIELDS:
        if f.name not in fields and f.default is not None:
            fields[f.name] = f.default_value(fields, shape)
    return fields


def make_node(
    cls: type[NodeOp],
    id: int,
    operand_shapes: list[Shape],
    fields: Mapping[str, Any],
    shape: Shape | None,
) -> NodeOp:
    """Node `id` of op `cls` (no operands yet) with its declared shape: the one its shape rule
    infers from `operand_shapes`, which must equal `shape` where the op declares one. Raises
    ShapeError, so every way of building tl ops (emitters, programs, importers) checks alike."""
    node = cls(id, [], shape, dict(fields))
    out = node.infer(operand_shapes)
    if shape is None:
        node.set_declared_shape(out)
    elif out != tuple(shape):
        raise ShapeError(
            f"{cls.TAG}: declared shape {fmt_shape(tuple(shape))} does not match the inferred "
            f"{fmt_shape(out)}"
        )
    return node


def cast_record(node: NodeOp, record: Mapping[str, Any] | None, dtype: type) -> Record | None:
    """`record` as an interpretation in `dtype` reads it: arrays of `dtype`, the op's scalar
    payload fields (eps, ...) as 0-d arrays whatever shape the caller gave them."""
    if record is None:
        return None
    scalar = {p.name for p in type(node).PAYLOAD if p.scalar}
    return {
        k: np.asarray(v, dtype).reshape(() if k in scalar else np.shape(v))
        for k, v in record.items()
    }


class Emitter(ABC, Generic[V]):
    """Builds values of type V from tl ops; the helpers below `bind` are the rules' vocabulary."""

    def bind(
        self,
        cls: type[NodeOp],
        operands: list[V],
        attributes: Mapping[str, Any] | None = None,
        shape: Shape | None = None,
        record: Record | None = None,
    ) -> V:
        """Apply op `cls` to `operands` with metadata `attributes` (omitted fields take their
        defaults) and payload `record`; `shape` is needed only by ops with a declared output
        shape (linear, ...)."""
        return self.evaluate(self.node(cls, operands, attributes, shape), operands, record)

    def node(
        self,
        cls: type[NodeOp],
        operands: list[V],
        attributes: Mapping[str, Any] | None = None,
        shape: Shape | None = None,
    ) -> NodeOp:
        """The op's node (not yet in any graph) with its declared shape, checked by the op's
        shape rule against the operands' shapes (raises ShapeError)."""
        fields = fill_defaults(cls, attributes or {}, shape)
        return make_node(cls, self.next_id(), [self.shape(v) for v in operands], fields, shape)

    def next_id(self) -> int:
        """The id a new node gets (meaningful only where nodes join a graph)."""
        return 0

    @abstractmethod
    def evaluate(self, node: NodeOp, operands: list[V], record: Record | None) -> V:
        """This interpretation's value of `node` applied to `operands`."""

    @abstractmethod
    def shape(self, value: V) -> Shape: ...

    # -- constants -------------------------------------------------------------------------

    def const(self, array: np.ndarray) -> V:
        array = np.asarray(array, dtype=np.float64)
        return self.bind(ops.ConstOp, [], {"shape": array.shape}, array.shape, {"value": array})

    def full(self, shape: Shape, value: float) -> V:
        """A constant filled with `value`, built in memory: within the element budget
        (`tlc.core.limits`; LimitError otherwise), which a shape like [0, 2^62] is not."""
        check_elements(shape, "constant")
        return self.const(np.full(shape, value, dtype=np.float64))

    def full_like(self, v: V, value: float) -> V:
        return self.full(self.shape(v), value)

    # -- elementwise -----------------------------------------------------------------------

    def unary(self, cls: type[NodeOp], a: V, **fields: Any) -> V:
        return self.bind(cls, [a], fields or None)

    def add(self, a: V, b: V) -> V:
        return self.bind(ops.AddOp, [a, b])

    def sub(self, a: V, b: V) -> V:
        return self.bind(ops.SubOp, [a, b])

    def mul(self, a: V, b: V) -> V:
        return self.bind(ops.MulElemOp, [a, b])

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
        return self.bind(ops.ReshapeOp, [a], {"from": src, "to": tuple(to)})

    def flatten(self, a: V) -> V:
        return self.bind(ops.FlattenOp, [a], {"shape": self.shape(a)})

    def broadcast_to(self, a: V, to: Shape) -> V:
        src = self.shape(a)
        if src == tuple(to):
            return a
        return self.bind(ops.BroadcastToOp, [a], {"from": src, "to": tuple(to)})

    def transpose(self, a: V, axis1: int, axis2: int) -> V:
        if axis1 == axis2:
            return a
        return self.bind(ops.TransposeOp, [a], {"axis1": axis1, "axis2": axis2})

    def permute(self, a: V, perm: tuple[int, ...]) -> V:
        if tuple(perm) == tuple(range(len(perm))):
            return a
        return self.bind(ops.PermuteOp, [a], {"perm": tuple(perm)})

    def swap_last(self, a: V) -> V:
        """Transpose the last two axes (matrix transpose, batched)."""
        r = len(self.shape(a))
        return self.transpose(a, r - 2, r - 1)

    # -- reductions ------------------------------------------------------------------------

    def reduce_sum(self, a: V, axis: int) -> V:
        """The sum along `axis`. Over an empty axis it is zeros (the empty sum), built as a
        constant: the op's shape rule refuses an empty axis, as TorchLean's does, but the
        rules written in this vocabulary (gradients through broadcasts, softmax, linear with
        no inputs) reduce over whatever axes their operands have."""
        shape = self.shape(a)
        if shape[axis] == 0:
            return self.full(shape[:axis] + shape[axis + 1 :], 0.0)
        return self.bind(ops.ReduceSumOp, [a], {"axis": axis})

    def sum_all(self, a: V) -> V:
        return self.bind(ops.SumOp, [a])

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
        return self.bind(ops.MatmulOp, [a, b])

    def linear(self, a: V, weight: np.ndarray) -> V:
        """x W^T at every leading index (no bias); `weight` is [out, in]."""
        shape = self.shape(a)[:-1] + (weight.shape[0],)
        return self.bind(ops.LinearOp, [a], None, shape, {"weight": np.asarray(weight)})

    def rows(self, a: V) -> V:
        """View [..., n] as the matrix [prod(...), n]."""
        shape = self.shape(a)
        return self.reshape(a, (numel(shape[:-1]), shape[-1]))


#: A reference rule: (node, parent values, record, dtype) -> value (tlc.semantics.reference).
ValueRule = Callable[[NodeOp, list[np.ndarray], "Record | None", Any], np.ndarray]


class NumpyEmitter(Emitter[np.ndarray]):
    """Evaluates every op now, in `dtype`, by its rule in `rules` (the reference table)."""

    def __init__(self, rules: Mapping[type, ValueRule], dtype: type = np.float64) -> None:
        self.rules = rules
        self.dtype = dtype

    def evaluate(
        self, node: NodeOp, operands: list[np.ndarray], record: Record | None
    ) -> np.ndarray:
        cast = cast_record(node, record, self.dtype)
        value = np.asarray(self.rules[type(node)](node, operands, cast, self.dtype))
        expected = node.declared_shape
        assert value.shape == expected, f"{node.TAG}: produced {value.shape}, expected {expected}"
        return value

    def shape(self, value: np.ndarray) -> Shape:
        return value.shape


#: An interval rule: (node, parent boxes, record, outward rounding) -> box or None
#: (tlc.semantics.ibp).
BoxRule = Callable[[NodeOp, list[Box], "Record | None", Outward], "Box | None"]


class NoBox(Exception):
    """An op of an emitted composition has no box (out of its domain, or no rule)."""


class IntervalEmitter(Emitter[Box]):
    """Evaluates every op now on boxes by its rule in `rules` (the interval table), rounded
    outward for `outward.dtype`; raises `NoBox` where a rule gives none. Record fields are taken
    as the run's dtype holds them (a float32 run multiplies by float32 constants)."""

    def __init__(self, rules: Mapping[type, BoxRule], outward: Outward) -> None:
        self.rules = rules
        self.outward = outward

    def evaluate(self, node: NodeOp, operands: list[Box], record: Record | None) -> Box:
        rule = self.rules.get(type(node))
        cast = cast_record(node, record, self.outward.dtype)
        if cast is not None:
            cast = {k: v.astype(np.float64) for k, v in cast.items()}
        box = None if rule is None else rule(node, operands, cast, self.outward)
        if box is None:
            raise NoBox(node.TAG)
        return sanitize(Box(*np.broadcast_arrays(box.lo, box.hi)))

    def shape(self, value: Box) -> Shape:
        return value.shape


class GraphEmitter(Emitter[NodeOp]):
    """Appends each op as a node (ids continue the graph's) and keeps the new nodes' payload."""

    def __init__(self, block: Block, payload: Payload):
        self.block = block
        self.payload = payload
        self._next_id = sum(1 for op in block.ops if isinstance(op, NodeOp))

    def next_id(self) -> int:
        return self._next_id

    def evaluate(self, node: NodeOp, operands: list[NodeOp], record: Record | None) -> NodeOp:
        node.operands = [p.result for p in operands]
        self.block.add_op(node)
        if record is not None:
            self.payload.records[node.id] = {
                k: np.asarray(v, np.float64) for k, v in record.items()
            }
            self.payload.kinds[node.id] = node.TAG
        self._next_id += 1
        return node

    def shape(self, value: NodeOp) -> Shape:
        shape = value.declared_shape
        assert shape is not None, "gradient graphs are built from shape-checked graphs"
        return shape
