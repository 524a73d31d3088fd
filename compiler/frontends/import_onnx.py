"""ONNX import: an ONNX model (opset 13 and later, default domain) becomes a tl graph + payload.

`from_onnx(path_or_model)` maps every node through `RULES`, one table keyed by ONNX op type
(the source's vocabulary: several op types make the same tl op, some make none); each entry
names the attributes its rule understands, and a node carrying any other attribute is refused.
An op type that is an op kind's `ONNX` spelling (`tl.leaky_relu` is `LeakyRelu` with `alpha` as
`negative_slope`) is imported from that spelling (`DERIVED`): its attributes set the mapped
metadata fields, an absent one leaves the field's default (which is ONNX's). Explicit rules
remain only where the ONNX form differs from a tl op: layers taking parameters as inputs
(Conv, Gemm, BatchNormalization, LayerNormalization), shapes and axes given as inputs or with
negative defaults (Reshape, Expand, Softmax, Concat, Transpose, reductions), pooling's padding
conventions, value-level ops (Identity, Cast, Constant) and Add's bias fusion.

Initializers and `Constant` outputs are constants: a layer that takes them as parameters (Conv
weights, Gemm/MatMul right-hand sides, normalisation statistics) puts them in its payload record;
anywhere else they become `const` nodes. `Gemm`, and `MatMul` followed by the `Add` of a bias
vector, become `linear` where that is exact (the weight is a constant matrix, alpha = beta = 1):
PyTorch's `[out, in]` layout is `transB = 1`'s `B` as stored.

ONNX broadcasts; tl does not, so broadcasting appears as explicit `broadcast_to` nodes. Graph
inputs become input nodes in order (ids 0, 1, ...); their shapes must be static (or given with
`input_shapes`). Integer and float16 tensors are held as reals where that computes ONNX's
values (`SELECTING`, `INTEGER_ARITHMETIC`; checked per run by `Traced.check_values`), and a
model with several outputs is one graph per output. Every node's tl shape is checked against
ONNX's own shape inference where that knows the shape. Unsupported ops, attributes, dtypes and
data-dependent shapes are errors naming the node and its op type:
`ONNX import: node 'conv1' (Conv): unsupported attribute 'foo'`.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location
from tlc.core.limits import LimitError, check_elements
from tlc.core.payload import named
from tlc.dialect import ops as tl
from tlc.dialect.batch import concrete
from tlc.dialect.families import BinaryOp, OnnxSpelling
from tlc.dialect.metadata import Kind
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import BATCH, Shape, fmt_shape
from tlc.frontends.import_common import (
    ImportFailure,
    Resampling,
    along,
    broadcast_all,
    broadcast_to,
    ceil_mode_extra,
    channel_norm,
    conv_transpose,
    dilated_max_pool,
    einsum,
    elementwise,
    finish,
    generalise_batch,
    import_error,
    interpolate,
    ints,
    lift,
    matmul,
    new_builder,
    norm_axis,
    pad,
    pad_or_crop,
    reduce,
    reshape,
    take,
    tile,
    weighted_taps,
    window_counts,
)
from tlc.frontends.onnx_prepare import (
    check_strings,
    graph_inputs,
    opset_of,
    prepare,
    unsupported_report,
)
from tlc.semantics.program import EXACT_INTEGERS, GraphBuilder, SourceValue, Traced

PREFIX = "ONNX import"
MIN_OPSET = 13
REAL_TYPES = {TensorProto.FLOAT: "FLOAT", TensorProto.DOUBLE: "DOUBLE"}

#: Element types tl holds as reals beside FLOAT, DOUBLE and BOOL (docs/importing.md, "Integers
#: and float16"): their values are numbers of the type only while `Traced.check_values` says so.
EXACT_TYPES: dict[int, np.dtype] = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t))
    for t in (
        TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
        TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
        TensorProto.FLOAT16,
    )
}  # fmt: skip

#: Op types whose every output element, on integers or float16, is an element of an input, a
#: constant of the node or 0 and 1: their float64 value is ONNX's value of the type.
SELECTING = frozenset({
    "Identity", "Reshape", "Flatten", "Transpose", "Concat", "Gather", "GatherND", "Slice", "Split",
    "Squeeze", "Unsqueeze", "Expand", "Tile", "Pad", "Where", "MaxPool", "GlobalMaxPool",
    "ReduceMax", "ReduceMin", "Max", "Min", "Clip", "Relu", "Abs", "Neg", "Sign", "Less",
    "Greater", "Constant", "Cast", "CastLike",
})  # fmt: skip

#: Op types whose float64 value on integers is ONNX's integer value whenever the value and its
#: operands are integers of the type below 2^53 (checked on each run, `Traced.check_values`):
#: float64 sums, differences and products of such integers are exact, and so is C's `pow`
#: where the power is such an integer (glibc's pow errs by less than 1 ulp); Div is
#: trunc(a / b) (`_div`).
INTEGER_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Pow", "Div"})

#: Op types of INTEGER_ARITHMETIC and SELECTING that read every input as data (so a constant
#: input is a value of the computation, which float64 holds exactly only below 2^53).
DATA_INPUTS = frozenset({"Add", "Sub", "Mul", "Pow", "Div", "Max", "Min", "Where", "Concat",
                         "Less", "Greater"})  # fmt: skip

_REQUIRED = object()

Value = SSAValue | np.ndarray


@dataclass
class NodeCall:
    """One ONNX node being translated."""

    importer: OnnxImporter
    node: onnx.NodeProto
    index: int

    @property
    def ops(self) -> GraphBuilder:
        return self.importer.builder

    @property
    def opset(self) -> int:
        return self.importer.opset

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        for a in self.node.attribute:
            if a.name == name:
                value = helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        if default is _REQUIRED:
            raise self.refuse(f"missing attribute '{name}'")
        return default

    def input(self, i: int) -> Value | None:
        """Input `i`, or None where it is absent (past the end or an empty name)."""
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        return self.importer.env[self.node.input[i]]

    def inputs(self) -> list[Value]:
        return [self.importer.env[name] for name in self.node.input if name]

    def tensor(self, i: int) -> SSAValue:
        value = self.input(i)
        if value is None:
            raise self.refuse(f"missing input {i}")
        return lift(self.ops, value)

    def const(self, i: int, what: str, default: Any = _REQUIRED) -> np.ndarray | None:
        """Input `i`, which must be an initializer or a Constant output."""
        value = self.input(i)
        if value is None:
            if default is _REQUIRED:
                raise self.refuse(f"missing input {i} ({what})")
            return default
        if not isinstance(value, np.ndarray):
            raise self.refuse(f"{what} (input {i}) must be an initializer or a Constant")
        return value

    def shape(self, value: SSAValue) -> Shape:
        return self.ops.shape_of(value)

    def used(self, i: int) -> bool:
        """Whether output `i` exists and a later node or the graph's output reads it."""
        return i < len(self.node.output) and bool(self.importer.uses[self.node.output[i]])

    def refuse(self, message: str) -> ImportFailure:
        return import_error(PREFIX, f"{self.importer.describe(self.node, self.index)}: {message}")


Rule = Callable[..., Value | list[Value | None]]


@dataclass(frozen=True)
class Entry:
    rule: Rule
    attributes: frozenset[str]
    #: How many leading outputs the rule produces (None: all of them); later outputs must be
    #: unused.
    outputs: int | None = 1


#: ONNX op type -> the rule and the attributes it understands.
RULES: dict[str, Entry] = {}


def on(
    *op_types: str, attributes: Sequence[str] = (), outputs: int | None = 1, **bound: Any
) -> Callable[[Rule], Rule]:
    def add(rule: Rule) -> Rule:
        fn = functools.partial(rule, **bound) if bound else rule
        for op_type in op_types:
            assert op_type not in RULES, f"two rules for {op_type}"
            RULES[op_type] = Entry(fn, frozenset(attributes), outputs)
        return rule

    return add


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------


@on("Identity")
def _identity(call: NodeCall) -> Value:
    value = call.input(0)
    if value is None:
        raise call.refuse("missing input 0")
    return value


@on("Clip")
def _clip(call: NodeCall) -> SSAValue:
    """Clip's bounds are inputs from opset 11 (older models are converted first); tl's are
    fields, so a given bound must be a constant. An absent bound is infinite."""
    fields = {}
    for i, name in ((1, "min"), (2, "max")):
        bound = call.const(i, name, None)
        if bound is not None:
            fields[name] = float(np.asarray(bound).reshape(()))
    return call.ops.apply(tl.ClipOp, [call.tensor(0)], fields)


@on("Selu", attributes=["alpha", "gamma"])
def _selu(call: NodeCall) -> SSAValue:
    """tl's selu has SELU's constants; ONNX states them as attributes whose defaults are their
    float32 roundings (and PyTorch's exporter writes those values out). Other constants are
    gamma · elu(x, alpha), the formula tl's selu computes, with the given ones."""
    alpha = float(call.attr("alpha", np.float32(tl.SELU_ALPHA)))
    gamma = float(call.attr("gamma", np.float32(tl.SELU_SCALE)))
    x = call.tensor(0)
    if np.float32(alpha) == np.float32(tl.SELU_ALPHA) and np.float32(gamma) == np.float32(
        tl.SELU_SCALE
    ):
        return call.ops.apply(tl.SeluOp, [x], {})
    y = call.ops.apply(tl.EluOp, [x], {"alpha": alpha})
    return elementwise(call.ops, tl.MulElemOp, [y, np.float64(gamma)])


