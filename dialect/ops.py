"""The `tl` dialect: every op kind of the graph IR, each defined once with its shape rule.

A node op's parents are its operands (variadic, so a document with the wrong parent count still
loads and verify-structure can report it), its declared output shape is its result type, and its
node id is the `id` attribute (so `nodes[2].id = 7` can be represented and reported). Op-local
metadata fields are declared in `FIELDS` (see `tlc.dialect.metadata`). Families share a base class,
so a new elementwise op is a name and a tag.

Shape rules raise `ShapeError` with TorchLean's message text (reference/torchlean-ir.md §2).
"""

from __future__ import annotations

from typing import Any, ClassVar

from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.rewriter import Rewriter
from xdsl.traits import IsolatedFromAbove, NoTerminator, SymbolOpInterface

from tlc.dialect.metadata import Field, Kind, MetadataError, fmt_value, from_attr, to_attr
from tlc.dialect.shapes import (
    Shape,
    ShapeError,
    can_broadcast_to,
    check_axis,
    fmt_ids,
    fmt_shape,
    numel,
)
from tlc.dialect.types import TensorType, shape_of_type, type_for

# --------------------------------------------------------------------------------------------
# The node base class and families
# --------------------------------------------------------------------------------------------


class NodeOp(IRDLOperation):
    """A graph node. Subclasses set `name`, `TAG`, `ARITY`, `FIELDS` and `infer`."""

    TAG: ClassVar[str]
    ARITY: ClassVar[tuple[int, int | None]] = (1, 1)
    FIELDS: ClassVar[tuple[Field, ...]] = ()
    #: True where the op reads parameters from the payload (shown as `payload=node_id`).
    USES_PAYLOAD: ClassVar[bool] = False

    parents = var_operand_def()
    result = result_def()
    node_id = attr_def(IntegerAttr, attr_name="id")

    def __init__(
        self,
        node_id: int,
        parents: list[SSAValue],
        shape: Shape | None,
        fields: dict[str, Any] | None = None,
    ):
        attrs: dict[str, Attribute] = {"id": IntegerAttr(node_id, i64)}
        for f in self.FIELDS:
            if fields is not None and f.name in fields:
                attrs[f.name] = to_attr(f, fields[f.name])
        super().__init__(operands=[parents], result_types=[type_for(shape)], attributes=attrs)

    # -- reading the node ------------------------------------------------------------------

    @property
    def id(self) -> int:
        return self.node_id.value.data

    @property
    def declared_shape(self) -> Shape | None:
        return shape_of_type(self.result.type)

    def meta(self, name: str) -> Any:
        """The value of metadata field `name` (raises MetadataError if missing or mistyped)."""
        field = next(f for f in self.FIELDS if f.name == name)
        attr = self.attributes.get(name)
        if attr is None:
            raise MetadataError(f"{self.TAG}: missing metadata field '{name}'")
        return from_attr(field, attr)

    def metadata(self) -> dict[str, Any]:
        return {f.name: self.meta(f.name) for f in self.FIELDS}

    def set_declared_shape(self, shape: Shape) -> None:
        """Give the node a declared shape; uses of its result see the new value."""
        Rewriter.replace_value_with_new_type(self.result, TensorType(shape))

    # -- the op's contract -----------------------------------------------------------------

    def infer(self, parents: list[Shape]) -> Shape:
        """The output shape from the parents' shapes (called with the right parent count)."""
        raise NotImplementedError(f"{type(self).__name__} has no shape rule")

    def describe(self) -> str:
        """TorchLean's `OpKind.describe`: the tag with its metadata, as listings show it."""
        parts = [f"{f.name}={self._describe_value(f)}" for f in self.FIELDS]
        if self.USES_PAYLOAD:
            parts.append("payload=node_id")
        return f"{self.TAG}({', '.join(parts)})" if parts else self.TAG

    def _describe_value(self, field: Field) -> str:
        value = self.meta(field.name)
        return fmt_shape(value) if field.kind is Kind.INTS else fmt_value(field, value)

    def parent_ids(self) -> list[int]:
        """The node ids of the parents (the `id` of each operand's defining node)."""
        return [node_id_of(v) for v in self.parents]

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
    owner = value.owner
    assert isinstance(owner, NodeOp), "node operands are always results of node ops"
    return owner.id


