"""Derivative rules: one JVP table and one VJP table keyed by op class, filled next to each rule.

A VJP rule `vjp(em, node, ins, out, g, record) -> (parent cotangents, parameter cotangents)`
is written in the emitter's vocabulary (tlc.semantics.emitter), so the same rule computes
`tlc.vjp` numerically and writes the gradient graph of the `grad` pass. `ins` are the parents'
forward values, `out` the node's (the saved values), `g` the cotangent of the output; a parent
cotangent may be None (no gradient flows there) and parameter cotangents are keyed by payload
field. A JVP rule `jvp(em, node, ins, out, tangents, record, record_tangent) -> tangent` runs
numerically (a NumpyEmitter and float64 arrays), with zeros for parents that carry no tangent.

Rules derive from the op's facts where it states them (`_derived`): an elementwise op's
`derivative` fact f'(x) gives both modes (`elementwise`); an op with only a decomposition is
differentiated through it, JAX-style: the decomposition is emitted with the rule's own emitter
(recomputed numerically, or written into the gradient graph) and each part's rule applied
(`through_decomposition`). Families share one-line helpers for the explicit rules: `binary`
(two partials), `linear_op` (the JVP is the op itself, the VJP its transpose), `self_adjoint`
(a symmetric Jacobian: one product serves both), `stop_gradient` (derivative 0).

Conventions at kinks (PyTorch's): relu'(0) = 0, abs'(0) = sign(0) = 0, max/min split a tie
0.5/0.5, max_pool sends a window's gradient to its first maximum in row-major order.

Two kinds of op have no derivative, and they differ: where gradients *stop* (detach, sign, random
sources, the graph's inputs as leaves) the op has a rule, `stop_gradient`'s, that passes nothing on
(derivative 0), with the reason in `GRADIENT_STOPS`; where tlc does not provide a derivative (the
backward ops: second order) the tables refuse the op (`JVP.unsupported`), and reaching one with a
(co)tangent is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tlc.core.payload import Record
from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.families import UnaryOp
from tlc.dialect.ops import NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.backward_reference import max_pool_tangent
from tlc.semantics.emitter import Emitter, NumpyEmitter
from tlc.semantics.interpret import REFERENCE
from tlc.semantics.reference import payload_field

Cotangents = tuple[list[Any], dict[str, Any]]
Vjp = Callable[[Emitter, NodeOp, list[Any], Any, Any, "Record | None"], Cotangents]
Jvp = Callable[
    [NumpyEmitter, NodeOp, list[np.ndarray], np.ndarray, list[np.ndarray], "Record | None", Record],
    np.ndarray,
]

JVP: RuleTable[Jvp] = RuleTable("JVP")
VJP: RuleTable[Vjp] = RuleTable("VJP")

#: The payload fields each parameterised op is differentiated with respect to (when present in
#: its record): its schema's differentiable fields (`Param.differentiable`; never `eps`).
PARAMS: dict[type[NodeOp], tuple[str, ...]] = {
    op: tuple(p.name for p in op.PAYLOAD if p.differentiable)
    for op in NODE_OPS
    if op.reads_payload()
}

#: Ops where gradients stop (their rule passes nothing on), with the reason.
GRADIENT_STOPS: dict[type[NodeOp], str] = {}


def _ref(node: NodeOp, args: list[np.ndarray], record: Record | None) -> np.ndarray:
    return np.asarray(REFERENCE[type(node)](node, args, record, np.float64))


defvjp = VJP.register
defjvp = JVP.register


# --------------------------------------------------------------------------------------------
# Family helpers
# --------------------------------------------------------------------------------------------

#: f'(x) as a value, given the node, its input x and output y.
Factor = Callable[[Emitter, NodeOp, Any, Any], Any]


def elementwise(cls: type[NodeOp], factor: Factor) -> None:
    """A unary elementwise op: tangent t f'(x), cotangent g f'(x)."""
    jvp, vjp = _elementwise_rules(factor)
    defjvp(cls)(jvp)
    defvjp(cls)(vjp)


def _elementwise_rules(factor: Factor) -> tuple[Jvp, Vjp]:
    def jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
        return ts[0] * factor(em, node, ins[0], out)

    def vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
        return [em.mul(g, factor(em, node, ins[0], out))], {}

    return jvp, vjp


def _by_derivative(em: Emitter, node: NodeOp, x: Any, y: Any) -> Any:
    """The op's `derivative` fact."""
    return node.derivative(em, x, y)  # type: ignore[attr-defined]


