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
        h = ops.max_pool(ops.reshape(ops.linear(x, params[0]), to=[1, 4, 4]), kernel=[2, 2])
        return ops.linear(ops.flatten(h), params[1])

    rng = np.random.default_rng(0)
    traced = tlc.trace(program, (3,), [rng.normal(size=(16, 3)), rng.normal(size=(2, 4))])
    result = tlc.bounds(traced, center=np.zeros(3), radius=0.1)
    assert list(result.fallbacks.values()) == [
        "max_pool: no linear relaxation written; its interval box is used"
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
    with pytest.raises(ValueError, match="method must be one of ibp, crown, crown-ibp"):
        tlc.bounds(SEED_MLP, center=X, radius=0.1, method="deeppoly")
