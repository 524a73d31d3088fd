"""PyTorch import: a module traced by torch.fx becomes a tl graph plus its payload.

`from_torch(module, example_input)` runs `torch.fx.symbolic_trace`, propagates the example's
shapes through the trace (`ShapeProp`), then maps every FX node through `RULES`, one table keyed
by the node's target: the submodule's class for `call_module` (`nn.Linear`), the function for
`call_function` (`torch.relu`, `operator.add`), the method name for `call_method` (`"sum"`).
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
import functools
import importlib
import inspect
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location
from tlc.dialect import ops as tl
from tlc.dialect.families import BinaryOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.frontends.import_common import (
    ImportFailure,
    ceil_mode_extra,
    elementwise,
    finish,
    generalise_batch,
    import_error,
    ints,
    lift,
    matmul,
    new_builder,
    norm_axis,
    pad,
    reduce,
    reshape,
)
from tlc.semantics.program import GraphBuilder, Traced

PREFIX = "PyTorch graph import"

_REQUIRED = object()


@dataclass(frozen=True)
class Constant:
    """A tensor the module holds (a `get_attr` node): a `const` node once used as a value."""

    value: np.ndarray


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
        return raw.value

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
def _in_place(call: Call, op: type[tl.BinaryOp]) -> Any:
    """`x += y` traces to `operator.iadd`: the value is x + y (tl graphs are functional)."""
    return _elementwise(call, op)


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
    m = call.module
    return call.ops.linear(call.tensor(0), _param(m.weight), _param(m.bias))


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


@on(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv_module(call: Call) -> SSAValue:
    m = call.module
    if m.padding_mode != "zeros":
        raise call.refuse(f"padding_mode='{m.padding_mode}' (only 'zeros')")
    return _conv_of(
        call, _param(m.weight), _param(m.bias), m.stride, m.padding, m.dilation, m.groups
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
        call, _param(m.running_mean), _param(m.running_var), _param(m.weight), _param(m.bias),
        m.eps,
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
    return _layernorm_of(call, m.normalized_shape, _param(m.weight), _param(m.bias), m.eps)


@on(F.layer_norm)
def _layernorm(call: Call) -> SSAValue:
    return _layernorm_of(
        call, call.arg(1, "normalized_shape"), call.constant(2, "weight", None),
        call.constant(3, "bias", None), call.arg(4, "eps", 1e-5),
    )  # fmt: skip


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
    "flatten", "reshape", "view", "squeeze", "unsqueeze",
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


@on(torch.transpose, "transpose")
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
    if _tuple(p.dilation, rank) != [1] * rank:
        raise call.refuse("pooling with dilation")
    if p.return_indices:
        raise call.refuse("return_indices=True")
    if p.divisor_override is not None:
        raise call.refuse("divisor_override")
    if not p.count_include_pad and any(padding):
        raise call.refuse("count_include_pad=False with padding (tl counts the zero padding)")
    if p.ceil_mode:
        spatial = call.ops.shape_of(x)[-rank:]
        extra = [
            ceil_mode_extra(n, q, q, k, s)
            for n, q, k, s in zip(spatial, padding, kernel, stride, strict=True)
        ]
        if any(extra):
            if op is tl.AvgPoolOp:
                raise call.refuse("ceil_mode=True where it adds a partial window (tl rounds down)")
            # pad explicitly with -inf, which never wins a max, so tl's rounding down keeps the
            # partial windows
            hi = [q + e for q, e in zip(padding, extra, strict=True)]
            x = pad(call.ops, x, len(call.ops.shape_of(x)) - rank, padding, hi, -np.inf)
            padding = [0] * rank
    return call.ops.apply(op, [x], {"kernel": kernel, "stride": stride, "padding": padding})


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


@on(nn.AdaptiveAvgPool1d, rank=1)
@on(nn.AdaptiveAvgPool2d, rank=2)
def _adaptive_avg_pool(call: Call, rank: int) -> SSAValue:
    """Adaptive pooling is a plain average pool where each input extent divides evenly."""
    x = call.tensor(0)
    spatial = call.ops.shape_of(x)[-rank:]
    wanted = [
        s if o is None else o
        for s, o in zip(spatial, _tuple_none(call.module.output_size, rank), strict=True)
    ]
    if any(s % o for s, o in zip(spatial, wanted, strict=True)):
        raise call.refuse(
            f"adaptive pooling of {fmt_shape(spatial)} to {fmt_shape(wanted)} (uneven windows)"
        )
    kernel = [s // o for s, o in zip(spatial, wanted, strict=True)]
    return call.ops.avg_pool(x, kernel=kernel, stride=kernel, padding=[0] * rank)


def _tuple_none(value: Any, rank: int) -> list[Any]:
    return list(value) if isinstance(value, Sequence) else [value] * rank


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


@on(operator.getitem)
def _getitem(call: Call) -> Any:
    container = call.arg(0, "a")
    if isinstance(container, SSAValue | Constant):
        raise call.refuse("indexing or slicing a tensor")
    return container[call.arg(1, "b")]


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
            return Constant(_param(value)) if isinstance(value, torch.Tensor) else value
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
        if not meta.dtype.is_floating_point:
            raise call.refuse(f"produces {meta.dtype} values (tl graphs compute on reals)")
        ours = self.builder.shape_of(result)
        if ours != expected:
            raise call.refuse(
                f"tl shape {fmt_shape(ours)} differs from the traced shape {fmt_shape(expected)}"
            )


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
        gm = fx.symbolic_trace(module)
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
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*examples)
    except Exception as exc:  # the model's own error on the example (shapes, dtypes, ...)
        raise import_error(
            PREFIX, f"running the model on the example failed: {str(exc).splitlines()[0]}"
        ) from None
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
