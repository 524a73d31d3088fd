"""Fusion into a producer's stores and max pooling's fold (docs/kernel-design.md,
"Fusion and pooling").

A convolution or a linear layer followed by a residual add (of a value computed before it) and
a relu writes relu(product + bias + shortcut) in one store (`module.fusions`, `Fused`): the
fused code must give the bits of the unfused one (the same additions in the same order), on
every store path (wide columns, whole vectors, tiles, C^T, depthwise strips, dot tiles, the
packed linear kernel), and agree with the reference within a contraction's tolerance. Max
pooling folds numpy's maximum over each window in the reference's row-major order: NaN where
the reference has NaN and every other bit (-0.0 against +0.0 included) equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_targets import options, runnable

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import module
from tlc.codegen.jit import compile_graph
from tlc.codegen.lower.convolution import ConvFrame, kernel_name
from tlc.codegen.module import build_graph_module, fusions, pack_params
from tlc.codegen.target import HOST, Target, target_info
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.semantics.interpret import interpret


def unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile from here on with the residual add a map of its own (the code before fusion:
    the add's own pass, relu fused into it), in a fresh JIT cache."""
    unary = {op: fn for op, fn in module.EPILOGUES.items() if op is not ops.AddOp}
    monkeypatch.setattr(module, "EPILOGUES", unary)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})


def close(got: np.ndarray, expected: np.ndarray) -> None:
    """f32 against the reference: a contraction's summation-order tolerance (the op records',
    rtol 2e-5, relative to the largest magnitude)."""
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


def residual(n: int, c: int, h: int, w: int, kernel: int, stride: int, depthwise: bool,
             swap: bool, relu: bool) -> str:  # fmt: skip
    """relu(x) -> conv, plus the shortcut (relu(x) subsampled to the conv's output by a 1x1
    average pool), then relu: a residual block's end."""
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    pad, groups = kernel // 2, c if depthwise else 1
    add = "add(%2, %3)" if swap else "add(%3, %2)"
    tail = f"  %5 = relu(%4) : [{n}, {c}, {oh}, {ow}]\n  output %5" if relu else "  output %4"
    return f"""tl.graph @block {{
  %0 = input : [{n}, {c}, {h}, {w}]
  %1 = relu(%0) : [{n}, {c}, {h}, {w}]
  %2 = avg_pool(%1) {{kernel = [1, 1], stride = [{stride}, {stride}]}} : [{n}, {c}, {oh}, {ow}]
  %3 = conv(%1) {{kernel = [{kernel}, {kernel}], stride = [{stride}, {stride}], padding = [{pad}, {pad}], groups = {groups}, channel_axis = 1, in_channels = {c}, out_channels = {c}}} : [{n}, {c}, {oh}, {ow}]
  %4 = {add} : [{n}, {c}, {oh}, {ow}]
{tail}
}}
"""  # noqa: E501


def check_residual(
    patch: pytest.MonkeyPatch, n: int, c: int, h: int, w: int, kernel: int, stride: int,
    depthwise: bool, swap: bool, relu: bool, seed: int, target: Target = HOST,
) -> None:  # fmt: skip
    """conv -> add(., shortcut) [-> relu] is one kernel (the add, and the relu, compile to
    nothing), whose result is the unfused code's, bit for bit, and the reference's within
    the contraction tolerance."""
    text = residual(n, c, h, w, kernel, stride, depthwise, swap, relu)
    graph = checked_graph(tlc.parse(text))
    chain = fusions(graph, graph.nodes[-1])[3]
    assert [node.TAG for node in chain.nodes] == ["add", "relu"][: 1 + relu]
    assert chain.slots[0] == int(swap) and chain.operands == [2]
    rng = np.random.default_rng(seed)
    depth = 1 if depthwise else c
    payload = Payload({3: {"weight": rng.normal(size=(c, depth, kernel, kernel)),
                           "bias": rng.normal(size=c)}})  # fmt: skip
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    ir = build_graph_module(graph, payload, np.float32, target=target).ir
    assert '.n4"' not in ir and '.n5"' not in ir, "the add compiled on its own"
    fused = compile_graph(graph, payload, np.float32, target=target)(x)
    close(fused, interpret(graph, payload, x, np.float32).output)
    unfused(patch)
    assert '.n4"' in build_graph_module(graph, payload, np.float32, target=target).ir
    assert fused.tobytes() == compile_graph(graph, payload, np.float32, target=target)(x).tobytes()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 3),
    c=st.integers(1, 24),
    h=st.integers(1, 30),
    w=st.integers(1, 60),
    kernel=st.sampled_from([1, 3]),
    stride=st.sampled_from([1, 2]),
    depthwise=st.booleans(),
    swap=st.booleans(),
    relu=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_fused_residual_add_gives_the_unfused_bits(
    monkeypatch: pytest.MonkeyPatch, n: int, c: int, h: int, w: int, kernel: int, stride: int,
    depthwise: bool, swap: bool, relu: bool, seed: int,
) -> None:  # fmt: skip
    """Over planes of 1..30 x 1..60, batches, strides, depthwise or not and either operand
    order (`check_residual`)."""
    with monkeypatch.context() as patch:
        check_residual(patch, n, c, h, w, kernel, stride, depthwise, swap, relu, seed)


