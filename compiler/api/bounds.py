"""Bounds of a document's graph: the glue behind `tlc.bounds`, `tlc.ibp`, `tlc.check_samples`
and `tlc-run --arithmetic interval` (the rules are in `tlc.semantics.ibp` and
`tlc.semantics.crown`).

The input box is the l-infinity ball of `radius` around the input `x`: [x - radius, x + radius],
both ends rounded outward so the ball of the float64 `x` and `radius` is inside it. A graph with
several input nodes takes `x` as `{node id: array}`, one radius for all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import choose, dtype_of, for_batch, prepare
from tlc.core.diagnostics import Diagnostic, DiagnosticError, error
from tlc.dialect.batch import has_batch
from tlc.dialect.ops import GraphOp, InputOp
from tlc.dialect.shapes import numel
from tlc.semantics.interval_arith import Box

if TYPE_CHECKING:
    from tlc.semantics.containment import SampleReport
    from tlc.semantics.crown import Bounds, PreparedCrown


def ball(x: Any, radius: float) -> tuple[Any, Any]:
    """(lo, hi) of the l-infinity ball, rounded outward; `x` an array or `{node id: array}`."""
    if not radius >= 0:
        raise DiagnosticError.simple(f"radius must be a number >= 0, got {radius}")

    def ends(v: Any) -> tuple[np.ndarray, np.ndarray]:
        v = np.asarray(v, dtype=np.float64)
        if radius == 0:
            return v, v
        with np.errstate(all="ignore"):
            return np.nextafter(v - radius, -np.inf), np.nextafter(v + radius, np.inf)

    if isinstance(x, Mapping):
        pairs = {nid: ends(v) for nid, v in x.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    return ends(x)


def input_box(lo: Any = None, hi: Any = None, center: Any = None, radius: Any = None) -> tuple:
    """(lo, hi) from either the ends or a centre and a radius (a number or one per coordinate,
    broadcast against the centre), the ball's ends rounded outward. Exactly one form. For a
    graph with several input nodes each is `{node id: array}` (a radius may be one number)."""
    if isinstance(lo if lo is not None else center, Mapping):
        keys = lo if lo is not None else center

        def part(v: Any, k: int) -> Any:
            return v[k] if isinstance(v, Mapping) else v

        pairs = {k: input_box(part(lo, k), part(hi, k), part(center, k), part(radius, k))
                 for k in keys}  # fmt: skip
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if (lo is None) != (hi is None):
        raise DiagnosticError.simple("bounds: give both lo and hi, or center and radius")
    if lo is not None:
        if center is not None or radius is not None:
            raise DiagnosticError.simple("bounds: give lo/hi or center/radius, not both")
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if center is None:
        raise DiagnosticError.simple("bounds: give the input box as lo/hi or center/radius")
    mid = np.asarray(center, dtype=np.float64)
    rad = np.asarray(0.0 if radius is None else radius, dtype=np.float64)
    if not np.all(rad >= 0):
        raise DiagnosticError.simple("bounds: radius must be >= 0 (every coordinate)")
    mid, rad = np.broadcast_arrays(mid, rad)
    with np.errstate(all="ignore"):
        low = np.where(rad == 0, mid, np.nextafter(mid - rad, -np.inf))
        high = np.where(rad == 0, mid, np.nextafter(mid + rad, np.inf))
    return low, high


def prepared_bounds(
    source: Any,
    payload: Any = None,
    graph: str | None = None,
    dtype: str = "f64",
    box_shape: tuple[int, ...] | None = None,
) -> PreparedCrown:
    """A document, module, tl.graph op or traced model (`tlc.from_onnx`) checked once for
    repeated `tlc.bounds` calls in `dtype` (f64/f32). A graph with the batch extent `N` is
    specialised to the batch size of boxes of `box_shape` (one box, or a batch of boxes)."""
    from tlc.semantics.crown import prepare_crown
    from tlc.semantics.program import Traced

    if isinstance(source, Traced) and not source.per_output:  # else graph= chooses an output
        chosen, records = source.graph, payload if payload is not None else source.payload
    elif isinstance(source, GraphOp):
        chosen, records = source, payload
    else:
        chosen, records = choose(source, graph, payload)
    if has_batch(chosen):
        chosen = _for_box_batch(chosen, box_shape)
    return prepare_crown(chosen, records, dtype_of(dtype))


def _for_box_batch(graph: GraphOp, box_shape: tuple[int, ...] | None) -> GraphOp:
    """`graph` (with `N` in its input's shape) for boxes of `box_shape`: the input's own
    rank (one box) or one more (a batch of boxes, leading)."""
    node = next(n for n in graph.nodes if isinstance(n, InputOp))
    declared = node.declared_shape
    assert declared is not None, "checked graphs declare every shape"
    shape = box_shape or ()
    if len(shape) == len(declared) + 1:
        shape = shape[1:]
    return for_batch(graph, np.empty(shape))


def bounds(
    source: Any,
    lo: Any = None,
    hi: Any = None,
    center: Any = None,
    radius: Any = None,
    C: Any = None,
    method: str = "crown",
    dtype: str = "f64",
    payload: Any = None,
    graph: str | None = None,
) -> Bounds:
    """`tlc.bounds`: sound lower/upper bounds of the output (or of `C @ output`) over an input
    box, or a batch of boxes (arrays with a leading batch axis), by `method` ("ibp", "crown",
    "crown-ibp"); enclosing the real values and the `dtype` (f64/f32) reference values. A
    graph with several input nodes takes each of lo/hi/center (and radius, or one number) as
    `{node id: array}`."""
    from tlc.semantics.crown import PreparedCrown, bind_box

    low, high = input_box(lo, hi, center, radius)
    box_shape = None if isinstance(low, Mapping) else low.shape
    prepared = (
        source
        if isinstance(source, PreparedCrown)
        else prepared_bounds(source, payload, graph, dtype, box_shape)
    )
    if not isinstance(low, Mapping) and len(prepared.input_ids) == 1:
        shape = prepared.steps[prepared.input_id].shape
        if low.ndim == 1 and len(shape) != 1 and low.size == numel(shape):  # a flat list
            low, high = low.reshape(shape), high.reshape(shape)
    low, high, batched = bind_box(prepared, low, high)
    result = prepared(low, high, method, None if C is None else np.asarray(C, dtype=np.float64))
    if not batched:
        result.lower, result.upper = result.lower[0], result.upper[0]
        result.boxes = [None if b is None else Box(b.lo[0], b.hi[0]) for b in result.boxes]
    return result


def ibp(
    source: str | ModuleOp,
    x: Any,
    radius: float,
    payload: Any = None,
    graph: str | None = None,
    arithmetic: str = "f64",
) -> list[Box | None]:
    """`tlc.ibp`: a box per node (None where no sound rule applies) for inputs within `radius`
    of `x`, enclosing the real values and the `arithmetic` (f64/f32) reference values."""
    from tlc.semantics.ibp import prepare_ibp

    chosen, records, x = prepare(source, x, payload, graph)
    lo, hi = ball(x, radius)
    return prepare_ibp(chosen, records, dtype_of(arithmetic))(lo, hi)


def check_samples(
    source: str | ModuleOp,
    x: Any,
    radius: float,
    samples: int = 50,
    payload: Any = None,
    graph: str | None = None,
    arithmetic: str = "f64",
    seed: int = 0,
) -> SampleReport:
    """`tlc.check_samples`: `samples` deterministic inputs from the ball, each evaluated in
    `arithmetic` and checked against every node's box (see `tlc.semantics.containment`)."""
    from tlc.semantics.containment import check_samples as check

    chosen, records, x = prepare(source, x, payload, graph)
    lo, hi = ball(x, radius)
    return check(chosen, records, lo, hi, samples, dtype_of(arithmetic), seed)


def violation_error(graph: GraphOp, report: SampleReport, requested: int) -> DiagnosticError:
    """The counterexample as a diagnostic at the node: which sample, input, value and box."""
    v = report.violation
    assert v is not None, "only a failed check has a counterexample"
    node = graph.nodes[v.node_id]
    index = list(v.index)
    diag = error(
        f"samples: node {v.node_id} leaves its box on sample {v.sample} of {requested}: "
        f"value {_exact(v.value[v.index])} at index {index} is outside "
        f"[{_exact(v.box.lo[v.index])}, {_exact(v.box.hi[v.index])}]",
        node,
    ).diagnostics[0]
    for nid, value in v.inputs.items():
        diag.notes.append(Diagnostic("note", f"input {nid}: {_exact(value)}"))
    diag.notes.append(Diagnostic("note", f"node {v.node_id} value: {_exact(v.value)}"))
    diag.notes.append(
        Diagnostic("note", f"node {v.node_id} box: {_exact(v.box.lo)} .. {_exact(v.box.hi)}")
    )
    return DiagnosticError(diag)


def _exact(a: np.ndarray) -> str:
    """Every digit needed to tell neighbouring doubles apart (a violation may be one ULP)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(float(a))
    return "[" + ", ".join(_exact(row) for row in a) + "]"