class DeclaredShapeOp(NodeOp):
    """Nodes whose output shape is part of the graph interface (inputs, random sources)."""

    def infer(self, parents: list[Shape]) -> Shape:
        return self.require_declared()


class UnaryOp(NodeOp):
    """Elementwise unary ops: the shape passes through."""

    def infer(self, parents: list[Shape]) -> Shape:
        return parents[0]


class BinaryOp(NodeOp):
    """Elementwise binary ops: no implicit broadcasting, both shapes must be equal."""

    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, parents: list[Shape]) -> Shape:
        a, b = parents
        if a != b:
            raise ShapeError(f"{self.TAG}: shape mismatch: {fmt_shape(a)} vs {fmt_shape(b)}")
        return a


class AxisOp(NodeOp):
    """Unary ops along one valid axis that keep the shape (softmax, log_softmax)."""

    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        check_axis(self.meta("axis"), parents[0])
        return parents[0]


class ReductionOp(NodeOp):
    """Drop one non-empty axis."""

    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        axis = self.meta("axis")
        if not (axis < len(s) and s[axis] > 0):
            raise ShapeError(f"invalid or empty reduction axis {axis} for shape {fmt_shape(s)}")
        return s[:axis] + s[axis + 1 :]


def _check_positive(tag: str, param: str, n: int) -> None:
    if n == 0:
        raise ShapeError(f"{tag}: {param} must be > 0")


def _expect_parent_shape(tag: str, expected: Shape, got: Shape) -> None:
    """Ops that restate their parent's shape in metadata (broadcast_to, reshape, flatten)."""
    if got != expected:
        raise ShapeError(
            f"{tag}: parent shape mismatch: expected {fmt_shape(expected)}, got {fmt_shape(got)}"
        )


def _default_stride(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    return tuple(fields["kernel"])


def _zeros(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    return (0,) * len(fields["kernel"])


def _ones(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    return (1,) * len(fields["kernel"])


def _same_padding(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
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
        Field("stride", Kind.INTS, _default_stride),
        Field("padding", Kind.INTS, _zeros),
    )

    def describe(self) -> str:
        config = ", ".join(f"{f.name}={self._describe_value(f)}" for f in self.FIELDS)
        return f"{self.TAG}(config={{{config}}})"

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        kernel, stride, padding = self.meta("kernel"), self.meta("stride"), self.meta("padding")
        rank = len(kernel)
        _check_positive(self.TAG, "spatial rank", rank)
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


# --------------------------------------------------------------------------------------------
# The op kinds
# --------------------------------------------------------------------------------------------


@irdl_op_definition
class InputOp(DeclaredShapeOp):
    """`%0 = input : [4]` — the graph input; its shape is the graph's interface."""

    name = "tl.input"
    TAG: ClassVar[str] = "input"
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)


@irdl_op_definition
class ConstOp(NodeOp):
    """`%3 = const {shape = [2]} : [2]` — a constant whose values live in the payload."""

    name = "tl.const"
    TAG: ClassVar[str] = "const"
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("shape", Kind.INTS, lambda _f, declared: declared),
    )

    def describe(self) -> str:
        return f"const(shape={fmt_shape(self.meta('shape'))})"

    def infer(self, parents: list[Shape]) -> Shape:
        return self.meta("shape")


@irdl_op_definition
class PermuteOp(NodeOp):
    """`%1 = permute(%0) {perm = [0, 2, 1]}` — output axis i is input axis perm[i]."""

    name = "tl.permute"
    TAG: ClassVar[str] = "permute"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("perm", Kind.INTS),)

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        perm = self.meta("perm")
        r, text = len(perm), fmt_shape(perm)
        seen: set[int] = set()
        for p in perm:
            if p >= r:
                raise ShapeError(f"permute: axis {p} out of range for rank {r} in {text}")
            if p in seen:
                raise ShapeError(f"permute: duplicate axis {p} in {text}")
            seen.add(p)
        if r != len(s):
            raise ShapeError(f"permute: invalid permutation {text} for shape {fmt_shape(s)}")
        return tuple(s[p] for p in perm)


