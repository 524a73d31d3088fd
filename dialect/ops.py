"""The `tl` dialect: every op kind of the graph IR, each defined once with all its facts.

A node op's parents are its operands (variadic, so a document with the wrong parent count still
loads and verify-structure can report it), its declared output shape is its result type, and its
node id is the `id` attribute (so `nodes[2].id = 7` can be represented and reported). What an op
kind declares, and how interpretations use it, is described in `tlc.dialect.families`; shape
rules raise `ShapeError` with TorchLean's message text.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    i64,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    region_def,
    traits_def,
)
from xdsl.traits import IsolatedFromAbove, NoTerminator, SymbolOpInterface

from tlc.core.attrs import block_of
from tlc.dialect import minmax
from tlc.dialect.families import (
    AxisOp,
    BinaryOp,
    DeclaredShapeOp,
    Monotone,
    NodeOp,
    OnnxSpelling,
    Param,
    PoolOp,
    ReductionOp,
    TorchSpelling,
    UnaryOp,
    check_positive,
    conv_out_dim,
    expect_parent_shape,
    ones_per_axis,
    padding_default,
    zeros_per_axis,
)
from tlc.dialect.families import node_id_of as node_id_of
from tlc.dialect.families import pool_out_dim as pool_out_dim
from tlc.dialect.metadata import Field, Kind
from tlc.dialect.shapes import Shape, ShapeError, can_broadcast_to, check_axis, fmt_shape, numel

# --------------------------------------------------------------------------------------------
# The op kinds
# --------------------------------------------------------------------------------------------


@irdl_op_definition
class InputOp(DeclaredShapeOp):
    """`%0 = input : [4]` — the graph input; its shape is the graph's interface."""

    name = "tl.input"
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)


def declared_shape(_fields: dict[str, Any], declared: Shape | None) -> Shape | None:
    """the declared shape"""
    return declared


@irdl_op_definition
class ConstOp(NodeOp):
    """`%3 = const {shape = [2]} : [2]` — a constant whose values live in the payload."""

    name = "tl.const"
    PAYLOAD = (Param("value", lambda _n, _p, out: (numel(out),)),)
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("shape", Kind.INTS, declared_shape),)

    def describe(self) -> str:
        return f"const(shape={fmt_shape(self.meta('shape'))})"

    def infer(self, parents: list[Shape]) -> Shape:
        """`shape` (which defaults to the declared shape; one of the two must be given)."""
        return self.meta("shape")


@irdl_op_definition
class PermuteOp(NodeOp):
    """`%1 = permute(%0) {perm = [0, 2, 1]}` — output axis i is input axis perm[i]."""

    name = "tl.permute"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("perm", Kind.INTS),)

    def infer(self, parents: list[Shape]) -> Shape:
        """`perm` must be a permutation of `0..rank-1`; output axis i is input axis `perm[i]`.
        (TorchLean's `permute: missing axis` cannot occur: axes are checked in range and
        distinct first, and `len(perm)` distinct axes below `len(perm)` are all of them.)"""
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
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis1", Kind.INT), Field("axis2", Kind.INT))

    def infer(self, parents: list[Shape]) -> Shape:
        """Both axes `< rank`; the two extents swap."""
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
    """`%2 = detach(%0)` — identity forward, stops gradients."""

    name = "tl.detach"
    ONNX = OnnxSpelling("Identity")
    TORCH = TorchSpelling(functions=("torch.detach",), methods=("detach",))
    MONOTONE = Monotone.INCREASING

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return x


@irdl_op_definition
class RandUniformOp(DeclaredShapeOp):
    """`%0 = rand_uniform {seed = 7} : [3]` — deterministic U[0,1) samples."""

    name = "tl.rand_uniform"
    ARITY: ClassVar[tuple[int, int | None]] = (0, 0)
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("seed", Kind.INT),)


