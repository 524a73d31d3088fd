"""ibp: interval bound propagation, the graph read in the scalar context of boxes.

`ibp(graph, payload, lo, hi, dtype)` gives every node a `Box` (lo, hi) that encloses the node's
value for every input in the box [lo, hi], both its exact real value and the value the reference
denotation (`tlc.semantics.interpret`) computes in `dtype`; or None where no sound rule applies
(sqrt/log of a box reaching below their domain, division by a box holding 0, an op the table
refuses, or a parent without a box). A node never gets a wrong box. Endpoints are
rounded outward (`tlc.semantics.interval_arith`); the rules follow reference/torchlean-ir.md §5 and
are tight for monotone functions (endpoint rules, not the global codomain), so the seed's MLP at
radius 0.05 ends in tanh([0.020775, 0.035640]) = [0.020772, 0.035625], not [-1, 1].

`prepare_ibp(graph, payload, dtype)` does the per-graph work once (checks, payload records as
`dtype` holds them, in float64, |W| of each weight) and returns a callable `(lo, hi) -> boxes`;
`ibp` is one such call. `INTERVAL[OpClass]` is `rule(node, parent_boxes, record, outward) ->
Box | None`, where `record` is the node's prepared `interval_record`; many rules reuse the
reference rule of the op (`REFERENCE`) on box endpoints, so an op's meaning is written once.
Rules derive from the op's facts where it states them (`_derived`): an elementwise op that is
monotone gets the endpoint rule stepped outward by its `ULPS` (none where exact), inside its
`DOMAIN`; a binary op that selects one of its inputs (`EXACT_MONOTONE`) the exact endpoint rule;
an op with a decomposition and no other rule the decomposition evaluated on boxes
(`IntervalEmitter`), each part by its own rule, which is sound because each part is. Explicit
rules below are the ops that need their own (tight softmax, the weighted maps, norms, ...);
`INTERVAL.unsupported` lists the ops without a rule (their nodes get no box) with the reason.
docs/intervals.md explains each rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload, Record
from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.batch import PROBES, PerBatch, has_batch
from tlc.dialect.families import BinaryOp, Monotone, UnaryOp
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, numel
from tlc.dialect.verify import graph_shapes
from tlc.semantics.emitter import IntervalEmitter, NoBox
from tlc.semantics.interpret import (
    REFERENCE,
    bind_inputs,
    check_sizes,
    given_inputs,
    input_shapes,
)
from tlc.semantics.interval_arith import COMPOSITE_ULPS, F64, LIBM_ULPS, Box, Outward, sanitize
from tlc.semantics.payload_check import prepare_records
from tlc.semantics.reference import payload_field

__all__ = [
    "ABS_WEIGHT",
    "INTERVAL",
    "Box",
    "IntervalRule",
    "PreparedIBP",
    "ibp",
    "interval_record",
    "prepare_ibp",
]

IntervalRule = Callable[[NodeOp, list[Box], "Record | None", Outward], "Box | None"]

#: Ops the table refuses get no box; rules may also give None for a node whose parent box
#: leaves the op's domain (see the module docstring).
INTERVAL: RuleTable[IntervalRule] = RuleTable("interval")

#: float64 outward rounding for intermediate bounds that are not node boxes.
EXACT = Outward(F64)


def ibp(
    graph: GraphOp, payload: Payload | None, lo: Any, hi: Any, dtype: type = np.float64
) -> list[Box | None]:
    """A box (or None) per node for inputs in [lo, hi] (arrays like `interpret`'s `x`)."""
    return prepare_ibp(graph, payload, dtype)(lo, hi)


@dataclass(frozen=True)
class _Step:
    node: NodeOp
    rule: IntervalRule | None
    parents: tuple[int, ...]
    record: Record | None
    shape: Shape


@dataclass(frozen=True)
class PreparedIBP:
    """A checked graph with its interval records: call it on (lo, hi) for a box per node.

    Checking the graph and payload, the float64 records with |W| and the rule lookup in
    `INTERVAL` happen once in `prepare_ibp`; a call binds the input box and folds the rules over
    the nodes, so the boxes of many input boxes (benchmarks, sweeps over radii, the sampled
    check) cost the interval arithmetic only."""

    graph: GraphOp
    shapes: list[Shape]
    outward: Outward
    steps: list[_Step]

    def __call__(self, lo: Any, hi: Any) -> list[Box | None]:
        lows = bind_inputs(self.graph, self.shapes, lo, F64)
        highs = bind_inputs(self.graph, self.shapes, hi, F64)
        boxes: list[Box | None] = []
        for step in self.steps:
            node = step.node
            box: Box | None
            if node.id in lows:
                box = self.outward.to_grid(_input_box(node, lows[node.id], highs[node.id]))
            else:
                box = self._apply(step, [boxes[pid] for pid in step.parents])
            boxes.append(box)
        return boxes

    def _apply(self, step: _Step, parents: list[Box | None]) -> Box | None:
        if step.rule is None or any(p is None for p in parents):
            return None
        box = step.rule(step.node, parents, step.record, self.outward)  # type: ignore[arg-type]
        if box is None:
            return None
        box = sanitize(Box(*np.broadcast_arrays(box.lo, box.hi)))
        assert box.shape == step.shape, f"{step.node.TAG}: box of the wrong shape"
        return box


class PreparedIBPPerBatch:
    """A graph with the batch extent `N`, checked once (with its payload) and called like
    `PreparedIBP`: each call propagates through the graph specialised to the batch size of its
    box (prepared once per batch size)."""

    def __init__(self, graph: GraphOp, payload: Payload | None, dtype: type):
        graph_shapes(graph)  # checks an unverified graph at the probe batch sizes
        self.graph = graph
        self.per_batch = PerBatch(graph, lambda g: prepare_ibp(g, payload, dtype))
        self.per_batch.at(PROBES[0])  # checks the payload now, not on the first call

    def __call__(self, lo: Any, hi: Any) -> list[Box | None]:
        lows, highs = given_inputs(self.graph, lo), given_inputs(self.graph, hi)
        return self.per_batch.for_inputs(input_shapes(lows))(lows, highs)


def prepare_ibp(
    graph: GraphOp, payload: Payload | None, dtype: type = np.float64
) -> PreparedIBP | PreparedIBPPerBatch:
    """Check `graph` and `payload` (the same checks and messages as `interpret`) and build each
    node's interval record (`interval_record`), once, for repeated propagation in `dtype`. A
    graph with the batch extent `N` is prepared per batch size its boxes give."""
    if has_batch(graph):
        return PreparedIBPPerBatch(graph, payload, dtype)
    shapes = graph_shapes(graph)
    check_sizes(graph, shapes)
    records = prepare_records(graph, payload or Payload(), dtype, shapes)
    steps = [
        _Step(node, INTERVAL.get(type(node)), tuple(node.parent_ids()),
              interval_record(records[node.id]) if node.id in records else None,
              shapes[node.id])
        for node in graph.nodes
    ]  # fmt: skip
    return PreparedIBP(graph, shapes, Outward(dtype), steps)


#: The key of |weight| in an interval record.
ABS_WEIGHT = "|weight|"


def interval_record(record: Record) -> Record:
    """The record a rule receives: the payload record as the run's dtype holds it (from
    `prepare_records`), in float64, and for a weighted op (linear, conv) also `ABS_WEIGHT`, the
    magnitude `_weighted` multiplies the radius by."""
    converted = {k: np.asarray(v, dtype=F64) for k, v in record.items()}
    if "weight" in converted:
        converted[ABS_WEIGHT] = np.abs(converted["weight"])
    return converted


def _input_box(node: NodeOp, lo: np.ndarray, hi: np.ndarray) -> Box:
    bad = ~(lo <= hi)
    if bad.any():
        index = [int(i) for i in np.unravel_index(np.argmax(bad), bad.shape)]
        raise DiagnosticError.simple(
            f"ibp: input {node.id}: empty box: lo > hi (or NaN) at index {index}"
        )
    return Box(lo, hi)


#: Decorator: `@register(OpA, ...)` makes `rule` the interval rule of each class.
register = INTERVAL.register


def reference(
    node: NodeOp, *args: np.ndarray, record: Record | None = None, dtype: type = F64
) -> np.ndarray:
    """The op's reference rule evaluated in float64 (on box endpoints), or in `dtype`."""
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCE[type(node)](node, list(args), record, dtype), dtype=dtype)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