@pytest.mark.parametrize(
    ("n", "c", "h", "w", "kernel", "depthwise"),
    [
        (1, 16, 20, 56, 3, False),  # wide columns: rows of 58 staged for 56
        (1, 16, 28, 28, 1, False),  # whole vectors (784 positions), packed
        (1, 24, 14, 14, 1, False),  # the input read in place, the last vector masked
        (1, 8, 13, 13, 3, False),  # tiles stored by `_store_columns`, planes of 169
        (1, 128, 7, 7, 3, False),  # C^T: 49 positions, 128 channels
        (2, 32, 7, 7, 1, False),  # two images a group: columns across planes
        (1, 32, 14, 14, 3, True),  # depthwise strips, row by row
        (1, 32, 7, 7, 3, True),  # depthwise 7x7: the flat run, the add applied row by row
    ],
    ids=["wide", "whole vectors", "in place", "tiles", "C^T", "two images", "depthwise",
         "depthwise 7x7"],
)  # fmt: skip
@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
def test_every_store_path_fuses_the_residual_add(
    monkeypatch: pytest.MonkeyPatch, n: int, c: int, h: int, w: int, kernel: int,
    depthwise: bool, cpu: str,
) -> None:  # fmt: skip
    """On AVX-512 (this machine, if it has it), AVX2 and SSE (masked stores lane by lane)."""
    target = HOST if cpu == "host" else runnable(cpu)
    check_residual(monkeypatch, n, c, h, w, kernel, 1, depthwise, False, True, 5, target)


@pytest.mark.parametrize(("c", "h", "seed"), [(6, 29, 0), (6, 29, 6), (13, 23, 0)])
@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
def test_a_fused_depthwise_flat_run_contracts_as_the_unfused_one(
    monkeypatch: pytest.MonkeyPatch, c: int, h: int, seed: int, cpu: str
) -> None:
    """A depthwise 3x3 over an h x 1 plane runs flat (rows of 3 staged columns), its last
    strip moved back over the one before: with the taps' multiply-adds left to the
    backend's contraction, the unfused kernel (rows copied out of the stack buffer) got a
    multiply and an add where the fused one got an FMA, 1 ulp apart at row 22 (found by
    hypothesis); each multiply-add is now one `llvm.fmuladd`."""
    target = HOST if cpu == "host" else runnable(cpu)
    check_residual(monkeypatch, 1, c, h, 1, 3, 1, True, False, False, seed, target)


def test_a_fused_block_has_the_same_bits_on_any_threads_and_batch() -> None:
    """The parts of a split convolution (batch 1, two threads) read the shortcut at the
    columns they store, and a batch of 3 runs the fused kernel over the batch (row tasks):
    the same bits as one thread, and as each image alone."""
    text = residual(1, 32, 28, 28, 3, 1, False, False, True)
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(9)
    payload = Payload({3: {"weight": rng.normal(size=(32, 32, 3, 3)), "bias": rng.normal(size=32)}})
    x = rng.normal(size=(1, 32, 28, 28)).astype(np.float32)
    one, two = (compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2))
    assert one.tobytes() == two.tobytes()
    batch = checked_graph(tlc.parse(residual(3, 32, 28, 28, 3, 1, False, False, True)))
    xs = rng.normal(size=(3, 1, 32, 28, 28)).astype(np.float32)
    batched = compile_graph(batch, payload, np.float32, threads=2)(xs.reshape(3, 32, 28, 28))
    alone = compile_graph(graph, payload, np.float32, threads=2)
    assert batched.tobytes() == np.stack([alone(v) for v in xs]).tobytes()


