"""A one-tap, unpadded, strided convolution (resnet's 1x1 stride-2 downsamples) stages only
stride phase 0 of its input, the one phase it reads (`ConvFrame.subsampled`,
`ConvFrame._stage_phase`): the staged planes are the output planes' size, every element
written, no padding to zero. Checked against the reference interpreter (the op records'
f32 tolerance for convolutions, rtol 2e-5, docs/codegen.md "Numerical policy") on even and
odd extents, strides along one axis or both, 1-d and 2-d, one image and several, every
convolution kernel that stages (the product kernel, C^T, split parts at 1 and 2 threads: the
same bytes), and in AVX2 and SSE code where the host runs it.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_codegen_targets import runnable

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen.jit import compile_graph
from tlc.codegen.lower.convolution import ConvFrame
from tlc.core.payload import Payload
from tlc.dialect.shapes import numel
from tlc.dialect.verify import graph_shapes
from tlc.semantics.interpret import interpret


def downsample(lead: int, cin: int, cout: int, extents: tuple[int, ...],
               stride: tuple[int, ...]) -> str:  # fmt: skip
    shape = [lead, cin, *extents]
    ones = [1] * len(extents)
    return f"""tl.graph @down {{
  %0 = input : {shape}
  %1 = conv(%0) {{kernel = {ones}, stride = {list(stride)}, channel_axis = 1, in_channels = {cin}, out_channels = {cout}}}
  %2 = relu(%1)
  output %2
}}
"""  # noqa: E501


CASES = [
    (1, 64, 128, (56, 56), (2, 2)),  # resnet18's first downsample: the product kernel
    (2, 16, 32, (28, 28), (2, 2)),  # two images a group
    (1, 256, 512, (14, 14), (2, 2)),  # 7 x 7 out: C^T
    (1, 8, 16, (33, 31), (2, 2)),  # odd extents: the last step stops at the last input
    (3, 8, 16, (9, 40), (1, 3)),  # a stride along the last axis only
    (1, 8, 16, (40, 9), (2, 1)),  # along the first only: whole rows copied
    (2, 8, 16, (70,), (2,)),  # 1-d
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[3]}s{c[4]}")
def test_only_phase_zero_is_staged(case: tuple) -> None:
    lead, cin, cout, extents, stride = case
    graph = checked_graph(tlc.parse(downsample(lead, cin, cout, extents, stride)))
    out_sp = tuple(-(-e // s) for e, s in zip(extents, stride, strict=True))
    frame = ConvFrame.of(graph.nodes[1], (lead, cin, *extents), (lead, cout, *out_sp))
    assert frame.subsampled and frame.staged_plane == numel(out_sp)
    rng = np.random.default_rng(len(extents) + cin)
    weights = Payload({1: {"weight": rng.normal(size=(cout, cin, *([1] * len(extents)))),
                           "bias": rng.normal(size=cout)}})  # fmt: skip
    x = rng.normal(size=(lead, cin, *extents)).astype(np.float32)
    got = [compile_graph(graph, weights, np.float32, threads=t)(x) for t in (1, 2)]
    expected = interpret(graph, weights, x, np.float32).output
    np.testing.assert_allclose(got[0], expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    assert got[0].tobytes() == got[1].tobytes()


def test_a_runtime_payload_stages_phase_zero_too() -> None:
    """The row-major weights' product kernel reads the same staged planes."""
    graph = checked_graph(tlc.parse(downsample(1, 16, 24, (20, 22), (2, 2))))
    rng = np.random.default_rng(7)
    weight, bias = rng.normal(size=(24, 16, 1, 1)), rng.normal(size=24)
    x = rng.normal(size=(1, 16, 20, 22)).astype(np.float32)
    params = np.concatenate([weight.reshape(-1), bias]).astype(np.float32)
    got = compile_graph(graph, None, np.float32, runtime_payload=True)(x, params)
    expected = interpret(graph, Payload({1: {"weight": weight, "bias": bias}}), x,
                         np.float32).output  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


def test_padding_or_more_taps_stage_every_phase() -> None:
    base = downsample(1, 8, 8, (12, 12), (2, 2))
    for text in (base.replace("kernel = [1, 1]", "kernel = [3, 3]"),
                 base.replace("stride", "padding = [1, 1], stride")):  # fmt: skip
        graph = checked_graph(tlc.parse(text))
        shapes = graph_shapes(graph)
        frame = ConvFrame.of(graph.nodes[1], shapes[0], shapes[1])
        assert not frame.subsampled and frame.staged_plane == 4 * numel(frame.window.phases)


@pytest.mark.parametrize("cpu", ["znver3", "x86-64-v2"])
def test_every_vector_width_stages_phase_zero(cpu: str) -> None:
    """AVX2 (8 lanes of f32, 16 inputs a step) and SSE (4, 8): the same shuffle and tail."""
    target = runnable(cpu)
    for case in (CASES[3], CASES[4], CASES[6]):
        lead, cin, cout, extents, stride = case
        graph = checked_graph(tlc.parse(downsample(lead, cin, cout, extents, stride)))
        rng = np.random.default_rng(11)
        weights = Payload({1: {"weight": rng.normal(size=(cout, cin, *([1] * len(extents)))),
                               "bias": rng.normal(size=cout)}})  # fmt: skip
        x = rng.normal(size=(lead, cin, *extents)).astype(np.float32)
        got = compile_graph(graph, weights, np.float32, target=target)(x)
        expected = interpret(graph, weights, x, np.float32).output
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
