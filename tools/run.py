"""tlc-run: evaluate a graph of a .tlir document and print its output or its whole value table.

    tlc-run FILE [--payload P.npz] [--input 0.3,-0.2,0.1,0.4 | --input x.npy]
            [--arithmetic f64|f32|interval [--radius R] [--samples N]] [--print-values]
            [--graph @name] [--backend reference]

The chosen graph is checked first (verify-structure, infer-shapes); the payload is the document's
inline `tl.payload` section unless `--payload` names an .npz file. Values print with six decimals
(`--digits`), one line per node: `node 1: [0.107000, -0.017000, ...]`, scalars `node 4: 0.027720`,
rank >= 2 as nested brackets, magnitudes >= 1e15 in exponent form. Without `--print-values`
only the output node's line is printed.
`--arithmetic interval` prints boxes for inputs within `--radius` of `--input` (docs/intervals.md):
`node 0: [lo...] .. [hi...]`, `node k: none` where no sound rule applies; `--samples N` then checks
N sampled evaluations against every box and reports the first counterexample (exit 1).
`--grad` prints the scalar output and its gradient (f64, docs/autodiff.md): `output: 0.027713`,
then `grad input: [...]` and `grad %1.weight: [[...]]` per parameter field, same number format.
Each arithmetic is one entry of `ARITHMETICS` (a function printing its lines).
Exit codes: 0 success, 1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import (
    checked_graph,
    for_batch,
    parse_input_text,
    resolve_payload,
    shape_input,
)
from tlc.core.diagnostics import DiagnosticError, SourceManager, error
from tlc.core.payload import Payload
from tlc.dialect.batch import has_batch
from tlc.dialect.ops import GraphOp, InputOp, NodeOp, node_id_of
from tlc.dialect.shapes import fmt_shape
from tlc.frontends.text import parse_source
from tlc.tools.common import glue_values, int_in, read_input, run_tool, tool_parser
from tlc.tools.formatting import format_box, format_value
from tlc.tools.run_program import params_payload, run_program_lines, select_program

if TYPE_CHECKING:
    pass

BACKENDS = ("reference", "llvm", "plan")


@dataclass
class Job:
    """A checked graph ready to run: everything an arithmetic needs."""

    args: argparse.Namespace
    module: ModuleOp
    graph: GraphOp
    payload: Payload

    def input_value(self) -> Any:
        """The `--input` values: an array shaped like the graph's only input node, or
        `{node id: array}` for a graph with several (each named: `--input %1=...` by node id,
        `--input 1=...` by position among the input nodes)."""
        nodes = self.input_nodes()
        given: list[str] = self.args.input or []
        graph = f"graph @{self.graph.graph_name}"
        if not given:
            if len(nodes) == 1:
                raise DiagnosticError.simple(
                    f"{graph} has an input node: give its value with --input"
                )
            raise DiagnosticError.simple(
                f"{graph} has {len(nodes)} input nodes: give each with --input NAME=VALUES "
                "(NAME: %ID or position)"
            )
        if len(nodes) == 1 and len(given) == 1 and not NAMED_INPUT.match(given[0]):
            return self._value(nodes[0], given[0], "--input")
        values: dict[int, np.ndarray] = {}
        for text in given:
            m = NAMED_INPUT.match(text)
            if m is None:
                raise DiagnosticError.simple(
                    f"--input '{text}': {graph} has {len(nodes)} input nodes; name each: "
                    "--input %ID=VALUES (node id) or --input K=VALUES (K-th input)"
                )
            node = self._named(m.group(1), nodes)
            if node.id in values:
                raise DiagnosticError.simple(f"--input: input node %{node.id} given twice")
            values[node.id] = self._value(node, text[m.end() :], f"--input {m.group(1)}")
        missing = [f"%{n.id}" for n in nodes if n.id not in values]
        if missing:
            raise DiagnosticError.simple(
                f"--input: no value for input node {', '.join(missing)} of {graph}"
            )
        return values if len(nodes) > 1 else values[nodes[0].id]

    def _named(self, name: str, nodes: list[InputOp]) -> InputOp:
        """The input node `%ID` (by node id) or `K` (the K-th input node)."""
        ids = ", ".join(f"%{n.id}" for n in nodes)
        if name.startswith("%"):
            for node in nodes:
                if node.id == int(name[1:]):
                    return node
            raise DiagnosticError.simple(f"--input {name}: not an input node (inputs: {ids})")
        if int(name) < len(nodes):
            return nodes[int(name)]
        raise DiagnosticError.simple(
            f"--input {name}: the graph has {len(nodes)} input nodes ({ids}), numbered from 0"
        )

    @staticmethod
    def _value(node: InputOp, text: str, what: str) -> np.ndarray:
        assert node.declared_shape is not None, "infer-shapes fills in every shape"
        return shape_input(parse_input_text(text), node.declared_shape, what)

    def input_nodes(self) -> list[InputOp]:
        return [n for n in self.graph.nodes if isinstance(n, InputOp)]


#: `--input %1=0.3,0.2` or `--input 1=0.3,0.2`: a value for one input node of several.
NAMED_INPUT = re.compile(r"^(%\d+|\d+)=")


#: Most decimals --digits prints (float64 has 17 significant digits; 100 is plenty).
MAX_DIGITS = 100


def _run_float(job: Job) -> list[str]:
    from tlc.api.execute import execute_plan
    from tlc.semantics.interpret import DTYPES, interpret

    if job.args.backend == "llvm":
        return _run_llvm(job, DTYPES[job.args.arithmetic])
    x = job.input_value() if job.input_nodes() else {}
    # `--backend plan`: each node on the kernel its select-kernels plan names (docs/kernels.md).
    evaluate = execute_plan if job.args.backend == "plan" else interpret
    table = evaluate(job.graph, job.payload, x, DTYPES[job.args.arithmetic])
    shown = range(len(table)) if job.args.print_values else [table.output_id]
    return [f"node {i}: {format_value(table[i], job.args.digits)}" for i in shown]


def _run_llvm(job: Job, dtype: type) -> list[str]:
    """`--backend llvm`: JIT-compile the graph (payload baked in) and print its output node."""
    from tlc.codegen.jit import compile_graph

    if job.args.print_values:
        raise DiagnosticError.simple(
            "--print-values needs the reference backend: compiled code keeps only the output"
        )
    if len(job.input_nodes()) > 1:
        raise DiagnosticError.simple(
            f"--backend llvm: compiled code takes one input; graph @{job.graph.graph_name} has "
            f"{len(job.input_nodes())} (run it with the reference backend)"
        )
    compiled = compile_graph(job.graph, job.payload, dtype)
    x = job.input_value() if job.input_nodes() else np.zeros(compiled.input_shape)
    output = job.graph.output
    assert output is not None and isinstance(output.value.owner, NodeOp)
    value = compiled(np.asarray(x, dtype=dtype))
    return [f"node {output.value.owner.id}: {format_value(value, job.args.digits)}"]


def _run_grad(job: Job) -> list[str]:
    """`--grad`: the scalar output and its gradient with respect to the input and every
    parameter (docs/autodiff.md); with `--backend llvm` the gradient graph runs compiled."""
    from tlc.passes.grad import build_grad_graph
    from tlc.semantics.autodiff.modes import output_id, vjp

    out = job.graph.nodes[output_id(job.graph)]
    if out.declared_shape != ():
        shape = fmt_shape(out.declared_shape)
        raise error(f"--grad needs a scalar output; node {out.id} has shape {shape}", out)
    x = job.input_value() if job.input_nodes() else {}
    if job.args.backend == "llvm":
        from tlc.codegen.jit import compile_graph

        grad, payload, layout = build_grad_graph(job.graph, job.payload)
        pieces = layout.unpack(compile_graph(grad, payload)(np.asarray(x, dtype=np.float64)))
    else:
        from tlc.semantics.interpret import interpret

        dx, dp = vjp(job.graph, job.payload, x)
        pieces = {"output": interpret(job.graph, job.payload, x).output}
        if isinstance(dx, Mapping):  # several input nodes: one gradient each
            pieces |= {f"input %{nid}": v for nid, v in dx.items()}
        elif job.input_nodes():
            pieces["input"] = dx
        pieces |= {f"%{nid}.{name}": v for nid, rec in dp.items() for name, v in rec.items()}
    digits = job.args.digits
    lines = [f"output: {format_value(pieces.pop('output'), digits)}"]
    return lines + [f"grad {label}: {format_value(v, digits)}" for label, v in pieces.items()]


def _run_interval(job: Job) -> list[str]:
    """Boxes for the ball of --radius around --input; with --samples N, the containment check."""
    from tlc.api.bounds import ball, violation_error
    from tlc.semantics.containment import check_samples
    from tlc.semantics.ibp import ibp

    x = job.input_value() if job.input_nodes() else {}
    lo, hi = ball(x, job.args.radius or 0.0)
    samples = job.args.samples or 0
    report = check_samples(job.graph, job.payload, lo, hi, samples) if samples else None
    boxes = report.boxes if report else ibp(job.graph, job.payload, lo, hi)
    output = job.graph.output
    assert output is not None, "verify-structure guarantees one output"
    shown = range(len(boxes)) if job.args.print_values else [node_id_of(output.value)]
    lines = [f"node {i}: {format_box(boxes[i], job.args.digits)}" for i in shown]
    if report is not None:
        if report.violation is not None:
            raise violation_error(job.graph, report, samples)
        lines.append(f"samples: {samples} inputs, every node value inside its box")
    return lines


#: `--arithmetic` name -> the function that runs a job in it and returns the lines to print.
ARITHMETICS: dict[str, Callable[[Job], list[str]]] = {
    "f64": _run_float,
    "f32": _run_float,
    "interval": _run_interval,
}


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("tlc-run", __doc__)
    p.add_argument("input_file", metavar="FILE", help="the .tlir document, - for stdin")
    p.add_argument("--payload", metavar="P.npz", help="payload file (default: inline tl.payload)")
    p.add_argument("--params", metavar="P.npz",
                   help="parameters by name, for a tl.program or a graph lowered from one "
                   "(docs/programs.md)")  # fmt: skip
    p.add_argument("--input", action="append", metavar="[NAME=]VALUES|X.npy",
                   help="input values: '0.3,-0.2,0.1,0.4' (row-major) or an .npy file; for a "
                   "graph with several inputs, once per input as %%ID=VALUES (node id) or "
                   "K=VALUES (K-th input)")  # fmt: skip
    p.add_argument("--arithmetic", choices=list(ARITHMETICS), default="f64",
                   help="scalar context (default f64)")  # fmt: skip
    p.add_argument("--radius", type=float, metavar="R",
                   help="interval: l-infinity radius of the input box (default 0)")  # fmt: skip
    p.add_argument("--samples", type=int, metavar="N",
                   help="interval: check N sampled inputs against every box")  # fmt: skip
    p.add_argument("--print-values", action="store_true", help="print every node's value")
    p.add_argument("--graph", metavar="@NAME", help="graph to run (needed if there are several)")
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="evaluator")
    p.add_argument("--digits", type=int_in(0, MAX_DIGITS), default=6,
                   help=f"decimals printed (default 6, at most {MAX_DIGITS})")  # fmt: skip
    p.add_argument("--grad", action="store_true",
                   help="print the gradient of the scalar output w.r.t. the input and every "
                   "parameter (f64; docs/autodiff.md)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    sources = SourceManager()
    return run_tool(lambda: _main(argv, sources), "tlc-run", sources)


def _main(argv: list[str] | None, sources: SourceManager) -> int:
    parser = build_parser()
    args = parser.parse_args(glue_values(sys.argv[1:] if argv is None else argv, ["--input"]))
    if args.arithmetic != "interval" and (args.radius is not None or args.samples is not None):
        parser.error("--radius and --samples need --arithmetic interval")
    if args.backend == "llvm" and args.arithmetic not in ("f64", "f32"):
        parser.error("--backend llvm runs compiled f64 or f32 code (no --arithmetic interval)")
    if args.grad and (args.arithmetic != "f64" or args.print_values):
        parser.error("--grad computes f64 gradients (no other --arithmetic, no --print-values)")
    if (args.radius is not None and not args.radius >= 0) or (args.samples or 0) < 0:
        parser.error("--radius and --samples must be >= 0")
    name, text = read_input(args.input_file)
    sources.add(name, text)
    module = parse_source(text, name)
    program = select_program(module, args.graph)
    if program is not None:
        for line in run_program_lines(args, program):
            print(line)
        return 0
    graph = checked_graph(module, args.graph)
    if args.params is not None:
        payload = params_payload(module, graph, args.params)
    else:
        payload = resolve_payload(module, graph, args.payload)
    job = Job(args, module, graph, payload)
    if has_batch(graph) and job.input_nodes():  # `N`: the batch size --input gives
        job = Job(args, module, for_batch(graph, job.input_value()), payload)
    for line in (_run_grad if args.grad else ARITHMETICS[args.arithmetic])(job):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
