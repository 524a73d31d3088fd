"""Values a row run computes and only its own nodes read by rows lie task by task
(`plan._task_blocks`): each task's block holds its rows of them, shared by liveness within the
task, instead of every value staying alive to the run's end. The kernels and rows are
unchanged, so the bytes are the same as with one region per value, at any thread count.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_codegen_runtime import conv_fields, graph_of, residual_cnn

from tlc.codegen import jit
from tlc.codegen import plan as codegen_plan
from tlc.codegen.jit import compile_graph
from tlc.codegen.module import build_graph_module
from tlc.core.payload import Payload
from tlc.dialect.shapes import numel
from tlc.semantics.interpret import interpret


def conv_chain(n: int, layers: int, rng: np.random.Generator) -> tuple[str, Payload]:
    """`layers` 3x3 convolutions + relu over n images of 16 channels, 16 x 16: one row run."""
    lines = [f"  %0 = input : [{n}, 16, 16, 16]"]
    payload = Payload()
    for i in range(layers):
        lines += [f"  %{2 * i + 1} = conv(%{2 * i}) {conv_fields(16, 16)}",
                  f"  %{2 * i + 2} = relu(%{2 * i + 1})"]  # fmt: skip
        payload.records[2 * i + 1] = {"weight": rng.normal(size=(16, 16, 3, 3)) / 12,
                                      "bias": rng.normal(size=16)}  # fmt: skip
    body = "\n".join(lines)
    return f"tl.graph @chain {{\n{body}\n  output %{2 * layers}\n}}\n", payload


@pytest.mark.parametrize("name", ["chain", "residual"])
def test_a_runs_values_lie_task_by_task(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The arena of a chain of convolutions over 16 images no longer grows with its length;
    the residual CNN's skips stay alive across blocks. The same bytes at 1, 2, 3 threads."""
    rng = np.random.default_rng(5)
    text, payload = conv_chain(16, 6, rng) if name == "chain" else residual_cnn(16, rng)
    graph = graph_of(text)
    plan = build_graph_module(graph, payload, np.float32).plan
    runs = {p.run for p in plan.nodes if p.run is not None}
    assert runs, "the residual blocks over 16 images are a row run"
    inner = [p for p in plan.nodes if p.run is not None and p.out_stride]
    assert inner, "some of the run's values lie in task blocks"
    for p in inner:  # a task's block is a multiple of its rows, aligned
        assert p.rows is not None and p.out_stride >= p.rows.out_row
        assert p.out_stride * p.rows.chunk * 4 % 64 == 0
    x = np.random.default_rng(6).normal(size=(16, 16 if name == "chain" else 3, 16, 16))
    x = x.astype(np.float32)
    monkeypatch.setattr(jit, "_graph_cache", {})
    blocked = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2, 3)]
    monkeypatch.setattr(codegen_plan, "_task_blocks", lambda *args: ({}, {}))
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the patch is not in the caches' keys
    whole = build_graph_module(graph, payload, np.float32).plan
    assert plan.unshared == whole.unshared
    if name == "chain":  # five values of 16 images alive at once, against two per task
        assert plan.arena * 2 < whole.arena
    want = compile_graph(graph, payload, np.float32, threads=1)(x)
    assert all(got.tobytes() == want.tobytes() for got in blocked)