#: (d out / d a, d out / d b) as values, given a, b and the output.
Partials = Callable[[Emitter, Any, Any, Any], tuple[Any, Any]]


def binary(cls: type[NodeOp], partials: Partials) -> None:
    """A binary elementwise op: tangent ta fa + tb fb, cotangents (g fa, g fb)."""

    @defjvp(cls)
    def jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
        fa, fb = partials(em, ins[0], ins[1], out)
        return ts[0] * fa + ts[1] * fb

    @defvjp(cls)
    def vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
        fa, fb = partials(em, ins[0], ins[1], out)
        return [em.mul(g, fa), em.mul(g, fb)], {}


#: The transpose of a linear op: (em, node, parent shapes, g) -> parent cotangents.
Transpose = Callable[[Emitter, NodeOp, list[tuple[int, ...]], Any], list[Any]]


def linear_op(cls: type[NodeOp], transpose: Transpose) -> None:
    """An op linear in its parents: the JVP applies the op to the tangents, the VJP is its
    transpose."""

    @defjvp(cls)
    def jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
        return _ref(node, ts, record)

    @defvjp(cls)
    def vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
        return transpose(em, node, [em.shape(x) for x in ins], g), {}


#: J v for a symmetric Jacobian J: (em, node, x, y, v).
Product = Callable[[Emitter, NodeOp, Any, Any, Any], Any]


def self_adjoint(cls: type[NodeOp], product: Product) -> None:
    """A unary op whose Jacobian is symmetric (softmax): J t forward, J g backward."""

    @defjvp(cls)
    def jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
        return product(em, node, ins[0], out, ts[0])

    @defvjp(cls)
    def vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
        return [product(em, node, ins[0], out, g)], {}


def stop_gradient(reason: str, *op_classes: type[NodeOp]) -> None:
    """Gradients stop at `op_classes` (derivative 0, for `reason`): tangent 0, no cotangent."""

    def jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
        return np.zeros_like(out)

    def vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
        return [None] * len(ins), {}

    defjvp(*op_classes)(jvp)
    defvjp(*op_classes)(vjp)
    GRADIENT_STOPS.update(dict.fromkeys(op_classes, reason))


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------

# Elementwise ops stating their `derivative` get `elementwise` rules (see `_derived`); gelu's
# derivative is a backward op, which tlc.dialect.ops cannot name.
elementwise(
    ops.GeluOp,
    lambda em, n, x, y: em.unary(bw.GeluGradOp, x, approximate=n.meta("approximate")),
)
stop_gradient("identity forward, no gradient by definition (PyTorch's detach)", ops.DetachOp)
stop_gradient("piecewise constant: derivative 0 wherever it exists", bw.SignOp)
stop_gradient(
    "a leaf: its tangent is given (jvp) and its cotangent is the result (vjp)", ops.InputOp
)
stop_gradient("a random source with no parents; its samples carry no derivative", ops.RandUniformOp)
stop_gradient(
    "the sample is piecewise constant in keepProb (derivative 0 almost everywhere, undefined at "
    "the thresholds); like PyTorch's bernoulli it passes no gradient",
    ops.BernoulliMaskOp,
)


def _max_weight(em: Emitter, a: Any, b: Any) -> Any:
    """d max(a, b) / da: 1 where a > b, 0 where a < b, 0.5 at a tie: (1 + sign(a - b)) / 2."""
    return em.scale(em.add(em.full_like(a, 1.0), em.sign(em.sub(a, b))), 0.5)


def _max_partials(em: Emitter, a: Any, b: Any, y: Any) -> tuple[Any, Any]:
    w = _max_weight(em, a, b)
    return w, em.one_minus(w)


