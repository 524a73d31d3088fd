"""Differential tests: random well-shaped graphs, compiled (JIT and shared library) vs reference.

A graph is a chain grown from one input: each step applies a random op to the latest value
(binary ops pair it with an earlier value of the same shape), so every op with a lowering meets
inputs produced by other ops. Tolerances: f64 rtol 1e-9 / atol 1e-10 and f32 rtol 2e-3 /
atol 2e-4: each op agrees with the reference to a few ulp or the summation-order tolerance of
tests/op_records.py; the bound allows that error to be amplified along a chain of up to eight
ops (softmax/layernorm/linear have gains of order 1-10 on the sampled ranges).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.codegen.jit import compile_graph
from tlc.codegen.loader import load
from tlc.codegen.shared_lib import build_library
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.semantics.interpret import interpret

TOL = {np.float64: {"rtol": 1e-9, "atol": 1e-10}, np.float32: {"rtol": 2e-3, "atol": 2e-4}}

UNARY = [ops.AbsOp, ops.ReluOp, ops.TanhOp, ops.SigmoidOp, ops.SoftplusOp, ops.SinOp, ops.CosOp,
         ops.GeluOp, ops.DetachOp, ops.LeakyReluOp]  # fmt: skip
BINARY = [ops.AddOp, ops.SubOp, ops.MulElemOp, ops.MaxElemOp, ops.MinElemOp]


class Builder:
    """Grows a graph node by node, keeping shapes and payload records."""

    def __init__(self, shape: tuple[int, ...]):
        self.nodes: list[NodeOp] = [ops.InputOp(0, [], shape)]
        self.payload = Payload()
        self.rng = np.random.default_rng(len(shape))

    @property
    def last(self) -> NodeOp:
        return self.nodes[-1]

    def shape(self, node: NodeOp) -> tuple[int, ...]:
        return node.declared_shape

    def add(self, cls, parents, shape, fields=None, record=None) -> None:
        node = cls(len(self.nodes), [p.result for p in parents], shape, fields)
        if record is not None:
            self.payload.records[node.id] = record
        self.nodes.append(node)

    def graph(self) -> GraphOp:
        return GraphOp("rand", [*self.nodes, OutputOp(self.last.result)])


def step(draw, b: Builder) -> None:
    x = b.last
    s = b.shape(x)
    r = len(s)
    kinds = ["unary", "binary", "linear", "softmax", "layernorm", "batch_norm", "broadcast"]
    if r >= 2:
        kinds += ["reduce", "transpose", "matmul", "pool", "conv", "flatten"]
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        cls = draw(st.sampled_from(UNARY))
        fields = {
            ops.GeluOp: {"approximate": draw(st.sampled_from(["none", "tanh"]))},
            ops.LeakyReluOp: {"negative_slope": draw(st.sampled_from([0.01, 0.2, 1.5, -0.5]))},
        }
        b.add(cls, [x], s, fields.get(cls))
    elif kind == "binary":
        same = [n for n in b.nodes if b.shape(n) == s]
        b.add(draw(st.sampled_from(BINARY)), [x, draw(st.sampled_from(same))], s)
    elif kind == "linear":
        n = draw(st.integers(1, 6))
        rec = {"weight": b.rng.normal(size=(n, s[-1])) / np.sqrt(s[-1])}
        if draw(st.booleans()):
            rec["bias"] = b.rng.normal(size=n)
        b.add(ops.LinearOp, [x], (*s[:-1], n), record=rec)
    elif kind == "softmax":
        cls = draw(st.sampled_from([ops.SoftmaxOp, ops.LogSoftmaxOp]))
        b.add(cls, [x], s, {"axis": draw(st.integers(0, r - 1))})
    elif kind == "layernorm":
        axis = draw(st.integers(0, r - 1))
        rec = {"gamma": b.rng.normal(size=s[axis:]), "beta": b.rng.normal(size=s[axis:])}
        b.add(ops.LayernormOp, [x], s, {"axis": axis}, rec if draw(st.booleans()) else None)
    elif kind == "batch_norm":
        axis = draw(st.integers(0, r - 1))
        c = s[axis]
        rec = {"gamma": b.rng.normal(size=c), "beta": b.rng.normal(size=c),
               "mean": b.rng.normal(size=c), "var": b.rng.uniform(0.5, 2, size=c)}  # fmt: skip
        b.add(ops.BatchNormEvalOp, [x], s, {"channel_axis": axis, "channels": c}, rec)
    elif kind == "broadcast":
        to = (draw(st.integers(1, 3)), *s)
        b.add(ops.BroadcastToOp, [x], to, {"from": s, "to": to})
    elif kind == "reduce":
        axis = draw(st.integers(0, r - 1))
        cls = draw(st.sampled_from([ops.ReduceSumOp, ops.ReduceMeanOp]))
        b.add(cls, [x], s[:axis] + s[axis + 1 :], {"axis": axis})
    elif kind == "transpose":
        perm = list(draw(st.permutations(range(r))))
        b.add(ops.PermuteOp, [x], tuple(s[p] for p in perm), {"perm": tuple(perm)})
    elif kind == "matmul":
        perm = list(range(r))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        t = tuple(s[p] for p in perm)
        b.add(ops.TransposeOp, [x], t, {"axis1": r - 2, "axis2": r - 1})
        b.add(ops.MatmulOp, [x, b.last], (*s[:-1], s[-2]))
    elif kind == "pool":
        cls = draw(st.sampled_from([ops.MaxPoolOp, ops.AvgPoolOp]))
        k = draw(st.integers(1, min(2, s[-1])))
        pad = draw(st.integers(0, k // 2))
        out = (*s[:-1], ops.pool_out_dim(s[-1], k, 1, pad))
        b.add(cls, [x], out, {"kernel": (k,), "stride": (1,), "padding": (pad,)})
    elif kind == "conv":
        cin, cout, k = s[-2], draw(st.integers(1, 3)), draw(st.integers(1, min(3, s[-1] + 2)))
        pad = draw(st.integers(0, 1))
        if s[-1] + 2 * pad < k:
            pad = 1
        n_out = ops.conv_out_dim(s[-1], k, 1, 1, pad, pad)
        fields = {"kernel": (k,), "stride": (1,), "dilation": (1,), "groups": 1,
                  "padding": (pad,), "padding_after": (pad,),
                  "channel_axis": r - 2, "in_channels": cin, "out_channels": cout}  # fmt: skip
        rec = {"weight": b.rng.normal(size=(cout, cin, k)) / np.sqrt(cin * k),
               "bias": b.rng.normal(size=cout)}  # fmt: skip
        b.add(ops.ConvOp, [x], (*s[:-2], cout, n_out), fields, rec)
    else:
        b.add(ops.FlattenOp, [x], (int(np.prod(s)),), {"shape": s})


@st.composite
def graphs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    b = Builder(shape)
    for _ in range(draw(st.integers(1, 6))):
        step(draw, b)
    if draw(st.booleans()):
        b.add(ops.SumOp, [b.last], ())
    x = np.random.default_rng(draw(st.integers(0, 1000))).normal(size=shape)
    return b.graph(), b.payload, x


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from([np.float64, np.float32]))
def test_jit_matches_reference(case, dtype) -> None:
    graph, payload, x = case
    expected = interpret(graph, payload, x, dtype).output
    got = compile_graph(graph, payload, dtype)(x.astype(dtype))
    np.testing.assert_allclose(got, expected, **TOL[dtype])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(graphs(), st.sampled_from([np.float64, np.float32]))
def test_shared_library_matches_reference(tmp_path: Path, case, dtype) -> None:
    graph, payload, x = case
    expected = interpret(graph, payload, x, dtype).output
    built = build_library([(graph, payload)], str(tmp_path / "librand.so"), dtype)
    got = load(built.library)(x.astype(dtype))
    np.testing.assert_allclose(got, expected, **TOL[dtype])