def fire_net(n: int, rng: np.random.Generator, linear: bool = False) -> tuple[str, Payload]:
    """Two squeezenet fire modules over n images of 16 channels, 24 x 24 (a 1x1 squeeze, 1x1
    and 3x3 expansions of it concatenated along the channels), a max pool between them, a
    1x1 classifier and a global average pool (`linear`: a linear layer instead)."""
    lines, payload = [f"  %0 = input : [{n}, 16, 24, 24]"], Payload()

    def conv(i: int, source: int, cin: int, cout: int, k: int) -> None:
        pad = "" if k == 1 else ", padding = [1, 1]"
        fields = f"kernel = [{k}, {k}]{pad}, channel_axis = 1, in_channels = {cin}"
        lines.append(f"  %{i} = conv(%{source}) {{{fields}, out_channels = {cout}}}")
        lines.append(f"  %{i + 1} = relu(%{i})")
        payload.records[i] = {"weight": rng.normal(size=(cout, cin, k, k)) / np.sqrt(cin * k * k),
                              "bias": rng.normal(size=cout) * 0.1}  # fmt: skip

    for first, source, cin in ((1, 0, 16), (9, 8, 128)):
        conv(first, source, cin, 16, 1)
        conv(first + 2, first + 1, 16, 64, 1)
        conv(first + 4, first + 1, 16, 64, 3)
        lines.append(f"  %{first + 6} = concat(%{first + 3}, %{first + 5}) {{axis = 1}}")
        if first == 1:
            lines.append("  %8 = max_pool(%7) {kernel = [2, 2]}")
    if linear:
        lines += [f"  %16 = reshape(%15) {{from = [{n}, 128, 12, 12], to = [{n}, 18432]}}",
                  f"  %17 = linear(%16) : [{n}, 64]", "  output %17"]  # fmt: skip
        payload.records[17] = {"weight": rng.normal(size=(64, 18432)) / 136}
    else:
        conv(16, 15, 128, 10, 1)
        lines += ["  %18 = avg_pool(%17) {kernel = [12, 12]}", "  output %18"]
    return "tl.graph @fire {\n" + "\n".join(lines) + "\n}\n", payload


def test_a_run_goes_through_fire_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch 16 two fire modules, their pool and the classifier are one row run
    (`plan.row_runs`): a gathered concatenation (its expansions write their slabs, it
    computes nothing) does not stop it, and the squeezes, pools and classifier (by
    themselves in chunks of 2 rows) take one image per task, as the expansions writing their
    slabs do. Each concatenation lies in the run's task blocks, its producers writing a
    block apart. The bits are those of one region per node (chunks of 2, the concatenations
    whole in the arena) at 1, 2 and 3 threads, and near the reference."""
    text, payload = fire_net(16, np.random.default_rng(8))
    graph = graph_of(text)
    plan = build_graph_module(graph, payload, np.float32).plan
    nodes = plan.nodes
    rows = [p for p in nodes if p.rows is not None]
    assert [p.node.id for p in rows] == [1, 3, 5, 8, 9, 11, 13, 16]
    assert {(p.run, p.rows.chunk) for p in rows} == {(1, 1)} and nodes[16].run_end
    assert nodes[18].rows is None  # the global pool: too little work for tasks
    for concat, parts in ((7, (3, 5)), (15, (11, 13))):
        assert nodes[concat].gathered and nodes[concat].run is None
        stride = nodes[concat].out_stride
        assert stride >= 128 * numel(nodes[concat].shape[2:])  # in the task blocks
        assert all(nodes[q].into[0] == concat and nodes[q].out_stride == stride for q in parts)
    x = np.random.default_rng(9).normal(size=(16, 16, 24, 24)).astype(np.float32)
    monkeypatch.setattr(jit, "_graph_cache", {})
    runs = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2, 3)]
    monkeypatch.setattr(codegen_plan, "row_runs", lambda plans: None)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the patch is not in the caches' keys
    alone = build_graph_module(graph, payload, np.float32).plan.nodes
    assert {p.rows.chunk for p in alone if p.rows is not None and p.into is None} == {2}
    assert all(alone[c].out_stride == 0 for c in (7, 15))
    want = compile_graph(graph, payload, np.float32, threads=2)(x)
    assert all(got.tobytes() == want.tobytes() for got in runs)
    expected = interpret(graph, payload, x, np.float32).output
    np.testing.assert_allclose(want, expected, rtol=2e-5, atol=2e-6)  # contractions' order


def test_a_matrix_product_keeps_its_rows() -> None:
    """At batch 32 (chunks of 4) the fire modules are one run of one image per task all the
    same, but a linear layer after them (its rows the M rows of one matrix product, 16 per
    task: `MATRIX_ROWS`) is not re-planned at one row to join it."""
    text, payload = fire_net(32, np.random.default_rng(8), linear=True)
    nodes = build_graph_module(graph_of(text), payload, np.float32).plan.nodes
    chunks = {p.node.id: (p.rows.chunk, p.run) for p in nodes if p.rows is not None}
    assert chunks == {**{i: (1, 1) for i in (1, 3, 5, 8, 9, 11, 13)}, 17: (16, None)}
    assert nodes[13].run_end
