"""Verification of VNN-LIB properties: the engine behind `tlc-verify`.

A property (`tlc.frontends.vnnlib`) is a disjunction of cases, each an input box and output
rows `C y + d <= 0` describing a counterexample. The answer follows VNN-COMP's contract:

Cases that one CROWN pass over their whole box already refutes are done first; the others are
attacked (falsification), then split.

- `sat`: an input inside a case's box whose outputs satisfy the case's rows. Found by sampling
  and a signed-gradient attack (PGD with `tlc.vjp`), and reported only after the reference
  interpreter (`tlc.semantics.interpret`, in the run's arithmetic) has evaluated it again and
  every row holds;
- `unsat`: for every case, every box of a partition of its input box has a row whose sound
  lower bound (`tlc.semantics.crown`, rounded down, plus d rounded down) is > 0 (>= 0 for a
  strict row): no input of the box can satisfy that row. Boxes are split in halves along their
  widest input (relative to the case's box), CROWN bounding a batch of boxes per pass, while the
  input has at most `SPLIT_DIMENSIONS` coordinates;
- `unknown`: neither (too many boxes, or an input too large to split);
- `timeout`: the time limit passed first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tlc.core.diagnostics import DiagnosticError
from tlc.dialect.shapes import numel
from tlc.frontends.vnnlib import Case, Property
from tlc.semantics.crown import EXACT, PreparedCrown
from tlc.semantics.interpret import Prepared

#: Input splitting (complete verification) only for inputs this small.
SPLIT_DIMENSIONS = 16
#: Boxes bounded in one CROWN pass, and the most boxes a case may be split into.
BATCH, MAX_BOXES = 256, 200_000
#: Falsification effort: random points per case, attack restarts and steps.
SAMPLES, RESTARTS, STEPS = 256, 2, 25


@dataclass(frozen=True)
class Verdict:
    """The answer for one property: `result` (sat/unsat/unknown/timeout), for sat the checked
    counterexample (input and output, flat), and how long it took."""

    result: str
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    seconds: float = 0.0

    def text(self) -> str:
        """The VNN-COMP result text: the result line, for sat the assignment
        `((X_0 v) ... (Y_0 v) ...)`, each value printed exactly (repr of the double)."""
        if self.result != "sat":
            return self.result + "\n"
        assert self.x is not None and self.y is not None
        pairs = [f"(X_{i} {float(v)!r})" for i, v in enumerate(self.x)]
        pairs += [f"(Y_{i} {float(v)!r})" for i, v in enumerate(self.y)]
        return "sat\n(" + "\n ".join(pairs) + ")\n"


class Network:
    """A network prepared once: bounds (`PreparedCrown`), reference evaluation, gradients."""

    def __init__(self, bounds: PreparedCrown, evaluate: Prepared, payload: Any):
        self.bounds, self.evaluate, self.payload = bounds, evaluate, payload
        self.input_shape = bounds.steps[bounds.single_input("tlc-verify")].shape
        self.output_shape = bounds.steps[bounds.output_id].shape

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """The reference output for a flat input, flat."""
        return np.asarray(self.evaluate(x.reshape(self.input_shape)).output).ravel()

    def gradient(self, x: np.ndarray, row: np.ndarray) -> np.ndarray:
        """d (row . y) / dx at flat x, flat."""
        from tlc.api.autodiff import vjp

        cotangent = row.reshape(self.output_shape)
        dx, _ = vjp(self.evaluate.graph, self.payload, x.reshape(self.input_shape), cotangent)
        return np.asarray(dx).ravel()


def check_sizes(net: Network, prop: Property, net_name: str, prop_name: str) -> None:
    inputs, outputs = numel(net.input_shape), max(numel(net.output_shape), 1)
    if (prop.inputs, prop.outputs) != (inputs, outputs):
        raise DiagnosticError.simple(
            f"{prop_name} declares {prop.inputs} inputs and {prop.outputs} outputs, but "
            f"{net_name} has {inputs} inputs and {outputs} outputs"
        )


def verify(net: Network, prop: Property, timeout: float = 60.0, seed: int = 0) -> Verdict:
    """Decide `prop` on `net` within `timeout` seconds (see the module docstring)."""
    start = time.monotonic()
    deadline = start + timeout

    def done(result: str, x: Any = None, y: Any = None) -> Verdict:
        return Verdict(result, x, y, time.monotonic() - start)

    rng = np.random.default_rng(seed)
    open_cases = [case for case in prop.cases if not _refuted_at_root(net, case)]
    for case in open_cases:
        found = _falsify(net, case, rng, deadline)
        if found is not None:
            return done("sat", *found)
        if time.monotonic() > deadline:
            return done("timeout")
    undecided = False
    for case in open_cases:
        outcome = _branch_and_bound(net, case, deadline)
        if isinstance(outcome, tuple):
            return done("sat", *outcome)
        if outcome == "timeout":
            return done("timeout")
        undecided |= outcome == "unknown"
    return done("unknown" if undecided else "unsat")


def _confirmed(net: Network, case: Case, x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(x, y) if x, clipped into the case's box, is a counterexample by the reference."""
    x = np.clip(x, case.lo, case.hi)
    y = net.outputs(x)
    return (x, y) if case.holds(y) else None