def _min_partials(em: Emitter, a: Any, b: Any, y: Any) -> tuple[Any, Any]:
    w = _max_weight(em, b, a)
    return w, em.one_minus(w)


binary(ops.MulElemOp, lambda em, a, b, y: (b, a))


def _div_partials(em: Emitter, a: Any, b: Any, y: Any) -> tuple[Any, Any]:
    """d (a / b) / da = 1 / b, d (a / b) / db = -(a / b) / b."""
    inverse = em.unary(ops.InvOp, b)
    return inverse, em.neg(em.mul(y, inverse))


binary(ops.DivOp, _div_partials)


def _pow_elem_partials(em: Emitter, a: Any, b: Any, y: Any) -> tuple[Any, Any]:
    """d a^b / da = b a^(b-1); d a^b / db = a^b ln a where a > 0, else 0 (ln a is no real
    number there; PyTorch gives NaN for a < 0 and 0 at a = 0)."""
    da = em.mul(b, em.bind(ops.PowElemOp, [a, em.sub(b, em.full_like(b, 1.0))]))
    positive = em.bind(ops.LessOp, [em.full_like(a, 0.0), a])
    safe = em.bind(ops.WhereOp, [positive, a, em.full_like(a, 1.0)])
    return da, em.mul(em.mul(y, em.unary(ops.LogOp, safe)), positive)


binary(ops.PowElemOp, _pow_elem_partials)
binary(ops.MaxElemOp, _max_partials)
binary(ops.MinElemOp, _min_partials)

linear_op(ops.AddOp, lambda em, node, shapes, g: [g, g])

linear_op(ops.SubOp, lambda em, node, shapes, g: [g, em.neg(g)])
stop_gradient("piecewise constant (0 or 1): derivative 0 wherever it exists", ops.LessOp)
stop_gradient("piecewise constant (integers): derivative 0 wherever it exists", ops.TruncOp)


@defjvp(ops.WhereOp)
def _where_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    """The tangent of the value chosen (the condition, piecewise constant, carries none)."""
    return np.where(ins[0] != 0, ts[1], ts[2])


@defvjp(ops.WhereOp)
def _where_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    """g to the value chosen at each element, 0 to the other: two wheres (exact)."""
    zero = em.full_like(g, 0.0)
    return [
        None,
        em.bind(ops.WhereOp, [ins[0], g, zero]),
        em.bind(ops.WhereOp, [ins[0], zero, g]),
    ], {}


@defjvp(ops.PadOp)
def _pad_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    """The same pad of the tangent, constant pads holding 0 (the value does not vary)."""
    widths = list(zip(node.meta("before"), node.meta("after"), strict=True))
    mode = ops.NUMPY_PAD_MODES[node.meta("mode")]
    return np.pad(ts[0], widths, mode=mode)


@defvjp(ops.PadOp)
def _pad_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    """The transpose of the pad, axis by axis (last first): along axis a the pad is the 0/1
    matrix P [padded, n] with P[i, source(i)] = 1, so the cotangent is g P, a `linear` with
    weight P^T over the axis moved last (positions of a constant pad have no source and send
    nothing back; reflected and repeated ones add up)."""
    shape = em.shape(ins[0])
    for axis in reversed(range(len(shape))):
        if node.meta("before")[axis] == 0 and node.meta("after")[axis] == 0:
            continue
        sources = node.sources(axis, shape[axis])
        select = np.zeros((len(sources), shape[axis]))
        kept = sources >= 0
        select[np.arange(len(sources))[kept], sources[kept]] = 1.0
        last = len(shape) - 1
        g = em.transpose(em.linear(em.transpose(g, axis, last), select.T), axis, last)
    return [g], {}


def _safe_log_pieces(em: Emitter, x: Any, eps: Any) -> tuple[Any, Any]:
    """safe_log(x, eps) = log(softplus(x) + eps): (1 / (softplus(x) + eps), sigmoid(x))."""
    shape = em.shape(x)
    r = em.unary(ops.InvOp, em.add(em.unary(ops.SoftplusOp, x), em.broadcast_to(eps, shape)))
    return r, em.unary(ops.SigmoidOp, x)