@irdl_op_definition
class TransposeOp(NodeOp):
    """`%1 = transpose(%0) {axis1 = 0, axis2 = 2}` — swap two axes."""

    name = "tl.transpose"
    TAG: ClassVar[str] = "transpose"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis1", Kind.INT), Field("axis2", Kind.INT))

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        a, b = self.meta("axis1"), self.meta("axis2")
        for axis in (a, b):
            if axis >= len(s):
                raise ShapeError(f"transpose: axis {axis} out of range for rank {len(s)}")
        out = list(s)
        out[a], out[b] = s[b], s[a]
        return tuple(out)


@irdl_op_definition
class DetachOp(UnaryOp):
    """`%2 = detach(%1)` — identity forward, stops gradients."""

    name = "tl.detach"
    TAG: ClassVar[str] = "detach"


@irdl_op_definition
class RandUniformOp(DeclaredShapeOp):
    """`%0 = rand_uniform {seed = 7} : [3]` — deterministic U[0,1) samples."""

    name = "tl.rand_uniform"
    TAG: ClassVar[str] = "rand_uniform"
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("seed", Kind.INT),)


@irdl_op_definition
class BernoulliMaskOp(NodeOp):
    """`%2 = bernoulli_mask(%1) {seed = 7} : [3]` — a {0,1} mask; the parent is keepProb []."""

    name = "tl.bernoulli_mask"
    TAG: ClassVar[str] = "bernoulli_mask"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("seed", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        if parents[0] != ():
            raise ShapeError(
                f"bernoulli_mask: expected scalar keepProb parent, got {fmt_shape(parents[0])}"
            )
        return self.require_declared()


@irdl_op_definition
class AddOp(BinaryOp):
    """`%2 = add(%0, %1)` — elementwise a + b."""

    name = "tl.add"
    TAG: ClassVar[str] = "add"


@irdl_op_definition
class SubOp(BinaryOp):
    """`%2 = sub(%0, %1)` — elementwise a - b."""

    name = "tl.sub"
    TAG: ClassVar[str] = "sub"


@irdl_op_definition
class MulElemOp(BinaryOp):
    """`%2 = mul_elem(%0, %1)` — elementwise a * b."""

    name = "tl.mul_elem"
    TAG: ClassVar[str] = "mul_elem"


@irdl_op_definition
class MaxElemOp(BinaryOp):
    """`%2 = max_elem(%0, %1)` — elementwise max."""

    name = "tl.max_elem"
    TAG: ClassVar[str] = "max_elem"


@irdl_op_definition
class MinElemOp(BinaryOp):
    """`%2 = min_elem(%0, %1)` — elementwise min."""

    name = "tl.min_elem"
    TAG: ClassVar[str] = "min_elem"


@irdl_op_definition
class AbsOp(UnaryOp):
    """`%1 = abs(%0)` — |x|."""

    name = "tl.abs"
    TAG: ClassVar[str] = "abs"


@irdl_op_definition
class SqrtOp(UnaryOp):
    """`%1 = sqrt(%0)` — square root."""

    name = "tl.sqrt"
    TAG: ClassVar[str] = "sqrt"


@irdl_op_definition
class ReluOp(UnaryOp):
    """`%1 = relu(%0)` — max(x, 0)."""

    name = "tl.relu"
    TAG: ClassVar[str] = "relu"


@irdl_op_definition
class TanhOp(UnaryOp):
    """`%1 = tanh(%0)`."""

    name = "tl.tanh"
    TAG: ClassVar[str] = "tanh"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    """`%1 = sigmoid(%0)` — 1 / (1 + e^-x)."""

    name = "tl.sigmoid"
    TAG: ClassVar[str] = "sigmoid"


@irdl_op_definition
class SoftplusOp(UnaryOp):
    """`%1 = softplus(%0)` — log(1 + e^x), stable."""

    name = "tl.softplus"
    TAG: ClassVar[str] = "softplus"


@irdl_op_definition
class ExpOp(UnaryOp):
    """`%1 = exp(%0)`."""

    name = "tl.exp"
    TAG: ClassVar[str] = "exp"


@irdl_op_definition
class LogOp(UnaryOp):
    """`%1 = log(%0)` — fails on inputs <= 0 or NaN."""

    name = "tl.log"
    TAG: ClassVar[str] = "log"


@irdl_op_definition
class InvOp(UnaryOp):
    """`%1 = inv(%0)` — 1 / x."""

    name = "tl.inv"
    TAG: ClassVar[str] = "inv"


@irdl_op_definition
class SinOp(UnaryOp):
    """`%1 = sin(%0)`."""

    name = "tl.sin"
    TAG: ClassVar[str] = "sin"


@irdl_op_definition
class CosOp(UnaryOp):
    """`%1 = cos(%0)`."""

    name = "tl.cos"
    TAG: ClassVar[str] = "cos"


@irdl_op_definition
class GeluOp(UnaryOp):
    """`%1 = gelu(%0) {approximate = "tanh"}` — exact erf form by default (PyTorch's meaning)."""

    name = "tl.gelu"
    TAG: ClassVar[str] = "gelu"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("approximate", Kind.STR, lambda _f, _d: "none", ("none", "tanh")),
    )


