"""A batch norm whose operand is a convolution read by nothing else is applied in the
convolution's stores (`module.norm_stores`, `reductions.norm_stage`): ONNX zoo resnet50's
conv -> batch norm -> relu and its projection shortcut conv -> batch norm read by the add;
not its conv -> batch norm -> add(., shortcut) -> relu, whose batch norm keeps the add and
relu in its pass; and only when every convolution of its attributes and shapes takes the same
(they share one node function). The batch norm is then a view of the convolution's value and
no kernel of its own runs. Each element goes through the same operations in the same order
as unfused (the sum and bias, then (x - mean) * scale + beta, then the epilogue), so the bits
are the unfused build's, on every convolution kernel (the product kernel's in-place, wide,
packed and cut-panel stores, the direct kernel, C^T, a runtime payload's row-major path, the
JIT's held payload) and at any thread count; against the reference interpreter, the op records' f32
tolerance for convolutions and normalisations (rtol 2e-5, docs/codegen.md "Numerical
policy").
"""

from __future__ import annotations

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import module as codegen_module
from tlc.codegen.jit import compile_graph
from tlc.codegen.lower.convolution import ConvFrame, kernel_name
from tlc.codegen.module import build_graph_module, pack_params
from tlc.codegen.target import HOST, target_info
from tlc.core.payload import Payload
from tlc.semantics.interpret import interpret


def block(channels: int, size: int, kernel: int, lead: int = 1, depthwise: bool = False,
          mid: int | None = None) -> str:  # fmt: skip
    """x -> conv a (kernel x kernel, to `channels` + 8) -> bn -> relu -> conv b (back to
    `channels`) -> bn -> add(., bn(conv c(x))) -> relu: a residual block whose shortcut is a
    1x1 projection with its own batch norm (the projection and its batch norm first, as in
    the zoo model). The three convolutions differ in shape, so none shares another's node
    function (`norm_stores` leaves a kernel shared by convolutions that would take different
    maps alone: `test_a_kernel_shared_by_different_chains_keeps_its_batch_norms`).
    `depthwise`: conv a groups every channel apart (and keeps its channels); `mid`: conv a's
    output channels instead."""
    mid = mid or (channels if depthwise else channels + 8)
    shape = [lead, channels, size, size]
    pad = kernel // 2

    def conv(cin: int, cout: int) -> str:
        return (f"kernel = [{kernel}, {kernel}], padding = [{pad}, {pad}], channel_axis = 1, "
                f"in_channels = {cin}, out_channels = {cout}")  # fmt: skip

    one = f"kernel = [1, 1], channel_axis = 1, in_channels = {channels}, out_channels = {channels}"
    groups = f", groups = {channels}" if depthwise else ""
    return f"""tl.graph @block {{
  %0 = input : {shape}
  %1 = conv(%0) {{{one}}}
  %2 = batch_norm_eval(%1) {{channel_axis = 1, channels = {channels}}}
  %3 = conv(%0) {{{conv(channels, mid)}{groups}}}
  %4 = batch_norm_eval(%3) {{channel_axis = 1, channels = {mid}}}
  %5 = relu(%4)
  %6 = conv(%5) {{{conv(mid, channels)}}}
  %7 = batch_norm_eval(%6) {{channel_axis = 1, channels = {channels}}}
  %8 = add(%7, %2)
  %9 = relu(%8)
  output %9
}}
"""


def norm_fields(rng: np.random.Generator, channels: int) -> dict:
    return {"gamma": rng.uniform(0.5, 1.5, channels), "beta": rng.normal(size=channels),
            "mean": rng.normal(size=channels), "var": rng.uniform(0.5, 1.5, channels)}  # fmt: skip


def conv_fields(rng: np.random.Generator, kernel: int, cin: int, cout: int) -> dict:
    return {"weight": rng.normal(size=(cout, cin, kernel, kernel)) / np.sqrt(cin * kernel**2),
            "bias": rng.normal(size=cout)}  # fmt: skip


def payload(channels: int, kernel: int, seed: int = 0, depthwise: bool = False,
            mid: int | None = None) -> Payload:  # fmt: skip
    """The fields of `block`'s graph."""
    rng = np.random.default_rng(seed)
    mid = mid or (channels if depthwise else channels + 8)
    return Payload({1: conv_fields(rng, 1, channels, channels), 2: norm_fields(rng, channels),
                    3: conv_fields(rng, kernel, 1 if depthwise else channels, mid),
                    4: norm_fields(rng, mid), 6: conv_fields(rng, kernel, mid, channels),
                    7: norm_fields(rng, channels)})  # fmt: skip


def unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds without the rule from now on (and no graph compiled before reused)."""
    monkeypatch.setattr(
        codegen_module, "norm_stores", lambda graph, shapes, out, maps, fused: (maps, fused)
    )
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the patch is not in the caches' keys


#: (channels, size, kernel, lead, conv a's output channels): the kernel conv a runs on this
#: host, checked below.
SHAPES = {
    "product": (16, 16, 3, 2, 24),  # rows of whole vectors: the product kernel, read in place
    "product, wide": (8, 56, 3, 1, 16),  # 56 of 58 staged columns: whole staged rows
    "product, packed runs": (16, 13, 3, 2, 24),  # 13 of 15: patches packed, stored per plane
    "product, a cut panel": (16, 4, 3, 2, 24),  # 16 positions an image: half a last panel
    "direct": (32, 14, 3, 1, 40),  # 3x3 over 32 channels of 14 x 14: the direct kernel
    "direct, a partial block": (40, 14, 3, 2, 48),  # 48 channels: a last block of 16 of 32
    "transposed": (64, 7, 1, 1, 128),  # 1x1 over 64 channels of 7 x 7, to 128: C^T
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_batch_norms_run_in_the_convolutions_stores(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    channels, size, kernel, lead, mid = SHAPES[name]
    graph = checked_graph(tlc.parse(block(channels, size, kernel, lead, mid=mid)))
    weights = payload(channels, kernel, mid=mid)
    built = build_graph_module(graph, weights, np.float32)
    plan = built.plan
    for conv, norm in ((1, 2), (3, 4)):
        assert [type(m).__name__ for m in plan.nodes[conv].maps] == ["BatchNormEvalOp"]
        assert plan.nodes[norm].fused_into == conv and f'.n{norm}"' not in built.ir
    assert plan.nodes[3].epilogue is not None and plan.nodes[5].fused_into == 3
    # The residual add reads the shortcut in the batch norm's pass, not in conv b's stores.
    assert plan.nodes[6].maps == () and plan.nodes[7].fused_into is None
    assert plan.nodes[7].epilogue is not None and plan.nodes[9].fused_into == 7
    plane = (lead, channels, size, size)
    wider = (lead, mid, size, size)
    chosen = kernel_name(target_info(HOST), 4, ConvFrame.of(graph.nodes[3], plane, wider))
    prefix = "C " if name.startswith("product") else "C^T" if name == "transposed" else "direct"
    # SSE hosts take other kernels for some: still checked below.
    assert chosen.startswith(prefix) or target_info(HOST).vector_bytes < 32
    x = np.random.default_rng(1).normal(size=(lead, channels, size, size)).astype(np.float32)
    fused = [compile_graph(graph, weights, np.float32, threads=t)(x) for t in (1, 2)]
    expected = interpret(graph, weights, x, np.float32).output
    np.testing.assert_allclose(fused[0], expected, rtol=2e-5, atol=2e-5)
    params = pack_params(graph, weights, np.float32)
    runtime = compile_graph(graph, None, np.float32, runtime_payload=True)(x, params)
    unfused(monkeypatch)
    assert '.n4"' in build_graph_module(graph, weights, np.float32).ir
    want = compile_graph(graph, weights, np.float32, threads=1)(x)
    assert all(got.tobytes() == want.tobytes() for got in fused)
    again = compile_graph(graph, None, np.float32, runtime_payload=True)(x, params)
    assert runtime.tobytes() == again.tobytes()


def test_a_held_payload_reads_the_batch_norms_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """A payload over BAKE_LIMIT is held by the JIT in the baked layouts (`bound_params`):
    the batch norms, views of their convolutions, keep their fields there."""
    monkeypatch.setattr(codegen_module, "BAKE_LIMIT", 1024)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    graph = checked_graph(tlc.parse(block(32, 14, 3)))
    weights = payload(32, 3, seed=5)
    held = compile_graph(graph, weights, np.float32)
    assert held.bound is not None
    x = np.random.default_rng(6).normal(size=(1, 32, 14, 14)).astype(np.float32)
    got = held(x)
    unfused(monkeypatch)
    assert got.tobytes() == compile_graph(graph, weights, np.float32)(x).tobytes()


def test_only_a_convolutions_only_user_joins_its_stores() -> None:
    """Not when the convolution is read twice or is depthwise."""
    text = block(16, 8, 3).replace("%8 = add(%7, %2)", "%8 = add(%7, %1)")
    text = text.replace("%9 = relu(%8)", "%9 = add(%8, %2)")
    graph = checked_graph(tlc.parse(text))  # %1 read by its batch norm and the add
    plan = build_graph_module(graph, payload(16, 3), np.float32).plan
    assert plan.nodes[1].maps == () and plan.nodes[2].fused_into is None
    assert plan.nodes[3].maps != ()
    graph = checked_graph(tlc.parse(block(16, 8, 3, depthwise=True)))
    plan = build_graph_module(graph, payload(16, 3, depthwise=True), np.float32).plan
    assert plan.nodes[3].maps == () and plan.nodes[1].maps != ()


def test_a_kernel_shared_by_different_chains_keeps_its_batch_norms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Convolutions a and b of the same attributes and shapes share one node function; b's
    batch norm feeds the residual add (it stays a pass), so a keeps its batch norm too and
    the module has as many functions as unfused; the projection, alone of its kind, takes
    its own."""
    graph = checked_graph(tlc.parse(block(16, 8, 3, mid=16)))
    weights = payload(16, 3, mid=16)
    built = build_graph_module(graph, weights, np.float32)
    nodes = built.plan.nodes
    assert nodes[3].maps == () and nodes[4].fused_into is None and nodes[5].fused_into == 4
    assert nodes[6].maps == () and nodes[1].maps != ()
    x = np.random.default_rng(2).normal(size=(1, 16, 8, 8)).astype(np.float32)
    got = compile_graph(graph, weights, np.float32)(x)
    unfused(monkeypatch)
    alone = build_graph_module(graph, weights, np.float32)
    # conv a and b share one function either way; the projection's batch norm has none now
    assert built.ir.count("define internal") == alone.ir.count("define internal") - 1
    assert got.tobytes() == compile_graph(graph, weights, np.float32)(x).tobytes()


