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
The box options of `tlc.bounds` (docs/verification.md): `--radius` per coordinate (`0.1,0,0.2,0`
or an .npy file), `--lo/--hi` instead of `--input`/`--radius`, `--method ibp|crown|crown-ibp`,
`--spec C.npy` (bounds of C y, printed as `spec: [lo...] .. [hi...]`); with any of them the
bounds come from `tlc.bounds` and print rounded outward (the printed box contains the sound one).
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
from tlc.semantics.crown import METHODS
from tlc.semantics.interval_arith import Box
from tlc.tools.common import (
    glue_values,
    int_in,
    is_number,
    read_input,
    run_tool,
    tool_parser,
)
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
    """Boxes for the ball of --radius around --input; with --samples N, the containment check.
    With a box option (`uses_bounds`) the bounds of `tlc.bounds` instead (`_run_bounds`)."""
    from tlc.api.bounds import ball, violation_error
    from tlc.semantics.containment import check_samples
    from tlc.semantics.ibp import ibp

    if uses_bounds(job.args):
        return _run_bounds(job)
    x = job.input_value() if job.input_nodes() else {}
    lo, hi = ball(x, float(job.args.radius or 0.0))
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


def uses_bounds(args: argparse.Namespace) -> bool:
    """Whether a box option asks for `tlc.bounds` (a per-coordinate radius, --lo/--hi, --method,
    --spec) rather than the seed's IBP table."""
    per_coordinate = args.radius is not None and not is_number(args.radius)
    return per_coordinate or any(v is not None for v in (args.lo, args.hi, args.method, args.spec))


def _box_ends(job: Job) -> tuple[Any, Any]:
    """The input box of the box options: --lo/--hi, or --input with a radius that is a number,
    a comma list or an .npy file (per coordinate), the ball's ends rounded outward; for a graph
    with several input nodes `{node id: array}` from the named --input values and one radius."""
    from tlc.api.bounds import input_box

    args = job.args
    nodes = job.input_nodes()
    radius = parse_input_text(args.radius or "0")
    if len(nodes) != 1:
        if args.lo is not None or radius.size != 1:
            raise DiagnosticError.simple(
                f"box options: graph @{job.graph.graph_name} has {len(nodes)} input nodes; "
                "--lo/--hi and a per-coordinate --radius take a graph with one input node "
                "(give each input with --input and one --radius)"
            )
        return input_box(center=job.input_value(), radius=float(radius.reshape(())))
    if args.lo is not None:
        return job._value(nodes[0], args.lo, "--lo"), job._value(nodes[0], args.hi, "--hi")
    centre = job.input_value()
    if radius.size != 1:
        radius = shape_input(radius, centre.shape, "--radius")
    return input_box(center=centre, radius=radius.reshape(radius.shape if radius.size > 1 else ()))


def _run_bounds(job: Job) -> list[str]:
    """`tlc.bounds` of the box options: the output's box (or `spec:` the bounds of C y), every
    node's box with --print-values, ends rounded outward; nodes whose interval box CROWN used
    are named on stderr; --samples checks sampled values against every node's box."""
    from tlc.api.bounds import bounds, prepared_bounds, violation_error
    from tlc.core.npyio import read_npy
    from tlc.semantics.containment import check_samples

    args = job.args
    lo, hi = _box_ends(job)
    spec = None if args.spec is None else read_npy(args.spec, "--spec")
    result = bounds(prepared_bounds(job.graph, job.payload), lo=lo, hi=hi, C=spec,
                    method=args.method or "ibp")  # fmt: skip
    for node_id, reason in sorted(result.fallbacks.items()):
        sys.stderr.write(f"note: node {node_id}: {reason}\n")
    output = node_id_of(job.graph.output.value)  # type: ignore[union-attr]
    shown = range(len(result.boxes)) if args.print_values else []
    lines = [
        f"node {i}: {format_box(result.boxes[i], args.digits, outward=True)}"
        for i in shown
        if i != output or spec is not None
    ]
    final = Box(result.lower, result.upper)
    lines.append(f"{'spec' if spec is not None else f'node {output}'}: "
                 f"{format_box(final, args.digits, outward=True)}")  # fmt: skip
    if args.samples:
        boxes = list(result.boxes)
        if spec is None:
            boxes[output] = final
        report = check_samples(job.graph, job.payload, lo, hi, args.samples, boxes=boxes)
        if report.violation is not None:
            raise violation_error(job.graph, report, args.samples)
        lines.append(f"samples: {args.samples} inputs, every node value inside its box")
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
    p.add_argument("--arithmetic", choices=list(ARITHMETICS),
                   help="scalar context (default f64; f32 with --backend llvm, as compiled "
                   "code defaults to f32)")  # fmt: skip
    p.add_argument("--radius", metavar="R|R0,R1,...|R.npy",
                   help="interval: l-infinity radius of the input box (default 0), one number "
                   "or one per coordinate")  # fmt: skip
    p.add_argument(
        "--lo",
        metavar="VALUES|LO.npy",
        help="interval: the input box's lower ends (with --hi, instead of --input)",
    )
    p.add_argument("--hi", metavar="VALUES|HI.npy", help="interval: the input box's upper ends")
    p.add_argument(
        "--method",
        choices=METHODS,
        help="interval: bounds by ibp, crown or crown-ibp (docs/verification.md)",
    )
    p.add_argument(
        "--spec",
        metavar="C.npy",
        help="interval: bound C y, C a matrix with one column per output element",
    )
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
    flags = ["--input", "--lo", "--hi", "--radius"]
    args = parser.parse_args(glue_values(sys.argv[1:] if argv is None else argv, flags))
    if args.arithmetic is None:  # the reference and gradients in f64, compiled code in f32
        args.arithmetic = "f32" if args.backend == "llvm" and not args.grad else "f64"
    box_options = (args.radius, args.samples, args.lo, args.hi, args.method, args.spec)
    if args.arithmetic != "interval" and any(v is not None for v in box_options):
        parser.error("--radius, --samples, --lo, --hi, --method and --spec need --arithmetic "
                     "interval")  # fmt: skip
    if (args.lo is None) != (args.hi is None):
        parser.error("--lo and --hi go together")
    if args.lo is not None and (args.input or args.radius is not None):
        parser.error("give the input box as --lo/--hi or as --input with --radius, not both")
    if args.samples and args.spec is not None:
        parser.error("--samples checks node boxes; it does not check the bounds of --spec")
    if args.backend == "llvm" and args.arithmetic not in ("f64", "f32"):
        parser.error("--backend llvm runs compiled f64 or f32 code (no --arithmetic interval)")
    if args.grad and (args.arithmetic != "f64" or args.print_values):
        parser.error("--grad computes f64 gradients (no other --arithmetic, no --print-values)")
    if args.radius is not None and not args.radius.endswith(".npy"):
        try:
            values = [float(item) for item in args.radius.split(",")]
        except ValueError:
            parser.error(f"--radius '{args.radius}' is not a number, a comma list or an .npy file")
        if not all(v >= 0 for v in values):
            parser.error("--radius and --samples must be >= 0")
    if (args.samples or 0) < 0:
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
