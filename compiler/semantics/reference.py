"""The reference rule of every op kind: TorchLean's `Graph.denote`, over numpy float64 or float32.

`REFERENCE[OpClass]` is `rule(node, args, record, dtype) -> ndarray`: `args` are the parents'
values (already of `dtype`), `record` the node's payload record (cast to `dtype`, None for ops
that read no payload or were given none) and `dtype` the scalar context. An op stating its numpy
function (`UnaryOp.numpy`, `BinaryOp.numpy`) gets it as its rule; an op with only a decomposition
gets the decomposition evaluated by a `NumpyEmitter` (each part by its own rule, in `dtype`); the
rules below are the ops that need their own. The backward ops' rules (gradient graphs) are
registered by `tlc.semantics.backward_reference`; `tlc.semantics.interpret` imports it,
so the complete table is `tlc.semantics.interpret.REFERENCE`. Every rule computes in
`dtype` throughout: a float32 run rounds at every step, as a float32 machine would, instead of
rounding a float64 result once at the end. The one data-dependent failure is raw `log` of a
non-positive or NaN input, which raises `EvalError` with the seed's message; every other rule is
total on well-shaped inputs (reference/torchlean-ir.md §2, §4).

Random sources are deterministic: `rand_uniform {seed = s}` draws `numpy.random.Generator(PCG64(s))
.random(shape)` in float64 (U[0, 1)); `bernoulli_mask {seed = s}` draws the same stream and keeps
an entry (1) where the draw is `< keepProb`, else 0. In float32 the draws are rounded to float32
(a draw that would round up to 1.0 is stepped back below 1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.rule_table import RuleTable
from tlc.dialect import minmax, ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.semantics.emitter import NumpyEmitter

Rule = Callable[[NodeOp, list[np.ndarray], "dict[str, np.ndarray] | None", Any], np.ndarray]

REFERENCE: RuleTable[Rule] = RuleTable("reference")

LOG_MESSAGE = (
    "IR eval: log: input contains values <= 0 (or NaN); "
    "use `safe_log` if you want epsilon protection"
)


class EvalError(DiagnosticError):
    """Evaluation failed on bad input (payload mismatch, raw log of a non-positive value...)."""


def eval_error(message: str, node: NodeOp) -> EvalError:
    """An `EvalError` located at `node`."""
    return EvalError(*error(message, node).diagnostics)


def _quiet(rule: Rule) -> Rule:
    """`rule` run without numpy floating-point warnings: overflow to inf and NaN from inf - inf
    are values of the denotation, not events to report."""

    @functools.wraps(rule)
    def quiet(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return rule(node, args, record, dtype)

    return quiet


def register(*op_classes: type[NodeOp]) -> Callable[[Rule], Rule]:
    """Decorator: `rule` is the reference semantics of each of `op_classes` (held quiet)."""

    def add(rule: Rule) -> Rule:
        REFERENCE.register(*op_classes)(_quiet(rule))
        return rule

    return add


def payload_field(node: NodeOp, record: Any, name: str, dtype: Any) -> np.ndarray:
    """The record's field `name`, else the default the op's payload schema gives it, in
    `dtype` (layernorm and batch norm's eps)."""
    if record is not None and name in record:
        return record[name]
    param = next(p for p in type(node).PAYLOAD if p.name == name)
    assert param.default is not None, f"{node.TAG}.{name} has no default"
    return np.asarray(param.default, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


@register(ops.InputOp)
def _input(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    raise AssertionError("input nodes take their value from the caller, not from a rule")


@register(ops.ConstOp)
def _const(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return record["value"].reshape(node.meta("shape"))


def uniform_draws(seed: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The documented U[0, 1) stream of `rand_uniform`/`bernoulli_mask`, in `dtype`."""
    draws = np.random.Generator(np.random.PCG64(seed)).random(shape)
    rounded = draws.astype(dtype)
    return np.where(rounded < 1, rounded, np.nextafter(dtype(1), dtype(0))).astype(dtype)


@register(ops.RandUniformOp)
def _rand_uniform(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return uniform_draws(node.meta("seed"), node.require_declared(), dtype)


@register(ops.BernoulliMaskOp)
def _bernoulli(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    draws = uniform_draws(node.meta("seed"), node.require_declared(), dtype)
    return (draws < args[0]).astype(dtype)


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------


register(ops.SafeLogOp)(lambda node, args, record, dtype: np.log(ops.softplus(args[0]) + args[1]))


@register(ops.LogOp)
def _log(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    (x,) = args
    if not np.all(x > 0):
        raise eval_error(LOG_MESSAGE, node)
    return np.log(x)


# --------------------------------------------------------------------------------------------
# Layout: every value is moved, none computed
# --------------------------------------------------------------------------------------------


@register(ops.PermuteOp)
def _permute(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.transpose(args[0], node.meta("perm"))


@register(ops.TransposeOp)
def _transpose(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.swapaxes(args[0], node.meta("axis1"), node.meta("axis2"))


@register(ops.ReshapeOp)
def _reshape(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return args[0].reshape(node.meta("to"))


@register(ops.FlattenOp)
def _flatten(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return args[0].reshape(-1)


@register(ops.BroadcastToOp)
def _broadcast(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.array(np.broadcast_to(args[0], node.meta("to")))


@register(ops.GatherOp)
def _gather(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    indices = np.asarray(node.meta("indices"), dtype=np.int64)
    return np.take(args[0], indices, axis=node.meta("axis"))


@register(ops.ConcatOp)
def _concat(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.concatenate(args, axis=node.meta("axis"))


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------


@register(ops.ReduceSumOp)
def _reduce_sum(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.sum(args[0], axis=node.meta("axis"), dtype=dtype)


@register(ops.ReduceMeanOp)
def _reduce_mean(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.mean(args[0], axis=node.meta("axis"), dtype=dtype)


@register(ops.SumOp)
def _sum(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.asarray(np.sum(args[0], dtype=dtype))


@register(ops.MseLossOp)
def _mse(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    yhat, target = args
    return np.asarray(np.mean(np.square(yhat - target), dtype=dtype))


# --------------------------------------------------------------------------------------------
# Normalisations along an axis
# --------------------------------------------------------------------------------------------


@register(ops.SoftmaxOp)
def _softmax(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    axis = node.meta("axis")
    # initial=-inf: over an empty axis the result is empty (docs/semantics.md), not an error
    e = np.exp(args[0] - np.max(args[0], axis=axis, keepdims=True, initial=-np.inf))
    return e / np.sum(e, axis=axis, keepdims=True)


@register(ops.LogSoftmaxOp)
def _log_softmax(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    axis = node.meta("axis")
    shifted = args[0] - np.max(args[0], axis=axis, keepdims=True, initial=-np.inf)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@register(ops.HardMaskedSoftmaxOp)
def _hard_masked(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    (x,) = args
    allowed = np.array(node.meta("allowed"), dtype=bool).reshape(x.shape)
    top = np.max(np.where(allowed, x, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0).astype(dtype)
    e = np.where(allowed, np.exp(x - top), dtype(0))
    total = np.sum(e, axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), dtype(0)).astype(dtype)


@register(ops.LayernormOp)
def _layernorm(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """PyTorch's layer_norm with normalized_shape = s[axis:] (biased variance)."""
    (x,) = args
    axes = tuple(range(node.meta("axis"), x.ndim))
    eps = payload_field(node, record, "eps", dtype)
    record = record or {}
    centred = x - np.mean(x, axis=axes, keepdims=True)
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    y = centred / np.sqrt(var + eps)
    if "gamma" in record:
        y = y * record["gamma"]
    if "beta" in record:
        y = y + record["beta"]
    return y


@register(ops.BatchNormEvalOp)
def _batch_norm(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Eval-mode batch norm: (x - mean) / sqrt(var + eps) * gamma + beta per channel."""
    (x,) = args
    axis = node.meta("channel_axis")
    view = [1] * x.ndim
    view[axis] = x.shape[axis]

    def per_channel(name: str) -> np.ndarray:
        return record[name].reshape(view)

    eps = payload_field(node, record, "eps", dtype)
    scale = per_channel("gamma") / np.sqrt(per_channel("var") + eps)
    return (x - per_channel("mean")) * scale + per_channel("beta")


# --------------------------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------------------------


@register(ops.LinearOp)
def _linear(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """W x + b at every leading index, W [out, in] (PyTorch's layout)."""
    y = np.matmul(args[0], record["weight"].T)
    return y + record["bias"] if "bias" in record else y


@register(ops.MatmulOp)
def _matmul(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    return np.matmul(args[0], args[1])


def _windows(
    x: np.ndarray,
    first: int,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    pads: list[tuple[int, int]],
    fill: float,
) -> np.ndarray:
    """Sliding windows over axes first.. of `x` padded with `fill`: shape
    x.shape[:first] + out extents + kernel extents (dilated taps only)."""
    spatial = tuple(range(first, first + len(kernel)))
    padded = np.pad(x, [(0, 0)] * first + pads, constant_values=fill)
    extents = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    view = sliding_window_view(padded, extents, axis=spatial)
    positions = tuple(slice(None, None, s) for s in stride)
    taps = tuple(slice(None, None, d) for d in dilation)
    return view[(Ellipsis, *positions, *taps)]


def _pool_windows(node: NodeOp, x: np.ndarray, fill: float) -> np.ndarray:
    """x.shape[:lead] + pooled extents + kernel: each window of the spatial suffix."""
    kernel, stride, padding = node.meta("kernel"), node.meta("stride"), node.meta("padding")
    first = x.ndim - len(kernel)
    extents = tuple(
        ops.pool_out_dim(n, k, s, p)
        for n, k, s, p in zip(x.shape[first:], kernel, stride, padding, strict=True)
    )
    if 0 in extents:
        return np.zeros(x.shape[:first] + extents + tuple(kernel), dtype=x.dtype)
    pads = [(p, p) for p in padding]
    windows = _windows(x, first, kernel, stride, (1,) * len(kernel), pads, fill)
    kept = tuple(slice(0, n) for n in extents) + (slice(None),) * len(kernel)
    return windows[(Ellipsis, *kept)]


def _window_axes(node: NodeOp, windows: np.ndarray) -> tuple[int, ...]:
    rank = len(node.meta("kernel"))
    return tuple(range(windows.ndim - rank, windows.ndim))


@register(ops.MaxPoolOp)
def _max_pool(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Max over each window: `minmax.maximum` folded over the taps in row-major order from
    -inf (padding is -inf, so it never wins), so a window's NaN is its first one and a window
    of zeros takes its last zero's sign (np.max over the window axes takes lanes in an order
    of its own)."""
    windows = _pool_windows(node, args[0], -np.inf)
    rank = len(node.meta("kernel"))
    top = np.full(windows.shape[:-rank], -np.inf, dtype)
    for tap in np.ndindex(windows.shape[-rank:]):
        top = minmax.maximum(top, windows[(Ellipsis, *tap)])
    return top.astype(dtype)


@register(ops.AvgPoolOp)
def _avg_pool(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Mean over each window, zero padding counted in the divisor (count_include_pad)."""
    windows = _pool_windows(node, args[0], 0.0)
    divisor = dtype(math.prod(node.meta("kernel")))
    return (np.sum(windows, axis=_window_axes(node, windows), dtype=dtype) / divisor).astype(dtype)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@register(ops.ConvOp)
def _conv(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """N-d grouped convolution; channels at `channel_axis`, spatial axes after it.

    Kernel [out, in/groups, k...], bias [out]; `padding` before and `padding_after` after each
    spatial axis (zeros), `stride` and `dilation` per axis.
    """
    (x,) = args
    m = node.metadata()
    axis, groups, kernel = m["channel_axis"], m["groups"], tuple(m["kernel"])
    rank = len(kernel)
    pads = list(zip(m["padding"], m["padding_after"], strict=True))
    windows = _windows(x, axis + 1, kernel, m["stride"], m["dilation"], pads, 0.0)
    # windows: lead + [C] + out + kernel  ->  lead + [G, C/G] + out + kernel
    lead = x.shape[:axis]
    cin, cout = m["in_channels"], m["out_channels"]
    windows = windows.reshape(lead + (groups, cin // groups) + windows.shape[axis + 1 :])
    weight = record["weight"].reshape((groups, cout // groups, cin // groups) + kernel)
    lead_ix = _LETTERS[: len(lead)]
    out_ix = _LETTERS[len(lead) : len(lead) + rank]
    k_ix = _LETTERS[len(lead) + rank : len(lead) + 2 * rank]
    spec = f"{lead_ix}GC{out_ix}{k_ix},GOC{k_ix}->{lead_ix}GO{out_ix}"
    y = np.einsum(spec, windows, weight, optimize=True)
    y = y.reshape(lead + (cout,) + y.shape[len(lead) + 2 :])
    if "bias" in record:
        y = y + record["bias"].reshape((cout,) + (1,) * rank)
    return y.astype(dtype, copy=False)


# --------------------------------------------------------------------------------------------
# Derived from the op's facts
# --------------------------------------------------------------------------------------------


def _by_numpy(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """The op's numpy function, computed in the run's dtype."""
    return np.asarray(node.numpy(*args), dtype=dtype)


def _by_decomposition(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """The op's decomposition, each part by its own reference rule in the run's dtype."""
    return np.asarray(node.decompose(NumpyEmitter(REFERENCE, dtype), *args), dtype=dtype)


def _derived(op_class: type[NodeOp]) -> Rule | None:
    if op_class.defines("numpy"):
        return _quiet(_by_numpy)
    if op_class.defines("decompose"):
        return _quiet(_by_decomposition)
    return None


REFERENCE.derive(NODE_OPS, _derived)