LINEAR = """tl.graph @mlp {{
  %0 = input : [{m}, {k}]
  %1 = linear(%0) : [{m}, {n}]
  %2 = linear(%0) : [{m}, {n}]
  %3 = add(%2, %1) : [{m}, {n}]
  %4 = relu(%3) : [{m}, {n}]
  output %4
}}
"""


@pytest.mark.parametrize(
    ("m", "k", "n", "runtime"),
    [(8, 300, 300, False), (3, 40, 10, False), (5, 64, 200, True), (70, 700, 130, False)],
    ids=["packed", "dot tiles", "runtime payload", "k blocks"],
)
def test_a_residual_add_after_a_linear_layer_is_fused(
    monkeypatch: pytest.MonkeyPatch, m: int, k: int, n: int, runtime: bool
) -> None:
    """The second linear layer stores relu(x W2 + b2 + linear1(x)): the packed kernel (also
    over K blocks, the epilogue on the last one), the dot tiles, a runtime payload; the
    same bits as the unfused code."""
    check_linear_residual(monkeypatch, m, k, n, runtime, 4)


def check_linear_residual(
    patch: pytest.MonkeyPatch, m: int, k: int, n: int, runtime: bool, seed: int,
    target: Target = HOST,
) -> None:  # fmt: skip
    """linear -> add(., linear) -> relu in one store (`LINEAR`), baked or with a runtime
    payload: the unfused code's bits, and the reference's within the contraction tolerance."""
    graph = checked_graph(tlc.parse(LINEAR.format(m=m, k=k, n=n)))
    assert [node.TAG for node in fusions(graph, graph.nodes[-1])[2].nodes] == ["add", "relu"]
    rng = np.random.default_rng(seed)
    payload = Payload({i: {"weight": rng.normal(size=(n, k)) / np.sqrt(k),
                           "bias": rng.normal(size=n)} for i in (1, 2)})  # fmt: skip
    x = rng.normal(size=(m, k)).astype(np.float32)

    def run() -> np.ndarray:
        if runtime:
            params = pack_params(graph, payload, np.float32)
            return compile_graph(graph, None, np.float32, runtime_payload=True,
                                 target=target)(x, params)  # fmt: skip
        return compile_graph(graph, payload, np.float32, target=target)(x)

    fused = run()
    close(fused, interpret(graph, payload, x, np.float32).output)
    unfused(patch)
    assert fused.tobytes() == run().tobytes()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 100),
    n=st.integers(1, 48),
    runtime=st.booleans(),
    seed=st.integers(0, 2**16),
    cpu=st.sampled_from(["host", "znver3", "x86-64-v2"]),
)
def test_a_fused_linear_store_gives_the_unfused_bits(
    monkeypatch: pytest.MonkeyPatch, m: int, k: int, n: int, runtime: bool, seed: int, cpu: str
) -> None:
    """Few output columns (the dot tiles: 1-48 columns, whole tiles of 4 or 3 and a partial
    one) and depths that leave scalar tails past the last whole vector, on AVX-512, AVX2 and
    SSE (`check_linear_residual`)."""
    target = HOST if cpu == "host" else runnable(cpu)
    with monkeypatch.context() as patch:
        check_linear_residual(patch, m, k, n, runtime, seed, target)


@pytest.mark.parametrize(
    ("cpu", "m", "k", "n", "runtime"),
    [("host", 2, 31, 6, False), ("host", 4, 63, 22, True), ("host", 6, 75, 20, True),
     ("znver3", 6, 55, 5, False), ("znver3", 8, 33, 22, True)],
)  # fmt: skip
def test_the_dot_tiles_tails_contract_as_the_unfused_ones(
    monkeypatch: pytest.MonkeyPatch, cpu: str, m: int, k: int, n: int, runtime: bool
) -> None:
    """The dot tiles' scalar tails (depth past the last whole vector) left each multiply and
    add to the backend's contraction and reassociation, which it chose differently in the
    fused and the unfused functions: their outputs 1 ulp apart on AVX-512 and AVX2 (found by
    a random search: 15 of 120 cases); each tail step is now one `llvm.fmuladd`."""
    target = HOST if cpu == "host" else runnable(cpu)
    check_linear_residual(monkeypatch, m, k, n, runtime, 0, target)