@defjvp(ops.SafeLogOp)
def _safe_log_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    r, s = _safe_log_pieces(em, ins[0], ins[1])
    return (ts[0] * s + ts[1]) * r


@defvjp(ops.SafeLogOp)
def _safe_log_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    r, s = _safe_log_pieces(em, ins[0], ins[1])
    gr = em.mul(g, r)
    return [em.mul(gr, s), em.sum_all(gr)], {}


@defjvp(ops.MseLossOp)
def _mse_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    a, b = ins
    return np.asarray(2.0 / max(a.size, 1) * np.sum((a - b) * (ts[0] - ts[1])))


@defvjp(ops.MseLossOp)
def _mse_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    a, b = ins
    shape = em.shape(a)
    ga = em.scale(em.mul(em.broadcast_to(g, shape), em.sub(a, b)), 2.0 / max(numel(shape), 1))
    return [ga, em.neg(ga)], {}


# --------------------------------------------------------------------------------------------
# Layout and reductions: linear ops
# --------------------------------------------------------------------------------------------


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _concat_transpose(em: Emitter, node: NodeOp, shapes: list[Any], g: Any) -> list[Any]:
    """Each part's slice of g, taken by a 0/1 selection matrix on the concat axis."""
    axis = node.meta("axis")
    last = len(shapes[0]) - 1
    moved = em.transpose(g, axis, last)
    total = em.shape(g)[axis]
    parts, start = [], 0
    for shape in shapes:
        n = shape[axis]
        select = np.zeros((n, total))
        select[np.arange(n), start + np.arange(n)] = 1.0
        parts.append(em.transpose(em.linear(moved, select), axis, last))
        start += n
    return parts


def _gather_transpose(em: Emitter, node: NodeOp, shapes: list[Any], g: Any) -> list[Any]:
    """Each input element receives the sum of the cotangents of the outputs it was copied to:
    the selection matrix's transpose applied along the axis (a `linear` on the last axis)."""
    axis, indices = node.meta("axis"), node.meta("indices")
    last = len(shapes[0]) - 1
    scatter = np.zeros((shapes[0][axis], len(indices)))
    np.add.at(scatter, (np.asarray(indices, dtype=np.int64), np.arange(len(indices))), 1.0)
    return [em.transpose(em.linear(em.transpose(g, axis, last), scatter), axis, last)]


def _reduce_transpose(em: Emitter, node: NodeOp, shapes: list[Any], g: Any) -> list[Any]:
    return [em.unreduce(g, node.meta("axis"), shapes[0])]


def _mean_transpose(em: Emitter, node: NodeOp, shapes: list[Any], g: Any) -> list[Any]:
    axis = node.meta("axis")
    return [em.scale(em.unreduce(g, axis, shapes[0]), 1.0 / shapes[0][axis])]


linear_op(ops.ReshapeOp, lambda em, node, shapes, g: [em.reshape(g, shapes[0])])
linear_op(ops.FlattenOp, lambda em, node, shapes, g: [em.reshape(g, shapes[0])])
linear_op(ops.PermuteOp, lambda em, node, shapes, g: [em.permute(g, _inverse(node.meta("perm")))])
linear_op(
    ops.TransposeOp,
    lambda em, node, shapes, g: [em.transpose(g, node.meta("axis1"), node.meta("axis2"))],
)
linear_op(ops.BroadcastToOp, lambda em, node, shapes, g: [em.sum_to(g, shapes[0])])
linear_op(ops.SumOp, lambda em, node, shapes, g: [em.broadcast_to(g, shapes[0])])
linear_op(ops.ReduceSumOp, _reduce_transpose)
linear_op(ops.ReduceMeanOp, _mean_transpose)
linear_op(ops.ConcatOp, _concat_transpose)
linear_op(ops.GatherOp, _gather_transpose)
linear_op(
    ops.AvgPoolOp,
    lambda em, node, shapes, g: [em.bind(bw.AvgPoolGradOp, [g], _pool_fields(node), shapes[0])],
)


