"""Reference semantics of the backward ops (tlc.dialect.backward_ops), in numpy.

Registered in `tlc.semantics.reference.REFERENCE` like every other op's rule, so gradient graphs
run in the reference denotation. Each rule is the exact adjoint of its forward op's windowing:
an output position o and kernel tap k read the padded input at o * stride + k * dilation, so the
backward rules loop over the taps (few) and scatter whole strided slices (many elements) at once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from tlc.dialect import ops
from tlc.dialect.backward_ops import (
    AvgPoolGradOp,
    ConvGradOp,
    ConvInputGradOp,
    ConvWeightGradOp,
    GeluGradOp,
    MaxPoolGradOp,
)
from tlc.dialect.ops import NodeOp
from tlc.semantics.reference import register

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


@register(GeluGradOp)
def _gelu_grad(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Exact: Phi(x) + x phi(x). Tanh form: the derivative of 0.5 x (1 + tanh(u(x)))."""
    (x,) = args
    with np.errstate(all="ignore"):
        if node.meta("approximate") == "tanh":
            u = dtype(_SQRT_2_OVER_PI) * (x + dtype(0.044715) * x * x * x)
            t = np.tanh(u)
            du = dtype(_SQRT_2_OVER_PI) * (1 + dtype(3 * 0.044715) * x * x)
            return (dtype(0.5) * (1 + t) + dtype(0.5) * x * (1 - t * t) * du).astype(dtype)
        cdf = dtype(0.5) * (1 + _erf(x / dtype(math.sqrt(2))).astype(dtype))
        pdf = np.exp(dtype(-0.5) * x * x) / dtype(math.sqrt(2 * math.pi))
        return (cdf + x * pdf).astype(dtype)


# --------------------------------------------------------------------------------------------
# Windows: the strided slice of the padded input that one kernel tap reads
# --------------------------------------------------------------------------------------------


def _taps(
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    out: tuple[int, ...],
) -> Iterator[tuple[slice, ...]]:
    """For each tap in row-major order, the slices (over the spatial axes) it reads."""
    for tap in itertools.product(*(range(k) for k in kernel)):
        yield tuple(
            slice(t * d, t * d + s * (n - 1) + 1, s)
            for t, d, s, n in zip(tap, dilation, stride, out, strict=True)
        )


def _crop(padded: np.ndarray, lead: int, pads: list[tuple[int, int]]) -> np.ndarray:
    keep = tuple(slice(lo, padded.shape[lead + i] - hi) for i, (lo, hi) in enumerate(pads))
    return padded[(slice(None),) * lead + keep]


def _pool_geometry(node: NodeOp, x_shape: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]]:
    lead = len(x_shape) - len(node.meta("kernel"))
    return lead, [(p, p) for p in node.meta("padding")]


def _first_max(node: NodeOp, x: np.ndarray, out: tuple[int, ...]) -> tuple[Any, ...]:
    """Which tap wins each window: the first maximum in row-major tap order (PyTorch's).

    Returns (winner per output position, the taps' slices, lead axes, padding).
    """
    kernel, stride = node.meta("kernel"), node.meta("stride")
    lead, pads = _pool_geometry(node, x.shape)
    padded = np.pad(x, [(0, 0)] * lead + pads, constant_values=-np.inf)
    taps = [(slice(None),) * lead + w for w in _taps(kernel, stride, (1,) * len(kernel), out)]
    best = np.full(x.shape[:lead] + out, -np.inf, dtype=x.dtype)
    winner = np.zeros(best.shape, dtype=np.int64)
    for j, window in enumerate(taps):
        value = padded[window]
        better = value > best
        best = np.where(better, value, best)
        winner = np.where(better, j, winner)
    return winner, taps, lead, pads


@register(MaxPoolGradOp)
def _max_pool_grad(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Route each window's cotangent to its first maximum; overlapping windows accumulate."""
    x, g = args
    winner, taps, lead, pads = _first_max(node, x, g.shape[x.ndim - len(node.meta("kernel")) :])
    grad = np.zeros(
        x.shape[:lead]
        + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[lead:], pads, strict=True)),
        dtype=dtype,
    )
    for j, window in enumerate(taps):
        grad[window] += np.where(winner == j, g, dtype(0))
    return _crop(grad, lead, pads)


