"""The front end on a large graph and on a large inline payload.

    python bench/frontend.py [--nodes N] [--repeats R]
    python bench/frontend.py --payload-mb M [--repeats R]

Graph mode: parse, verify-structure, infer-shapes and print a generated N-node graph (default
100,000), as `tlc-opt -p verify-structure,infer-shapes` runs them: one module, the phases in
turn. The graph cycles through elementwise, axis, binary and layout ops on [8, 16] tensors,
half of them with the shape left out (so infer-shapes has work to do). The aim (issue 14): all
four phases under 5 s at 100,000 nodes.

Payload mode: an MLP whose linear weights take M MB of .tlir text (default 30), read with the
weights inline (`tl.payload`) and with the same weights in an .npz file beside a document
without them, each up to a `Payload` of arrays. The aim (issue 14) is about whole tool runs:
`tlc-compile` or `tlc-run` on the inline document within 2x of the same run with the .npz;
reading decimal text alone stays some 30x reading binary (docs/security.md has both figures);
this mode prints both: the reads, then the tool runs (CPU time of the child processes).

Times are the best of R runs (default 3), as wall time and as this process's CPU time (on a
shared machine the wall time also counts other processes). Each run starts from a collected
heap, so one run's garbage is not scanned in the next.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import resolve_payload
from tlc.core.payload import Payload, save_npz
from tlc.dialect.ops import GraphOp
from tlc.dialect.printer import print_tlir
from tlc.frontends.text import context, parse_source
from tlc.passes.infer_shapes import InferShapesPass
from tlc.passes.verify_structure import VerifyStructurePass
from tlc.tools.common import tool_collector

PATTERN = [
    "relu(%{a})",
    "softmax(%{a}) {{axis = 1}}",
    "add(%{a}, %{b})",
    "transpose(%{a}) {{axis1 = 0, axis2 = 1}}",
    "transpose(%{a}) {{axis1 = 0, axis2 = 1}}",
    "tanh(%{a})",
    "layernorm(%{a}) {{axis = 1}}",
    "mul_elem(%{a}, %{b})",
]

Times = tuple[float, float]


def generate(nodes: int) -> str:
    """A chain over [8, 16] tensors (each transpose pair restores the shape)."""
    lines = ["tl.graph @big {", "  %0 = input : [8, 16]"]
    shapes = [(8, 16)]
    for i in range(1, nodes):
        text = PATTERN[i % len(PATTERN)]
        a = i - 1
        b = next(j for j in range(i - 2, -1, -1) if shapes[j] == shapes[a]) if "%{b}" in text else 0
        shape = (shapes[a][1], shapes[a][0]) if text.startswith("transpose") else shapes[a]
        shapes.append(shape)
        declared = f" : [{shape[0]}, {shape[1]}]" if i % 2 else ""
        lines.append(f"  %{i} = {text.format(a=a, b=b)}{declared}")
    lines += [f"  output %{nodes - 1}", "}", ""]
    return "\n".join(lines)


def timed(run: Callable[[], object]) -> tuple[Times, object]:
    start, start_cpu = time.perf_counter(), time.process_time()
    result = run()
    return (time.perf_counter() - start, time.process_time() - start_cpu), result


def best(runs: list[Times]) -> Times:
    return min(r[0] for r in runs), min(r[1] for r in runs)


def report(title: str, phases: list[tuple[str, list[Times]]]) -> None:
    print(title)
    print(f"  {'phase':17} {'wall s':>7} {'cpu s':>7}")
    for name, runs in phases:
        wall, cpu = best(runs)
        print(f"  {name:17} {wall:7.3f} {cpu:7.3f}")


def graph_mode(nodes: int, repeats: int) -> None:
    text = generate(nodes)
    names = ["parse", "verify-structure", "infer-shapes", "print", "total"]
    runs: dict[str, list[Times]] = {name: [] for name in names}
    for _ in range(repeats):
        gc.collect()
        with tool_collector():  # as tlc-opt runs them
            times = pipeline(text, nodes)
        for name, t in zip(names, times, strict=True):
            runs[name].append(t)
    mb = len(text) / 1e6
    report(f"{nodes} nodes, {mb:.2f} MB of .tlir, best of {repeats}", list(runs.items()))


def pipeline(text: str, nodes: int) -> list[Times]:
    """One run of the four phases on one module, and their total."""
    ctx = context()
    t_parse, module = timed(lambda: parse_source(text, "big.tlir"))
    assert isinstance(module, ModuleOp)
    t_verify, _ = timed(lambda: VerifyStructurePass().apply(ctx, module))
    t_infer, _ = timed(lambda: InferShapesPass().apply(ctx, module))
    t_print, printed = timed(lambda: print_tlir(module))
    graph = next(op for op in module.ops if isinstance(op, GraphOp))
    assert len(graph.nodes) == nodes and isinstance(printed, str)
    phases = [t_parse, t_verify, t_infer, t_print]
    return [*phases, (sum(t[0] for t in phases), sum(t[1] for t in phases))]


def payload_documents(megabytes: float, directory: str) -> tuple[str, str, str]:
    """(document with the weights inline, document without them, the .npz of the weights)."""
    rng = np.random.default_rng(0)
    width = 512
    per_layer = width * (width + 1) * 19  # about 19 bytes of text per float64
    layers = max(1, round(megabytes * 1e6 / per_layer))
    lines = ["tl.graph @mlp {", f"  %0 = input : [{width}]"]
    payload = Payload()
    for i in range(1, layers + 1):
        lines.append(f"  %{i} = linear(%{i - 1}) : [{width}]")
        payload.records[i] = {
            "weight": rng.normal(0, 0.05, (width, width)),
            "bias": rng.normal(0, 0.05, width),
        }
        payload.kinds[i] = "linear"
    lines += [f"  output %{layers}", "}", ""]
    bare = "\n".join(lines)
    records = [
        f"  %{i} = linear {{weight = {r['weight'].tolist()}, bias = {r['bias'].tolist()}}}"
        for i, r in payload.records.items()
    ]
    inline = bare + "tl.payload @mlp {\n" + "\n".join(records) + "\n}\n"
    npz = os.path.join(directory, "weights.npz")
    save_npz(payload, npz)
    return inline, bare, npz


def payload_mode(megabytes: float, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tlc-bench-") as tmp:
        inline, bare, npz = payload_documents(megabytes, tmp)

        def read(text: str, source: str | None) -> Payload:
            module = parse_source(text, "mlp.tlir")
            graph = next(op for op in module.ops if isinstance(op, GraphOp))
            return resolve_payload(module, graph, source)

        runs: dict[str, list[Times]] = {"inline tl.payload": [], "weights in .npz": []}
        for _ in range(repeats):
            gc.collect()
            t_inline, a = timed(lambda: read(inline, None))
            gc.collect()
            t_npz, b = timed(lambda: read(bare, npz))
            assert isinstance(a, Payload) and isinstance(b, Payload)
            assert all(np.array_equal(a[i]["weight"], b[i]["weight"]) for i in b.records)
            runs["inline tl.payload"].append(t_inline)
            runs["weights in .npz"].append(t_npz)
            del a, b
        title = f"inline payload of {len(inline) / 1e6:.1f} MB of .tlir, best of {repeats}"
        report(title, list(runs.items()))
        ratio = best(runs["inline tl.payload"])[1] / best(runs["weights in .npz"])[1]
        print(f"  inline / npz (cpu): {ratio:.2f}x")
        tool_runs(inline, bare, npz, tmp, repeats)


def tool_runs(inline: str, bare: str, npz: str, tmp: str, repeats: int) -> None:
    """The aim's figures: `tlc-run` and `tlc-compile` on the inline document against the same
    command with `--payload` the .npz, by the CPU time of the child processes (median)."""
    width = int(re.search(r"input : \[(\d+)\]", bare).group(1))  # type: ignore[union-attr]
    documents = {}
    for name, text in (("inline", inline), ("bare", bare)):
        documents[name] = os.path.join(tmp, f"{name}.tlir")
        Path(documents[name]).write_text(text)
    x = ",".join(["0.1"] * width)
    so = os.path.join(tmp, "mlp.so")
    commands = {
        "tlc-run": ["tlc-run", "--input", x],
        "tlc-compile": ["tlc-compile", "-o", so, "--target-cpu", "x86-64-v2"],
    }
    print(f"\ntool runs, CPU s of the child process, median of {repeats}")
    for tool, command in commands.items():
        inline_s, npz_s = [], []
        for _ in range(repeats):
            inline_s.append(child_cpu([*command, documents["inline"]]))
            npz_s.append(child_cpu([*command, documents["bare"], "--payload", npz]))
        a, b = statistics.median(inline_s), statistics.median(npz_s)
        print(f"  {tool:12} inline {a:.3f}  npz {b:.3f}  inline / npz {a / b:.2f}x")


def child_cpu(command: list[str]) -> float:
    """User + system CPU seconds of running `command` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--payload-mb", type=float, help="payload mode: MB of inline weights")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.payload_mb:
        payload_mode(args.payload_mb, args.repeats)
    else:
        graph_mode(args.nodes, args.repeats)


if __name__ == "__main__":
    main()
