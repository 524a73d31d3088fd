"""The front end on a large graph: parse, verify-structure, infer-shapes and print a generated
10,000-node graph, timing each phase.

    python bench/frontend.py [--nodes N] [--repeats R]

The graph cycles through elementwise, axis, binary and layout ops on [8, 16] tensors, half of
them with the shape left out (so infer-shapes has work to do). Times are the best of
`--repeats` runs, as wall time and as this process's CPU time (on a shared machine the wall
time also counts other processes); the aim is all four phases under 2 s in total.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tlc.dialect.ops import GraphOp
from tlc.dialect.printer import print_tlir
from tlc.frontends.text import context, parse_source
from tlc.passes.infer_shapes import InferShapesPass
from tlc.passes.verify_structure import VerifyStructurePass

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


def best_of(repeats: int, run: Callable[[], object]) -> tuple[tuple[float, float], object]:
    """(best wall time, best CPU time of this process) and the last result."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return (wall, cpu), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    text = generate(args.nodes)
    ctx = context()

    def parsed() -> object:
        return parse_source(text, "big.tlir")

    t_parse, module = best_of(args.repeats, parsed)
    t_verify, _ = best_of(args.repeats, lambda: VerifyStructurePass().apply(ctx, module))
    fresh = [parse_source(text, "big.tlir") for _ in range(args.repeats)]
    t_infer, _ = best_of(args.repeats, lambda: InferShapesPass().apply(ctx, fresh.pop()))
    t_print, printed = best_of(args.repeats, lambda: print_tlir(module))
    graph = next(op for op in module.ops if isinstance(op, GraphOp))
    assert len(graph.nodes) == args.nodes and isinstance(printed, str)
    phases = [("parse", t_parse), ("verify-structure", t_verify),
              ("infer-shapes", t_infer), ("print", t_print)]  # fmt: skip
    total = (sum(t[0] for _, t in phases), sum(t[1] for _, t in phases))
    print(f"{args.nodes} nodes, {len(text) / 1e6:.2f} MB of .tlir, best of {args.repeats}")
    print(f"  {'phase':17} {'wall s':>7} {'cpu s':>7}")
    for name, (wall, cpu) in [*phases, ("total", total)]:
        print(f"  {name:17} {wall:7.3f} {cpu:7.3f}")


if __name__ == "__main__":
    main()
