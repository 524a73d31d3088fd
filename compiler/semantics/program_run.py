"""Running a textual program (`tl.program`) with any instance of the operations interface.

`run_program` folds over the program's calls in order, calling the interface method named by
each call with the values and parameters it reads and its fields as keywords, so a textual
program means exactly what the same calls mean in Python. Its instances give:

- `evaluate_program`: the program's own evaluator (the `Eager` instance; parameters by name),
- `lower_program`: the graph and the parameter binding (the `GraphBuilder` instance with
  symbolic parameters), which the `lower-program` pass installs,
- `check_program`: the same lowering, run by the document reader (`tlc.frontends.text`) so a
  program that is read also lowers.

A parameter where a value is expected becomes a `const` node bound to that parameter; a value
where a parameter is expected is an error. Parameter files are keyed by parameter name
(`load_params`); `payload_from_params` turns one into the payload of a lowered graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tlc.core.diagnostics import DiagnosticError, Location, error, location_of
from tlc.core.limits import LimitError, check_elements
from tlc.core.npyio import read_npz
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.dialect.program_ops import BindOp, CallOp, ParamsOp, ProgramOp
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.semantics.program import (
    INTERFACE,
    NOT_IN_INTERFACE,
    Eager,
    GraphBuilder,
    Ops,
    Param,
    value_slots,
)


@dataclass
class ProgramRun:
    """The result of running a program: its return value and the value of every `let`."""

    result: Any
    lets: dict[str, Any]


def _where(op: Operation) -> Location:
    loc = location_of(op)
    return loc if loc is not None else Location("<program>", 0, 0)


def run_program(program: ProgramOp, ops: Ops, x: Any, params: Mapping[str, Any]) -> ProgramRun:
    """Run `program` on input `x` with parameter values `params` (by name) in instance `ops`."""
    env: dict[SSAValue, Any] = {program.input: x}
    param_args = program.params
    env.update({arg: params[name] for name, arg in param_args.items()})
    is_param = set(param_args.values())
    lets: dict[str, Any] = {}
    for call in program.calls:
        ops.at = _where(call)
        value = _call(ops, call, [(env[a], a in is_param) for a in call.args])
        env[call.result] = value
        if call.let_name is not None:
            lets[call.let_name] = value
    ret = program.ret
    if ret is None:
        raise error(f"program @{program.graph_name} has no return", program)
    ops.at = _where(ret)
    return ProgramRun(env[ret.value], lets)


def _call(ops: Ops, call: CallOp, args: list[tuple[Any, bool]]) -> Any:
    name, where = call.callee_name, _where(call)
    op = INTERFACE.get(name)
    if op is None:
        why = next((f" ({w})" for o, w in NOT_IN_INTERFACE.items() if name == o.TAG), "")
        raise error(f"unknown operation '{name}' in a program{why}", where)
    slots = value_slots(op)
    values = []
    for i, (value, param) in enumerate(args):
        if slots is None or i < slots:
            values.append(ops.const(value) if param else value)
        elif not param:
            raise error(f"{name}: argument {i + 1} must be a parameter, not a value", where)
        else:
            values.append(value)
    method = getattr(ops, name)
    fields = call.keyword_args()
    try:
        inspect.signature(method).bind(*values, **fields)
    except TypeError as exc:
        raise error(f"{name}: {exc}", where) from None
    result = method(*values, **fields)
    declared = call.declared_shape
    if declared is not None and ops.shape_of(result) != declared:
        raise error(
            f"{name}: declared shape {fmt_shape(declared)} does not match the inferred "
            f"{fmt_shape(ops.shape_of(result))}",
            where,
        )
    return result


# --------------------------------------------------------------------------------------------
# Lowering
# --------------------------------------------------------------------------------------------


@dataclass
class Lowered:
    """A lowered program: its graph, its parameter binding, and the node of each `let`."""

    graph: GraphOp
    params: ParamsOp
    let_nodes: dict[str, int]


def lower_program(program: ProgramOp) -> Lowered:
    """The graph of `program` (same name), nodes in call order; parameters bound by name."""
    declared = {name: program.shape_of_arg(arg) for name, arg in program.params.items()}
    for name, shape in [("input", program.shape_of_arg(program.input)), *declared.items()]:
        try:
            check_elements(shape, f"program @{program.graph_name}: {name}")
        except LimitError as exc:
            raise error(str(exc), program) from None
    builder = GraphBuilder(
        program.graph_name, [program.shape_of_arg(program.input)], _where(program)
    )
    run = run_program(
        program, builder, builder.input, {n: Param(n, s) for n, s in declared.items()}
    )
    graph = builder.finish(run.result, _where(program.ret or program))
    binds = [BindOp(node, kind, fields) for node, (kind, fields) in sorted(builder.bound.items())]
    for bind in binds:
        bind.location = graph.nodes[bind.node_id].location
    params = ParamsOp(program.graph_name, list(declared.items()), binds)
    params.location = program.location
    graph.location = program.location
    owners = {name: value.owner for name, value in run.lets.items()}
    return Lowered(graph, params, {name: graph.nodes.index(op) for name, op in owners.items()})


def check_program(program: ProgramOp) -> None:
    """Raise a located DiagnosticError if `program` does not lower (shapes, parameter uses)."""
    lower_program(program)


# --------------------------------------------------------------------------------------------
# Parameters by name, and the program's evaluator
# --------------------------------------------------------------------------------------------


def load_params(path: str) -> dict[str, np.ndarray]:
    """A parameter file: an .npz whose keys are parameter names (`W1`, `b1`, ...)."""
    return {k: v.astype(np.float64, copy=False) for k, v in read_npz(path, "parameters").items()}


def check_params(
    declared: Mapping[str, Shape], params: Mapping[str, Any], where: Operation
) -> dict[str, np.ndarray]:
    """The parameters as float64 arrays, each present and of its declared shape."""
    checked = {}
    for name, shape in declared.items():
        if name not in params:
            raise error(f"parameter %{name} is missing from the parameters given", where)
        value = np.asarray(params[name], dtype=np.float64)
        if value.shape != shape:
            raise error(
                f"parameter %{name}: shape mismatch: given {fmt_shape(value.shape)}, "
                f"declared {fmt_shape(shape)}",
                where,
            )
        checked[name] = value
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise error(f"parameters not declared by @{_name(where)}: {', '.join(unknown)}", where)
    return checked


def _name(op: Operation) -> str:
    return op.graph_name if isinstance(op, ProgramOp | ParamsOp) else "?"


def evaluate_program(
    program: ProgramOp, params: Mapping[str, Any], x: Any, dtype: type = np.float64
) -> ProgramRun:
    """The program's own evaluator: every `let`'s value and the result, in `dtype`."""
    declared = {name: program.shape_of_arg(arg) for name, arg in program.params.items()}
    values = check_params(declared, params, program)
    value = np.asarray(x, dtype=dtype)
    expected = program.shape_of_arg(program.input)
    if value.shape != expected:
        raise error(
            f"IR eval: input 0: shape mismatch: given {fmt_shape(value.shape)}, "
            f"declared {fmt_shape(expected)}",
            program,
        )
    return run_program(program, Eager(dtype), value, values)


def payload_from_params(module: ModuleOp, graph_name: str, params: Mapping[str, Any]) -> Payload:
    """The payload of graph `graph_name` from parameters by name, via its `tl.params` binding."""
    binding = next(
        (op for op in module.ops if isinstance(op, ParamsOp) and op.graph_name == graph_name),
        None,
    )
    if binding is None:
        raise DiagnosticError.simple(
            f"graph @{graph_name} has no tl.params binding, so parameters by name cannot be used"
        )
    values = check_params(binding.declared, params, binding)
    payload = Payload()
    for bind in binding.binds:
        record = {field: values[name] for field, name in bind.field_params().items()}
        payload.records[bind.node_id] = record
        payload.kinds[bind.node_id] = bind.kind.data
    return payload
