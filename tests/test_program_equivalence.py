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

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.diagnostics import DiagnosticError
from tlc.dialect.program_ops import ProgramOp
from tlc.frontend import parse_source
from tlc.passes.interpret import interpret
from tlc.program_run import evaluate_program, lower_program, payload_from_params

#: Raw `log` three times over, so that many programs fail on a non-positive value.
UNARY = ["relu", "tanh", "sigmoid", "softplus", "exp", "log", "log", "log", "abs", "sqrt",
         "sin", "cos", "inv", "detach", "sign"]  # fmt: skip
BINARY = ["add", "sub", "mul_elem", "max_elem", "min_elem"]


class Gen:
    """Builds one random program: values in scope with their shapes, declared parameters."""

    def __init__(self, draw: st.DrawFn, shape: tuple[int, ...]):
        self.draw = draw
        self.values: list[tuple[str, tuple[int, ...]]] = [("%x", shape)]
        self.params: dict[str, tuple[int, ...]] = {}

    def param(self, shape: tuple[int, ...]) -> str:
        name = f"%p{len(self.params)}"
        self.params[name] = shape
        return name

    def same_shape(self, shape: tuple[int, ...]) -> str:
        """Another operand of `shape`: a value in scope, or a new parameter (a const node)."""
        matches = [n for n, s in self.values if s == shape]
        if matches and self.draw(st.booleans()):
            return self.draw(st.sampled_from(matches))
        return self.param(shape)

    def step(self, expr: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        """Apply one random op to `expr` (of `shape`); returns the new expression and shape."""
        d = self.draw
        rank = len(shape)
        choices = ["unary", "unary", "binary", "linear", "sum", "softmax", "layernorm"]
        if rank >= 1:
            choices += ["reduce", "concat", "flatten", "reshape", "safe_log", "mse"]
        if rank >= 2:
            choices += ["transpose", "matmul"]
        kind = d(st.sampled_from(choices))
        if kind == "unary":
            return f"{d(st.sampled_from(UNARY))}({expr})", shape
        if kind == "binary":
            other = self.same_shape(shape)
            args = (expr, other) if d(st.booleans()) else (other, expr)
            return f"{d(st.sampled_from(BINARY))}({args[0]}, {args[1]})", shape
        if kind == "linear":
            if rank == 0:
                return f"relu({expr})", shape
            out = d(st.integers(1, 4))
            w = self.param((out, shape[-1]))
            bias = f", {self.param((out,))}" if d(st.booleans()) else ""
            return f"linear({expr}, {w}{bias})", shape[:-1] + (out,)
        if kind == "sum":
            return f"sum({expr})", ()
        if kind in ("softmax", "layernorm"):
            if rank == 0:
                return f"tanh({expr})", shape
            axis = d(st.integers(0, rank - 1))
            if kind == "layernorm" and d(st.booleans()):
                g, b = self.param(shape[axis:]), self.param(shape[axis:])
                return f"layernorm({expr}, {g}, {b}) {{axis = {axis}}}", shape
            op = kind if kind == "layernorm" else d(st.sampled_from(["softmax", "log_softmax"]))
            return f"{op}({expr}) {{axis = {axis}}}", shape
        if kind == "reduce":
            axis = d(st.integers(0, rank - 1))
            op = d(st.sampled_from(["reduce_sum", "reduce_mean"]))
            return f"{op}({expr}) {{axis = {axis}}}", shape[:axis] + shape[axis + 1 :]
        if kind == "concat":
            axis = d(st.integers(0, rank - 1))
            other = self.same_shape(shape)
            out = tuple(s * 2 if i == axis else s for i, s in enumerate(shape))
            return f"concat({expr}, {other}) {{axis = {axis}}}", out
        if kind == "flatten":
            return f"flatten({expr})", (int(np.prod(shape)),)
        if kind == "reshape":
            n = int(np.prod(shape))
            to = (1, n) if d(st.booleans()) else (n,)
            return f"reshape({expr}) {{to = [{', '.join(map(str, to))}]}}", to
        if kind == "safe_log":
            return f"safe_log({expr}, {self.param(())})", shape
        if kind == "mse":
            return f"mse_loss({expr}, {self.same_shape(shape)})", ()
        if kind == "transpose":
            a, b = d(st.integers(0, rank - 1)), d(st.integers(0, rank - 1))
            out = list(shape)
            out[a], out[b] = shape[b], shape[a]
            return f"transpose({expr}) {{axis1 = {a}, axis2 = {b}}}", tuple(out)
        p = d(st.integers(1, 3))
        w = self.param(shape[:-2] + (shape[-1], p))
        return f"matmul({expr}, {w})", shape[:-1] + (p,)


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, ...]], tuple[int, ...], int]:
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    gen = Gen(draw, shape)
    lets = []
    for i in range(draw(st.integers(1, 5))):
        expr, s = draw(st.sampled_from(gen.values))
        for _ in range(draw(st.integers(1, 3))):  # nested calls
            expr, s = gen.step(expr, s)
        annotation = f" : [{', '.join(map(str, s))}]" if draw(st.booleans()) else ""
        lets.append(f"  %v{i} = {expr}{annotation}")
        gen.values.append((f"%v{i}", s))
    head = f"tl.program @p(%x: [{', '.join(map(str, shape))}])"
    if gen.params:
        decls = ", ".join(f"{n}: [{', '.join(map(str, s))}]" for n, s in gen.params.items())
        head += f" params({decls})"
    text = "\n".join([head + " {", *lets, f"  return {gen.values[-1][0]}", "}"]) + "\n"
    return text, gen.params, shape, draw(st.integers(0, 2**32 - 1))


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return fn(), None
    except DiagnosticError as exc:
        return None, [(d.message, d.location) for d in exc.diagnostics]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_program_equals_its_lowered_graph(case) -> None:  # type: ignore[no-untyped-def]
    text, declared, shape, seed = case
    module = parse_source(text, "random.tlir")
    (program,) = [op for op in module.ops if isinstance(op, ProgramOp)]
    rng = np.random.default_rng(seed)
    params = {n[1:]: rng.normal(size=s) for n, s in declared.items()}
    x = rng.normal(size=shape)
    lowered = lower_program(program)
    payload = payload_from_params(_module_of(lowered), "p", params)
    for dtype in (np.float64, np.float32):
        run, run_error = _outcome(lambda: evaluate_program(program, params, x, dtype))  # noqa: B023
        table, graph_error = _outcome(lambda: interpret(lowered.graph, payload, x, dtype))  # noqa: B023
        assert run_error == graph_error, text
        if run is None:
            continue
        for name, node in lowered.let_nodes.items():
            np.testing.assert_array_equal(run.lets[name], table[node], err_msg=f"{text}%{name}")
            assert run.lets[name].dtype == table[node].dtype
        np.testing.assert_array_equal(run.result, table.output)


def _module_of(lowered):  # type: ignore[no-untyped-def]
    from xdsl.dialects.builtin import ModuleOp

    return ModuleOp([lowered.graph, lowered.params])