def test_the_shortcut_computed_last_takes_the_add() -> None:
    """A downsampling block computes its shortcut (a 1x1 stride-2 convolution) after the main
    branch: the add joins the convolution computed last, whose other operand is then there;
    an add reading one value twice, or a value with a second user, stays a node."""
    c = "channel_axis = 1, in_channels = 4, out_channels = 4"
    text = f"""tl.graph @down {{
  %0 = input : [1, 4, 8, 8]
  %1 = conv(%0) {{kernel = [3, 3], stride = [2, 2], padding = [1, 1], {c}}} : [1, 4, 4, 4]
  %2 = conv(%0) {{kernel = [1, 1], stride = [2, 2], {c}}} : [1, 4, 4, 4]
  %3 = add(%1, %2) : [1, 4, 4, 4]
  %4 = relu(%3) : [1, 4, 4, 4]
  %5 = conv(%4) {{kernel = [1, 1], {c}}} : [1, 4, 4, 4]
  %6 = add(%5, %5) : [1, 4, 4, 4]
  %7 = conv(%6) {{kernel = [1, 1], {c}}} : [1, 4, 4, 4]
  %8 = add(%7, %6) : [1, 4, 4, 4]
  %9 = add(%8, %7) : [1, 4, 4, 4]
  output %9
}}
"""
    graph = checked_graph(tlc.parse(text))
    chains = fusions(graph, graph.nodes[-1])
    assert {p: [node.id for node in chain.nodes] for p, chain in chains.items()} == {2: [3, 4]}
    assert chains[2].slots == (1, 0) and chains[2].operands == [1]


def test_a_fused_add_may_be_the_output() -> None:
    """The chain's last node is the graph's output: its producer writes the caller's out."""
    text = residual(1, 8, 12, 12, 3, 1, False, False, False)
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(7)
    payload = Payload({3: {"weight": rng.normal(size=(8, 8, 3, 3)), "bias": rng.normal(size=8)}})
    built = build_graph_module(graph, payload, np.float32)
    assert built.plan.writer == 3 and built.plan.nodes[4].fused_into == 3
    x = rng.normal(size=(1, 8, 12, 12)).astype(np.float32)
    close(
        compile_graph(graph, payload, np.float32)(x),
        interpret(graph, payload, x, np.float32).output,
    )


#: Values whose order a max must get right: signed zeros, infinities, NaN of both signs.
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 1e-40], np.float32)


