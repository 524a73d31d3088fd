"""The node op base class and the op families: what every op kind of the `tl` dialect declares.

An op kind is one xDSL class (see `tlc.dialect.ops`); it states every op-level fact once:
- its name (`tl.relu`; the .tlir tag `relu` is derived from it), arity and typed metadata fields
  (`FIELDS`, with defaults; see `tlc.dialect.metadata`);
- its payload schema (`PAYLOAD`: the record's fields, their shapes, defaults such as `eps`, which
  are differentiable), checked by `tlc.semantics.payload_check` and read by every interpretation;
- its shape rule (`infer`), raising `ShapeError` with TorchLean's message text;
- the facts of its family that carry semantics: an elementwise op's numpy function, derivative,
  monotonicity and rounding error; its ONNX and PyTorch spellings; an optional decomposition into
  other ops. Interpretation tables (reference, intervals, derivatives, lowering, kernels,
  importers, exporters) derive their rules from these facts and hold explicit rules only where an
  op needs one.

Nothing here knows how an interpretation works: a derivative or a decomposition is written in the
emitter vocabulary (`em.mul`, `em.unary`, ...) that `tlc.semantics` passes in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeVar

import numpy as np
from xdsl.dialects.builtin import UNKNOWN_LOC, IntegerAttr, LocationAttr, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation, attr_def, result_def, var_operand_def

from tlc.core.attrs import id_attr, init_single_result
from tlc.dialect.metadata import Field, Kind, MetadataError, fmt_value, from_attr, to_attr
from tlc.dialect.shapes import Shape, ShapeError, check_axis, fmt_ids, fmt_shape
from tlc.dialect.types import shape_of_type, type_for

# --------------------------------------------------------------------------------------------
# Facts an op kind may declare
# --------------------------------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def absent_fact(method: F) -> F:
    """Marks a family's placeholder for a fact its op kinds may state (`NodeOp.defines`)."""
    method.absent_fact = True  # type: ignore[attr-defined]
    return method


class Monotone(Enum):
    """How an elementwise function orders its values; interval and linear-bound rules use it."""

    INCREASING = "increasing"
    DECREASING = "decreasing"
    NONE = "not monotone"


@dataclass(frozen=True)
class Param:
    """One field of an op's payload record.

    `shape(node, parent shapes, output shape)` is the field's expected shape (None: the op checks
    it itself, with its own message); `default` is the value an absent optional field takes;
    `scalar` fields hold one number (stored as a 0-d array); `differentiable` fields get a
    gradient in `tlc.grad` and the grad pass.
    """

    name: str
    shape: Callable[[Any, list[Shape], Shape], Shape | None] = lambda _n, _p, _o: None
    required: bool = True
    default: float | None = None
    scalar: bool = False
    differentiable: bool = True


@dataclass(frozen=True)
class OnnxSpelling:
    """The ONNX operator an op kind is (default domain): `attributes` maps each ONNX attribute
    name to the tl metadata field it sets (ONNX's default = the field's default)."""

    op_type: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TorchSpelling:
    """The PyTorch callables an op kind is: `functions` (dotted names such as
    `torch.nn.functional.relu`, called with the tensors first), `modules` (`torch.nn.ReLU`),
    tensor `methods` (`relu`); `arguments` are the tl fields read from the call's arguments after
    the tensors (by position or keyword) or from the module's attributes of the same name."""

    functions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# The node base class and families
# --------------------------------------------------------------------------------------------