def _pool_fields(node: NodeOp) -> dict[str, Any]:
    return {name: node.meta(name) for name in ("kernel", "stride", "padding")}


@defjvp(ops.MaxPoolOp)
def _max_pool_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    return max_pool_tangent(node, ins[0], ts[0])


@defvjp(ops.MaxPoolOp)
def _max_pool_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    return [em.bind(bw.MaxPoolGradOp, [ins[0], g], _pool_fields(node))], {}


# --------------------------------------------------------------------------------------------
# Normalisations along an axis
# --------------------------------------------------------------------------------------------


def _softmax_product(em: Emitter, node: NodeOp, x: Any, y: Any, v: Any) -> Any:
    """(diag(y) - y y^T) v along the axis: y (v - sum(v y))."""
    axis = node.meta("axis")
    return em.mul(y, em.sub(v, em.keep_sum(em.mul(v, y), axis)))


def _masked_softmax_product(em: Emitter, node: NodeOp, x: Any, y: Any, v: Any) -> Any:
    """Softmax's product along the last axis; blocked entries have y = 0, so they get 0."""
    last = len(em.shape(y)) - 1
    return em.mul(y, em.sub(v, em.keep_sum(em.mul(v, y), last)))


self_adjoint(ops.SoftmaxOp, _softmax_product)
self_adjoint(ops.HardMaskedSoftmaxOp, _masked_softmax_product)


@defjvp(ops.LogSoftmaxOp)
def _log_softmax_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    axis = node.meta("axis")
    return ts[0] - np.sum(ts[0] * np.exp(out), axis=axis, keepdims=True)


@defvjp(ops.LogSoftmaxOp)
def _log_softmax_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    axis = node.meta("axis")
    return [em.sub(g, em.mul(em.unary(ops.ExpOp, out), em.keep_sum(g, axis)))], {}


def _eps(node: NodeOp, record: Record | None) -> float:
    return float(payload_field(node, record, "eps", np.float64))


def _layernorm_frame(node: NodeOp, shape: tuple[int, ...]) -> tuple[tuple[int, int], Any]:
    """Layernorm works on the rows of [prod(s[:axis]), prod(s[axis:])]."""
    axis = node.meta("axis")
    return (numel(shape[:axis]), numel(shape[axis:])), shape[axis:]


@defjvp(ops.LayernormOp)
def _layernorm_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    x, t = ins[0], ts[0]
    (m, n), suffix = _layernorm_frame(node, x.shape)
    x2, t2 = x.reshape(m, n), t.reshape(m, n)
    d = x2 - x2.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt((d * d).mean(axis=1, keepdims=True) + _eps(node, record))
    xhat = d * rstd
    dxhat = rstd * (t2 - t2.mean(axis=1, keepdims=True) - xhat * (t2 * xhat).mean(1, keepdims=True))
    record = record or {}
    gamma = record.get("gamma", np.ones(suffix)).reshape(n)
    tangent = dxhat * gamma
    if "gamma" in rt:
        tangent = tangent + xhat * rt["gamma"].reshape(n)
    if "beta" in rt:
        tangent = tangent + rt["beta"].reshape(n)
    return tangent.reshape(x.shape)


@defvjp(ops.LayernormOp)
def _layernorm_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    shape = em.shape(ins[0])
    (m, n), suffix = _layernorm_frame(node, shape)
    x2, g2 = em.reshape(ins[0], (m, n)), em.reshape(g, (m, n))
    d = em.sub(x2, em.keep_mean(x2, 1))
    var = em.keep_mean(em.mul(d, d), 1)
    eps = em.full((m, n), _eps(node, record))
    rstd = em.unary(ops.InvOp, em.unary(ops.SqrtOp, em.add(var, eps)))
    xhat = em.mul(d, rstd)
    record = record or {}
    gg = g2
    if "gamma" in record:
        gg = em.mul(g2, em.const(np.broadcast_to(record["gamma"].reshape(n), (m, n))))
    centred = em.sub(gg, em.keep_mean(gg, 1))
    gx = em.mul(rstd, em.sub(centred, em.mul(xhat, em.keep_mean(em.mul(gg, xhat), 1))))
    params = {}
    if "gamma" in record:
        params["gamma"] = em.reshape(em.reduce_sum(em.mul(g2, xhat), 0), suffix)
    if "beta" in record:
        params["beta"] = em.reshape(em.reduce_sum(g2, 0), suffix)
    return [em.reshape(gx, shape)], params


