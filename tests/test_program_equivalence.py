"""Equivalence of a textual program and its lowered graph, value for value, errors included.

Hypothesis writes random well-typed programs (.tlir text) over a fragment of the interface:
elementwise unary and binary ops (raw `log` included, so many programs fail on negative
values), linear layers, parameters read as values (`const` nodes), reductions, softmax /
log_softmax / layernorm on any axis, transpose, reshape, flatten, concat, matmul, safe_log and
mse_loss, with nested calls as well as lets. Each program is parsed, evaluated by its own
evaluator (`evaluate_program`) and lowered (`lower_program`); the lowered graph is run by the
reference denotation (`interpret`) with the payload built from the same parameters by name.
Every `let` must equal the value of the node it lowered to, bit for bit (both sides apply the
same reference rules to the same inputs in the same order, so no tolerance is needed), and a
failure must be the same diagnostic at the same location on both sides. Checked in float64 and
float32; 300 programs per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp

import tlc
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect.printer import print_tlir
from tlc.dialect.program_ops import ProgramOp
from tlc.frontends.text import parse_source
from tlc.semantics.interpret import interpret
from tlc.semantics.program_run import evaluate_program, lower_program, payload_from_params

#: Raw `log` three times over, so that many programs fail on a non-positive value.
UNARY = ["relu", "tanh", "sigmoid", "softplus", "exp", "log", "log", "log", "abs", "sqrt",
         "sin", "cos", "inv", "detach", "sign"]  # fmt: skip
BINARY = ["add", "sub", "mul_elem", "max_elem", "min_elem"]


Shape = tuple[int, ...]


@dataclass(frozen=True)
class E:
    """One expression in both forms: .tlir text and the same calls in Python."""

    tl: str
    py: str


def call(tag: str, *args: E, **fields: object) -> E:
    tl = f"{tag}({', '.join(a.tl for a in args)})"
    if fields:
        tl += " {" + ", ".join(f"{k} = {v}" for k, v in fields.items()) + "}"
    py_args = [a.py for a in args] + [f"{k}={v!r}" for k, v in fields.items()]
    return E(tl, f"ops.{tag}({', '.join(py_args)})")


class Gen:
    """Builds one random program: values in scope with their shapes, declared parameters."""

    def __init__(self, draw: st.DrawFn, shape: Shape):
        self.draw = draw
        self.values: list[tuple[E, Shape]] = [(E("%x", "x"), shape)]
        self.params: dict[str, Shape] = {}

    def param(self, shape: Shape) -> E:
        name = f"p{len(self.params)}"
        self.params[name] = shape
        return E(f"%{name}", f"p[{name!r}]")

    def same_shape(self, shape: Shape) -> E:
        """Another operand of `shape`: a value in scope, or a new parameter (a const node)."""
        matches = [e for e, s in self.values if s == shape]
        if matches and self.draw(st.booleans()):
            return self.draw(st.sampled_from(matches))
        return self.param(shape)

    def step(self, expr: E, shape: Shape) -> tuple[E, Shape]:
        """Apply one random op to `expr` (of `shape`); returns the new expression and shape."""
        d = self.draw
        rank = len(shape)
        choices = ["unary", "unary", "binary", "linear", "sum", "softmax", "layernorm"]
        if rank >= 1:
            choices += ["reduce", "concat", "flatten", "reshape", "safe_log", "mse"]
        if rank >= 2:
            choices += ["transpose", "matmul"]
        kind = d(st.sampled_from(choices))
        if kind == "unary" or (rank == 0 and kind in ("linear", "softmax", "layernorm")):
            return call(d(st.sampled_from(UNARY)), expr), shape
        if kind == "binary":
            other = self.same_shape(shape)
            args = (expr, other) if d(st.booleans()) else (other, expr)
            return call(d(st.sampled_from(BINARY)), *args), shape
        if kind == "linear":
            out = d(st.integers(1, 4))
            w = self.param((out, shape[-1]))
            bias = [self.param((out,))] if d(st.booleans()) else []
            return call("linear", expr, w, *bias), shape[:-1] + (out,)
        if kind == "sum":
            return call("sum", expr), ()
        if kind in ("softmax", "layernorm"):
            axis = d(st.integers(0, rank - 1))
            if kind == "layernorm" and d(st.booleans()):
                g, b = self.param(shape[axis:]), self.param(shape[axis:])
                return call("layernorm", expr, g, b, axis=axis), shape
            op = kind if kind == "layernorm" else d(st.sampled_from(["softmax", "log_softmax"]))
            return call(op, expr, axis=axis), shape
        if kind == "reduce":
            axis = d(st.integers(0, rank - 1))
            op = d(st.sampled_from(["reduce_sum", "reduce_mean"]))
            return call(op, expr, axis=axis), shape[:axis] + shape[axis + 1 :]
        if kind == "concat":
            axis = d(st.integers(0, rank - 1))
            out = tuple(s * 2 if i == axis else s for i, s in enumerate(shape))
            return call("concat", expr, self.same_shape(shape), axis=axis), out
        if kind == "flatten":
            return call("flatten", expr), (int(np.prod(shape)),)
        if kind == "reshape":
            n = int(np.prod(shape))
            to = [1, n] if d(st.booleans()) else [n]
            return call("reshape", expr, to=to), tuple(to)
        if kind == "safe_log":
            return call("safe_log", expr, self.param(())), shape
        if kind == "mse":
            return call("mse_loss", expr, self.same_shape(shape)), ()
        if kind == "transpose":
            a, b = d(st.integers(0, rank - 1)), d(st.integers(0, rank - 1))
            out = list(shape)
            out[a], out[b] = shape[b], shape[a]
            return call("transpose", expr, axis1=a, axis2=b), tuple(out)
        p = d(st.integers(1, 3))
        return call("matmul", expr, self.param(shape[:-2] + (shape[-1], p))), shape[:-1] + (p,)


@dataclass
class Case:
    text: str  # the .tlir program
    python: str  # the same program as a Python function `prog(ops, x, p)`
    params: dict[str, Shape]
    shape: Shape
    seed: int


def _dims(shape: Shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


@st.composite
def programs(draw: st.DrawFn) -> Case:
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    gen = Gen(draw, shape)
    lets, body = [], []
    for i in range(draw(st.integers(1, 5))):
        expr, s = draw(st.sampled_from(gen.values))
        for _ in range(draw(st.integers(1, 3))):  # nested calls
            expr, s = gen.step(expr, s)
        annotation = f" : {_dims(s)}" if draw(st.booleans()) else ""
        lets.append(f"  %v{i} = {expr.tl}{annotation}")
        body.append(f"    v{i} = {expr.py}")
        gen.values.append((E(f"%v{i}", f"v{i}"), s))
    head = f"tl.program @p(%x: {_dims(shape)})"
    if gen.params:
        head += " params(" + ", ".join(f"%{n}: {_dims(s)}" for n, s in gen.params.items()) + ")"
    result = gen.values[-1][0]
    text = "\n".join([head + " {", *lets, f"  return {result.tl}", "}"]) + "\n"
    python = "\n".join(["def p(ops, x, p):", *body, f"    return {result.py}"]) + "\n"
    return Case(text, python, gen.params, shape, draw(st.integers(0, 2**32 - 1)))


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return fn(), None
    except DiagnosticError as exc:
        return None, [(d.message, d.location) for d in exc.diagnostics]


def _inputs(case: Case) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(case.seed)
    return {n: rng.normal(size=s) for n, s in case.params.items()}, rng.normal(size=case.shape)


def _program(case: Case) -> ProgramOp:
    (program,) = parse_source(case.text, "random.tlir").ops
    assert isinstance(program, ProgramOp)
    return program


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_program_equals_its_lowered_graph(case: Case) -> None:
    program = _program(case)
    params, x = _inputs(case)
    lowered = lower_program(program)
    payload = payload_from_params(ModuleOp([lowered.graph, lowered.params]), "p", params)
    for dtype in (np.float64, np.float32):
        run, run_error = _outcome(lambda: evaluate_program(program, params, x, dtype))  # noqa: B023
        table, graph_error = _outcome(lambda: interpret(lowered.graph, payload, x, dtype))  # noqa: B023
        assert run_error == graph_error, case.text
        if run is None:
            continue
        for name, node in lowered.let_nodes.items():
            np.testing.assert_array_equal(run.lets[name], table[node], err_msg=case.text + name)
            assert run.lets[name].dtype == table[node].dtype
        np.testing.assert_array_equal(run.result, table.output)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_python_trace_and_text_lower_to_the_same_graph(case: Case) -> None:
    """The same calls written in Python and traced give the graph and payload of the text."""
    namespace: dict[str, object] = {}
    exec(compile(case.python, "random_program.py", "exec"), namespace)
    params, x = _inputs(case)
    traced = tlc.trace(namespace["p"], case.shape, params)  # type: ignore[arg-type]
    lowered = lower_program(_program(case))
    assert print_tlir(ModuleOp([lowered.graph.clone()])) == print_tlir(traced.module), case.python
    payload = payload_from_params(ModuleOp([lowered.graph, lowered.params]), "p", params)
    assert payload.kinds == traced.payload.kinds
    flat, traced_flat = payload.flat(), traced.payload.flat()
    assert flat.keys() == traced_flat.keys()
    for key, value in traced_flat.items():
        np.testing.assert_array_equal(flat[key], value)
