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
