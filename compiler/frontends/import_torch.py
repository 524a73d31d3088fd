"""PyTorch import: a module traced by torch.fx becomes a tl graph plus its payload.

`from_torch(module, example_input)` traces the module with `ConcreteTracer` (torch.fx's tracer
whose proxies also carry their value on the example, so code branching on shapes runs as on the
example), records each node's shape on the example, then maps every FX node through `RULES`, one
table keyed by the node's target: the submodule's class for `call_module` (`nn.Linear`), the
function for `call_function` (`torch.relu`, `operator.add`), the method name for `call_method`
(`"sum"`).
Parameters go to the payload keyed by node id, in PyTorch's layouts (`[out, in]`).

The table is keyed by the source's vocabulary (several targets make one tl op, some make none,
some make several), so it is a dict rather than a rule table by op kind. Every target an op
kind's `TORCH` spelling names is imported from that spelling (`DERIVED`, `_spelled`); explicit
rules remain where PyTorch's form is not one tl op: layers whose parameters become the payload
(Linear, Conv, BatchNorm, LayerNorm), softplus (tl has no beta/threshold), add/sub's `alpha`
and the in-place operators, softmax's dim, reductions, layouts, pooling, and sizes.

A target without a rule, or a rule meeting an argument it cannot translate exactly, is an error
naming the FX node and its target (`PyTorch graph import: unsupported target ...`); the importer
never returns a graph that computes something else. As a second guard every node's tl shape is
compared with the shape PyTorch produced on the example.

Several placeholders become several input nodes (ids 0, 1, ... in placeholder order), which the
reference denotation runs with one array per input. The example's batch dimension stays in the
graph: a model traced on [N, C, H, W] gives convolutions with `channel_axis = 1`.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import inspect
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location
from tlc.core.payload import named
from tlc.dialect import ops as tl
from tlc.dialect.families import BinaryOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.frontends.import_common import (
    ImportFailure,
    Resampling,
    adaptive_pool,
    broadcast_all,
    broadcast_to,
    ceil_mode_extra,
    channel_norm,
    conv_transpose,
    cubic_kernel,
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
from tlc.semantics.program import GraphBuilder, Traced

PREFIX = "PyTorch graph import"

_REQUIRED = object()


@dataclass(frozen=True)
class Constant:
    """A tensor the module holds (a `get_attr` node): a `const` node once used as a value.
    `dtype` is the tensor's own (an index buffer is int64, a mask bool)."""

    value: np.ndarray
    dtype: torch.dtype = torch.float64
    #: Its name in the module (`layers.0.self_attn.in_proj_weight`).
    name: str = ""


@dataclass
class Call:
    """One FX node being translated: its arguments, resolved to graph values and Python data."""

    importer: TorchImporter
    node: fx.Node
    module: nn.Module | None

    @property
    def ops(self) -> GraphBuilder:
        return self.importer.builder

    @property
    def out_shape(self) -> Shape:
        """The shape PyTorch produced for this node on the example input."""
        return self.importer.traced_shape(self.node)

    def arg(self, index: int, name: str, default: Any = _REQUIRED) -> Any:
        if index < len(self.node.args):
            raw = self.node.args[index]
        elif name in self.node.kwargs:
            raw = self.node.kwargs[name]
        elif default is _REQUIRED:
            raise self.refuse(f"missing argument '{name}'")
        else:
            return default
        return self.importer.resolve(raw)

    def rest(self, index: int, name: str) -> Any:
        """Varargs or one sequence (`x.permute(0, 2, 1)` or `x.permute((0, 2, 1))`)."""
        if len(self.node.args) > index + 1:
            return [self.importer.resolve(a) for a in self.node.args[index:]]
        value = self.arg(index, name)
        return list(value) if isinstance(value, list | tuple) else [value]

    def tensor(self, index: int, name: str = "input") -> SSAValue:
        return self.value(self.arg(index, name))

    def value(self, raw: Any) -> SSAValue:
        if isinstance(raw, Constant):
            return self.importer.constant_node(raw)
        if isinstance(raw, SSAValue):
            return raw
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return lift(self.ops, raw)
        raise self.refuse(f"expected a tensor, got {type(raw).__name__}")

    def constant(self, index: int, name: str, default: Any = _REQUIRED) -> np.ndarray | None:
        """A tensor argument that must be a parameter or buffer of the module (or None)."""
        raw = self.arg(index, name, default)
        if raw is None:
            return None
        if not isinstance(raw, Constant):
            raise self.refuse(f"argument '{name}' must be a parameter or buffer of the module")
        return named(raw.value, raw.name)

    def param(self, attribute: str) -> np.ndarray | None:
        """The called module's parameter or buffer `attribute` (None where it has none), named
        as in the model's state_dict (`fc1.weight`)."""
        assert self.module is not None
        value = _param(getattr(self.module, attribute))
        return None if value is None else named(value, f"{self.node.target}.{attribute}")

    def refuse(self, message: str) -> ImportFailure:
        return import_error(
            PREFIX,
            f"FX node '{self.node.name}' ({self.importer.target_text(self.node)}): {message}",
        )


Rule = Callable[..., Any]

#: FX target (module class, function, or method name) -> rule(call, **bound) -> value.
RULES: dict[Any, Rule] = {}


def on(*targets: Any, **bound: Any) -> Callable[[Rule], Rule]:
    """Register `rule` for each of `targets`, with `bound` keyword arguments fixed."""

    def add(rule: Rule) -> Rule:
        for target in targets:
            assert target not in RULES, f"two rules for {target}"
            RULES[target] = functools.partial(rule, **bound) if bound else rule
        return rule

    return add