@irdl_op_definition
class BernoulliMaskOp(NodeOp):
    """`%2 = bernoulli_mask(%1) {seed = 7} : [3]` — a {0,1} mask; the parent is keepProb []."""

    name = "tl.bernoulli_mask"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("seed", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        """The parent (keep probability) must be a scalar `[]`; the result is the declared shape
        (required)."""
        if parents[0] != ():
            raise ShapeError(
                f"bernoulli_mask: expected scalar keepProb parent, got {fmt_shape(parents[0])}"
            )
        return self.require_declared()


@irdl_op_definition
class AddOp(BinaryOp):
    """`%2 = add(%0, %1)` — elementwise a + b."""

    name = "tl.add"
    ONNX = OnnxSpelling("Add")
    TORCH = TorchSpelling(functions=("torch.add", "operator.add"), methods=("add",))
    numpy = staticmethod(np.add)


@irdl_op_definition
class SubOp(BinaryOp):
    """`%2 = sub(%0, %1)` — elementwise a - b."""

    name = "tl.sub"
    ONNX = OnnxSpelling("Sub")
    TORCH = TorchSpelling(functions=("torch.sub", "operator.sub"), methods=("sub",))
    numpy = staticmethod(np.subtract)


@irdl_op_definition
class MulElemOp(BinaryOp):
    """`%2 = mul_elem(%0, %1)` — elementwise a * b."""

    name = "tl.mul_elem"
    ONNX = OnnxSpelling("Mul")
    TORCH = TorchSpelling(functions=("torch.mul", "operator.mul"), methods=("mul",))
    numpy = staticmethod(np.multiply)


@irdl_op_definition
class MaxElemOp(BinaryOp):
    """`%2 = max_elem(%0, %1)` — elementwise max."""

    name = "tl.max_elem"
    ONNX = OnnxSpelling("Max")
    TORCH = TorchSpelling(functions=("torch.maximum", "torch.max"), methods=("maximum",))
    numpy = staticmethod(minmax.maximum)
    EXACT_MONOTONE = True


@irdl_op_definition
class MinElemOp(BinaryOp):
    """`%2 = min_elem(%0, %1)` — elementwise min."""

    name = "tl.min_elem"
    ONNX = OnnxSpelling("Min")
    TORCH = TorchSpelling(functions=("torch.minimum", "torch.min"), methods=("minimum",))
    numpy = staticmethod(minmax.minimum)
    EXACT_MONOTONE = True


@irdl_op_definition
class DivOp(BinaryOp):
    """`%2 = div(%0, %1)` — elementwise a / b, IEEE division in the run's scalar type: x / 0 is
    ±inf (NaN for 0 / 0), in float64 and float32 alike."""

    name = "tl.div"
    ONNX = OnnxSpelling("Div")
    TORCH = TorchSpelling(
        functions=("torch.div", "torch.true_divide", "operator.truediv"),
        methods=("div", "true_divide"),
    )
    numpy = staticmethod(np.divide)


@irdl_op_definition
class LessOp(BinaryOp):
    """`%2 = less(%0, %1)` — 1 where a < b, else 0 (also where either is NaN), in the run's
    scalar type: ONNX's `Less` (whose booleans tl holds as 0 and 1), PyTorch's `<`; `Greater`
    and `>` are it with the operands swapped. Its derivative is 0 (gradients stop)."""

    name = "tl.less"
    ONNX = OnnxSpelling("Less")
    TORCH = TorchSpelling(functions=("torch.lt", "torch.less", "operator.lt"), methods=("lt",))

    def numpy(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a < b).astype(a.dtype)


@irdl_op_definition
class WhereOp(NodeOp):
    """`%3 = where(%0, %1, %2)` — a where the condition is not 0 (NaN counts as true), else b;
    three parents of one shape (ONNX's `Where`, whose boolean condition tl holds as 0 and 1,
    PyTorch's `where`; the importers broadcast explicitly)."""

    name = "tl.where"
    ARITY: ClassVar[tuple[int, int | None]] = (3, 3)

    def infer(self, parents: list[Shape]) -> Shape:
        """The condition and both values have the same shape (no implicit broadcasting); the
        result has that shape."""
        condition, a, b = parents
        if not condition == a == b:
            raise ShapeError(
                f"where: shape mismatch: {fmt_shape(condition)}, {fmt_shape(a)}, {fmt_shape(b)}"
            )
        return a

    def numpy(self, condition: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(condition != 0, a, b)


@irdl_op_definition
class PreluOp(BinaryOp):
    """`%2 = prelu(%0, %1)` — x where x > 0, else slope · x, with the slope %1 of x's shape
    (ONNX's `PRelu` broadcasts the slope, PyTorch's `prelu` holds one per channel of axis 1:
    the importers broadcast it with an explicit `broadcast_to`, usually of a constant)."""

    name = "tl.prelu"
    ONNX = OnnxSpelling("PRelu")

    def numpy(self, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        return np.where(x <= 0, x * slope, x)  # a NaN x itself, as leaky_relu

    def decompose(self, em: Any, x: Any, slope: Any) -> Any:
        """relu(x) + slope · min(x, 0): the value `numpy` selects (x + 0 above 0, 0 + slope x
        below), up to the sign of a zero result."""
        below = em.mul(slope, em.bind(MinElemOp, [x, em.full_like(x, 0.0)]))
        return em.add(em.unary(ReluOp, x), below)


#: Error budgets (ULPs of the scalar type) of the numpy functions: libm functions are faithful to
#: a few ULPs; the small compositions (sigmoid, softplus: an exp, a log1p and one or two
#: correctly rounded operations) add at most a few ULPs each.
LIBM_ULPS = 8
COMPOSITE_ULPS = 16


@irdl_op_definition
class AbsOp(UnaryOp):
    """`%1 = abs(%0)` — |x|."""

    name = "tl.abs"
    ONNX = OnnxSpelling("Abs")
    TORCH = TorchSpelling(functions=("torch.abs", "operator.abs"), methods=("abs",))
    numpy = staticmethod(np.abs)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.sign(x)


@irdl_op_definition
class SqrtOp(UnaryOp):
    """`%1 = sqrt(%0)` — square root."""

    name = "tl.sqrt"
    ONNX = OnnxSpelling("Sqrt")
    TORCH = TorchSpelling(functions=("torch.sqrt",), methods=("sqrt",))
    numpy = staticmethod(np.sqrt)
    MONOTONE = Monotone.INCREASING
    ULPS = 1
    DOMAIN = (0.0, False)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.scale(em.unary(InvOp, y), 0.5)


@irdl_op_definition
class NegOp(UnaryOp):
    """`%1 = neg(%0)` — -x."""

    name = "tl.neg"
    ONNX = OnnxSpelling("Neg")
    TORCH = TorchSpelling(functions=("torch.neg", "operator.neg"), methods=("neg",))
    numpy = staticmethod(np.negative)
    MONOTONE = Monotone.DECREASING

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """-1."""
        return em.full_like(x, -1.0)

    def decompose(self, em: Any, x: Any) -> Any:
        """(-1) x: the same value bit for bit (the sign of a zero flips too)."""
        return em.scale(x, -1.0)


@irdl_op_definition
class ReluOp(UnaryOp):
    """`%1 = relu(%0)` — max(x, 0)."""

    name = "tl.relu"
    ONNX = OnnxSpelling("Relu")
    TORCH = TorchSpelling(
        functions=("torch.relu", "torch.nn.functional.relu"),
        modules=("torch.nn.ReLU",),
        methods=("relu",),
    )
    MONOTONE = Monotone.INCREASING

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return minmax.maximum(x, x.dtype.type(0))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.unary(ReluOp, em.sign(x))


@irdl_op_definition
class LeakyReluOp(UnaryOp):
    """`%1 = leaky_relu(%0) {negative_slope = 0.2}` — x where x > 0, else negative_slope * x
    (PyTorch's `F.leaky_relu`, ONNX's `LeakyRelu`; the slope defaults to 0.01 in both)."""

    name = "tl.leaky_relu"
    FIELDS = (Field("negative_slope", Kind.FLOAT, 0.01),)
    ONNX = OnnxSpelling("LeakyRelu", {"alpha": "negative_slope"})
    TORCH = TorchSpelling(
        functions=("torch.nn.functional.leaky_relu",),
        modules=("torch.nn.LeakyReLU",),
        arguments=("negative_slope",),
    )
    ULPS = 1

    def monotone(self) -> Monotone:
        return Monotone.INCREASING if self.meta("negative_slope") >= 0 else Monotone.NONE

    def numpy(self, x: np.ndarray) -> np.ndarray:
        # x unless x <= 0: a NaN x is itself (not NaN times the slope, whose bits would be
        # the multiplier's choice when the slope is NaN too)
        return np.where(x <= 0, x * x.dtype.type(self.meta("negative_slope")), x)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """1 where x > 0, else the slope (PyTorch's value at 0): s + (1 - s) relu(sign(x))."""
        slope = self.meta("negative_slope")
        positive = em.unary(ReluOp, em.sign(x))
        return em.add(em.full_like(x, slope), em.scale(positive, 1.0 - slope))

    def decompose(self, em: Any, x: Any) -> Any:
        """max(x, s x) for s <= 1, min(x, s x) above: the selection `numpy` makes, bit for bit
        (max and min give the second of equal values, so a zero result is s x's zero, and a
        NaN x itself). For s = 0 the product is 0 min(x, 1), so that x = +inf gives +inf, not
        max(inf, 0 inf) = NaN."""
        slope = self.meta("negative_slope")
        if slope == 0:
            below = em.scale(em.bind(MinElemOp, [x, em.full_like(x, 1.0)]), 0.0)
            return em.bind(MaxElemOp, [x, below])
        return em.bind(MaxElemOp if slope <= 1 else MinElemOp, [x, em.scale(x, slope)])


@irdl_op_definition
class TanhOp(UnaryOp):
    """`%1 = tanh(%0)`."""

    name = "tl.tanh"
    ONNX = OnnxSpelling("Tanh")
    TORCH = TorchSpelling(
        functions=("torch.tanh", "torch.nn.functional.tanh"),
        modules=("torch.nn.Tanh",),
        methods=("tanh",),
    )
    numpy = staticmethod(np.tanh)
    MONOTONE = Monotone.INCREASING
    ULPS = LIBM_ULPS

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.one_minus(em.mul(y, y))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Without overflow: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@irdl_op_definition
class SigmoidOp(UnaryOp):
    """`%1 = sigmoid(%0)` — 1 / (1 + e^-x)."""

    name = "tl.sigmoid"
    ONNX = OnnxSpelling("Sigmoid")
    TORCH = TorchSpelling(
        functions=("torch.sigmoid", "torch.nn.functional.sigmoid"),
        modules=("torch.nn.Sigmoid",),
        methods=("sigmoid",),
    )
    MONOTONE = Monotone.INCREASING
    ULPS = COMPOSITE_ULPS

    numpy = staticmethod(sigmoid)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.mul(y, em.one_minus(y))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)."""
    return minmax.maximum(x, x.dtype.type(0)) + np.log1p(np.exp(-np.abs(x)))


@irdl_op_definition
class SoftplusOp(UnaryOp):
    """`%1 = softplus(%0)` — log(1 + e^x), stable."""

    name = "tl.softplus"
    ONNX = OnnxSpelling("Softplus")
    MONOTONE = Monotone.INCREASING
    ULPS = COMPOSITE_ULPS
    numpy = staticmethod(softplus)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.unary(SigmoidOp, x)


@irdl_op_definition
class ExpOp(UnaryOp):
    """`%1 = exp(%0)`."""

    name = "tl.exp"
    ONNX = OnnxSpelling("Exp")
    TORCH = TorchSpelling(functions=("torch.exp",), methods=("exp",))
    numpy = staticmethod(np.exp)
    MONOTONE = Monotone.INCREASING
    ULPS = LIBM_ULPS

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return y


@irdl_op_definition
class LogOp(UnaryOp):
    """`%1 = log(%0)` — fails on inputs <= 0 or NaN."""

    name = "tl.log"
    ONNX = OnnxSpelling("Log")
    TORCH = TorchSpelling(functions=("torch.log",), methods=("log",))
    numpy = staticmethod(np.log)
    MONOTONE = Monotone.INCREASING
    ULPS = LIBM_ULPS
    DOMAIN = (0.0, True)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.unary(InvOp, x)


@irdl_op_definition
class InvOp(UnaryOp):
    """`%1 = inv(%0)` — 1 / x."""

    name = "tl.inv"
    ONNX = OnnxSpelling("Reciprocal")
    TORCH = TorchSpelling(functions=("torch.reciprocal",), methods=("reciprocal",))

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return 1 / x

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.neg(em.mul(y, y))


@irdl_op_definition
class PowOp(UnaryOp):
    """`%1 = pow(%0) {exponent = 0.75}` — x to a constant power (C's `pow`: NaN for a negative x
    and a non-integer exponent, ±inf for 0 to a negative power; x^0 = 1 everywhere). ONNX's
    `Pow` with a constant exponent, PyTorch's `pow` and `**` with a number."""

    name = "tl.pow"
    FIELDS = (Field("exponent", Kind.FLOAT),)
    TORCH = TorchSpelling(
        functions=("torch.pow", "operator.pow"), methods=("pow",), arguments=("exponent",)
    )
    ULPS = LIBM_ULPS

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return np.power(x, x.dtype.type(self.meta("exponent")))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """e x^(e-1) (0 for e = 0, as PyTorch)."""
        e = self.meta("exponent")
        if e == 0:
            return em.full_like(x, 0.0)
        return em.scale(em.bind(PowOp, [x], {"exponent": e - 1}), e)


@irdl_op_definition
class PowElemOp(BinaryOp):
    """`%2 = pow_elem(%0, %1)` — elementwise a to the power b (C's `pow`: NaN for a negative a
    and a non-integer b, ±inf for 0 to a negative power; a^0 = 1 everywhere): ONNX's `Pow`
    whose exponent is a tensor of many values or a graph input (`pow` has a constant one)."""

    name = "tl.pow_elem"
    ONNX = OnnxSpelling("Pow")
    ULPS = LIBM_ULPS

    def numpy(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.power(a, b)


@irdl_op_definition
class RsqrtOp(UnaryOp):
    """`%1 = rsqrt(%0)` — 1 / sqrt(x) (PyTorch's `rsqrt`; ONNX has no op: its exporters write
    Sqrt and Reciprocal, as the export of the decomposition does)."""

    name = "tl.rsqrt"
    TORCH = TorchSpelling(functions=("torch.rsqrt",), methods=("rsqrt",))
    MONOTONE = Monotone.DECREASING
    #: Two correctly rounded operations: a relative error below 1.5 u, at most 2 ULPs.
    ULPS = 2
    DOMAIN = (0.0, False)

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return 1 / np.sqrt(x)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """-y^3 / 2."""
        return em.scale(em.mul(y, em.mul(y, y)), -0.5)

    def decompose(self, em: Any, x: Any) -> Any:
        """inv(sqrt(x)): the operations `numpy` does."""
        return em.unary(InvOp, em.unary(SqrtOp, x))


@irdl_op_definition
class TruncOp(UnaryOp):
    """`%1 = trunc(%0)` — x rounded toward zero to an integer (C's `trunc`, PyTorch's `trunc`;
    exact, and ±inf and NaN stay). ONNX has no Trunc: the importer writes ONNX's integer `Div`
    with it. Piecewise constant: its derivative is 0 wherever it exists (gradients stop), and
    it is non-decreasing, so its box is its endpoints'."""

    name = "tl.trunc"
    TORCH = TorchSpelling(functions=("torch.trunc",), methods=("trunc",))
    numpy = staticmethod(np.trunc)
    MONOTONE = Monotone.INCREASING


@irdl_op_definition
class SinOp(UnaryOp):
    """`%1 = sin(%0)`."""

    name = "tl.sin"
    ONNX = OnnxSpelling("Sin")
    TORCH = TorchSpelling(functions=("torch.sin",), methods=("sin",))
    numpy = staticmethod(np.sin)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.unary(CosOp, x)


@irdl_op_definition
class CosOp(UnaryOp):
    """`%1 = cos(%0)`."""

    name = "tl.cos"
    ONNX = OnnxSpelling("Cos")
    TORCH = TorchSpelling(functions=("torch.cos",), methods=("cos",))
    numpy = staticmethod(np.cos)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        return em.neg(em.unary(SinOp, x))


_erf = np.vectorize(math.erf, otypes=[np.float64])


@irdl_op_definition
class GeluOp(UnaryOp):
    """`%1 = gelu(%0) {approximate = "tanh"}` — exact erf form by default (PyTorch's meaning)."""

    name = "tl.gelu"
    FIELDS = (Field("approximate", Kind.STR, "none", ("none", "tanh")),)
    ONNX = OnnxSpelling("Gelu", {"approximate": "approximate"})
    TORCH = TorchSpelling(
        functions=("torch.nn.functional.gelu",),
        modules=("torch.nn.GELU",),
        arguments=("approximate",),
    )

    def numpy(self, x: np.ndarray) -> np.ndarray:
        """PyTorch's gelu: exact x/2 (1 + erf(x/sqrt 2)), or its tanh approximation.

        The erf is evaluated per element in float64 and rounded to x's dtype (numpy has no
        float32 erf); the surrounding arithmetic is in x's dtype.
        """
        dtype = x.dtype.type
        half = dtype(0.5)
        if self.meta("approximate") == "tanh":
            k = dtype(math.sqrt(2 / math.pi))
            inner = k * (x + dtype(0.044715) * x * x * x)
            return half * x * (1 + np.tanh(inner))
        return half * x * (1 + _erf(x * dtype(1 / math.sqrt(2))).astype(dtype))


@irdl_op_definition
class ErfOp(UnaryOp):
    """`%1 = erf(%0)` — the error function (2/sqrt(pi)) ∫_0^x e^(-t²) dt."""

    name = "tl.erf"
    ONNX = OnnxSpelling("Erf")
    TORCH = TorchSpelling(functions=("torch.erf", "torch.special.erf"), methods=("erf",))
    MONOTONE = Monotone.INCREASING
    ULPS = LIBM_ULPS

    def numpy(self, x: np.ndarray) -> np.ndarray:
        """Per element in float64 (numpy has no erf), rounded to x's dtype."""
        return _erf(x).astype(x.dtype)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """(2/sqrt(pi)) e^(-x²)."""
        return em.scale(em.unary(ExpOp, em.neg(em.mul(x, x))), 2 / math.sqrt(math.pi))


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    """max(x, 0) + alpha (e^min(x, 0) - 1) in x's dtype: x above 0 exactly; below, e^x - 1
    rather than PyTorch's expm1 (an absolute difference of about an ULP of 1, relatively more
    for x near 0), so that the decomposition is this function bit for bit."""
    dtype = x.dtype.type
    below = np.exp(minmax.minimum(x, dtype(0))) - dtype(1)
    return minmax.maximum(x, dtype(0)) + below * dtype(alpha)


def _elu_derivative(em: Any, x: Any, alpha: float) -> Any:
    """1 where x > 0, else alpha e^x (PyTorch's value at 0): p + (1 - p) alpha e^min(x, 0) with
    p = relu(sign(x))."""
    positive = em.unary(ReluOp, em.sign(x))
    below = em.scale(em.unary(ExpOp, em.bind(MinElemOp, [x, em.full_like(x, 0.0)])), alpha)
    return em.add(positive, em.mul(em.one_minus(positive), below))


def _elu_decomposition(em: Any, x: Any, alpha: float) -> Any:
    """max(x, 0) + alpha (e^min(x, 0) - 1), the operations `_elu` does."""
    zero = em.full_like(x, 0.0)
    below = em.sub(em.unary(ExpOp, em.bind(MinElemOp, [x, zero])), em.full_like(x, 1.0))
    return em.add(em.bind(MaxElemOp, [x, zero]), em.scale(below, alpha))


@irdl_op_definition
class EluOp(UnaryOp):
    """`%1 = elu(%0) {alpha = 1.0}` — x where x > 0, else alpha (e^x - 1) (PyTorch's `F.elu`,
    ONNX's `Elu`; alpha defaults to 1 in both).

    Intervals go through the decomposition (two parts increasing together for alpha >= 0, so
    the box is tight): e^x - 1 cancels near 0, so no ULP bound relative to the result holds for
    the endpoint rule."""

    name = "tl.elu"
    FIELDS = (Field("alpha", Kind.FLOAT, 1.0),)
    ONNX = OnnxSpelling("Elu", {"alpha": "alpha"})
    TORCH = TorchSpelling(
        functions=("torch.nn.functional.elu",), modules=("torch.nn.ELU",), arguments=("alpha",)
    )

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return _elu(x, self.meta("alpha"))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """1 where x > 0, else alpha e^x."""
        return _elu_derivative(em, x, self.meta("alpha"))

    def decompose(self, em: Any, x: Any) -> Any:
        """max(x, 0) + alpha (e^min(x, 0) - 1)."""
        return _elu_decomposition(em, x, self.meta("alpha"))


#: SELU's constants (Klambauer et al. 2017), as PyTorch holds them in float64; ONNX's attribute
#: defaults are their float32 roundings.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


@irdl_op_definition
class SeluOp(UnaryOp):
    """`%1 = selu(%0)` — scale · elu(x, alpha) with SELU's fixed constants (PyTorch's `F.selu`,
    ONNX's `Selu` at its default alpha and gamma)."""

    name = "tl.selu"
    TORCH = TorchSpelling(
        functions=("torch.selu", "torch.nn.functional.selu"), modules=("torch.nn.SELU",)
    )

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return _elu(x, SELU_ALPHA) * x.dtype.type(SELU_SCALE)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """scale where x > 0, else scale · alpha e^x."""
        return em.scale(_elu_derivative(em, x, SELU_ALPHA), SELU_SCALE)

    def decompose(self, em: Any, x: Any) -> Any:
        """scale (max(x, 0) + alpha (e^min(x, 0) - 1))."""
        return em.scale(_elu_decomposition(em, x, SELU_ALPHA), SELU_SCALE)


def hardsigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """min(max(alpha x + beta, 0), 1) in x's dtype."""
    dtype = x.dtype.type
    return minmax.minimum(minmax.maximum(x * dtype(alpha) + dtype(beta), dtype(0)), dtype(1))


@irdl_op_definition
class HardSigmoidOp(UnaryOp):
    """`%1 = hardsigmoid(%0) {alpha = 0.2, beta = 0.5}` — max(0, min(1, alpha x + beta)) (ONNX's
    `HardSigmoid` and its defaults; PyTorch's `F.hardsigmoid` is alpha = 1/6, beta = 1/2).

    Intervals go through the decomposition: alpha x + beta can cancel, so no ULP bound relative
    to the result holds for the endpoint rule."""

    name = "tl.hardsigmoid"
    FIELDS = (Field("alpha", Kind.FLOAT, 0.2), Field("beta", Kind.FLOAT, 0.5))
    ONNX = OnnxSpelling("HardSigmoid", {"alpha": "alpha", "beta": "beta"})

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return hardsigmoid(x, self.meta("alpha"), self.meta("beta"))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """alpha strictly inside (0 < alpha x + beta < 1), else 0 (PyTorch's value at the
        corners): alpha relu(sign(t)) relu(sign(1 - t))."""
        t = em.add(em.scale(x, self.meta("alpha")), em.full_like(x, self.meta("beta")))
        above = em.unary(ReluOp, em.sign(t))
        below = em.unary(ReluOp, em.sign(em.one_minus(t)))
        return em.scale(em.mul(above, below), self.meta("alpha"))

    def decompose(self, em: Any, x: Any) -> Any:
        """min(max(alpha x + beta, 0), 1): the operations `numpy` does, in its order."""
        t = em.add(em.scale(x, self.meta("alpha")), em.full_like(x, self.meta("beta")))
        return em.bind(
            MinElemOp, [em.bind(MaxElemOp, [t, em.full_like(x, 0.0)]), em.full_like(x, 1.0)]
        )


@irdl_op_definition
class HardSwishOp(UnaryOp):
    """`%1 = hardswish(%0)` — x · hardsigmoid(x) with alpha = 1/6, beta = 1/2 (ONNX's
    `HardSwish`, PyTorch's `F.hardswish`)."""

    name = "tl.hardswish"
    ONNX = OnnxSpelling("HardSwish")
    TORCH = TorchSpelling(
        functions=("torch.nn.functional.hardswish",), modules=("torch.nn.Hardswish",)
    )

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return x * hardsigmoid(x, 1 / 6, 0.5)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """0 below -3, x/3 + 1/2 on [-3, 3] (corners included, as PyTorch), 1 above:
        inside (x/3 + 1/2) + above, with above = relu(sign(x - 3)), below = relu(sign(-3 - x))
        and inside = 1 - above - below."""
        above = em.unary(ReluOp, em.sign(em.sub(x, em.full_like(x, 3.0))))
        below = em.unary(ReluOp, em.sign(em.sub(em.full_like(x, -3.0), x)))
        inside = em.sub(em.one_minus(above), below)
        ramp = em.add(em.scale(x, 1 / 3), em.full_like(x, 0.5))
        return em.add(em.mul(inside, ramp), above)

    def decompose(self, em: Any, x: Any) -> Any:
        """x · hardsigmoid(x) {alpha = 1/6, beta = 1/2}."""
        return em.mul(x, em.bind(HardSigmoidOp, [x], {"alpha": 1 / 6, "beta": 0.5}))


@irdl_op_definition
class SiluOp(UnaryOp):
    """`%1 = silu(%0)` — x · sigmoid(x) (PyTorch's `F.silu`, `nn.SiLU`; ONNX has no op, its
    exporters write Sigmoid and Mul)."""

    name = "tl.silu"
    TORCH = TorchSpelling(functions=("torch.nn.functional.silu",), modules=("torch.nn.SiLU",))
    ULPS = COMPOSITE_ULPS

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return x * sigmoid(x)

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """s (1 + x (1 - s)) with s = sigmoid(x)."""
        s = em.unary(SigmoidOp, x)
        return em.mul(s, em.add(em.full_like(x, 1.0), em.mul(x, em.one_minus(s))))

    def decompose(self, em: Any, x: Any) -> Any:
        """x · sigmoid(x)."""
        return em.mul(x, em.unary(SigmoidOp, x))


@irdl_op_definition
class ClipOp(UnaryOp):
    """`%1 = clip(%0) {min = 0.0, max = 6.0}` — min(max(x, min), max) (ONNX's `Clip`, whose
    bounds are constant inputs, PyTorch's `clamp`, `hardtanh`, `relu6`); an absent bound is
    infinite."""

    name = "tl.clip"
    FIELDS = (Field("min", Kind.FLOAT, -math.inf), Field("max", Kind.FLOAT, math.inf))
    TORCH = TorchSpelling(functions=("torch.clamp",), arguments=("min", "max"))
    MONOTONE = Monotone.INCREASING

    def numpy(self, x: np.ndarray) -> np.ndarray:
        dtype = x.dtype.type
        low = minmax.maximum(x, dtype(self.meta("min")))
        return minmax.minimum(low, dtype(self.meta("max")))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """1 on [min, max] (bounds included, as PyTorch's clamp), else 0:
        1 - relu(sign(x - max)) - relu(sign(min - x))."""
        above = em.unary(ReluOp, em.sign(em.sub(x, em.full_like(x, self.meta("max")))))
        below = em.unary(ReluOp, em.sign(em.sub(em.full_like(x, self.meta("min")), x)))
        return em.sub(em.one_minus(above), below)

    def decompose(self, em: Any, x: Any) -> Any:
        """min(max(x, min), max)."""
        low = em.bind(MaxElemOp, [x, em.full_like(x, self.meta("min"))])
        return em.bind(MinElemOp, [low, em.full_like(x, self.meta("max"))])


@irdl_op_definition
class SoftsignOp(UnaryOp):
    """`%1 = softsign(%0)` — x / (1 + |x|) (ONNX's `Softsign`, PyTorch's `F.softsign`,
    `nn.Softsign`), computed as x · (1 / (1 + |x|)), its decomposition: within 2 ULPs (three
    correctly rounded operations)."""

    name = "tl.softsign"
    ONNX = OnnxSpelling("Softsign")
    TORCH = TorchSpelling(
        functions=("torch.nn.functional.softsign",), modules=("torch.nn.Softsign",)
    )
    MONOTONE = Monotone.INCREASING
    ULPS = 2

    def numpy(self, x: np.ndarray) -> np.ndarray:
        one = x.dtype.type(1)
        return x * (one / (one + np.abs(x)))

    def derivative(self, em: Any, x: Any, y: Any) -> Any:
        """1 / (1 + |x|)^2."""
        d = em.add(em.full_like(x, 1.0), em.unary(AbsOp, x))
        return em.unary(InvOp, em.mul(d, d))

    def decompose(self, em: Any, x: Any) -> Any:
        """x · inv(1 + abs(x))."""
        return em.mul(x, em.unary(InvOp, em.add(em.full_like(x, 1.0), em.unary(AbsOp, x))))


@irdl_op_definition
class MaxPoolOp(PoolOp):
    """`%1 = max_pool(%0) {kernel = [2, 2], stride = [2, 2], padding = [0, 0]}`."""

    name = "tl.max_pool"


@irdl_op_definition
class AvgPoolOp(PoolOp):
    """`%1 = avg_pool(%0) {kernel = [2, 2]}` — zero padding counts in the divisor."""

    name = "tl.avg_pool"


@irdl_op_definition
class BroadcastToOp(NodeOp):
    """`%1 = broadcast_to(%0) {from = [3], to = [2, 3]}` — explicit broadcasting."""

    name = "tl.broadcast_to"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("from", Kind.INTS), Field("to", Kind.INTS))

    def infer(self, parents: list[Shape]) -> Shape:
        """The parent must have shape `from`, and `from` must broadcast (NumPy rules) to `to`; the
        result is `to`."""
        (s,) = parents
        src, dst = self.meta("from"), self.meta("to")
        expect_parent_shape(self.TAG, src, s)
        if not can_broadcast_to(src, dst):
            raise ShapeError(
                f"broadcast_to: invalid broadcast from {fmt_shape(src)} to {fmt_shape(dst)}"
            )
        return dst


def before_default(fields: dict[str, Any], _declared: Shape | None) -> tuple[int, ...]:
    """`before`"""
    return tuple(fields["before"])


#: numpy's names of the pad modes.
NUMPY_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}


@irdl_op_definition
class PadOp(NodeOp):
    """`%1 = pad(%0) {before = [0, 2], after = [1, 0], mode = "reflect"}` — each axis i grows
    by before[i] elements in front and after[i] behind: `constant` ones hold `value`, `reflect`
    ones mirror the axis about its end element (which is not repeated), `edge` ones repeat the
    end element (ONNX's Pad modes; PyTorch's constant, reflect and replicate)."""

    name = "tl.pad"
    FIELDS = (
        Field("before", Kind.INTS),
        Field("after", Kind.INTS, before_default),
        Field("mode", Kind.STR, "constant", ("constant", "reflect", "edge")),
        Field("value", Kind.FLOAT, 0.0),
    )

    def infer(self, parents: list[Shape]) -> Shape:
        """`before` and `after` have one entry per axis; a `reflect` pad is shorter than its
        axis, an `edge` pad needs a non-empty axis. Axis i becomes `before[i] + s[i] +
        after[i]`."""
        (s,) = parents
        before, after, mode = self.meta("before"), self.meta("after"), self.meta("mode")
        if len(before) != len(s) or len(after) != len(s):
            raise ShapeError(
                f"pad: before/after ranks {len(before)}/{len(after)} differ from the input "
                f"rank {len(s)}"
            )
        for axis, (n, lo, hi) in enumerate(zip(s, before, after, strict=True)):
            if mode == "reflect" and max(lo, hi) >= n and max(lo, hi) > 0:
                raise ShapeError(
                    f"pad: reflect padding ({lo}, {hi}) of axis {axis} must be shorter than "
                    f"its extent {n}"
                )
            if mode == "edge" and n == 0 and max(lo, hi) > 0:
                raise ShapeError(f"pad: edge padding of the empty axis {axis}")
        return tuple(lo + n + hi for n, lo, hi in zip(s, before, after, strict=True))

    def numpy(self, x: np.ndarray) -> np.ndarray:
        widths = list(zip(self.meta("before"), self.meta("after"), strict=True))
        mode = self.meta("mode")
        if mode == "constant":
            return np.pad(x, widths, constant_values=x.dtype.type(self.meta("value")))
        return np.pad(x, widths, mode=NUMPY_PAD_MODES[mode])

    def sources(self, axis: int, n: int) -> np.ndarray:
        """For each position along padded axis `axis` (input extent n), the input index it
        copies; -1 where a `constant` pad holds the value."""
        lo, hi = self.meta("before")[axis], self.meta("after")[axis]
        j = np.arange(lo + n + hi) - lo
        mode = self.meta("mode")
        if mode == "edge":
            return np.clip(j, 0, n - 1)
        if mode == "reflect":
            j = np.abs(j)
            return np.where(j > n - 1, 2 * (n - 1) - j, j)
        return np.where((j >= 0) & (j < n), j, -1)


@irdl_op_definition
class ReduceSumOp(ReductionOp):
    """`%1 = reduce_sum(%0) {axis = 1}` — sum along an axis, which is dropped."""

    name = "tl.reduce_sum"


@irdl_op_definition
class ReduceMeanOp(ReductionOp):
    """`%1 = reduce_mean(%0) {axis = 1}` — mean along an axis, which is dropped."""

    name = "tl.reduce_mean"


@irdl_op_definition
class SumOp(NodeOp):
    """`%4 = sum(%3) : []` — sum of every element, a scalar."""

    name = "tl.sum"

    def infer(self, parents: list[Shape]) -> Shape:
        """s → `[]`."""
        return ()


@irdl_op_definition
class MatmulOp(NodeOp):
    """`%2 = matmul(%0, %1)` — (...,m,n) x (...,n,p) -> (...,m,p), identical leading dims."""

    name = "tl.matmul"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)
    #: ONNX's MatMul also broadcasts and takes vectors; tl's is its case of equal batch axes.
    ONNX = OnnxSpelling("MatMul")

    def infer(self, parents: list[Shape]) -> Shape:
        """Both parents rank ≥ 2 with identical leading dims: `(..., m, n) × (..., n, p) → (..., m,
        p)`."""
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
    PAYLOAD = (
        Param("weight", lambda _n, parents, out: (out[-1], parents[0][-1])),
        Param("bias", lambda _n, _p, out: (out[-1],), required=False),
    )

    def infer(self, parents: list[Shape]) -> Shape:
        """Input and declared output rank ≥ 1 with identical leading dims; the last extent comes
        from the declared shape (required), which the payload's W `[out, in]` must match."""
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
    PAYLOAD = (
        Param("weight", lambda node, _p, _o: node.kernel_shape()),
        Param("bias", lambda node, _p, _o: (node.meta("out_channels"),), required=False),
    )
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("kernel", Kind.INTS),
        Field("stride", Kind.INTS, ones_per_axis),
        Field("padding", Kind.INTS, zeros_per_axis),
        Field("dilation", Kind.INTS, ones_per_axis),
        Field("padding_after", Kind.INTS, padding_default),
        Field("groups", Kind.INT, 1),
        Field("channel_axis", Kind.INT, 0),
        Field("in_channels", Kind.INT),
        Field("out_channels", Kind.INT),
    )

    def describe(self) -> str:
        config = ", ".join(f"{f.name}={self._describe_value(f)}" for f in self.FIELDS)
        return f"conv(config={{{config}}}, payload=node_id)"

    def kernel_shape(self) -> Shape:
        """The kernel's shape [out, in/groups, k...]."""
        m = self.metadata()
        return (m["out_channels"], m["in_channels"] // max(m["groups"], 1), *m["kernel"])

    def infer(self, parents: list[Shape]) -> Shape:
        """`in_channels`, `out_channels`, `groups` > 0, both channel counts divisible by `groups`;
        `channel_axis < rank` and `s[channel_axis] = in_channels`; exactly `len(kernel)`
        axes follow the channel axis, with matching stride/padding/dilation/padding_after
        ranks; per spatial axis kernel, stride, dilation > 0 and `n + lo + hi ≥
        dilation·(k-1)+1`. Output: `s[:channel_axis] ++ [out_channels] ++ [(n + lo + hi -
        dilation·(k-1) - 1) / stride + 1 ...]`."""
        (s,) = parents
        m = self.metadata()
        tag, groups = self.TAG, m["groups"]
        cin, cout, axis = m["in_channels"], m["out_channels"], m["channel_axis"]
        check_positive(tag, "inChannels", cin)
        check_positive(tag, "outChannels", cout)
        check_positive(tag, "groups", groups)
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
            check_positive(tag, f"{name} kernel", k)
            check_positive(tag, f"{name} stride", st)
            check_positive(tag, f"{name} dilation", dil)
            effective = dil * (k - 1) + 1
            if size + lo + hi < effective:
                raise ShapeError(
                    f"{tag}: {name} window does not fit padded input: input={size}, "
                    f"padding=({lo}, {hi}), effectiveKernel={effective}"
                )
            out.append(conv_out_dim(size, k, st, dil, lo, hi))
        return s[:axis] + (cout,) + tuple(out)


#: The per-channel fields of a batch-norm record, in the order gradients list them.
BATCH_NORM_STATS = ("gamma", "beta", "mean", "var")


@irdl_op_definition
class BatchNormEvalOp(NodeOp):
    """`%1 = batch_norm_eval(%0) {channel_axis = 0, channels = 3}` — gamma, beta, mean, var
    and eps from the payload."""

    name = "tl.batch_norm_eval"
    PAYLOAD = (
        *(Param(f, lambda node, _p, _o: (node.meta("channels"),)) for f in BATCH_NORM_STATS),
        Param("eps", required=False, default=1e-5, scalar=True, differentiable=False),
    )
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
        """`channels > 0`, `channel_axis < rank`, `s[channel_axis] = channels`; s → s."""
        (s,) = parents
        axis, channels = self.meta("channel_axis"), self.meta("channels")
        check_positive("batch_norm_eval", "channels", channels)
        check_axis(axis, s)
        if s[axis] != channels:
            raise ShapeError(f"batch_norm_eval: channel mismatch: op={channels} vs input={s[axis]}")
        return s


@irdl_op_definition
class LrnOp(NodeOp):
    """`%1 = lrn(%0) {size = 5, alpha = 1.0e-4, beta = 0.75, k = 1.0}` — local response
    normalisation across the channels (axis 1 of [N, C, ...]): x / (k + alpha/size · S)^beta,
    S the sum of x² over channels c - floor((size-1)/2) .. c + ceil((size-1)/2) (ONNX's `LRN`,
    whose `bias` is k; PyTorch's `local_response_norm` for odd sizes, where its window is the
    same)."""

    name = "tl.lrn"
    FIELDS = (
        Field("size", Kind.INT),
        Field("alpha", Kind.FLOAT, 1e-4),
        Field("beta", Kind.FLOAT, 0.75),
        Field("k", Kind.FLOAT, 1.0),
    )
    ONNX = OnnxSpelling("LRN", {"size": "size", "alpha": "alpha", "beta": "beta", "bias": "k"})

    def infer(self, parents: list[Shape]) -> Shape:
        """Rank ≥ 2 ([N, C, ...]) and `size > 0`; s → s."""
        (s,) = parents
        check_positive("lrn", "size", self.meta("size"))
        if len(s) < 2:
            raise ShapeError(f"lrn: expected an [N, C, ...] input of rank≥2, got {fmt_shape(s)}")
        return s

    def decompose(self, em: Any, x: Any) -> Any:
        """x / pow(k + alpha · avg, beta), avg the windowed mean of x² along the channels: an
        `avg_pool` {kernel = [size, 1]} over [N, C, prod(spatial)] with zero padding counted
        (floor((size-1)/2) zeros before, one more after for an even size)."""
        size, alpha = self.meta("size"), self.meta("alpha")
        shape = em.shape(x)
        rows = (shape[0], shape[1], numel(shape[2:]))
        square = em.reshape(em.mul(x, x), rows)
        before = (size - 1) // 2
        if size % 2 == 0:
            square = em.bind(ConcatOp, [square, em.full((rows[0], 1, rows[2]), 0.0)], {"axis": 1})
        window = {"kernel": (size, 1), "stride": (1, 1), "padding": (before, 0)}
        mean = em.reshape(em.bind(AvgPoolOp, [square], window), shape)
        base = em.add(em.full(shape, self.meta("k")), em.scale(mean, alpha))
        return em.bind(DivOp, [x, em.bind(PowOp, [base], {"exponent": self.meta("beta")})])


@irdl_op_definition
class SafeLogOp(NodeOp):
    """`%2 = safe_log(%0, %1)` — log(softplus(x) + eps); the second parent is the scalar eps."""

    name = "tl.safe_log"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def describe(self) -> str:
        return "safe_log(epsilon=scalar_parent)"

    def infer(self, parents: list[Shape]) -> Shape:
        """The second parent (epsilon) must be a scalar `[]`; the result is the first parent's
        shape."""
        s, eps = parents
        if eps != ():
            raise ShapeError(f"safe_log: epsilon must be scalar, got {fmt_shape(eps)}")
        return s


@irdl_op_definition
class SoftmaxOp(AxisOp):
    """`%1 = softmax(%0) {axis = 1}` — torch.softmax(x, dim=axis)."""

    name = "tl.softmax"


@irdl_op_definition
class LogSoftmaxOp(AxisOp):
    """`%1 = log_softmax(%0) {axis = 1}` — stable torch.log_softmax(x, dim=axis)."""

    name = "tl.log_softmax"


@irdl_op_definition
class HardMaskedSoftmaxOp(NodeOp):
    """`%1 = hard_masked_softmax(%0) {mask_shape = [2, 2], allowed = [true, false, true, true]}`
    — softmax over the last axis among allowed entries; blocked entries (and fully blocked rows)
    give 0."""

    name = "tl.hard_masked_softmax"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("mask_shape", Kind.INTS),
        Field("allowed", Kind.BOOLS),
    )

    def describe(self) -> str:
        return f"hard_masked_softmax(maskShape={fmt_shape(self.meta('mask_shape'))})"

    def infer(self, parents: list[Shape]) -> Shape:
        """`allowed` has `numel(mask_shape)` entries, `mask_shape` equals the parent's shape, rank ≥
        1; s → s."""
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
    PAYLOAD = (
        *(
            Param(f, lambda node, parents, _o: parents[0][node.meta("axis") :], required=False)
            for f in ("gamma", "beta")
        ),
        Param("eps", required=False, default=1e-5, scalar=True, differentiable=False),
    )
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        """`axis < rank` and `numel(s[axis:]) > 0`; s → s. The normalised suffix is `s[axis:]`
        (PyTorch's `normalized_shape`)."""
        (s,) = parents
        axis = self.meta("axis")
        check_axis(axis, s)
        check_positive("layernorm", "embedDim", numel(s[axis:]))
        return s


