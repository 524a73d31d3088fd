"""crown: linear-relaxation bounds (CROWN), sound in floating point.

CROWN bounds a linear function `Lambda . z_out` of a node's value from below by walking the
graph backwards: every node `z = f(parents)` is replaced by linear functions of its parents
that bound it (exactly for linear ops; a lower and an upper line per neuron for relu, tanh,
sigmoid, chosen by the sign of the coefficient), until only the input node is left, whose box
gives the minimum of a linear function in closed form. Upper bounds are lower bounds of
`-Lambda`, so a pass bounds the rows `[C; -C]` at once. Nonlinear nodes need bounds of their
pre-activation; `prepare_crown(...)(lo, hi, method)` gets them by a backward pass from every
pre-activation node (`method="crown"`) or from the interval boxes (`"crown-ibp"`), and every
node's box is intersected with its interval box, so CROWN is never looser than IBP.

Soundness in floating point (docs/verification.md). The pass keeps, for every row k,

    target_k >= sum over frontier nodes n of <Lambda_n[k], z_n> + c_k - e_k

exactly over the reals, for every input in the box and for both the real value of every node
and the value the reference computes in `dtype`. Coefficients Lambda are whatever floats the
pass computes: a rounded product `fl(Lambda W)` is a different but equally valid coefficient
once the difference `(fl(Lambda W) - Lambda W) . x` is charged to `e`, bounded by
`gamma |Lambda| (|W| mag(x))` with mag(x) from the node's interval box. The `dtype` evaluation's
own rounding `z_d = f(x) + delta` is charged the same way (`|Lambda| |delta|`). Constants `c`
are summed rounding down, errors `e` rounding up; the bound is `down(c - e)`.

`CROWN[OpClass]` is `rule(step, lam, boxes, out) -> Back | None`, one table keyed by op class
(`tlc.core.rule_table.RuleTable`); `None` (or an op the table refuses) concretises the node with
its interval box, the IBP fallback, and the reason is recorded in `Bounds.fallbacks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload, Record
from tlc.core.rule_table import RuleTable
from tlc.dialect import ops
from tlc.dialect.families import Monotone
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.emitter import IntervalEmitter, NoBox
from tlc.semantics.ibp import (
    ABS_WEIGHT,
    INTERVAL,
    PreparedIBP,
    default_eps,
    prepare_ibp,
    reference,
)  # fmt: skip
from tlc.semantics.interpret import bind_inputs
from tlc.semantics.interval_arith import COMPOSITE_ULPS, F64, LIBM_ULPS, Box, Outward, sanitize

__all__ = ["CROWN", "METHODS", "Back", "Bounds", "PreparedCrown", "prepare_crown"]

#: The methods `PreparedCrown` computes: interval boxes only; CROWN with CROWN intermediate
#: bounds; CROWN for the output with interval intermediate bounds.
METHODS = ("ibp", "crown", "crown-ibp")

#: float64 outward rounding: the pass computes in float64 whatever the denotation's dtype.
EXACT = Outward(F64)
_U = EXACT.u
_TINY = EXACT.tiny


def _up(x: Any) -> np.ndarray:
    """`EXACT.up` (one float64 step up, past the exact result of one rounded operation) without
    its per-call checks: the pass runs under `np.errstate(all="ignore")` in float64."""
    return np.nextafter(x, np.inf)


def _down(x: Any) -> np.ndarray:
    """`EXACT.down`, as `_up`."""
    return np.nextafter(x, -np.inf)


@dataclass
class Back:
    """What a rule gives for a node with coefficients `lam` [B, K, *shape]: coefficients per
    parent (by position), and per row a constant and an error bound (both [B, K]) with
    <lam, z> >= sum <parents[i], parent_i> + const - err."""

    parents: dict[int, np.ndarray]
    const: np.ndarray | float = 0.0
    err: np.ndarray | float = 0.0


@dataclass(frozen=True)
class Step:
    """A node as a rule sees it: the node, its parents' ids, its interval record (float64,
    with |W|) and shape, and a cache for data derived once from the node (gather maps)."""

    node: NodeOp
    parents: tuple[int, ...]
    record: Record | None
    shape: Shape
    cache: dict[str, Any] = field(default_factory=dict)


CrownRule = Callable[[Step, np.ndarray, list[Box], Box, Outward], "Back | None"]
CROWN: RuleTable[CrownRule] = RuleTable("crown")
register = CROWN.register

#: Nonlinear ops whose relaxation reads the bounds of their parents (every elementwise unary
#: op but the exact ones, max pool, products, max/min; `_needs_parent_bounds` adds matmul of
#: two variable factors): in method "crown" their parents get a backward pass of their own.
NEEDS_PARENT_BOUNDS: tuple[type, ...] = (
    ops.UnaryOp, ops.MaxPoolOp, ops.MulElemOp, ops.MaxElemOp, ops.MinElemOp
)  # fmt: skip
EXACT_UNARY = (ops.DetachOp, ops.NegOp)


def _needs_parent_bounds(node: NodeOp) -> bool:
    """`NEEDS_PARENT_BOUNDS` but the exact unary ops, and matmul of two variable factors."""
    if isinstance(node, ops.MatmulOp):
        return not any(isinstance(v.owner, ops.ConstOp) for v in node.parents)
    return isinstance(node, NEEDS_PARENT_BOUNDS) and not isinstance(node, EXACT_UNARY)


#: The most coefficients (float64) a backward pass holds at once: a batch of boxes larger than
#: this allows is bounded in several passes (128 MiB of coefficients each).
COEFFICIENTS = 2**24

#: Ops whose interval rule acts on every leading index alike, so a batch of boxes costs one call.
BATCHABLE = (ops.InputOp, ops.ConstOp, ops.UnaryOp, ops.BinaryOp, ops.LinearOp)


@dataclass
class Bounds:
    """The result of `tlc.bounds`: `lower`/`upper` of the output (or of `C y` with a spec
    matrix C), one row per box for a batch; `boxes[k]` every node's box (None where no interval
    rule applies); `fallbacks` node id -> why CROWN used that node's interval box."""

    lower: np.ndarray
    upper: np.ndarray
    boxes: list[Box | None]
    method: str
    fallbacks: dict[int, str]

    def node(self, node_id: int) -> Box | None:
        """The box of node `node_id` (batched boxes carry a leading batch axis)."""
        return self.boxes[node_id]

    @property
    def width(self) -> np.ndarray:
        return self.upper - self.lower


# --------------------------------------------------------------------------------------------
# Rigorous dot products
# --------------------------------------------------------------------------------------------


def _rows(lam: np.ndarray) -> np.ndarray:
    """lam [B, K, *shape] as [B, K, n]."""
    return lam.reshape(lam.shape[:2] + (-1,))


def row_dot(lam: np.ndarray, v: np.ndarray) -> np.ndarray:
    """<lam[b, k], v[b]> for every row (v [B, *shape] or [*shape], one for all boxes), computed
    in float64 (no rounding control): [B, K]. Callers hold `np.errstate(all="ignore")` (the
    backward pass holds it throughout)."""
    v = np.asarray(v, dtype=F64)
    shape = lam.shape[2:]
    if v.shape != shape:
        v = np.broadcast_to(v, (lam.shape[0],) + shape) if v.shape[1:] != shape else v
        return np.matmul(_rows(lam), v.reshape(v.shape[0], -1, 1))[..., 0]
    return np.matmul(_rows(lam), v.reshape(-1, 1))[..., 0]


def _row_dots(lam: np.ndarray, vectors: list[np.ndarray]) -> np.ndarray:
    """<lam[b, k], v_i[b]> for several vectors in one product: [B, K, len(vectors)]."""
    batch = lam.shape[0]
    flat = np.stack([np.broadcast_to(v, (batch,) + lam.shape[2:]).reshape(batch, -1)
                     for v in vectors], axis=-1)  # fmt: skip
    return np.matmul(_rows(lam), flat)


