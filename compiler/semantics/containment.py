"""The sampled containment check: evaluate sample inputs and check every node's value is in its box.

`check_samples(graph, payload, lo, hi, count, dtype)` propagates boxes with `ibp`, then evaluates
`count` deterministic inputs from the input box with the reference denotation (`interpret`, same
`dtype`) and compares every node's value with its box. Both are prepared once (`prepare_ibp`,
`prepare`), so the sample loop does only the reference fold and the comparison. It stops at the
first value outside its box and returns it as a `Violation` (node, sample input, value, box).
Like the seed's checker, a pass is a regression check (NaNs, broken dispatch, an unsound rule),
not an enclosure proof.

The samples (`sample_inputs`), for each input node's box [lo, hi]:
  sample 0 is the centre lo + (hi - lo) / 2;
  odd samples are vertices: each coordinate lo or hi, chosen by a coin from the stream;
  even samples are uniform points lo + (hi - lo) * U[0, 1) from the stream;
the stream is `numpy.random.Generator(PCG64(seed))` with seed 0 unless given, and every point is
clipped into the box. Vertices are where interval rules are tight, so they test soundness hardest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.semantics.ibp import Box, prepare_ibp
from tlc.semantics.interpret import bind_inputs, prepare


@dataclass(frozen=True)
class Violation:
    """A node value outside the node's box: the first offending element, and what produced it."""

    sample: int
    node_id: int
    index: tuple[int, ...]
    inputs: dict[int, np.ndarray]
    value: np.ndarray
    box: Box


@dataclass(frozen=True)
class SampleReport:
    """What `check_samples` did: the boxes, how many samples ran, the first violation if any."""

    boxes: list[Box | None]
    samples: int
    violation: Violation | None

    @property
    def ok(self) -> bool:
        return self.violation is None


def sample_inputs(
    boxes: dict[int, Box], count: int, seed: int = 0
) -> Iterator[dict[int, np.ndarray]]:
    """`count` inputs (input node id -> array) from the input boxes; see the module docstring."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for k in range(count):
        point = {}
        for nid, box in boxes.items():
            if k == 0:
                x = box.lo + (box.hi - box.lo) / 2
            elif k % 2:
                x = np.where(rng.random(box.shape) < 0.5, box.lo, box.hi)
            else:
                x = box.lo + (box.hi - box.lo) * rng.random(box.shape)
            point[nid] = np.clip(x, box.lo, box.hi)
        yield point


def check_samples(
    graph: GraphOp,
    payload: Payload | None,
    lo: Any,
    hi: Any,
    count: int,
    dtype: type = np.float64,
    seed: int = 0,
    boxes: list[Box | None] | None = None,
) -> SampleReport:
    """Propagate boxes for [lo, hi] (or take `boxes`, one per node, e.g. CROWN's), then check
    `count` sampled evaluations against them."""
    propagate = prepare_ibp(graph, payload, dtype)
    if boxes is None:
        boxes = propagate(lo, hi)
    lows = bind_inputs(graph, propagate.shapes, lo, np.float64)
    highs = bind_inputs(graph, propagate.shapes, hi, np.float64)
    input_boxes = {nid: Box(lows[nid], highs[nid]) for nid in lows}
    for nid, box in input_boxes.items():
        if not (np.all(np.isfinite(box.lo)) and np.all(np.isfinite(box.hi))):
            raise DiagnosticError.simple(f"samples: input {nid}: cannot sample an unbounded box")
    evaluate = prepare(graph, payload, dtype)
    for k, x in enumerate(sample_inputs(input_boxes, count, seed)):
        table = evaluate(x)
        for nid, box in enumerate(boxes):
            if box is None:
                continue
            value = np.asarray(table[nid], dtype=np.float64)
            outside = ~box.contains(value)
            if outside.any():
                index = tuple(int(i) for i in np.unravel_index(np.argmax(outside), outside.shape))
                return SampleReport(boxes, k + 1, Violation(k, nid, index, x, value, box))
    return SampleReport(boxes, count, None)


__all__ = ["SampleReport", "Violation", "check_samples", "sample_inputs"]