def _to_real(call: NodeCall, value: Value | None, target: int) -> Value:
    """Casts between real types leave a tl value alone (graphs are dtype-free; the scalar type
    is chosen at run time); integer constants become reals exactly. A cast to an integer type
    or float16 leaves the value alone too where the source holds integers (or booleans): the
    value is the cast's while it is a number of the target type, which `Traced.check_values`
    checks; from a real type to an integer type it is truncated (`trunc`), and to float16 it
    would round, which no tl op does."""
    if value is None:
        raise call.refuse("missing input 0")
    source = call.importer.types.get(call.node.input[0])
    integral = source in EXACT_TYPES and source != TensorProto.FLOAT16
    if target in EXACT_TYPES and target != TensorProto.FLOAT16 and not integral:
        # From a real (or BOOL) type: C's conversion, toward zero (ONNX leaves a value out of
        # the target's range undefined: `Traced.check_values` refuses it)
        if isinstance(value, np.ndarray):
            return np.trunc(value.astype(np.float64))
        return call.ops.apply(tl.TruncOp, [value])
    if target == TensorProto.FLOAT16 and not (integral or source == TensorProto.BOOL):
        raise call.refuse(
            f"cast to FLOAT16 from {TensorProto.DataType.Name(source or 0)} (tl computes on "
            "reals and has no rounding to float16)"
        )
    if target not in {*REAL_TYPES, *EXACT_TYPES}:
        raise call.refuse(f"cast to {TensorProto.DataType.Name(target)} (tl computes on reals)")
    return value.astype(np.float64) if isinstance(value, np.ndarray) else value


@on("Cast", attributes=["to", "saturate", "round_mode"])
def _cast(call: NodeCall) -> Value:
    """To BOOL: tl's booleans are 1 where the value is not 0 (NaN included) and 0 elsewhere,
    a `where` of constants; to a real type: `_to_real`."""
    value = call.input(0)
    if call.attr("to") == TensorProto.BOOL and value is not None:
        if isinstance(value, np.ndarray):
            return (value != 0).astype(np.float64)
        shape = call.shape(value)
        ones, zeros = call.ops.const(np.ones(shape)), call.ops.const(np.zeros(shape))
        return call.ops.apply(tl.WhereOp, [value, ones, zeros])
    return _to_real(call, value, call.attr("to"))


@on("CastLike", attributes=["saturate", "round_mode"])
def _cast_like(call: NodeCall) -> Value:
    like = call.input(1)
    target = (
        helper.np_dtype_to_tensor_dtype(like.dtype)
        if isinstance(like, np.ndarray)
        else TensorProto.DOUBLE
    )
    return _to_real(call, call.input(0), target)


@on("Add")
def _add(call: NodeCall) -> Value:
    """An Add of a bias vector to a bias-free MatMul's `linear` fills its bias (see
    `OnnxImporter.fuse_bias`); any other Add is the elementwise op."""
    values = call.inputs()
    if len(values) == 2:
        fused = call.importer.fuse_bias(call, *values)
        if fused is not None:
            return fused
    return _elementwise(call, tl.AddOp)


def _elementwise(call: NodeCall, op: type[tl.NodeOp]) -> Value:
    """An elementwise binary op over the node's inputs: ONNX broadcasts them
    (multidirectionally) and Max/Min take any number, folded left; one input is itself."""
    values = call.inputs()
    if not values:
        raise call.refuse("no inputs")
    if len(values) == 1:
        return values[0]
    return elementwise(call.ops, op, values)


# --------------------------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------------------------


@on("MatMul")
def _matmul(call: NodeCall) -> SSAValue:
    a, b = call.input(0), call.input(1)
    if isinstance(b, np.ndarray) and b.ndim == 2 and isinstance(a, SSAValue):
        out = call.ops.linear(a, b.T.copy())
        call.importer.bias_free[out] = call.node.output[0]
        return out
    return matmul(call.ops, call.tensor(0), call.tensor(1))


@on("Gemm", attributes=["alpha", "beta", "transA", "transB"])
def _gemm(call: NodeCall) -> SSAValue:
    """Y = alpha * A' B' + beta * C; a `linear` with bias where B is constant and
    alpha = beta = 1 with C a row vector, else linear/matmul followed by explicit scaling."""
    alpha, beta = call.attr("alpha", 1.0), call.attr("beta", 1.0)
    a = call.tensor(0)
    if call.attr("transA", 0):
        a = call.ops.transpose(a, axis1=0, axis2=1)
    b, c = call.input(1), call.input(2)
    trans_b = call.attr("transB", 0)
    if isinstance(b, np.ndarray):
        weight = b if trans_b else b.T.copy()
        out_dim = weight.shape[0]
        bias = None
        if isinstance(c, np.ndarray) and alpha == 1 and beta == 1 and _is_row(c, out_dim):
            bias, c = np.broadcast_to(c, (out_dim,)).reshape(out_dim).copy(), None
        y = call.ops.linear(a, weight, bias)
    else:
        b = call.tensor(1)
        y = call.ops.matmul(a, call.ops.transpose(b, axis1=0, axis2=1) if trans_b else b)
    if alpha != 1:
        y = elementwise(call.ops, tl.MulElemOp, [y, np.float64(alpha)])
    if c is None:
        return y
    if isinstance(c, np.ndarray):
        return elementwise(call.ops, tl.AddOp, [y, beta * np.asarray(c, np.float64)])
    term = c if beta == 1 else elementwise(call.ops, tl.MulElemOp, [c, np.float64(beta)])
    return elementwise(call.ops, tl.AddOp, [y, term])


def _is_row(c: np.ndarray, n: int) -> bool:
    """C broadcasts along rows only: shape [], [1], [n], [1, n] or [1, 1]."""
    return c.ndim <= 2 and all(d == 1 for d in c.shape[:-1]) and c.shape[-1:] in ((), (1,), (n,))


# --------------------------------------------------------------------------------------------
# Normalisations along an axis
# --------------------------------------------------------------------------------------------


@on("Softmax", attributes=["axis"], op=tl.SoftmaxOp)
@on("LogSoftmax", attributes=["axis"], op=tl.LogSoftmaxOp)
def _softmax(call: NodeCall, op: type[tl.NodeOp]) -> SSAValue:
    x = call.tensor(0)
    axis = norm_axis(call.attr("axis", -1), len(call.shape(x)))
    return call.ops.apply(op, [x], {"axis": axis})


@on("LayerNormalization", attributes=["axis", "epsilon", "stash_type"], outputs=3)
def _layernorm(call: NodeCall) -> list[Value | None]:
    """Y is a `layernorm`; the optional Mean and InvStdDev outputs (over the normalised axes,
    kept as extent 1) are built from reductions. Each is built only where the model uses it
    (None otherwise)."""
    x = call.tensor(0)
    shape = call.shape(x)
    axis = norm_axis(call.attr("axis", -1), len(shape))
    suffix = shape[axis:]

    def affine(i: int, what: str) -> np.ndarray | None:
        value = call.const(i, what, None)
        return None if value is None else np.broadcast_to(value, suffix).copy()

    eps = float(call.attr("epsilon", 1e-5))
    outputs: list[Value | None] = [
        call.ops.layernorm(x, affine(1, "scale"), affine(2, "bias"), eps, axis=axis)
        if call.used(0)
        else None
    ]
    if not any(call.used(i) for i in (1, 2)):
        return outputs
    axes = list(range(axis, len(shape)))
    mean = reduce(call.ops, tl.ReduceMeanOp, x, axes, keepdims=True)
    centred = elementwise(call.ops, tl.SubOp, [x, mean])
    square = call.ops.apply(tl.MulElemOp, [centred, centred])
    variance = reduce(call.ops, tl.ReduceMeanOp, square, axes, keepdims=True)
    std = call.ops.apply(tl.SqrtOp, [elementwise(call.ops, tl.AddOp, [variance, np.float64(eps)])])
    return [*outputs, mean, call.ops.apply(tl.InvOp, [std])]


@on("BatchNormalization", attributes=["epsilon", "momentum", "training_mode"], outputs=3)
def _batch_norm(call: NodeCall) -> SSAValue | list[Value | None]:
    """Eval mode is `batch_norm_eval` with the stored statistics. training_mode=1 normalises by
    the batch's own per-channel mean and (biased) variance over every axis but the channels,
    from reductions, and its running_mean / running_var outputs are the stored statistics
    times momentum plus the batch's times 1 - momentum (ONNX's reference)."""
    gamma, beta = call.const(1, "scale"), call.const(2, "B")
    mean, var = call.const(3, "input_mean"), call.const(4, "input_var")
    eps = float(call.attr("epsilon", 1e-5))
    x = call.tensor(0)
    if not call.attr("training_mode", 0):
        if call.used(1) or call.used(2):
            raise call.refuse("running_mean and running_var are outputs of training_mode=1 only")
        return call.ops.batch_norm_eval(x, gamma, beta, mean, var, eps, channel_axis=1)
    shape = call.shape(x)
    axes = [0, *range(2, len(shape))]
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)
    batch_mean = reduce(call.ops, tl.ReduceMeanOp, x, axes, keepdims=True)
    centred = elementwise(call.ops, tl.SubOp, [x, batch_mean])
    square = call.ops.apply(tl.MulElemOp, [centred, centred])
    batch_var = reduce(call.ops, tl.ReduceMeanOp, square, axes, keepdims=True)
    std = call.ops.apply(tl.SqrtOp, [elementwise(call.ops, tl.AddOp, [batch_var, np.float64(eps)])])
    y = elementwise(call.ops, tl.DivOp, [centred, std])
    y = elementwise(call.ops, tl.MulElemOp, [y, np.reshape(gamma, per_channel)])
    y = elementwise(call.ops, tl.AddOp, [y, np.reshape(beta, per_channel)])
    momentum = float(call.attr("momentum", np.float32(0.9)))

    def running(stored: np.ndarray, batch: SSAValue) -> SSAValue:
        new = elementwise(call.ops, tl.MulElemOp, [reshape(call.ops, batch, [shape[1]]),
                                                   np.float64(1 - momentum)])  # fmt: skip
        return elementwise(call.ops, tl.AddOp, [np.asarray(stored) * momentum, new])

    return [y, running(mean, batch_mean), running(var, batch_var)]


