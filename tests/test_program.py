"""Python programs against the operations interface: instances, tracing, the seed MLP.

One record per op (`CASES`) drives the instance checks: each program is traced to a graph, which
must pass verify-structure and infer-shapes; the eager instance must equal the reference
denotation of the traced graph exactly (both apply the same rule to the same inputs), in float64
and float32; the interval instance must give exactly the boxes `ibp` gives on the traced graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

import tlc
from tlc.dialect.families import UnaryOp
from tlc.dialect.printer import print_tlir
from tlc.dialect.registry import NODE_OPS
from tlc.frontends.text import context, parse_source
from tlc.passes.infer_shapes import InferShapesPass
from tlc.passes.verify_structure import VerifyStructurePass
from tlc.semantics.ibp import INTERVAL, ibp
from tlc.semantics.interpret import interpret
from tlc.semantics.program import INTERFACE, NOT_IN_INTERFACE, Ops, ProgramError, bounds, evaluate
from tlc.semantics.program_run import evaluate_program, lower_program, payload_from_params

W1 = np.array(
    [
        [0.15, -0.12, 0.08, 0.05],
        [0.02, 0.11, -0.09, 0.07],
        [-0.04, 0.06, 0.10, -0.03],
        [0.09, 0.01, 0.04, 0.13],
        [-0.07, 0.03, 0.12, -0.02],
    ]
)
B1 = np.array([0.01, -0.02, 0.03, 0.0, 0.02])
W2 = np.array(
    [
        [0.05, 0.08, -0.06, 0.03, 0.07],
        [-0.04, 0.02, 0.09, -0.01, 0.06],
        [0.10, -0.03, 0.04, 0.05, -0.08],
    ]
)
B2 = np.array([0.02, -0.01, 0.0])
SEED_PARAMS = {"W1": W1, "b1": B1, "W2": W2, "b2": B2}
X0 = np.array([0.3, -0.2, 0.1, 0.4])


def mlp(ops: Ops, x: Any, params: dict[str, np.ndarray]) -> Any:
    return ops.tanh(
        ops.sum(
            ops.linear(
                ops.relu(ops.linear(x, params["W1"], params["b1"])), params["W2"], params["b2"]
            )
        )
    )


MLP_TEXT = """\
tl.program @mlp(%x: [4]) params(%W1: [5, 4], %b1: [5], %W2: [3, 5], %b2: [3]) {
  %y = tanh(sum(linear(relu(linear(%x, %W1, %b1)), %W2, %b2)))
  return %y
}
"""

# -- the seed MLP ------------------------------------------------------------------------------


def test_seed_mlp_eagerly_and_on_its_traced_graph() -> None:
    assert f"{evaluate(mlp, X0, SEED_PARAMS):.6f}" == "0.027713"
    assert f"{evaluate(mlp, X0, SEED_PARAMS, np.float32):.6f}" == "0.027713"
    assert evaluate(mlp, X0, SEED_PARAMS, np.float32).dtype == np.float32
    traced = tlc.trace(mlp, input_shape=[4], params=SEED_PARAMS)
    table = interpret(traced.graph, traced.payload, X0)
    assert [f"{float(v):.6f}" for v in table.values[4:]] == ["0.027720", "0.027713"]


def test_seed_mlp_through_the_llvm_backend() -> None:
    jit = pytest.importorskip("tlc.codegen.jit")
    traced = tlc.trace(mlp, input_shape=[4], params=SEED_PARAMS)
    compiled = jit.compile_graph(traced.graph, traced.payload, np.float64)
    assert f"{float(compiled(X0)):.6f}" == "0.027713"


def test_seed_mlp_on_intervals_matches_ibp() -> None:
    box = bounds(mlp, X0 - 0.05, X0 + 0.05, SEED_PARAMS).box
    assert (f"{box.lo:.6f}", f"{box.hi:.6f}") == ("0.020772", "0.035625")


def test_trace_gives_the_six_node_graph_with_parameters_in_the_payload() -> None:
    traced = tlc.trace(mlp, input_shape=[4], params=SEED_PARAMS)
    assert [n.describe() for n in traced.graph.nodes] == [
        "input",
        "linear(payload=node_id)",
        "relu",
        "linear(payload=node_id)",
        "sum",
        "tanh",
    ]
    assert sorted(traced.payload.flat()) == ["1.bias", "1.weight", "3.bias", "3.weight"]
    np.testing.assert_array_equal(traced.payload[3]["weight"], W2)
    assert "0.15" not in print_tlir(traced.module)  # parameters are not graph data


# -- errors name the program line ---------------------------------------------------------------


def test_a_shape_error_names_the_program_line() -> None:
    def bad(ops: Ops, x: Any, params: Any) -> Any:
        h = ops.linear(x, params["W1"], params["b1"])
        return ops.add(h, x)  # [5] + [4]

    line = inspect.getsourcelines(bad)[1] + 2
    with pytest.raises(ProgramError) as info:
        tlc.trace(bad, [4], SEED_PARAMS)
    (diag,) = info.value.diagnostics
    assert diag.message == "add: shape mismatch: [5] vs [4]"
    assert (diag.location.file, diag.location.line) == (__file__, line)
    assert str(info.value).startswith(f"{__file__}:{line}:16: error: add: shape mismatch")
    assert "return ops.add(h, x)  # [5] + [4]" in str(info.value)


def test_a_parameter_mismatch_names_the_program_line() -> None:
    def swapped(ops: Ops, x: Any, params: Any) -> Any:
        return ops.linear(x, params["W2"], params["b2"])

    with pytest.raises(ProgramError) as info:
        tlc.trace(swapped, [4], SEED_PARAMS)
    (diag,) = info.value.diagnostics
    assert diag.message == (
        "IR eval: linear 1: weight shape [3, 5] does not match input shape [4] (in-dim 5 vs 4)"
    )
    assert diag.location.line == inspect.getsourcelines(swapped)[1] + 1


def test_raw_log_of_a_negative_value_fails_eagerly_at_the_call() -> None:
    def logs(ops: Ops, x: Any, params: Any) -> Any:
        return ops.log(x)

    with pytest.raises(ProgramError, match="IR eval: log: input contains values <= 0"):
        evaluate(logs, X0)


def test_unknown_metadata_is_reported() -> None:
    with pytest.raises(ProgramError, match="softmax: unknown metadata field 'axes'"):
        evaluate(lambda ops, x, p: ops.softmax(x, axes=0), X0)


# -- every op, through every instance ----------------------------------------------------------

Case = tuple[list[int], Callable[[Ops, Any, Any], Any], dict[str, tuple[int, ...]]]

CONV = {"stride": [2], "padding": [1]}
CASES: dict[str, Case] = {
    "const": ([3], lambda o, x, p: o.add(x, o.const(p["c"])), {"c": (3,)}),
    "permute": ([2, 3, 4], lambda o, x, p: o.permute(x, perm=[2, 0, 1]), {}),
    "transpose": ([2, 3, 4], lambda o, x, p: o.transpose(x, axis1=0, axis2=2), {}),
    "detach": ([3], lambda o, x, p: o.detach(x), {}),
    "rand_uniform": ([3], lambda o, x, p: o.add(x, o.rand_uniform(shape=[3], seed=7)), {}),
    "bernoulli_mask": (
        [3],
        lambda o, x, p: o.mul_elem(x, o.bernoulli_mask(o.sigmoid(o.sum(x)), shape=[3], seed=3)),
        {},
    ),
    "add": ([3], lambda o, x, p: o.add(x, p["a"]), {"a": (3,)}),
    "sub": ([3], lambda o, x, p: o.sub(p["a"], x), {"a": (3,)}),
    "mul_elem": ([3], lambda o, x, p: o.mul_elem(x, o.tanh(x)), {}),
    "max_elem": ([3], lambda o, x, p: o.max_elem(x, p["a"]), {"a": (3,)}),
    "min_elem": ([3], lambda o, x, p: o.min_elem(x, p["a"]), {"a": (3,)}),
    "abs": ([3], lambda o, x, p: o.abs(x), {}),
    "sqrt": ([3], lambda o, x, p: o.sqrt(o.abs(x)), {}),
    "relu": ([3], lambda o, x, p: o.relu(x), {}),
    "leaky_relu": (
        [3],
        lambda o, x, p: o.add(o.leaky_relu(x), o.leaky_relu(x, negative_slope=-0.5)),
        {},
    ),
    "tanh": ([3], lambda o, x, p: o.tanh(x), {}),
    "sigmoid": ([3], lambda o, x, p: o.sigmoid(x), {}),
    "softplus": ([3], lambda o, x, p: o.softplus(x), {}),
    "exp": ([3], lambda o, x, p: o.exp(x), {}),
    "log": ([3], lambda o, x, p: o.log(o.exp(x)), {}),
    "inv": ([3], lambda o, x, p: o.inv(o.exp(x)), {}),
    "sin": ([3], lambda o, x, p: o.sin(x), {}),
    "cos": ([3], lambda o, x, p: o.cos(x), {}),
    "gelu": ([3], lambda o, x, p: o.add(o.gelu(x), o.gelu(x, approximate="tanh")), {}),
    "max_pool": ([2, 4, 4], lambda o, x, p: o.max_pool(x, kernel=[2, 2]), {}),
    "avg_pool": ([2, 5], lambda o, x, p: o.avg_pool(x, kernel=[3], stride=[1], padding=[1]), {}),
    "broadcast_to": ([3], lambda o, x, p: o.broadcast_to(x, to=[2, 3]), {}),
    "reduce_sum": ([2, 3], lambda o, x, p: o.reduce_sum(x, axis=1), {}),
    "reduce_mean": ([2, 3], lambda o, x, p: o.reduce_mean(x, axis=0), {}),
    "sum": ([2, 3], lambda o, x, p: o.sum(x), {}),
    "matmul": ([2, 3], lambda o, x, p: o.matmul(x, p["m"]), {"m": (3, 4)}),
    "linear": (
        [2, 3],
        lambda o, x, p: o.linear(o.linear(x, p["w"], p["b"]), p["v"]),
        {"w": (4, 3), "b": (4,), "v": (2, 4)},
    ),
    "conv": (
        [2, 7],
        lambda o, x, p: o.conv(x, p["k"], p["kb"], **CONV),
        {"k": (4, 2, 3), "kb": (4,)},
    ),
    "batch_norm_eval": (
        [3, 2],
        lambda o, x, p: o.batch_norm_eval(x, p["g"], p["b"], p["m"], p["var"], p["eps"]),
        {"g": (3,), "b": (3,), "m": (3,), "var": (3,), "eps": ()},
    ),
    "safe_log": ([3], lambda o, x, p: o.safe_log(x, 1e-3), {}),
    "softmax": ([2, 3, 4], lambda o, x, p: o.softmax(x, axis=1), {}),
    "log_softmax": ([2, 3], lambda o, x, p: o.log_softmax(x, axis=0), {}),
    "hard_masked_softmax": (
        [2, 2],
        lambda o, x, p: o.hard_masked_softmax(x, allowed=[True, False, True, True]),
        {},
    ),
    "layernorm": (
        [2, 3],
        lambda o, x, p: o.add(o.layernorm(x, axis=0), o.layernorm(x, p["g"], p["b"], axis=1)),
        {"g": (3,), "b": (3,)},
    ),
    "reshape": ([2, 3], lambda o, x, p: o.reshape(x, to=[3, 2]), {}),
    "flatten": ([2, 3], lambda o, x, p: o.flatten(x), {}),
    "concat": ([2, 3], lambda o, x, p: o.concat(x, o.relu(x), x, axis=1), {}),
    "gather": ([2, 3], lambda o, x, p: o.gather(x, axis=1, indices=[2, 0, 2, 1]), {}),
    "div": ([3], lambda o, x, p: o.div(x, o.add(o.mul_elem(x, x), p["a"])), {"a": (3,)}),
    "prelu": ([3], lambda o, x, p: o.prelu(x, p["a"]), {"a": (3,)}),
    "pow": ([3], lambda o, x, p: o.add(o.pow(x, exponent=3.0), o.pow(o.abs(x), exponent=0.5)), {}),
    "pow_elem": ([3], lambda o, x, p: o.pow_elem(o.exp(x), o.tanh(x)), {}),  # a positive base
    "less": ([3], lambda o, x, p: o.mul_elem(o.less(x, p["a"]), x), {"a": (3,)}),
    "where": ([3], lambda o, x, p: o.where(o.less(x, p["a"]), x, o.neg(x)), {"a": (3,)}),
    "lrn": ([2, 3, 4], lambda o, x, p: o.lrn(x, size=3, alpha=0.5, k=2.0), {}),
    "pad": ([2, 3], lambda o, x, p: o.pad(x, before=[1, 0], after=[0, 2], mode="reflect"), {}),
    "mse_loss": ([3], lambda o, x, p: o.mse_loss(x, p["t"]), {"t": (3,)}),
    "sign": ([3], lambda o, x, p: o.sign(x), {}),
    "gelu_grad": ([3], lambda o, x, p: o.gelu_grad(x, approximate="tanh"), {}),
    "max_pool_grad": (
        [1, 4],
        lambda o, x, p: o.max_pool_grad(x, o.max_pool(x, kernel=[2]), kernel=[2]),
        {},
    ),
    "avg_pool_grad": ([1, 2], lambda o, x, p: o.avg_pool_grad(x, kernel=[2], shape=[1, 4]), {}),
    "conv_input_grad": (
        [4, 4],
        lambda o, x, p: o.conv_input_grad(
            x, p["k"], kernel=[3], in_channels=2, out_channels=4, **CONV, shape=[2, 7]
        ),
        {"k": (4, 2, 3)},
    ),
    "conv_weight_grad": (
        [2, 7],
        lambda o, x, p: o.conv_weight_grad(
            x, o.conv(x, p["k"], **CONV), kernel=[3], in_channels=2, out_channels=4, **CONV
        ),
        {"k": (4, 2, 3)},
    ),
}


#: An elementwise unary op with no case of its own is exercised as `o.<tag>(x)` at its metadata's
#: defaults: a new op defined by its facts needs no test here (docs/architecture.md).
for _tag, _op in INTERFACE.items():
    if _tag not in CASES and issubclass(_op, UnaryOp):
        CASES[_tag] = ([3], lambda o, x, p, tag=_tag: getattr(o, tag)(x), {})


def test_the_interface_covers_every_op() -> None:
    for op in NODE_OPS:
        assert (op in NOT_IN_INTERFACE) != (op.TAG in INTERFACE), op.TAG
        assert op in NOT_IN_INTERFACE or callable(getattr(Ops, op.TAG)), op.TAG
    assert sorted(CASES) == sorted(INTERFACE)


def _params(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, Any]:
    params = {k: rng.normal(size=s) for k, s in shapes.items()}
    for name in ("var", "eps"):  # batch norm's variance and eps must be positive
        if name in params:
            params[name] = np.abs(params[name]) + 0.1
    return params


@pytest.mark.parametrize("tag", sorted(CASES))
def test_every_op_traces_and_its_instances_agree(tag: str) -> None:
    shape, program, shapes = CASES[tag]
    rng = np.random.default_rng(len(tag))
    params = _params(shapes, rng)
    x = rng.normal(size=shape)
    traced = tlc.trace(program, shape, params, name=tag)
    assert tag in {n.TAG for n in traced.graph.nodes}
    VerifyStructurePass().apply(context(), traced.module)
    InferShapesPass().apply(context(), traced.module)
    for dtype in (np.float64, np.float32):
        eager = evaluate(program, x, params, dtype)
        table = interpret(traced.graph, traced.payload, x, dtype)
        np.testing.assert_array_equal(eager, table.output)
        assert eager.dtype == dtype
    box = bounds(program, x - 0.01, x + 0.01, params).box
    if any(type(n) in INTERVAL.unsupported for n in traced.graph.nodes):
        assert box is None  # no rule, no box
        return
    graph_box = ibp(traced.graph, traced.payload, x - 0.01, x + 0.01)[-1]
    assert (box is None) == (graph_box is None)
    if box is not None:
        np.testing.assert_array_equal(box.lo, graph_box.lo)
        np.testing.assert_array_equal(box.hi, graph_box.hi)


# -- the Python trace and the textual form -----------------------------------------------------


def _lowered(text: str) -> tuple[ModuleOp, Any]:
    module = parse_source(text, "program.tlir")
    lowered = lower_program(next(iter(module.ops)))  # type: ignore[arg-type]
    return ModuleOp([lowered.graph]), ModuleOp([lowered.graph.clone(), lowered.params])


def net(ops: Ops, x: Any, p: dict[str, np.ndarray]) -> Any:
    h = ops.layernorm(ops.linear(x, p["W"], p["b"]), p["g"], p["beta"], axis=1)
    c = ops.concat(ops.softmax(h, axis=0), ops.add(h, p["shift"]), axis=1)
    return ops.reduce_mean(ops.conv(c, p["K"], p["kb"], padding=[1], channel_axis=0), axis=0)


NET_TEXT = """\
tl.program @net(%x: [2, 4]) params(%W: [3, 4], %b: [3], %g: [3], %beta: [3], %shift: [2, 3],
                                   %K: [5, 2, 3], %kb: [5]) {
  %h = layernorm(linear(%x, %W, %b), %g, %beta) {axis = 1}
  %c = concat(softmax(%h) {axis = 0}, add(%h, %shift)) {axis = 1}
  %r = reduce_mean(conv(%c, %K, %kb) {padding = [1], channel_axis = 0}) {axis = 0}
  return %r
}
"""

NET_SHAPES = {
    "W": (3, 4),
    "b": (3,),
    "g": (3,),
    "beta": (3,),
    "shift": (2, 3),
    "K": (5, 2, 3),
    "kb": (5,),
}


@pytest.mark.parametrize(
    ("program", "text", "shape", "params"),
    [
        (mlp, MLP_TEXT, [4], SEED_PARAMS),
        (net, NET_TEXT, [2, 4], _params(NET_SHAPES, np.random.default_rng(0))),
    ],
)
def test_trace_and_text_lower_to_the_same_graph(
    program: Callable[..., Any], text: str, shape: list[int], params: dict[str, np.ndarray]
) -> None:
    traced = tlc.trace(program, shape, params)
    graph_module, with_params = _lowered(text)
    assert print_tlir(graph_module) == print_tlir(traced.module)
    from_names = payload_from_params(with_params, traced.graph.graph_name, params)
    assert from_names.kinds == traced.payload.kinds
    assert from_names.flat().keys() == traced.payload.flat().keys()
    for key, value in traced.payload.flat().items():
        np.testing.assert_array_equal(from_names.flat()[key], value)
    program_op = parse_source(text, "program.tlir").ops.first
    x = np.random.default_rng(1).normal(size=shape)
    np.testing.assert_array_equal(
        evaluate_program(program_op, params, x).result,
        evaluate(program, x, params),  # type: ignore[arg-type]
    )