@irdl_op_definition
class MaxPoolOp(PoolOp):
    """`%1 = max_pool(%0) {kernel = [2, 2], stride = [2, 2], padding = [0, 0]}`."""

    name = "tl.max_pool"
    TAG: ClassVar[str] = "max_pool"


@irdl_op_definition
class AvgPoolOp(PoolOp):
    """`%1 = avg_pool(%0) {kernel = [2, 2]}` — zero padding counts in the divisor."""

    name = "tl.avg_pool"
    TAG: ClassVar[str] = "avg_pool"


@irdl_op_definition
class BroadcastToOp(NodeOp):
    """`%1 = broadcast_to(%0) {from = [3], to = [2, 3]}` — explicit broadcasting."""

    name = "tl.broadcast_to"
    TAG: ClassVar[str] = "broadcast_to"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("from", Kind.INTS), Field("to", Kind.INTS))

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        src, dst = self.meta("from"), self.meta("to")
        _expect_parent_shape(self.TAG, src, s)
        if not can_broadcast_to(src, dst):
            raise ShapeError(
                f"broadcast_to: invalid broadcast from {fmt_shape(src)} to {fmt_shape(dst)}"
            )
        return dst


@irdl_op_definition
class ReduceSumOp(ReductionOp):
    """`%1 = reduce_sum(%0) {axis = 1}` — sum along an axis, which is dropped."""

    name = "tl.reduce_sum"
    TAG: ClassVar[str] = "reduce_sum"


@irdl_op_definition
class ReduceMeanOp(ReductionOp):
    """`%1 = reduce_mean(%0) {axis = 1}` — mean along an axis, which is dropped."""

    name = "tl.reduce_mean"
    TAG: ClassVar[str] = "reduce_mean"


@irdl_op_definition
class SumOp(NodeOp):
    """`%4 = sum(%3) : []` — sum of every element, a scalar."""

    name = "tl.sum"
    TAG: ClassVar[str] = "sum"

    def infer(self, parents: list[Shape]) -> Shape:
        return ()


@irdl_op_definition
class MatmulOp(NodeOp):
    """`%2 = matmul(%0, %1)` — (...,m,n) x (...,n,p) -> (...,m,p), identical leading dims."""

    name = "tl.matmul"
    TAG: ClassVar[str] = "matmul"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, parents: list[Shape]) -> Shape:
        a, b = parents
        if len(a) < 2 or len(b) < 2:
            raise ShapeError(
                f"matmul: expected rank≥2 inputs, got {fmt_shape(a)} and {fmt_shape(b)}"
            )
        if a[:-2] != b[:-2]:
            raise ShapeError(
                f"matmul: leading dimensions mismatch: {fmt_shape(a[:-2])} vs {fmt_shape(b[:-2])}"
            )
        if a[-1] != b[-2]:
            raise ShapeError(f"matmul: inner dims mismatch: {a[-1]} vs {b[-2]}")
        return a[:-1] + (b[-1],)


@irdl_op_definition
class LinearOp(NodeOp):
    """`%1 = linear(%0) : [5]` — W x + b at every leading index; W [out, in] from the payload."""

    name = "tl.linear"
    TAG: ClassVar[str] = "linear"
    USES_PAYLOAD: ClassVar[bool] = True

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        out = self.require_declared()
        if not s or not out:
            raise ShapeError(
                f"linear: expected rank≥1 input/output, got input={fmt_shape(s)}, "
                f"out={fmt_shape(out)}"
            )
        if s[:-1] != out[:-1]:
            raise ShapeError(
                f"linear: leading dimensions must be preserved: input={fmt_shape(s)}, "
                f"outShape={fmt_shape(out)}"
            )
        return out