# --------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------


def _pads(
    call: NodeCall, spatial: Shape, kernel: list[int], stride: list[int], dilation: list[int]
) -> tuple[list[int], list[int]]:
    """Padding before and after each spatial axis, from `pads` or `auto_pad`."""
    rank = len(kernel)
    auto = call.attr("auto_pad", "NOTSET")
    if auto == "VALID":
        return [0] * rank, [0] * rank
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for n, k, s, d in zip(spatial, kernel, stride, dilation, strict=True):
            total = max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
            small, large = total // 2, total - total // 2
            lo.append(small if auto == "SAME_UPPER" else large)
            hi.append(large if auto == "SAME_UPPER" else small)
        return lo, hi
    if auto != "NOTSET":
        raise call.refuse(f"auto_pad='{auto}'")
    pads = ints(call.attr("pads", [0] * (2 * rank)))
    return pads[:rank], pads[rank:]


@dataclass(frozen=True)
class ConvInputs:
    """A Conv's or ConvTranspose's input, constant weight and bias, and window geometry."""

    x: SSAValue
    weight: np.ndarray
    bias: np.ndarray | None
    kernel: list[int]
    stride: list[int]
    dilation: list[int]


def _conv_inputs(call: NodeCall) -> ConvInputs:
    weight = call.const(1, "W")
    rank = weight.ndim - 2
    kernel = list(weight.shape[2:])
    if ints(call.attr("kernel_shape", kernel)) != kernel:
        raise call.refuse("kernel_shape disagrees with the weight's shape")
    stride = ints(call.attr("strides", [1] * rank))
    dilation = ints(call.attr("dilations", [1] * rank))
    return ConvInputs(call.tensor(0), weight, call.const(2, "B", None), kernel, stride, dilation)


