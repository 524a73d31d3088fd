"""CROWN bounds (tlc.semantics.crown, tlc.bounds): agreement with an independent float64 oracle
on ReLU MLPs, never looser than IBP, enclosure of sampled outputs in f64 and f32, the other
relaxations (tanh, sigmoid, conv, pooling, batch norm, layout ops), fallbacks and API errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from crown_nets import mlp, random_layers
from crown_oracle import crown_mlp
from hypothesis import given, settings
from hypothesis import strategies as st

import tlc
from tlc.core.diagnostics import DiagnosticError

SEED_MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X = [0.3, -0.2, 0.1, 0.4]

SHAPES = [[5, 50, 50, 50, 5], [8, 20, 20, 3], [4, 30, 2], [10, 16, 16, 16, 16, 4]]


def _box(n: int, seed: int, radius: float) -> tuple[np.ndarray, np.ndarray]:
    centre = np.random.default_rng(seed).uniform(-1, 1, n)
    return centre - radius, centre + radius


@pytest.mark.parametrize("sizes", SHAPES)
@pytest.mark.parametrize("radius", [0.01, 0.1, 0.5])
def test_crown_equals_the_oracle(sizes: list[int], radius: float) -> None:
    layers = random_layers(sizes, seed=len(sizes))
    lo, hi = _box(sizes[0], 1, radius)
    got = tlc.bounds(mlp(layers), lo, hi, method="crown")
    want_lo, want_hi = crown_mlp(layers, lo, hi)
    scale = np.maximum(1.0, np.abs(want_hi - want_lo))
    assert np.all(np.abs(got.lower - want_lo) <= 1e-9 * scale)
    assert np.all(np.abs(got.upper - want_hi) <= 1e-9 * scale)
    assert np.all(got.lower <= want_lo + 1e-12 * scale)  # sound side: never inside the oracle


def test_spec_matrix_is_folded_into_the_last_layer() -> None:
    layers = random_layers([5, 40, 40, 4], seed=3)
    lo, hi = _box(5, 2, 0.2)
    spec = np.array([[1.0, -1, 0, 0], [1, 0, -1, 0], [1, 0, 0, -1]])
    got = tlc.bounds(mlp(layers), lo, hi, C=spec, method="crown")
    want_lo, want_hi = crown_mlp(layers, lo, hi, spec)
    np.testing.assert_allclose(got.lower, want_lo, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.upper, want_hi, rtol=1e-9, atol=1e-9)
    plain = tlc.bounds(mlp(layers), lo, hi, method="crown")
    naive = np.minimum(spec * plain.lower, spec * plain.upper).sum(axis=1)
    assert np.all(got.lower >= naive) and np.any(got.lower > naive + 1e-6)


@pytest.mark.parametrize("method", ["crown", "crown-ibp"])
def test_never_looser_than_ibp(method: str) -> None:
    layers = random_layers([6, 50, 50, 50, 50, 50, 50, 5], seed=4)
    for radius in (0.001, 0.05, 1.0, 10.0):
        lo, hi = _box(6, 5, radius)
        c = tlc.bounds(mlp(layers), lo, hi, method=method)
        i = tlc.bounds(mlp(layers), lo, hi, method="ibp")
        assert np.all(c.lower >= i.lower) and np.all(c.upper <= i.upper)


def test_crown_is_tighter_than_ibp_on_relu_mlps() -> None:
    layers = random_layers([5, 50, 50, 50, 5], seed=6)
    lo, hi = _box(5, 7, 0.05)
    c = tlc.bounds(mlp(layers), lo, hi, method="crown")
    i = tlc.bounds(mlp(layers), lo, hi, method="ibp")
    assert np.median(i.width / c.width) > 2


def _samples(lo: np.ndarray, hi: np.ndarray, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 2, (count // 2,) + lo.shape)
    uniform = rng.uniform(0, 1, (count - count // 2,) + lo.shape)
    return np.clip(lo + (hi - lo) * np.concatenate([corners, uniform]), lo, hi)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(1, 4),
    width=st.integers(1, 24),
    radius=st.floats(0.0, 3.0),
    activation=st.sampled_from(["relu", "tanh", "sigmoid"]),
    dtype=st.sampled_from(["f64", "f32"]),
    method=st.sampled_from(["crown", "crown-ibp"]),
)
def test_bounds_contain_sampled_outputs(
    seed: int, depth: int, width: int, radius: float, activation: str, dtype: str, method: str
) -> None:
    sizes = [3] + [width] * depth + [2]
    layers = random_layers(sizes, seed, scale=2.0)
    traced = mlp(layers, activation)
    lo, hi = _box(3, seed, radius)
    result = tlc.bounds(traced, lo, hi, method=method, dtype=dtype)
    for x in _samples(lo, hi, 40, seed):
        values = tlc.run(traced.module, x, traced.payload, dtype=dtype)
        for node_id, box in enumerate(result.boxes):
            assert box is not None and np.all(box.contains(values[node_id])), node_id
        assert np.all(result.lower <= values.output) and np.all(values.output <= result.upper)


def test_seed_mlp_tutorial_figures() -> None:
    crown = tlc.bounds(SEED_MLP, center=X, radius=0.05)
    ibp = tlc.bounds(SEED_MLP, center=X, radius=0.05, method="ibp")
    assert float(ibp.lower) == float(tlc.ibp(SEED_MLP, X, 0.05)[5].lo)
    assert 0.0247 < crown.lower < 0.0248 and 0.0312 < crown.upper < 0.0313
    assert crown.fallbacks == {}


def test_per_coordinate_radius_and_batches() -> None:
    radius = np.array([0.05, 0.0, 0.1, 0.0])
    one = tlc.bounds(SEED_MLP, center=X, radius=radius)
    batch = tlc.bounds(SEED_MLP, center=np.array([X, X]), radius=np.array([radius, radius / 2]))
    assert batch.lower.shape == (2,)
    assert batch.lower[0] == one.lower and batch.upper[0] == one.upper
    assert batch.lower[1] >= one.lower and batch.upper[1] <= one.upper
    assert batch.node(2).lo.shape == (2, 5)


def test_fallback_is_recorded() -> None:
    def program(ops, x, params):  # noqa: ANN001, ANN202
        h = ops.softmax(ops.reshape(ops.linear(x, params[0]), to=[4, 4]), axis=1)
        return ops.linear(ops.flatten(h), params[1])

    rng = np.random.default_rng(0)
    traced = tlc.trace(program, (3,), [rng.normal(size=(16, 3)), rng.normal(size=(2, 16))])
    result = tlc.bounds(traced, center=np.zeros(3), radius=0.1)
    assert list(result.fallbacks.values()) == [
        "softmax: no linear relaxation written; its interval box is used"
    ]


def test_cnn_relaxations_contain_samples() -> None:
    rng = np.random.default_rng(1)

    def program(ops, x, params):  # noqa: ANN001, ANN202
        h = ops.conv(x, params["k1"], params["b1"], stride=[2, 2], padding=[1, 1])
        h = ops.batch_norm_eval(h, *params["bn"])
        h = ops.relu(h)
        h = ops.avg_pool(h, kernel=[2, 2])
        left = ops.sigmoid(ops.permute(h, perm=[0, 2, 1]))
        h = ops.concat(ops.tanh(h), left, axis=0)
        h = ops.sub(ops.add(h, h), ops.relu(h))
        return ops.linear(ops.flatten(h), params["w"], params["b"])

    params = {
        "k1": rng.normal(size=(3, 2, 3, 3)),
        "b1": rng.normal(size=3),
        "bn": [
            rng.uniform(0.5, 2, 3),
            rng.normal(size=3),
            rng.normal(size=3),
            rng.uniform(0.5, 2, 3),
        ],
        "w": rng.normal(size=(4, 24)),
        "b": rng.normal(size=4),
    }
    traced = tlc.trace(program, (2, 8, 8), params)
    lo = rng.uniform(-1, 1, (2, 8, 8))
    for dtype in ("f64", "f32"):
        crown = tlc.bounds(traced, lo, lo + 0.2, dtype=dtype)
        ibp = tlc.bounds(traced, lo, lo + 0.2, dtype=dtype, method="ibp")
        assert crown.fallbacks == {}
        assert np.all(crown.lower >= ibp.lower) and np.all(crown.upper <= ibp.upper)
        assert np.sum(crown.width) < np.sum(ibp.width)
        for x in _samples(lo, lo + 0.2, 60, 2):
            y = tlc.run(traced.module, x, traced.payload, dtype=dtype).output
            assert np.all(crown.lower <= y) and np.all(y <= crown.upper)


def test_api_errors() -> None:
    with pytest.raises(DiagnosticError, match="give both lo and hi"):
        tlc.bounds(SEED_MLP, lo=X)
    with pytest.raises(DiagnosticError, match="radius must be >= 0"):
        tlc.bounds(SEED_MLP, center=X, radius=[0.1, -0.1, 0, 0])
    with pytest.raises(DiagnosticError, match="C must be a matrix with 1 columns"):
        tlc.bounds(SEED_MLP, center=X, radius=0.1, C=np.eye(2))
    with pytest.raises(DiagnosticError, match=r"C must be a matrix .* got shape \[\]$"):
        tlc.bounds(SEED_MLP, center=X, radius=0.1, C=np.array(1.0))  # was an IndexError
    with pytest.raises(ValueError, match="method must be one of ibp, crown, crown-ibp"):
        tlc.bounds(SEED_MLP, center=X, radius=0.1, method="deeppoly")


def _printed_ends(line: str) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = line.split(": ", 1)[1].split(" .. ")
    return (np.array([float(v) for v in end.strip("[]").split(",")]) for end in (lo, hi))


@pytest.mark.parametrize("method", ["ibp", "crown", "crown-ibp"])
@pytest.mark.parametrize("digits", [0, 3, 6, 17, 100])  # 100: decimal's default precision
def test_tlc_run_prints_every_method_rounded_outward(
    method: str, digits: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tlc.core.payload import save_npz
    from tlc.dialect.printer import print_tlir
    from tlc.tools.run import main

    layers = random_layers([3, 12, 12, 2], seed=9)
    traced = mlp(layers)
    doc = tmp_path / "net.tlir"
    doc.write_text(print_tlir(traced.module))
    save_npz(traced.payload, str(tmp_path / "p.npz"))
    spec = np.array([[1.0, -1.0], [0.5, 3.0]])
    np.save(tmp_path / "spec.npy", spec)
    lo, hi = np.array([-0.3, 0.1, 0.2]), np.array([0.1, 0.45, 0.2])
    box = ["--lo", "-0.3,0.1,0.2", "--hi", "0.1,0.45,0.2", "--digits", str(digits)]
    for extra, C in (([], None), (["--spec", str(tmp_path / "spec.npy")], spec)):
        argv = [str(doc), "--payload", str(tmp_path / "p.npz"), "--arithmetic", "interval",
                "--method", method, *box, *extra]  # fmt: skip
        assert main(argv) == 0
        printed_lo, printed_hi = _printed_ends(capsys.readouterr().out.splitlines()[-1])
        sound = tlc.bounds(traced, lo, hi, C=C, method=method)
        assert np.all(printed_lo <= sound.lower) and np.all(sound.upper <= printed_hi)
        assert np.all(sound.lower - printed_lo <= 10.0**-digits)
        assert np.all(printed_hi - sound.upper <= 10.0**-digits)


@pytest.mark.parametrize("slope", [0.01, 0.2, 0.7])
def test_leaky_relu_crown_equals_the_oracle(slope: float) -> None:
    layers = random_layers([5, 30, 30, 30, 4], seed=11)
    lo, hi = _box(5, 3, 0.3)
    got = tlc.bounds(mlp(layers, "leaky_relu", negative_slope=slope), lo, hi, method="crown")
    want_lo, want_hi = crown_mlp(layers, lo, hi, negative_slope=slope)
    scale = np.maximum(1.0, np.abs(want_hi - want_lo))
    assert got.fallbacks == {}
    assert np.all(np.abs(got.lower - want_lo) <= 1e-9 * scale)
    assert np.all(np.abs(got.upper - want_hi) <= 1e-9 * scale)


def _relaxation_net(kind: str, width: int, seed: int) -> tuple[object, str]:
    """A small graph around one relaxation: (traced graph, the op under test)."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(width, 3)), rng.normal(size=(width, 3))
    w3 = rng.normal(size=(2, 3 * width))

    def program(ops, x, params):  # noqa: ANN001, ANN202
        h = ops.linear(x, params[0])
        if kind == "mul_elem":
            h = ops.mul_elem(h, ops.linear(x, params[1]))
        elif kind in ("max_elem", "min_elem"):
            h = getattr(ops, kind)(h, ops.linear(x, params[1]))
        elif kind == "max_pool":
            h = ops.flatten(ops.max_pool(ops.reshape(h, to=[1, 2, width // 2]), kernel=[2, 2],
                                         stride=[1, 1], padding=[1, 0]))  # fmt: skip
            return ops.linear(h, params[2][:, : 3 * (width // 2 - 1)])  # 3 x (width/2 - 1)
        elif kind == "matmul":
            left = ops.reshape(h, to=[2, width // 2])
            right = ops.reshape(ops.linear(x, params[1]), to=[width // 2, 2])
            return ops.linear(ops.flatten(ops.matmul(left, right)), params[2][:, :4])
        elif kind.startswith("leaky_relu"):
            h = ops.leaky_relu(h, negative_slope=float(kind.split(":")[1]))
        elif kind.startswith("elu"):
            h = ops.elu(h, alpha=float(kind.split(":")[1]))
        else:
            h = getattr(ops, kind)(h)
        return ops.linear(h, params[2][:, :width])

    return tlc.trace(program, (3,), [w1, w2, w3]), kind.split(":")[0]


RELAXED = ["leaky_relu:0.1", "leaky_relu:1.5", "leaky_relu:-0.3", "elu:1.0", "elu:0.5", "exp",
           "softplus", "erf", "gelu", "silu", "hardswish", "abs", "sin", "mul_elem", "max_elem",
           "min_elem", "max_pool", "matmul"]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(RELAXED),
    width=st.sampled_from([4, 8, 12]),
    radius=st.floats(0.0, 2.0),
    dtype=st.sampled_from(["f64", "f32"]),
    method=st.sampled_from(["crown", "crown-ibp"]),
)
def test_relaxations_contain_sampled_outputs(
    seed: int, kind: str, width: int, radius: float, dtype: str, method: str
) -> None:
    traced, _ = _relaxation_net(kind, width, seed)
    lo, hi = _box(3, seed, radius)
    result = tlc.bounds(traced, lo, hi, method=method, dtype=dtype)
    assert result.fallbacks == {}
    for x in _samples(lo, hi, 20, seed):
        values = tlc.run(traced.module, x, traced.payload, dtype=dtype)
        for node_id, box in enumerate(result.boxes):
            assert box is not None and np.all(box.contains(values[node_id])), node_id
        assert np.all(result.lower <= values.output) and np.all(values.output <= result.upper)


@pytest.mark.parametrize("kind", RELAXED)
def test_relaxations_are_tighter_than_ibp(kind: str) -> None:
    traced, op = _relaxation_net(kind, 12, 5)
    lo, hi = _box(3, 4, 0.4)
    crown = tlc.bounds(traced, lo, hi)
    ibp = tlc.bounds(traced, lo, hi, method="ibp")
    assert crown.fallbacks == {}
    assert np.all(crown.lower >= ibp.lower) and np.all(crown.upper <= ibp.upper)
    assert np.sum(crown.width) < 0.95 * np.sum(ibp.width), op


TWO_INPUTS = """
tl.graph @two {
  %0 = input : [3]
  %1 = input : [3]
  %2 = linear(%0) : [4]
  %3 = linear(%1) : [4]
  %4 = add(%2, %3) : [4]
  %5 = relu(%4) : [4]
  %6 = mul_elem(%5, %3) : [4]
  %7 = linear(%6) : [2]
  output %7
}

tl.payload @two {
  %2 = linear {weight = [[0.5, -1.0, 0.2], [0.3, 0.8, -0.6], [-0.7, 0.1, 0.9], [1.1, -0.4, 0.3]],
               bias = [0.1, -0.2, 0.0, 0.3]}
  %3 = linear {weight = [[-0.3, 0.6, 0.5], [0.9, -0.2, 0.4], [0.2, 0.7, -0.8], [-0.5, 0.3, 0.6]],
               bias = [0.0, 0.1, -0.1, 0.2]}
  %7 = linear {weight = [[1.0, -0.5, 0.8, 0.3], [-0.6, 0.9, 0.2, -1.2]], bias = [0.05, -0.05]}
}
"""


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_graphs_with_several_inputs(dtype: str) -> None:
    centre = {0: np.array([0.2, -0.4, 0.6]), 1: np.array([-0.1, 0.5, 0.3])}
    crown = tlc.bounds(TWO_INPUTS, center=centre, radius=0.3, dtype=dtype)
    ibp = tlc.bounds(TWO_INPUTS, center=centre, radius=0.3, method="ibp", dtype=dtype)
    assert crown.fallbacks == {}
    assert np.all(crown.lower >= ibp.lower) and np.all(crown.upper <= ibp.upper)
    assert np.sum(crown.width) < np.sum(ibp.width)
    batch = tlc.bounds(
        TWO_INPUTS, center={k: np.stack([v, v]) for k, v in centre.items()}, radius=0.3,
        dtype=dtype,
    )  # fmt: skip
    # one pass for the batch: the same bounds up to the rounding of differently shaped products
    np.testing.assert_allclose(batch.lower[1], crown.lower, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(batch.upper[0], crown.upper, rtol=1e-12, atol=1e-15)
    rng = np.random.default_rng(5)
    for _ in range(60):
        x = {k: v + rng.uniform(-0.3, 0.3, 3) for k, v in centre.items()}
        y = tlc.run(TWO_INPUTS, x, dtype=dtype).output
        assert np.all(crown.lower <= y) and np.all(y <= crown.upper)
    with pytest.raises(DiagnosticError, match="no box given for input node 1"):
        tlc.bounds(TWO_INPUTS, lo={0: centre[0]}, hi={0: centre[0]})


def test_linear_with_leading_axes_gets_every_row() -> None:
    """The [I; -I] rows of an intermediate bound on a node with leading axes ([2, 4]) select
    one leading index each: no shortcut may treat them as [W; -W]."""

    def program(ops, x, params):  # noqa: ANN001, ANN202
        return ops.linear(ops.relu(ops.linear(ops.relu(ops.linear(x, params[0])), params[1])),
                          params[2])  # fmt: skip

    rng = np.random.default_rng(2)
    traced = tlc.trace(program, (2, 3), [rng.normal(size=(4, 3)), rng.normal(size=(4, 4)),
                                          rng.normal(size=(2, 4))])  # fmt: skip
    lo = rng.uniform(-1, 1, (2, 3))
    crown = tlc.bounds(traced, lo, lo + 0.5)
    ibp = tlc.bounds(traced, lo, lo + 0.5, method="ibp")
    assert np.all(crown.lower >= ibp.lower) and np.all(crown.upper <= ibp.upper)
    for x in _samples(lo, lo + 0.5, 60, 3):
        y = tlc.run(traced.module, x, traced.payload).output
        assert np.all(crown.lower <= y) and np.all(y <= crown.upper)


def test_large_batches_are_bounded_in_several_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    import tlc.semantics.crown as crown

    layers = random_layers([4, 10, 10, 3], seed=12)
    centres = np.random.default_rng(4).uniform(-1, 1, (7, 4))
    whole = tlc.bounds(mlp(layers), center=centres, radius=0.2)
    monkeypatch.setattr(crown, "COEFFICIENTS", 3 * 20 * 10)  # rows 2 x 10, n 10: 3 per pass
    parts = tlc.bounds(mlp(layers), center=centres, radius=0.2)
    assert parts.lower.shape == (7, 3) and parts.node(2).lo.shape == (7, 10)
    np.testing.assert_allclose(parts.lower, whole.lower, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(parts.upper, whole.upper, rtol=1e-12, atol=1e-15)