@irdl_op_definition
class ConvOp(NodeOp):
    """`%1 = conv(%0) {kernel = [3, 3], in_channels = 3, out_channels = 8, ...}`.

    Channels at `channel_axis` (default 0), spatial axes after it; kernel [out, in/groups, k...]
    and bias [out] come from the payload.
    """

    name = "tl.conv"
    TAG: ClassVar[str] = "conv"
    USES_PAYLOAD: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("kernel", Kind.INTS),
        Field("stride", Kind.INTS, _ones),
        Field("padding", Kind.INTS, _zeros),
        Field("dilation", Kind.INTS, _ones),
        Field("padding_after", Kind.INTS, _same_padding),
        Field("groups", Kind.INT, lambda _f, _d: 1),
        Field("channel_axis", Kind.INT, lambda _f, _d: 0),
        Field("in_channels", Kind.INT),
        Field("out_channels", Kind.INT),
    )

    def describe(self) -> str:
        config = ", ".join(f"{f.name}={self._describe_value(f)}" for f in self.FIELDS)
        return f"conv(config={{{config}}}, payload=node_id)"

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        m = self.metadata()
        tag, groups = self.TAG, m["groups"]
        cin, cout, axis = m["in_channels"], m["out_channels"], m["channel_axis"]
        _check_positive(tag, "inChannels", cin)
        _check_positive(tag, "outChannels", cout)
        _check_positive(tag, "groups", groups)
        if cin % groups:
            raise ShapeError(f"{tag}: in_channels={cin} is not divisible by groups={groups}")
        if cout % groups:
            raise ShapeError(f"{tag}: out_channels={cout} is not divisible by groups={groups}")
        check_axis(axis, s)
        if s[axis] != cin:
            raise ShapeError(f"{tag}: input-channel mismatch: op={cin} vs input={s[axis]}")
        spatial = s[axis + 1 :]
        rank = len(m["kernel"])
        if len(spatial) != rank:
            raise ShapeError(
                f"{tag}: kernel rank {rank} does not match the {len(spatial)} spatial axes "
                f"after channel axis {axis}"
            )
        geometry = [m["stride"], m["dilation"], m["padding"], m["padding_after"]]
        if any(len(g) != rank for g in geometry):
            raise ShapeError(f"{tag}: spatial metadata ranks must agree")
        out = []
        for i, size in enumerate(spatial):
            k, st, dil = m["kernel"][i], m["stride"][i], m["dilation"][i]
            lo, hi = m["padding"][i], m["padding_after"][i]
            name = f"axis {axis + 1 + i}"
            _check_positive(tag, f"{name} kernel", k)
            _check_positive(tag, f"{name} stride", st)
            _check_positive(tag, f"{name} dilation", dil)
            effective = dil * (k - 1) + 1
            if size + lo + hi < effective:
                raise ShapeError(
                    f"{tag}: {name} window does not fit padded input: input={size}, "
                    f"padding=({lo}, {hi}), effectiveKernel={effective}"
                )
            out.append(conv_out_dim(size, k, st, dil, lo, hi))
        return s[:axis] + (cout,) + tuple(out)


@irdl_op_definition
class BatchNormEvalOp(NodeOp):
    """`%1 = batch_norm_eval(%0) {channel_axis = 0, channels = 3}` — gamma, beta, mean, var
    and eps from the payload."""

    name = "tl.batch_norm_eval"
    TAG: ClassVar[str] = "batch_norm_eval"
    USES_PAYLOAD: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("channel_axis", Kind.INT),
        Field("channels", Kind.INT),
    )

    def describe(self) -> str:
        return (
            f"batch_norm_eval(channelAxis={self.meta('channel_axis')}, "
            f"channels={self.meta('channels')}, payload=node_id)"
        )

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        axis, channels = self.meta("channel_axis"), self.meta("channels")
        _check_positive("batch_norm_eval", "channels", channels)
        check_axis(axis, s)
        if s[axis] != channels:
            raise ShapeError(f"batch_norm_eval: channel mismatch: op={channels} vs input={s[axis]}")
        return s