def dot_bound(lam: np.ndarray, v: np.ndarray) -> np.ndarray:
    """An upper bound of <|lam|, v> for v >= 0 (error terms): the float64 sum is within
    gamma_n of exact; we step over it with the factor and one outward step."""
    n = max(numel(lam.shape[2:]), 1)
    return _up(row_dot(np.abs(lam), v) * (1 + EXACT.gamma(n)) + n * _TINY)


def dot_error(lam: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The rounding error of `row_dot(lam, v)` itself: within gamma_n <|lam|, |v|>."""
    n = max(numel(lam.shape[2:]), 1)
    return _up(dot_bound(lam, np.abs(v)) * EXACT.gamma(n) + n * _TINY)


def min_over_box(lam: np.ndarray, box: Box) -> np.ndarray:
    """A lower bound of min over x in box of <lam, x> (box [B, *shape]): centre minus spread,
    rounded down, allowing for gamma_n of both products (`dot_bound`, `dot_error`, here with
    one product of |lam| for both)."""
    n = max(numel(lam.shape[2:]), 1)
    with np.errstate(all="ignore"):
        mid = 0.5 * box.lo + 0.5 * box.hi
        rad = np.nextafter(np.maximum(box.hi - mid, mid - box.lo), np.inf)
        centre = row_dot(lam, mid)
        both = _row_dots(np.abs(lam), [rad, np.abs(mid)]) * (1 + EXACT.gamma(n)) + n * _TINY
        spread = _up(both[..., 0])
        error = _up(_up(both[..., 1]) * EXACT.gamma(n) + n * _TINY)
        value = _down(_down(centre - spread) - error)
    return np.where(np.isnan(value), -np.inf, value)


def magnitude(box: Box) -> np.ndarray:
    return box.magnitude()


# --------------------------------------------------------------------------------------------
# Linear ops
# --------------------------------------------------------------------------------------------


def _linear_errors(
    lam: np.ndarray, forward_abs: np.ndarray, out: Outward, fan_in: int, fan_out: int
) -> np.ndarray:
    """Error of a linear step: our product Lambda W within gamma_{fan_out} |Lambda||W| (float64),
    the denotation's W x + b within gamma_{fan_in} (|W||x| + |b|) (dtype); `forward_abs` is
    |W| mag(x) + |b| at the node's shape."""
    g = EXACT.gamma(fan_out) + out.gamma(fan_in)
    return _up(g * dot_bound(lam, forward_abs))


def _cached(step: Step, key: str, make: Callable[[], Any]) -> Any:
    """A value derived from the node and its parents' boxes, once per `PreparedCrown` call
    (every backward pass of a call sees the same parent boxes; the call clears these keys)."""
    if key not in step.cache:
        step.cache[key] = make()
    return step.cache[key]


#: `Step.cache` keys that hold per-call values (cleared at the start of every call).
PER_CALL = ("forward_abs", "lines")


@register(ops.LinearOp)
def _linear(
    step: Step,
    lam: np.ndarray,
    parents: list[Box],
    own: Box,
    out: Outward,
    identity: bool = False,
) -> Back:
    """Lambda W to the parent, Lambda b to the constant. `identity`: lam is [I; -I] (the rows
    of an intermediate bound), so Lambda W is [W; -W] without a product (when the node has no
    leading axes of more than one element)."""
    record = step.record
    assert record is not None
    w = record["weight"]
    (x,) = parents

    def forward_abs() -> np.ndarray:
        total = np.matmul(magnitude(x), record[ABS_WEIGHT].T)
        return total + np.abs(record["bias"]) if "bias" in record else total

    if identity and numel(x.shape[1:-1]) == 1:  # no leading axes that rows would select
        stacked = np.concatenate([w, -w]).reshape((2 * w.shape[0],) + x.shape[1:])
        into = np.broadcast_to(stacked, lam.shape[:2] + x.shape[1:])
    else:
        into = np.matmul(lam, w)
    const: np.ndarray | float = 0.0
    if "bias" in record:
        const = row_dot(lam, record["bias"])
    abs_x = _cached(step, "forward_abs", forward_abs)
    err = _linear_errors(lam, abs_x, out, w.shape[1] + 1, w.shape[0] + 1)
    return Back({0: into}, const, err)


def _conv_geometry(node: NodeOp) -> dict[str, Any]:
    m = node.metadata()
    m["pads"] = list(zip(m["padding"], m["padding_after"], strict=True))
    return m


def _scatter_taps(
    target: np.ndarray,
    first: int,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    out_extents: tuple[int, ...],
    tap_values: Callable[[tuple[int, ...]], np.ndarray],
) -> None:
    """The adjoint of a sliding-window gather: for every kernel tap, add `tap_values(tap)`
    (shaped like the windowed output) into the padded `target` at the positions that tap read
    (spatial axes from `first`)."""
    for tap in np.ndindex(*kernel):
        index: list[slice] = [slice(None)] * first
        for t, s, d, o in zip(tap, stride, dilation, out_extents, strict=True):
            index.append(slice(t * d, t * d + s * (o - 1) + 1, s))
        target[tuple(index)] += tap_values(tap)


def _crop(padded: np.ndarray, first: int, pads: list[tuple[int, int]], sizes: Shape) -> np.ndarray:
    index = [slice(None)] * first + [
        slice(lo, lo + n) for (lo, _hi), n in zip(pads, sizes, strict=True)
    ]
    return padded[tuple(index)]


@register(ops.ConvOp)
def _conv(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """The adjoint of the convolution (a transposed convolution, tap by tap)."""
    record = step.record
    assert record is not None
    m = _conv_geometry(step.node)
    (x,) = parents
    in_shape = x.shape[1:]
    axis, groups, kernel = m["channel_axis"], m["groups"], tuple(m["kernel"])
    cin, cout = m["in_channels"], m["out_channels"]
    lead = lam.shape[: 2 + axis]
    out_sp = step.shape[axis + 1 :]
    in_sp = in_shape[axis + 1 :]
    g_lam = lam.reshape(lead + (groups, cout // groups) + out_sp)
    weight = record["weight"].reshape((groups, cout // groups, cin // groups) + kernel)
    padded_sp = tuple(n + lo + hi for n, (lo, hi) in zip(in_sp, m["pads"], strict=True))
    target = np.zeros(lead + (groups, cin // groups) + padded_sp)
    letters = "abcdefghijklmnop"[: len(out_sp)]
    spec = f"...go{letters},goc->...gc{letters}"

    def tap_values(tap: tuple[int, ...]) -> np.ndarray:
        return np.einsum(spec, g_lam, weight[(Ellipsis, *tap)], optimize=True)

    with np.errstate(all="ignore"):
        _scatter_taps(target, len(lead) + 2, kernel, m["stride"], m["dilation"], out_sp, tap_values)
    into = _crop(target, len(lead) + 2, m["pads"], in_sp).reshape(lead + (cin,) + in_sp)
    magnitude_record = {"weight": record[ABS_WEIGHT]}
    forward_abs = np.stack(
        [reference(step.node, magnitude(x)[b], record=magnitude_record) for b in range(len(x.lo))]
    )
    const: np.ndarray | float = 0.0
    if "bias" in record:
        bias = record["bias"].reshape((cout,) + (1,) * len(kernel))
        const = row_dot(lam, np.broadcast_to(bias, step.shape))
        forward_abs = forward_abs + np.abs(bias)
    fan_in = cin // groups * math.prod(kernel) + 1
    fan_out = cout // groups * math.prod(kernel) + 1
    return Back({0: into}, const, _linear_errors(lam, forward_abs, out, fan_in, fan_out))


@register(ops.AvgPoolOp)
def _avg_pool(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """The adjoint of averaging with zero padding counted: each output's coefficient / k spread
    over its window."""
    m = step.node.metadata()
    kernel, stride, padding = tuple(m["kernel"]), tuple(m["stride"]), m["padding"]
    (x,) = parents
    in_shape = x.shape[1:]
    first = 1 + len(in_shape) - len(kernel)  # in lam's axes: B, K, leading..., spatial
    pads = [(p, p) for p in padding]
    sizes = in_shape[len(in_shape) - len(kernel) :]
    padded = tuple(n + 2 * p for n, p in zip(sizes, padding, strict=True))
    target = np.zeros(lam.shape[: first + 1] + padded)
    k = math.prod(kernel)
    share = lam / k
    out_sp = step.shape[len(step.shape) - len(kernel) :]
    _scatter_taps(target, first + 1, kernel, stride, (1,) * len(kernel), out_sp, lambda t: share)
    into = _crop(target, first + 1, pads, sizes)
    forward_abs = np.stack([reference(step.node, magnitude(x)[b]) for b in range(len(x.lo))])
    err = _linear_errors(lam, forward_abs, out, k + 1, k + 1)
    return Back({0: into}, 0.0, err)


def _reduced_axis(node: NodeOp, parent_shape: Shape) -> tuple[int, ...]:
    if isinstance(node, ops.SumOp):
        return tuple(range(len(parent_shape)))
    return (node.meta("axis"),)


@register(ops.SumOp, ops.ReduceSumOp, ops.ReduceMeanOp)
def _reduction(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """The adjoint of a sum over axes: the coefficient broadcast back (divided by n for the
    mean); the denotation's sum is within gamma_n of the sum of magnitudes."""
    (x,) = parents
    shape = x.shape[1:]
    axes = _reduced_axis(step.node, shape)
    n = math.prod(shape[a] for a in axes)
    spread = np.expand_dims(lam, tuple(2 + a for a in axes))
    into = np.broadcast_to(spread, lam.shape[:2] + shape)
    if isinstance(step.node, ops.ReduceMeanOp):
        into = into / n
    total = np.sum(magnitude(x), axis=tuple(1 + a for a in axes))
    err = _linear_errors(lam, total, out, n + 1, 2)
    return Back({0: into}, 0.0, err)


@register(ops.AddOp, ops.SubOp)
def _add_sub(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """Exact over the reals; the denotation's sum is within u of the result."""
    sign = -1.0 if isinstance(step.node, ops.SubOp) else 1.0
    err = _up(2 * out.u * dot_bound(lam, magnitude(own)))
    return Back({0: lam, 1: sign * lam}, 0.0, err)


@register(ops.MatmulOp)
def _matmul(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back | None:
    """A product with a constant factor is linear in the other; two variable factors get
    McCormick's planes per product (`_bilinear`)."""
    a, b = parents
    const_a, const_b = (isinstance(v.owner, ops.ConstOp) for v in step.node.parents)
    if const_b:
        matrix = b.lo[0]
        into = np.matmul(lam, np.swapaxes(matrix, -1, -2))
        forward_abs = np.matmul(magnitude(a), np.abs(matrix))
        return Back({0: into}, 0.0, _matmul_err(lam, forward_abs, matrix, out))
    if const_a:
        matrix = a.lo[0]
        into = np.matmul(np.swapaxes(matrix, -1, -2), lam)
        forward_abs = np.matmul(np.abs(matrix), magnitude(b))
        return Back({1: into}, 0.0, _matmul_err(lam, forward_abs, matrix, out))
    if not _bounded(a, b):
        return None
    return _bilinear(lam, a, b, out)


def _bilinear(lam: np.ndarray, a: Box, b: Box, out: Outward) -> Back:
    """y = A B with both factors variable: every product a_mn b_np between McCormick's planes
    (as `mul_lines`): b_l a + a_l b - a_l b_l below, b_u a + a_l b - a_l b_u above, so
    Lambda+ takes the lower planes and Lambda- the upper ones: to A, Lambda+ b_l^T + Lambda-
    b_u^T; to B, a_l^T Lambda; to the constant, -<Lambda+, a_l b_l> - <Lambda-, a_l b_u>.
    Charged: our three products (gamma of their lengths times the magnitudes), the constant's
    two matrix products, and the denotation's dot products, gamma_n (|A| |B|)."""
    swap = lambda v: np.swapaxes(v, -1, -2)  # noqa: E731
    a_lo, b_lo, b_hi = a.lo[:, None], b.lo[:, None], b.hi[:, None]
    plus, minus = np.maximum(lam, 0.0), np.minimum(lam, 0.0)
    m, n, p = a.shape[-2], a.shape[-1], b.shape[-1]
    into_a = np.matmul(plus, swap(b_lo)) + np.matmul(minus, swap(b_hi))
    into_b = np.matmul(swap(a_lo), lam)
    low_plane, high_plane = np.matmul(a.lo, b.lo), np.matmul(a.lo, b.hi)
    const = -row_dot(plus, low_plane) - row_dot(minus, high_plane)
    mag_a, mag_b = magnitude(a), magnitude(b)
    b_mag = np.maximum(np.abs(b.lo), np.abs(b.hi))
    a_abs = np.abs(a.lo)
    planes = np.matmul(a_abs, b_mag)  # bounds |a_l b_l| and |a_l b_u| summed over n
    err = (
        EXACT.gamma(p + 1) * dot_bound(lam, np.matmul(mag_a, b_mag))
        + EXACT.gamma(m) * dot_bound(lam, np.matmul(a_abs, mag_b))
        + (EXACT.gamma(n) + EXACT.gamma(numel(lam.shape[2:]) + 2)) * dot_bound(lam, planes)
        + out.gamma(n) * dot_bound(lam, np.matmul(mag_a, mag_b))
    )
    return Back({0: into_a, 1: into_b}, const, _up(err * (1 + 8 * _U)))


def _matmul_err(lam: np.ndarray, forward_abs: np.ndarray, matrix: np.ndarray, out: Outward):
    inner = matrix.shape[-2] + matrix.shape[-1] + 1
    return _linear_errors(lam, forward_abs, out, inner, inner)


@register(ops.BatchNormEvalOp)
def _batch_norm(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """y = (x - mean) s + beta with s = gamma / sqrt(var + eps) per channel, s held as an
    interval (it encloses the exact scale and the one the dtype computes): the midpoint of s is
    the coefficient, its radius times |x - mean| joins the error with the dtype's three
    roundings."""
    record = step.record
    assert record is not None
    (x,) = parents
    shape = x.shape[1:]
    axis = step.node.meta("channel_axis")
    view = [1] * len(shape)
    view[axis] = shape[axis]

    def channel(name: str) -> np.ndarray:
        return record[name].reshape(view)

    root = out.monotone(
        out.add(Box.point(channel("var")), default_eps(step.node, record, out)), np.sqrt, 1
    )
    scale = out.div(Box.point(channel("gamma")), root)
    if scale is None:
        return None  # type: ignore[return-value]
    s_mid = 0.5 * scale.lo + 0.5 * scale.hi
    s_rad = _up(np.maximum(scale.hi - s_mid, s_mid - scale.lo))
    shift = channel("beta") - channel("mean") * s_mid
    into = lam * s_mid
    const = row_dot(lam, np.broadcast_to(shift, shape))
    centred = magnitude(x) + np.abs(channel("mean"))
    s_mag = np.maximum(np.abs(scale.lo), np.abs(scale.hi))
    rounding = 4 * (out.u + _U) * (centred * s_mag + np.abs(channel("beta")))
    err = dot_bound(lam, s_rad * centred + rounding) * (1 + 8 * _U)
    return Back({0: into}, const, _up(err + dot_error(lam, np.broadcast_to(shift, shape))))


# --------------------------------------------------------------------------------------------
# Ops that move values: the adjoint of a gather
# --------------------------------------------------------------------------------------------


def _gather_map(step: Step, parent_shapes: list[Shape]) -> np.ndarray:
    """out_flat[j] = concat(parents_flat)[map[j]]: the op's reference rule applied to the
    positions 0, 1, 2, ... (exact in float64), computed once per node."""
    if "gather" not in step.cache:
        offsets = np.cumsum([0] + [numel(s) for s in parent_shapes])
        positions = [
            np.arange(offsets[i], offsets[i + 1], dtype=F64).reshape(s)
            for i, s in enumerate(parent_shapes)
        ]
        moved = reference(step.node, *positions).astype(np.int64).ravel()
        counts = np.bincount(moved, minlength=int(offsets[-1]))
        step.cache["gather"] = (moved, offsets, int(counts.max(initial=1)))
    return step.cache["gather"]


@register(
    ops.DetachOp, ops.PermuteOp, ops.TransposeOp, ops.ReshapeOp, ops.FlattenOp, ops.ConcatOp,
    ops.BroadcastToOp, ops.GatherOp,
)  # fmt: skip
def _moves(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """Each output element is one parent element: its coefficient goes back to that element
    (summed where broadcasting repeats one, the only case with rounding)."""
    shapes = [p.shape[1:] for p in parents]
    moved, offsets, repeats = _gather_map(step, shapes)
    flat = _rows(lam)
    back = np.zeros(flat.shape[:2] + (int(offsets[-1]),))
    err: np.ndarray | float = 0.0
    if repeats == 1:
        back[..., moved] = flat
    else:
        np.add.at(back, (slice(None), slice(None), moved), flat)
        err = _up(EXACT.gamma(repeats) * dot_bound(lam, magnitude(own)))
    into = {
        i: back[..., offsets[i] : offsets[i + 1]].reshape(lam.shape[:2] + shape)
        for i, shape in enumerate(shapes)
    }
    return Back(into, 0.0, err)


# --------------------------------------------------------------------------------------------
# Elementwise nonlinear ops: a lower and an upper line per neuron
# --------------------------------------------------------------------------------------------


def _relaxed(
    lam: np.ndarray,
    lines: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    parent: Box,
    own: Box,
    denotation_err: np.ndarray | None,
) -> Back:
    """y >= s_lo z + b_lo and y <= s_hi z + b_hi (each [B, *shape], exact as floats): rows
    with a positive coefficient take the lower line, negative ones the upper line (see
    `_relaxed_lines`, the same for lines in several parents)."""
    s_lo, b_lo, s_hi, b_hi = lines
    return _relaxed_lines(lam, ([s_lo], b_lo, [s_hi], b_hi), [parent], own, denotation_err)


def _relaxed_lines(
    lam: np.ndarray,
    lines: tuple[list[np.ndarray], np.ndarray, list[np.ndarray], np.ndarray],
    parents: list[Box],
    own: Box,
    denotation_err: np.ndarray | None,
) -> Back:
    """y >= sum_i s_lo[i] z_i + b_lo and y <= sum_i s_hi[i] z_i + b_hi (each [B, *shape],
    exact as floats), z_i the parents: rows with a positive coefficient take the lower line,
    negative ones the upper line. Our products are charged u |new coefficient| mag(z_i), the
    constant's dot product its gamma_n, and `denotation_err` (>= |y_dtype - f(z)|, None when
    exact) times |lam|."""
    s_lo, b_lo, s_hi, b_hi = lines
    positive = lam >= 0
    into = {
        i: lam * np.where(positive, lo[:, None], hi[:, None])
        for i, (lo, hi) in enumerate(zip(s_lo, s_hi, strict=True))
    }
    const = row_dot(np.where(positive, lam, 0.0), b_lo) + row_dot(
        np.where(positive, 0.0, lam), b_hi
    )
    n = max(numel(lam.shape[2:]), 1)
    err = EXACT.gamma(n + 1) * dot_bound(lam, np.maximum(np.abs(b_lo), np.abs(b_hi)))
    for i, coefficient in into.items():
        err = err + _U * dot_bound(coefficient, magnitude(parents[i]))
    if denotation_err is not None:
        err = err + dot_bound(lam, denotation_err)
    return Back(into, const, _up((err + 2 * n * _TINY) * (1 + 8 * _U)))


def relu_lines(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, ...]:
    """CROWN's relu relaxation on [lo, hi]: stable neurons exactly (z or 0); unstable ones the
    chord s (z - lo) above (s = u / (u - l) rounded up, its intercept -s l rounded up: the line
    only moves up) and the adaptive lower line: z when u >= -l, else 0."""
    active, dead = lo >= 0, hi <= 0
    unstable = ~(active | dead)
    with np.errstate(all="ignore"):
        slope = _up(hi / _down(hi - lo))
        intercept = _up(-slope * lo)
    s_hi = np.where(active, 1.0, np.where(unstable, slope, 0.0))
    b_hi = np.where(unstable, intercept, 0.0)
    s_lo = np.where(active, 1.0, np.where(unstable & (hi >= -lo), 1.0, 0.0))
    return s_lo, np.zeros_like(lo), s_hi, b_hi


@register(ops.ReluOp)
def _relu(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back | None:
    (z,) = parents
    if not (np.all(np.isfinite(z.lo)) and np.all(np.isfinite(z.hi))):
        return None
    lines = _cached(step, "lines", lambda: relu_lines(z.lo, z.hi))
    return _relaxed(lam, lines, z, own, None)


@dataclass(frozen=True)
class SShape:
    """An increasing function, convex below 0 and concave above (tanh, sigmoid): the function,
    its derivative, the negative x with f'(x) = s (NaN if none), its range, the denotation's
    error in ULPs."""

    f: Callable[[np.ndarray], np.ndarray]
    df: Callable[[np.ndarray], np.ndarray]
    critical: Callable[[np.ndarray], np.ndarray]
    bottom: float
    top: float
    ulps: int


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _sigmoid_critical(s: np.ndarray) -> np.ndarray:
    low = 0.5 * (1.0 - np.sqrt(1.0 - 4.0 * s))
    return np.log(low) - np.log1p(-low)


S_SHAPES: dict[type[NodeOp], SShape] = {
    ops.TanhOp: SShape(
        np.tanh,
        lambda x: 1.0 - np.tanh(x) ** 2,
        lambda s: -np.arctanh(np.sqrt(1.0 - s)),
        -1.0,
        1.0,
        LIBM_ULPS,
    ),
    ops.SigmoidOp: SShape(
        _sigmoid,
        lambda x: _sigmoid(x) * (1.0 - _sigmoid(x)),
        _sigmoid_critical,
        0.0,
        1.0,
        COMPOSITE_ULPS,
    ),
}


def _extreme(shape: SShape, s: np.ndarray, lo: np.ndarray, hi: np.ndarray, lower: bool):
    """A rigorous bound of min (lower) or max of g(x) = f(x) - s x over [lo, hi].

    f is convex on x <= 0 and concave on x >= 0. On the convex part a minimum of g is bounded
    by the tangent of g at any point t of that part (g >= g(t) + g'(t)(x - t)), at the
    part's ends; on the concave part the minimum is at an end. The maximum is the mirror
    image. t is the critical point f'(t) = s clipped into the part (any t gives a valid
    bound; the critical point gives the tight one). Evaluation errors of f, f' and the few
    products are far below 1e-12 (1 + (1 + |s|) M) with M the larger end magnitude."""
    sign = 1.0 if lower else -1.0
    with np.errstate(all="ignore"):

        def g(x: np.ndarray) -> np.ndarray:
            return shape.f(x) - s * x

        # the part where g has curvature of the helpful sign: convex part for a minimum
        if lower:
            a, b = lo, np.minimum(hi, 0.0)
        else:
            a, b = np.maximum(lo, 0.0), hi
        has = a <= b
        t = sign * shape.critical(s)
        t = np.where(np.isnan(t), 0.5 * (a + b), np.clip(t, a, b))
        slope = shape.df(t) - s
        tangent_a = g(t) + slope * (a - t)
        tangent_b = g(t) + slope * (b - t)
        pick = np.minimum if lower else np.maximum
        curved = np.where(has, pick(tangent_a, tangent_b), np.nan)
        ends = pick(g(lo), g(hi))
        zero = np.where((lo <= 0) & (hi >= 0), g(np.zeros_like(lo)), np.nan)
        best = pick(pick(ends, np.where(np.isnan(curved), ends, curved)),
                    np.where(np.isnan(zero), ends, zero))  # fmt: skip
        m = np.maximum(np.abs(lo), np.abs(hi))
        slack = 1e-12 * (1.0 + (1.0 + np.abs(s)) * m)
        return _down(best - slack) if lower else _up(best + slack)


def s_shape_lines(shape: SShape, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, ...]:
    """Tangent/secant lines: below 0 (convex) the chord above and the tangent at the midpoint
    below; above 0 the mirror image; across 0 both with slope min(f'(l), f'(u)). Each line's
    intercept is the rigorous extreme of f(x) - s x over the box (`_extreme`), so any slope
    gives a sound line; the slope only decides tightness. Unbounded boxes use the range."""
    with np.errstate(all="ignore"):
        width = hi - lo
        chord = np.where(width > 0, (shape.f(hi) - shape.f(lo)) / width, shape.df(lo))
        tangent = shape.df(0.5 * lo + 0.5 * hi)
        across = np.minimum(shape.df(lo), shape.df(hi))
        s_lo = np.where(hi <= 0, tangent, np.where(lo >= 0, chord, across))
        s_hi = np.where(hi <= 0, chord, np.where(lo >= 0, tangent, across))
        finite = np.isfinite(lo) & np.isfinite(hi)
        s_lo = np.where(finite & np.isfinite(s_lo), s_lo, 0.0)
        s_hi = np.where(finite & np.isfinite(s_hi), s_hi, 0.0)
        b_lo = _extreme(shape, s_lo, lo, hi, lower=True)
        b_hi = _extreme(shape, s_hi, lo, hi, lower=False)
    b_lo = np.where(finite & np.isfinite(b_lo), b_lo, shape.bottom)
    b_hi = np.where(finite & np.isfinite(b_hi), b_hi, shape.top)
    return s_lo, b_lo, s_hi, b_hi


def _s_shaped(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    shape = S_SHAPES[type(step.node)]
    (z,) = parents
    lines = _cached(step, "lines", lambda: s_shape_lines(shape, z.lo, z.hi))
    # the denotation: f_dtype(z) within `ulps` ULPs (of dtype) of f(z); one ULP is at most
    # 2 u |f(z)| and |f(z)| <= mag(own) (1 + small): 4 ulps u mag(own) with room
    denotation = 4 * shape.ulps * out.u * magnitude(own) + shape.ulps * out.tiny
    return _relaxed(lam, lines, z, own, denotation)


register(ops.TanhOp, ops.SigmoidOp)(_s_shaped)


@register(ops.NegOp)
def _neg(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """Exact: -x is exact in every scalar type."""
    return Back({0: -lam})


def _bounded(*boxes: Box) -> bool:
    return all(np.all(np.isfinite(b.lo)) and np.all(np.isfinite(b.hi)) for b in boxes)


#: Pieces of the input box in the derived relaxation (`piecewise_lines`).
PIECES = 32


def _grid(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """PIECES + 2 sorted points from lo to hi (ends exact), 0 among them where lo < 0 < hi
    (the kink of relu-like ops)."""
    t = np.linspace(0.0, 1.0, PIECES + 1)
    with np.errstate(all="ignore"):
        even = np.minimum(lo[..., None] + (hi - lo)[..., None] * t, hi[..., None])
    even[..., 0], even[..., -1] = lo, hi
    return np.sort(np.concatenate([even, np.clip(0.0, lo, hi)[..., None]], axis=-1), axis=-1)


def _intercepts(
    s: np.ndarray, a: np.ndarray, b: np.ndarray, piece: Box, ends: Box | None, slope: Box | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rigorous min and max of g(z) = f(z) - s z over [lo, hi], piece by piece ([a_j, b_j]).

    Always: f(z) in the piece's box [f_j, F_j], so g >= f_j - max(s a_j, s b_j) and <= F_j -
    min(s a_j, s b_j). With `ends` (f enclosed at a_j and b_j, [..., pieces + 1]) and `slope`
    (f' enclosed on each piece, [D_j, E_j]), also the mean-value bounds g(z) >= g(a_j) + w_j
    min(D_j - s, 0) and >= g(b_j) - w_j max(E_j - s, 0) (w_j = b_j - a_j), and the mirror images
    above: exact where g is linear on a piece, so piecewise-linear ops get their lines exactly."""
    sv = s[..., None]
    with np.errstate(all="ignore"):
        sa, sb = sv * a, sv * b
        low = _down(piece.lo - _up(np.maximum(sa, sb)))
        high = _up(piece.hi - _down(np.minimum(sa, sb)))
        if ends is not None and slope is not None:
            w = _up(b - a)
            g_lo = _down(ends.lo - _up(sv * np.concatenate([a, b[..., -1:]], -1)))
            g_hi = _up(ends.hi - _down(sv * np.concatenate([a, b[..., -1:]], -1)))
            fall = _down(w * np.minimum(_down(slope.lo - sv), 0.0))  # <= 0
            rise = _up(w * np.maximum(_up(slope.hi - sv), 0.0))  # >= 0
            low = np.fmax(low, np.fmax(_down(g_lo[..., :-1] + fall),
                                       _down(g_lo[..., 1:] - rise)))  # fmt: skip
            high = np.fmin(high, np.fmin(_up(g_hi[..., :-1] + rise),
                                         _up(g_hi[..., 1:] - fall)))  # fmt: skip
    return np.min(low, axis=-1), np.max(high, axis=-1)


#: Nodes `_ReusingEmitter` has built, by op, operand shapes and metadata (cleared when large).
_NODES: dict[tuple[Any, ...], NodeOp] = {}


class _ReusingEmitter(IntervalEmitter):
    """`IntervalEmitter` that builds each distinct node once: a derivative fact evaluated on
    boxes binds the same few ops on every call, and building an op is most of its cost. The
    interval rules read only a node's metadata, so an equal node serves every call."""

    def node(
        self,
        cls: type[NodeOp],
        operands: list[Box],
        attributes: Mapping[str, Any] | None = None,
        shape: Shape | None = None,
    ) -> NodeOp:
        fields = repr(sorted((attributes or {}).items()))
        key = (cls, tuple(v.shape for v in operands), fields, shape)
        if key not in _NODES:
            if len(_NODES) > 4096:
                _NODES.clear()
            _NODES[key] = super().node(cls, operands, attributes, shape)
        return _NODES[key]


def piecewise_lines(
    node: NodeOp, record: Record | None, lo: np.ndarray, hi: np.ndarray, out: Outward
) -> tuple[tuple[np.ndarray, ...], bool] | None:
    """Lines for an elementwise unary op derived from its facts (its interval rule and, for a
    monotone op, its derivative), and whether they bound only the real function (then the
    caller charges the denotation's error).

    [lo, hi] is cut into pieces (`_grid`); the interval rule gives f's box on each piece and
    at each grid point. Candidate slopes: the chord through the ends and the secants of the
    first and last pieces (f'(lo), f'(hi) for a kinked op); each candidate's intercepts are
    rigorous (`_intercepts`) whatever the slope, and the lower line kept is the one highest at
    the box's midpoint, the upper one the lowest: the smallest area between line and function
    (for relu-like ops CROWN's adaptive choice: slope 1 when hi >= -lo). A monotone op (its
    endpoint rule) also gets the mean-value bounds from its derivative's interval on each
    piece, taken with float64 constants: they hold for the real function, which is continuous
    (every elementwise op of tl is, on its domain). None where a rule gives no box."""
    rule = INTERVAL.get(type(node))
    if rule is None:
        return None
    grid = _grid(lo, hi)
    a, b = grid[..., :-1], grid[..., 1:]
    piece, ends = rule(node, [Box(a, b)], record, out), rule(node, [Box(grid, grid)], record, out)
    if piece is None or ends is None:
        return None
    piece = Box(*np.broadcast_arrays(piece.lo, piece.hi))
    ends = Box(*np.broadcast_arrays(ends.lo, ends.hi))
    slope = None
    monotone = node.monotone() is not Monotone.NONE  # type: ignore[attr-defined]
    if monotone and type(node).defines("derivative"):
        try:
            real = rule(node, [Box(a, b)], record, EXACT)
            slope = node.derivative(_ReusingEmitter(INTERVAL, EXACT), Box(a, b), real)  # type: ignore[attr-defined]
        except NoBox:
            slope = None
    mid_at = 0.5 * ends.lo + 0.5 * ends.hi
    with np.errstate(all="ignore"):
        chord = (mid_at[..., -1] - mid_at[..., 0]) / (hi - lo)
        first = (mid_at[..., 1] - mid_at[..., 0]) / (grid[..., 1] - grid[..., 0])
        last = (mid_at[..., -1] - mid_at[..., -2]) / (grid[..., -1] - grid[..., -2])
    candidates = [np.where(np.isfinite(c), c, 0.0) for c in (last, first, chord)]
    middle = 0.5 * lo + 0.5 * hi
    lower: tuple[np.ndarray, ...] = ()
    upper: tuple[np.ndarray, ...] = ()
    for s in candidates:
        low, high = _intercepts(s, a, b, piece, ends, slope)
        with np.errstate(all="ignore"):
            new_lo, new_hi = (s, low, s * middle + low), (s, high, s * middle + high)
        if not lower:
            lower, upper = new_lo, new_hi
            continue
        better_lo, better_hi = new_lo[2] > lower[2], new_hi[2] < upper[2]
        lower = tuple(np.where(better_lo, n, o) for n, o in zip(new_lo, lower, strict=True))
        upper = tuple(np.where(better_hi, n, o) for n, o in zip(new_hi, upper, strict=True))
    (s_lo, b_lo, _), (s_hi, b_hi, _) = lower, upper
    if not (np.all(np.isfinite(b_lo)) and np.all(np.isfinite(b_hi))):
        return None
    return (s_lo, b_lo, s_hi, b_hi), slope is not None


def _piecewise(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward):
    """Any elementwise unary op with an interval rule (`piecewise_lines`). Lines of the real
    function are charged the denotation's error: within `ULPS` of the dtype (one more in a
    narrower run, for constants rounded to it), at most 4 (ULPS + 1) u mag(own)."""
    (z,) = parents
    if not _bounded(z):
        return None
    found = _cached(step, "lines", lambda: piecewise_lines(step.node, step.record, z.lo, z.hi, out))
    if found is None:
        return None
    lines, real_only = found
    denotation = None
    if real_only:
        ulps = type(step.node).ULPS + (0 if out.dtype is F64 else 1)
        denotation = 4 * ulps * out.u * magnitude(own) + ulps * out.tiny
    return _relaxed(lam, lines, z, own, denotation)


def _pool_map(step: Step, parent_shape: Shape) -> np.ndarray:
    """[*output shape, window] flat parent positions of each output's window (-1: padding),
    from the reference's window gather on the positions 0, 1, 2, ..., once per node."""
    from tlc.semantics.reference import _pool_windows

    if "windows" not in step.cache:
        positions = np.arange(numel(parent_shape), dtype=F64).reshape(parent_shape)
        windows = _pool_windows(step.node, positions, -1.0)
        step.cache["windows"] = windows.reshape(step.shape + (-1,)).astype(np.int64)
    return step.cache["windows"]


@register(ops.MaxPoolOp)
def _max_pool(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward):
    """The max of a window is >= its element x_j with the largest lower end (the lower line);
    it equals x_j when that lower end is >= every other element's upper end, else it is <= the
    largest upper end (the upper line, a constant), as auto_LiRPA's max pool. Exact in every
    scalar type (the max is one of its inputs)."""
    (x,) = parents
    windows = _pool_map(step, x.shape[1:])
    if not _bounded(x) or windows.shape[-1] == 0 or np.any(np.all(windows < 0, axis=-1)):
        return None
    batch, rows = lam.shape[:2]
    valid = windows >= 0
    at = np.where(valid, windows, 0)
    low = np.where(valid, x.lo.reshape(batch, -1)[:, at], -np.inf)
    high = np.where(valid, x.hi.reshape(batch, -1)[:, at], -np.inf)
    pick = np.argmax(low, axis=-1)[..., None]
    chosen = np.take_along_axis(np.broadcast_to(at, low.shape), pick, axis=-1)[..., 0]
    best_low = np.take_along_axis(low, pick, axis=-1)[..., 0]
    others = np.where(np.arange(low.shape[-1]) == pick, -np.inf, high)
    dominant = best_low >= np.max(others, axis=-1)
    top = np.max(high, axis=-1)
    to_x = np.where((lam >= 0) | dominant[:, None], lam, 0.0)
    to_const = np.where((lam < 0) & ~dominant[:, None], lam, 0.0)
    n = numel(x.shape[1:])
    target = (np.arange(batch * rows)[:, None] * n).reshape(batch, rows, 1)
    target = target + chosen.reshape(batch, 1, -1)
    into = np.bincount(target.ravel(), weights=_rows(to_x).ravel(), minlength=batch * rows * n)
    into = into.reshape((batch, rows) + x.shape[1:])
    # the scattered sums: each parent element collects at most `window` coefficients
    chosen_mag = magnitude(x).reshape(batch, -1)[
        np.arange(batch)[:, None], chosen.reshape(batch, -1)
    ]
    err = EXACT.gamma(windows.shape[-1]) * dot_bound(to_x, chosen_mag.reshape(top.shape))
    err = _up(err + dot_error(to_const, top))
    return Back({0: into}, row_dot(to_const, top), err)


def mul_lines(a: Box, b: Box) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray], np.ndarray]:
    """McCormick planes of a b on a box: a b >= b_lo a + a_lo b - a_lo b_lo (as (a - a_lo)(b -
    b_lo) >= 0) and a b <= b_hi a + a_lo b - a_lo b_hi (as (a - a_lo)(b - b_hi) <= 0), the
    planes auto_LiRPA takes; the intercepts rounded outward."""
    with np.errstate(all="ignore"):
        low = _down(-_up(a.lo * b.lo))
        high = _up(-_down(a.lo * b.hi))
    return [b.lo, a.lo], low, [b.hi, a.lo], high


@register(ops.MulElemOp)
def _mul(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward):
    a, b = parents
    if not _bounded(a, b):
        return None
    # the denotation: a_d b_d rounded once, within u |y|
    lines = _cached(step, "lines", lambda: mul_lines(a, b))
    return _relaxed_lines(lam, lines, [a, b], own, 2 * out.u * magnitude(own) + out.tiny)


def max_lines(a: Box, b: Box) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray], np.ndarray]:
    """max(a, b) = b + relu(a - b) with a - b in [dl, du]: a (or b) where it dominates;
    otherwise relu's lines: below, a if du >= -dl else b (CROWN's adaptive choice); above,
    b + s (a - b - dl) with s = du / (du - dl) rounded up, written s a + t b + c with t the
    float 1 - s and c covering -s dl and the rounding of t (|1 - s - t| mag(b))."""
    with np.errstate(all="ignore"):
        dl, du = _down(a.lo - b.hi), _up(a.hi - b.lo)
        s = np.clip(_up(du / _down(du - dl)), 0.0, 1.0)
        t = 1.0 - s
        c = _up(_up(-s * dl) + _up(_U * b.magnitude()))
    a_wins, b_wins = dl >= 0, du <= 0
    unstable = ~(a_wins | b_wins)
    one, zero = np.ones_like(dl), np.zeros_like(dl)
    pick_a = a_wins | (unstable & (du >= -dl))
    lower = [np.where(pick_a, one, zero), np.where(pick_a, zero, one)]
    upper = [np.where(unstable, s, np.where(a_wins, one, zero)),
             np.where(unstable, t, np.where(a_wins, zero, one))]  # fmt: skip
    return lower, zero, upper, np.where(unstable, c, 0.0)


@register(ops.MaxElemOp, ops.MinElemOp)
def _max_min(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward):
    """`max_lines`; min(a, b) = -max(-a, -b), its lines the negated ones of the negated boxes.
    Exact in every scalar type (the result is one of the inputs)."""
    a, b = parents
    if not _bounded(a, b):
        return None
    if isinstance(step.node, ops.MaxElemOp):
        return _relaxed_lines(
            lam, _cached(step, "lines", lambda: max_lines(a, b)), [a, b], own, None
        )
    negated = _cached(step, "lines", lambda: max_lines(Box(-a.hi, -a.lo), Box(-b.hi, -b.lo)))
    lower, b_lo, upper, b_hi = negated
    return _relaxed_lines(lam, (upper, -b_hi, lower, -b_lo), [a, b], own, None)


@register(ops.ConstOp)
def _const(step: Step, lam: np.ndarray, parents: list[Box], own: Box, out: Outward) -> Back:
    """A point: its contribution is a number."""
    value = own.lo
    return Back({}, row_dot(lam, value), dot_error(lam, value))


# --------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------


@dataclass
class PreparedCrown:
    """A checked graph with its records, for bounds of many boxes: `(lo, hi, method, C)`."""

    ibp: PreparedIBP
    steps: list[Step]
    input_ids: tuple[int, ...]
    output_id: int

    @property
    def input_id(self) -> int:
        """The input node of a graph with one (`single_input` checks there is one)."""
        return self.input_ids[0]

    def single_input(self, what: str) -> int:
        """The only input node; a diagnostic naming `what` needs one otherwise."""
        if len(self.input_ids) != 1:
            raise DiagnosticError.simple(
                f"{what}: graph @{self.ibp.graph.graph_name} has {len(self.input_ids)} input "
                "nodes; it takes a graph with one input node"
            )
        return self.input_ids[0]

    def __call__(
        self,
        lo: np.ndarray | dict[int, np.ndarray],
        hi: np.ndarray | dict[int, np.ndarray],
        method: str = "crown",
        spec: np.ndarray | None = None,
    ) -> Bounds:
        """Bounds for the boxes [lo, hi] ([B, *input shape], one box per row; `{input node id:
        array}` for a graph with several input nodes) of the output, or of spec @ output (spec
        [K, numel(output)]), by `method` (see `METHODS`)."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if spec is not None:  # checked (a matrix, one column per output element) before use
            spec = self._spec(spec)
        fallbacks: dict[int, str] = {}
        for step in self.steps:
            for key in PER_CALL:
                step.cache.pop(key, None)
        if not isinstance(lo, dict):
            lo, hi = {self.single_input("bounds"): lo}, {self.input_id: hi}
        assert isinstance(hi, dict)
        batch = next(iter(lo.values())).shape[0]
        chunk = self._chunk(spec)
        if batch > chunk:  # bound the coefficient arrays' memory: a few calls of `chunk` boxes
            parts = [
                self({i: v[k : k + chunk] for i, v in lo.items()},
                     {i: v[k : k + chunk] for i, v in hi.items()}, method, spec)
                for k in range(0, batch, chunk)
            ]  # fmt: skip
            return Bounds(
                np.concatenate([b.lower for b in parts]),
                np.concatenate([b.upper for b in parts]),
                [None if any(b.boxes[i] is None for b in parts)
                 else Box(np.concatenate([b.boxes[i].lo for b in parts]),
                          np.concatenate([b.boxes[i].hi for b in parts]))
                 for i in range(len(self.steps))],
                method,
                {k: v for b in parts for k, v in b.fallbacks.items()},
            )  # fmt: skip
        boxes = self._interval_boxes(lo, hi)
        if method != "ibp" and boxes[self.output_id] is not None:
            self._tighten(boxes, method, fallbacks)
        out_box = boxes[self.output_id]
        if out_box is None:
            raise DiagnosticError.simple(
                f"bounds: the output node {self.output_id} has no interval box (a parent leaves "
                "an op's domain); no bound can be given"
            )
        matrix = self._spec(spec)
        batch = out_box.lo.shape[0]
        rows = np.broadcast_to(matrix, (batch,) + matrix.shape)
        rows = rows.reshape((batch, matrix.shape[0]) + out_box.shape[1:])
        if spec is None:  # the box itself (C = I adds nothing but rounding)
            lower, upper = out_box.lo.reshape(batch, -1), out_box.hi.reshape(batch, -1)
        else:
            lower, upper = min_over_box(rows, out_box), -min_over_box(-rows, out_box)
        if method != "ibp" and rows.size:  # an empty output or C: nothing to tighten
            both = self._backward(self.output_id, np.concatenate([rows, -rows], axis=1), boxes,
                                  fallbacks)  # fmt: skip
            k = matrix.shape[0]
            lower, upper = np.maximum(lower, both[:, :k]), np.minimum(upper, -both[:, k:])
        if spec is None:
            lower, upper = lower.reshape(out_box.lo.shape), upper.reshape(out_box.lo.shape)
        return Bounds(lower, upper, boxes, method, fallbacks)

    def _chunk(self, spec: np.ndarray | None) -> int:
        """Boxes per pass: a backward pass holds [boxes, rows, n] coefficients, rows twice the
        elements of a node it starts from (the output, or a parent of a nonlinear node) or of
        C, n up to the largest node; at most `COEFFICIENTS` in all."""
        largest = max(max(numel(step.shape), 1) for step in self.steps)
        starts = [self.output_id] + [p for s in self.steps if _needs_parent_bounds(s.node)
                                     for p in s.parents]  # fmt: skip
        rows = 2 * max(max(numel(self.steps[i].shape), 1) for i in starts)
        rows = max(rows, 0 if spec is None else 2 * np.shape(spec)[0])
        return max(1, COEFFICIENTS // (rows * largest))

    def _spec(self, spec: np.ndarray | None) -> np.ndarray:
        n = numel(self.steps[self.output_id].shape)
        if spec is None:
            return np.eye(n)
        matrix = np.asarray(spec, dtype=F64)
        if matrix.ndim == 1:
            matrix = matrix[None, :]
        if matrix.ndim != 2 or matrix.shape[1] != n:
            raise DiagnosticError.simple(
                f"bounds: C must be a matrix with {n} columns (the output's elements), "
                f"got shape {list(matrix.shape)}"
            )
        return matrix

    def _interval_boxes(
        self, lo: dict[int, np.ndarray], hi: dict[int, np.ndarray]
    ) -> list[Box | None]:
        """The interval boxes of every node for a batch of input boxes (per input node), on a
        leading batch axis: one pass over the batch where every rule allows it (`_batched`),
        else box by box."""
        batch = next(iter(lo.values())).shape[0]
        ordered = all(np.all(lo[i] <= hi[i]) for i in lo)
        if batch == 1 or not self._batchable or not ordered:
            per_box = [
                self.ibp({i: v[b] for i, v in lo.items()}, {i: v[b] for i, v in hi.items()})
                for b in range(batch)
            ]
            return [
                None if any(boxes[i] is None for boxes in per_box)
                else Box(np.stack([boxes[i].lo for boxes in per_box]),
                         np.stack([boxes[i].hi for boxes in per_box]))
                for i in range(len(self.steps))
            ]  # fmt: skip
        boxes: list[Box | None] = []
        for step in self.steps:
            i = step.node.id
            if i in lo:
                boxes.append(self.ibp.outward.to_grid(Box(lo[i], hi[i])))
            else:
                boxes.append(self._batched(step, [boxes[p] for p in step.parents], batch))
        return boxes

    @property
    def _batchable(self) -> bool:
        return all(isinstance(s.node, BATCHABLE) for s in self.steps)

    def _batched(self, step: Step, parents: list[Box | None], batch: int) -> Box | None:
        """The interval rule on batched boxes: for `BATCHABLE` ops, which act on leading axes
        alike (elementwise ops; linear maps every leading index)."""
        ibp_step = self.ibp.steps[step.node.id]
        if ibp_step.rule is None or any(p is None for p in parents):
            return None
        box = ibp_step.rule(step.node, parents, ibp_step.record, self.ibp.outward)  # type: ignore[arg-type]
        if box is None:
            return None
        shape = (batch,) + step.shape
        return sanitize(Box(np.broadcast_to(box.lo, shape), np.broadcast_to(box.hi, shape)))

    def _tighten(self, boxes: list[Box | None], method: str, fallbacks: dict[int, str]) -> None:
        """Forward over the nodes: each box from its rule on the tightened parents, intersected
        with its interval box; pre-activation nodes (method crown) also with their CROWN
        bounds."""
        needs = set()
        if method == "crown":
            for step in self.steps:
                if _needs_parent_bounds(step.node):
                    needs.update(step.parents)
        # a linear map of the input: its backward pass is min over the input box of W x + b,
        # the interval rule's own computation (midpoint-radius), so it would add nothing
        needs -= {
            s.node.id for s in self.steps
            if isinstance(s.node, ops.LinearOp) and s.parents[0] in self.input_ids
        }  # fmt: skip
        for step in self.steps:
            i = step.node.id
            if boxes[i] is None or isinstance(step.node, ops.InputOp | ops.ConstOp):
                continue
            parents = [boxes[p] for p in step.parents]
            if any(p is None for p in parents):
                continue
            box = self._reapply(step, parents, boxes[i])
            if i in needs and numel(step.shape):  # an empty node has nothing to tighten
                n = numel(step.shape)
                eye = np.eye(n).reshape((n,) + step.shape)
                rows = np.broadcast_to(np.concatenate([eye, -eye]), (box.lo.shape[0], 2 * n)
                                       + step.shape)  # fmt: skip
                both = self._backward(i, rows, boxes, fallbacks, identity=True)
                low = both[:, :n].reshape(box.lo.shape)
                high = -both[:, n:].reshape(box.lo.shape)
                box = Box(np.maximum(box.lo, low), np.minimum(box.hi, high))
            boxes[i] = box

    def _reapply(self, step: Step, parents: list[Box], current: Box) -> Box:
        """The interval rule on tightened parent boxes, intersected with the current box."""
        ibp_step = self.ibp.steps[step.node.id]
        batch = current.lo.shape[0]
        if batch > 1 and isinstance(step.node, BATCHABLE):
            one_pass = self._batched(step, parents, batch)
            if one_pass is None:
                return current
            return Box(np.maximum(current.lo, one_pass.lo), np.minimum(current.hi, one_pass.hi))
        fresh = []
        for b in range(batch):
            one = self.ibp._apply(ibp_step, [Box(p.lo[b], p.hi[b]) for p in parents])
            if one is None:
                return current
            fresh.append(one)
        lo = np.maximum(current.lo, np.stack([f.lo for f in fresh]))
        hi = np.minimum(current.hi, np.stack([f.hi for f in fresh]))
        return Box(lo, hi)

    def _backward(
        self,
        start: int,
        rows: np.ndarray,
        boxes: list[Box | None],
        fallbacks: dict[int, str],
        identity: bool = False,
    ) -> np.ndarray:
        """A rigorous lower bound of <rows[b, k], z_start> over box b: [B, K]. `identity`:
        rows are [I; -I] (a linear start node then skips its product)."""
        lams: dict[int, np.ndarray] = {start: np.array(rows, dtype=F64)}
        const = np.zeros(rows.shape[:2])
        err = np.zeros(rows.shape[:2])
        with np.errstate(all="ignore"):
            for step in reversed(self.steps[: start + 1]):
                i = step.node.id
                if i not in lams:
                    continue
                lam = lams.pop(i)
                if not numel(step.shape):  # an empty value: <lam, z> is exactly 0
                    continue
                own = boxes[i]
                assert own is not None
                back = None
                if i in self.input_ids:
                    const = _down(const + min_over_box(lam, own))
                    continue
                rule = CROWN.get(type(step.node))
                parents = [boxes[p] for p in step.parents]
                if identity and i == start and isinstance(step.node, ops.LinearOp):
                    back = _linear(step, lam, parents, own, self.ibp.outward, identity=True)  # type: ignore[arg-type]
                elif rule is not None and all(p is not None for p in parents):
                    back = rule(step, lam, parents, own, self.ibp.outward)  # type: ignore[arg-type]
                if back is None:
                    fallbacks.setdefault(i, _fallback_reason(step))
                    const = _down(const + min_over_box(lam, own))
                    continue
                const = _down(const + back.const)
                err = _up(err + back.err)
                for position, coefficient in back.parents.items():
                    pid = step.parents[position]
                    if pid in lams:
                        total = lams[pid] + coefficient
                        # the sum's rounding: within u |total| per coefficient
                        err = _up(err + _U * dot_bound(total, boxes[pid].magnitude()))
                        lams[pid] = total
                    else:
                        lams[pid] = np.asarray(coefficient, dtype=F64)  # never written in place
            bound = _down(const - err)
        return np.where(np.isnan(bound), -np.inf, bound)


CROWN.derive(
    NODE_OPS,
    lambda cls: _piecewise if issubclass(cls, ops.UnaryOp) else None,  # type: ignore[arg-type]
)
CROWN.refuse("no linear relaxation written; its interval box is used", *CROWN.missing(NODE_OPS))


def _fallback_reason(step: Step) -> str:
    node = step.node
    if type(node) not in CROWN:
        return f"{node.TAG}: {CROWN.unsupported[type(node)]}"
    return f"{node.TAG}: unbounded parent box; its interval box is used"


def prepare_crown(
    graph: GraphOp, payload: Payload | None, dtype: type = np.float64
) -> PreparedCrown:
    """Check the graph and payload once (as `prepare_ibp`) for repeated bounds in `dtype`."""
    prepared = prepare_ibp(graph, payload, dtype)
    inputs = tuple(n.id for n in graph.nodes if isinstance(n, ops.InputOp))
    steps = [Step(s.node, s.parents, s.record, s.shape) for s in prepared.steps]
    output = graph.output
    assert output is not None and isinstance(output.value.owner, NodeOp)
    return PreparedCrown(prepared, steps, inputs, output.value.owner.id)


def bind_box(
    prepared: PreparedCrown, lo: Any, hi: Any
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], bool]:
    """(lo, hi) as `{input node id: [B, *shape]}` float64 arrays and whether the caller gave a
    batch. One array for a graph with one input node, else `{node id: array}` (or a list in
    node order, as `tlc.run` takes); every input batched alike or none."""
    graph, shapes = prepared.ibp.graph, prepared.ibp.shapes
    if len(prepared.input_ids) == 1 and not isinstance(lo, dict | list | tuple):
        lo, hi = {prepared.input_id: lo}, {prepared.input_id: hi}
    elif isinstance(lo, list | tuple):
        lo, hi = (
            dict(zip(prepared.input_ids, lo, strict=True)),
            dict(zip(prepared.input_ids, hi, strict=True)),
        )
    lows, highs, flags = {}, {}, set()
    for i in prepared.input_ids:
        if i not in lo or i not in hi:
            raise DiagnosticError.simple(f"bounds: no box given for input node {i}")
        lo_a, hi_a = np.broadcast_arrays(np.asarray(lo[i], F64), np.asarray(hi[i], F64))
        batched = lo_a.shape != shapes[i] and lo_a.shape[1:] == shapes[i]
        flags.add(batched)
        lows[i], highs[i] = (lo_a, hi_a) if batched else (lo_a[None], hi_a[None])
    if len(flags) > 1:
        raise DiagnosticError.simple("bounds: batch every input's box, or none")
    if not flags.pop():  # unbatched: the same checks and messages as evaluation
        bind_inputs(graph, shapes, {i: v[0] for i, v in lows.items()}, F64)
        bind_inputs(graph, shapes, {i: v[0] for i, v in highs.items()}, F64)
        return lows, highs, False
    sizes = {v.shape[0] for v in lows.values()}
    if len(sizes) > 1:
        raise DiagnosticError.simple("bounds: every input needs the same number of boxes")
    return lows, highs, True