@on("Conv", attributes=["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])
def _conv(call: NodeCall) -> SSAValue:
    c = _conv_inputs(call)
    x, weight, bias, stride, dilation = c.x, c.weight, c.bias, c.stride, c.dilation
    lo, hi = _pads(call, call.shape(x)[2:], c.kernel, stride, dilation)
    return call.ops.conv(
        x, weight, bias, stride=stride, padding=lo, padding_after=hi, dilation=dilation,
        groups=int(call.attr("group", 1)), channel_axis=1,
    )  # fmt: skip


POOL_ATTRIBUTES = ["auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"]


@on("GlobalAveragePool", op=tl.AvgPoolOp)
@on("GlobalMaxPool", op=tl.MaxPoolOp)
def _global_pool(call: NodeCall, op: type[tl.PoolOp]) -> SSAValue:
    """One window over every axis after the channel axis ([N, C, d1, ...] to [N, C, 1, ...]):
    a pool whose kernel is the spatial extents."""
    x = call.tensor(0)
    spatial = list(call.shape(x)[2:])
    if not spatial:
        return x
    return call.ops.apply(
        op, [x], {"kernel": spatial, "stride": spatial, "padding": [0] * len(spatial)}
    )


@on("Sum")
def _sum(call: NodeCall) -> Value:
    """Variadic Sum: its inputs broadcast and added left to right (ONNX's order)."""
    return _elementwise(call, tl.AddOp)


@on("MaxPool", attributes=[*POOL_ATTRIBUTES, "storage_order"], op=tl.MaxPoolOp)
@on("AveragePool", attributes=[*POOL_ATTRIBUTES, "count_include_pad"], op=tl.AvgPoolOp)
def _pool(call: NodeCall, op: type[tl.PoolOp]) -> SSAValue:
    x = call.tensor(0)
    kernel = ints(call.attr("kernel_shape"))
    rank = len(kernel)
    stride = ints(call.attr("strides", [1] * rank))
    dilation = ints(call.attr("dilations", [1] * rank))
    dilated = dilation != [1] * rank
    spatial = call.shape(x)[-rank:]
    lo, hi = _pads(call, spatial, kernel, stride, dilation)
    counts_pad = op is tl.AvgPoolOp and call.attr("count_include_pad", 0)
    extra = [0] * rank
    if call.attr("ceil_mode", 0):
        span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
        extra = [ceil_mode_extra(*a) for a in zip(spatial, lo, hi, span, stride, strict=True)]
        hi = [h + e for h, e in zip(hi, extra, strict=True)]
    if dilated and op is tl.MaxPoolOp:
        y = dilated_max_pool(call.ops, x, kernel, stride, dilation, lo, hi)
    elif dilated:
        # An average is a depthwise convolution with uniform weights, and tl's conv dilates.
        channels = call.shape(x)[1]
        weight = np.full((channels, 1, *kernel), 1.0 / prod(kernel))
        y = call.ops.conv(
            x, weight, stride=stride, padding=lo, padding_after=hi, dilation=dilation,
            groups=channels, channel_axis=1,
        )  # fmt: skip
    else:
        y = _pool_padded(call, op, x, rank, kernel, stride, lo, hi)
    if op is tl.MaxPoolOp or not any(lo + hi) or (counts_pad and not any(extra)):
        return y
    # tl divides every window by its full size; ONNX divides by the input elements it covers,
    # with count_include_pad=1 by the elements of the padded input (ceil_mode's partial
    # windows reach past it).
    geometry = zip(spatial, lo, hi, kernel, stride, dilation, strict=True)
    if counts_pad:
        geometry = (
            (n + p + h - e, 0, e, k, s, d)
            for (n, p, h, k, s, d), e in zip(geometry, extra, strict=True)
        )
    counted = functools.reduce(np.multiply.outer, [window_counts(*a) for a in geometry])
    if not counted.all():
        raise call.refuse("a window covers only padding (count_include_pad=0 divides by zero)")
    return elementwise(call.ops, tl.MulElemOp, [y, prod(kernel) / counted])


def _pool_padded(
    call: NodeCall,
    op: type[tl.PoolOp],
    x: SSAValue,
    rank: int,
    kernel: list[int],
    stride: list[int],
    lo: list[int],
    hi: list[int],
) -> SSAValue:
    """The pool over `x` padded by `lo`/`hi` (zeros, counted, for an average)."""
    padding = lo
    if lo != hi or any(2 * p > k for p, k in zip(lo, kernel, strict=True)):
        # tl pads both sides equally, at most half a window: pad explicitly instead, with
        # what the pool would have padded with (-inf never wins a max; zeros are counted).
        fill = -np.inf if op is tl.MaxPoolOp else 0.0
        x = pad(call.ops, x, len(call.shape(x)) - rank, lo, hi, fill)
        padding = [0] * rank
    return call.ops.apply(op, [x], {"kernel": kernel, "stride": stride, "padding": padding})


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


@on("Flatten", attributes=["axis"])
def _flatten(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    shape = call.shape(x)
    axis = norm_axis(call.attr("axis", 1), len(shape))
    return reshape(call.ops, x, [prod(shape[:axis]), prod(shape[axis:])])


@on("Reshape", attributes=["allowzero"])
def _reshape(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    source = call.shape(x)
    target = ints(call.const(1, "shape").reshape(-1))
    allowzero = call.attr("allowzero", 0)
    copies = [i for i, d in enumerate(target) if d == 0 and not allowzero]  # 0: keep the extent
    if target.count(-1) > 1 or min(target, default=0) < -1 or any(i >= len(source) for i in copies):
        raise call.refuse(f"cannot reshape {fmt_shape(source)} to shape {list(target)}")
    target = [source[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if -1 in target:
        known = prod(d for d in target if d != -1)
        target[target.index(-1)] = prod(source) // known if known else 0
    if prod(target) != prod(source):
        raise call.refuse(f"cannot reshape {fmt_shape(source)} to {fmt_shape(target)}")
    return reshape(call.ops, x, target)


@on("Expand")
def _expand(call: NodeCall) -> SSAValue:
    """Bidirectional broadcasting against a constant shape."""
    x = call.tensor(0)
    shape = tuple(ints(call.const(1, "shape").reshape(-1)))
    try:  # numpy cannot even broadcast shapes past 2^63 elements
        check_elements(shape, f"output '{call.node.output[0]}'")
        target = np.broadcast_shapes(call.shape(x), shape)
    except (LimitError, ValueError) as exc:
        raise call.refuse(str(exc)) from None
    return broadcast_to(call.ops, x, target)


@on("Transpose", attributes=["perm"])
def _transpose(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    rank = len(call.shape(x))
    perm = ints(call.attr("perm", list(reversed(range(rank)))))
    return x if perm == list(range(rank)) else call.ops.permute(x, perm=perm)


@on("Concat", attributes=["axis"])
def _concat(call: NodeCall) -> SSAValue:
    parts = [lift(call.ops, v) for v in call.inputs()]
    if len(parts) == 1:
        return parts[0]
    axis = norm_axis(call.attr("axis"), len(call.shape(parts[0])))
    return call.ops.concat(*parts, axis=axis)


def _axes(call: NodeCall, index: int, rank: int) -> list[int] | None:
    """Axes given as a constant input (opset 13 and later; older models are converted)."""
    given = call.const(index, "axes", None)
    return None if given is None else [norm_axis(a, rank) for a in ints(given.reshape(-1))]


@on("Gather", attributes=["axis"])
def _gather(call: NodeCall) -> SSAValue:
    """Constant integer indices of any shape (NumPy's `take`): a `gather` of the flattened
    indices, reshaped to the indices' shape in place of the axis. Indices the graph computes
    (an embedding's token ids) select from constant data: `_lookup`."""
    indices = call.input(1)
    if isinstance(indices, SSAValue) and isinstance(call.input(0), np.ndarray):
        return _lookup(call, call.input(0), indices)
    x = call.tensor(0)
    indices = call.const(1, "indices")
    if not np.issubdtype(indices.dtype, np.integer):
        raise call.refuse(f"indices of type {indices.dtype} (integers only)")
    return take(call.ops, x, norm_axis(call.attr("axis", 0), len(call.shape(x))), indices)


@on("GatherND", attributes=["batch_dims"])
def _gather_nd(call: NodeCall) -> SSAValue:
    """Constant indices [B..., I..., k] over data [B..., D1..Dk, ...] (B: the first
    `batch_dims` axes, the same in both): each index row picks a slice of its batch entry's
    axes D1..Dk. The batch and D axes flattened to one, the rows' flat (row-major) positions
    `take`n from it (PyTorch's dynamo export of an adaptive pool that repeats elements)."""
    x = call.tensor(0)
    indices = call.const(1, "indices")  # int64 (the checker refuses other types)
    shape = call.shape(x)
    b = int(call.attr("batch_dims", 0))
    if not 0 <= b < min(len(shape), max(indices.ndim, 1)):
        raise call.refuse(
            f"batch_dims={b} (0 to one less than the smaller rank: data {len(shape)}, "
            f"indices {indices.ndim})"
        )
    if list(indices.shape[:b]) != list(shape[:b]):
        raise call.refuse(
            f"the indices' batch axes {list(indices.shape[:b])} differ from the data's "
            f"{list(shape[:b])}"
        )
    k = indices.shape[-1] if indices.ndim else 0
    if not 1 <= k <= len(shape) - b:
        raise call.refuse(
            f"index rows of length {k} (1 to the data's rank after the batch axes, "
            f"{len(shape) - b})"
        )
    head = np.asarray(shape[b : b + k])
    if np.any((indices < -head) | (indices >= head)):
        raise call.refuse(
            f"an index out of range for the data's leading axes {list(shape[b : b + k])}"
        )
    rows = np.where(indices < 0, indices + head, indices)
    flat = np.ravel_multi_index(tuple(np.moveaxis(rows, -1, 0)), tuple(head))
    batches, span = int(np.prod(shape[:b])), int(np.prod(head))
    starts = np.arange(batches).reshape(*shape[:b], *[1] * (flat.ndim - b)) * span
    merged = reshape(call.ops, x, (batches * span, *shape[b + k :]))
    flat = flat + starts
    return take(call.ops, merged, 0, flat)


def _lookup(call: NodeCall, data: np.ndarray, indices: SSAValue) -> SSAValue:
    """Gather from constant data at indices the graph computes: the indices' one-hot rows over
    the axis (1 where index = k or k - n, by two `less` against the constant k), times the data
    by a `linear`; exact (each output is one datum plus zeros) where the data is finite. ONNX
    refuses an index outside [-n, n - 1]; tl's row would be zeros, so the range is checked on
    each run with the integer values (`Traced.check_values`)."""
    name = call.node.input[1]
    if call.importer.types.get(name) not in EXACT_TYPES:
        raise call.refuse(f"indices (input 1) '{name}' are not integers")
    if not np.all(np.isfinite(data)):
        raise call.refuse("data (input 0) holds a non-finite value (0 · inf is not 0)")
    axis = norm_axis(call.attr("axis", 0), data.ndim)
    n, shape = data.shape[axis], call.shape(indices)
    if n == 0:
        raise call.refuse(f"data (input 0) has an empty axis {axis}: no index is valid")
    ops = call.ops
    spread = broadcast_to(ops, reshape(ops, indices, (*shape, 1)), (*shape, n))
    k = np.broadcast_to(np.arange(n, dtype=np.float64), (*shape, n))
    wrapped = ops.apply(tl.LessOp, [spread, ops.const(np.zeros((*shape, n)))])
    spread = ops.add(spread, ops.mul_elem(wrapped, ops.const(np.full((*shape, n), float(n)))))
    below = ops.apply(tl.LessOp, [spread, ops.const(k)])
    above = ops.apply(tl.LessOp, [ops.const(k), spread])
    hot = ops.sub(ops.sub(ops.const(np.ones((*shape, n))), below), above)
    moved = np.moveaxis(np.asarray(data, np.float64), axis, 0)
    rows = ops.linear(hot, moved.reshape(n, -1).T.copy())
    out = reshape(ops, rows, (*shape, *moved.shape[1:]))
    if axis:  # [*indices, *before, *after] -> [*before, *indices, *after]
        r = len(shape)
        perm = [*range(r, r + axis), *range(r), *range(r + axis, len(call.shape(out)))]
        out = ops.permute(out, perm=perm)
    owner = indices.owner
    assert isinstance(owner, tl.NodeOp)
    what = (
        f"the indices of {call.importer.describe(call.node, call.index)} into an axis of "
        f"extent {n} (ONNX refuses the others)"
    )
    kind = EXACT_TYPES[call.importer.types[name]].name
    call.importer.within.append(SourceValue(owner.id, name, kind, (-n, n - 1, what)))
    return out


def slice_indices(n: int, start: int, end: int, step: int) -> range:
    """ONNX Slice's elements along an axis of extent n: negative starts/ends count from the end,
    then both are clamped into [0, n] (step > 0) or [0, n - 1] and [-1, n - 1] (step < 0)."""
    start, end = (v + n if v < 0 else v for v in (start, end))
    if step > 0:
        return range(min(max(start, 0), n), min(max(end, 0), n), step)
    return range(min(max(start, 0), n - 1), min(max(end, -1), n - 1), step)


@on("Slice")
def _slice(call: NodeCall) -> SSAValue:
    """Constant starts, ends, axes and steps: one `gather` per sliced axis."""
    x = call.tensor(0)
    shape = call.shape(x)
    starts = ints(call.const(1, "starts").reshape(-1))
    ends = ints(call.const(2, "ends").reshape(-1))
    axes = _axes(call, 3, len(shape)) or list(range(len(starts)))
    given = call.const(4, "steps", None)
    steps = [1] * len(starts) if given is None else ints(given.reshape(-1))
    if 0 in steps:
        raise call.refuse("a step of 0")
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        x = take(call.ops, x, axis, list(slice_indices(shape[axis], start, end, step)))
    return x


@on("Split", attributes=["axis", "num_outputs"], outputs=None)
def _split(call: NodeCall) -> list[Value | None]:
    """Several outputs, each one `gather` of its consecutive block (a node per used output).
    Sizes from the constant `split` input, else `num_outputs` (opset 18) or the node's output
    count: equal blocks, the last one smaller where the extent does not divide (ONNX's rule)."""
    x = call.tensor(0)
    shape = call.shape(x)
    axis = norm_axis(call.attr("axis", 0), len(shape))
    given = call.const(1, "split", None)
    n = shape[axis]
    if given is not None:
        sizes = ints(given.reshape(-1))
    else:
        count = call.attr("num_outputs", len(call.node.output))
        block = -(-n // count)
        sizes = [min(block, n - i * block) for i in range(count)]
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise call.refuse(f"split sizes {sizes} do not add up to the extent {n}")
    starts = np.cumsum([0, *sizes])
    return [
        take(call.ops, x, axis, list(range(starts[i], starts[i + 1]))) if call.used(i) else None
        for i in range(len(sizes))
    ]


@on("Squeeze")
def _squeeze(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    shape = call.shape(x)
    axes = _axes(call, 1, len(shape))
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else axes
    if any(shape[a] != 1 for a in axes):
        raise call.refuse(f"squeezing an axis of extent > 1 in {fmt_shape(shape)}")
    return reshape(call.ops, x, [d for i, d in enumerate(shape) if i not in axes])


@on("Unsqueeze")
def _unsqueeze(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    shape = list(call.shape(x))
    given = ints(call.const(1, "axes").reshape(-1))
    for a in sorted(norm_axis(a, len(shape) + len(given)) for a in given):
        shape.insert(a, 1)
    return reshape(call.ops, x, shape)


@on("Tile")
def _tile(call: NodeCall) -> SSAValue:
    """Each axis repeated: a reshape to [.., 1, d, ..], a broadcast to [.., r, d, ..], a
    reshape to [.., r d, ..] (the copies follow each other, as Tile lays them out)."""
    x = call.tensor(0)
    repeats = ints(call.const(1, "repeats").reshape(-1))
    if len(repeats) != len(call.shape(x)):
        raise call.refuse(f"{len(repeats)} repeats for an input of rank {len(call.shape(x))}")
    return tile(call.ops, x, repeats)


RESIZE_ATTRIBUTES = [
    "antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
    "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode",
]  # fmt: skip


def source_coordinates(
    mode: str, out: int, n: int, scale: float, roi: tuple[float, float] = (0.0, 1.0)
) -> np.ndarray:
    """ONNX Resize's coordinate_transformation_mode: the input coordinate of each output index.
    `scale` is the given scale, or out / n where sizes are given; the resized length the
    formulas use is `scale * n`, which differs from `out` where the scale does not divide
    (as ONNX's reference implementation computes it, in float64). `roi` is the axis's
    (start, end) region of interest, read by tf_crop_and_resize only."""
    x = np.arange(out, dtype=np.float64)
    width = scale * n
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if width != 1 else np.full(out, -0.5)
    if mode == "half_pixel_symmetric":
        return n / 2 * (1 - out / width) + (x + 0.5) / scale - 0.5
    if mode == "align_corners":
        return x * (n - 1) / (width - 1) if width != 1 else np.zeros(out)
    if mode == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            return np.full(out, (end - start) * (n - 1) / 2 + start * (n - 1))
        return x * (end - start) * (n - 1) / (width - 1) + start * (n - 1)
    return x / scale  # asymmetric


def nearest_indices(rounding: str, position: np.ndarray, n: int) -> np.ndarray:
    """ONNX Resize's nearest_mode, then clamped into the axis."""
    if rounding == "floor":
        index = np.floor(position)
    elif rounding == "ceil":
        index = np.ceil(position)
    elif rounding == "round_prefer_ceil":
        index = np.floor(position + 0.5)
    else:  # round_prefer_floor
        index = np.ceil(position - 0.5)
    return np.clip(index, 0, n - 1).astype(np.int64)


@on("Resize", attributes=RESIZE_ATTRIBUTES)
def _resize(call: NodeCall) -> SSAValue:
    """Every mode (nearest, linear, cubic with cubic_coeff_a and exclude_outside, antialias),
    every coordinate transformation (tf_crop_and_resize with its roi; outputs whose coordinate
    falls outside the input are extrapolation_value), every keep_aspect_ratio_policy (with
    sizes: not_larger / not_smaller take the smallest / largest scale for every axis and round
    the extents half up, as ONNX's reference does); each resized axis alone (the interpolation
    is separable): nearest is a `gather`, linear and cubic a sum of gathers weighted by
    constants (`weighted_taps`), extrapolation a `where` with a constant mask."""
    x = call.tensor(0)
    shape = call.shape(x)
    mode = call.attr("mode", "nearest")
    transform = call.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise call.refuse(f"mode '{mode}' (nearest, linear or cubic)")
    antialias = bool(call.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise call.refuse("antialias=1 with mode 'nearest' (linear and cubic only)")
    resampling = Resampling(
        mode,
        antialias,
        float(call.attr("cubic_coeff_a", -0.75)),
        bool(call.attr("exclude_outside", 0)),
    )
    axes = call.attr("axes", None)
    axes = list(range(len(shape))) if axes is None else [norm_axis(a, len(shape)) for a in axes]
    scales, sizes = call.const(2, "scales", None), call.const(3, "sizes", None)
    if sizes is not None and sizes.size:
        out = ints(sizes.reshape(-1))
        factors = [o / shape[a] for a, o in zip(axes, out, strict=True)]
        policy = call.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":  # one scale for every axis, the output rounded half up
            scale = min(factors) if policy == "not_larger" else max(factors)
            factors = [scale] * len(axes)
            out = [int(scale * shape[a] + 0.5) for a in axes]
    elif scales is not None and scales.size:
        factors = [float(f) for f in scales.reshape(-1)]
        out = [int(np.floor(shape[a] * f)) for a, f in zip(axes, factors, strict=True)]
    else:
        raise call.refuse("neither scales nor sizes given")
    rois = [(0.0, 1.0)] * len(axes)
    if transform == "tf_crop_and_resize":
        roi = call.const(1, "roi")
        roi = [float(r) for r in roi.reshape(-1)]
        if len(roi) != 2 * len(axes):
            raise call.refuse(f"roi holds {len(roi)} values (expected {2 * len(axes)})")
        rois = list(zip(roi[: len(axes)], roi[len(axes) :], strict=True))
    fill = float(call.attr("extrapolation_value", 0.0))
    for axis, o, factor, roi in zip(axes, out, factors, rois, strict=True):
        n = shape[axis]
        if o == n and factor == 1 and roi == (0.0, 1.0):
            continue
        position = source_coordinates(transform, o, n, factor, roi)
        if mode == "nearest":
            rounding = call.attr("nearest_mode", "round_prefer_floor")
            x = take(call.ops, x, axis, nearest_indices(rounding, position, n))
        elif mode == "linear" and not antialias:
            x = interpolate(call.ops, x, axis, position)
        else:
            x = weighted_taps(call.ops, x, axis, *resampling.taps(position, n, factor))
        outside = (position < 0) | (position > n - 1)
        if transform == "tf_crop_and_resize" and outside.any():
            mask = along(call.ops, outside.astype(np.float64), axis, x)
            x = call.ops.apply(tl.WhereOp, [mask, broadcast_to(call.ops, fill, call.shape(x)), x])
    return x


class Reduction(NamedTuple):
    """A reduction node's operand and what it reduces: `axes` normalised and sorted (None when
    none are given and noop_with_empty_axes makes the node the identity), `out` the result's
    shape under keepdims."""

    x: SSAValue
    axes: list[int] | None
    keep: bool
    out: list[int]


def _reduction(call: NodeCall, since: int, x: SSAValue | None = None) -> Reduction:
    """Read a reduction's operand (`x` when given: a value derived from input 0), axes and
    keepdims. The axes are an input from opset `since`, an attribute before; none given means
    every axis, or no reduction at all under noop_with_empty_axes."""
    x = call.tensor(0) if x is None else x
    shape = call.shape(x)
    rank = len(shape)
    if call.opset >= since:
        given = call.const(1, "axes", None)
        axes = None if given is None else ints(given.reshape(-1))
    else:
        axes = call.attr("axes", None)
    keep = bool(call.attr("keepdims", 1))
    if not axes:
        if call.attr("noop_with_empty_axes", 0):
            return Reduction(x, None, keep, list(shape))
        axes = range(rank)
    chosen = sorted({norm_axis(a, rank) for a in axes})
    out = [1 if a in chosen else d for a, d in enumerate(shape) if keep or a not in chosen]
    return Reduction(x, chosen, keep, out)


@on("ReduceSum", attributes=["keepdims", "noop_with_empty_axes"], op=tl.ReduceSumOp, since=13)
@on(
    "ReduceMean",
    attributes=["axes", "keepdims", "noop_with_empty_axes"],
    op=tl.ReduceMeanOp,
    since=18,
)
def _reduce(
    call: NodeCall, op: type[tl.ReductionOp], since: int, x: SSAValue | None = None
) -> SSAValue:
    """`since`: the opset from which the axes are an input rather than an attribute."""
    r = _reduction(call, since, x)
    if r.axes is None:
        return r.x
    if 0 in call.shape(r.x):
        # The sum of no elements is 0, their mean 0 / 0 (NaN), as in ONNX's reference; an
        # output of extent 0 holds nothing either way.
        return call.ops.const(np.full(r.out, 0.0 if op is tl.ReduceSumOp else np.nan))
    return reduce(call.ops, op, r.x, r.axes, r.keep)


@on("ReduceL2", attributes=["axes", "keepdims", "noop_with_empty_axes"])
def _reduce_l2(call: NodeCall) -> SSAValue:
    """The Euclidean norm over the axes (an input from opset 18): `sqrt` of the `reduce_sum`
    of `mul_elem(x, x)` (swin v2's cosine attention, F.normalize exported); over no elements
    0, as in ONNX's reference. Under noop_with_empty_axes with no axes ONNX still takes
    sqrt(x * x), i.e. |x|."""
    x = call.tensor(0)
    squares = _reduce(call, tl.ReduceSumOp, 18, call.ops.mul_elem(x, x))
    return call.ops.apply(tl.SqrtOp, [squares])


@on("ReduceMax", attributes=["axes", "keepdims", "noop_with_empty_axes"], negate=False)
@on("ReduceMin", attributes=["axes", "keepdims", "noop_with_empty_axes"], negate=True)
def _reduce_extreme(call: NodeCall, negate: bool) -> SSAValue:
    """The reduced axes moved last and flattened into one of extent n, then a max pool
    {kernel = n, stride = n}: exactly the max. The min is -max(-x) (negation is exact). Axes are
    an input from opset 18. Over no elements the result is ONNX's -inf (+inf for the min), for
    booleans False (True)."""
    r = _reduction(call, 18)
    if r.axes is None:
        return r.x
    x, shape = r.x, call.shape(r.x)
    rank = len(shape)
    kept = [a for a in range(rank) if a not in r.axes]
    n = prod(shape[a] for a in r.axes)
    if n == 0:  # ONNX: the max of no elements is -inf (False), the min +inf (True)
        if call.node.input[0] in call.importer.bools:
            return call.ops.const(np.full(r.out, 1.0 if negate else 0.0))
        return call.ops.const(np.full(r.out, np.inf if negate else -np.inf))
    if negate:
        x = call.ops.apply(tl.NegOp, [x])
    moved = x if kept + r.axes == list(range(rank)) else call.ops.permute(x, perm=kept + r.axes)
    rows = reshape(call.ops, moved, [*(shape[a] for a in kept), n])
    y = call.ops.apply(tl.MaxPoolOp, [rows], {"kernel": [n], "stride": [n], "padding": [0]})
    if negate:
        y = call.ops.apply(tl.NegOp, [y])
    return reshape(call.ops, y, r.out)


CONSTANT_ATTRIBUTES = ["value", "value_float", "value_floats", "value_int", "value_ints"]


@on("Constant", attributes=CONSTANT_ATTRIBUTES)
def _constant(call: NodeCall) -> np.ndarray:
    (attribute,) = call.node.attribute
    value = helper.get_attribute_value(attribute)
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


# --------------------------------------------------------------------------------------------
# Ops of real models written with tl ops: Pow's exponent, Mean, Tile, normalisations,
# transposed convolutions, Pad
# --------------------------------------------------------------------------------------------


@on("Pow")
def _pow(call: NodeCall) -> SSAValue:
    """Pow's exponent is an input. A constant holding one number is tl's `pow` (x broadcast to
    the exponent's shape where that is larger); any other exponent (a constant of several
    values, or a computed tensor) is `pow_elem` of the two broadcast together."""
    exponent = call.input(1)
    if isinstance(exponent, np.ndarray) and np.unique(exponent).size == 1:
        x = call.tensor(0)
        target = np.broadcast_shapes(call.shape(x), exponent.shape)
        value = float(exponent.reshape(-1)[0])
        return call.ops.apply(tl.PowOp, [broadcast_to(call.ops, x, target)], {"exponent": value})
    return elementwise(call.ops, tl.PowElemOp, [call.tensor(0), call.tensor(1)])


@on("PRelu")
def _prelu(call: NodeCall) -> SSAValue:
    """The slope broadcasts to x (from opset 7 unidirectionally, by numpy's rule); a 1-D slope
    that does not but has one entry per channel of axis 1 is opset 6's per-channel slope, which
    the version converter passes on unchanged."""
    x, slope = call.tensor(0), call.tensor(1)
    shape, given = call.shape(x), call.shape(slope)
    try:
        np.broadcast_shapes(shape, given)
    except ValueError:
        if len(given) != 1 or len(shape) < 2 or given[0] != shape[1]:
            raise call.refuse(
                f"slope shape {fmt_shape(given)} neither broadcasts to {fmt_shape(shape)} nor "
                "has one entry per channel"
            ) from None
        slope = reshape(call.ops, slope, (given[0],) + (1,) * (len(shape) - 2))
    return call.ops.apply(tl.PreluOp, [x, broadcast_to(call.ops, slope, shape)])


@on("Greater")
def _greater(call: NodeCall) -> SSAValue:
    """a > b is less(b, a) (both 0 where either is NaN)."""
    a, b = call.inputs()
    return elementwise(call.ops, tl.LessOp, [b, a])


@on("Div")
def _div(call: NodeCall) -> Value:
    """`div`; on integers ONNX truncates the quotient toward zero: trunc(a / b), exact while
    |a| < 2^53 (2^24 in float32), which `Traced.check_values` checks: where a / b is no
    integer it is at least 1/|b| from the next one toward which rounding could carry it, more
    than half an ulp of a / b, and k = trunc(a / b) is itself a float, so rounding stays in
    [k, k + 1)."""
    y = _elementwise(call, tl.DivOp)
    kind = call.importer.types.get(call.node.output[0])
    if kind in EXACT_TYPES and kind != TensorProto.FLOAT16 and isinstance(y, SSAValue):
        return call.ops.apply(tl.TruncOp, [y])
    return y


@on("Floor", "Ceil")
def _floor_ceil(call: NodeCall) -> SSAValue:
    """floor(x) = trunc(x) - (x < trunc(x)), ceil(x) = trunc(x) + (trunc(x) < x): exact (the
    step is 0 or 1, and NaN and ±inf stay: they are their own truncations)."""
    x = call.tensor(0)
    t = call.ops.apply(tl.TruncOp, [x])
    if call.node.op_type == "Floor":
        return call.ops.sub(t, call.ops.apply(tl.LessOp, [x, t]))
    return call.ops.add(t, call.ops.apply(tl.LessOp, [t, x]))


@on("Where")
def _where(call: NodeCall) -> SSAValue:
    """The condition (booleans as 0 and 1) and both values broadcast together."""
    return call.ops.apply(tl.WhereOp, broadcast_all(call.ops, call.inputs()))


@on("Mean")
def _mean(call: NodeCall) -> Value:
    """Variadic Mean: the broadcast sum left to right, divided by the number of inputs."""
    total = _elementwise(call, tl.AddOp)
    count = len(call.inputs())
    return total if count == 1 else elementwise(call.ops, tl.DivOp, [total, np.float64(count)])


@on("Einsum", attributes=["equation"])
def _einsum(call: NodeCall) -> SSAValue:
    """`tlc.frontends.import_common.einsum`: NumPy's equation, `...` included."""
    return einsum(call.ops, call.attr("equation"), call.inputs(), call.refuse)


@on("InstanceNormalization", attributes=["epsilon"])
def _instance_norm(call: NodeCall) -> SSAValue:
    x = call.tensor(0)
    channels = call.shape(x)[1]
    scale, bias = call.const(1, "scale"), call.const(2, "B")
    eps = float(call.attr("epsilon", np.float32(1e-5)))  # ONNX's float32 default
    return channel_norm(call.ops, x, channels, scale, bias, eps)


@on("GroupNormalization", attributes=["epsilon", "num_groups", "stash_type"])
def _group_norm(call: NodeCall) -> SSAValue:
    """Opset 21's per-channel scale and bias (opset 18's per-group ones are converted first)."""
    x = call.tensor(0)
    channels, groups = call.shape(x)[1], int(call.attr("num_groups"))
    if groups == 0 or channels % groups:
        raise call.refuse(f"num_groups={groups} does not divide the {channels} channels")
    scale, bias = call.const(1, "scale"), call.const(2, "bias")
    if scale.size != channels or bias.size != channels:
        raise call.refuse(f"scale and bias must have one entry per channel ({channels})")
    eps = float(call.attr("epsilon", np.float32(1e-5)))
    return channel_norm(call.ops, x, groups, scale, bias, eps)


CONV_TRANSPOSE_ATTRIBUTES = [
    "auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
    "strides",
]  # fmt: skip


@on("ConvTranspose", attributes=CONV_TRANSPOSE_ATTRIBUTES)
def _conv_transpose(call: NodeCall) -> SSAValue:
    """Written as the convolution it transposes (`tlc.frontends.import_common.conv_transpose`).
    The output's padding comes from `pads`, or from `output_shape` / `auto_pad` as ONNX states:
    total = s (n - 1) + output_padding + d (k - 1) + 1 - output extent, the smaller half before
    for SAME_UPPER, after otherwise (ONNX's rule, which ONNX Runtime follows)."""
    c = _conv_inputs(call)
    x, weight, bias, kernel, stride, dilation = (
        c.x,
        c.weight,
        c.bias,
        c.kernel,
        c.stride,
        c.dilation,
    )
    rank = len(kernel)
    extra = ints(call.attr("output_padding", [0] * rank))
    groups = int(call.attr("group", 1))
    spatial = call.shape(x)[2:]
    auto = call.attr("auto_pad", "NOTSET")
    wanted = call.attr("output_shape", None)
    if wanted is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [n * s for n, s in zip(spatial, stride, strict=True)]
    if wanted is not None:
        wanted = ints(wanted)[-rank:]
        geometry = zip(stride, spatial, extra, dilation, kernel, strict=True)
        full = [s * (n - 1) + e + d * (k - 1) + 1 for s, n, e, d, k in geometry]
        total = [f - w for f, w in zip(full, wanted, strict=True)]
        small = [t // 2 for t in total]
        large = [t - t // 2 for t in total]
        lo, hi = (small, large) if auto == "SAME_UPPER" else (large, small)
    elif auto in ("NOTSET", "VALID"):
        pads = ints(call.attr("pads", [0] * (2 * rank))) if auto == "NOTSET" else [0] * (2 * rank)
        lo, hi = pads[:rank], pads[rank:]
    else:
        raise call.refuse(f"auto_pad='{auto}'")
    hi = [h - e for h, e in zip(hi, extra, strict=True)]
    return conv_transpose(
        call.ops, x, weight, bias, stride=stride, lo=lo, hi=hi, dilation=dilation, groups=groups
    )


@on("Pad", attributes=["mode", "pads", "value"])
def _pad(call: NodeCall) -> SSAValue:
    """Pad-2's attribute form (opset < 11: `pads`, `value`) and Pad-11's inputs (pads, the
    constant value, from opset 18 the axes), all constants; every mode, negative pads crop
    (`pad_or_crop`; reflect only with pads >= 0)."""
    x = call.tensor(0)
    rank = len(call.shape(x))
    mode = call.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise call.refuse(f"mode='{mode}' (tl pads constant, reflect, edge or wrap)")
    if call.opset < 11:
        pads, value = ints(call.attr("pads")), float(call.attr("value", 0.0))
    else:
        pads = ints(call.const(1, "pads").reshape(-1))
        given = call.const(2, "constant_value", None)
        value = 0.0 if given is None or given.size == 0 else float(given.reshape(-1)[0])
        axes = call.const(3, "axes", None)
        if axes is not None:
            chosen = [norm_axis(a, rank) for a in ints(axes.reshape(-1))]
            if len(pads) != 2 * len(chosen):
                raise call.refuse(
                    f"{len(pads)} pads for {len(chosen)} axes (expected {2 * len(chosen)})"
                )
            full = [0] * (2 * rank)
            for i, a in enumerate(chosen):
                full[a], full[rank + a] = pads[i], pads[len(chosen) + i]
            pads = full
    if len(pads) != 2 * rank:
        raise call.refuse(f"{len(pads)} pads for an input of rank {rank} (expected {2 * rank})")
    if mode == "reflect" and any(p < 0 for p in pads):
        raise call.refuse("negative pads (cropping) with mode='reflect'")
    return pad_or_crop(call.ops, x, pads[:rank], pads[rank:], mode, value)


# --------------------------------------------------------------------------------------------
# Every other op type: the op kind whose ONNX spelling it is
# --------------------------------------------------------------------------------------------


def _spelled(call: NodeCall, op: type[tl.NodeOp], spelling: OnnxSpelling) -> Value:
    """A node of the op kind spelled `spelling`: its attributes set the mapped metadata fields,
    its inputs are the parents; an elementwise binary op broadcasts them as ONNX does.

    An absent attribute takes ONNX's default, which is the field's default; ONNX stores float
    attributes, defaults included, as float32, so an absent float is the float32 nearest the
    field's default (LeakyRelu's alpha is float32(0.01) in ONNX Runtime and the reference
    evaluator alike), as a given one is the float32 the model holds."""
    if issubclass(op, BinaryOp):
        return _elementwise(call, op)
    kinds = {f.name: f for f in op.FIELDS}
    fields = {}
    for attribute, name in spelling.attributes.items():
        value = call.attr(attribute, None)
        field = kinds[name]
        if value is None and field.kind is Kind.FLOAT and not callable(field.default):
            value = float(np.float32(field.default))
        if value is not None:
            fields[name] = value
    tensors = [lift(call.ops, value) for value in call.inputs()]
    return call.ops.apply(op, tensors, fields)


def _derive_rules(op_kinds: Sequence[type[tl.NodeOp]]) -> list[str]:
    """Give every op type spelled by one of `op_kinds` and without an explicit rule the rule
    `_spelled`, understanding exactly the spelling's attributes. Returns the op types added."""
    added = []
    for op in op_kinds:
        spelling = op.ONNX
        if spelling is None or spelling.op_type in RULES:
            continue
        rule = functools.partial(_spelled, op=op, spelling=spelling)
        RULES[spelling.op_type] = Entry(rule, frozenset(spelling.attributes))
        added.append(spelling.op_type)
    return added


#: The op types imported by their op kind's spelling (the rest of `RULES` is explicit).
DERIVED = frozenset(_derive_rules(NODE_OPS))


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


class OnnxImporter:
    def __init__(self, model: onnx.ModelProto, builder: GraphBuilder, opset: int):
        self.model = model
        self.builder = builder
        self.opset = opset
        self.env: dict[str, Value] = {}
        #: Linear nodes made from a MatMul without bias, by value -> the ONNX value name.
        self.bias_free: dict[SSAValue, str] = {}
        #: Integer values a rule reads as indices, with the range ONNX allows them.
        self.within: list[SourceValue] = []
        self.uses = Counter(
            name for node in model.graph.node for name in node.input if name
        ) + Counter(o.name for o in model.graph.output)
        self.inferred, self.types = _inferred_shapes(model)
        self.types.update((i.name, i.type.tensor_type.elem_type) for i in model.graph.input)
        self.bools = frozenset(n for n, t in self.types.items() if t == TensorProto.BOOL)

    def describe(self, node: onnx.NodeProto, index: int) -> str:
        name = f"node '{node.name}'" if node.name else f"node #{index}"
        return f"{name} ({node.op_type})"

    def fuse_bias(self, call: NodeCall, a: Value, b: Value) -> SSAValue | None:
        """Add(MatMul(x, W), c) with c a constant vector over the output features: the
        linear's bias (exact: linear computes x W^T, then adds b)."""
        for lin, c in ((a, b), (b, a)):
            name = self.bias_free.get(lin) if isinstance(lin, SSAValue) else None
            if name is None or self.uses[name] != 1 or not isinstance(c, np.ndarray):
                continue
            shape = self.builder.shape_of(lin)
            if c.size == shape[-1] and np.broadcast_shapes(c.shape, shape) == shape:
                owner = lin.owner
                assert isinstance(owner, tl.LinearOp)
                self.builder.payload.records[owner.id]["bias"] = np.asarray(c, np.float64).reshape(
                    -1
                )
                del self.bias_free[lin]
                return lin
        return None

    def translate(self, node: onnx.NodeProto, index: int) -> None:
        call = NodeCall(self, node, index)
        if node.domain not in ("", "ai.onnx"):
            raise call.refuse(f"unsupported domain '{node.domain}'")
        entry = RULES.get(node.op_type)
        if entry is None:
            raise import_error(PREFIX, f"{self.describe(node, index)}: unsupported op type")
        for attribute in node.attribute:
            if attribute.name not in entry.attributes:
                raise call.refuse(f"unsupported attribute '{attribute.name}'")
        for name in node.input:
            if name and name not in self.env:
                raise call.refuse(
                    f"input '{name}' is not defined by a graph input, an initializer or an "
                    "earlier node"
                )
        for extra in [] if entry.outputs is None else node.output[entry.outputs :]:
            if extra and self.uses[extra]:
                raise call.refuse(f"output '{extra}' is used (only the first is supported)")
        self._check_types(call)
        try:
            result = entry.rule(call)
        except ImportFailure:
            raise
        except DiagnosticError as exc:
            raise call.refuse(str(exc)) from None
        values = result if isinstance(result, list) else [result]
        for name, value in zip(node.output, values, strict=False):
            if name and value is not None:
                self._check(call, name, value)
                try:
                    check_elements(self._shape(value), f"output '{name}'")
                except LimitError as exc:
                    raise call.refuse(str(exc)) from None
                self.env[name] = value

    def _check_types(self, call: NodeCall) -> None:
        """A node computing on integers or float16 must be one whose float64 value is ONNX's
        value of the type (`SELECTING`, and `INTEGER_ARITHMETIC` on integers); an output whose
        type inference does not know takes the type of its first such input."""
        node = call.node
        exact = [
            (f"input '{n}'", self.types[n])
            for n in node.input
            if n
            and self.types.get(n) in EXACT_TYPES
            and (isinstance(self.env[n], SSAValue) or node.op_type in DATA_INPUTS)
        ]
        for n in node.output:
            if n and n not in self.types and exact:
                self.types[n] = exact[0][1]
        exact += [(f"output '{n}'", self.types[n]) for n in node.output
                  if n and self.types.get(n) in EXACT_TYPES]  # fmt: skip
        if not exact:
            return
        what, kind = next(((w, k) for w, k in exact if k == TensorProto.FLOAT16), exact[0])
        name = TensorProto.DataType.Name(kind)
        if kind == TensorProto.FLOAT16 and node.op_type not in SELECTING:
            raise call.refuse(
                f"{what} is FLOAT16: tl computes in float64 and rounds to float16 only at the "
                f"outputs, which is ONNX's float16 {node.op_type} only for ops that select "
                "values (Max, Min, Where, Clip, max pooling, layout ops)"
            )
        if node.op_type not in SELECTING | INTEGER_ARITHMETIC:
            raise call.refuse(
                f"{what} is {name}: tl computes on reals, and its float64 {node.op_type} is not "
                "exact on integers in general (exact on integers: Add, Sub, Mul, Div, Pow and "
                "the ops that select values)"
            )
        if node.op_type not in DATA_INPUTS:
            return
        for n in node.input:
            value = self.env.get(n) if n else None
            if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.size:
                largest = np.abs(value.astype(np.float64)).max()
                if largest >= EXACT_INTEGERS:
                    raise call.refuse(
                        f"input '{n}' holds {int(largest)} in magnitude, beyond 2^53 where "
                        "float64 does not hold every integer"
                    )

    def source_types(self) -> list[SourceValue]:
        """The tl nodes holding integer and float16 values, with their ONNX names and types
        (`Traced.source_types`), and the index ranges rules asked for (`self.within`)."""
        found = []
        for name, value in self.env.items():
            kind = self.types.get(name)
            if isinstance(value, SSAValue) and kind in EXACT_TYPES:
                owner = value.owner
                assert isinstance(owner, tl.NodeOp)
                found.append(SourceValue(owner.id, name, EXACT_TYPES[kind].name))
        return found + self.within

    def _check(self, call: NodeCall, name: str, value: Value) -> None:
        expected = self.inferred.get(name)
        ours = self._shape(value)
        if expected is not None and tuple(ours) != expected:
            raise call.refuse(
                f"tl shape {fmt_shape(ours)} differs from ONNX's inferred shape "
                f"{fmt_shape(expected)}"
            )

    def _shape(self, value: Value) -> Shape:
        return value.shape if isinstance(value, np.ndarray) else self.builder.shape_of(value)


def _inferred_shapes(model: onnx.ModelProto) -> tuple[dict[str, Shape], dict[str, int]]:
    """Static shapes ONNX's shape inference knows, by value name; and the element types it
    knows (BOOL values, which tl holds as 0 and 1, only an empty reduction tells apart;
    integers and float16, see `OnnxImporter._check_types`)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is only a cross-check; a model it rejects is checked by us
        return {}, {}
    shapes = {}
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    for info in infos[len(inferred.graph.input) :]:
        shape = _static_shape(info)
        if shape is not None:
            shapes[info.name] = shape
    types = {i.name: i.type.tensor_type.elem_type for i in infos if i.type.tensor_type.elem_type}
    return shapes, types


def _static_shape(info: onnx.ValueInfoProto) -> Shape | None:
    t = info.type.tensor_type
    if not t.HasField("shape") or not all(d.HasField("dim_value") for d in t.shape.dim):
        return None
    return tuple(d.dim_value for d in t.shape.dim)


def _input_shape(info: onnx.ValueInfoProto, given: Shape | None) -> Shape:
    t = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        raise import_error(PREFIX, f"input '{info.name}' is not a tensor")
    if t.elem_type not in {*REAL_TYPES, *EXACT_TYPES, TensorProto.BOOL}:
        known = t.elem_type in TensorProto.DataType.values()
        kind = TensorProto.DataType.Name(t.elem_type) if known else f"#{t.elem_type} (unknown)"
        raise import_error(
            PREFIX,
            f"input '{info.name}' has element type {kind} (tl graph inputs are FLOAT/DOUBLE, "
            "BOOL as 0 and 1, or integers and FLOAT16 held as reals)",
        )
    shape = tuple(given) if given is not None else _static_shape(info)
    if shape is None:
        raise import_error(
            PREFIX,
            f"input '{info.name}' has a symbolic or unknown shape "
            f"{_dims(info)}; give its static shape (tlc-translate --input-shape, "
            "tlc.from_onnx(..., input_shapes=[...]))",
        )
    try:
        check_elements(shape, f"input '{info.name}'")
    except LimitError as exc:
        raise import_error(PREFIX, str(exc)) from None
    return shape


def symbolic_batch(model: onnx.ModelProto) -> list[Shape] | None:
    """The input shapes with `N` for a model whose inputs have a symbolic leading dimension
    (one `dim_param` name shared by all such inputs, or none) and static other dimensions; None
    when every input is static or some other dimension is symbolic (then refused as before)."""
    shapes, params = [], set()
    for info in graph_inputs(model):
        t = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not t.HasField("shape"):
            return None
        dims = list(t.shape.dim)
        if not dims or not all(d.HasField("dim_value") for d in dims[1:]):
            return None
        lead = dims[0]
        if not lead.HasField("dim_value"):
            params.add(lead.dim_param)
        shape = (lead.dim_value if lead.HasField("dim_value") else BATCH,)
        shapes.append(shape + tuple(d.dim_value for d in dims[1:]))
    return shapes if len(params) == 1 else None


def _dims(info: onnx.ValueInfoProto) -> str:
    t = info.type.tensor_type
    if not t.HasField("shape"):
        return "(none stored)"
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
            for d in t.shape.dim]  # fmt: skip
    return f"[{', '.join(dims)}]"


def _graph_name(model: onnx.ModelProto) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", model.graph.name or "main")
    return name if re.match(r"[A-Za-z_]", name) else f"g_{name}"


#: Data types whose raw data packs two elements per byte (INT4, UINT4, FLOAT4E2M1).
PACKED_4BIT = frozenset({21, 22, 23})


def _check_model(model: onnx.ModelProto) -> None:
    """ONNX's own checker on every initializer first: data not matching its dims and unknown
    data types are its diagnostics rather than exceptions in numpy_helper. (Not `check_model`:
    it also demands declared output types that exporters often leave out and the rules do not
    need. Nodes are checked by their rules, which name the node and op type; undefined inputs
    and cycles by `OnnxImporter.translate`, which sees each node's inputs in order.)"""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for t in model.graph.initializer:
        try:
            check_elements(t.dims, f"initializer '{t.name}'")  # before the checker reads data
        except LimitError as exc:
            raise import_error(PREFIX, str(exc)) from None
        try:
            onnx.checker.check_tensor(t, ctx)
        except Exception as exc:  # ValidationError, and the checker's other failures
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise import_error(
                PREFIX, f"initializer '{t.name}': not valid ONNX: {reason}"
            ) from None
        try:  # the checker passes a data type it does not know when the data is raw bytes
            itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except KeyError:
            raise import_error(
                PREFIX, f"initializer '{t.name}': not valid ONNX: unknown data type {t.data_type}"
            ) from None
        # ... nor raw data of another size than its dims (4-bit types pack two per byte)
        count = prod(t.dims)
        size = (count + 1) // 2 if t.data_type in PACKED_4BIT else count * itemsize
        external = t.data_location == TensorProto.EXTERNAL
        if t.HasField("raw_data") and not external and len(t.raw_data) != size:
            raise import_error(
                PREFIX,
                f"initializer '{t.name}': not valid ONNX: {len(t.raw_data)} bytes of raw data "
                f"for dims {fmt_shape(tuple(t.dims))}, which take {size}",
            )


def _real(name: str, value: np.ndarray) -> np.ndarray:
    """An initializer's value (checked by `_check_model`), which must hold real numbers."""
    if value.dtype.kind not in "biuf":
        raise import_error(
            PREFIX,
            f"initializer '{name}' holds {value.dtype} data of shape {fmt_shape(value.shape)}, "
            "expected real numbers",
        )
    return value


def _named(initializers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each initializer marked with its name, so a payload field that is one is bound by it
    (`tl.params`); characters a .tlir parameter name cannot hold become `_`, and a name that
    collides after that stays unbound."""
    taken: set[str] = set()
    out = {}
    for name, value in initializers.items():
        spelled = re.sub(r"[^A-Za-z0-9_.]", "_", name)
        spelled = spelled if re.match(r"[A-Za-z_]", spelled) else f"_{spelled}"
        out[name] = value if spelled in taken else named(value, spelled)
        taken.add(spelled)
    return out


def load_model(source: str | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The model and the name diagnostics use for it."""
    if isinstance(source, onnx.ModelProto):
        return source, "<onnx model>"
    try:
        return onnx.load(source), str(source)
    except Exception as exc:  # OSError, protobuf's DecodeError, onnx's own errors
        raise DiagnosticError.simple(f"cannot read ONNX model '{source}': {exc}") from None


def from_onnx(
    source: str | onnx.ModelProto,
    input_shapes: Sequence[Shape] | None = None,
    name: str | None = None,
) -> Traced:
    """Import an ONNX model (a path or a `ModelProto`): a `Traced` (module, graph, payload).
    Without `input_shapes`, inputs whose leading dimension is symbolic (`batch_size` and its
    other dimensions static) share the batch extent `N` (see `symbolic_batch`). A model with
    several outputs is one graph per output (`_several_outputs`); integer and float16 values
    are recorded in `Traced.source_types` (see `OnnxImporter._check_types`)."""
    model, where = load_model(source)
    check_strings(model, where)  # before anything reads a name
    if len(model.graph.output) > 1:
        return _several_outputs(model, input_shapes, name)
    if input_shapes is None:
        batched = symbolic_batch(model)
        if batched is not None:
            return generalise_batch(
                lambda n: from_onnx(model, [concrete(s, n) for s in batched], name),
                lambda reason: import_error(
                    PREFIX,
                    f"the model's symbolic batch dimension does not stay the batch: {reason}; "
                    "give static input shapes (tlc-translate --input-shape, "
                    "tlc.from_onnx(..., input_shapes=[...]))",
                ),
            )
    _check_model(model)  # initializers valid and within the budget before anything reads them
    prepared = prepare(model, where, MIN_OPSET, input_shapes)
    model = prepared.model  # large initializers are stubs: their values are in `initializers`
    opset = opset_of(model)
    graph = model.graph
    initializers = {name: _real(name, v) for name, v in prepared.initializers().items()}
    inputs = [i for i in graph.input if i.name not in initializers]
    if input_shapes is not None and len(input_shapes) != len(inputs):
        raise import_error(
            PREFIX, f"{len(input_shapes)} input shapes given for {len(inputs)} inputs"
        )
    shapes = [
        _input_shape(info, None if input_shapes is None else input_shapes[i])
        for i, info in enumerate(inputs)
    ]
    gap = unsupported_report(model, {op: e.attributes for op, e in RULES.items()}, where)
    if gap is not None:
        raise gap
    if not graph.output:
        raise import_error(PREFIX, "the graph has no outputs")
    builder, values = new_builder(name or _graph_name(model), shapes, Location(where, 1, 1))
    importer = OnnxImporter(model, builder, opset)
    importer.env.update(_named(initializers))
    importer.env.update(zip((i.name for i in inputs), values, strict=True))
    for index, node in enumerate(graph.node):
        importer.translate(node, index)
    result = importer.env.get(graph.output[0].name)
    if result is None:
        raise import_error(PREFIX, f"the graph output '{graph.output[0].name}' is not defined")
    traced = finish(builder, lift(builder, result))
    traced.source_types = importer.source_types()
    return traced


def _several_outputs(
    model: onnx.ModelProto, input_shapes: Sequence[Shape] | None, name: str | None
) -> Traced:
    """A model with several outputs: one tl graph per output (tl graphs have one), each
    importing the nodes its output needs and taking every graph input, named after its output
    (`@<name>_<output>` with `name`); the module holds them with their inline payloads, and the
    `Traced`'s own graph and payload are the first output's (`per_output`: each output's)."""
    names: list[str] = []
    parts = []
    for output in model.graph.output:
        single = onnx.ModelProto()
        single.CopyFrom(model)
        del single.graph.output[:]
        single.graph.output.append(output)
        needed = _needed_nodes(single.graph)
        del single.graph.node[:]
        single.graph.node.extend(needed)
        spelled = _graph_name_of(f"{name}_{output.name}" if name else output.name, names)
        names.append(spelled)
        parts.append(from_onnx(single, input_shapes, spelled))
    ops = [op.clone() for part in parts for op in part.document().ops]
    module = ModuleOp(ops)
    graphs = [op for op in ops if isinstance(op, tl.GraphOp)]
    first = parts[0]
    return Traced(module, graphs[0], first.payload, first.source_types, parts)


def _needed_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes the graph's outputs depend on, in their order."""
    wanted = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if wanted.intersection(node.output):
            kept.append(node)
            wanted.update(node.input)
    return kept[::-1]


def _graph_name_of(text: str, taken: list[str]) -> str:
    """`text` as a graph name (characters a name cannot hold become `_`), unique among `taken`."""
    spelled = re.sub(r"[^A-Za-z0-9_]", "_", text)
    spelled = spelled if re.match(r"[A-Za-z_]", spelled) else f"out_{spelled}"
    unique, k = spelled, 1
    while unique in taken:
        unique, k = f"{spelled}_{k}", k + 1
    return unique


__all__ = ["DERIVED", "RULES", "from_onnx", "load_model"]
