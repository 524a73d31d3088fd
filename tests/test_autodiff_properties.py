"""Property tests of tlc.jvp / tlc.vjp on random graphs (hypothesis draws the structure).

A random graph grows from one input by steps drawn from `STEPS` (elementwise ops, fan-out into
binary ops, linear layers, matmul with a const parameter, normalisations, reductions, layout ops,
concat, conv and pooling, safe_log, mse_loss), each step also giving its PyTorch counterpart, so
the same graph and payload run in torch.autograd. Values come from a numpy generator seeded by
hypothesis (structure is what is searched; values are Gaussian). Checked, in float64:

- <u, J v> = <J^T u, v> with parameters moving too (rel 1e-9: two summation orders);
- J v against central differences, relative error < 1e-6 (h = 1e-6 in a random direction;
  random Gaussian values sit on a kink with probability ~0, and structural ties such as
  max_elem(a, a) are smooth along every direction);
- J^T u and the parameter cotangents against torch.autograd (rel 1e-8);
- the gradient graph in the reference denotation against the numeric VJP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.passes.grad import build_grad_graph
from tlc.semantics.autodiff.modes import jvp, vjp
from tlc.semantics.autodiff.rules import PARAMS
from tlc.semantics.interpret import interpret

TorchStep = Callable[[Any, list[Any], dict[str, Any]], Any]


@dataclass
class RandomGraph:
    """A graph under construction, its payload, and the torch program computing the same."""

    rng: np.random.Generator
    nodes: list[NodeOp] = field(default_factory=list)
    payload: Payload = field(default_factory=Payload)
    torch_steps: list[tuple[TorchStep, list[int]]] = field(default_factory=list)

    def shape(self, nid: int) -> tuple[int, ...]:
        shape = self.nodes[nid].declared_shape
        assert shape is not None
        return shape

    def add(
        self,
        cls: type[NodeOp],
        parents: list[int],
        torch_fn: TorchStep,
        fields: dict[str, Any] | None = None,
        shape: tuple[int, ...] | None = None,
        record: dict[str, np.ndarray] | None = None,
    ) -> int:
        nid = len(self.nodes)
        values = [self.nodes[p].result for p in parents]
        if shape is None:
            probe = cls(nid, [], None, fields)
            shape = probe.infer([self.shape(p) for p in parents])
        self.nodes.append(cls(nid, values, shape, fields))
        if record is not None:
            self.payload.records[nid] = record
            self.payload.kinds[nid] = cls.TAG
        self.torch_steps.append((torch_fn, parents))
        return nid

    def const(self, shape: tuple[int, ...], values: np.ndarray) -> int:
        return self.add(
            ops.ConstOp,
            [],
            lambda t, xs, r: r["value"].reshape(shape),
            {"shape": shape},
            shape,
            {"value": values},
        )

    def graph(self, out: int) -> GraphOp:
        return GraphOp("random", [*self.nodes, OutputOp(self.nodes[out].result)])

    def torch_run(self, t: Any, x: Any, params: dict[int, dict[str, Any]]) -> Any:
        values: list[Any] = []
        for nid, (fn, parents) in enumerate(self.torch_steps):
            values.append(
                x if nid == 0 else fn(t, [values[p] for p in parents], params.get(nid, {}))
            )
        return values


# --------------------------------------------------------------------------------------------
# Steps: each picks its parents among the nodes so far and appends one op (maybe a const too)
# --------------------------------------------------------------------------------------------

UNARY: dict[type[NodeOp], Callable[[Any, Any], Any]] = {
    ops.TanhOp: lambda t, x: t.tanh(x),
    ops.SigmoidOp: lambda t, x: t.sigmoid(x),
    ops.SinOp: lambda t, x: t.sin(x),
    ops.CosOp: lambda t, x: t.cos(x),
    ops.SoftplusOp: lambda t, x: t.nn.functional.softplus(x),
    ops.ReluOp: lambda t, x: t.relu(x),
    ops.AbsOp: lambda t, x: t.abs(x),
    ops.ExpOp: lambda t, x: t.exp(x),
}

BINARY: dict[type[NodeOp], Callable[[Any, Any, Any], Any]] = {
    ops.AddOp: lambda t, a, b: a + b,
    ops.SubOp: lambda t, a, b: a - b,
    ops.MulElemOp: lambda t, a, b: a * b,
    ops.MaxElemOp: lambda t, a, b: t.maximum(a, b),
    ops.MinElemOp: lambda t, a, b: t.minimum(a, b),
}


def _unary(draw: Any, g: RandomGraph, a: int) -> int:
    cls = draw(st.sampled_from(sorted(UNARY, key=lambda c: c.TAG)))
    if cls is ops.ExpOp:  # keep exp's argument bounded so values stay O(1)
        a = g.add(ops.TanhOp, [a], lambda t, xs, r: t.tanh(xs[0]))
    fn = UNARY[cls]
    return g.add(cls, [a], lambda t, xs, r: fn(t, xs[0]))


def _gelu(draw: Any, g: RandomGraph, a: int) -> int:
    form = draw(st.sampled_from(["none", "tanh"]))
    return g.add(
        ops.GeluOp,
        [a],
        lambda t, xs, r: t.nn.functional.gelu(xs[0], approximate=form),
        {"approximate": form},
    )


def _binary(draw: Any, g: RandomGraph, a: int) -> int:
    same = [i for i in range(len(g.nodes)) if g.shape(i) == g.shape(a)]
    b = draw(st.sampled_from(same))
    cls = draw(st.sampled_from(sorted(BINARY, key=lambda c: c.TAG)))
    fn = BINARY[cls]
    return g.add(cls, [a, b], lambda t, xs, r: fn(t, xs[0], xs[1]))


def _linear(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if not shape:
        return _unary(draw, g, a)
    out = draw(st.integers(1, 4))
    record = {"weight": g.rng.standard_normal((out, shape[-1])) / np.sqrt(shape[-1])}
    if draw(st.booleans()):
        record["bias"] = g.rng.standard_normal(out)
    return g.add(
        ops.LinearOp,
        [a],
        lambda t, xs, r: t.nn.functional.linear(xs[0], r["weight"], r.get("bias")),
        shape=shape[:-1] + (out,),
        record=record,
    )


def _axis_op(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if not shape:
        return _unary(draw, g, a)
    axis = draw(st.integers(0, len(shape) - 1))
    kind = draw(st.sampled_from(["softmax", "log_softmax", "layernorm", "batch_norm"]))
    if kind == "softmax":
        return g.add(ops.SoftmaxOp, [a], lambda t, xs, r: t.softmax(xs[0], axis), {"axis": axis})
    if kind == "log_softmax":
        fn = lambda t, xs, r: t.log_softmax(xs[0], axis)  # noqa: E731
        return g.add(ops.LogSoftmaxOp, [a], fn, {"axis": axis})
    if kind == "layernorm":
        suffix = shape[axis:]
        record = None
        if draw(st.booleans()):
            record = {
                "gamma": 1 + 0.3 * g.rng.standard_normal(suffix),
                "beta": g.rng.standard_normal(suffix),
                "eps": np.array(0.01),
            }

        def layernorm(t: Any, xs: list[Any], r: dict[str, Any]) -> Any:
            eps = float(r["eps"]) if "eps" in r else 1e-5
            return t.nn.functional.layer_norm(xs[0], suffix, r.get("gamma"), r.get("beta"), eps)

        return g.add(ops.LayernormOp, [a], layernorm, {"axis": axis}, record=record)
    channels = shape[axis]
    record = {
        "gamma": 1 + 0.3 * g.rng.standard_normal(channels),
        "beta": g.rng.standard_normal(channels),
        "mean": g.rng.standard_normal(channels),
        "var": g.rng.uniform(0.5, 2.0, channels),
        "eps": np.array(1e-3),
    }
    view = [1] * len(shape)
    view[axis] = channels

    def batch_norm(t: Any, xs: list[Any], r: dict[str, Any]) -> Any:
        def c(name: str) -> Any:
            return r[name].reshape(view)

        return (xs[0] - c("mean")) / t.sqrt(c("var") + r["eps"]) * c("gamma") + c("beta")

    fields = {"channel_axis": axis, "channels": channels}
    return g.add(ops.BatchNormEvalOp, [a], batch_norm, fields, record=record)


def _reduce(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if len(shape) < 2:
        return g.add(ops.SumOp, [a], lambda t, xs, r: xs[0].sum())
    axis = draw(st.integers(0, len(shape) - 1))
    if draw(st.booleans()):
        return g.add(ops.ReduceSumOp, [a], lambda t, xs, r: xs[0].sum(axis), {"axis": axis})
    return g.add(ops.ReduceMeanOp, [a], lambda t, xs, r: xs[0].mean(axis), {"axis": axis})


def _layout(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    kind = draw(st.sampled_from(["reshape", "broadcast", "transpose", "permute", "flatten"]))
    if kind == "broadcast" or not shape:
        to = (2, *shape)
        fields = {"from": shape, "to": to}
        return g.add(ops.BroadcastToOp, [a], lambda t, xs, r: xs[0].expand(to), fields)
    if kind == "flatten":
        return g.add(ops.FlattenOp, [a], lambda t, xs, r: xs[0].reshape(-1), {"shape": shape})
    if kind == "reshape" or len(shape) < 2:
        to = (int(np.prod(shape)), 1)
        fields = {"from": shape, "to": to}
        return g.add(ops.ReshapeOp, [a], lambda t, xs, r: xs[0].reshape(to), fields)
    if kind == "transpose":
        fields = {"axis1": 0, "axis2": len(shape) - 1}
        return g.add(ops.TransposeOp, [a], lambda t, xs, r: xs[0].transpose(0, -1), fields)
    perm = tuple(reversed(range(len(shape))))
    return g.add(ops.PermuteOp, [a], lambda t, xs, r: xs[0].permute(*perm), {"perm": perm})


def _concat(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if not shape:
        return _unary(draw, g, a)
    axis = draw(st.integers(0, len(shape) - 1))
    others = [
        i
        for i in range(len(g.nodes))
        if len(g.shape(i)) == len(shape)
        and all(d == e for k, (d, e) in enumerate(zip(g.shape(i), shape, strict=True)) if k != axis)
    ]
    b = draw(st.sampled_from(others))
    return g.add(ops.ConcatOp, [a, b], lambda t, xs, r: t.cat(xs, axis), {"axis": axis})


def _matmul(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if len(shape) != 2:
        return _linear(draw, g, a)
    p = draw(st.integers(1, 3))
    w = g.const((shape[1], p), g.rng.standard_normal(shape[1] * p))
    return g.add(ops.MatmulOp, [a, w], lambda t, xs, r: xs[0] @ xs[1])


def _conv_or_pool(draw: Any, g: RandomGraph, a: int) -> int:
    shape = g.shape(a)
    if len(shape) != 2 or shape[1] < 2:
        return _unary(draw, g, a)
    kind = draw(st.sampled_from(["conv", "max_pool", "avg_pool"]))
    if kind == "conv":
        cin, cout = shape[0], draw(st.integers(1, 3))
        fields = {
            "kernel": (2,), "stride": (1,), "padding": (1,), "dilation": (1,),
            "padding_after": (1,), "groups": 1, "channel_axis": 0,
            "in_channels": cin, "out_channels": cout,
        }  # fmt: skip
        record = {
            "weight": g.rng.standard_normal((cout, cin, 2)),
            "bias": g.rng.standard_normal(cout),
        }

        def conv(t: Any, xs: list[Any], r: dict[str, Any]) -> Any:
            y = t.nn.functional.conv1d(xs[0][None], r["weight"], r["bias"], padding=1)
            return y[0]

        return g.add(ops.ConvOp, [a], conv, fields, (cout, shape[1] + 1), record)
    fields = {"kernel": (2,), "stride": (1,), "padding": (0,)}

    def pooled(t: Any, xs: list[Any], r: dict[str, Any]) -> Any:
        return getattr(t.nn.functional, f"{kind}1d")(xs[0][None], 2, 1)[0]

    cls = ops.MaxPoolOp if kind == "max_pool" else ops.AvgPoolOp
    return g.add(cls, [a], pooled, fields)


def _safe_log(draw: Any, g: RandomGraph, a: int) -> int:
    eps = g.const((), g.rng.uniform(0.1, 1.0, 1))
    fn = lambda t, xs, r: t.log(t.nn.functional.softplus(xs[0]) + xs[1])  # noqa: E731
    return g.add(ops.SafeLogOp, [a, eps], fn)


STEPS = [_unary, _gelu, _binary, _linear, _axis_op, _reduce, _layout, _concat, _matmul]
STEPS += [_conv_or_pool, _safe_log]


@st.composite
def random_graphs(draw: Any) -> tuple[RandomGraph, int, np.ndarray]:
    g = RandomGraph(np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    shape = draw(st.sampled_from([(4,), (2, 3), (3, 4), (2, 3, 2)]))
    g.add(ops.InputOp, [], lambda t, xs, r: None, shape=shape)
    last = 0
    for _ in range(draw(st.integers(1, 6))):
        parent = draw(st.sampled_from([last, last, draw(st.integers(0, last))]))
        last = draw(st.sampled_from(STEPS))(draw, g, parent)
    if draw(st.booleans()) and g.shape(last):
        target = g.const(g.shape(last), g.rng.standard_normal(int(np.prod(g.shape(last)))))
        last = g.add(ops.MseLossOp, [last, target], lambda t, xs, r: t.nn.functional.mse_loss(*xs))
    return g, last, g.rng.standard_normal(shape)


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _params(g: RandomGraph) -> dict[int, dict[str, np.ndarray]]:
    return {
        nid: {k: v for k, v in rec.items() if k in PARAMS[type(g.nodes[nid])]}
        for nid, rec in g.payload.items()
    }


def _param_directions(g: RandomGraph, seed: int) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        nid: {k: rng.standard_normal(v.shape) for k, v in fields.items()}
        for nid, fields in _params(g).items()
    }


def _moved(g: RandomGraph, w: dict[int, dict[str, np.ndarray]], h: float) -> Payload:
    moved = Payload({k: dict(r) for k, r in g.payload.items()}, dict(g.payload.kinds))
    for nid, fields in w.items():
        for name, direction in fields.items():
            moved.records[nid][name] = g.payload[nid][name] + h * direction
    return moved


@PROPERTY
@given(random_graphs(), st.integers(0, 2**16))
def test_vjp_is_the_transpose_of_jvp(case: tuple, seed: int) -> None:
    g, out, x = case
    graph = g.graph(out)
    rng = np.random.default_rng(seed)
    v, w = rng.standard_normal(x.shape), _param_directions(g, seed + 1)
    y, tangent = jvp(graph, g.payload, x, v, w)
    u = rng.standard_normal(y.shape)
    dx, dp = vjp(graph, g.payload, x, u)
    lhs = float(np.sum(u * tangent))
    rhs = float(np.sum(dx * v))
    rhs += sum(float(np.sum(dp[n][k] * d)) for n, f in w.items() for k, d in f.items())
    assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-10)


@PROPERTY
@given(random_graphs(), st.integers(0, 2**16))
def test_jvp_matches_central_differences(case: tuple, seed: int) -> None:
    g, out, x = case
    graph = g.graph(out)
    rng = np.random.default_rng(seed)
    v, w = rng.standard_normal(x.shape), _param_directions(g, seed + 1)
    _, tangent = jvp(graph, g.payload, x, v, w)
    h = 1e-6

    def f(step: float) -> np.ndarray:
        return interpret(graph, _moved(g, w, step), x + step * v).output

    fd = (f(h) - f(-h)) / (2 * h)
    error = np.max(np.abs(fd - tangent)) / max(float(np.max(np.abs(tangent))), 1e-3)
    assert error < 1e-6


@PROPERTY
@given(random_graphs(), st.integers(0, 2**16))
def test_vjp_matches_torch_autograd(case: tuple, seed: int) -> None:
    torch = pytest.importorskip("torch")
    g, out, x = case
    graph = g.graph(out)
    y = interpret(graph, g.payload, x).output
    u = np.random.default_rng(seed).standard_normal(y.shape)
    dx, dp = vjp(graph, g.payload, x, u)

    tx = torch.tensor(x, requires_grad=True)
    params = {
        nid: {
            k: torch.tensor(v, requires_grad=k in PARAMS[type(g.nodes[nid])]) for k, v in r.items()
        }
        for nid, r in g.payload.items()
    }
    ty = g.torch_run(torch, tx, params)[out]
    np.testing.assert_allclose(ty.detach().numpy(), y, rtol=1e-10, atol=1e-12)
    if ty.requires_grad:
        ty.backward(torch.tensor(u))

    def grad_of(tensor: Any) -> np.ndarray:
        return np.zeros(tuple(tensor.shape)) if tensor.grad is None else tensor.grad.numpy()

    np.testing.assert_allclose(dx, grad_of(tx), rtol=1e-8, atol=1e-10)
    for nid, fields in _params(g).items():
        for name in fields:
            expected = grad_of(params[nid][name])
            np.testing.assert_allclose(dp[nid][name], expected, rtol=1e-8, atol=1e-10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_gradient_graph_matches_vjp(case: tuple) -> None:
    g, out, x = case
    graph = g.graph(out)
    grad, grad_payload, layout = build_grad_graph(graph, g.payload)
    pieces = layout.unpack(interpret(grad, grad_payload, x).output)
    dx, dp = vjp(graph, g.payload, x)
    np.testing.assert_allclose(pieces["input"], dx, rtol=1e-13, atol=1e-15)
    for nid, fields in dp.items():
        for name, value in fields.items():
            np.testing.assert_allclose(pieces[f"%{nid}.{name}"], value, rtol=1e-13, atol=1e-15)