@irdl_op_definition
class SafeLogOp(NodeOp):
    """`%2 = safe_log(%0, %1)` — log(softplus(x) + eps); the second parent is the scalar eps."""

    name = "tl.safe_log"
    TAG: ClassVar[str] = "safe_log"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def describe(self) -> str:
        return "safe_log(epsilon=scalar_parent)"

    def infer(self, parents: list[Shape]) -> Shape:
        s, eps = parents
        if eps != ():
            raise ShapeError(f"safe_log: epsilon must be scalar, got {fmt_shape(eps)}")
        return s


@irdl_op_definition
class SoftmaxOp(AxisOp):
    """`%1 = softmax(%0) {axis = 1}` — torch.softmax(x, dim=axis)."""

    name = "tl.softmax"
    TAG: ClassVar[str] = "softmax"


@irdl_op_definition
class LogSoftmaxOp(AxisOp):
    """`%1 = log_softmax(%0) {axis = 1}` — stable torch.log_softmax(x, dim=axis)."""

    name = "tl.log_softmax"
    TAG: ClassVar[str] = "log_softmax"


@irdl_op_definition
class HardMaskedSoftmaxOp(NodeOp):
    """`%1 = hard_masked_softmax(%0) {mask_shape = [2, 2], allowed = [true, false, true, true]}`
    — softmax over the last axis among allowed entries; blocked entries (and fully blocked rows)
    give 0."""

    name = "tl.hard_masked_softmax"
    TAG: ClassVar[str] = "hard_masked_softmax"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("mask_shape", Kind.INTS),
        Field("allowed", Kind.BOOLS),
    )

    def describe(self) -> str:
        return f"hard_masked_softmax(maskShape={fmt_shape(self.meta('mask_shape'))})"

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        mask_shape, allowed = self.meta("mask_shape"), self.meta("allowed")
        if len(allowed) != numel(mask_shape):
            raise ShapeError(
                f"hard_masked_softmax: mask has {len(allowed)} entries, "
                f"expected {numel(mask_shape)} for shape {fmt_shape(mask_shape)}"
            )
        if mask_shape != s:
            raise ShapeError(
                f"hard_masked_softmax: mask shape mismatch: {fmt_shape(mask_shape)} "
                f"vs {fmt_shape(s)}"
            )
        if not s:
            raise ShapeError("hard_masked_softmax: expected rank≥1 input, got []")
        return s


@irdl_op_definition
class LayernormOp(NodeOp):
    """`%1 = layernorm(%0) {axis = 1}` — normalise over s[axis:] (PyTorch's normalized_shape);
    optional gamma/beta/eps from the payload (defaults 1, 0, 1e-5)."""

    name = "tl.layernorm"
    TAG: ClassVar[str] = "layernorm"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        axis = self.meta("axis")
        check_axis(axis, s)
        _check_positive("layernorm", "embedDim", numel(s[axis:]))
        return s


@irdl_op_definition
class ReshapeOp(NodeOp):
    """`%1 = reshape(%0) {from = [2, 3], to = [6]}` — same elements, row-major."""

    name = "tl.reshape"
    TAG: ClassVar[str] = "reshape"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("from", Kind.INTS), Field("to", Kind.INTS))

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        src, dst = self.meta("from"), self.meta("to")
        _expect_parent_shape(self.TAG, src, s)
        if numel(src) != numel(dst):
            raise ShapeError(f"reshape: numel mismatch: {numel(src)} vs {numel(dst)}")
        return dst


@irdl_op_definition
class FlattenOp(NodeOp):
    """`%1 = flatten(%0) {shape = [2, 3]} : [6]` — to a vector of numel(shape)."""

    name = "tl.flatten"
    TAG: ClassVar[str] = "flatten"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("shape", Kind.INTS),)

    def infer(self, parents: list[Shape]) -> Shape:
        (s,) = parents
        expected = self.meta("shape")
        _expect_parent_shape(self.TAG, expected, s)
        return (numel(s),)


@irdl_op_definition
class ConcatOp(NodeOp):
    """`%3 = concat(%1, %2) {axis = 1}` — same rank, other extents equal, axis extents summed."""

    name = "tl.concat"
    TAG: ClassVar[str] = "concat"
    ARITY: ClassVar[tuple[int, int | None]] = (2, None)
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        axis = self.meta("axis")
        first = parents[0]
        check_axis(axis, first)
        dims = list(first)
        for shape in parents[1:]:
            if len(shape) != len(dims):
                raise ShapeError("concat: rank mismatch")
            for i, (expected, actual) in enumerate(zip(dims, shape, strict=True)):
                if i == axis:
                    dims[i] = expected + actual
                elif actual != expected:
                    raise ShapeError(
                        f"concat: non-axis dim mismatch at axis {i}: expected {expected}, "
                        f"got {actual}"
                    )
        return tuple(dims)