@settings(max_examples=40, deadline=None)
@given(
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pad=st.booleans(),
    h=st.integers(3, 20),
    w=st.integers(3, 40),
    c=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    cpu=st.sampled_from(["host", "znver3", "x86-64-v2"]),
)
def test_max_pool_has_the_references_nans_and_signed_zeros(
    kernel: tuple[int, int], stride: tuple[int, int], pad: bool, h: int, w: int, c: int,
    seed: int, cpu: str,
) -> None:  # fmt: skip
    """Windows of ±0.0, ±inf, NaN of both signs: NaN exactly where the reference has NaN
    (a NaN anywhere in the window), every other result bit for bit the reference's (numpy's
    maximum folded over the taps in row-major order: of equal values the later wins, so a
    window of -0.0 and +0.0 gives the sign of its last zero), on AVX-512, AVX2 and SSE."""
    target = options(runnable(cpu)) if cpu != "host" else {}
    padding = [k // 2 for k in kernel] if pad else [0, 0]
    text = (f"tl.graph @p {{\n  %0 = input : [2, {c}, {h}, {w}]\n"
            f"  %1 = max_pool(%0) {{kernel = {list(kernel)}, stride = {list(stride)}, "
            f"padding = {padding}}}\n  output %1\n}}\n")  # fmt: skip
    x = SPECIAL[np.random.default_rng(seed).integers(0, len(SPECIAL), size=(2, c, h, w))]
    graph = checked_graph(tlc.parse(text))
    expected = interpret(graph, None, x, np.float32).output
    got = tlc.compile(text, dtype="f32", **target)(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    real = ~np.isnan(expected)
    assert got[real].tobytes() == expected[real].tobytes()


def test_a_zero_tie_takes_the_last_zero_of_the_window() -> None:
    """The reference's tie rule, pinned: a 3x3 window of zeros whose last zero (row-major) is
    -0.0 gives -0.0, whose last is +0.0 gives +0.0 (llvm.maximum orders -0.0 below +0.0 and
    gave +0.0 for both), and one NaN anywhere makes the window NaN."""
    text = ("tl.graph @p {\n  %0 = input : [1, 1, 3, 3]\n"
            "  %1 = max_pool(%0) {kernel = [3, 3]}\n  output %1\n}\n")  # fmt: skip
    f = tlc.compile(text, dtype="f32")
    for last in (-0.0, 0.0):
        x = np.zeros((1, 1, 3, 3), np.float32)
        x[0, 0, 0, 0] = -last
        x[0, 0, 2, 2] = last
        assert np.signbit(f(x)[0, 0, 0, 0]) == np.signbit(np.float32(last))
        assert np.signbit(f(x)[0, 0, 0, 0]) == np.signbit(tlc.run(text, x).output[0, 0, 0, 0])
    x = np.full((1, 1, 3, 3), -np.inf, np.float32)
    x[0, 0, 1, 0] = np.nan
    assert np.isnan(f(x)[0, 0, 0, 0])


@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
def test_a_max_pool_reads_its_input_in_place(cpu: str) -> None:
    """A 2-D max pool stages nothing (scratch: the one element every scratch rule gets): it
    reads the input rows, skipping the kernel rows in the padding and masking the columns
    outside the input in its rows' end strips, ceil mode's windows past the end (the
    padding concatenations read around) included. Rows wide enough for unmasked strips
    between the masked ones, NaN and signed zeros in places: the reference's bits, for 1-3
    threads, on AVX-512, AVX2 and SSE."""
    target = HOST if cpu == "host" else runnable(cpu)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 5, 36, 74)).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, 40)] = np.nan
    x.reshape(-1)[rng.integers(0, x.size, 400)] = -0.0
    x.reshape(-1)[rng.integers(0, x.size, 400)] = 0.0
    padded = """tl.graph @p {
  %0 = input : [2, 5, 36, 74]
  %1 = max_pool(%0) {kernel = [3, 3], stride = [2, 2], padding = [1, 1]}
  output %1
}
"""
    ceil = """tl.graph @ceil {
  %0 = input : [2, 5, 36, 74]
  %1 = const {shape = [2, 5, 1, 74]} : [2, 5, 1, 74]
  %2 = concat(%0, %1) {axis = 2} : [2, 5, 37, 74]
  %3 = const {shape = [2, 5, 37, 1]} : [2, 5, 37, 1]
  %4 = concat(%2, %3) {axis = 3} : [2, 5, 37, 75]
  %5 = max_pool(%4) {kernel = [3, 3], stride = [2, 2]}
  output %5
}
"""
    fills = {1: {"value": np.full(740, -np.inf)}, 3: {"value": np.full(370, -np.inf)}}
    for text, payload in ((padded, None), (ceil, Payload(fills))):
        graph = checked_graph(tlc.parse(text))
        pool = build_graph_module(graph, payload, np.float32, target=target).plan.nodes[-1]
        assert pool.scratch == 1
        expected = interpret(graph, payload, x, np.float32).output
        assert np.isnan(expected).any() and (np.signbit(expected) & (expected == 0)).any()
        for threads in (1, 2, 3):
            got = compile_graph(graph, payload, np.float32, target=target, threads=threads)(x)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
            real = ~np.isnan(expected)
            assert got[real].tobytes() == expected[real].tobytes()


@pytest.mark.parametrize(("c", "h"), [(64, 14), (128, 7), (32, 26)])
def test_the_direct_kernel_fuses_the_residual_add(
    monkeypatch: pytest.MonkeyPatch, c: int, h: int
) -> None:
    """resnet18's 3x3 convolutions on small planes run the direct kernel (output channels as
    the vector lanes, stored a tile row at a time): its stores read the shortcut at the lanes
    they write, so the block's end is one store there too, with the unfused bits. (Planes
    whose rows are whole vectors of no x86-64 target: the product kernel takes those.)"""
    graph = checked_graph(tlc.parse(residual(1, c, h, h, 3, 1, False, False, True)))
    conv, x = graph.nodes[3], graph.nodes[1].require_declared()
    frame = ConvFrame.of(conv, x, conv.require_declared())
    assert kernel_name(target_info(), 4, frame).startswith("direct")
    check_residual(monkeypatch, 1, c, h, h, 3, 1, False, False, True, 6)
