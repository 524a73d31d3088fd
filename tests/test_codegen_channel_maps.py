"""A batch norm followed by per-channel maps and a relu (ONNX zoo densenet121's pre-activation:
batch norm, a scale and a shift by broadcast constants, relu, then the convolution) compiles to
one pass: the batch norm's kernel applies every map and the relu as it stores
(`module.channel_maps`, `Step.maps`), and the maps and broadcasts are never computed. Each
element goes through the same operations in the same order as in the unfused graph, so the
bits are the unfused build's; against the reference interpreter, the op records' f32
tolerance for normalisations (rtol 2e-5, docs/codegen.md "Numerical policy").
"""

from __future__ import annotations

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import jit
from tlc.codegen import module as codegen_module
from tlc.codegen.jit import compile_graph
from tlc.codegen.module import build_graph_module
from tlc.core.payload import Payload
from tlc.semantics.interpret import interpret

DTYPES = {"f64": np.float64, "f32": np.float32}


def pre_activation(lead: int | None, channels: int = 8, size: int = 6,
                   second: str = "mul_elem", shared: bool = False) -> str:  # fmt: skip
    """input -> batch norm -> `second`(., broadcast c1) -> add(., broadcast c2) -> relu ->
    1x1 conv over `lead` images (None: one image without a leading axis, for `batch=`);
    `shared`: c1's broadcast has a second user (an add to the conv's output)."""
    shape = [channels, size, size] if lead is None else [lead, channels, size, size]
    axis = len(shape) - 3
    spread = f"{{from = [{channels}, 1, 1], to = {shape}}}"
    tail = "  output %9" if not shared else "  %10 = add(%9, %3)\n  output %10"
    return f"""tl.graph @pre {{
  %0 = input : {shape}
  %1 = batch_norm_eval(%0) {{channel_axis = {axis}, channels = {channels}}}
  %2 = const {{shape = [{channels}, 1, 1]}}
  %3 = broadcast_to(%2) {spread}
  %4 = {second}(%1, %3)
  %5 = const {{shape = [{channels}, 1, 1]}}
  %6 = broadcast_to(%5) {spread}
  %7 = add(%4, %6)
  %8 = relu(%7)
  %9 = conv(%8) {{kernel = [1, 1], channel_axis = {axis}, in_channels = {channels}, out_channels = {channels}}}
{tail}
}}
"""  # noqa: E501


def payload(channels: int = 8, seed: int = 0) -> Payload:
    rng = np.random.default_rng(seed)
    return Payload({
        1: {"gamma": rng.uniform(0.5, 1.5, channels), "beta": rng.normal(size=channels),
            "mean": rng.normal(size=channels), "var": rng.uniform(0.5, 1.5, channels)},
        2: {"value": rng.uniform(0.5, 1.5, channels)},
        5: {"value": rng.normal(size=channels)},
        9: {"weight": rng.normal(size=(channels, channels, 1, 1)) / np.sqrt(channels),
            "bias": rng.normal(size=channels)},
    })  # fmt: skip


def unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds without the maps from now on (and no graph compiled before reused)."""
    monkeypatch.setattr(codegen_module, "channel_maps", lambda *args: ({}, {}))
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the patch is not in the caches' keys


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("lead", [1, 3])
def test_the_maps_run_in_the_batch_norms_pass(
    lead: int, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = DTYPES[dtype]
    graph = checked_graph(tlc.parse(pre_activation(lead)))
    built = build_graph_module(graph, payload(), t)
    plan = built.plan
    assert [type(m).__name__ for m in plan.nodes[1].maps] == ["MulElemOp", "AddOp"]
    assert plan.nodes[1].epilogue is not None and plan.nodes[8].fused_into == 1
    assert all(plan.nodes[i].dead for i in (3, 4, 6, 7))
    for node in (3, 4, 6, 7, 8):  # no kernel computes a map, a broadcast or the relu
        assert f'.n{node}"' not in built.ir, node
    x = np.random.default_rng(1).normal(size=(lead, 8, 6, 6)).astype(t)
    monkeypatch.setattr(jit, "_graph_cache", {})
    fused = compile_graph(graph, payload(), t)(x)
    expected = interpret(graph, payload(), x, t).output
    np.testing.assert_allclose(fused, expected, rtol=2e-5 if t is np.float32 else 1e-11,
                               atol=1e-6 if t is np.float32 else 1e-12)  # fmt: skip
    unfused(monkeypatch)
    assert '.n4"' in build_graph_module(graph, payload(), t).ir
    assert compile_graph(graph, payload(), t)(x).tobytes() == fused.tobytes()


def test_a_batch_extent_and_threads_keep_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled for a batch of 16 (the batch norm one kernel over the batch, its constants
    not batched) and over 16 images (row tasks), at several thread counts: the same bytes as
    unfused."""
    x = np.random.default_rng(2).normal(size=(16, 16, 20, 20)).astype(np.float32)
    for lead, batch in ((None, 16), (16, None)):
        graph = checked_graph(tlc.parse(pre_activation(lead, channels=16, size=20)))
        assert build_graph_module(graph, payload(16), np.float32, batch=batch).plan.nodes[1].maps
        fused = [compile_graph(graph, payload(16), np.float32, batch, threads=t)(x)
                 for t in (1, 2, 3)]  # fmt: skip
        with monkeypatch.context() as patch:
            unfused(patch)
            want = compile_graph(graph, payload(16), np.float32, batch, threads=1)(x)
        assert all(got.tobytes() == want.tobytes() for got in fused)


def test_only_per_channel_first_operand_chains_ending_in_a_relu_fuse() -> None:
    graph = checked_graph(tlc.parse(pre_activation(1, shared=True)))  # %3 read twice
    assert build_graph_module(graph, payload(), np.float32).plan.nodes[1].maps == ()
    text = pre_activation(1).replace("%8 = relu(%7)", "%8 = sigmoid(%7)")
    graph = checked_graph(tlc.parse(text))
    assert build_graph_module(graph, payload(), np.float32).plan.nodes[1].maps == ()
    text = pre_activation(1).replace("%4 = mul_elem(%1, %3)", "%4 = mul_elem(%3, %1)")
    graph = checked_graph(tlc.parse(text))
    assert build_graph_module(graph, payload(), np.float32).plan.nodes[1].maps == ()


@pytest.mark.parametrize("second", ["sub", "div"])
def test_every_map_kind_keeps_its_order(second: str, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = checked_graph(tlc.parse(pre_activation(1, second=second)))
    assert len(build_graph_module(graph, payload(), np.float32).plan.nodes[1].maps) == 2
    x = np.random.default_rng(3).normal(size=(1, 8, 6, 6)).astype(np.float32)
    monkeypatch.setattr(jit, "_graph_cache", {})
    fused = compile_graph(graph, payload(), np.float32)(x)
    unfused(monkeypatch)
    assert compile_graph(graph, payload(), np.float32)(x).tobytes() == fused.tobytes()


def test_a_relu_right_after_a_batch_norm_is_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """conv -> batch norm -> relu (ONNX zoo resnet50's, not folded into the weights): the
    relu is applied in the batch norm's pass, the same bits."""
    text = """tl.graph @bn {
  %0 = input : [1, 8, 6, 6]
  %1 = batch_norm_eval(%0) {channel_axis = 1, channels = 8}
  %2 = relu(%1)
  output %2
}
"""
    graph = checked_graph(tlc.parse(text))
    weights = Payload({1: payload().records[1]})
    assert build_graph_module(graph, weights, np.float32).plan.nodes[2].fused_into == 1
    x = np.random.default_rng(4).normal(size=(1, 8, 6, 6)).astype(np.float32)
    fused = compile_graph(graph, weights, np.float32)(x)
    monkeypatch.setattr(codegen_module, "fusions", lambda *args: {})
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    assert build_graph_module(graph, weights, np.float32).plan.nodes[2].fused_into is None
    assert compile_graph(graph, weights, np.float32)(x).tobytes() == fused.tobytes()