@irdl_op_definition
class ReshapeOp(NodeOp):
    """`%1 = reshape(%0) {from = [2, 3], to = [6]}` — same elements, row-major."""

    name = "tl.reshape"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("from", Kind.INTS), Field("to", Kind.INTS))

    def infer(self, parents: list[Shape]) -> Shape:
        """The parent must have shape `from`, and `numel(from) = numel(to)`; the result is `to`."""
        (s,) = parents
        src, dst = self.meta("from"), self.meta("to")
        expect_parent_shape(self.TAG, src, s)
        if numel(src) != numel(dst):
            raise ShapeError(f"reshape: numel mismatch: {numel(src)} vs {numel(dst)}")
        return dst


@irdl_op_definition
class FlattenOp(NodeOp):
    """`%1 = flatten(%0) {shape = [2, 3]} : [6]` — to a vector of numel(shape)."""

    name = "tl.flatten"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("shape", Kind.INTS),)

    def infer(self, parents: list[Shape]) -> Shape:
        """The parent must have shape `shape`; the result is `[numel(shape)]`."""
        (s,) = parents
        expected = self.meta("shape")
        expect_parent_shape(self.TAG, expected, s)
        return (numel(s),)


@irdl_op_definition
class ConcatOp(NodeOp):
    """`%3 = concat(%1, %2) {axis = 1}` — same rank, other extents equal, axis extents summed."""

    name = "tl.concat"
    ARITY: ClassVar[tuple[int, int | None]] = (2, None)
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT),)

    def infer(self, parents: list[Shape]) -> Shape:
        """Two or more parents of the same rank, `axis < rank`, every other extent equal; the axis
        extents are summed."""
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
class GatherOp(NodeOp):
    """`%1 = gather(%0) {axis = 1, indices = [2, 0, 0]}` — out[..., j, ...] = x[..., indices[j],
    ...] along `axis` (PyTorch's `index_select`, ONNX's `Gather` with constant 1-D indices).
    Slices, splits, integer indexing and nearest-neighbour resizing are gathers."""

    name = "tl.gather"
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("axis", Kind.INT), Field("indices", Kind.INTS))

    def infer(self, parents: list[Shape]) -> Shape:
        """`axis < rank`, every index `< s[axis]`; the axis extent becomes `len(indices)`."""
        (s,) = parents
        axis, indices = self.meta("axis"), self.meta("indices")
        check_axis(axis, s)
        for index in indices:
            if index >= s[axis]:
                raise ShapeError(
                    f"gather: index {index} out of range for axis {axis} of shape {fmt_shape(s)}"
                )
        return s[:axis] + (len(indices),) + s[axis + 1 :]