def _param(tensor: torch.Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.detach().cpu().double().numpy()


def _tuple(value: Any, rank: int) -> list[int]:
    return ints(value) if isinstance(value, Sequence) else [int(value)] * rank


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------


def _softplus_of(call: Call, beta: float, threshold: float) -> SSAValue:
    # PyTorch returns x itself where beta * x > threshold; tl's softplus is log(1 + e^x)
    # everywhere, which differs from x by log1p(e^-20) < 2.1e-9 at the default threshold.
    if beta != 1 or threshold != 20:
        raise call.refuse(f"softplus with beta={beta}, threshold={threshold} (only 1, 20)")
    return call.ops.softplus(call.tensor(0))


@on(nn.Softplus)
def _softplus_module(call: Call) -> SSAValue:
    return _softplus_of(call, call.module.beta, call.module.threshold)


@on(F.softplus)
def _softplus(call: Call) -> SSAValue:
    return _softplus_of(call, call.arg(1, "beta", 1), call.arg(2, "threshold", 20))


@on(F.hardsigmoid, nn.Hardsigmoid)
def _hardsigmoid(call: Call) -> SSAValue:
    """PyTorch's hardsigmoid is relu6(x + 3) / 6: tl's with alpha = 1/6, beta = 1/2."""
    _check_arguments(call, 1, ())
    return call.ops.apply(tl.HardSigmoidOp, [call.tensor(0)], {"alpha": 1 / 6, "beta": 0.5})


def _clip_of(call: Call, low: Any, high: Any) -> SSAValue:
    """tl's clip with constant bounds; None (no bound) is infinite."""
    fields = {}
    for name, bound in (("min", low), ("max", high)):
        if isinstance(bound, SSAValue | Constant):
            raise call.refuse(f"a tensor {name} bound (tl's clip bounds are numbers)")
        if bound is not None:
            fields[name] = float(bound)
    return call.ops.apply(tl.ClipOp, [call.tensor(0)], fields)


@on(torch.clamp, torch.clip, "clamp", "clip")
def _clamp(call: Call) -> SSAValue:
    _check_arguments(call, 1, ("min", "max"))
    return _clip_of(call, call.arg(1, "min", None), call.arg(2, "max", None))


@on(F.hardtanh)
def _hardtanh(call: Call) -> SSAValue:
    _check_arguments(call, 1, ("min_val", "max_val"))
    return _clip_of(call, call.arg(1, "min_val", -1.0), call.arg(2, "max_val", 1.0))


@on(F.relu6)
def _relu6(call: Call) -> SSAValue:
    _check_arguments(call, 1, ())
    return _clip_of(call, 0.0, 6.0)


@on(nn.Hardtanh, nn.ReLU6)
def _hardtanh_module(call: Call) -> SSAValue:
    return _clip_of(call, call.module.min_val, call.module.max_val)


@on(torch.add, "add", op=tl.AddOp)
@on(torch.sub, "sub", op=tl.SubOp)
def _with_alpha(call: Call, op: type[tl.BinaryOp]) -> Any:
    """`torch.add(x, y, alpha=a)` is x + a y: tl's add where alpha is 1."""
    if call.arg(2, "alpha", 1) != 1:
        raise call.refuse("alpha != 1")
    return _elementwise(call, op)


@on(operator.iadd, op=tl.AddOp)
@on(operator.isub, op=tl.SubOp)
@on(operator.imul, op=tl.MulElemOp)
@on(operator.itruediv, op=tl.DivOp)
def _in_place(call: Call, op: type[tl.BinaryOp]) -> Any:
    """`x += y` traces to `operator.iadd`: the value is x + y (tl graphs are functional)."""
    return _elementwise(call, op)


@on(torch.pow, operator.pow, "pow")
def _pow(call: Call) -> Any:
    """A tensor to a number's power is tl's `pow` (the spelling's rule); a tensor exponent, or
    a number to a tensor power, is `pow_elem` of the two broadcast together; numbers alone are
    arithmetic on sizes."""
    base, exponent = call.arg(0, "input"), call.arg(1, "exponent")
    tensors = [isinstance(v, SSAValue | Constant) for v in (base, exponent)]
    if tensors == [True, False]:
        return _spelled(call, tl.PowOp)
    if not any(tensors):
        return call.node.target(base, exponent)
    return elementwise(call.ops, tl.PowElemOp, [call.value(base), call.value(exponent)])


def _elementwise(call: Call, op: type[tl.BinaryOp]) -> Any:
    """A binary op on its two operands (PyTorch broadcasts them; a number is a constant). Where
    neither is a tensor the call is arithmetic on sizes (`x.size(0) * 2`), which the graph does
    not compute: its value is the function's own."""
    a, b = call.arg(0, "input"), call.arg(1, "other")
    if not isinstance(a, SSAValue | Constant) and not isinstance(b, SSAValue | Constant):
        if call.node.op != "call_function":
            raise call.refuse(f"expected a tensor, got {type(a).__name__}")
        return call.node.target(a, b)
    return elementwise(call.ops, op, [call.value(a), call.value(b)])


# --------------------------------------------------------------------------------------------
# Parameterised layers
# --------------------------------------------------------------------------------------------


@on(nn.Linear)
def _linear_module(call: Call) -> SSAValue:
    return call.ops.linear(call.tensor(0), call.param("weight"), call.param("bias"))


@on(F.linear)
def _linear(call: Call) -> SSAValue:
    weight, bias = call.constant(1, "weight"), call.constant(2, "bias", None)
    return call.ops.linear(call.tensor(0), weight, bias)


def _conv_of(
    call: Call, weight: np.ndarray, bias: np.ndarray | None, stride: Any, padding: Any,
    dilation: Any, groups: int,
) -> SSAValue:  # fmt: skip
    x = call.tensor(0)
    rank = weight.ndim - 2
    dilation = _tuple(dilation, rank)
    if padding == "valid":
        lo = hi = [0] * rank
    elif padding == "same":  # PyTorch puts the odd extra pad after (F.pad right/bottom)
        total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:], strict=True)]
        lo, hi = [t // 2 for t in total], [t - t // 2 for t in total]
    else:
        lo = hi = _tuple(padding, rank)
    return call.ops.conv(
        x, weight, bias, stride=_tuple(stride, rank), padding=lo, padding_after=hi,
        dilation=dilation, groups=int(groups), channel_axis=len(call.ops.shape_of(x)) - 1 - rank,
    )  # fmt: skip


def _zeros_padded(call: Call) -> nn.Module:
    """The call's convolution module, which must pad with zeros."""
    m = call.module
    if m.padding_mode != "zeros":
        raise call.refuse(f"padding_mode='{m.padding_mode}' (only 'zeros')")
    return m


@on(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv_module(call: Call) -> SSAValue:
    m = _zeros_padded(call)
    return _conv_of(
        call, call.param("weight"), call.param("bias"), m.stride, m.padding, m.dilation, m.groups
    )


@on(F.conv1d, F.conv2d, F.conv3d)
def _conv(call: Call) -> SSAValue:
    weight, bias = call.constant(1, "weight"), call.constant(2, "bias", None)
    return _conv_of(
        call, weight, bias, call.arg(3, "stride", 1), call.arg(4, "padding", 0),
        call.arg(5, "dilation", 1), call.arg(6, "groups", 1),
    )  # fmt: skip


def _batch_norm_of(call: Call, mean: Any, var: Any, gamma: Any, beta: Any, eps: float) -> SSAValue:
    if mean is None or var is None:
        raise call.refuse("batch norm without running statistics uses batch statistics")
    channels = mean.shape[0]
    gamma = np.ones(channels) if gamma is None else gamma
    beta = np.zeros(channels) if beta is None else beta
    return call.ops.batch_norm_eval(
        call.tensor(0), gamma, beta, mean, var, float(eps), channel_axis=1
    )


@on(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def _batch_norm_module(call: Call) -> SSAValue:
    m = call.module
    if m.training:
        raise call.refuse("batch norm in training mode (call .eval() first)")
    return _batch_norm_of(
        call, call.param("running_mean"), call.param("running_var"), call.param("weight"),
        call.param("bias"), m.eps,
    )  # fmt: skip


@on(F.batch_norm)
def _batch_norm(call: Call) -> SSAValue:
    if call.arg(5, "training", False):
        raise call.refuse("batch norm in training mode")
    return _batch_norm_of(
        call, call.constant(1, "running_mean"), call.constant(2, "running_var"),
        call.constant(3, "weight", None), call.constant(4, "bias", None),
        call.arg(7, "eps", 1e-5),
    )  # fmt: skip


def _layernorm_of(
    call: Call, normalized: Sequence[int], gamma: Any, beta: Any, eps: float
) -> SSAValue:
    x = call.tensor(0)
    axis = len(call.ops.shape_of(x)) - len(tuple(normalized))
    return call.ops.layernorm(x, gamma, beta, float(eps), axis=axis)


@on(nn.LayerNorm)
def _layernorm_module(call: Call) -> SSAValue:
    m = call.module
    return _layernorm_of(call, m.normalized_shape, call.param("weight"), call.param("bias"), m.eps)


@on(F.layer_norm)
def _layernorm(call: Call) -> SSAValue:
    return _layernorm_of(
        call, call.arg(1, "normalized_shape"), call.constant(2, "weight", None),
        call.constant(3, "bias", None), call.arg(4, "eps", 1e-5),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Padding, prelu, local response norm, transposed convolutions, group and instance norm
# --------------------------------------------------------------------------------------------

#: PyTorch's pad modes -> tl's (`circular` is a gather: `pad_or_crop`).
PAD_MODES = {
    "constant": "constant",
    "reflect": "reflect",
    "replicate": "edge",
    "circular": "wrap",
}


@on(torch.gt, torch.greater, operator.gt, "gt")
def _greater(call: Call) -> Any:
    """a > b is less(b, a)."""
    _check_arguments(call, 2, ())
    a, b = call.arg(0, "input"), call.arg(1, "other")
    return elementwise(call.ops, tl.LessOp, [call.value(b), call.value(a)])


@on(torch.where)
def _where(call: Call) -> SSAValue:
    """torch.where(condition, a, b) (the one-argument form, nonzero indices, is refused)."""
    if len(call.node.args) + len(call.node.kwargs) != 3:
        raise call.refuse("where without both values (the nonzero-indices form)")
    values = [
        call.value(call.arg(i, name)) for i, name in enumerate(("condition", "input", "other"))
    ]
    return call.ops.apply(tl.WhereOp, broadcast_all(call.ops, values))


def _pad_of(call: Call, widths: Sequence[int], mode: str, value: Any) -> SSAValue:
    """F.pad's `pad` lists (before, after) from the last axis backwards; negative widths crop."""
    x = call.tensor(0)
    rank = len(call.ops.shape_of(x))
    if mode not in PAD_MODES:
        raise call.refuse(f"mode='{mode}' (tl pads constant, reflect, replicate or circular)")
    widths = ints(widths)
    if len(widths) % 2 or len(widths) > 2 * rank:
        raise call.refuse(f"{len(widths)} pad widths for an input of rank {rank}")
    if mode == "reflect" and any(w < 0 for w in widths):
        raise call.refuse("negative pads (cropping) with mode='reflect'")
    before, after = [0] * rank, [0] * rank
    for i in range(len(widths) // 2):
        before[rank - 1 - i], after[rank - 1 - i] = widths[2 * i], widths[2 * i + 1]
    fill = 0.0 if value is None else float(value)
    return pad_or_crop(call.ops, x, before, after, PAD_MODES[mode], fill)


@on(F.pad)
def _pad(call: Call) -> SSAValue:
    _check_arguments(call, 1, ("pad", "mode", "value"))
    mode, value = call.arg(2, "mode", "constant"), call.arg(3, "value", None)
    return _pad_of(call, call.arg(1, "pad"), mode, value)


PAD_MODULES = {
    "constant": (nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d,
                 nn.ConstantPad3d),
    "reflect": (nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d),
    "replicate": (nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d),
    "circular": (nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d),
}  # fmt: skip


def _pad_module(call: Call, mode: str) -> SSAValue:
    return _pad_of(call, call.module.padding, mode, getattr(call.module, "value", None))


for _mode, _modules in PAD_MODULES.items():
    on(*_modules, mode=_mode)(_pad_module)


def _prelu_of(call: Call, weight: np.ndarray) -> SSAValue:
    """PyTorch's slope has one entry, or one per channel of axis 1 (PyTorch checks which):
    broadcast explicitly."""
    x = call.tensor(0)
    shape = call.ops.shape_of(x)
    per_channel = (weight.size,) + (1,) * (len(shape) - 2)
    slope = np.reshape(weight, (1,) if weight.size == 1 else per_channel)
    return call.ops.apply(tl.PreluOp, [x, broadcast_to(call.ops, slope, shape)])


@on(nn.PReLU)
def _prelu_module(call: Call) -> SSAValue:
    return _prelu_of(call, _param(call.module.weight))


@on(F.prelu)
def _prelu(call: Call) -> SSAValue:
    return _prelu_of(call, call.constant(1, "weight"))


def _lrn_of(call: Call, size: int, alpha: float, beta: float, k: float) -> SSAValue:
    if int(size) % 2 == 0:
        raise call.refuse(
            f"size={size}: PyTorch's window for an even size starts one channel before ONNX's, "
            "which tl's lrn has"
        )
    fields = {"size": int(size), "alpha": float(alpha), "beta": float(beta), "k": float(k)}
    return call.ops.apply(tl.LrnOp, [call.tensor(0)], fields)


@on(nn.LocalResponseNorm)
def _lrn_module(call: Call) -> SSAValue:
    m = call.module
    return _lrn_of(call, m.size, m.alpha, m.beta, m.k)


@on(F.local_response_norm)
def _lrn(call: Call) -> SSAValue:
    return _lrn_of(
        call, call.arg(1, "size"), call.arg(2, "alpha", 1e-4), call.arg(3, "beta", 0.75),
        call.arg(4, "k", 1.0),
    )  # fmt: skip


def _conv_transpose_of(
    call: Call, weight: np.ndarray, bias: np.ndarray | None, stride: Any, padding: Any,
    output_padding: Any, groups: int, dilation: Any,
) -> SSAValue:  # fmt: skip
    x = call.tensor(0)
    rank = weight.ndim - 2
    if len(call.ops.shape_of(x)) != rank + 2:
        raise call.refuse("an input without a batch axis")
    stride, dilation = _tuple(stride, rank), _tuple(dilation, rank)
    lo = _tuple(padding, rank)
    hi = [p - e for p, e in zip(lo, _tuple(output_padding, rank), strict=True)]
    return conv_transpose(
        call.ops, x, weight, bias, stride=stride, lo=lo, hi=hi, dilation=dilation,
        groups=int(groups),
    )  # fmt: skip


@on(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _conv_transpose_module(call: Call) -> SSAValue:
    m = _zeros_padded(call)
    if len(call.node.args) > 1 or call.node.kwargs:
        raise call.refuse("an output_size argument")
    return _conv_transpose_of(
        call, _param(m.weight), _param(m.bias), m.stride, m.padding, m.output_padding,
        m.groups, m.dilation,
    )  # fmt: skip


@on(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
def _conv_transpose(call: Call) -> SSAValue:
    weight, bias = call.constant(1, "weight"), call.constant(2, "bias", None)
    return _conv_transpose_of(
        call, weight, bias, call.arg(3, "stride", 1), call.arg(4, "padding", 0),
        call.arg(5, "output_padding", 0), call.arg(6, "groups", 1), call.arg(7, "dilation", 1),
    )  # fmt: skip


@on(nn.GroupNorm)
def _group_norm_module(call: Call) -> SSAValue:
    m = call.module
    return channel_norm(
        call.ops, call.tensor(0), m.num_groups, _param(m.weight), _param(m.bias), m.eps
    )


@on(F.group_norm)
def _group_norm(call: Call) -> SSAValue:
    weight, bias = call.constant(2, "weight", None), call.constant(3, "bias", None)
    groups, eps = int(call.arg(1, "num_groups")), float(call.arg(4, "eps", 1e-5))
    return channel_norm(call.ops, call.tensor(0), groups, weight, bias, eps)


INSTANCE_NORM_RANKS = {nn.InstanceNorm1d: 3, nn.InstanceNorm2d: 4, nn.InstanceNorm3d: 5}


@on(*INSTANCE_NORM_RANKS)
def _instance_norm_module(call: Call) -> SSAValue:
    """Statistics of each sample and channel; a module tracking running statistics uses those
    in eval mode, which is batch norm's evaluation."""
    m = call.module
    x = call.tensor(0)
    shape = call.ops.shape_of(x)
    if len(shape) != INSTANCE_NORM_RANKS[type(m)]:
        raise call.refuse("an input without a batch axis")
    weight, bias = _param(m.weight), _param(m.bias)
    if m.track_running_stats and not m.training:
        return _batch_norm_of(call, _param(m.running_mean), _param(m.running_var), weight, bias,
                              m.eps)  # fmt: skip
    return channel_norm(call.ops, x, shape[1], weight, bias, m.eps)


@on(F.instance_norm)
def _instance_norm(call: Call) -> SSAValue:
    if not call.arg(5, "use_input_stats", True):
        mean, var = call.constant(1, "running_mean"), call.constant(2, "running_var")
        weight, bias = call.constant(3, "weight", None), call.constant(4, "bias", None)
        return _batch_norm_of(call, mean, var, weight, bias, call.arg(7, "eps", 1e-5))
    x = call.tensor(0)
    weight, bias = call.constant(3, "weight", None), call.constant(4, "bias", None)
    eps = float(call.arg(7, "eps", 1e-5))
    return channel_norm(call.ops, x, call.ops.shape_of(x)[1], weight, bias, eps)


# --------------------------------------------------------------------------------------------
# Along an axis
# --------------------------------------------------------------------------------------------


def _softmax_of(call: Call, op: type[tl.NodeOp], dim: Any, dtype: Any) -> SSAValue:
    if dim is None:
        raise call.refuse("softmax without dim")
    if dtype is not None:
        raise call.refuse("dtype argument")
    x = call.tensor(0)
    return call.ops.apply(op, [x], {"axis": norm_axis(dim, len(call.ops.shape_of(x)))})


@on(nn.Softmax, op=tl.SoftmaxOp)
@on(nn.LogSoftmax, op=tl.LogSoftmaxOp)
def _softmax_module(call: Call, op: type[tl.NodeOp]) -> SSAValue:
    return _softmax_of(call, op, call.module.dim, None)


@on(F.softmax, torch.softmax, "softmax", op=tl.SoftmaxOp)
@on(F.log_softmax, torch.log_softmax, "log_softmax", op=tl.LogSoftmaxOp)
def _softmax(call: Call, op: type[tl.NodeOp]) -> SSAValue:
    dtype_index = 3 if call.node.target in (F.softmax, F.log_softmax) else 2
    return _softmax_of(call, op, call.arg(1, "dim", None), call.arg(dtype_index, "dtype", None))


def _reduction(call: Call, op: type[tl.ReductionOp]) -> SSAValue:
    if call.arg(3, "dtype", None) is not None:
        raise call.refuse("dtype argument")
    dim = call.arg(1, "dim", None)
    axes = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return reduce(call.ops, op, call.tensor(0), axes, bool(call.arg(2, "keepdim", False)))


on(torch.sum, "sum", op=tl.ReduceSumOp)(_reduction)
on(torch.mean, "mean", op=tl.ReduceMeanOp)(_reduction)


@on(torch.cat, torch.concat, torch.concatenate)
def _cat(call: Call) -> SSAValue:
    parts = [call.value(t) for t in call.arg(0, "tensors")]
    dim = call.arg(1, "dim", 0)
    if len(parts) == 1:
        return parts[0]
    axis = norm_axis(dim, len(call.ops.shape_of(parts[0])))
    return call.ops.concat(*parts, axis=axis)


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


@on(
    nn.Flatten, nn.Unflatten, torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze,
    "flatten", "reshape", "view", "squeeze", "unsqueeze", torch.unflatten, "unflatten",
)  # fmt: skip
def _reshape(call: Call) -> SSAValue:
    """Row-major reshapes; the target is the shape PyTorch produced on the example."""
    return reshape(call.ops, call.tensor(0), call.out_shape)


@on(nn.Identity, nn.Dropout, "contiguous")
def _identity(call: Call) -> SSAValue:
    if call.module is not None and call.module.training:
        raise call.refuse("dropout in training mode (call .eval() first)")
    return call.tensor(0)


@on(torch.permute, "permute")
def _permute(call: Call) -> SSAValue:
    x = call.tensor(0)
    rank = len(call.ops.shape_of(x))
    return call.ops.permute(x, perm=[norm_axis(d, rank) for d in call.rest(1, "dims")])


@on(torch.transpose, "transpose", torch.swapaxes, "swapaxes", torch.swapdims, "swapdims")
def _transpose(call: Call) -> SSAValue:
    x = call.tensor(0)
    rank = len(call.ops.shape_of(x))
    a, b = norm_axis(call.arg(1, "dim0"), rank), norm_axis(call.arg(2, "dim1"), rank)
    return x if a == b else call.ops.transpose(x, axis1=a, axis2=b)


@on(torch.matmul, operator.matmul, torch.mm, torch.bmm, "matmul", "mm", "bmm")
def _matmul(call: Call) -> SSAValue:
    return matmul(call.ops, call.tensor(0), call.tensor(1, "other"))


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


@dataclass
class Pool:
    kernel: Any
    stride: Any
    padding: Any
    dilation: Any = 1
    ceil_mode: bool = False
    return_indices: bool = False
    count_include_pad: bool = True
    divisor_override: Any = None


def _pool_of(call: Call, op: type[tl.PoolOp], rank: int, p: Pool) -> SSAValue:
    x = call.tensor(0)
    kernel = _tuple(p.kernel, rank)
    stride = kernel if p.stride is None or p.stride == [] else _tuple(p.stride, rank)
    padding = _tuple(p.padding, rank)
    dilation = _tuple(p.dilation, rank)
    if p.return_indices:
        raise call.refuse("return_indices=True")
    if dilation != [1] * rank:  # max pooling only: PyTorch's average pools have no dilation
        spatial = call.ops.shape_of(x)[-rank:]
        span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
        geometry = zip(spatial, padding, span, stride, strict=True)
        extra = [ceil_mode_extra(n, q, q, k, s) if p.ceil_mode else 0 for n, q, k, s in geometry]
        hi = [q + e for q, e in zip(padding, extra, strict=True)]
        return dilated_max_pool(call.ops, x, kernel, stride, dilation, padding, hi)
    if p.divisor_override is not None:
        raise call.refuse("divisor_override")
    spatial = call.ops.shape_of(x)[-rank:]
    geometry = zip(spatial, padding, kernel, stride, strict=True)
    extra = [ceil_mode_extra(n, q, q, k, s) if p.ceil_mode else 0 for n, q, k, s in geometry]
    if op is tl.AvgPoolOp and (any(extra) or (not p.count_include_pad and any(padding))):
        return _average_counted(call, x, kernel, stride, padding, extra, p.count_include_pad)
    if any(extra):
        # pad explicitly with -inf, which never wins a max, so tl's rounding down keeps the
        # partial windows
        hi = [q + e for q, e in zip(padding, extra, strict=True)]
        x = pad(call.ops, x, len(call.ops.shape_of(x)) - rank, padding, hi, -np.inf)
        padding = [0] * rank
    return call.ops.apply(op, [x], {"kernel": kernel, "stride": stride, "padding": padding})


def _average_counted(
    call: Call,
    x: SSAValue,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    extra: list[int],
    counts_pad: bool,
) -> SSAValue:
    """PyTorch's average pool where its divisor is not the window size: ceil_mode's partial
    windows (`extra` past the padding) and count_include_pad=False with padding. The input
    padded explicitly with zeros (the partial windows too), tl's average pool, then times
    prod(kernel) / (the elements PyTorch counts in each window: those of the padded input
    with count_include_pad, else those of the input)."""
    rank = len(kernel)
    spatial = call.ops.shape_of(x)[-rank:]
    hi = [q + e for q, e in zip(padding, extra, strict=True)]
    x = pad(call.ops, x, len(call.ops.shape_of(x)) - rank, padding, hi, 0.0)
    fields = {"kernel": kernel, "stride": stride, "padding": [0] * rank}
    y = call.ops.apply(tl.AvgPoolOp, [x], fields)
    geometry = zip(spatial, padding, extra, kernel, stride, strict=True)
    counts = [
        window_counts(n + 2 * q, 0, e, k, s, 1)
        if counts_pad
        else window_counts(n, q, q + e, k, s, 1)
        for n, q, e, k, s in geometry
    ]
    counted = functools.reduce(np.multiply.outer, counts)
    return elementwise(call.ops, tl.MulElemOp, [y, float(np.prod(kernel)) / counted])


@on(nn.MaxPool1d, op=tl.MaxPoolOp, rank=1)
@on(nn.MaxPool2d, op=tl.MaxPoolOp, rank=2)
@on(nn.AvgPool1d, op=tl.AvgPoolOp, rank=1)
@on(nn.AvgPool2d, op=tl.AvgPoolOp, rank=2)
def _pool_module(call: Call, op: type[tl.PoolOp], rank: int) -> SSAValue:
    m = call.module
    return _pool_of(
        call, op, rank,
        Pool(
            m.kernel_size, m.stride, m.padding, getattr(m, "dilation", 1), m.ceil_mode,
            getattr(m, "return_indices", False), getattr(m, "count_include_pad", True),
            getattr(m, "divisor_override", None),
        ),
    )  # fmt: skip


@on(F.max_pool1d, op=tl.MaxPoolOp, rank=1)
@on(F.max_pool2d, op=tl.MaxPoolOp, rank=2)
def _max_pool(call: Call, op: type[tl.PoolOp], rank: int) -> SSAValue:
    return _pool_of(
        call, op, rank,
        Pool(
            call.arg(1, "kernel_size"), call.arg(2, "stride", None), call.arg(3, "padding", 0),
            call.arg(4, "dilation", 1), call.arg(5, "ceil_mode", False),
            call.arg(6, "return_indices", False),
        ),
    )  # fmt: skip


@on(F.avg_pool1d, op=tl.AvgPoolOp, rank=1)
@on(F.avg_pool2d, op=tl.AvgPoolOp, rank=2)
def _avg_pool(call: Call, op: type[tl.PoolOp], rank: int) -> SSAValue:
    return _pool_of(
        call, op, rank,
        Pool(
            call.arg(1, "kernel_size"), call.arg(2, "stride", None), call.arg(3, "padding", 0),
            ceil_mode=call.arg(4, "ceil_mode", False),
            count_include_pad=call.arg(5, "count_include_pad", True),
            divisor_override=call.arg(6, "divisor_override", None),
        ),
    )  # fmt: skip


def _adaptive_of(call: Call, op: type[tl.PoolOp], rank: int, output_size: Any) -> SSAValue:
    """Adaptive pooling to `output_size` (None keeps an extent): a plain pool where every extent
    divides evenly, PyTorch's variable windows otherwise (`import_common.adaptive_pool`)."""
    if call.module is not None and getattr(call.module, "return_indices", False):
        raise call.refuse("return_indices=True")
    x = call.tensor(0)
    spatial = call.ops.shape_of(x)[-rank:]
    wanted = [
        n if o is None else int(o)
        for n, o in zip(spatial, _tuple_none(output_size, rank), strict=True)
    ]
    return adaptive_pool(call.ops, op, x, wanted)


@on(nn.AdaptiveAvgPool1d, op=tl.AvgPoolOp, rank=1)
@on(nn.AdaptiveAvgPool2d, op=tl.AvgPoolOp, rank=2)
@on(nn.AdaptiveMaxPool1d, op=tl.MaxPoolOp, rank=1)
@on(nn.AdaptiveMaxPool2d, op=tl.MaxPoolOp, rank=2)
def _adaptive_pool_module(call: Call, op: type[tl.PoolOp], rank: int) -> SSAValue:
    return _adaptive_of(call, op, rank, call.module.output_size)


@on(F.adaptive_avg_pool1d, op=tl.AvgPoolOp, rank=1)
@on(F.adaptive_avg_pool2d, op=tl.AvgPoolOp, rank=2)
@on(F.adaptive_max_pool1d, op=tl.MaxPoolOp, rank=1)
@on(F.adaptive_max_pool2d, op=tl.MaxPoolOp, rank=2)
def _adaptive_pool(call: Call, op: type[tl.PoolOp], rank: int) -> SSAValue:
    if call.arg(2, "return_indices", False):
        raise call.refuse("return_indices=True")
    return _adaptive_of(call, op, rank, call.arg(1, "output_size"))


def _tuple_none(value: Any, rank: int) -> list[Any]:
    return list(value) if isinstance(value, Sequence) else [value] * rank


# --------------------------------------------------------------------------------------------
# Indexing, splitting, stacking, repeating: gathers with constant indices, reshapes, broadcasts
# --------------------------------------------------------------------------------------------


def _indices(call: Call, raw: Any) -> np.ndarray:
    """Constant integer indices: a Python int or list, or an integer buffer of the module."""
    if isinstance(raw, Constant):  # (a boolean mask never gets here: its shape is data's)
        if raw.dtype.is_floating_point:
            raise call.refuse(f"indices of type {raw.dtype}")
        return raw.value.astype(np.int64)
    if isinstance(raw, SSAValue):
        raise call.refuse("indices computed by the model (tl's gather indices are constants)")
    if isinstance(raw, bool) or not isinstance(raw, int | list | tuple):
        raise call.refuse(f"indexing with {type(raw).__name__}")
    return np.asarray(raw, dtype=np.int64)


def _axis(call: Call, x: SSAValue, dim: Any) -> int:
    return norm_axis(dim, len(call.ops.shape_of(x)))


@on(operator.getitem)
def _getitem(call: Call) -> Any:
    """`x[...]` with ints, slices, None, `...` and at most one list or integer buffer of indices
    (NumPy's basic indexing and its one-array case): one `gather` per indexed axis. Indexing a
    tuple or list (of sizes, or the pieces of a split) picks the element."""
    container = call.arg(0, "a")
    key = call.arg(1, "b")
    if not isinstance(container, SSAValue | Constant):
        return container[key]
    x = call.value(container)
    key = key if isinstance(key, tuple) else (key,)
    rank = len(call.ops.shape_of(x))
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if key.count(Ellipsis) > 1:
        raise call.refuse("more than one '...'")
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (rank - used) + key[at + 1 :]
    if used > rank:
        raise call.refuse(f"{used} indices for a tensor of rank {rank}")
    if sum(1 for k in key if isinstance(k, list | Constant | SSAValue)) > 1:
        raise call.refuse("more than one index list or tensor (NumPy's advanced indexing)")
    axis = 0
    for k in key:
        shape = call.ops.shape_of(x)
        if k is None:
            x = reshape(call.ops, x, (*shape[:axis], 1, *shape[axis:]))
            axis += 1
        elif isinstance(k, slice):
            x = take(call.ops, x, axis, list(range(*k.indices(shape[axis]))))
            axis += 1
        else:
            index = _indices(call, k)
            x = take(call.ops, x, axis, index)
            axis += index.ndim
    return x


@on(torch.index_select, "index_select")
def _index_select(call: Call) -> SSAValue:
    x = call.tensor(0)
    index = _indices(call, call.arg(2, "index"))
    if index.ndim != 1:
        raise call.refuse("index_select with indices that are not a vector")
    return take(call.ops, x, _axis(call, x, call.arg(1, "dim")), index)


@on(torch.select, "select")
def _select(call: Call) -> SSAValue:
    x = call.tensor(0)
    return take(call.ops, x, _axis(call, x, call.arg(1, "dim")), int(call.arg(2, "index")))


@on(torch.narrow, "narrow")
def _narrow(call: Call) -> SSAValue:
    x = call.tensor(0)
    axis = _axis(call, x, call.arg(1, "dim"))
    start = norm_axis(call.arg(2, "start"), call.ops.shape_of(x)[axis])
    return take(call.ops, x, axis, list(range(start, start + int(call.arg(3, "length")))))


def _pieces(call: Call, x: SSAValue, axis: int, sizes: Sequence[int]) -> list[SSAValue]:
    """Consecutive blocks along `axis`, one `gather` each."""
    starts = np.cumsum([0, *sizes])
    return [
        take(call.ops, x, axis, list(range(starts[i], starts[i + 1]))) for i in range(len(sizes))
    ]


@on(torch.split, "split")
def _split(call: Call) -> list[SSAValue]:
    """Blocks of one size (the last one smaller) or of the given sizes."""
    x = call.tensor(0)
    axis = _axis(call, x, call.arg(2, "dim", 0))
    n = call.ops.shape_of(x)[axis]
    size = call.arg(1, "split_size_or_sections")
    sizes = list(size) if isinstance(size, list | tuple) else [
        min(size, n - start) for start in range(0, n, size)
    ]  # fmt: skip
    if sum(sizes) != n:
        raise call.refuse(f"split sizes {sizes} do not add up to the extent {n}")
    return _pieces(call, x, axis, sizes)


@on(torch.chunk, "chunk")
def _chunk(call: Call) -> list[SSAValue]:
    """PyTorch's chunks: ceil(n / chunks) elements each, the last smaller (and fewer chunks
    than asked where that runs out)."""
    x = call.tensor(0)
    axis = _axis(call, x, call.arg(2, "dim", 0))
    n = call.ops.shape_of(x)[axis]
    block = -(-n // int(call.arg(1, "chunks")))
    return _pieces(call, x, axis, [min(block, n - start) for start in range(0, n, block)])


@on(torch.unbind, "unbind")
def _unbind(call: Call) -> list[SSAValue]:
    x = call.tensor(0)
    axis = _axis(call, x, call.arg(1, "dim", 0))
    return [take(call.ops, x, axis, i) for i in range(call.ops.shape_of(x)[axis])]


@on(torch.stack)
def _stack(call: Call) -> SSAValue:
    """Each tensor reshaped with a new axis of extent 1, then concatenated along it."""
    parts = [call.value(t) for t in call.arg(0, "tensors")]
    shape = call.ops.shape_of(parts[0])
    axis = norm_axis(call.arg(1, "dim", 0), len(shape) + 1)
    parts = [reshape(call.ops, p, (*shape[:axis], 1, *shape[axis:])) for p in parts]
    return parts[0] if len(parts) == 1 else call.ops.concat(*parts, axis=axis)


@on(torch.flip, "flip")
def _flip(call: Call) -> SSAValue:
    x = call.tensor(0)
    for dim in call.rest(1, "dims"):
        axis = _axis(call, x, dim)
        x = take(call.ops, x, axis, list(range(call.ops.shape_of(x)[axis] - 1, -1, -1)))
    return x


@on(torch.roll, "roll")
def _roll(call: Call) -> SSAValue:
    """`torch.roll` by constant shifts: per axis, element i is x[(i - shift) mod n] (a
    `gather`); without dims, the flattened tensor rolled and reshaped back. (PyTorch itself
    refuses, on the example, shifts and dims of different lengths.)"""
    x = call.tensor(0)
    shape = call.ops.shape_of(x)
    shifts, dims = call.arg(1, "shifts"), call.arg(2, "dims", None)
    shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
    if dims is None:
        flat = reshape(call.ops, x, (int(np.prod(shape)),))
        return reshape(call.ops, _rolled(call.ops, flat, 0, sum(shifts)), shape)
    dims = list(dims) if isinstance(dims, list | tuple) else [dims]
    for shift, dim in zip(shifts, dims, strict=True):
        x = _rolled(call.ops, x, _axis(call, x, dim), shift)
    return x


def _rolled(ops: GraphBuilder, x: SSAValue, axis: int, shift: int) -> SSAValue:
    n = ops.shape_of(x)[axis]
    return take(ops, x, axis, (np.arange(n) - shift) % n) if n and shift % n else x


@on(torch.masked_fill, "masked_fill")
def _masked_fill(call: Call) -> SSAValue:
    """`x.masked_fill(mask, value)`: where(mask, value, x)."""
    values = [
        call.value(call.arg(i, name)) for i, name in ((1, "mask"), (2, "value"), (0, "input"))
    ]
    return call.ops.apply(tl.WhereOp, broadcast_all(call.ops, values))


@on(F.normalize)
def _normalize(call: Call) -> SSAValue:
    """`F.normalize(x, p=2, dim)`: x / max(sqrt(sum of x^2 over dim), eps), the norm kept as an
    axis of extent 1 and broadcast (swin v2's cosine attention)."""
    if call.arg(1, "p", 2.0) != 2:
        raise call.refuse(f"p={call.arg(1, 'p')} (the Euclidean norm, p=2, only)")
    if call.arg(4, "out", None) is not None:
        raise call.refuse("unsupported argument 'out'")
    x = call.tensor(0)
    squares = reduce(
        call.ops, tl.ReduceSumOp, call.ops.mul_elem(x, x), [call.arg(2, "dim", 1)], True
    )
    norm = elementwise(
        call.ops,
        tl.MaxElemOp,
        [call.ops.apply(tl.SqrtOp, [squares]), lift(call.ops, float(call.arg(3, "eps", 1e-12)))],
    )
    return elementwise(call.ops, tl.DivOp, [x, norm])


@on(F.dropout)
def _dropout(call: Call) -> SSAValue:
    if call.arg(2, "training", True) and call.arg(1, "p", 0.5) > 0:
        raise call.refuse("dropout in training mode (call .eval() first)")
    return call.tensor(0)


@on("expand", "expand_as", torch.broadcast_to, "broadcast_to")
def _expand(call: Call) -> SSAValue:
    """Broadcasting to the shape PyTorch produced on the example."""
    return broadcast_to(call.ops, call.tensor(0), call.out_shape)


@on("repeat", torch.tile, "tile")
def _repeat(call: Call) -> SSAValue:
    """`x.repeat(sizes)` and `torch.tile`: NumPy's tile (reshape, broadcast, reshape)."""
    return tile(call.ops, call.tensor(0), ints(call.rest(1, "dims")))


@on(torch.repeat_interleave, "repeat_interleave")
def _repeat_interleave(call: Call) -> SSAValue:
    """Each element repeated `repeats` times in place (a number: the same for every one)."""
    x = call.tensor(0)
    repeats = call.arg(1, "repeats")
    dim = call.arg(2, "dim", None)
    if dim is None:
        x, dim = reshape(call.ops, x, [int(np.prod(call.ops.shape_of(x)))]), 0
    axis = _axis(call, x, dim)
    n = call.ops.shape_of(x)[axis]
    counts = _indices(call, repeats) if not isinstance(repeats, int) else np.full(n, repeats)
    return take(call.ops, x, axis, np.repeat(np.arange(n), counts))


# --------------------------------------------------------------------------------------------
# Resampling
# --------------------------------------------------------------------------------------------


@on(F.interpolate)
def _interpolate(call: Call) -> SSAValue:
    """PyTorch's nearest, nearest-exact, (bi/tri)linear, bicubic and area modes, linear and
    bicubic also antialiased, each axis alone. The source index of output i uses PyTorch's
    scale: 1 / scale_factor where one is given (and not recomputed), else in / out (align
    corners: (in - 1) / (out - 1)); nearest computes it in float32 as PyTorch does. Bicubic
    weighs the 4 taps around it by Keys' kernel (a = -0.75), indices clamped into the axis;
    antialiasing is PyTorch's separable filter (`_antialias_taps`)."""
    x = call.tensor(0)
    mode = call.arg(3, "mode", "nearest")
    align = call.arg(4, "align_corners", None)
    factor = call.arg(2, "scale_factor", None)
    if call.arg(5, "recompute_scale_factor", None):
        factor = None
    antialias = bool(call.arg(6, "antialias", False))
    shape = call.ops.shape_of(x)
    rank = len(shape) - 2
    out = call.out_shape[2:]
    if mode == "area":
        return adaptive_pool(call.ops, tl.AvgPoolOp, x, out)
    factors = _tuple_none(factor, rank)
    for i, (n, o, f) in enumerate(zip(shape[2:], out, factors, strict=True)):
        axis = 2 + i
        if mode in ("bilinear", "bicubic") and (antialias or mode == "bicubic"):
            index = np.arange(o, dtype=np.float64)
            scale = ((n - 1) / (o - 1) if o > 1 else 0.0) if align else (1 / f if f else n / o)
            if antialias:
                taps = _antialias_taps(n, o, scale, mode == "bicubic")
            else:
                position = scale * index if align else scale * (index + 0.5) - 0.5
                taps = Resampling("cubic", False, -0.75, False).taps(position, n, 1.0)
            x = weighted_taps(call.ops, x, axis, *taps)
        elif mode.startswith("nearest"):
            if o == n:
                continue
            scale = np.float32(1 / f if f else n / o)
            offset = np.float32(0.5 if mode == "nearest-exact" else 0.0)
            position = np.floor((np.arange(o, dtype=np.float32) + offset) * scale)
            x = take(call.ops, x, axis, np.minimum(position.astype(np.int64), n - 1))
        elif align:
            scale = (n - 1) / (o - 1) if o > 1 else 0.0
            x = interpolate(call.ops, x, axis, scale * np.arange(o, dtype=np.float64))
        else:
            scale = 1 / f if f else n / o
            position = np.maximum(scale * (np.arange(o, dtype=np.float64) + 0.5) - 0.5, 0.0)
            x = interpolate(call.ops, x, axis, position)
    return x


def _antialias_taps(n: int, o: int, scale: float, cubic: bool) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's antialiased linear / bicubic weights along one axis (its CPU kernel, after
    PIL): output i is centred at c = scale (i + 0.5) and covers the input indices from
    trunc(c - support + 0.5) (at least 0) to trunc(c + support + 0.5) (at most n), where the
    support is 1 (linear) or 2 (bicubic), times the scale when downsampling; index j weighs
    filter((j - c + 0.5) / max(scale, 1)) (the triangle, or Keys' cubic with a = -0.5), the
    weights normalised to sum 1. Indices [o, K] and weights [o, K], K the widest window
    (shorter ones padded with weight 0)."""
    support = (2.0 if cubic else 1.0) * max(scale, 1.0)
    centre = scale * (np.arange(o, dtype=np.float64) + 0.5)
    first = np.maximum(np.trunc(centre - support + 0.5), 0).astype(np.int64)
    last = np.minimum(np.trunc(centre + support + 0.5).astype(np.int64), n)
    width = int(np.max(last - first, initial=1))
    indices = first[:, None] + np.arange(width)[None, :]
    distance = (indices - centre[:, None] + 0.5) / max(scale, 1.0)
    weights = cubic_kernel(distance, -0.5) if cubic else np.clip(1 - np.abs(distance), 0, None)
    weights = np.where(indices < last[:, None], weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    return indices, weights / np.where(total == 0, 1.0, total)


# --------------------------------------------------------------------------------------------
# Attention and einsum
# --------------------------------------------------------------------------------------------


@on(F.scaled_dot_product_attention)
def _attention(call: Call) -> SSAValue:
    """softmax(q k^T scale + mask) v (PyTorch's math form): a boolean mask or `is_causal`
    adds -inf where attention is not allowed, a float mask is added; `enable_gqa` repeats
    each key/value head for its group of query heads."""
    q, k, v = call.tensor(0), call.tensor(1, "key"), call.tensor(2, "value")
    mask = call.arg(3, "attn_mask", None)
    if call.arg(4, "dropout_p", 0.0):
        raise call.refuse("dropout_p > 0")
    causal = call.arg(5, "is_causal", False)
    scale = call.arg(6, "scale", None)
    sq, sk = call.ops.shape_of(q), call.ops.shape_of(k)
    if call.arg(7, "enable_gqa", False) and sq[-3] != sk[-3]:
        group = np.arange(sq[-3]) // (sq[-3] // sk[-3])
        k = take(call.ops, k, len(sk) - 3, group)
        v = take(call.ops, v, len(sk) - 3, group)
        sk = call.ops.shape_of(k)
    scale = 1 / np.sqrt(sq[-1]) if scale is None else float(scale)
    scores = matmul(call.ops, q, call.ops.transpose(k, axis1=len(sk) - 2, axis2=len(sk) - 1))
    scores = elementwise(call.ops, tl.MulElemOp, [scores, np.float64(scale)])
    if causal:
        allowed = np.tril(np.ones((sq[-2], sk[-2]), dtype=bool))
        scores = elementwise(call.ops, tl.AddOp, [scores, np.where(allowed, 0.0, -np.inf)])
    if mask is not None:
        if isinstance(mask, Constant) and mask.dtype == torch.bool:
            additive: Any = np.where(mask.value != 0, 0.0, -np.inf)
        elif isinstance(mask, Constant | SSAValue):
            additive = call.value(mask)
        else:
            raise call.refuse(f"attn_mask of type {type(mask).__name__}")
        scores = elementwise(call.ops, tl.AddOp, [scores, additive])
    rank = len(call.ops.shape_of(scores))
    weights = call.ops.softmax(scores, axis=rank - 1)
    return matmul(call.ops, weights, v)


@on(torch.einsum)
def _einsum(call: Call) -> SSAValue:
    """`tlc.frontends.import_common.einsum` (any number of operands, `...` included)."""
    equation = str(call.node.args[0])
    tensors = [call.value(t) for t in call.rest(1, "operands")]
    return einsum(call.ops, equation, tensors, call.refuse)


@on("torchvision.ops.stochastic_depth.stochastic_depth")
def _stochastic_depth(call: Call) -> SSAValue:
    """torchvision's stochastic depth: the identity at inference (`training=False`)."""
    if call.arg(3, "training", True) and call.arg(1, "p") > 0:
        raise call.refuse("stochastic depth in training mode (call .eval() first)")
    return call.tensor(0)


# --------------------------------------------------------------------------------------------
# Static values (sizes), which the graph does not compute
# --------------------------------------------------------------------------------------------


@on("size")
def _size(call: Call) -> Any:
    shape = call.ops.shape_of(call.tensor(0))
    dim = call.arg(1, "dim", None)
    return torch.Size(shape) if dim is None else shape[dim]


@on("dim")
def _dim(call: Call) -> int:
    return len(call.ops.shape_of(call.tensor(0)))


@on(builtins.getattr)
def _getattr(call: Call) -> Any:
    name = call.arg(1, "name")
    if name != "shape":
        raise call.refuse(f"attribute '{name}'")
    return torch.Size(call.ops.shape_of(call.tensor(0)))


# --------------------------------------------------------------------------------------------
# Every other target: the op kind whose PyTorch spelling it is
# --------------------------------------------------------------------------------------------

#: Keyword arguments PyTorch's functions take that do not change the value: FX records
#: `F.relu(x)` as `relu(x, inplace=False)`.
VALUE_NEUTRAL = frozenset({"inplace"})


def _spelled(call: Call, op: type[tl.NodeOp]) -> Any:
    """The op kind spelled by the call's target, applied to its leading tensors (as many as the
    op takes; an elementwise binary op broadcasts them). The spelling's `arguments` are the
    metadata fields: the call's arguments after the tensors, by position or keyword, or a
    module's attributes of the same name; an absent one is the field's default (PyTorch's).
    Any other argument is refused: the rule cannot know what it means."""
    spelling = op.TORCH
    assert spelling is not None
    if issubclass(op, BinaryOp):
        _check_arguments(call, 2, ())
        return _elementwise(call, op)
    count = op.ARITY[0]
    _check_arguments(call, count, spelling.arguments)
    if call.module is not None:
        fields = {name: getattr(call.module, name) for name in spelling.arguments}
    else:
        fields = {
            name: call.arg(count + i, name)
            for i, name in enumerate(spelling.arguments)
            if count + i < len(call.node.args) or name in call.node.kwargs
        }
    values = [call.tensor(i, ("input", "other")[i] if i < 2 else f"input{i}") for i in range(count)]
    return call.ops.apply(op, values, fields)


def _check_arguments(call: Call, tensors: int, fields: Sequence[str]) -> None:
    """Refuse positional arguments past the tensors and fields, and unknown keywords."""
    if len(call.node.args) > tensors + len(fields):
        raise call.refuse(
            f"{len(call.node.args)} positional arguments (at most {tensors + len(fields)})"
        )
    known = {"input", "other", *fields, *VALUE_NEUTRAL}
    for name in call.node.kwargs:
        if name not in known:
            raise call.refuse(f"unsupported argument '{name}'")


def _resolve(dotted: str) -> Any:
    """The object a dotted name (`torch.nn.functional.leaky_relu`) names: its longest
    importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return functools.reduce(getattr, parts[cut:], value)
    raise AssertionError(f"{dotted} names no module attribute")


def _derive_rules(op_kinds: Sequence[type[tl.NodeOp]]) -> list[Any]:
    """Give every target an op kind's PyTorch spelling names (functions, module classes,
    method names) and no explicit rule has the rule `_spelled`. Returns the targets added."""
    added = []
    for op in op_kinds:
        spelling = op.TORCH
        if spelling is None:
            continue
        targets = [_resolve(name) for name in (*spelling.functions, *spelling.modules)]
        for target in [*targets, *spelling.methods]:
            if target not in RULES:
                RULES[target] = functools.partial(_spelled, op=op)
                added.append(target)
    return added


#: The targets imported by their op kind's spelling (the rest of `RULES` is explicit).
DERIVED = frozenset(_derive_rules(NODE_OPS))


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


class TorchImporter:
    """Walks one traced module's FX graph in order, keeping each node's value."""

    def __init__(self, gm: fx.GraphModule, builder: GraphBuilder):
        self.gm = gm
        self.builder = builder
        self.env: dict[fx.Node, Any] = {}
        self.consts: dict[int, SSAValue] = {}

    def resolve(self, raw: Any) -> Any:
        if isinstance(raw, fx.Node):
            return self.env[raw]
        if isinstance(raw, list | tuple):
            return type(raw)(self.resolve(r) for r in raw)
        return raw

    def constant_node(self, constant: Constant) -> SSAValue:
        key = id(constant)
        if key not in self.consts:
            self.consts[key] = self.builder.const(constant.value)
        return self.consts[key]

    def fold(self, node: fx.Node) -> Any:
        """A call on the module's tensors alone (`in_proj_bias.chunk(3)`), computed by PyTorch
        in float64 once: constants, like the parameters themselves (None: not such a call)."""
        inputs = [self.env[n] for n in node.all_input_nodes]
        if node.op not in ("call_function", "call_method") or not inputs:
            return None
        if not all(isinstance(v, Constant) for v in inputs) or str(node.target).endswith("_"):
            return None

        def tensor(raw: Any) -> Any:
            if isinstance(raw, fx.Node):
                constant = self.env[raw]
                return torch.from_numpy(constant.value).to(
                    torch.float64 if constant.dtype.is_floating_point else constant.dtype
                )
            return raw

        args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), tensor)
        with torch.no_grad():
            if node.op == "call_method":
                result = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:
                result = node.target(*args, **kwargs)

        def constant(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return Constant(_param(value), value.dtype)
            if isinstance(value, list | tuple):
                return type(value)(constant(v) for v in value)
            return value

        return constant(result)

    def traced_shape(self, node: fx.Node) -> Shape:
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise import_error(PREFIX, f"FX node '{node.name}' produced no single tensor")
        return tuple(int(d) for d in meta.shape)

    def target_text(self, node: fx.Node) -> str:
        if node.op == "call_module":
            cls = type(self.gm.get_submodule(str(node.target)))
            return f"{cls.__module__}.{cls.__qualname__}"
        if node.op == "call_method":
            return f"Tensor.{node.target}"
        if node.op == "call_function":
            return fx.node._get_qualified_name(node.target)
        return f"{node.op} {node.target}"

    def rule_for(self, node: fx.Node) -> tuple[Rule, nn.Module | None]:
        module = self.gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        key = type(module) if module is not None else node.target
        rule = RULES.get(key)
        if rule is None and node.op == "call_function":  # a function of an optional package
            rule = RULES.get(fx.node._get_qualified_name(node.target))
        if rule is None:
            raise import_error(
                PREFIX,
                f"unsupported target {self.target_text(node)} (FX node '{node.name}', {node.op})",
            )
        return rule, module

    def translate(self, node: fx.Node) -> Any:
        if node.op == "get_attr":
            value = self.gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                return Constant(_param(value), value.dtype, str(node.target))
            return value
        folded = self.fold(node)
        if folded is not None:
            return folded
        rule, module = self.rule_for(node)
        call = Call(self, node, module)
        try:
            result = rule(call)
        except ImportFailure:
            raise
        except DiagnosticError as exc:
            raise call.refuse(str(exc)) from None
        if isinstance(result, SSAValue):
            self._check(call, result)
        return result

    def _check(self, call: Call, result: SSAValue) -> None:
        expected = call.out_shape  # refuses a call whose value is not one tensor
        meta = call.node.meta["tensor_meta"]
        if not meta.dtype.is_floating_point and meta.dtype != torch.bool:  # bools as 0 and 1
            raise call.refuse(f"produces {meta.dtype} values (tl graphs compute on reals)")
        ours = self.builder.shape_of(result)
        if ours != expected:
            raise call.refuse(
                f"tl shape {fmt_shape(ours)} differs from the traced shape {fmt_shape(expected)}"
            )


class ConcreteTracer(fx.Tracer):
    """torch.fx's tracer, with every proxy also carrying its value on the example inputs, as a
    fake tensor (`FakeTensorMode`: shapes, dtypes and flags, no values computed, so tracing
    costs no forward pass).

    Python code that inspects shapes or flags (`if x.dim() == 3`, `tgt_len, bsz, e =
    x.shape`, `len(x.shape)`) then runs as it would on the example, which is what a graph of
    static shapes means: a shape, a size or a flag derived from them is a Python value in the
    trace, not a node. A branch on tensor values (`if x.sum() > 0`, `.item()`) is refused: it
    would specialise the graph to the example's data.

    Modules the importer has a rule for are leaves (`call_module` nodes); every other module,
    PyTorch's own included (`nn.MultiheadAttention`, `nn.TransformerEncoderLayer`), is traced
    through. `F.multi_head_attention_forward`, the one functional that dispatches on
    `has_torch_function` of its tensors, is traced into as well.
    """

    def __init__(self, examples: Sequence[Any]) -> None:
        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.examples = [
            self.fake.from_tensor(e) if isinstance(e, torch.Tensor) else e for e in examples
        ]
        self.placeholders = 0

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return type(m) in RULES

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return ExampleProxy(node, self)

    def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any):  # type: ignore[no-untyped-def]
        if kind == "call_method" and target == "clone" and _module_tensor(args[0]):
            # a copy of a parameter (swin v2 zeroes a part of its qkv bias copy in place): a
            # tensor of the trace, a constant of the graph where a node reads it
            return _attribute(self.root, str(args[0].node.target)).detach().clone()
        fresh = kind == "call_method" and target in FRESH_TENSORS and isinstance(args[0], fx.Proxy)
        if fresh and not _holds_proxy((args[1:], kwargs)):
            # zeros or ones of a static size: a tensor of the trace (swin's attention mask,
            # filled in place), a constant of the graph where a node reads it
            dtype = args[0].node.meta["example"].dtype
            return getattr(torch.empty(0, dtype=dtype), target)(*args[1:], **kwargs)
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **kw)
        node = proxy.node
        node.meta["example"] = value = self._run(node)
        # a size, shape or flag (fake tensors hold no data, so none comes from tensor values)
        static = value is not None and _static(value) and target is not builtins.getattr
        if kind in ("call_function", "call_method") and static:
            self.graph.erase_node(node)
            return value
        return proxy

    def _run(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            index, self.placeholders = self.placeholders, self.placeholders + 1
            return self.examples[index] if index < len(self.examples) else node.args[0]
        if node.op == "get_attr":
            return _attribute(self.root, str(node.target))
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), self._example)
        try:
            with torch.no_grad(), _modules_unpatched(), self.fake:
                if node.op == "call_module":
                    return self.root.get_submodule(str(node.target))(*args, **kwargs)
                if node.op == "call_method":
                    return getattr(args[0], str(node.target))(*args[1:], **kwargs)
                return node.target(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            raise import_error(
                PREFIX,
                f"FX node '{node.name}': its shape or value depends on the tensor values "
                "(the graph would hold only the example's)",
            ) from None
        except Exception as exc:  # whatever the model's code raises on the example
            raise ExampleFailure(str(exc)) from None

    def _example(self, node: fx.Node) -> Any:
        if "example" not in node.meta:  # a tensor constant FX made an attribute itself
            node.meta["example"] = _attribute(self.root, str(node.target))
        return node.meta["example"]

    def to_bool(self, obj: fx.Proxy) -> bool:
        value = obj.node.meta["example"]
        if isinstance(value, torch.Tensor):
            raise fx.proxy.TraceError(
                f"Python control flow on the tensor values of '{obj.node.name}' (the graph "
                "would hold only the example's branch)"
            )
        return bool(value)

    def iter(self, obj: fx.Proxy) -> Any:
        return iter([obj[i] for i in range(len(obj.node.meta["example"]))])


@contextlib.contextmanager
def _modules_unpatched() -> Iterator[None]:
    """Module calls and attribute reads as outside a trace (FX patches both while tracing), to
    run a leaf module on its example."""
    patched = nn.Module.__call__, nn.Module.__getattr__
    nn.Module.__call__ = fx._symbolic_trace._orig_module_call  # type: ignore[method-assign]
    nn.Module.__getattr__ = fx._symbolic_trace._orig_module_getattr  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__call__, nn.Module.__getattr__ = patched  # type: ignore[method-assign]


@contextlib.contextmanager
def _wrapped_with_rules() -> Iterator[None]:
    """The functions a library marked `torch.fx.wrap` (torchvision's `stochastic_depth`, swin's
    `shifted_window_attention`) stay FX leaves only where a rule imports them; the others are
    traced through, as modules without a rule are."""
    table = fx._symbolic_trace._wrapped_fns_to_patch
    saved = dict(table)
    for key, frame in saved.items():
        function = frame.get(key[1])
        if (
            function is not None
            and function not in RULES
            and fx.node._get_qualified_name(function) not in RULES
        ):
            del table[key]
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


def _attribute(root: nn.Module, path: str) -> Any:
    """The attribute at a dotted path, read past the module `__getattr__` FX patches while
    tracing (which would record the read)."""
    value: Any = root
    for part in path.split("."):
        if isinstance(value, nn.Module) and part not in value.__dict__:
            value = fx._symbolic_trace._orig_module_getattr(value, part)
        else:
            value = getattr(value, part)
    return value


#: Tensor methods whose value depends only on the receiver's dtype (`x.new_zeros(size)`).
FRESH_TENSORS = frozenset({"new_zeros", "new_ones", "new_full"})


def _module_tensor(value: Any) -> bool:
    return isinstance(value, fx.Proxy) and value.node.op == "get_attr"


def _holds_proxy(value: Any) -> bool:
    found: list[fx.Proxy] = []
    fx.node.map_aggregate(value, lambda v: found.append(v) if isinstance(v, fx.Proxy) else v)
    return bool(found)


def _static(value: Any) -> bool:
    """A value the trace keeps as Python data: sizes, shapes, flags, dtypes."""
    if isinstance(value, list | tuple):
        return all(_static(v) for v in value)
    return value is None or isinstance(value, int | float | bool | str | torch.dtype | torch.device)


class ExampleFailure(Exception):
    """The model's own code failed on the example inputs while being traced."""


class ExampleProxy(fx.Proxy):
    """A proxy whose shape, rank, dtype and flags are its example's (see ConcreteTracer)."""

    def __getattr__(self, name: str) -> Any:
        example = self.node.meta.get("example")
        if isinstance(example, torch.Tensor) and name in STATIC_ATTRIBUTES:
            return getattr(example, name)
        return super().__getattr__(name)

    def __len__(self) -> int:
        return len(self.node.meta["example"])


#: Tensor attributes that are shapes or flags, read from the example.
STATIC_ATTRIBUTES = frozenset(
    {"shape", "ndim", "dtype", "device", "is_nested", "requires_grad", "layout", "is_sparse",
     "is_cuda", "is_quantized", "is_meta"}
)  # fmt: skip


#: The checks FX adds that a parameter bound to its default keeps that value.
SPECIALISATION_CHECKS = (torch._assert, fx._symbolic_trace._assert_is_none)


def trace(module: nn.Module, examples: Sequence[Any]) -> fx.GraphModule:
    """`ConcreteTracer` on `module` called with `examples`; the forward's other parameters
    take their defaults (the checks FX adds for them are dropped)."""
    signature = inspect.signature(module.forward)
    parameters = list(signature.parameters.values())
    extra = parameters[len(examples) :]
    if any(p.default is inspect.Parameter.empty for p in extra):
        names = [p.name for p in parameters if p.default is inspect.Parameter.empty]
        raise import_error(
            PREFIX,
            f"the model takes {len(names)} inputs ({', '.join(names)}), "
            f"{len(examples)} example inputs given",
        )
    concrete = {p.name: p.default for p in extra if p.default is not inspect.Parameter.empty}
    tracer = ConcreteTracer(examples)
    with mock.patch.object(F, "has_torch_function", lambda *_: False), _wrapped_with_rules():
        graph = tracer.trace(module, concrete_args=concrete or None)
    gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
    for node in reversed(graph.nodes):
        if node.op == "call_function" and node.target in (
            torch._assert,
            fx._symbolic_trace._assert_is_none,
        ):
            graph.erase_node(node)
    graph.eliminate_dead_code()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[len(examples) :]:  # FX passed the defaults themselves on
        assert not node.users, f"{node.target} is read only by the checks just dropped"
        graph.erase_node(node)
    for node in graph.nodes:  # the shapes the importer checks every node against
        example = node.meta.pop("example", None)
        if isinstance(example, torch.Tensor):
            node.meta["tensor_meta"] = _extract_tensor_metadata(example)
    gm.recompile()
    return gm


def _graph_name(module: nn.Module) -> str:
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", type(module).__name__).lower()
    name = re.sub(r"[^a-z0-9_]", "_", name)
    return name if re.match(r"[a-z_]", name) else f"m_{name}"


def _rows(example: torch.Tensor, n: int) -> torch.Tensor:
    """`example` with `n` rows: its rows repeated (only the shapes matter to the importer)."""
    index = torch.arange(n) % len(example)
    return example[index]


def _location(module: nn.Module) -> Location:
    """Where the module's forward is defined: the imported nodes' location."""
    try:
        lines, line = inspect.getsourcelines(type(module).forward)
        return Location(inspect.getsourcefile(type(module).forward) or "<torch>", line, 1)
    except (OSError, TypeError):
        return Location("<torch>", 1, 1)


def from_torch(
    module: nn.Module, example_input: Any, name: str | None = None, dynamic_batch: bool = False
) -> Traced:
    """Trace `module` with torch.fx on `example_input` (a tensor, or a tuple of tensors for
    several inputs) and translate it: a `Traced` (module, graph, payload keyed by node id).
    With `dynamic_batch`, the leading dimension of every input is the batch extent `N`: the
    model is imported at two batch sizes (rows of the example repeated) and must be one graph
    over `N` (`tlc.frontends.import_common.generalise_batch`)."""
    if dynamic_batch:
        examples = (
            tuple(example_input) if isinstance(example_input, list | tuple) else (example_input,)
        )
        for example in examples:
            if not isinstance(example, torch.Tensor) or example.ndim == 0 or not len(example):
                raise import_error(
                    PREFIX, "dynamic_batch needs example tensors with a leading batch dimension"
                )
        return generalise_batch(
            lambda n: from_torch(module, tuple(_rows(e, n) for e in examples), name),
            lambda reason: import_error(
                PREFIX, f"the model does not keep its batch dimension: {reason}; import it "
                "without dynamic_batch (the example's batch size is then fixed)",
            ),
        )  # fmt: skip
    examples = tuple(example_input) if isinstance(example_input, list | tuple) else (example_input,)
    try:
        gm = trace(module, examples)
    except ImportFailure:
        raise
    except ExampleFailure as exc:  # the model's own error on the example (shapes, dtypes, ...)
        raise import_error(
            PREFIX, f"running the model on the example failed: {str(exc).splitlines()[0]}"
        ) from None
    except Exception as exc:  # FX raises many kinds (TraceError, TypeError, ...)
        raise import_error(
            PREFIX, f"torch.fx cannot trace {type(module).__name__}: {exc}"
        ) from None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(examples):
        raise import_error(
            PREFIX,
            f"the model takes {len(placeholders)} inputs "
            f"({', '.join(n.name for n in placeholders)}), {len(examples)} example inputs given",
        )
    for node, example in zip(placeholders, examples, strict=True):
        if not isinstance(example, torch.Tensor) or not example.dtype.is_floating_point:
            raise import_error(PREFIX, f"input '{node.name}': expected a floating-point tensor")
    at = _location(module)
    builder, inputs = new_builder(
        name or _graph_name(module), [tuple(e.shape) for e in examples], at
    )
    importer = TorchImporter(gm, builder)
    importer.env.update(zip(placeholders, inputs, strict=True))
    output = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            output = node.args[0]
            break
        importer.env[node] = importer.translate(node)
    if not isinstance(output, fx.Node):
        count = len(output) if isinstance(output, list | tuple | dict) else "no"
        raise import_error(PREFIX, f"the model returns {count} values; tl graphs have one output")
    value = importer.env[output]
    if isinstance(value, Constant):
        value = importer.constant_node(value)
    if not isinstance(value, SSAValue):
        raise import_error(PREFIX, f"the model returns a {type(value).__name__}, not a tensor")
    return finish(builder, value)


__all__ = ["DERIVED", "RULES", "from_torch"]