def _objective(case: Case, y: np.ndarray) -> tuple[float, int]:
    """max over rows of C y + d (a counterexample makes it <= 0) and the row attaining it."""
    values = case.C @ y + case.d
    k = int(np.argmax(values))
    return float(values[k]), k


def _falsify(
    net: Network, case: Case, rng: np.random.Generator, deadline: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Random points of the box (centre first), then signed-gradient descent on the objective
    from the best points."""
    if len(case.C) == 0:
        return _confirmed(net, case, 0.5 * case.lo + 0.5 * case.hi)
    width = case.hi - case.lo
    points = [0.5 * case.lo + 0.5 * case.hi]
    points += list(case.lo + width * rng.random((SAMPLES, len(case.lo))))
    scored = []
    for x in points:
        if time.monotonic() > deadline:
            return None
        found = _confirmed(net, case, x)
        if found is not None:
            return found
        scored.append((_objective(case, net.outputs(x))[0], x))
    scored.sort(key=lambda item: item[0])
    for _, x in scored[:RESTARTS]:
        step = 0.25 * width
        for _ in range(STEPS):
            if time.monotonic() > deadline:
                return None
            _, k = _objective(case, net.outputs(x))
            x = np.clip(x - step * np.sign(net.gradient(x, case.C[k])), case.lo, case.hi)
            found = _confirmed(net, case, x)
            if found is not None:
                return found
            step = step * 0.85
    return None


def _refuted(case: Case, lower: np.ndarray) -> np.ndarray:
    """Per box: whether some row's sound lower bound of C y + d shows it cannot hold."""
    with np.errstate(all="ignore"):
        margin = EXACT.down(lower + case.d)
    return np.any(np.where(case.strict, margin >= 0, margin > 0), axis=1)


def _refuted_at_root(net: Network, case: Case) -> bool:
    """Whether one CROWN pass over the case's whole box already shows it cannot hold (then
    there is nothing to falsify)."""
    if len(case.C) == 0:
        return False
    shape = (1,) + net.input_shape
    result = net.bounds(case.lo.reshape(shape), case.hi.reshape(shape), "crown", case.C)
    return bool(_refuted(case, result.lower)[0])


def _branch_and_bound(
    net: Network, case: Case, deadline: float
) -> str | tuple[np.ndarray, np.ndarray]:
    """ "unsat", "unknown", "timeout" or a confirmed counterexample for one case."""
    if len(case.C) == 0:
        return "unknown"  # no output condition: every input is a counterexample (found above)
    shape = net.input_shape
    scale = np.where(case.hi > case.lo, case.hi - case.lo, 1.0)
    queue = [(case.lo, case.hi)]
    bounded = 0
    while queue:
        if time.monotonic() > deadline:
            return "timeout"
        batch, queue = queue[:BATCH], queue[BATCH:]
        lo = np.stack([b[0] for b in batch])
        hi = np.stack([b[1] for b in batch])
        result = net.bounds(lo.reshape((-1,) + shape), hi.reshape((-1,) + shape), "crown", case.C)
        bounded += len(batch)
        open_boxes = [
            b for b, done in zip(batch, _refuted(case, result.lower), strict=True) if not done
        ]
        if not open_boxes:
            continue
        if len(case.lo) > SPLIT_DIMENSIONS or bounded + len(queue) > MAX_BOXES:
            return "unknown"
        for low, high in open_boxes:
            found = _confirmed(net, case, 0.5 * low + 0.5 * high)
            if found is not None:
                return found
            axis = int(np.argmax((high - low) / scale))
            middle = 0.5 * low[axis] + 0.5 * high[axis]
            left_hi, right_lo = high.copy(), low.copy()
            left_hi[axis], right_lo[axis] = middle, middle
            queue += [(low, left_hi), (right_lo, high)]
    return "unsat"