@irdl_op_definition
class MseLossOp(NodeOp):
    """`%2 = mse_loss(%0, %1) : []` — mean of (yhat - target)^2."""

    name = "tl.mse_loss"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, parents: list[Shape]) -> Shape:
        """Both parents the same shape; the result is `[]`."""
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
        super().__init__(attributes={"sym_name": StringAttr(name)}, regions=[Region(block_of(ops))])

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
    AbsOp, SqrtOp, NegOp, ReluOp, LeakyReluOp, TanhOp, SigmoidOp, SoftplusOp, ExpOp, LogOp, InvOp,
    SinOp, CosOp, GeluOp, ErfOp, EluOp, SeluOp, HardSigmoidOp, HardSwishOp, SiluOp, ClipOp,
    SoftsignOp,
    DivOp, PreluOp, PowOp, PowElemOp, RsqrtOp, LrnOp, PadOp, LessOp, WhereOp, TruncOp,
    MaxPoolOp, AvgPoolOp, BroadcastToOp, ReduceSumOp, ReduceMeanOp, SumOp, MatmulOp,
    LinearOp, ConvOp, BatchNormEvalOp, SafeLogOp, SoftmaxOp, LogSoftmaxOp, HardMaskedSoftmaxOp,
    LayernormOp, ReshapeOp, FlattenOp, ConcatOp, MseLossOp, GatherOp,
)  # fmt: skip
