"""Min, max and compare-select ops: the compiled code gives the reference's bits, signed zeros
and NaN payloads included (docs/semantics.md, "Signed zeros and NaN").

The reference's rules are explicit selects (`tlc.dialect.minmax`): max(a, b) is a where a is
NaN or a > b, else b (so of two equal values, -0.0 and +0.0 included, the second; of two NaNs
the first), min likewise with a < b; relu, clip, hardsigmoid and hardswish are made of them, a
max pool folds max over its taps in row-major order, leaky_relu and prelu
give x unless x <= 0, sign gives +0.0 at either zero. Each op, on ±0.0, ±inf, NaNs of both
signs (and one with a payload), subnormals and values at the bounds, in both operand orders,
on AVX-512, AVX2 and SSE code, f32 and f64, one and two threads: every bit of the output
equal (a NaN that arithmetic makes, such as slope x, only as NaN: `ARITHMETIC`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codegen_targets import options, runnable

import tlc
from tlc.api.evaluate import checked_graph
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.semantics.interpret import interpret

UINT = {np.float32: np.uint32, np.float64: np.uint64}


def specials(dtype: type) -> np.ndarray:
    """The values a max or a compare-select must order right: both zeros, both infinities,
    quiet NaNs of both signs and one with a payload, a subnormal, and values at the bounds of
    the ops below (0, 1, 6, ±1, ±3)."""
    nans = {np.float32: [0x7FC00000, 0xFFC00000, 0x7FC00123],
            np.float64: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000123]}  # fmt: skip
    values = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 6.0, 0.5, -3.0, 3.0, 1e-40, -7.0],
                      dtype)  # fmt: skip
    return np.concatenate([values, np.array(nans[dtype], UINT[dtype]).view(dtype)])


#: Each op on an input of n elements (its text after the input node, %0).
UNARY: dict[str, Callable[[int], str]] = {
    "relu": lambda n: "relu(%0)",
    "relu6": lambda n: "clip(%0) {min = 0.0, max = 6.0}",
    "clip_max_0": lambda n: "clip(%0) {max = 0.0}",
    "clip_min_0": lambda n: "clip(%0) {min = 0.0}",
    "hardtanh": lambda n: "clip(%0) {min = -1.0, max = 1.0}",
    "hardsigmoid": lambda n: "hardsigmoid(%0)",
    "hardsigmoid_zero": lambda n: "hardsigmoid(%0) {alpha = 1.0, beta = 0.0}",
    "hardswish": lambda n: "hardswish(%0)",
    "leaky_relu": lambda n: "leaky_relu(%0) {negative_slope = 0.01}",
    "leaky_relu_steep": lambda n: "leaky_relu(%0) {negative_slope = 2.0}",
    "leaky_relu_negative": lambda n: "leaky_relu(%0) {negative_slope = -0.5}",
    "leaky_relu_flat": lambda n: "leaky_relu(%0) {negative_slope = 0.0}",
    "sign": lambda n: "sign(%0)",
    "clip_zeros": lambda n: "clip(%0) {min = -0.0, max = 0.0}",
    "clip_nan_bound": lambda n: "clip(%0) {min = nan, max = 1.0}",  # NaN, x's where x is NaN
}
#: Pools over the input viewed as [1, 1, 1, n] (a max pool's NaN is its window's first).
POOLS: dict[str, Callable[[int], str]] = {
    "global_max_pool": lambda n: f"max_pool(%1) {{kernel = [1, {n}]}}",
    "max_pool_3_s2": lambda n: "max_pool(%1) {kernel = [1, 3], stride = [1, 2], padding = [0, 1]}",
}
#: Binary ops, the other operand a constant (%1) on either side.
BINARY = {"max_elem": "max_elem", "min_elem": "min_elem", "prelu": "prelu"}


def graph_text(op: str, n: int, swap: bool) -> str:
    if op in UNARY:
        return f"tl.graph @g {{\n  %0 = input : [{n}]\n  %1 = {UNARY[op](n)}\n  output %1\n}}\n"
    if op in POOLS:
        return (f"tl.graph @g {{\n  %0 = input : [{n}]\n"
                f"  %1 = reshape(%0) {{from = [{n}], to = [1, 1, 1, {n}]}}\n"
                f"  %2 = {POOLS[op](n)}\n  output %2\n}}\n")  # fmt: skip
    args = "%1, %0" if swap else "%0, %1"
    return (f"tl.graph @g {{\n  %0 = input : [{n}]\n  %1 = const {{shape = [{n}]}} : [{n}]\n"
            f"  %2 = {BINARY[op]}({args})\n  output %2\n}}\n")  # fmt: skip


#: Ops whose NaN may come out of arithmetic (slope x, alpha x + beta, x hardsigmoid(x)): NaN
#: where the reference has NaN, its sign and payload not compared. LLVM gives a NaN product
#: no fixed bits (it folds -1 * s into -s, flipping a NaN slope's sign); selects keep theirs.
ARITHMETIC = {"prelu", "leaky_relu", "leaky_relu_negative", "leaky_relu_steep", "leaky_relu_flat",
              "hardsigmoid", "hardsigmoid_zero", "hardswish"}  # fmt: skip


def assert_same_bits(got: np.ndarray, expected: np.ndarray, dtype: type,
                     nan_bits: bool = True) -> None:  # fmt: skip
    got, expected = np.asarray(got, dtype), np.asarray(expected, dtype)
    assert got.shape == expected.shape
    if not nan_bits:
        assert np.array_equal(np.isnan(got), np.isnan(expected))
        got, expected = np.where(np.isnan(got), 0, got), np.where(np.isnan(expected), 0, expected)
    gb, eb = got.view(UINT[dtype]), expected.view(UINT[dtype])
    bad = np.flatnonzero(gb.reshape(-1) != eb.reshape(-1))
    assert not bad.size, ", ".join(f"[{i}] {gb.flat[i]:x} (reference {eb.flat[i]:x})"
                                   for i in bad[:8])  # fmt: skip


def compiled_and_reference(op: str, x: np.ndarray, other: np.ndarray, swap: bool, dtype: type,
                           cpu: str, threads: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    text = graph_text(op, x.size, swap)
    payload = Payload({1: {"value": other}}) if op in BINARY else None
    expected = interpret(checked_graph(tlc.parse(text)), payload, x, dtype).output
    name = "f32" if dtype is np.float32 else "f64"
    target = options(runnable(cpu)) if cpu != "host" else {}
    got = tlc.compile(text, payload, dtype=name, threads=threads, **target)(x)
    return got, expected


OPS = sorted(UNARY) + sorted(POOLS) + sorted(BINARY)


@settings(max_examples=120, deadline=None)
@given(
    op=st.sampled_from(OPS),
    picks=st.lists(st.integers(0, 14), min_size=1, max_size=70),
    others=st.lists(st.integers(0, 14), min_size=70, max_size=70),
    swap=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    cpu=st.sampled_from(["host", "znver3", "x86-64-v2"]),
    threads=st.sampled_from([1, 2]),
)
def test_compiled_bits_are_the_references(
    op: str, picks: list[int], others: list[int], swap: bool, dtype: type, cpu: str,
    threads: int,
) -> None:  # fmt: skip
    """Every bit, on AVX-512, AVX2 and SSE code: lengths 1-70 cover scalar tails, whole
    vectors and (at two threads) parts."""
    if cpu != "host":
        runnable(cpu)
    values = specials(dtype)
    x = values[picks]
    other = values[others[: x.size]]
    got, expected = compiled_and_reference(op, x, other, swap, dtype, cpu, threads)
    assert_same_bits(got, expected, dtype, op not in ARITHMETIC)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", OPS)
def test_every_pair_of_special_values(op: str, dtype: type) -> None:
    """Each op on every special value, and each binary op on every ordered pair of them,
    repeated to 5 x 225 elements (vector bodies and tails), on this CPU."""
    values = specials(dtype)
    n = values.size
    x = np.tile(np.repeat(values, n), 5) if op in BINARY else np.tile(values, 23)
    other = np.tile(np.tile(values, n), 5) if op in BINARY else x
    for swap in (False, True) if op in BINARY else (False,):
        got, expected = compiled_and_reference(op, x, other, swap, dtype, "host", 2)
        assert_same_bits(got, expected, dtype, op not in ARITHMETIC)


def test_clip_to_zero_gives_the_bounds_zero() -> None:
    """relu6's kin `clip {max = 0}` of -0.0 is min(-0.0, +0.0): +0.0, the bound (equal values:
    the second operand), as in the reference; llvm.minimum, before, ordered -0.0 below +0.0
    and gave -0.0."""
    text = "tl.graph @g {\n  %0 = input : [2]\n  %1 = clip(%0) {max = 0.0}\n  output %1\n}\n"
    got = tlc.compile(text)(np.array([-0.0, 0.0], np.float32))
    assert not np.signbit(got).any()
    assert not np.signbit(tlc.run(text, [-0.0, 0.0], dtype="f32").output).any()


@pytest.mark.parametrize("n", [1, 7, 64, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_references_max_and_min_are_its_selects(n: int, dtype: type) -> None:
    """The reference's max_elem and min_elem give the documented bits on any length and on
    strided views (not whatever numpy's loops do): of equal operands the second, of a NaN
    the first NaN operand (its sign and payload), else the larger / smaller."""
    values = specials(dtype)
    u = UINT[dtype]
    a = np.resize(np.repeat(values, values.size), 2 * n)[::2]
    b = np.resize(np.tile(values, values.size), 2 * n)[::2]
    for rule, better in ((ops.MaxElemOp.numpy, np.greater), (ops.MinElemOp.numpy, np.less)):
        got = rule(a, b).view(u)
        want = [x if np.isnan(x) or better(x, y) else y for x, y in zip(a, b, strict=True)]
        assert np.array_equal(got, np.array(want, dtype).view(u))
        assert got.dtype == u


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pools_fold_their_taps_in_order(dtype: type) -> None:
    """A max pool's value is max folded over its window's taps in row-major order from -inf:
    a window of zeros gives its last zero's sign, a window holding NaNs its first NaN, for a
    global 56 x 56 or 7 x 7 window as for a 3 x 3 one, in the reference (numpy's np.max over
    the window axes, before, took lanes in its own order) and in compiled code (whose global
    pool folds in lanes, then again in order where the plane's maximum is zero or NaN)."""
    rng = np.random.default_rng(5)
    values = specials(dtype)
    pool = np.concatenate([values[:2], values[-3:]])
    u = UINT[dtype]
    name = "f32" if dtype is np.float32 else "f64"
    for h, kernel, count, nans in ((56, 56, 1, 5), (7, 7, 1, 0), (9, 3, 3, 5)):
        x = pool[rng.integers(0, 2, size=(2, 3, h, h))]
        x.reshape(-1)[rng.integers(0, x.size, nans)] = pool[rng.integers(2, 5, nans)]
        text = (f"tl.graph @p {{\n  %0 = input : [2, 3, {h}, {h}]\n"
                f"  %1 = max_pool(%0) {{kernel = [{kernel}, {kernel}], stride = [{kernel}, "
                f"{kernel}]}}\n  output %1\n}}\n")  # fmt: skip
        want = np.full((2, 3, count, count), -np.inf, dtype)
        for i in range(kernel):
            for j in range(kernel):
                tap = x[:, :, i::kernel, j::kernel]
                want = np.where(np.isnan(want) | (want > tap), want, tap)
        assert np.array_equal(tlc.run(text, x, dtype=name).output.view(u), want.view(u))
        for threads in (1, 2):
            got = tlc.compile(text, dtype=name, threads=threads)(x)
            assert np.array_equal(np.asarray(got).view(u), want.view(u))
