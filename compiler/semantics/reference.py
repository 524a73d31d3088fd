"""The reference rule of every op kind: TorchLean's `Graph.denote`, over numpy float64 or float32.

`REFERENCE[OpClass]` is `rule(node, args, record, dtype) -> ndarray`: `args` are the parents'
values (already of `dtype`), `record` the node's payload record (cast to `dtype`, None for ops
that read no payload or were given none) and `dtype` the scalar context. Every rule computes in
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
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp

Rule = Callable[[NodeOp, list[np.ndarray], "dict[str, np.ndarray] | None", Any], np.ndarray]

REFERENCE: dict[type[NodeOp], Rule] = {}

LOG_MESSAGE = (
    "IR eval: log: input contains values <= 0 (or NaN); "
    "use `safe_log` if you want epsilon protection"
)


class EvalError(DiagnosticError):
    """Evaluation failed on bad input (payload mismatch, raw log of a non-positive value...)."""


def eval_error(message: str, node: NodeOp) -> EvalError:
    """An `EvalError` located at `node`."""
    return EvalError(*error(message, node).diagnostics)


def register(*op_classes: type[NodeOp]) -> Callable[[Rule], Rule]:
    """Decorator: `rule` is the reference semantics of each of `op_classes`.

    The table holds the rule wrapped to run without numpy floating-point warnings: overflow to
    inf and NaN from inf - inf are values of the denotation, not events to report.
    """

    def add(rule: Rule) -> Rule:
        @functools.wraps(rule)
        def quiet(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
            with np.errstate(all="ignore"):
                return rule(node, args, record, dtype)

        for cls in op_classes:
            assert cls not in REFERENCE, f"two reference rules for {cls.__name__}"
            REFERENCE[cls] = quiet
        return rule

    return add


def elementwise(op_class: type[NodeOp], fn: Callable[..., np.ndarray]) -> None:
    """An op that applies `fn` to its parents' values elementwise (dtype preserved)."""

    def rule(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
        return np.asarray(fn(*args), dtype=dtype)

    register(op_class)(rule)


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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """PyTorch's gelu: exact x/2 (1 + erf(x/sqrt 2)), or its tanh approximation.

    The erf is evaluated per element in float64 and rounded to `dtype` (numpy has no float32
    erf); the surrounding arithmetic is in `dtype`.
    """
    (x,) = args
    half = dtype(0.5)
    if node.meta("approximate") == "tanh":
        k = dtype(math.sqrt(2 / math.pi))
        inner = k * (x + dtype(0.044715) * x * x * x)
        return half * x * (1 + np.tanh(inner))
    return half * x * (1 + _erf(x * dtype(1 / math.sqrt(2))).astype(dtype))


register(ops.GeluOp)(_gelu)

for _op, _fn in (
    (ops.DetachOp, lambda x: x),
    (ops.AddOp, np.add),
    (ops.SubOp, np.subtract),
    (ops.MulElemOp, np.multiply),
    (ops.MaxElemOp, np.maximum),
    (ops.MinElemOp, np.minimum),
    (ops.AbsOp, np.abs),
    (ops.SqrtOp, np.sqrt),
    (ops.ReluOp, lambda x: np.maximum(x, 0)),
    (ops.TanhOp, np.tanh),
    (ops.SigmoidOp, _sigmoid),
    (ops.SoftplusOp, _softplus),
    (ops.ExpOp, np.exp),
    (ops.InvOp, lambda x: 1 / x),
    (ops.SinOp, np.sin),
    (ops.CosOp, np.cos),
    (ops.SafeLogOp, lambda x, eps: np.log(_softplus(x) + eps)),
):
    elementwise(_op, _fn)


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
    record = record or {}
    eps = record.get("eps", np.asarray(1e-5, dtype=dtype))
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

    eps = record.get("eps", np.asarray(1e-5, dtype=dtype))
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
    """Max over each window; padding is -inf, so it never wins."""
    windows = _pool_windows(node, args[0], -np.inf)
    return np.max(windows, axis=_window_axes(node, windows), initial=-np.inf).astype(dtype)


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


# The backward ops' rules (gradient graphs) live with autodiff and register themselves here.
import tlc.semantics.autodiff.backward_reference  # noqa: E402, F401
