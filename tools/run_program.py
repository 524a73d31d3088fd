"""tlc-run on a `tl.program`: the program's own evaluator, parameters by name (`--params`).

    tlc-run prog.tlir --params params.npz --input 0.3,-0.2,0.1,0.4 [--print-values]
            [--arithmetic f64|f32|interval [--radius R]]

Prints the returned value as `%y: 0.027713` (with `--print-values`, every `let` in order), boxes
as `%y: [lo] .. [hi]`. `--params` also runs a graph lowered from a program (`tl.params` binding):
`params_payload` gives its payload, so both forms run from the same parameter file.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import parse_input_text, shape_input
from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.program_ops import CallOp, ProgramOp
from tlc.semantics.program import IntervalOps
from tlc.semantics.program_run import (
    ProgramRun,
    check_params,
    evaluate_program,
    load_params,
    payload_from_params,
    run_program,
)
from tlc.tools.common import is_number
from tlc.tools.formatting import format_box, format_value


def select_program(module: ModuleOp, name: str | None) -> ProgramOp | None:
    """The program to run: the one `--graph @name` names, or the document's only item."""
    programs = [op for op in module.ops if isinstance(op, ProgramOp)]
    if name is not None:
        return next((p for p in programs if p.graph_name == name.removeprefix("@")), None)
    if len(programs) == 1 and not any(isinstance(op, GraphOp) for op in module.ops):
        return programs[0]
    if programs:
        names = ", ".join(f"@{p.graph_name}" for p in programs)
        raise DiagnosticError.simple(
            f"the document has programs ({names}); choose one with --graph @name"
        )
    return None


def params_payload(module: ModuleOp, graph: GraphOp, params_path: str) -> Payload:
    """A lowered graph's payload: its inline records plus the parameters bound by name."""
    payload = payload_from_module(module, graph.graph_name)
    by_name = payload_from_params(module, graph.graph_name, load_params(params_path))
    for node_id, record in by_name.records.items():  # fields by name over the inline ones
        payload.records.setdefault(node_id, {}).update(record)
    payload.kinds.update(by_name.kinds)
    return payload


def run_program_lines(args: argparse.Namespace, program: ProgramOp) -> list[str]:
    per_coordinate = args.radius is not None and not is_number(args.radius)
    for flag, given in (
        ("--payload", args.payload),
        ("--samples", args.samples),
        ("--lo/--hi", args.lo or args.hi),
        ("a per-coordinate --radius", per_coordinate or None),
        ("--method", args.method),
        ("--spec", args.spec),
    ):
        if given is not None:
            raise DiagnosticError.simple(f"{flag} applies to graphs: lower the program first")
    if args.backend != "reference":
        raise DiagnosticError.simple("--backend llvm compiles graphs: lower the program first")
    params = load_params(args.params) if args.params is not None else {}
    if not args.input:
        raise DiagnosticError.simple(f"program @{program.graph_name}: give its input with --input")
    if len(args.input) > 1:
        raise DiagnosticError.simple(
            f"program @{program.graph_name} has one input: give --input once"
        )
    x = shape_input(parse_input_text(args.input[0]), program.shape_of_arg(program.input))
    ret = program.ret
    assert ret is not None, "the parser requires a return"
    owner = ret.value.owner
    names = dict(zip(program.body.block.args, program.names, strict=True))
    result = owner.let_name if isinstance(owner, CallOp) else names[ret.value]
    digits = args.digits
    if args.arithmetic == "interval":
        run = _interval(program, params, x, float(args.radius or 0.0))
        show: Callable[[Any], str] = lambda v: format_box(v.box, digits)  # noqa: E731
    else:
        dtype = {"f64": np.float64, "f32": np.float32}[args.arithmetic]
        run = evaluate_program(program, params, x, dtype)
        show = lambda v: format_value(v, digits)  # noqa: E731
    values = {**run.lets, result: run.result}
    shown = list(values.items()) if args.print_values else [(result, values[result])]
    return [f"%{name}: {show(value)}" for name, value in shown]


def _interval(program: ProgramOp, params: Any, x: np.ndarray, radius: float) -> ProgramRun:
    """The program on intervals, for the ball of `radius` around `x` (parameters checked)."""
    declared = {name: program.shape_of_arg(arg) for name, arg in program.params.items()}
    ops = IntervalOps()
    checked = check_params(declared, params, program)
    return run_program(program, ops, ops.box(x - radius, x + radius), checked)