def _per_channel(node: NodeOp, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A [C] vector broadcast over `shape` along the channel axis."""
    view = [1] * len(shape)
    view[node.meta("channel_axis")] = shape[node.meta("channel_axis")]
    return np.broadcast_to(value.reshape(view), shape)


def _bn_stats(node: NodeOp, record: Record, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rstd = 1 / np.sqrt(record["var"] + _eps(node, record))
    return {
        "rstd": _per_channel(node, rstd, shape),
        "scale": _per_channel(node, record["gamma"] * rstd, shape),
        "mean": _per_channel(node, record["mean"], shape),
        "dvar": _per_channel(node, -0.5 * record["gamma"] * rstd**3, shape),
    }


@defjvp(ops.BatchNormEvalOp)
def _batch_norm_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    x, shape = ins[0], ins[0].shape
    s = _bn_stats(node, record, shape)
    centred = x - s["mean"]
    tangent = ts[0] * s["scale"]
    pieces = {
        "gamma": centred * s["rstd"],
        "beta": np.ones(shape),
        "mean": -s["scale"],
        "var": centred * s["dvar"],
    }
    for name, factor in pieces.items():
        if name in rt:
            tangent = tangent + _per_channel(node, rt[name], shape) * factor
    return tangent


@defvjp(ops.BatchNormEvalOp)
def _batch_norm_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    x, axis = ins[0], node.meta("channel_axis")
    s = _bn_stats(node, record, em.shape(x))
    centred = em.sub(x, em.const(s["mean"]))
    gbeta = em.sum_except(g, axis)
    params = {
        "gamma": em.sum_except(em.mul(g, em.mul(centred, em.const(s["rstd"]))), axis),
        "beta": gbeta,
        "mean": em.neg(em.sum_except(em.mul(g, em.const(s["scale"])), axis)),
        "var": em.sum_except(em.mul(g, em.mul(centred, em.const(s["dvar"]))), axis),
    }
    return [em.mul(g, em.const(s["scale"]))], params


# --------------------------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------------------------


@defjvp(ops.MatmulOp)
def _matmul_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    a, b = ins
    return np.matmul(ts[0], b) + np.matmul(a, ts[1])


@defvjp(ops.MatmulOp)
def _matmul_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    a, b = ins
    return [em.matmul(g, em.swap_last(b)), em.matmul(em.swap_last(a), g)], {}


def _weighted_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    """linear/conv: op(t; W) + op(x; dW, db), each op applied by its reference rule."""
    tangent = _ref(node, ts, {"weight": record["weight"]})
    if rt:
        weight = rt.get("weight", np.zeros_like(record["weight"]))
        moved = {"weight": weight, **({"bias": rt["bias"]} if "bias" in rt else {})}
        tangent = tangent + _ref(node, ins, moved)
    return tangent


defjvp(ops.LinearOp, ops.ConvOp)(_weighted_jvp)


@defvjp(ops.LinearOp)
def _linear_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    (x,) = ins
    weight = record["weight"]
    rows = em.rows(g)
    params = {"weight": em.matmul(em.swap_last(rows), em.rows(x))}
    if "bias" in record:
        params["bias"] = em.reduce_sum(rows, 0)
    return [em.linear(g, weight.T)], params


@defvjp(ops.ConvOp)
def _conv_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    (x,) = ins
    fields = node.metadata()
    kernel = em.const(record["weight"])
    params = {"weight": em.bind(bw.ConvWeightGradOp, [x, g], fields)}
    if "bias" in record:
        params["bias"] = em.sum_except(g, node.meta("channel_axis"))
    return [em.bind(bw.ConvInputGradOp, [g, kernel], fields, em.shape(x))], params


# --------------------------------------------------------------------------------------------
# Parameters held by a const node
# --------------------------------------------------------------------------------------------


@defjvp(ops.ConstOp)
def _const_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    return rt["value"].reshape(out.shape) if "value" in rt else np.zeros_like(out)


@defvjp(ops.ConstOp)
def _const_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    return [], {"value": g}


# --------------------------------------------------------------------------------------------
# Derived from the op's facts
# --------------------------------------------------------------------------------------------


class _Tape(Emitter[int]):
    """Emits a decomposition through `em` and records each op: values are indices into
    `values` (the parents first), so every value keeps its place even where a rule returns one
    of its inputs unchanged."""

    def __init__(self, em: Emitter[Any], parents: list[Any]) -> None:
        self.em = em
        self.values: list[Any] = list(parents)
        #: (node, operand indices, result index, record) per op, in emission order.
        self.entries: list[tuple[NodeOp, list[int], int, Record | None]] = []

    def next_id(self) -> int:
        return self.em.next_id()

    def evaluate(self, node: NodeOp, operands: list[int], record: Record | None) -> int:
        value = self.em.evaluate(node, [self.values[i] for i in operands], record)
        self.values.append(value)
        self.entries.append((node, list(operands), len(self.values) - 1, record))
        return len(self.values) - 1

    def shape(self, value: int) -> Shape:
        return self.em.shape(self.values[value])


def _record_tape(em: Emitter[Any], node: NodeOp, ins: list[Any]) -> tuple[_Tape, int]:
    tape = _Tape(em, ins)
    return tape, node.decompose(tape, *range(len(ins)))


def decomposition_jvp(em, node, ins, out, ts, record, rt):  # type: ignore[no-untyped-def]
    """Tangents pushed through the decomposition's parts, each by its own JVP rule."""
    tape, result = _record_tape(em, node, ins)
    tangents: list[Any] = list(ts)
    for part, operands, index, part_record in tape.entries:
        args = [tape.values[i] for i in operands]
        moved = [tangents[i] for i in operands]
        tangents.append(JVP[type(part)](em, part, args, tape.values[index], moved, part_record, {}))
    return tangents[result]


def decomposition_vjp(em, node, ins, out, g, record):  # type: ignore[no-untyped-def]
    """Cotangents pulled back through the decomposition's parts, each by its own VJP rule;
    the parts' own parameters (constants) are not the op's and are dropped."""
    tape, result = _record_tape(em, node, ins)
    cotangents: dict[int, Any] = {result: g}
    for part, operands, index, part_record in reversed(tape.entries):
        ct = cotangents.pop(index, None)
        if ct is None:
            continue
        args = [tape.values[i] for i in operands]
        to_parents, _ = VJP[type(part)](em, part, args, tape.values[index], ct, part_record)
        for i, c in zip(operands, to_parents, strict=True):
            if c is not None:
                cotangents[i] = em.add(cotangents[i], c) if i in cotangents else c
    return [cotangents.get(i) for i in range(len(ins))], {}


_DERIVATIVE_JVP, _DERIVATIVE_VJP = _elementwise_rules(_by_derivative)


def _derived_jvp(op_class: type[NodeOp]) -> Jvp | None:
    if issubclass(op_class, UnaryOp) and op_class.defines("derivative"):
        return _DERIVATIVE_JVP
    return decomposition_jvp if op_class.defines("decompose") else None


def _derived_vjp(op_class: type[NodeOp]) -> Vjp | None:
    if issubclass(op_class, UnaryOp) and op_class.defines("derivative"):
        return _DERIVATIVE_VJP
    return decomposition_vjp if op_class.defines("decompose") else None


JVP.derive(NODE_OPS, _derived_jvp)
VJP.derive(NODE_OPS, _derived_vjp)

_SECOND_ORDER = "a backward op of gradient graphs; second derivatives are not provided"
for _table in (JVP, VJP):
    _table.refuse(
        _SECOND_ORDER,
        bw.GeluGradOp, bw.MaxPoolGradOp, bw.AvgPoolGradOp, bw.ConvInputGradOp, bw.ConvWeightGradOp,
    )  # fmt: skip