def max_pool_tangent(node: NodeOp, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The JVP of `max_pool` at x: each window takes the tangent of its first maximum."""
    kernel = node.meta("kernel")
    lead = x.ndim - len(kernel)
    out = tuple(
        ops.pool_out_dim(n, k, s, p)
        for n, k, s, p in zip(
            x.shape[lead:], kernel, node.meta("stride"), node.meta("padding"), strict=True
        )
    )
    winner, taps, lead, pads = _first_max(node, x, out)
    padded = np.pad(t, [(0, 0)] * lead + pads)
    picked = np.zeros(winner.shape, dtype=t.dtype)
    for j, window in enumerate(taps):
        picked = np.where(winner == j, padded[window], picked)
    return picked


@register(AvgPoolGradOp)
def _avg_pool_grad(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    """Each window position receives cotangent / prod(kernel) (padding counts in the divisor)."""
    (g,) = args
    x_shape = node.require_declared()
    kernel, stride = node.meta("kernel"), node.meta("stride")
    lead, pads = _pool_geometry(node, x_shape)
    padded_shape = x_shape[:lead] + tuple(
        n + lo + hi for n, (lo, hi) in zip(x_shape[lead:], pads, strict=True)
    )
    grad = np.zeros(padded_shape, dtype=dtype)
    share = (g / dtype(math.prod(kernel))).astype(dtype)
    spatial = (slice(None),) * lead
    for window in _taps(kernel, stride, (1,) * len(kernel), g.shape[lead:]):
        grad[spatial + window] += share
    return _crop(grad, lead, pads)


# --------------------------------------------------------------------------------------------
# Convolution: channels at channel_axis, leading axes before it (flattened to B here)
# --------------------------------------------------------------------------------------------


def _conv_frame(node: ConvGradOp, x_shape: tuple[int, ...]) -> dict[str, Any]:
    m = node.metadata()
    axis = m["channel_axis"]
    pads = list(zip(m["padding"], m["padding_after"], strict=True))
    return {
        "axis": axis,
        "batch": math.prod(x_shape[:axis]),
        "groups": m["groups"],
        "cin": m["in_channels"],
        "cout": m["out_channels"],
        "kernel": tuple(m["kernel"]),
        "stride": tuple(m["stride"]),
        "dilation": tuple(m["dilation"]),
        "pads": pads,
        "padded": x_shape[: axis + 1]
        + tuple(n + lo + hi for n, (lo, hi) in zip(x_shape[axis + 1 :], pads, strict=True)),
    }


def _grouped(value: np.ndarray, f: dict[str, Any], channels: int) -> np.ndarray:
    """lead + [C] + spatial -> [B, G, C/G, P]."""
    return value.reshape(f["batch"], f["groups"], channels // f["groups"], -1)


@register(ConvInputGradOp)
def _conv_input_grad(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    assert isinstance(node, ConvGradOp)
    g, w = args
    x_shape = node.require_declared()
    f = _conv_frame(node, x_shape)
    axis, groups, cin = f["axis"], f["groups"], f["cin"]
    out = g.shape[axis + 1 :]
    gg = _grouped(g, f, f["cout"])
    weight = w.reshape(groups, f["cout"] // groups, cin // groups, -1)
    grad = np.zeros(f["padded"], dtype=dtype)
    lead = (slice(None),) * (axis + 1)
    taps = _taps(f["kernel"], f["stride"], f["dilation"], out)
    for j, window in enumerate(taps):
        part = np.einsum("bgop,goc->bgcp", gg, weight[..., j], optimize=True)
        grad[lead + window] += part.reshape(x_shape[: axis + 1] + out)
    return _crop(grad, axis + 1, f["pads"]).astype(dtype, copy=False)


@register(ConvWeightGradOp)
def _conv_weight_grad(node: NodeOp, args: list[np.ndarray], record: Any, dtype: Any) -> np.ndarray:
    assert isinstance(node, ConvGradOp)
    x, g = args
    f = _conv_frame(node, x.shape)
    axis, cin, cout = f["axis"], f["cin"], f["cout"]
    padded = np.pad(x, [(0, 0)] * (axis + 1) + f["pads"])
    gg = _grouped(g, f, cout)
    lead = (slice(None),) * (axis + 1)
    taps = _taps(f["kernel"], f["stride"], f["dilation"], g.shape[axis + 1 :])
    per_tap = [
        np.einsum("bgcp,bgop->goc", _grouped(padded[lead + window], f, cin), gg, optimize=True)
        for window in taps
    ]
    grad = np.stack(per_tap, axis=-1).reshape(node.kernel_shape())  # type: ignore[attr-defined]
    return grad.astype(dtype, copy=False)