class NodeOp(IRDLOperation):
    """A graph node. Subclasses set `name`, and where they differ from the defaults `ARITY`,
    `FIELDS`, `PAYLOAD`, `infer` and their family's facts."""

    #: The .tlir spelling, derived from `name` (`tl.relu` -> `relu`).
    TAG: ClassVar[str]
    ARITY: ClassVar[tuple[int, int | None]] = (1, 1)
    FIELDS: ClassVar[tuple[Field, ...]] = ()
    #: The payload record's fields; empty where the op reads no payload.
    PAYLOAD: ClassVar[tuple[Param, ...]] = ()
    ONNX: ClassVar[OnnxSpelling | None] = None
    TORCH: ClassVar[TorchSpelling | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive the tag from the name, and declare the op's upper-case facts (`ONNX = ...`)
        as the class constants xDSL's definition checker requires (`ClassVar`), so an op
        definition states each fact once without restating its type."""
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str) and name.startswith("tl."):
            cls.TAG = name.removeprefix("tl.")
        annotations = cls.__dict__.get("__annotations__")
        if annotations is None:
            annotations = {}
            cls.__annotations__ = annotations
        for key in list(cls.__dict__):
            if key.isupper() and key not in annotations:
                annotations[key] = ClassVar[Any]

    @absent_fact
    def decompose(self, em: Any, *parents: Any) -> Any:
        """The op written with other ops in the emitter vocabulary: the rule of every
        interpretation that has no explicit one. Op kinds that have one override this."""
        raise NotImplementedError(f"{self.TAG} has no decomposition")

    @classmethod
    def defines(cls, fact: str) -> bool:
        """Whether this op kind states the fact `fact` (a method such as `numpy`, `derivative`
        or `decompose`) rather than inheriting its family's placeholder for an absent fact."""
        rule = getattr(cls, fact, None)
        return rule is not None and not getattr(rule, "absent_fact", False)

    @classmethod
    def reads_payload(cls) -> bool:
        return bool(cls.PAYLOAD)

    @classmethod
    def payload_required(cls) -> bool:
        """True where a node of this kind cannot run without its record (shown as
        `payload=node_id` by `describe`)."""
        return any(p.required for p in cls.PAYLOAD)

    parents = var_operand_def()
    result = result_def()
    node_id = attr_def(IntegerAttr, attr_name="id")

    def __init__(
        self,
        node_id: int,
        parents: list[SSAValue],
        shape: Shape | None,
        fields: dict[str, Any] | None = None,
        location: LocationAttr | None = None,
    ):
        in_range = 0 <= node_id < 2**63  # else IntegerAttr raises xDSL's range error
        attrs: dict[str, Attribute] = {
            "id": id_attr(node_id) if in_range else IntegerAttr(node_id, i64)
        }
        for f in self.FIELDS:
            if fields is not None and f.name in fields:
                attrs[f.name] = to_attr(f, fields[f.name])
        # A node has exactly one variadic operand group, one result and no attribute defaults
        # (its fields' defaults are filled in above), which is all IRDL's generic builder
        # (`irdl_op_init`, half the cost of building a node) and `Operation.__init__` would
        # arrange.
        init_single_result(
            self,
            tuple([p.results[0] if isinstance(p, Operation) else p for p in parents]),
            type_for(shape),
            attrs,
            UNKNOWN_LOC if location is None else location,
        )

    # -- reading the node ------------------------------------------------------------------

    # The accessors below read the op's storage (`attributes`, `operands`, `results`) rather
    # than the IRDL descriptors (`node_id`, `parents`, `result`), which locate their field
    # anew at every access; the passes call them several times per node.

    @property
    def id(self) -> int:
        return self.attributes["id"].value.data  # type: ignore[attr-defined]

    @property
    def declared_shape(self) -> Shape | None:
        (result,) = self.results
        return shape_of_type(result.type)

    def meta(self, name: str) -> Any:
        """The value of metadata field `name` (raises MetadataError if missing or mistyped)."""
        return self._read(next(f for f in self.FIELDS if f.name == name))

    def metadata(self) -> dict[str, Any]:
        return {f.name: self._read(f) for f in self.FIELDS}

    def _read(self, field: Field) -> Any:
        attr = self.attributes.get(field.name)
        if attr is None:
            raise MetadataError(f"{self.TAG}: missing metadata field '{field.name}'")
        return from_attr(field, attr)

    def set_declared_shape(self, shape: Shape) -> None:
        """Give the node a declared shape; uses of its result see the new value."""
        (result,) = self.results
        # The value keeps its identity and its uses: `Rewriter.replace_value_with_new_type`
        # would make a new value and rebuild every user's operand list (a third of
        # infer-shapes on a large graph) to the same effect. xDSL keeps the type in `_type`.
        result._type = type_for(tuple(shape))

    # -- the op's contract -----------------------------------------------------------------

    def infer(self, parents: list[Shape]) -> Shape:
        """The output shape from the parents' shapes (called with the right parent count)."""
        raise NotImplementedError(f"{type(self).__name__} has no shape rule")

    def describe(self) -> str:
        """TorchLean's `OpKind.describe`: the tag with its metadata, as listings show it."""
        parts = [f"{f.name}={self._describe_value(f)}" for f in self.FIELDS]
        if self.payload_required():
            parts.append("payload=node_id")
        return f"{self.TAG}({', '.join(parts)})" if parts else self.TAG

    def _describe_value(self, field: Field) -> str:
        value = self.meta(field.name)
        return fmt_shape(value) if field.kind is Kind.INTS else fmt_value(field, value)

    def parent_ids(self) -> list[int]:
        """The node ids of the parents (the `id` of each operand's defining node)."""
        # `node_id_of` inlined, over the operand storage (`operands` wraps it in a new view)
        return [v.owner.attributes["id"].value.data for v in self._operands]  # type: ignore[attr-defined]

    def summary(self) -> str:
        """`Node(id=2, kind=relu, parents=#[1], outShape=[4])`, quoted by structure errors."""
        return (
            f"Node(id={self.id}, kind={self.describe()}, parents={fmt_ids(self.parent_ids())}, "
            f"outShape={fmt_shape(self.declared_shape)})"
        )

    def require_declared(self) -> Shape:
        declared = self.declared_shape
        if declared is None:
            raise ShapeError(f"{self.TAG}: the output shape must be declared")
        return declared


def node_id_of(value: SSAValue) -> int:
    """The id of the node defining `value` (node operands are always results of node ops)."""
    return value.owner.attributes["id"].value.data  # type: ignore[union-attr,attr-defined]


class DeclaredShapeOp(NodeOp):
    """Nodes whose output shape is part of the graph interface (inputs, random sources)."""

    def infer(self, parents: list[Shape]) -> Shape:
        """The declared shape (required)."""
        return self.require_declared()


class UnaryOp(NodeOp):
    """Elementwise unary ops: the shape passes through.

    Facts (each optional): `numpy(self, x)` the function on arrays, computed in x's dtype;
    `derivative(self, em, x, y)` dy/dx in the emitter vocabulary; `MONOTONE` (or `monotone()`
    where it depends on metadata); `ULPS`, the largest error of `numpy` in units of the last
    place (0: exact, the result is one of the inputs or a correctly rounded operation's result
    is not involved); `DOMAIN`, the inputs where the function is defined (`(0.0, False)`:
    x >= 0, `(0.0, True)`: x > 0).
    """

    MONOTONE: ClassVar[Monotone] = Monotone.NONE
    ULPS: ClassVar[int] = 0
    DOMAIN: ClassVar[tuple[float, bool] | None] = None

    def infer(self, parents: list[Shape]) -> Shape:
        """s → s."""
        return parents[0]

    def monotone(self) -> Monotone:
        return self.MONOTONE

    @absent_fact
    def numpy(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{self.TAG} has no numpy function")

    @absent_fact
    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        raise NotImplementedError(f"{self.TAG} has no derivative fact")


class BinaryOp(NodeOp):
    """Elementwise binary ops: no implicit broadcasting, both shapes must be equal.

    Facts: `numpy(self, a, b)` the function on arrays, in their dtype; `EXACT_MONOTONE` where
    the result is one of the inputs and non-decreasing in both (max, min).
    """

    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)
    EXACT_MONOTONE: ClassVar[bool] = False

    @absent_fact
    def numpy(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{self.TAG} has no numpy function")

    def infer(self, parents: list[Shape]) -> Shape:
        """Both parents must have the same shape (no implicit broadcasting); the result has that
        shape."""
        a, b = parents
        if a != b:
            raise ShapeError(f"{self.TAG}: shape mismatch: {fmt_shape(a)} vs {fmt_shape(b)}")
        return a


class AxisOp(NodeOp):
    """Unary ops along one valid axis that keep the shape (softmax, log_softmax)."""

    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        """`axis < rank`; s → s."""
        check_axis(self.meta("axis"), parents[0])
        return parents[0]


class ReductionOp(NodeOp):
    """Drop one non-empty axis."""

    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        """`axis < rank` and `s[axis] > 0`; the axis is dropped."""
        (s,) = parents
        axis = self.meta("axis")
        if not (axis < len(s) and s[axis] > 0):
            raise ShapeError(f"invalid or empty reduction axis {axis} for shape {fmt_shape(s)}")
        return s[:axis] + s[axis + 1 :]


def check_positive(tag: str, param: str, n: int) -> None:
    if n == 0:
        raise ShapeError(f"{tag}: {param} must be > 0")


def expect_parent_shape(tag: str, expected: Shape, got: Shape) -> None:
    """Ops that restate their parent's shape in metadata (broadcast_to, reshape, flatten)."""
    if got != expected:
        raise ShapeError(
            f"{tag}: parent shape mismatch: expected {fmt_shape(expected)}, got {fmt_shape(got)}"
        )


def stride_default(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    """`kernel`"""
    return tuple(fields["kernel"])


def zeros_per_axis(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    """zeros"""
    return (0,) * len(fields["kernel"])


def ones_per_axis(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    """ones"""
    return (1,) * len(fields["kernel"])


def padding_default(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    """`padding`"""
    return tuple(fields["padding"])


def pool_out_dim(size: int, kernel: int, stride: int, padding: int) -> int:
    """PyTorch's pooled extent; empty where the window cannot be placed (TorchLean's poolOutDim)."""
    if size == 0 or 2 * padding > kernel or size + 2 * padding < kernel:
        return 0
    return (size + 2 * padding - kernel) // stride + 1


def conv_out_dim(size: int, kernel: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    return (size + lo + hi - (dilation * (kernel - 1) + 1)) // stride + 1


class PoolOp(NodeOp):
    """Pooling over the spatial suffix (rank = len(kernel)); leading axes are kept."""

    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("kernel", Kind.INTS),
        Field("stride", Kind.INTS, stride_default),
        Field("padding", Kind.INTS, zeros_per_axis),
    )

    def describe(self) -> str:
        config = ", ".join(f"{f.name}={self._describe_value(f)}" for f in self.FIELDS)
        return f"{self.TAG}(config={{{config}}})"

    def infer(self, parents: list[Shape]) -> Shape:
        """`len(kernel)` is the spatial rank r (> 0, ≤ input rank); stride and padding have rank r;
        kernel and stride extents are non-zero. The last r axes become PyTorch's
        `floor((n + 2p - k) / s) + 1` (0 where the window cannot be placed); leading axes
        are kept."""
        (s,) = parents
        kernel, stride, padding = self.meta("kernel"), self.meta("stride"), self.meta("padding")
        rank = len(kernel)
        check_positive(self.TAG, "spatial rank", rank)
        if rank > len(s):
            raise ShapeError(f"{self.TAG}: kernel rank {rank} exceeds input rank {len(s)}")
        if len(stride) != rank or len(padding) != rank:
            raise ShapeError(
                f"{self.TAG}: axis-name, input, kernel, stride, and padding ranks must agree"
            )
        if 0 in kernel:
            raise ShapeError(f"{self.TAG}: kernel extents must be nonzero")
        if 0 in stride:
            raise ShapeError(f"{self.TAG}: stride extents must be nonzero")
        lead = len(s) - rank
        spatial = tuple(
            pool_out_dim(s[lead + i], kernel[i], stride[i], padding[i]) for i in range(rank)
        )
        return s[:lead] + spatial