def test_the_maps_after_the_batch_norm_and_an_output_batch_norm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """conv -> batch norm -> mul_elem and add by per-channel constants -> relu (`channel_maps`'
    chain, moved to the convolution with the batch norm), and a batch norm that is the graph's
    output (the convolution writes it): the unfused bits."""
    spread = "{from = [8, 1, 1], to = [2, 8, 6, 6]}"
    text = f"""tl.graph @maps {{
  %0 = input : [2, 8, 6, 6]
  %1 = conv(%0) {{kernel = [3, 3], padding = [1, 1], channel_axis = 1, in_channels = 8, out_channels = 8}}
  %2 = batch_norm_eval(%1) {{channel_axis = 1, channels = 8}}
  %3 = const {{shape = [8, 1, 1]}}
  %4 = broadcast_to(%3) {spread}
  %5 = mul_elem(%2, %4)
  %6 = const {{shape = [8, 1, 1]}}
  %7 = broadcast_to(%6) {spread}
  %8 = add(%5, %7)
  %9 = relu(%8)
  %10 = conv(%9) {{kernel = [1, 1], channel_axis = 1, in_channels = 8, out_channels = 8}}
  %11 = batch_norm_eval(%10) {{channel_axis = 1, channels = 8}}
  output %11
}}
"""  # noqa: E501
    rng = np.random.default_rng(8)
    weights = Payload({1: conv_fields(rng, 3, 8, 8), 2: norm_fields(rng, 8),
                       3: {"value": rng.uniform(0.5, 1.5, 8)}, 6: {"value": rng.normal(size=8)},
                       10: conv_fields(rng, 1, 8, 8), 11: norm_fields(rng, 8)})  # fmt: skip
    graph = checked_graph(tlc.parse(text))
    plan = build_graph_module(graph, weights, np.float32).plan
    kinds = [type(m).__name__ for m in plan.nodes[1].maps]
    assert kinds == ["BatchNormEvalOp", "MulElemOp", "AddOp"] and plan.nodes[9].fused_into == 1
    assert plan.nodes[11].fused_into == 10 and plan.writer == 10
    x = rng.normal(size=(2, 8, 6, 6)).astype(np.float32)
    got = compile_graph(graph, weights, np.float32)(x)
    expected = interpret(graph, weights, x, np.float32).output
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    unfused(monkeypatch)
    assert got.tobytes() == compile_graph(graph, weights, np.float32)(x).tobytes()
