"""Interval bound propagation: coverage of the op table, the seed's IBP table, rule tightness,
outward rounding checked with exact rationals, domains, and the sampled containment check."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tlc
from tlc.api.bounds import ball
from tlc.api.evaluate import prepare as prepare_document
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, OutputOp
from tlc.semantics import ibp as ibp_module
from tlc.semantics.containment import check_samples, sample_inputs
from tlc.semantics.ibp import ABS_WEIGHT, INTERVAL, ibp, prepare_ibp
from tlc.semantics.interval_arith import Box, Outward, sanitize
from tlc.tools.formatting import format_box
from tlc.tools.run import main as run_main

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X0 = [0.3, -0.2, 0.1, 0.4]

SEED_TABLE = [
    "[0.250000, -0.250000, 0.050000, 0.350000] .. [0.350000, -0.150000, 0.150000, 0.450000]",
    "[0.087000, -0.031500, -0.007500, 0.067500, -0.015000] .. "
    "[0.127000, -0.002500, 0.015500, 0.094500, 0.009000]",
    "[0.087000, 0.000000, 0.000000, 0.067500, 0.000000] .. "
    "[0.127000, 0.000000, 0.015500, 0.094500, 0.009000]",
    "[0.025445, -0.016025, 0.011355] .. [0.029815, -0.012220, 0.018045]",
    "[0.020775] .. [0.035640]",
    "[0.020772] .. [0.035625]",
]

F64, F32 = np.float64, np.float32


# --------------------------------------------------------------------------------------------
# The seed's MLP
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arithmetic", ["f64", "f32"])
def test_seed_ibp_table(arithmetic: str) -> None:
    boxes = tlc.ibp(MLP, X0, 0.05, dtype=arithmetic)
    assert [format_box(b) for b in boxes] == SEED_TABLE


def test_seed_boxes_hold_the_value_table() -> None:
    boxes = tlc.ibp(MLP, X0, 0.05)
    table = tlc.run(MLP, X0)
    for box, value in zip(boxes, table.values, strict=True):
        assert box is not None and box.contains(value).all()


def test_point_box_is_the_value_up_to_rounding() -> None:
    boxes = tlc.ibp(MLP, X0, 0.0)
    value = float(tlc.run(MLP, X0).output)
    out = boxes[5]
    assert out.lo <= value <= out.hi
    assert out.hi - out.lo < 1e-15


@pytest.mark.parametrize("arithmetic", ["f64", "f32"])
def test_check_samples_passes_on_the_mlp(arithmetic: str) -> None:
    report = tlc.check_samples(MLP, X0, 0.05, samples=50, dtype=arithmetic)
    assert report.ok and report.samples == 50
    assert format_box(report.boxes[5]) == SEED_TABLE[5]


# --------------------------------------------------------------------------------------------
# The sampled check catches an unsound rule, and the tool reports the counterexample
# --------------------------------------------------------------------------------------------


def _too_narrow_tanh(node, boxes, record, out):  # noqa: ANN001, ANN202
    """A broken tanh rule: only the box centre, as a point."""
    (a,) = boxes
    centre = np.tanh(0.5 * a.lo + 0.5 * a.hi)
    return Box(centre, centre)


def test_check_samples_reports_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(INTERVAL._rules, ops.TanhOp, _too_narrow_tanh)
    report = tlc.check_samples(MLP, X0, 0.05, samples=50)
    v = report.violation
    assert v is not None and v.node_id == 5 and v.sample == 0 and v.index == ()
    assert not v.box.contains(v.value).all()
    np.testing.assert_allclose(v.inputs[0], X0, rtol=1e-15)  # sample 0: the box centre
    assert report.samples == 1


def test_tool_prints_the_counterexample(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(INTERVAL._rules, ops.TanhOp, _too_narrow_tanh)
    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    argv = [str(path), "--input", "0.3,-0.2,0.1,0.4", "--arithmetic", "interval"]
    code = run_main([*argv, "--radius", "0.05", "--samples", "50"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[0].startswith(f"{path}:8:3: error: samples: node 5 leaves its box on sample 0 of 50")
    assert err[1] == "  %5 = tanh(%4) : []"
    assert err[3].startswith("note: input 0: [0.3")
    assert err[4].startswith("note: node 5 value: ")
    assert err[5].startswith("note: node 5 box: ")


@pytest.mark.parametrize(
    "extra",
    [["--radius", "0.1"], ["--samples", "3"]],
)
def test_interval_options_need_interval_arithmetic(extra: list[str], tmp_path: Path) -> None:
    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    assert run_main([str(path), "--input", "0.3,-0.2,0.1,0.4", *extra]) == 2


@pytest.mark.parametrize("extra", [["--radius", "-1"], ["--samples", "-2"], ["--radius", "nan"]])
def test_negative_radius_or_samples_are_usage_errors(extra: list[str], tmp_path: Path) -> None:
    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    args = [str(path), "--input", "0.3,-0.2,0.1,0.4", "--arithmetic", "interval", *extra]
    assert run_main(args) == 2


def test_empty_input_box_is_a_diagnostic() -> None:
    graph = _unary_graph(ops.TanhOp)
    with pytest.raises(tlc.core.diagnostics.DiagnosticError, match=r"empty box: lo > hi .* \[1\]"):
        ibp(graph, None, np.array([0.0, 2.0]), np.array([1.0, 1.0]))


# --------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------


def test_samples_are_deterministic_centre_vertices_and_interior() -> None:
    box = {0: Box(np.array([-1.0, 2.0]), np.array([1.0, 3.0]))}
    first = [p[0] for p in sample_inputs(box, 6)]
    again = [p[0] for p in sample_inputs(box, 6)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    np.testing.assert_array_equal(first[0], [0.0, 2.5])
    for k in (1, 3, 5):
        assert all(v in (lo, hi) for v, lo, hi in zip(first[k], [-1, 2], [1, 3], strict=True))
    for point in first:
        assert box[0].contains(point).all()


# --------------------------------------------------------------------------------------------
# Tightness: monotone ops use endpoint rules, not the global codomain
# --------------------------------------------------------------------------------------------


def _unary_graph(op: type[ops.NodeOp], fields: dict | None = None, shape=(2,)) -> GraphOp:  # noqa: ANN001
    x = ops.InputOp(0, [], shape)
    node = op(1, [x.result], shape, fields or {})
    return GraphOp("g", [x, node, OutputOp(node.result)])


def _box(op: type[ops.NodeOp], lo: list[float], hi: list[float], **fields) -> Box | None:  # noqa: ANN003
    graph = _unary_graph(op, fields, (len(lo),))
    return ibp(graph, None, np.array(lo), np.array(hi))[1]


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        (ops.TanhOp, np.tanh),
        (ops.SigmoidOp, lambda v: 1 / (1 + np.exp(-v))),
        (ops.ExpOp, np.exp),
        (ops.SoftplusOp, lambda v: np.log1p(np.exp(v))),
        (ops.SqrtOp, np.sqrt),
        (ops.LogOp, np.log),
    ],
)
def test_monotone_ops_use_endpoints(op: type[ops.NodeOp], fn) -> None:  # noqa: ANN001
    lo, hi = [0.020775, 1.5], [0.035640, 2.0]
    box = _box(op, lo, hi)
    assert box is not None
    np.testing.assert_allclose(box.lo, fn(np.array(lo)), rtol=1e-14)
    np.testing.assert_allclose(box.hi, fn(np.array(hi)), rtol=1e-14)
    assert np.all(box.lo < fn(np.array(lo))) and np.all(box.hi > fn(np.array(hi)))  # outward


def _leaky(v: np.ndarray, slope: float) -> np.ndarray:
    return np.where(v > 0, v, slope * v)


@pytest.mark.parametrize("slope", [0.01, 0.0, 2.5])
def test_leaky_relu_monotone_slope_is_one_step_outside_the_endpoints(slope: float) -> None:
    """slope >= 0: increasing (the op's `monotone()` fact), so the endpoint rule stepped one
    ULP outward (ULPS = 1): tight."""
    lo, hi = np.array([-2.0, -0.5, 0.25]), np.array([-1.0, 0.75, 3.0])
    graph = _unary_graph(ops.LeakyReluOp, {"negative_slope": slope}, (3,))
    box = ibp(graph, None, lo, hi)[1]
    assert box is not None
    np.testing.assert_array_equal(box.lo, np.nextafter(_leaky(lo, slope), -np.inf))
    np.testing.assert_array_equal(box.hi, np.nextafter(_leaky(hi, slope), np.inf))


def test_leaky_relu_f32_box_holds_the_f32_and_the_exact_values() -> None:
    """In float32 the slope 0.01 is rounded before the product, so the run's value at an
    endpoint differs from the float64 one; the box holds both and is at most one float32 step
    wider on each side."""
    lo, hi = np.array([-2.0, -0.5, 0.25]), np.array([-1.0, 0.75, 3.0])
    graph = _unary_graph(ops.LeakyReluOp, {"negative_slope": 0.01}, (3,))
    box = ibp(graph, None, lo, hi, F32)[1]
    assert box is not None
    for end, pick in ((lo, np.minimum), (hi, np.maximum)):
        run = _leaky(end.astype(F32), F32(0.01)).astype(F64)
        exact = _leaky(end, 0.01)
        assert box.contains(run).all() and box.contains(exact).all()
        outer = pick(run, exact)
        step = np.abs(np.nextafter(outer.astype(F32), F32(np.inf)) - outer.astype(F32))
        assert np.all(np.abs((box.lo if pick is np.minimum else box.hi) - outer) <= 2 * step)


@pytest.mark.parametrize("dtype", [F64, F32])
def test_leaky_relu_negative_slope_goes_through_its_decomposition(dtype: type) -> None:
    """slope < 0: not monotone, so the box is the decomposition's, max(x, s x) on boxes: sound
    (every sampled value, vertices included, is inside), exact where one branch dominates, and
    as wide as the interval max of the two branches where the box straddles the kink."""
    lo, hi = np.array([-2.0, -0.5, 0.25]), np.array([-1.0, 0.75, 3.0])
    graph = _unary_graph(ops.LeakyReluOp, {"negative_slope": -0.5}, (3,))
    report = check_samples(graph, None, lo, hi, 40, dtype)
    assert report.ok
    box = report.boxes[1]
    assert box is not None
    # [-2, -1] -> s x in [0.5, 1]; [-0.5, 0.75] -> max([-0.5, 0.75], [-0.375, 0.25])
    np.testing.assert_allclose(box.lo, [0.5, -0.375, 0.25], rtol=1e-6)
    np.testing.assert_allclose(box.hi, [1.0, 0.75, 3.0], rtol=1e-6)


def test_gelu_pieces() -> None:
    gelu = np.vectorize(lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2))))
    box = _box(ops.GeluOp, [-3.0, -0.5, -2.0], [-1.0, 1.0, 0.5], approximate="none")
    assert box is not None
    # decreasing piece: [gelu(hi), gelu(lo)]; straddling the minimum: gelu(x*) .. max of ends.
    # Tolerance: the box is widened by the evaluation-error bound 16 u (1 + M + .. + M^4),
    # about 2e-13 at M = 3.
    tol = {"rtol": 0, "atol": 1e-12}
    np.testing.assert_allclose(box.lo[0], gelu(-1.0), **tol)
    np.testing.assert_allclose(box.hi[0], gelu(-3.0), **tol)
    np.testing.assert_allclose(box.lo[1], gelu(-0.5), **tol)
    np.testing.assert_allclose(box.lo[2], -0.16997120747990366, rtol=0, atol=3e-12)
    np.testing.assert_allclose(box.hi[2], gelu(0.5), **tol)


def test_sin_and_cos_find_their_extrema() -> None:
    sin = _box(ops.SinOp, [0.1, 1.0, 4.0, -10.0], [0.5, 2.0, 5.0, 10.0])
    assert sin is not None
    np.testing.assert_allclose(sin.lo[:2], np.sin([0.1, 1.0]), rtol=1e-14)
    np.testing.assert_allclose(sin.hi, [np.sin(0.5), 1.0, np.sin(4.0), 1.0], rtol=1e-14)
    assert sin.lo[2] == -1.0 and sin.lo[3] == -1.0  # 3 pi / 2 in [4, 5]
    cos = _box(ops.CosOp, [0.5, -1.0], [1.0, 1.0])
    assert cos is not None
    np.testing.assert_allclose(cos.lo, np.cos([1.0, 1.0]), rtol=1e-14)
    np.testing.assert_allclose(cos.hi, [np.cos(0.5), 1.0], rtol=1e-14)


def test_softmax_box_is_attained_at_its_worst_corners() -> None:
    lo, hi = np.array([0.0, -1.0, 0.5]), np.array([0.3, 0.2, 0.6])
    box = _box(ops.SoftmaxOp, list(lo), list(hi), axis=0)
    assert box is not None

    def softmax(v: np.ndarray) -> np.ndarray:
        e = np.exp(v - v.max())
        return e / e.sum()

    for i in range(3):
        worst = np.where(np.arange(3) == i, lo, hi)
        best = np.where(np.arange(3) == i, hi, lo)
        # rtol: exp stepped 8 ULPs outward, the sums widened by gamma, plus the evaluation slack
        np.testing.assert_allclose(box.lo[i], softmax(worst)[i], rtol=1e-12)
        np.testing.assert_allclose(box.hi[i], softmax(best)[i], rtol=1e-12)


@pytest.mark.parametrize(
    ("op", "lo", "hi"),
    [
        (ops.LogOp, [1.0, 0.0], [2.0, 1.0]),
        (ops.SqrtOp, [1.0, -1e-300], [2.0, 1.0]),
        (ops.InvOp, [1.0, -1.0], [2.0, 1.0]),
    ],
)
def test_no_box_outside_the_domain(op: type[ops.NodeOp], lo: list[float], hi: list[float]) -> None:
    assert _box(op, lo, hi) is None
    assert _box(op, [1.0, 1.5], [2.0, 3.0]) is not None


def test_children_of_a_node_without_box_have_none() -> None:
    x = ops.InputOp(0, [], (2,))
    log = ops.LogOp(1, [x.result], (2,))
    exp = ops.ExpOp(2, [log.result], (2,))
    graph = GraphOp("g", [x, log, exp, OutputOp(exp.result)])
    boxes = ibp(graph, None, np.array([-1.0, 1.0]), np.array([1.0, 2.0]))
    assert boxes[0] is not None and boxes[1] is None and boxes[2] is None


# --------------------------------------------------------------------------------------------
# Outward rounding, checked against exact rational arithmetic
# --------------------------------------------------------------------------------------------

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _holds(box: Box, exact: Fraction) -> bool:
    lo, hi = float(box.lo), float(box.hi)
    above = lo == -math.inf or Fraction(lo) <= exact
    below = hi == math.inf or exact <= Fraction(hi)
    return above and below


@settings(max_examples=200, deadline=None)
@given(finite, finite, st.sampled_from([F64, F32]))
def test_arithmetic_encloses_the_exact_result(a: float, b: float, dtype: type) -> None:
    out = Outward(dtype)
    pa, pb = Box.point(np.asarray(a)), Box.point(np.asarray(b))
    fa, fb = Fraction(a), Fraction(b)
    assert _holds(out.add(pa, pb), fa + fb)
    assert _holds(out.sub(pa, pb), fa - fb)
    assert _holds(out.mul(pa, pb), fa * fb)
    if b != 0:
        quotient = out.div(pa, pb)
        assert quotient is not None and _holds(quotient, fa / fb)
    for bound in (out.add(pa, pb).lo, out.add(pa, pb).hi):  # endpoints on the run's grid
        assert float(np.asarray(bound).astype(dtype)) == float(bound)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(finite, min_size=1, max_size=12),
    st.lists(finite, min_size=12, max_size=12),
    st.sampled_from([F64, F32]),
)
def test_linear_map_encloses_the_exact_dot_product(xs: list[float], ws: list[float], dtype) -> None:  # noqa: ANN001
    x = np.array(xs)
    w = np.array(ws[: len(xs)])
    box = Outward(dtype).linear_map(
        Box.point(x), lambda v: np.asarray(w @ v), lambda v: np.asarray(np.abs(w) @ v), len(xs)
    )
    exact = sum((Fraction(a) * Fraction(b) for a, b in zip(ws, xs, strict=False)), Fraction(0))
    assert _holds(box, exact)


def test_outward_steps_leave_the_grid_point() -> None:
    out32 = Outward(F32)
    x = np.array([0.1, 1.0, -3.0])
    down, up = out32.down(x), out32.up(x)
    assert np.all(down < x) and np.all(up > x)
    assert np.array_equal(down.astype(F32).astype(F64), down)
    assert np.all(Outward(F64).down(x) == np.nextafter(x, -np.inf))


# --------------------------------------------------------------------------------------------
# The prepared form
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
def test_prepared_ibp_converts_once_and_matches_ibp(
    monkeypatch: pytest.MonkeyPatch, dtype: type
) -> None:
    """One `prepare_ibp`, many boxes: every call is bit-identical to a fresh `ibp`, and a call
    neither re-checks the payload nor re-infers shapes (both are broken after preparing)."""
    graph, payload, x = prepare_document(MLP, X0, None, None)
    balls = [ball(x, radius) for radius in (0.0, 0.05, 0.5)]
    fresh = [ibp(graph, payload, lo, hi, dtype) for lo, hi in balls]
    propagate = prepare_ibp(graph, payload, dtype)
    for step in propagate.steps:
        if step.record is not None and "weight" in step.record:
            assert np.array_equal(step.record[ABS_WEIGHT], np.abs(step.record["weight"]))

    def unused(*args: object) -> None:
        raise AssertionError("a prepared call redid per-graph work")

    monkeypatch.setattr(ibp_module, "prepare_records", unused)
    monkeypatch.setattr(ibp_module, "graph_shapes", unused)
    for (lo, hi), expected in zip(balls, fresh, strict=True):
        for got, want in zip(propagate(lo, hi), expected, strict=True):
            assert got is not None and want is not None
            assert got.lo.tobytes() == want.lo.tobytes() and got.hi.tobytes() == want.hi.tobytes()
    assert [format_box(b) for b in propagate(*balls[1])] == SEED_TABLE


# --------------------------------------------------------------------------------------------
# Module hygiene
# --------------------------------------------------------------------------------------------


def test_check_samples_api_matches_the_pass() -> None:
    graph = _unary_graph(ops.TanhOp)
    report = check_samples(graph, None, np.array([-1.0, 0.0]), np.array([1.0, 0.5]), 20)
    assert report.ok and report.samples == 20
    assert ibp_module.INTERVAL is INTERVAL


def test_a_box_nan_at_both_ends_widens_to_every_real() -> None:
    """Bounds that are NaN at both ends (inf - inf in both, as when a chain's bounds overflow
    while its values stay finite) are unknown, so the box is every real: keeping [nan, nan]
    as a box of the value NaN let a finite value (2.0e11 in a random chain's mse_loss) fall
    outside it."""
    box = sanitize(Box(np.array([np.nan, 1.0]), np.array([np.nan, np.nan])))
    assert box.lo.tolist() == [-np.inf, 1.0] and box.hi.tolist() == [np.inf, np.inf]
    assert box.contains(np.array([2.0e11, 3.0])).all()
