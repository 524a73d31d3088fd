"""Interval bounds of a document's graph: the glue behind `tlc.ibp`, `tlc.check_samples` and
`tlc-run --arithmetic interval` (the rules are in `tlc.semantics.ibp`).

The input box is the l-infinity ball of `radius` around the input `x`: [x - radius, x + radius],
both ends rounded outward so the ball of the float64 `x` and `radius` is inside it. A graph with
several input nodes takes `x` as `{node id: array}`, one radius for all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import dtype_of, prepare
from tlc.core.diagnostics import Diagnostic, DiagnosticError, error
from tlc.dialect.ops import GraphOp

if TYPE_CHECKING:
    from tlc.semantics.containment import SampleReport
    from tlc.semantics.interval_arith import Box


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