@irdl_op_definition
class MseLossOp(NodeOp):
    """`%2 = mse_loss(%0, %1) : []` — mean of (yhat - target)^2."""

    name = "tl.mse_loss"
    TAG: ClassVar[str] = "mse_loss"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, parents: list[Shape]) -> Shape:
        a, b = parents
        if a != b:
            raise ShapeError(
                f"mse_loss: yhat/target shape mismatch: {fmt_shape(a)} vs {fmt_shape(b)}"
            )
        return ()


# --------------------------------------------------------------------------------------------
# Structure: graphs, their output, payloads
# --------------------------------------------------------------------------------------------


@irdl_op_definition
class OutputOp(IRDLOperation):
    """`output %5` — selects the graph's output node."""

    name = "tl.output"
    value = operand_def()

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])


@irdl_op_definition
class GraphOp(IRDLOperation):
    """`tl.graph @name { nodes...  output %k }` — a topologically ordered node array."""

    name = "tl.graph"
    sym_name = attr_def(SymbolNameConstraint())
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator(), IsolatedFromAbove())

    def __init__(self, name: str, ops: list[Operation]):
        super().__init__(attributes={"sym_name": StringAttr(name)}, regions=[Region(Block(ops))])

    @property
    def graph_name(self) -> str:
        return self.sym_name.data

    @property
    def nodes(self) -> list[NodeOp]:
        return [op for op in self.body.block.ops if isinstance(op, NodeOp)]

    @property
    def output(self) -> OutputOp | None:
        return next((op for op in self.body.block.ops if isinstance(op, OutputOp)), None)


@irdl_op_definition
class RecordOp(IRDLOperation):
    """`%1 = linear {weight = [[...]], bias = [...]}` — one payload record, keyed by node id.

    Fields are dense f64 tensors (`weight`, `bias`, `value`, `gamma`, `eps`, ...); `kind` names
    the op the record is for, so a record for the wrong kind of node is reported.
    """

    name = "tl.record"
    node = attr_def(IntegerAttr)
    kind = attr_def(StringAttr)
    fields = attr_def(DictionaryAttr)

    def __init__(self, node: int, kind: str, fields: dict[str, DenseIntOrFPElementsAttr]):
        super().__init__(
            attributes={
                "node": IntegerAttr(node, i64),
                "kind": StringAttr(kind),
                "fields": DictionaryAttr(dict(fields)),
            }
        )


@irdl_op_definition
class PayloadOp(IRDLOperation):
    """`tl.payload @name { records... }` — inline parameters for the graph of the same name."""

    name = "tl.payload"
    graph = attr_def(StringAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), IsolatedFromAbove())

    def __init__(self, name: str, records: list[RecordOp]):
        super().__init__(
            attributes={"graph": StringAttr(name)},
            regions=[Region(Block(list(records)))],
        )

    @property
    def graph_name(self) -> str:
        return self.graph.data

    @property
    def records(self) -> list[RecordOp]:
        return [op for op in self.body.block.ops if isinstance(op, RecordOp)]


#: The op kinds of the graph IR (the registry adds the backward ops of gradient graphs).
FORWARD_OPS: tuple[type[NodeOp], ...] = (
    InputOp, ConstOp, PermuteOp, TransposeOp, DetachOp, RandUniformOp, BernoulliMaskOp,
    AddOp, SubOp, MulElemOp, MaxElemOp, MinElemOp,
    AbsOp, SqrtOp, ReluOp, TanhOp, SigmoidOp, SoftplusOp, ExpOp, LogOp, InvOp, SinOp, CosOp,
    GeluOp, MaxPoolOp, AvgPoolOp, BroadcastToOp, ReduceSumOp, ReduceMeanOp, SumOp, MatmulOp,
    LinearOp, ConvOp, BatchNormEvalOp, SafeLogOp, SoftmaxOp, LogSoftmaxOp, HardMaskedSoftmaxOp,
    LayernormOp, ReshapeOp, FlattenOp, ConcatOp, MseLossOp,
)  # fmt: skip
