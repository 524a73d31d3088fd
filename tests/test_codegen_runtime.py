"""The runtime of compiled code: memory plan, row tasks on the thread pool, batch as a kernel
dimension, the workspace cache, and the JIT's runtime helper in its private cache."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import subprocess
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_codegen_targets import runnable  # skips, or drops the extensions this CPU lacks

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import jit, runtime
from tlc.codegen.jit import compile_graph
from tlc.codegen.module import build_graph_module
from tlc.codegen.plan import LONG_RUN, PARALLEL_WORK, ROW_TASKS, TASKS
from tlc.codegen.shared_lib import build_library
from tlc.codegen.target import Target
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.payload_section import payload_from_module
from tlc.semantics.interpret import EvalError, interpret

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def wide_mlp(batch: int, rng: np.random.Generator) -> tuple[str, Payload]:
    sizes = [256, 512, 256, 10]
    lines, payload, nid = [f"  %0 = input : [{batch}, 256]"], Payload(), 0
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        lines.append(f"  %{nid + 1} = linear(%{nid}) : [{batch}, {n_out}]")
        payload.records[nid + 1] = {
            "weight": rng.normal(size=(n_out, n_in)) / np.sqrt(n_in),
            "bias": rng.normal(size=n_out),
        }
        nid += 1
        if i < 2:
            lines.append(f"  %{nid + 1} = relu(%{nid}) : [{batch}, {n_out}]")
            nid += 1
    return "tl.graph @wide {\n" + "\n".join(lines) + f"\n  output %{nid}\n}}\n", payload


def conv_fields(cin: int, cout: int, stride: int = 1) -> str:
    return (f"{{kernel = [3, 3], stride = [{stride}, {stride}], padding = [1, 1], "
            f"channel_axis = 1, in_channels = {cin}, out_channels = {cout}}}")  # fmt: skip


def residual_cnn(n: int, rng: np.random.Generator) -> tuple[str, Payload]:
    """A resnet-shaped graph: a stem, two residual blocks (the skip keeps a value alive across
    the block), a strided convolution, pooling, a linear head."""
    c, s = 16, 16
    text = f"""tl.graph @res {{
  %0 = input : [{n}, 3, {s}, {s}]
  %1 = conv(%0) {conv_fields(3, c)} : [{n}, {c}, {s}, {s}]
  %2 = relu(%1) : [{n}, {c}, {s}, {s}]
  %3 = conv(%2) {conv_fields(c, c)} : [{n}, {c}, {s}, {s}]
  %4 = batch_norm_eval(%3) {{channel_axis = 1, channels = {c}}} : [{n}, {c}, {s}, {s}]
  %5 = relu(%4) : [{n}, {c}, {s}, {s}]
  %6 = conv(%5) {conv_fields(c, c)} : [{n}, {c}, {s}, {s}]
  %7 = add(%6, %2) : [{n}, {c}, {s}, {s}]
  %8 = relu(%7) : [{n}, {c}, {s}, {s}]
  %9 = conv(%8) {conv_fields(c, c)} : [{n}, {c}, {s}, {s}]
  %10 = relu(%9) : [{n}, {c}, {s}, {s}]
  %11 = conv(%10) {conv_fields(c, c)} : [{n}, {c}, {s}, {s}]
  %12 = add(%11, %8) : [{n}, {c}, {s}, {s}]
  %13 = relu(%12) : [{n}, {c}, {s}, {s}]
  %14 = conv(%13) {conv_fields(c, 2 * c, 2)} : [{n}, {2 * c}, {s // 2}, {s // 2}]
  %15 = max_pool(%14) {{kernel = [2, 2]}} : [{n}, {2 * c}, {s // 4}, {s // 4}]
  %16 = reshape(%15) {{from = [{n}, {2 * c}, {s // 4}, {s // 4}], to = [{n}, {2 * c * s * s // 16}]}} : [{n}, {2 * c * s * s // 16}]
  %17 = linear(%16) : [{n}, 10]
  %18 = softmax(%17) {{axis = 1}} : [{n}, 10]
  output %18
}}
"""  # noqa: E501
    payload = Payload()
    for node, (cin, cout) in {1: (3, c), 3: (c, c), 6: (c, c), 9: (c, c), 11: (c, c),
                              14: (c, 2 * c)}.items():  # fmt: skip
        payload.records[node] = {
            "weight": rng.normal(size=(cout, cin, 3, 3)) / np.sqrt(9 * cin),
            "bias": rng.normal(size=cout) * 0.1,
        }
    payload.records[4] = {
        "gamma": rng.uniform(0.5, 1.5, c),
        "beta": rng.normal(size=c) * 0.1,
        "mean": rng.normal(size=c) * 0.1,
        "var": rng.uniform(0.5, 1.5, c),
    }
    payload.records[17] = {"weight": rng.normal(size=(10, 2 * c * s * s // 16)) * 0.05}
    return text, payload


def graph_of(text: str):
    return checked_graph(tlc.parse(text))


def test_the_plan_reuses_memory_by_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the residual add a map of its own (as after a producer that cannot fuse it)."""
    from tlc.codegen import module

    unary = {op: fn for op, fn in module.EPILOGUES.items() if op is not ops.AddOp}
    monkeypatch.setattr(module, "EPILOGUES", unary)
    text, payload = residual_cnn(4, np.random.default_rng(0))
    plan = build_graph_module(graph_of(text), payload, np.float32).plan
    assert plan is not None and plan.arena < plan.unshared / 2
    nodes = plan.nodes
    # the relu after the batch norm is applied in its pass (a view of its value)...
    assert nodes[5].fused_into == 4 and nodes[5].offset is None
    # ...and the residual add overwrites one of its operands, both dying there; but no node
    # of the block takes the region of %2, the skip the add still reads.
    assert nodes[7].in_place and nodes[7].offset in (nodes[6].offset, nodes[2].offset)
    live = {2: range(2, 8), 6: range(6, 8)}
    for a, span in live.items():
        for b in span:
            if b != a and nodes[b].offset is not None and not nodes[b].in_place:
                assert nodes[b].offset != nodes[a].offset, (a, b)


def test_a_fused_residual_add_keeps_its_shortcut_alive() -> None:
    """conv -> add(., %2) -> relu is one kernel: the convolution reads the shortcut %2 as it
    stores (an operand of its kernel), the add and the relu are views of its value, and no
    value computed while %2 is alive takes its region."""
    text, payload = residual_cnn(4, np.random.default_rng(0))
    plan = build_graph_module(graph_of(text), payload, np.float32).plan
    assert plan is not None
    nodes = plan.nodes
    assert nodes[6].reads == (5, 2) and nodes[6].epilogue is not None
    assert [n.TAG for n in nodes[6].epilogue.nodes] == ["add", "relu"]
    assert nodes[7].fused_into == nodes[8].fused_into == 6
    assert nodes[12].fused_into == nodes[13].fused_into == 11 and nodes[11].reads == (10, 8)
    for b in range(3, 7):
        assert nodes[b].offset is None or nodes[b].offset != nodes[1].offset, b


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_a_planned_residual_graph_matches_the_reference(dtype: type) -> None:
    rng = np.random.default_rng(1)
    text, payload = residual_cnn(4, rng)
    graph = graph_of(text)
    x = rng.normal(size=(4, 3, 16, 16)).astype(dtype)
    expected = interpret(graph, payload, x, dtype).output
    got = compile_graph(graph, payload, dtype, threads=2)(x)
    # Convolutions are contractions: the op records' summation-order tolerance.
    np.testing.assert_allclose(got, expected, rtol=1e-11 if dtype == np.float64 else 2e-5,
                               atol=1e-14 if dtype == np.float64 else 2e-6)  # fmt: skip


def fire(squeeze: int, expand: int, tail: str, n: int = 1) -> tuple[str, Payload]:
    """A squeezenet fire module on n x 16 x 20 x 20: a 1x1 squeeze, then 1x1 and 3x3
    expansions of it (relu fused) concatenated along the channels, then `tail`."""
    s, e = squeeze, expand
    one = f"{{kernel = [1, 1], channel_axis = 1, in_channels = {s}, out_channels = {e}}}"
    text = f"""tl.graph @fire {{
  %0 = input : [{n}, 16, 20, 20]
  %1 = conv(%0) {{kernel = [1, 1], channel_axis = 1, in_channels = 16, out_channels = {s}}}
  %2 = relu(%1) : [{n}, {s}, 20, 20]
  %3 = conv(%2) {one} : [{n}, {e}, 20, 20]
  %4 = relu(%3) : [{n}, {e}, 20, 20]
  %5 = conv(%2) {conv_fields(s, e)} : [{n}, {e}, 20, 20]
  %6 = relu(%5) : [{n}, {e}, 20, 20]
  %7 = concat(%4, %6) {{axis = 1}} : [{n}, {2 * e}, 20, 20]
{tail}
}}
"""
    rng = np.random.default_rng(4)
    payload = Payload()
    for node, (cin, cout, k) in {1: (16, s, 1), 3: (s, e, 1), 5: (s, e, 3)}.items():
        payload.records[node] = {"weight": rng.normal(size=(cout, cin, k, k)) / np.sqrt(cin * k),
                                 "bias": rng.normal(size=cout) * 0.1}  # fmt: skip
    return text, payload


@pytest.mark.parametrize(
    ("tail", "gathered"),
    [("  %8 = max_pool(%7) {kernel = [2, 2]}\n  output %8", True),
     ("  output %7", True),  # the concat is the output: the expansions write the caller's out
     ("  %8 = add(%7, %7)\n  %9 = concat(%8, %4) {axis = 1}\n  output %9", False)],
    ids=["fire", "output", "part read twice"],
)  # fmt: skip
@pytest.mark.parametrize("n", [1, 4], ids=["one image", "batch"])
def test_concat_parts_are_written_in_place(tail: str, gathered: bool, n: int) -> None:
    """A channel concatenation whose parts are read by nothing else is a region its
    producers write their slabs of: no copy (no concat function in the IR), the reference's
    values, the same bits at any thread count. In a batch the producers run as tasks of one
    image, each writing a concatenation row further on. In a batch a part with another
    reader keeps its own region and the concat copies it; with one image its slab is
    contiguous, and the other reader reads it there (the second concat, which also has it
    as a part, then copies it)."""
    sq, e = (8, 32) if n == 1 else (16, 64)  # at batch 4, enough work for row regions
    text, payload = fire(sq, e, tail, n)
    graph = graph_of(text)
    built = build_graph_module(graph, payload, np.float32)
    nodes = built.plan.nodes
    gathered = gathered or n == 1
    assert nodes[7].gathered == gathered
    assert ('"tlc_fire.n7"' in built.ir) != gathered
    if gathered:
        assert (nodes[3].into, nodes[5].into) == ((7, 0), (7, e * 400))
        if n > 1:
            assert all(nodes[i].rows.chunk == 1 and nodes[i].out_stride == 2 * e * 400
                       for i in (3, 5))  # fmt: skip
        if nodes[7].offset is not None:  # alive from its first part on: apart from %2
            squeezed = range(nodes[1].offset, nodes[1].offset + n * sq * 400)
            concat = range(nodes[7].offset, nodes[7].offset + n * 2 * e * 400)
            assert not set(squeezed) & set(concat)
    x = np.random.default_rng(5).normal(size=(n, 16, 20, 20)).astype(np.float32)
    outputs = {t: compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)}
    assert bits(outputs[1]) == bits(outputs[2])
    expected = interpret(graph, payload, x, np.float32).output
    np.testing.assert_allclose(outputs[1], expected, rtol=2e-5, atol=2e-6)


def test_growing_concatenations_are_prefixes_of_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense block (densenet's): each layer's convolution reads the block's concatenation
    so far (through a batch norm) and its output is concatenated to it. With one image every
    concatenation is a prefix of the block's last one, whose region the pool before the
    block and every convolution write their channels into: no concat copies, the reference's
    values, the same bits at 1 and 2 threads."""
    lines = ["  %0 = input : [1, 16, 12, 12]", "  %1 = max_pool(%0) {kernel = [1, 1]}"]
    payload, rng, last, channels = Payload(), np.random.default_rng(6), 1, 16
    for layer in range(3):
        n = 4 * layer + 2
        lines += [f"  %{n} = batch_norm_eval(%{last}) {{channel_axis = 1, channels = {channels}}}",
                  f"  %{n + 1} = relu(%{n})",
                  f"  %{n + 2} = conv(%{n + 1}) {conv_fields(channels, 8)}",
                  f"  %{n + 3} = concat(%{last}, %{n + 2}) {{axis = 1}}"]  # fmt: skip
        payload.records[n] = {"gamma": rng.uniform(0.5, 1.5, channels),
                              "beta": rng.normal(size=channels), "mean": rng.normal(size=channels),
                              "var": rng.uniform(0.5, 1.5, channels)}  # fmt: skip
        payload.records[n + 2] = {"weight": rng.normal(size=(8, channels, 3, 3)) / 12,
                                  "bias": rng.normal(size=8)}  # fmt: skip
        last, channels = n + 3, channels + 8
    lines += [f"  %14 = max_pool(%{last}) {{kernel = [2, 2]}}", "  output %14"]
    graph = graph_of("tl.graph @dense {\n" + "\n".join(lines) + "\n}\n")
    built = build_graph_module(graph, payload, np.float32)
    nodes = built.plan.nodes
    assert all(nodes[c].gathered for c in (5, 9, 13))
    assert (nodes[1].into, nodes[5].into, nodes[9].into) == ((5, 0), (9, 0), (13, 0))
    assert [nodes[c].into for c in (4, 8, 12)] == [(5, 16 * 144), (9, 24 * 144), (13, 32 * 144)]
    assert not any(f'"tlc_dense.n{c}"' in built.ir for c in (5, 9, 13))
    x = np.random.default_rng(7).normal(size=(1, 16, 12, 12)).astype(np.float32)
    outputs = {t: compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)}
    assert bits(outputs[1]) == bits(outputs[2])
    expected = interpret(graph, payload, x, np.float32).output
    np.testing.assert_allclose(outputs[1], expected, rtol=2e-5, atol=2e-6)


def test_row_runs_take_each_chunk_through_a_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive row regions over the same tasks (at batch 4, the convolutions from the
    first block's second on: the residual adds are fused into them) are one region whose
    task runs each on its rows (where the run's values lie: tests/test_codegen_task_blocks.py),
    and the bits are those of one region per node."""
    from tlc.codegen import plan as codegen_plan

    text, payload = residual_cnn(4, np.random.default_rng(0))
    graph = graph_of(text)
    built = build_graph_module(graph, payload, np.float32)
    nodes = built.plan.nodes
    chained = [(p.node.id, p.run_end) for p in nodes if p.run is not None]
    assert chained == [(6, False), (9, False), (11, False), (14, True)]
    assert '"tlc_res.r6"' in built.ir
    x = np.random.default_rng(3).normal(size=(4, 3, 16, 16)).astype(np.float32)
    runs = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)]
    monkeypatch.setattr(codegen_plan, "row_runs", lambda plans: None)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    assert ".r6" not in build_graph_module(graph, payload, np.float32).ir
    alone = compile_graph(graph, payload, np.float32, threads=2)(x)
    assert bits(runs[0]) == bits(runs[1]) == bits(alone)


def conv_chain(batch: int, depth: int, rng: np.random.Generator) -> tuple[str, Payload]:
    """`depth` 3x3 convolutions of 8 channels on 24 x 24, each with a relu (fused into it)."""
    lines, payload = [f"  %0 = input : [{batch}, 8, 24, 24]"], Payload()
    for i in range(depth):
        lines.append(f"  %{2 * i + 1} = conv(%{2 * i}) {conv_fields(8, 8)} : [{batch}, 8, 24, 24]")
        lines.append(f"  %{2 * i + 2} = relu(%{2 * i + 1}) : [{batch}, 8, 24, 24]")
        payload.records[2 * i + 1] = {"weight": rng.normal(size=(8, 8, 3, 3)) / 9,
                                      "bias": rng.normal(size=8)}  # fmt: skip
    body = "\n".join(lines)
    return f"tl.graph @chain {{\n{body}\n  output %{2 * depth}\n}}\n", payload


@pytest.mark.parametrize(("depth", "chunk"), [(LONG_RUN, 1), (LONG_RUN - 1, 2)])
def test_long_row_runs_take_one_image_per_task(
    monkeypatch: pytest.MonkeyPatch, depth: int, chunk: int
) -> None:
    """At batch 12 (rows in TASKS chunks of 2), a row run of LONG_RUN convolutions runs one
    image per task (`plan.one_row_runs`), a shorter one keeps its chunks; the bits are those
    of the chunked run, at 1 and 2 threads."""
    from tlc.codegen import plan as codegen_plan

    assert -(-12 // TASKS) == 2 and ROW_TASKS >= 12
    text, payload = conv_chain(12, depth, np.random.default_rng(4))
    graph = graph_of(text)
    nodes = build_graph_module(graph, payload, np.float32).plan.nodes
    convs = [p for p in nodes if isinstance(p.node, ops.ConvOp)]
    assert {(p.run, p.rows.chunk, p.rows.full.out_shape[0]) for p in convs} == {(1, chunk, chunk)}
    x = np.random.default_rng(5).normal(size=(12, 8, 24, 24)).astype(np.float32)
    runs = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)]
    monkeypatch.setattr(codegen_plan, "ROW_TASKS", 8)  # 12 rows: past it, chunks of 2
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    chunked = build_graph_module(graph, payload, np.float32).plan.nodes
    assert {p.rows.chunk for p in chunked if isinstance(p.node, ops.ConvOp)} == {2}
    alone = compile_graph(graph, payload, np.float32, threads=1)(x)
    assert bits(runs[0]) == bits(runs[1]) == bits(alone)


def test_heavy_layers_stay_out_of_row_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose payload holds more than RUN_PARAMS elements (8 x 8 x 3 x 3 weights and 8
    biases: 584, here over a bound of 500) joins no row run (`plan._heavy`): run image by
    image it would read its weights once per image. Its region keeps its chunks of 2 images,
    and the bits are those of the run of one image per task, at 1 and 2 threads."""
    from tlc.codegen import plan as codegen_plan

    text, payload = conv_chain(12, LONG_RUN, np.random.default_rng(4))
    graph = graph_of(text)
    x = np.random.default_rng(5).normal(size=(12, 8, 24, 24)).astype(np.float32)
    in_runs = compile_graph(graph, payload, np.float32, threads=1)(x)
    monkeypatch.setattr(codegen_plan, "RUN_PARAMS", 500)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    nodes = build_graph_module(graph, payload, np.float32).plan.nodes
    convs = [p for p in nodes if isinstance(p.node, ops.ConvOp)]
    assert {(p.run, p.rows.chunk) for p in convs} == {(None, 2)}
    for threads in (1, 2):
        alone = compile_graph(graph, payload, np.float32, threads=threads)(x)
        assert bits(alone) == bits(in_runs)
    monkeypatch.setattr(codegen_plan, "RUN_PARAMS", 584)  # not over it: one run again
    assert {p.run for p in build_graph_module(graph, payload, np.float32).plan.nodes
            if isinstance(p.node, ops.ConvOp)} == {1}  # fmt: skip


@pytest.mark.parametrize(
    ("pool", "fill", "bypassed"),
    [("max_pool", -np.inf, True), ("avg_pool", 0.0, True), ("max_pool", 0.0, False)],
    ids=["max, -inf", "average, 0", "max, 0"],
)
def test_a_pool_reads_around_its_padding_concatenations(pool: str, fill: float,
                                                        bypassed: bool) -> None:  # fmt: skip
    """ceil_mode pooling as ONNX imports it: the input padded at the end of both spatial axes
    by concatenations with constants of the pooling's padding value. The pooling reads the
    input itself (its windows past the end are padding) and the concatenations are never
    computed; a constant of any other value is data, and the copies stay."""
    text = f"""tl.graph @ceil {{
  %0 = input : [2, 3, 9, 9]
  %1 = const {{shape = [2, 3, 1, 9]}} : [2, 3, 1, 9]
  %2 = concat(%0, %1) {{axis = 2}} : [2, 3, 10, 9]
  %3 = const {{shape = [2, 3, 10, 1]}} : [2, 3, 10, 1]
  %4 = concat(%2, %3) {{axis = 3}} : [2, 3, 10, 10]
  %5 = {pool}(%4) {{kernel = [3, 3], stride = [2, 2]}} : [2, 3, 4, 4]
  output %5
}}
"""
    graph = graph_of(text)
    payload = Payload({1: {"value": np.full(54, fill)}, 3: {"value": np.full(60, fill)}})
    nodes = build_graph_module(graph, payload, np.float32).plan.nodes
    assert (nodes[5].reads, nodes[2].dead, nodes[4].dead) == (
        ((0,), True, True) if bypassed else ((4,), False, False)
    )
    x = np.random.default_rng(6).normal(size=(2, 3, 9, 9)).astype(np.float32)
    expected = interpret(graph, payload, x, np.float32).output
    # An average's 9 terms are summed in 3 chains: float32 rounding of the order.
    got = compile_graph(graph, payload, np.float32)(x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_results_do_not_depend_on_the_thread_count(dtype: type) -> None:
    rng = np.random.default_rng(2)
    # 100 rows of an elementwise map: chunks of 13 rows and a last one of 9 (its own kernel).
    tail = "tl.graph @t {\n  %0 = input : [100, 6000]\n  %1 = exp(%0) : [100, 6000]\n" \
        "  %2 = tanh(%1) : [100, 6000]\n  output %2\n}\n"  # fmt: skip
    for text, payload, x in (
        (*wide_mlp(64, rng), rng.normal(size=(64, 256))),
        (*residual_cnn(8, rng), rng.normal(size=(8, 3, 16, 16))),
        (tail, None, rng.normal(size=(100, 6000))),
    ):
        graph = graph_of(text)
        plan = build_graph_module(graph, payload, dtype).plan
        assert plan is not None and any(p.rows and p.rows.parallel for p in plan.nodes)
        x = x.astype(dtype)
        outputs = {t: bits(compile_graph(graph, payload, dtype, threads=t)(x)) for t in (1, 2, 3)}
        assert outputs[1] == outputs[2] == outputs[3]


def single_row_graphs(rng: np.random.Generator) -> list[tuple[str, Payload, np.ndarray]]:
    """Batch-1 graphs whose computed nodes have enough work to be split into parts: an
    im2col convolution (K blocked: 576 > CONV_KC, an output plane not of whole vectors), a
    depthwise one, strided convolutions (the last to 7x7 planes), linear layers (packed in
    f32; f64's payload is over BAKE_LIMIT, a runtime payload: dot tiles; few columns: dot
    tiles on AVX-512), pooling and elementwise maps."""
    dw = "groups = 64, in_channels = 64, out_channels = 64"
    convs = f"""tl.graph @c {{
  %0 = input : [1, 64, 40, 40]
  %1 = conv(%0) {conv_fields(64, 64)} : [1, 64, 40, 40]
  %2 = relu(%1) : [1, 64, 40, 40]
  %3 = conv(%2) {{kernel = [3, 3], padding = [1, 1], channel_axis = 1, {dw}}} : [1, 64, 40, 40]
  %4 = conv(%3) {conv_fields(64, 256, 2)} : [1, 256, 20, 20]
  %5 = conv(%4) {conv_fields(256, 256, 3)} : [1, 256, 7, 7]
  %6 = reshape(%5) {{from = [1, 256, 7, 7], to = [1, 12544]}} : [1, 12544]
  %7 = linear(%6) : [1, 256]
  %8 = relu(%7) : [1, 256]
  %9 = linear(%8) : [1, 10]
  output %9
}}
"""
    payload = Payload()
    for node, (cin, cout) in {1: (64, 64), 4: (64, 256), 5: (256, 256)}.items():
        payload.records[node] = {"weight": rng.normal(size=(cout, cin, 3, 3)) / np.sqrt(9 * cin),
                                 "bias": rng.normal(size=cout) * 0.1}  # fmt: skip
    payload.records[3] = {"weight": rng.normal(size=(64, 1, 3, 3)) / 3}
    for node, (n_in, n_out) in {7: (12544, 256), 9: (256, 10)}.items():
        payload.records[node] = {"weight": rng.normal(size=(n_out, n_in)) / np.sqrt(n_in)}
    few = "tl.graph @f {\n  %0 = input : [1, 4096]\n  %1 = linear(%0) : [1, 150]\n" \
        "  %2 = relu(%1) : [1, 150]\n  output %2\n}\n"  # fmt: skip
    maps = """tl.graph @m {
  %0 = input : [1, 64, 160, 160]
  %1 = exp(%0) : [1, 64, 160, 160]
  %2 = max_pool(%1) {kernel = [2, 2]} : [1, 64, 80, 80]
  %3 = avg_pool(%1) {kernel = [2, 2]} : [1, 64, 80, 80]
  %4 = add(%2, %3) : [1, 64, 80, 80]
  output %4
}
"""
    return [(convs, payload, rng.normal(size=(1, 64, 40, 40))),
            (maps, Payload(), rng.normal(size=(1, 64, 160, 160))),
            (few, Payload({1: {"weight": rng.normal(size=(150, 4096)) / 64}}),
             rng.normal(size=(1, 4096)))]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_single_row_layers_are_split_over_threads(dtype: type) -> None:
    """At batch 1 a layer's call is split into parts (output column blocks and channel tiles
    of a convolution, column panels of a linear, planes of a pooling, element blocks of a
    map) fixed at compile time: every thread count gives the same bits, and the reference's
    values (contractions: the op records' summation-order tolerance)."""
    rng = np.random.default_rng(8)
    graphs = single_row_graphs(rng)
    convs = graphs[0][0]
    for text, payload, x in graphs:
        graph = graph_of(text)
        plan = build_graph_module(graph, payload, dtype).plan
        assert plan is not None
        # Every computed node is split but, in the conv graph, the head (%9: 256 -> 10, too
        # little work); %5 (256 planes split into 9 stride phases, each part staging the rows
        # it reads) only in 2 parts, as more would repeat more than DUPLICATE_SHARE of its
        # product in copies.
        whole = {9} if text == convs else set()
        parts = {p.node.id: p.parts for p in plan.nodes if not p.view and p.rows is None}
        assert len(parts) == sum(not p.view for p in plan.nodes), "no row tasks at batch 1"
        assert all((n in whole) == (count == 1) for n, count in parts.items()), parts
        assert text != convs or parts[5] == 2, parts
        x = x.astype(dtype)
        outputs = {t: compile_graph(graph, payload, dtype, threads=t)(x) for t in (1, 2, 3)}
        assert bits(outputs[1]) == bits(outputs[2]) == bits(outputs[3])
        expected = interpret(graph, payload, x, dtype).output
        np.testing.assert_allclose(
            outputs[2],
            expected,
            rtol=1e-10 if dtype == np.float64 else 1e-4,
            atol=1e-12 if dtype == np.float64 else 1e-5,
        )


def test_a_split_node_has_one_kernel_function() -> None:
    """A split node's kernel is one function of its parts [part, end): each task calls it
    on its range of parts, a call on one thread over all of them (`Emitter.split_call`),
    with no whole-kernel copy of its own for LLVM to compile again (`-O3` time per function;
    the bits at 1, 2 and 3 threads: test_single_row_layers_are_split_over_threads)."""
    text, payload, _ = single_row_graphs(np.random.default_rng(8))[0]
    module = build_graph_module(graph_of(text), payload, np.float32)
    assert module.plan is not None
    split = {p.node.id for p in module.plan.nodes if p.parts > 1}
    kernels = re.findall(r'^define internal i32 @"tlc_c\.n(\d+)(\.\d+)?"\(', module.ir, re.M)
    assert len(split) >= 5 and split <= {int(node) for node, _ in kernels}, (split, kernels)
    assert not [node for node, copy in kernels if copy], kernels


def test_part_counts_balance_two_threads() -> None:
    """A split takes the part count two threads (then three, then four) finish soonest, the
    most parts among equals: parts are equal shares in whole units, so 8 units in 7 parts
    would leave one thread 5 of them (in 5 parts, shares of 1 and 2 units, two threads take
    4 each and three at most 3). A count that balances is kept as it is (the plan balances
    the count a convolution's split gives again), and a convolution takes it of the counts
    its copies allow."""
    from tlc.codegen.lower.convolution import MAX_PARTS, _split
    from tlc.codegen.lower.rules import balanced_parts

    assert [balanced_parts(8, most) for most in range(1, 9)] == [1, 2, 2, 4, 5, 5, 5, 8]
    assert [balanced_parts(n, TASKS) for n in range(1, TASKS + 1)] == list(range(1, TASKS + 1))
    assert balanced_parts(12, 8) == 6 and balanced_parts(16, 8) == 8
    assert balanced_parts(100, 1) == 1 and balanced_parts(0, 8) == 1
    assert MAX_PARTS == TASKS  # the counts a convolution balances are the counts that run
    up_to = {p: (lambda n, p=p: 0.0 if n <= p else float("inf")) for p in range(1, 9)}
    assert _split(8, up_to[7], 1) == 5
    assert _split(8, up_to[8], 1) == 8


def one_conv(x: tuple[int, ...], cout: int, fields: str, rng: np.random.Generator
             ) -> tuple[ops.GraphOp, Payload]:  # fmt: skip
    """A graph of one convolution of `x` to `cout` channels, its weights drawn from `rng`."""
    cin, kernel = x[1], [int(e) for e in fields.split("]")[0].split("[")[1].split(",")]
    axes = ", ".join(["channel_axis = 1", f"in_channels = {cin}", f"out_channels = {cout}"])
    text = f"""tl.graph @s {{
  %0 = input : {list(x)}
  %1 = conv(%0) {{{fields}, {axes}}} : OUT
  output %1
}}
"""
    graph = checked_graph(tlc.parse(text.replace(" : OUT", "")))
    text = text.replace("OUT", str(list(graph.nodes[1].infer([x]))))
    payload = Payload()
    payload.records[1] = {"weight": rng.normal(size=(cout, cin, *kernel)) / np.sqrt(cin * 9),
                          "bias": rng.normal(size=cout) * 0.1}  # fmt: skip
    return checked_graph(tlc.parse(text)), payload


#: `tlc_rt_parallel_parts`'s C type, and its task's.
PARALLEL_PARTS = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_int32)  # fmt: skip
PARTS_TASK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int64)  # fmt: skip
#: The calls a thread makes over its range [lo, hi) of a parts region.
Schedule = Callable[[int, int], list[tuple[int, int]]]


def halves(lo: int, hi: int) -> list[tuple[int, int]]:
    """The runtime's schedule when no thread takes from another: the owner takes half of what
    is left of its range (rounded up) at a time."""
    taken = []
    while lo < hi:
        n = (hi - lo + 1) // 2
        taken.append((lo, lo + n))
        lo += n
    return taken


def singles_backwards(lo: int, hi: int) -> list[tuple[int, int]]:
    """Each part alone, the last first: what other threads taking from a range's end give at
    the most."""
    return [(part, part + 1) for part in reversed(range(lo, hi))]


def task_shares(monkeypatch: pytest.MonkeyPatch, graph: ops.GraphOp, payload: Payload,
                x: np.ndarray, threads: int, schedule: Schedule = halves
                ) -> tuple[list[int], np.ndarray]:  # fmt: skip
    """Run the graph of `one_conv` at `threads` through a `tlc_rt_parallel_parts` that runs
    each thread's range of a region's parts (thread t's: [t parts / n, (t + 1) parts / n) of
    n = min(threads, parts)) in turn on the calling thread, in the calls of `schedule`: the
    output elements each thread's range wrote, and the output."""
    shares: list[int] = []

    def region(out: np.ndarray) -> Callable[[int, int, int, int], int]:
        def parallel_parts(task: int, ctx: int, parts: int, wanted: int) -> int:
            assert wanted == threads
            n = min(threads, parts)
            for t in range(n):
                before = np.isnan(out).sum()
                for first, end in schedule(t * parts // n, (t + 1) * parts // n):
                    assert PARTS_TASK(task)(ctx, first, end, 0) == 0
                shares.append(int(before - np.isnan(out).sum()))
            return 0

        return parallel_parts

    return shares, hooked_run(monkeypatch, graph, payload, x, threads, region)


def hooked_run(monkeypatch: pytest.MonkeyPatch, graph: ops.GraphOp, payload: Payload,
               x: np.ndarray, threads: int,
               region: Callable[[np.ndarray], Callable[[int, int, int, int], int]]
               ) -> np.ndarray:  # fmt: skip
    """The output of the graph of `one_conv` (NaN before the call) compiled for `threads`,
    run with `region(out)` as its `tlc_rt_parallel_parts`."""
    out = np.empty(tuple(graph.nodes[1].infer([x.shape])), x.dtype)
    hook = PARALLEL_PARTS(region(out))
    symbols = dict(runtime.helper_symbols())
    symbols["tlc_rt_parallel_parts"] = ctypes.cast(hook, ctypes.c_void_p).value
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    monkeypatch.setattr(jit, "helper_symbols", lambda: symbols)
    compiled = compile_graph(graph, payload, x.dtype.type, threads=threads)
    out[...] = np.nan
    compiled(x, out=out)
    return out


def test_nodes_from_part_work_on_are_split() -> None:
    """A single call is split into parts from `PART_WORK` on, half the work a row region
    needs (`PARALLEL_WORK`): at two threads its region is two tasks, which pays for
    mobilenet_v2's depthwise 960 channels on 7 x 7 (0.85 Mflop) and resnet18's classifier
    (512 -> 1000: 1 Mflop, 2 MB of weights); a node under it is one call. The bits are the
    same at 1, 2 and 3 threads."""
    from tlc.codegen.plan import PART_WORK, work

    rng = np.random.default_rng(9)
    dw = "groups = 960, in_channels = 960, out_channels = 960"
    text = f"""tl.graph @w {{
  %0 = input : [1, 960, 7, 7]
  %1 = conv(%0) {{kernel = [3, 3], padding = [1, 1], channel_axis = 1, {dw}}} : [1, 960, 7, 7]
  %2 = avg_pool(%1) {{kernel = [7, 7]}} : [1, 960, 1, 1]
  %3 = reshape(%2) {{from = [1, 960, 1, 1], to = [1, 960]}} : [1, 960]
  %4 = linear(%3) : [1, 500]
  %5 = linear(%4) : [1, 10]
  output %5
}}
"""
    graph = graph_of(text)
    payload = Payload({1: {"weight": rng.normal(size=(960, 1, 3, 3)) / 3},
                       4: {"weight": rng.normal(size=(500, 960)) / 31},
                       5: {"weight": rng.normal(size=(10, 500)) / 22}})  # fmt: skip
    plan = build_graph_module(graph, payload, np.float32).plan
    assert plan is not None
    for n in (1, 4, 5):
        p, node = plan.nodes[n], graph.nodes[n]
        amount = work(node, [plan.nodes[q].shape for q in node.parent_ids()], p.shape)
        assert (amount >= PART_WORK) == (p.parts > 1), (n, amount, p.parts)
        assert (n in (1, 4)) == (PART_WORK <= amount < PARALLEL_WORK), (n, amount)
    x = rng.normal(size=(1, 960, 7, 7)).astype(np.float32)
    outputs = {t: bits(compile_graph(graph, payload, np.float32, threads=t)(x)) for t in (1, 2, 3)}
    assert outputs[1] == outputs[2] == outputs[3]


@pytest.mark.parametrize(
    ("x", "cout", "fields"),
    [((1, 512, 13, 13), 1000, "kernel = [1, 1]"),
     ((1, 320, 7, 7), 1280, "kernel = [1, 1]"),
     ((1, 64, 56, 56), 64, "kernel = [3, 3], padding = [1, 1]"),
     ((1, 128, 56, 56), 128, "kernel = [3, 3], stride = [2, 2], padding = [1, 1]")],
)  # fmt: skip
def test_threads_take_balanced_ranges_of_parts(
    monkeypatch: pytest.MonkeyPatch, x: tuple[int, ...], cout: int, fields: str
) -> None:
    """A split node's region is `tlc_rt_parallel_parts` over its parts: each thread starts on
    a range of consecutive parts (staged rows and packed blocks shared by neighbouring parts
    are copied once per call), and each range holds about an equal share of the output: C =
    W patches splits its units by work, not by count (`_unit_starts`: squeezenet1_0's 512 ->
    1000 on 13 x 13, a block of 128 columns and one of 41, split by count gave one thread 3x
    the other's), and a path with fewer parts than the call spreads them over the call's
    (`_own_parts`: 320 -> 1280 on 7 x 7 as C^T, 4 parts in 6, had been 3 in one thread's
    range and 1 in the other's). The bits are the same at every count, whether each range
    runs in the owner's halves or part by part from its end (as when other threads take
    from it)."""
    graph, payload = one_conv(x, cout, fields, np.random.default_rng(3))
    parts = build_graph_module(graph, payload, np.float32).plan.nodes[1].parts
    assert parts in (6, 8), parts
    inputs = np.random.default_rng(4).normal(size=x).astype(np.float32)
    outputs = {}
    for threads, schedule in [(t, halves) for t in (1, 2, 3, 4)] + [(2, singles_backwards)]:
        shares, out = task_shares(monkeypatch, graph, payload, inputs, threads, schedule)
        outputs[threads, schedule] = out
        if threads == 1:  # one call over every part, no region
            assert shares == []
            continue
        assert sum(shares) == out.size and not np.isnan(out).any()
        assert len(shares) == threads, shares
        if threads == 2:  # (3 and 4 threads: as balanced as the path's parts allow)
            assert max(shares) <= 1.25 * out.size / threads, shares
    assert len({bits(v) for v in outputs.values()}) == 1


def part_writes(monkeypatch: pytest.MonkeyPatch, graph: ops.GraphOp, payload: Payload,
                x: np.ndarray) -> list[np.ndarray]:  # fmt: skip
    """Run the graph of `one_conv` at two threads through a `tlc_rt_parallel_parts` that runs
    each part of a region alone, in order, on the calling thread: per part, the mask of the
    output elements it wrote."""
    masks: list[np.ndarray] = []

    def region(out: np.ndarray) -> Callable[[int, int, int, int], int]:
        def parallel_parts(task: int, ctx: int, parts: int, wanted: int) -> int:
            for part in range(parts):
                before = np.isnan(out)
                assert PARTS_TASK(task)(ctx, part, part + 1, 0) == 0
                masks.append(before & ~np.isnan(out))
            return 0

        return parallel_parts

    hooked_run(monkeypatch, graph, payload, x, 2, region)
    return masks


@pytest.mark.parametrize(
    ("x", "cout", "by_columns"),
    [((1, 96, 54, 54), 16, True), ((1, 128, 54, 54), 32, True), ((1, 256, 27, 27), 32, True),
     ((1, 384, 27, 27), 48, True), ((1, 16, 54, 54), 64, False), ((1, 512, 13, 13), 48, False)],
)  # fmt: skip
def test_thin_1x1_layers_split_by_columns(
    monkeypatch: pytest.MonkeyPatch, x: tuple[int, ...], cout: int, by_columns: bool
) -> None:
    """A 1x1 convolution read in place with fewer than MAX_PARTS tiles of 8 output channels
    and at least MAX_PARTS panels of MAX_PANEL columns splits into runs of whole panels of
    columns, every output channel in each part (`convolution._column_parts`):
    squeezenet1_0's squeezes to 16, 32 and 48 channels split into 6 parts, not 2, 4 and 6
    tiles of output channels (2 left no part to take from a thread that lost its core), and
    each part reads only its columns of the input. Its parts are consecutive runs of columns
    covering the plane once, the two threads' ranges about equal; 64 channels (8 tiles) and
    a 13 x 13 plane (169 columns) keep their tiles of channels.
    The bits are the same at 1-4 threads, whether each range runs in halves or part by part
    from its end, and match the reference (f32 summation order: the op records'
    tolerance)."""
    from tlc.codegen.lower.convolution import MAX_PARTS

    graph, payload = one_conv(x, cout, "kernel = [1, 1]", np.random.default_rng(6))
    parts = build_graph_module(graph, payload, np.float32).plan.nodes[1].parts
    inputs = np.random.default_rng(7).normal(size=x).astype(np.float32)
    masks = part_writes(monkeypatch, graph, payload, inputs)
    assert len(masks) == parts and sum(int(m.sum()) for m in masks) == np.prod(masks[0].shape)
    planes = [m.reshape(cout, -1) for m in masks]
    whole = [bool((p == p[:1]).all()) for p in planes]  # every channel over the same columns
    assert all(whole) == by_columns and (parts >= MAX_PARTS * 3 // 4 or not by_columns), whole
    if by_columns:
        columns = [np.flatnonzero(p[0]) for p in planes]
        runs = np.concatenate(columns)
        assert (runs == np.arange(x[2] * x[3])).all()  # consecutive runs, in order, once
    outputs = {}
    for threads, schedule in [(t, halves) for t in (1, 2, 3, 4)] + [(2, singles_backwards)]:
        shares, outputs[threads, schedule] = task_shares(monkeypatch, graph, payload, inputs,
                                                         threads, schedule)  # fmt: skip
        if threads == 2:
            assert max(shares) <= 1.25 * outputs[threads, schedule].size / 2, shares
    assert len({bits(v) for v in outputs.values()}) == 1
    expected = interpret(graph, payload, inputs, np.float32).output
    np.testing.assert_allclose(outputs[1, halves], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cpu", ["x86-64-v2", "znver3"])
@pytest.mark.parametrize(("x", "cout"), [((1, 96, 54, 54), 16), ((1, 256, 27, 27), 32)])
def test_thin_1x1_layers_keep_their_bits_on_every_target(
    cpu: str, x: tuple[int, ...], cout: int
) -> None:
    """The split by columns of thin 1x1 layers (`convolution._column_parts`) in AVX2 code, and
    in SSE code, where a 27 x 27 plane (729 columns, not whole vectors of 4) is packed and
    its parts stay tiles of channels: the same bits at 1, 2 and 3 threads, close to the
    reference (the op records' tolerance)."""
    pointwise_on_threads(x, cout, runnable(cpu), seed=8)


def pointwise_on_threads(x: tuple[int, ...], cout: int, target: Target, seed: int) -> None:
    """A 1x1 convolution of x to `cout` channels (weights from `seed`, inputs from seed + 1)
    compiled for `target`: the same bits at 1, 2 and 3 threads, close to the reference (the
    op records' tolerance)."""
    graph, payload = one_conv(x, cout, "kernel = [1, 1]", np.random.default_rng(seed))
    inputs = np.random.default_rng(seed + 1).normal(size=x).astype(np.float32)
    outputs = {t: compile_graph(graph, payload, np.float32, target=target, threads=t)(inputs)
               for t in (1, 2, 3)}  # fmt: skip
    assert bits(outputs[1]) == bits(outputs[2]) == bits(outputs[3])
    expected = interpret(graph, payload, inputs, np.float32).output
    np.testing.assert_allclose(outputs[2], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cpu", ["znver3", "x86-64-v3"])
def test_avx2_runs_deep_1x1_layers_as_c_transposed(cpu: str) -> None:
    """In AVX2 code a 1x1 layer read in place whose C = W patches would read more than
    `DEEP_BYTES` of input planes per panel of columns runs as C^T (`_deep_in_place`), up to
    `DEEP_ROWS` positions and from 2 x `MAX_PANEL` output channels; at those bounds it stays
    C, and AVX-512 and SSE code keep their rules. The C^T layer gives the same bits at 1, 2
    and 3 threads, close to the reference."""
    from tlc.codegen.lower.convolution import ConvFrame, kernel_name
    from tlc.codegen.target import target_info

    def kernel(x: tuple[int, ...], cout: int, target: str) -> str:
        graph, _ = one_conv(x, cout, "kernel = [1, 1]", np.random.default_rng(13))
        node = graph.nodes[1]
        return kernel_name(target_info(Target(target)), 4, ConvFrame.of(node, x, node.infer([x])))

    deep = [((1, 384, 14, 14), 128), ((1, 1024, 28, 28), 128)]  # planes of 784 and 3136 bytes
    shallow = [((1, 256, 14, 14), 128), ((1, 512, 28, 28), 128),  # 32 KiB: not over
               ((1, 384, 14, 14), 64), ((1, 1024, 33, 33), 128)]  # fmt: skip
    assert all(kernel(x, cout, cpu).startswith("C^T") for x, cout in deep)
    assert all(kernel(x, cout, cpu).startswith("C ") for x, cout in shallow)
    assert all(kernel(x, cout, other).startswith("C ")
               for x, cout in deep for other in ("znver4", "x86-64-v2"))  # fmt: skip
    pointwise_on_threads((1, 384, 14, 14), 128, runnable(cpu), seed=14)


def test_tiles_of_consecutive_rows() -> None:
    """`_tiles_consecutive`: each tile of MR rows (from row 0, the last shorter) starts its
    patches at consecutive elements, whatever jump lies between tiles."""
    from tlc.codegen.lower.convolution import _tiles_consecutive

    two_images = np.r_[np.arange(6), 100 + np.arange(6)]
    assert _tiles_consecutive(np.arange(12), 5)
    assert _tiles_consecutive(two_images, 3) and _tiles_consecutive(two_images, 6)
    assert not _tiles_consecutive(two_images, 4)  # rows 4-7 hold 4, 5, 100, 101
    assert not _tiles_consecutive(np.array([0, 1, 2, 5, 6, 7]), 2)  # a padded row's end


def test_avx2_packs_a_1x1_c_transposed_by_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """In AVX2 code a 1x1 C^T over one image (squeezenet1_0's classifier) packs its rows of
    patches (`_rows_in_place` false) a tile's step at a time (`consecutive`); so does a 3x3
    C^T whose tiles (5 x 16) are the output's rows (5 x 5), but on 7 x 7 a tile's rows jump
    at the end of a padded row, and it packs element by element."""
    from tlc.codegen import gemm
    from tlc.codegen.lower import convolution

    calls: list[tuple[bool, bool]] = []
    packed_linear = gemm.emit_packed_linear

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append((kwargs["in_place"], kwargs["consecutive"]))
        return packed_linear(*args, **kwargs)

    monkeypatch.setattr(convolution, "emit_packed_linear", spy)
    window = "kernel = [3, 3], padding = [1, 1]"
    layers = [((1, 512, 13, 13), 1000, "kernel = [1, 1]"), ((1, 16, 5, 5), 300, window),
              ((1, 16, 7, 7), 300, window)]  # fmt: skip
    for x, cout, fields in layers:
        graph, payload = one_conv(x, cout, fields, np.random.default_rng(12))
        build_graph_module(graph, payload, np.float32, bound_payload=True, target=Target("znver3"))
    assert calls == [(False, True), (False, True), (False, False)]


@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
@pytest.mark.parametrize(
    ("x", "cout", "stride"),
    [((1, 512, 13, 13), 1000, 1), ((3, 300, 5, 5), 1000, 1), ((1, 64, 5, 5), 238, 1),
     ((2, 64, 10, 10), 238, 2)],
)  # fmt: skip
def test_c_transposed_1x1_reads_its_rows_in_place_or_packed(
    monkeypatch: pytest.MonkeyPatch, cpu: str, x: tuple[int, ...], cout: int, stride: int
) -> None:
    """A 1x1 convolution computed as C^T broadcasts its rows of patches from the planes it
    reads in place (`convolution._rows_in_place`: the input, or a stride-2 layer's staged
    phase 0) in AVX-512 and SSE code, so its parts repeat no packing, and from rows packed
    per call in AVX2 code; it writes its product out transposed in blocks of vectors
    (`_write_transposed`): squeezenet1_0's classifier, 3 images of 5 x 5 (tiles of rows
    across two images), 64 -> 238 on 5 x 5, and with stride 2 over 2 images (over both
    images C^T on AVX-512 and AVX2 only); plane sizes and channel counts that are not whole
    vectors (the last block of positions and of channels under masks). The bits are those of
    the other way of reading the rows with one element written at a time, the same at 1, 2
    and 3 threads, and close to the reference (the op records' tolerance)."""
    from tlc.codegen.lower import convolution
    from tlc.codegen.lower.convolution import ConvFrame, _transposed_mk, _write_transposed
    from tlc.codegen.target import target_info

    target = runnable(cpu)
    info = target_info(target)
    fields = f"kernel = [1, 1], stride = [{stride}, {stride}]"
    graph, payload = one_conv(x, cout, fields, np.random.default_rng(10))
    node = graph.nodes[1]
    frame = ConvFrame.of(node, x, node.infer([x]))
    transposed = _transposed_mk(info, 4, frame) is not None
    assert transposed == (stride == 1 or cpu != "x86-64-v2")
    in_place = convolution._rows_in_place(info, frame)
    assert in_place == (cpu == "x86-64-v2" or info.vector_bytes == 64)
    inputs = np.random.default_rng(11).normal(size=x).astype(np.float32)
    outputs = {t: compile_graph(graph, payload, np.float32, target=target, threads=t)(inputs)
               for t in (1, 2, 3)}  # fmt: skip
    assert bits(outputs[1]) == bits(outputs[2]) == bits(outputs[3])

    def one_at_a_time(k, f, product, out, channels, lanes, stage, fn) -> None:  # noqa: ANN001
        _write_transposed(k, f, product, out, channels, 1, stage, fn)

    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the patched rules are in no cache key
    monkeypatch.setattr(convolution, "_rows_in_place", lambda info, f: not in_place)
    monkeypatch.setattr(convolution, "_write_transposed", one_at_a_time)
    other = compile_graph(graph, payload, np.float32, target=target, threads=2)(inputs)
    assert bits(other) == bits(outputs[1])
    expected = interpret(graph, payload, inputs, np.float32).output
    np.testing.assert_allclose(outputs[2], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
def test_whole_vector_rows_split_counting_no_packed_block(
    monkeypatch: pytest.MonkeyPatch, cpu: str
) -> None:
    """A convolution whose output rows are whole vectors on every target
    (`convolution.WHOLE_ROWS`) packs no block, so its parts' shared block is no repeated copy
    (`_product_parts`): bench/run.py's CNN's first layer, 3 -> 16 3x3 on 32 x 32, was one part
    (its 27 x 1024 block counted as re-packed by each) and is two, a tile of 8 channels each.
    Each part writes its own channels once; the bits are the same at 1, 2 and 3 threads,
    whether a range runs in halves or part by part from its end, and on every target close to
    the reference (f32 summation order: the op records' tolerance)."""
    from tlc.codegen.lower import convolution

    graph, payload = one_conv((1, 3, 32, 32), 16, "kernel = [3, 3], padding = [1, 1]",
                              np.random.default_rng(10))  # fmt: skip
    inputs = np.random.default_rng(11).normal(size=(1, 3, 32, 32)).astype(np.float32)
    expected = interpret(graph, payload, inputs, np.float32).output
    if cpu != "host":
        target = runnable(cpu)
        outputs = [compile_graph(graph, payload, np.float32, target=target, threads=t)(inputs)
                   for t in (1, 2, 3)]  # fmt: skip
        assert len({bits(v) for v in outputs}) == 1
        np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-5)
        return
    assert build_graph_module(graph, payload, np.float32).plan.nodes[1].parts == 2
    masks = part_writes(monkeypatch, graph, payload, inputs)
    assert len(masks) == 2 and (masks[0] ^ masks[1]).all()
    assert masks[0][0, :8].all() and masks[1][0, 8:].all()
    outputs = [task_shares(monkeypatch, graph, payload, inputs, threads, schedule)[1]
               for threads, schedule in [(1, halves), (2, halves), (3, halves),
                                         (2, singles_backwards)]]  # fmt: skip
    assert len({bits(v) for v in outputs}) == 1
    np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(convolution, "WHOLE_ROWS", 1 << 30)  # counted as re-packed: one part
    assert build_graph_module(graph, payload, np.float32).plan.nodes[1].parts == 1


@pytest.mark.parametrize(
    ("x", "fields", "cout"),
    [((1, 64, 56, 56), "kernel = [3, 3], stride = [2, 2], padding = [1, 1]", 512),
     ((1, 3, 112, 112), "kernel = [7, 7], stride = [2, 2], padding = [3, 3]", 64),
     ((1, 32, 40, 37), "kernel = [3, 3], padding = [2, 2], dilation = [2, 2]", 64),
     ((1, 32, 91, 80), "kernel = [3, 3], stride = [3, 3], padding = [1, 1]", 512),
     ((1, 32, 64, 32), "kernel = [3, 3], padding = [1, 1]", 64),
     ((1, 16, 12, 20, 20), "kernel = [3, 3, 3], padding = [1, 1, 1]", 32),
     ((1, 128, 28, 28), "kernel = [3, 3], stride = [2, 2], padding = [1, 1]", 256)],
)  # fmt: skip
def test_split_convolutions_stage_only_their_rows(
    x: tuple[int, ...], fields: str, cout: int
) -> None:
    """A part of a split padded or strided convolution stages only the input rows its output
    rows read (`ConvFrame.stage_rows`): every part's rows must cover what its output rows'
    taps reach, for strides of 2 and 3, a 7x7 stem, a dilation, 32-wide rows (tiles load the
    staged planes directly), a 3-d convolution (split along its first spatial axis); and one
    whose 196 positions may run as C^T (on AVX-512), which packs the rows of patches in every
    part: its C^T kernel computes on its own parts, spread over the call's, the others
    are empty. The bits are the same at every thread count and match the reference (f32
    summation order: the op records' tolerance)."""
    rng = np.random.default_rng(5)
    graph, payload = one_conv(x, cout, fields, rng)
    plan = build_graph_module(graph, payload, np.float32).plan
    assert plan is not None and plan.nodes[1].parts >= 2, plan.nodes[1].parts
    inputs = rng.normal(size=x).astype(np.float32)
    outputs = {t: compile_graph(graph, payload, np.float32, threads=t)(inputs) for t in (1, 2, 3)}
    assert bits(outputs[1]) == bits(outputs[2]) == bits(outputs[3])
    expected = interpret(graph, payload, inputs, np.float32).output
    np.testing.assert_allclose(outputs[2], expected, rtol=1e-4, atol=1e-5)


@needs_cc
def test_library_threads_and_concurrent_callers(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    text, payload = residual_cnn(8, rng)
    graph = graph_of(text)
    built = build_library([(graph, payload)], str(tmp_path / "libres.so"), np.float32)
    assert "int tlc_set_num_threads(int n);" in Path(built.header).read_text()
    xs = [rng.normal(size=(8, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    results = {}
    for t in (1, 2, 3):
        lib = tlc.load(built.library, threads=t)
        assert lib.num_threads == t
        results[t] = [bits(lib(x)) for x in xs]
    assert results[1] == results[2] == results[3]
    # Calls from several threads at once: each takes its own workspace, and a region started
    # while another runs goes on its caller alone; the results are the same bytes.
    lib = tlc.load(built.library, threads=2)
    got: dict[int, list[bytes]] = {}

    def work(i: int) -> None:
        got[i] = [bits(lib(xs[(i + j) % 4])) for j in range(8)]

    callers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    for i in range(4):
        assert got[i] == [results[1][(i + j) % 4] for j in range(8)]
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        lib.set_num_threads(0)


@needs_cc
def test_the_pool_runs_every_task_once(tmp_path: Path) -> None:
    """tests/c/pool_stress.c against the runtime: thousands of regions of 1-64 tasks on 1-4
    threads, from one caller and then four at once: every task runs exactly once on a worker
    id below the thread count, and a region returns its lowest failing task's status; the
    same for parts regions (`tlc_rt_parallel_parts`: every part in exactly one range, parts
    of uneven cost so that threads take from each other's ranges). (Workers
    join a region only while it is open, so one waking late must not run a task twice or run
    the next region's with this one's context.)"""
    driver = Path(__file__).parent / "c" / "pool_stress.c"
    exe = tmp_path / "pool_stress"
    subprocess.run([runtime.c_compiler(), *runtime.CFLAGS, "-o", str(exe), str(driver),
                    runtime.SOURCE], check=True)  # fmt: skip
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, "ok\n")


def test_small_graphs_do_not_call_the_runtime() -> None:
    """A small workspace is a stack array and nothing is split: the code needs no helper."""
    seed = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text(encoding="utf-8")
    module = tlc.parse(seed)
    ir = build_graph_module(checked_graph(module), payload_from_module(module, "mlp")).ir
    assert "tlc_rt_" not in ir
    text, payload = wide_mlp(64, np.random.default_rng(6))
    ir = build_graph_module(graph_of(text), payload, np.float32).ir
    assert all(f"tlc_rt_{name}" in ir for name in ("parallel", "acquire", "release"))


def test_threads_must_be_positive() -> None:
    text, payload = wide_mlp(2, np.random.default_rng(4))
    with pytest.raises(tlc.DiagnosticError, match="threads must be at least 1, got 0"):
        tlc.compile(text, payload, dtype="f32", threads=0)


PER_EXAMPLE = """
tl.graph @m {
  %0 = input : [32]
  %1 = linear(%0) : [64]
  %2 = relu(%1) : [64]
  %3 = reshape(%2) {from = [64], to = [8, 8]} : [8, 8]
  %4 = transpose(%3) {axis1 = 0, axis2 = 1} : [8, 8]
  %5 = flatten(%4) {shape = [8, 8]} : [64]
  %6 = linear(%5) : [10]
  %7 = softmax(%6) {axis = 0} : [10]
  output %7
}
"""


def per_example_payload(rng: np.random.Generator) -> Payload:
    return Payload({1: {"weight": rng.normal(size=(64, 32)), "bias": rng.normal(size=64)},
                    6: {"weight": rng.normal(size=(10, 64)) * 0.3}})  # fmt: skip


@pytest.mark.parametrize("n", [1, 3, 256, 4096])
def test_batch_runs_the_kernels_over_the_batch(n: int) -> None:
    rng = np.random.default_rng(5)
    graph, payload = graph_of(PER_EXAMPLE), per_example_payload(rng)
    plan = build_graph_module(graph, payload, np.float64, batch=n).plan
    assert plan is not None
    linear = plan.nodes[1]
    if n * 2 * 64 * 32 < PARALLEL_WORK:  # one matrix product of M = n rows
        assert linear.rows is None and linear.kernel.arg_shapes == ((n, 32),)
    else:  # the same product in fixed row chunks, for threads
        assert linear.rows.full.arg_shapes == ((-(-n // 8), 32),) and linear.rows.tasks == 8
    # transpose has no batch form: its single-example kernel runs once per row, as tasks.
    transpose = plan.nodes[4]
    if n == 1:
        assert transpose.rows is None and transpose.kernel.out_shape == (8, 8)
    else:
        assert transpose.rows.chunk == 1 and transpose.rows.full.out_shape == (8, 8)
    # softmax's axis moves past the batch axis.
    assert plan.nodes[7].kernel.node.meta("axis") == 1 or plan.nodes[7].rows is not None
    x = rng.normal(size=(n, 32))
    single = compile_graph(graph, payload, np.float64)
    expected = np.stack([single(row) for row in x])
    got = {t: compile_graph(graph, payload, np.float64, batch=n, threads=t)(x) for t in (1, 2)}
    assert bits(got[1]) == bits(got[2])
    np.testing.assert_allclose(got[1], expected, rtol=1e-12, atol=1e-15)


def test_batch_of_a_graph_with_constants() -> None:
    """Values that do not depend on the input are computed once, without the batch axis."""
    text = """
tl.graph @c {
  %0 = input : [3]
  %1 = const : [3]
  %2 = exp(%1) : [3]
  %3 = add(%0, %2) : [3]
  output %3
}
tl.payload @c {
  %1 = const {value = [1.0, 2.0, 3.0]}
}
"""
    f = tlc.compile(text, dtype="f64", batch=4, threads=2)
    x = np.arange(12.0).reshape(4, 3)
    np.testing.assert_allclose(f(x), x + np.exp([1.0, 2.0, 3.0]), rtol=1e-15)
    only = """
tl.graph @k {
  %0 = input : [2]
  %1 = const : [2]
  %2 = exp(%1) : [2]
  output %2
}
tl.payload @k {
  %1 = const {value = [0.0, 1.0]}
}
"""
    np.testing.assert_allclose(tlc.compile(only, dtype="f64", batch=3)(np.zeros((3, 2))),
                               np.tile(np.exp([0.0, 1.0]), (3, 1)), rtol=1e-15)  # fmt: skip


@needs_cc
def test_workspace_blocks_are_reused() -> None:
    lib = runtime.helper()
    acquire, release = lib.tlc_rt_acquire, lib.tlc_rt_release
    acquire.restype, acquire.argtypes = ctypes.c_void_p, [ctypes.c_int64]
    release.argtypes = [ctypes.c_void_p]
    first = acquire(1 << 20)
    assert first % 64 == 0
    release(first)
    assert acquire(1000) == first  # the cached block serves a smaller request
    second = acquire(1000)  # while the first is taken, another block
    assert second != first
    release(first)
    release(second)


def test_the_runtime_cache_must_be_private(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "tlc").mkdir(mode=0o777)
    os.chmod(shared / "tlc", 0o777)  # the umask may have cleared bits
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    assert runtime.cache_dir() is None  # others can write it: never loaded from
    private = tmp_path / "private"
    monkeypatch.setenv("XDG_CACHE_HOME", str(private))
    path = runtime.cache_dir()
    assert path is not None and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    planted = Path(path) / "libtlcrt-x.so"
    planted.write_bytes(b"not a library")
    os.chmod(planted, 0o666)
    assert not runtime.own_file(str(planted))  # writable by others: rebuilt, not loaded
    os.chmod(planted, 0o644)
    assert runtime.own_file(str(planted))


ZERO_SIZE = {
    "sum of nothing is 0": ("%1 = sum(%0) : []", "[0]", None),
    "mse_loss of nothing is NaN": ("%1 = mse_loss(%0, %0) : []", "[0]", None),
    "linear of no features is the bias": (
        "%1 = linear(%0) : [3]", "[0]",
        "%1 = linear {weight = [[], [], []], bias = [1.0, 2.0, 3.0]}",
    ),
    "linear of no rows": (
        "%1 = linear(%0) : [0, 2]", "[0, 3]",
        "%1 = linear {weight = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}",
    ),
    "relu of no rows": ("%1 = relu(%0) : [0, 4]", "[0, 4]", None),
    "max_pool of no planes": ("%1 = max_pool(%0) {kernel = [2]} : [0, 3]", "[0, 6]", None),
    "avg_pool of no planes": ("%1 = avg_pool(%0) {kernel = [3]} : [0, 2]", "[0, 6]", None),
    "concat of no rows": ("%1 = relu(%0) : [0, 3]\n  %2 = exp(%0) : [0, 3]\n"
                          "  %3 = concat(%1, %2) {axis = 1} : [0, 6]\n  %4 = relu(%3) : [0, 6]",
                          "[0, 3]", None),
}  # fmt: skip


@pytest.mark.parametrize("case", ZERO_SIZE, ids=list(ZERO_SIZE))
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_zero_size_tensors_match_the_reference(case: str, dtype: str) -> None:
    line, shape, payload = ZERO_SIZE[case]
    last = line.split("\n")[-1].split("=")[0].strip()
    text = f"tl.graph @z {{\n  %0 = input : {shape}\n  {line}\n  output {last}\n}}\n"
    if payload:
        text += f"tl.payload @z {{\n  {payload}\n}}\n"
    dims = tuple(int(d) for d in shape.strip("[]").split(","))
    x = np.zeros(dims, dtype=np.float32 if dtype == "f32" else np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy: "Mean of empty slice"
        expected = tlc.run(text, x, dtype=dtype).output
    got = tlc.compile(text, dtype=dtype)(x)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)  # NaN equals NaN here


EMPTY_POOL = """
tl.graph @p {
  %0 = input : [1, 0, 4]
  %1 = avg_pool(%0) {kernel = [2, 2], stride = [2, 2]} : [1, 0, 2]
  %2 = max_pool(%0) {kernel = [2, 2], stride = [2, 2]} : [1, 0, 2]
  %3 = add(%1, %2) : [1, 0, 2]
  %4 = sum(%3) : []
  output %4
}
"""


def test_gradient_through_an_empty_pool_compiles(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:  # fmt: skip
    from tlc.tools.run import main as run_main

    source, x = tmp_path / "p.tlir", tmp_path / "x.npy"
    source.write_text(EMPTY_POOL)
    np.save(x, np.zeros((1, 0, 4)))
    printed = []
    for backend in ("reference", "llvm"):
        assert run_main([str(source), "--input", str(x), "--grad", "--backend", backend]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] == "output: 0.000000\ngrad input: [[]]\n"


def test_a_failing_task_fails_the_call_with_the_reference_error() -> None:
    text = "tl.graph @l {\n  %0 = input : [64, 20000]\n  %1 = log(%0) : [64, 20000]\n" \
        "  output %1\n}\n"  # fmt: skip
    graph = graph_of(text)
    plan = build_graph_module(graph, None, np.float32).plan
    assert plan is not None and plan.nodes[1].rows.parallel
    x = np.ones((64, 20000), np.float32)
    x[40, 7] = -1.0  # in a task other than the first
    with pytest.raises(EvalError) as reference:
        interpret(graph, None, x, np.float32)
    single = graph_of(text.replace("[64, 20000]", "[20000]"))
    for threads in (1, 2):
        for f in (compile_graph(graph, None, np.float32, threads=threads),
                  compile_graph(single, None, np.float32, batch=64, threads=threads)):  # fmt: skip
            with pytest.raises(EvalError) as failed:
                f(x)
            assert failed.value.diagnostics == reference.value.diagnostics


def test_a_linear_of_few_rows_stays_one_call() -> None:
    """Enough work for threads but fewer rows than one task takes (MATRIX_ROWS)."""
    text = "tl.graph @f {\n  %0 = input : [8, 400]\n  %1 = linear(%0) : [8, 400]\n  output %1\n}\n"
    rng = np.random.default_rng(7)
    payload = Payload({1: {"weight": rng.normal(size=(400, 400))}})
    plan = build_graph_module(graph_of(text), payload, np.float32).plan
    assert plan is not None and plan.nodes[1].rows is None
    assert plan.nodes[1].kernel.out_shape == (8, 400)


def test_a_path_with_fewer_parts_than_the_call_shares_its_units_by_the_call_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mobilenet_v2's 960 -> 160 on 7 x 7 splits into 4 parts, and its C^T path computes on
    3 of them (`_transposed_parts`: 64-column units), spread over the call's. Path part q
    starts at the units of the call's parts before the first one holding it
    (`_part_share`), so at two threads each range holds half the panels, give or take one
    (5 panels of 32 on AVX-512: 2 and 3; they were 1 and 4). The bits are the same at 1-3
    threads."""
    graph, payload = one_conv((1, 960, 7, 7), 160, "kernel = [1, 1]", np.random.default_rng(3))
    assert build_graph_module(graph, payload, np.float32).plan.nodes[1].parts == 4
    inputs = np.random.default_rng(4).normal(size=(1, 960, 7, 7)).astype(np.float32)
    outputs = {}
    for threads in (1, 2, 3):
        shares, outputs[threads] = task_shares(monkeypatch, graph, payload, inputs, threads)
        if threads == 2:
            size = outputs[2].size
            assert sum(shares) == size and max(shares) <= 0.6 * size, shares
    assert len({bits(v) for v in outputs.values()}) == 1