@register(ops.InputOp)
def _input(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    raise AssertionError("input boxes come from the caller, not from a rule")


@register(ops.ConstOp)
def _const(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return Box.point(reference(node, record=record))


@register(ops.RandUniformOp, ops.BernoulliMaskOp)
def _unit(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Draws in [0, 1) and masks in {0, 1}: the box [0, 1], whatever the seed."""
    shape = node.require_declared()
    return Box(np.zeros(shape), np.ones(shape))


# --------------------------------------------------------------------------------------------
# Layout: ops that only move values, so f(lo) <= f(x) <= f(hi) elementwise with no rounding
# --------------------------------------------------------------------------------------------


@register(
    ops.PermuteOp, ops.TransposeOp, ops.ReshapeOp, ops.FlattenOp, ops.BroadcastToOp,
    ops.ConcatOp, ops.MaxPoolOp, ops.GatherOp,
)  # fmt: skip
def _exact_monotone(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Non-decreasing in every argument and exact: the reference rule on lo and on hi."""
    return Box(reference(node, *(b.lo for b in boxes)), reference(node, *(b.hi for b in boxes)))


@register(ops.AbsOp)
def _abs(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    (a,) = boxes
    straddles = (a.lo < 0) & (a.hi > 0)
    low = np.where(straddles, 0.0, np.minimum(np.abs(a.lo), np.abs(a.hi)))
    return Box(low, a.magnitude())


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------


@register(ops.AddOp)
def _add(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return out.add(*boxes)


@register(ops.SubOp)
def _sub(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return out.sub(*boxes)


@register(ops.MulElemOp)
def _mul(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return out.mul(*boxes)


@register(ops.InvOp)
def _inv(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """1/x on a box excluding 0 (else None): decreasing on each side of 0."""
    (a,) = boxes
    one = Box.point(np.ones(a.shape))
    return out.div(one, a)


@register(ops.DivOp)
def _div(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """a / b elementwise: the four endpoint quotients, rounded outward, where b's box excludes
    0; where it holds 0 the box is unbounded, [-inf, inf], which holds every real quotient of
    the box (at b = 0 itself the value is ±inf or NaN, not a real number, outside every box as
    after an overflow)."""
    a, b = boxes
    excludes = (b.lo > 0) | (b.hi < 0)
    divisor = Box(np.where(excludes, b.lo, 1.0), np.where(excludes, b.hi, 1.0))
    quotient = out.div(a, divisor)
    assert quotient is not None, "the divisor box excludes 0"
    return Box(np.where(excludes, quotient.lo, -np.inf), np.where(excludes, quotient.hi, np.inf))


@register(ops.PowOp)
def _pow(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """x^e for a constant e. An integer e is monotone on each side of 0, so on a box excluding
    0 the values at its ends bound it; a box holding 0 adds 0 for an even positive e (the
    minimum), +inf for an even negative one (the pole) and [-inf, inf] for an odd negative one.
    A non-integer e is monotone on x >= 0, its domain: no box where a box reaches below 0.
    The ends are stepped `ULPS` outward (libm's pow), over the float64 and the run's values."""
    (a,) = boxes
    e = node.meta("exponent")
    if e == 0:
        return Box.point(np.ones(a.shape))
    integer = float(e).is_integer()
    if not integer and not np.all(a.lo >= 0):
        return None
    ends = [reference(node, v) for v in (a.lo, a.hi)]
    if out.dtype is not F64:
        ends += [
            np.asarray(reference(node, v.astype(out.dtype), dtype=out.dtype), dtype=F64)
            for v in (a.lo, a.hi)
        ]
    low, high = np.minimum.reduce(ends), np.maximum.reduce(ends)
    holds_zero = (a.lo <= 0) & (a.hi >= 0)
    if integer and e % 2 == 0:
        if e > 0:
            low = np.where(holds_zero, 0.0, low)
        else:
            high = np.where(holds_zero, np.inf, high)
    elif integer and e < 0:
        low, high = np.where(holds_zero, -np.inf, low), np.where(holds_zero, np.inf, high)
    return Box(out.down(low, ops.PowOp.ULPS), out.up(high, ops.PowOp.ULPS))


@register(ops.PowElemOp)
def _pow_elem(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """a^b elementwise. For fixed a > 0, a^b is monotone in b, and for fixed b monotone in
    a >= 0, so over a box with a >= 0 the four corners bound it; a box of b that is one integer
    is monotone on each side of 0 (as `pow`'s rule: a box of a holding 0 adds 0 for an even
    positive power, +inf for an even negative one, [-inf, inf] for an odd negative one). Where a
    reaches below 0 and b is not one integer (NaN for some a, b) and where b's box holds more
    than one value and a's reaches 0 or below, the box is unbounded, [-inf, inf]. The ends
    are stepped `ULPS` outward (libm's pow), over the float64 and the run's values."""
    a, b = boxes
    corners = [(x, e) for x in (a.lo, a.hi) for e in (b.lo, b.hi)]
    ends = [reference(node, x, e) for x, e in corners]
    if out.dtype is not F64:
        ends += [
            np.asarray(
                reference(node, x.astype(out.dtype), e.astype(out.dtype), dtype=out.dtype),
                dtype=F64,
            )
            for x, e in corners
        ]
    with np.errstate(invalid="ignore"):
        low, high = np.minimum.reduce(ends), np.maximum.reduce(ends)
    point = b.lo == b.hi
    integer = point & (np.floor(b.lo) == b.lo)
    holds_zero = (a.lo <= 0) & (a.hi >= 0)
    even = integer & (np.mod(b.lo, 2) == 0)
    low = np.where(even & (b.lo > 0) & holds_zero, 0.0, low)
    high = np.where(even & (b.lo < 0) & holds_zero, np.inf, high)
    unbounded = (integer & ~even & (b.lo < 0) & holds_zero) | ((a.lo < 0) & ~integer)
    unbounded |= ~point & (a.lo <= 0)
    low, high = np.where(unbounded, -np.inf, low), np.where(unbounded, np.inf, high)
    return Box(out.down(low, ops.PowElemOp.ULPS), out.up(high, ops.PowElemOp.ULPS))


@register(ops.LessOp)
def _less(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """1 where every a of its box is below every b, 0 where none is, else [0, 1] (exact)."""
    a, b = boxes
    surely, never = a.hi < b.lo, a.lo >= b.hi
    return Box(np.where(surely, 1.0, 0.0), np.where(never, 0.0, 1.0))


@register(ops.WhereOp)
def _where(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """a's box where the condition's box excludes 0, b's where it is the point 0, else the hull
    of both (the value is one of them; exact)."""
    condition, a, b = boxes
    true = (condition.lo > 0) | (condition.hi < 0)
    false = (condition.lo == 0) & (condition.hi == 0)
    low = np.where(true, a.lo, np.where(false, b.lo, np.minimum(a.lo, b.lo)))
    high = np.where(true, a.hi, np.where(false, b.hi, np.maximum(a.hi, b.hi)))
    return Box(low, high)


#: pad moves values and adds constants: the reference rule on lo and on hi.
register(ops.PadOp)(_exact_monotone)


@register(ops.SafeLogOp)
def _safe_log(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """log(softplus(x) + eps), step by step as the reference computes it; None if the sum's
    box reaches 0."""
    x, eps = boxes
    softplus = out.monotone(x, ops.softplus, COMPOSITE_ULPS)
    total = out.add(softplus, eps)
    if not np.all(total.lo > 0):
        return None
    return out.monotone(total, np.log, LIBM_ULPS)


#: Where each piecewise-monotone op changes direction, per `approximate` mode, to 17 digits
#: (mpmath, 40 digits): gelu's minimum; gelu_grad's minimum and maximum (+-sqrt 2 exactly for
#: the erf form).
CRITICAL_POINTS: dict[type[NodeOp], dict[str, tuple[float, ...]]] = {
    ops.GeluOp: {"none": (-0.7517915246935645,), "tanh": (-0.7524614220710163,)},
    bw.GeluGradOp: {
        "none": (-math.sqrt(2), math.sqrt(2)),
        "tanh": (-1.4185040087908284, 1.4185040087908284),
    },
}
#: A critical point this close to the box counts as inside; its value is widened by this much
#: (f' = 0 there, so a 1e-16 error in the point moves the value by far less).
CRITICAL_X_MARGIN, CRITICAL_Y_MARGIN = 1e-9, 1e-12


def piecewise(op_class: type[NodeOp]) -> None:
    """An elementwise op monotone between its `CRITICAL_POINTS`: the box spans the reference
    values at both ends and at every critical point inside the box.

    The reference's own evaluation error is absolute, not relative, where 1 + erf (1 + tanh)
    cancels for negative x and through the cubic term of the tanh form: at most of order
    u (1 + M + M^2 + M^3 + M^4), M = max |x|, which the box is widened by."""

    def rule(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
        (a,) = boxes
        at_lo, at_hi = reference(node, a.lo), reference(node, a.hi)
        low, high = np.minimum(at_lo, at_hi), np.maximum(at_lo, at_hi)
        for c in CRITICAL_POINTS[op_class][node.meta("approximate")]:
            inside = (a.lo <= c + CRITICAL_X_MARGIN) & (a.hi >= c - CRITICAL_X_MARGIN)
            y = float(reference(node, np.asarray(c)))
            low = np.where(inside, np.minimum(low, y - CRITICAL_Y_MARGIN), low)
            high = np.where(inside, np.maximum(high, y + CRITICAL_Y_MARGIN), high)
        box = Box(out.down(low, COMPOSITE_ULPS), out.up(high, COMPOSITE_ULPS))
        m = a.magnitude()
        with np.errstate(all="ignore"):
            err = COMPOSITE_ULPS * out.u * (1 + m + m**2 + m**3 + m**4)
        return out.widen(box, err)

    register(op_class)(rule)


piecewise(ops.GeluOp)
piecewise(bw.GeluGradOp)


def periodic(op_class: type[NodeOp], f: Callable[[np.ndarray], np.ndarray], peak: float) -> None:
    """sin/cos: f(lo) .. f(hi) unless the box holds a maximum (phase `peak` + 2 pi k, value 1)
    or a minimum (`peak` + pi + 2 pi k, value -1). The containment test errs towards holding."""

    def rule(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
        (a,) = boxes
        with np.errstate(all="ignore"):
            at_lo, at_hi = f(a.lo), f(a.hi)
        low = out.down(np.minimum(at_lo, at_hi), LIBM_ULPS)
        high = out.up(np.maximum(at_lo, at_hi), LIBM_ULPS)
        low = np.where(_holds_phase(a, peak + math.pi), -1.0, low)
        high = np.where(_holds_phase(a, peak), 1.0, high)
        return Box(np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0))

    register(op_class)(rule)


def _holds_phase(a: Box, phase: float) -> np.ndarray:
    """Whether [lo, hi] may contain phase + 2 pi k for an integer k (true when unsure)."""
    turn = 2 * math.pi
    with np.errstate(all="ignore"):
        slack = 1e-9 + 1e-15 * a.magnitude()
        first = np.ceil((a.lo - phase) / turn - slack)
        last = np.floor((a.hi - phase) / turn + slack)
        return ~(first > last)


periodic(ops.SinOp, np.sin, math.pi / 2)
periodic(ops.CosOp, np.cos, 0.0)


# --------------------------------------------------------------------------------------------
# Linear maps: sums, means, pooling, linear, conv (midpoint-radius = the min/max split)
# --------------------------------------------------------------------------------------------


def _linear_by_reference(node: NodeOp, a: Box, out: Outward, terms: int) -> Box:
    """A linear op with non-negative coefficients and no payload: |L| = L."""
    return out.linear_map(a, lambda v: reference(node, v), lambda v: reference(node, v), terms)


@register(ops.SumOp)
def _sum(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _linear_by_reference(node, boxes[0], out, max(numel(boxes[0].shape), 1))


@register(ops.ReduceSumOp)
def _reduce_sum(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _linear_by_reference(node, boxes[0], out, boxes[0].shape[node.meta("axis")])


@register(ops.ReduceMeanOp)
def _reduce_mean(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _linear_by_reference(node, boxes[0], out, boxes[0].shape[node.meta("axis")] + 1)


@register(ops.AvgPoolOp)
def _avg_pool(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Zero padding counts in the divisor, as in the reference: a fixed positive average."""
    return _linear_by_reference(node, boxes[0], out, math.prod(node.meta("kernel")) + 1)


def _weighted(
    node: NodeOp, a: Box, record: Record, out: Outward, bias_view: tuple[int, ...]
) -> Box:
    """W x + b with W from the payload: centre W m + b, radius |W| r (per weight, the min/max
    split min(w lo, w hi) = w m - |w| r); `terms` products and additions per output; the bias
    reshaped to `bias_view` broadcasts against the output. |W| comes from the interval record
    (`ABS_WEIGHT`); a record built elsewhere (tlc.semantics.program's interval arithmetic)
    lacks it."""
    weight = record["weight"]
    terms = math.prod(weight.shape[1:]) + 1  # [out, in] or [out, in/groups, k...]
    magnitude = {"weight": record[ABS_WEIGHT] if ABS_WEIGHT in record else np.abs(weight)}
    return out.linear_map(
        a,
        lambda v: reference(node, v, record=record),
        lambda v: reference(node, v, record=magnitude),
        terms,
        offset=np.abs(record["bias"]).reshape(bias_view) if "bias" in record else 0.0,
    )


@register(bw.AvgPoolGradOp)
def _avg_pool_grad(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Each window's cotangent spread evenly over the window: a fixed positive linear map; a
    position gathers at most prod(kernel) shares."""
    return _linear_by_reference(node, boxes[0], out, math.prod(node.meta("kernel")) + 1)


def _products(node: NodeOp, boxes: list[Box], out: Outward, terms: int) -> Box:
    """Sums of products of the two parents, `terms` products per output element."""
    return out.bilinear_map(*boxes, lambda a, b: reference(node, a, b), terms)


@register(bw.ConvInputGradOp)
def _conv_input_grad(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Cotangent x kernel: an input position meets out/groups channels at every kernel tap."""
    m = node.metadata()
    return _products(node, boxes, out, m["out_channels"] // m["groups"] * math.prod(m["kernel"]))


@register(bw.ConvWeightGradOp)
def _conv_weight_grad(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Input x cotangent: a kernel entry sums over every output position of its channel."""
    return _products(node, boxes, out, numel(boxes[1].shape) // node.meta("out_channels"))


@register(ops.LinearOp)
def _linear(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _weighted(node, boxes[0], record, out, (-1,))


@register(ops.ConvOp)
def _conv(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Zero padding is a point box [0, 0]; each output sums its receptive field like linear."""
    return _weighted(node, boxes[0], record, out, (-1,) + (1,) * len(node.meta("kernel")))


@register(ops.MatmulOp)
def _matmul(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Interval products a_ik * b_kj (four endpoint products each), then a directed sum over k."""
    a, b = boxes
    products = out.mul(
        Box(a.lo[..., :, :, None], a.hi[..., :, :, None]),
        Box(b.lo[..., None, :, :], b.hi[..., None, :, :]),
    )
    inner = a.shape[-1]

    def total(v: np.ndarray) -> np.ndarray:
        return np.sum(v, axis=-2)

    return out.linear_map(products, total, total, max(inner, 1))


# --------------------------------------------------------------------------------------------
# Compositions computed step by step, as the reference does
# --------------------------------------------------------------------------------------------


def _sqrt(a: Box, out: Outward) -> Box | None:
    return out.monotone(a, np.sqrt, 1) if np.all(a.lo >= 0) else None


def default_eps(node: NodeOp, record: Record, out: Outward) -> Box:
    """The record's eps, else the schema's default as the run's dtype sees it."""
    return Box.point(np.asarray(payload_field(node, record, "eps", out.dtype), dtype=F64))


@register(ops.BatchNormEvalOp)
def _batch_norm(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """(x - mean) * (gamma / sqrt(var + eps)) + beta per channel; the scale's sign is the
    interval product's business."""
    (a,) = boxes
    view = [1] * len(a.shape)
    axis = node.meta("channel_axis")
    view[axis] = a.shape[axis]

    def channel(name: str) -> Box:
        return Box.point(record[name].reshape(view))

    root = _sqrt(out.add(channel("var"), default_eps(node, record, out)), out)
    scale = None if root is None else out.div(channel("gamma"), root)
    if scale is None:
        return None
    return out.add(out.mul(out.sub(a, channel("mean")), scale), channel("beta"))


@register(ops.LayernormOp)
def _layernorm(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """centred = x - mean(x) as one linear map (so x_i's own share cancels), var = mean of
    squares, y = centred / sqrt(var + eps), clipped to |y| <= sqrt(n) (|c_i|^2 <= n var), then
    gamma and beta. None if sqrt(var + eps) may be 0 (eps = 0)."""
    (a,) = boxes
    axes = tuple(range(node.meta("axis"), len(a.shape)))
    n = numel(a.shape[node.meta("axis") :])

    def mean(v: np.ndarray) -> np.ndarray:
        return np.mean(v, axis=axes, keepdims=True)

    centred = out.linear_map(a, lambda v: v - mean(v), lambda v: (1 - 2 / n) * v + mean(v), n + 1)
    var = out.linear_map(out.square(centred), mean, mean, n + 1)
    record = record or {}
    root = _sqrt(out.add(var, default_eps(node, record, out)), out)
    y = None if root is None else out.div(centred, root)
    if y is None:
        return None
    bound = np.nextafter(math.sqrt(n) * (1 + 8 * (n + 8) * out.u), np.inf)
    y = Box(np.maximum(y.lo, -bound), np.minimum(y.hi, bound))
    if "gamma" in record:
        y = out.mul(y, Box.point(record["gamma"]))
    if "beta" in record:
        y = out.add(y, Box.point(record["beta"]))
    return y


@register(ops.MseLossOp)
def _mse(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """mean((yhat - target)^2): sub, square, then the mean as a linear map."""
    squares = out.square(out.sub(*boxes))

    def mean(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.mean(v))

    return out.linear_map(squares, mean, mean, max(numel(squares.shape), 1) + 1)


# --------------------------------------------------------------------------------------------
# Softmax family: s_i = 1 / (1 + sum_{j != i} e^(x_j - x_i)), bounded with the other entries at
# their worst ends (the rule, in a form that cannot overflow into inf / inf)
# --------------------------------------------------------------------------------------------


def _others(a: Box, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Along the last axis, for each i: (an upper bound of sum_{j != i, allowed} e^(hi_j - lo_i),
    a lower bound of sum_{j != i, allowed} e^(lo_j - hi_i))."""
    n = a.shape[-1]
    others = ~np.eye(n, dtype=bool) & allowed[..., None, :]
    with np.errstate(all="ignore"):
        big = EXACT.up(np.exp(EXACT.up(a.hi[..., None, :] - a.lo[..., :, None])), LIBM_ULPS)
        small = EXACT.down(np.exp(EXACT.down(a.lo[..., None, :] - a.hi[..., :, None])), LIBM_ULPS)
        g = EXACT.gamma(n)
        upper = EXACT.up(np.sum(np.where(others, big, 0.0), axis=-1) * (1 + g))
        lower = EXACT.down(np.sum(np.where(others, np.maximum(small, 0.0), 0.0), axis=-1) * (1 - g))
    return upper, lower


def _softmax_slack(a: Box, out: Outward) -> np.ndarray:
    """Absolute error of the reference's e^(x - max) / sum and x - max - log(sum) in `d`:
    the shift's rounding grows with |x|, the sum's with n (docs/intervals.md)."""
    n = a.shape[-1]
    m = np.max(a.magnitude(), axis=-1, keepdims=True, initial=0.0)  # empty axis: empty box
    return 8 * out.u * (n + 16 + 4 * m)


def _masked_softmax(a: Box, allowed: np.ndarray, out: Outward) -> Box:
    upper_sum, lower_sum = _others(a, allowed)
    with np.errstate(all="ignore"):
        low = EXACT.down(1.0 / (1.0 + upper_sum))
        high = EXACT.up(1.0 / (1.0 + lower_sum))
    box = out.widen(Box(low, high), _softmax_slack(a, out))
    return Box(
        np.where(allowed, np.clip(box.lo, 0.0, 1.0), 0.0),
        np.where(allowed, np.clip(box.hi, 0.0, 1.0), 0.0),
    )


def _along_axis(node: NodeOp, a: Box, rule: Callable[[Box], Box]) -> Box:
    """`rule` (which works on the last axis) applied along the node's `axis`."""
    axis = node.meta("axis")
    return rule(a.map(lambda v: np.moveaxis(v, axis, -1))).map(lambda v: np.moveaxis(v, -1, axis))


def _log_softmax_last(a: Box, out: Outward) -> Box:
    """log s_i = -log(1 + sum_{j != i} e^(x_j - x_i)), at most 0."""
    upper_sum, lower_sum = _others(a, np.ones(a.shape, dtype=bool))
    with np.errstate(all="ignore"):
        low = -EXACT.up(np.log1p(upper_sum), LIBM_ULPS)
        high = -EXACT.down(np.log1p(lower_sum), LIBM_ULPS)
    box = out.widen(Box(low, high), _softmax_slack(a, out))
    return Box(box.lo, np.minimum(box.hi, 0.0))


@register(ops.SoftmaxOp)
def _softmax(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _along_axis(
        node, boxes[0], lambda a: _masked_softmax(a, np.ones(a.shape, dtype=bool), out)
    )


@register(ops.LogSoftmaxOp)
def _log_softmax(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    return _along_axis(node, boxes[0], lambda a: _log_softmax_last(a, out))


@register(ops.HardMaskedSoftmaxOp)
def _hard_masked_softmax(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """Softmax over the allowed entries of each last-axis row; blocked entries are exactly 0."""
    (a,) = boxes
    allowed = np.array(node.meta("allowed"), dtype=bool).reshape(a.shape)
    return _masked_softmax(a, allowed, out)


# --------------------------------------------------------------------------------------------
# Derived from the op's facts
# --------------------------------------------------------------------------------------------


def _within(op_class: type[UnaryOp], lo: np.ndarray) -> bool:
    """Whether every lower endpoint lies in the op's `DOMAIN` (always, without one)."""
    if op_class.DOMAIN is None:
        return True
    bound, strict = op_class.DOMAIN
    return bool(np.all(lo > bound if strict else lo >= bound))


def _endpoints(node: NodeOp, a: Box, out: Outward, direction: Monotone) -> Box | None:
    """A monotone elementwise op: its values at the endpoints (swapped where it decreases),
    stepped `ULPS` outward (not at all where exact); None outside its `DOMAIN`.

    An endpoint's value is the float64 one and, in a narrower run, also the run's own: a
    function whose dtype evaluation rounds a constant first (leaky_relu's slope) may sit an
    ULP off the float64 value, and the box must hold both."""
    op_class = type(node)
    assert issubclass(op_class, UnaryOp)
    if not _within(op_class, a.lo):
        return None

    def at(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        value = reference(node, v)
        if out.dtype is F64:
            return value, value
        narrow = np.asarray(reference(node, v.astype(out.dtype), dtype=out.dtype), dtype=F64)
        return np.minimum(value, narrow), np.maximum(value, narrow)

    (lo_min, lo_max), (hi_min, hi_max) = at(a.lo), at(a.hi)
    if direction is Monotone.INCREASING:
        low, high = lo_min, hi_max
    else:
        low, high = hi_min, lo_max
    if op_class.ULPS == 0:
        return Box(low, high)
    return Box(out.down(low, op_class.ULPS), out.up(high, op_class.ULPS))


def _decomposed(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """The op's decomposition on boxes, each part by its own interval rule (None where a part
    has no box)."""
    try:
        return node.decompose(IntervalEmitter(INTERVAL, out), *boxes)
    except NoBox:
        return None


def _elementwise(node: NodeOp, boxes: list[Box], record: Any, out: Outward) -> Box | None:
    """The endpoint rule where the node is monotone (`monotone()` may depend on metadata, as
    leaky_relu's slope sign), else its decomposition, else no box."""
    direction = node.monotone()  # type: ignore[attr-defined]
    if direction is not Monotone.NONE and type(node).defines("numpy"):
        return _endpoints(node, boxes[0], out, direction)
    if type(node).defines("decompose"):
        return _decomposed(node, boxes, record, out)
    return None


def _may_be_monotone(op_class: type[UnaryOp]) -> bool:
    """A unary op declared monotone, or whose `monotone()` depends on its metadata."""
    return op_class.MONOTONE is not Monotone.NONE or op_class.monotone is not UnaryOp.monotone


def _derived(op_class: type[NodeOp]) -> IntervalRule | None:
    if issubclass(op_class, UnaryOp) and op_class.defines("numpy") and _may_be_monotone(op_class):
        return _elementwise
    if issubclass(op_class, BinaryOp) and op_class.EXACT_MONOTONE:
        return _exact_monotone  # max, min: the result is one of the inputs
    if op_class.defines("decompose"):
        return _elementwise if issubclass(op_class, UnaryOp) else _decomposed
    return None


INTERVAL.derive(NODE_OPS, _derived)
INTERVAL.refuse(
    "which input receives a window's cotangent depends on the window's argmax, which can "
    "change inside a box; no rule written yet (a sound one would add hull(0, g) of every window "
    "to each of its positions)",
    bw.MaxPoolGradOp,
)
