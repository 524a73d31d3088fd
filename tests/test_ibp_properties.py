"""Property tests of interval bound propagation: for random boxes and points inside them, every
node's value (float64 and float32 reference denotations) lies in the node's box.

Three generators: every op record of `op_records` (each op alone, random payloads), the backward
ops of gradient graphs, and random op chains over the ops with interval rules (random payloads,
binary ops joining earlier nodes, an optional reduction at the end). Points are the deterministic
samples of `tlc.semantics.containment` (centre, vertices, interior points). A sample whose
evaluation fails (raw log of a non-positive value, whose node then has no box) or overflows to a
non-finite value is skipped: boxes enclose real values, and inf/NaN are not real.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_records import RECORDS, OpRecord

from tlc.core.payload import Payload
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.semantics.containment import sample_inputs
from tlc.semantics.ibp import ibp
from tlc.semantics.interpret import EvalError, interpret
from tlc.semantics.interval_arith import Box

DTYPES = [np.float64, np.float32]
RADII = [0.0, 1e-7, 1e-3, 0.1, 0.7, 2.0]
SAMPLES = 12


def assert_contained(graph: GraphOp, payload: Payload, lo: list, hi: list, dtype: type) -> int:
    """Check sampled points against the boxes; returns how many (node, sample) pairs were
    checked, so a test can tell it did not skip everything."""
    boxes = ibp(graph, payload, lo, hi, dtype)
    inputs = {
        i: Box(np.asarray(a, float), np.asarray(b, float))
        for i, (a, b) in enumerate(zip(lo, hi, strict=True))
    }
    checked = 0
    for k, point in enumerate(sample_inputs(inputs, SAMPLES)):
        try:
            table = interpret(graph, payload, point, dtype)
        except EvalError:
            continue
        values = [np.asarray(v, dtype=np.float64) for v in table.values]
        if not all(np.all(np.isfinite(v)) for v in values):
            continue
        for nid, (box, value) in enumerate(zip(boxes, values, strict=True)):
            if box is None:
                continue
            inside = box.contains(value)
            assert inside.all(), (
                f"{graph.graph_name} ({np.dtype(dtype).name}): node {nid} "
                f"({graph.nodes[nid].TAG}) sample {k}: value {value[~inside]} outside "
                f"[{box.lo[~inside]}, {box.hi[~inside]}]"
            )
            checked += 1
    return checked


def _ball(xs: list[np.ndarray], radius: float) -> tuple[list, list]:
    return [np.asarray(x - radius) for x in xs], [np.asarray(x + radius) for x in xs]


# --------------------------------------------------------------------------------------------
# Every op alone (the shared op-record table)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rec", RECORDS, ids=[r.name for r in RECORDS])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    radius=st.sampled_from(RADII),
    scale=st.sampled_from([1.0, 0.01, 20.0]),
    dtype=st.sampled_from(DTYPES),
)
def test_op_boxes_hold_sampled_values(
    rec: OpRecord, seed: int, radius: float, scale: float, dtype: type
) -> None:
    xs, payload = rec.sample(np.random.default_rng(seed))
    lo, hi = _ball([np.asarray(x * scale) for x in xs], radius)
    assert_contained(rec.graph(), payload, lo, hi, dtype)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    radius=st.sampled_from(RADII),
    dtype=st.sampled_from(DTYPES),
)
def test_pow_elem_boxes_with_point_exponents_hold_sampled_values(
    seed: int, radius: float, dtype: type
) -> None:
    """pow_elem with a constant exponent (point boxes): integers of both signs and parities on
    bases of both signs and boxes holding 0, non-integers on positive bases; the cases the op
    records (positive bases, exponent boxes of width 2 radius) do not reach."""
    import tlc
    from tlc.api.evaluate import checked_graph, resolve_payload

    rng = np.random.default_rng(seed)
    integers = rng.choice([-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0], 6)
    exponents = np.concatenate([integers, rng.choice([0.5, -1.5, 2.25], 2)])
    module = tlc.parse(
        "tl.graph @g {\n  %0 = input : [8]\n  %1 = const : [8]\n  %2 = pow_elem(%0, %1)\n"
        "  output %2\n}\ntl.payload @g {\n  %1 = const {value = ["
        + ", ".join(repr(float(e)) for e in exponents)
        + "]}\n}\n"
    )
    graph = checked_graph(module)
    payload = resolve_payload(module, graph, None)
    # Non-integer powers on bases whose box stays above 0 (their domain), the rest anywhere.
    bases = np.concatenate([rng.normal(0.0, 2.0, 6), radius + rng.uniform(0.01, 3.0, 2)])
    lo, hi = _ball([bases], radius)
    assert assert_contained(graph, payload, lo, hi, dtype) > 0


# --------------------------------------------------------------------------------------------
# The backward ops of gradient graphs
# --------------------------------------------------------------------------------------------

_CONV = {"kernel": (3,), "stride": (2,), "padding": (1,), "dilation": (1,), "padding_after": (0,),
         "groups": 2, "channel_axis": 0, "in_channels": 2, "out_channels": 4}  # fmt: skip
_POOL = {"kernel": (2, 2), "stride": (1, 2), "padding": (1, 0)}

BACKWARD: list[tuple[str, type[NodeOp], tuple, tuple, dict]] = [
    ("sign", bw.SignOp, ((2, 3),), (2, 3), {}),
    ("gelu_grad", bw.GeluGradOp, ((2, 5),), (2, 5), {"approximate": "none"}),
    ("gelu_grad_tanh", bw.GeluGradOp, ((2, 5),), (2, 5), {"approximate": "tanh"}),
    ("avg_pool_grad", bw.AvgPoolGradOp, ((2, 4, 2),), (2, 3, 4), _POOL),
    ("conv_input_grad", bw.ConvInputGradOp, ((4, 4), (4, 1, 3)), (2, 8), _CONV),
    ("conv_weight_grad", bw.ConvWeightGradOp, ((2, 8), (4, 4)), (4, 1, 3), _CONV),
]


@pytest.mark.parametrize("case", BACKWARD, ids=[c[0] for c in BACKWARD])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), radius=st.sampled_from(RADII), dtype=st.sampled_from(DTYPES))
def test_backward_op_boxes_hold_sampled_values(
    case: tuple, seed: int, radius: float, dtype: type
) -> None:
    name, op, parents, out, fields = case
    inputs = [ops.InputOp(i, [], shape) for i, shape in enumerate(parents)]
    node = op(len(parents), [i.result for i in inputs], out, fields)
    graph = GraphOp(name, [*inputs, node, OutputOp(node.result)])
    rng = np.random.default_rng(seed)
    lo, hi = _ball([3 * rng.standard_normal(shape) for shape in parents], radius)
    assert assert_contained(graph, Payload(), lo, hi, dtype) > 0


# --------------------------------------------------------------------------------------------
# Random op chains
# --------------------------------------------------------------------------------------------

SHAPE = (2, 3)


@dataclass
class Chain:
    """A graph under construction: nodes in order, the payload, the node the chain is at."""

    rng: np.random.Generator
    nodes: list[NodeOp] = field(default_factory=list)
    payload: Payload = field(default_factory=Payload)

    def add(self, op: type[NodeOp], parents: list[NodeOp], out: tuple, **fields) -> NodeOp:  # noqa: ANN003
        node = op(len(self.nodes), [p.result for p in parents], out, fields)
        self.nodes.append(node)
        return node

    def record(self, node: NodeOp, **fields: np.ndarray) -> None:
        self.payload.records[node.id] = dict(fields)
        self.payload.kinds[node.id] = node.TAG

    def earlier(self) -> NodeOp:
        """A random earlier node of the chain's shape (to join with a binary op)."""
        same = [n for n in self.nodes if n.declared_shape == SHAPE]
        return same[int(self.rng.integers(len(same)))]


Step = Callable[[Chain, NodeOp], NodeOp]


def _unary(op: type[NodeOp], **fields) -> Step:  # noqa: ANN003
    return lambda c, x: c.add(op, [x], SHAPE, **fields)


def _binary(op: type[NodeOp]) -> Step:
    return lambda c, x: c.add(op, [x, c.earlier()], SHAPE)


def _linear(c: Chain, x: NodeOp) -> NodeOp:
    node = c.add(ops.LinearOp, [x], SHAPE)
    c.record(node, weight=c.rng.standard_normal((3, 3)), bias=c.rng.standard_normal(3))
    return node


def _matmul_const(c: Chain, x: NodeOp) -> NodeOp:
    const = c.add(ops.ConstOp, [], (3, 3), shape=(3, 3))
    c.record(const, value=c.rng.standard_normal(9))
    return c.add(ops.MatmulOp, [x, const], SHAPE)


def _batch_norm(c: Chain, x: NodeOp) -> NodeOp:
    node = c.add(ops.BatchNormEvalOp, [x], SHAPE, channel_axis=1, channels=3)
    c.record(node, gamma=c.rng.standard_normal(3), beta=c.rng.standard_normal(3),
             mean=c.rng.standard_normal(3), var=c.rng.uniform(0.1, 2, 3),
             eps=np.asarray(1e-5))  # fmt: skip
    return node


def _layernorm(c: Chain, x: NodeOp) -> NodeOp:
    axis = int(c.rng.integers(2))
    node = c.add(ops.LayernormOp, [x], SHAPE, axis=axis)
    c.record(node, gamma=c.rng.standard_normal(SHAPE[axis:]),
             beta=c.rng.standard_normal(SHAPE[axis:]))  # fmt: skip
    return node


def _masked_softmax(c: Chain, x: NodeOp) -> NodeOp:
    allowed = tuple(bool(b) for b in c.rng.integers(0, 2, 6))
    return c.add(ops.HardMaskedSoftmaxOp, [x], SHAPE, mask_shape=SHAPE, allowed=allowed)


def _transpose_twice(c: Chain, x: NodeOp) -> NodeOp:
    t = c.add(ops.TransposeOp, [x], SHAPE[::-1], axis1=0, axis2=1)
    return c.add(ops.PermuteOp, [t], SHAPE, perm=(1, 0))


def _safe_log(c: Chain, x: NodeOp) -> NodeOp:
    eps = c.add(ops.ConstOp, [], (), shape=())
    c.record(eps, value=np.asarray([c.rng.uniform(1e-6, 0.5)]))
    return c.add(ops.SafeLogOp, [x, eps], SHAPE)


STEPS: dict[str, Step] = {
    **{op.TAG: _unary(op) for op in (
        ops.AbsOp, ops.ReluOp, ops.TanhOp, ops.SigmoidOp, ops.SoftplusOp, ops.ExpOp, ops.SinOp,
        ops.CosOp, ops.SqrtOp, ops.LogOp, ops.InvOp, ops.DetachOp, bw.SignOp)},
    "gelu": _unary(ops.GeluOp, approximate="none"),
    "gelu_tanh": _unary(ops.GeluOp, approximate="tanh"),
    "gelu_grad": _unary(bw.GeluGradOp, approximate="none"),
    **{op.TAG: _binary(op) for op in (
        ops.AddOp, ops.SubOp, ops.MulElemOp, ops.MaxElemOp, ops.MinElemOp)},
    "softmax": lambda c, x: c.add(ops.SoftmaxOp, [x], SHAPE, axis=int(c.rng.integers(2))),
    "log_softmax": lambda c, x: c.add(ops.LogSoftmaxOp, [x], SHAPE, axis=int(c.rng.integers(2))),
    "hard_masked_softmax": _masked_softmax,
    "layernorm": _layernorm,
    "linear": _linear,
    "matmul": _matmul_const,
    "batch_norm_eval": _batch_norm,
    "transpose": _transpose_twice,
    "safe_log": _safe_log,
}  # fmt: skip

ENDS: dict[str, Step | None] = {
    "none": None,
    "sum": lambda c, x: c.add(ops.SumOp, [x], ()),
    "reduce_mean": lambda c, x: c.add(ops.ReduceMeanOp, [x], (2,), axis=1),
    "reduce_sum": lambda c, x: c.add(ops.ReduceSumOp, [x], (3,), axis=0),
    "mse_loss": lambda c, x: c.add(ops.MseLossOp, [x, c.earlier()], ()),
}


def build_chain(steps: list[str], end: str, seed: int) -> tuple[GraphOp, Payload]:
    chain = Chain(np.random.default_rng(seed))
    x = chain.add(ops.InputOp, [], SHAPE)
    for name in steps:
        x = STEPS[name](chain, x)
    finish = ENDS[end]
    if finish is not None:
        x = finish(chain, x)
    return GraphOp("chain", [*chain.nodes, OutputOp(x.result)]), chain.payload


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=6),
    end=st.sampled_from(sorted(ENDS)),
    seed=st.integers(0, 2**32 - 1),
    radius=st.sampled_from(RADII),
    dtype=st.sampled_from(DTYPES),
)
def test_random_chains_hold_sampled_values(
    steps: list[str], end: str, seed: int, radius: float, dtype: type
) -> None:
    graph, payload = build_chain(steps, end, seed)
    centre = np.random.default_rng(seed + 1).standard_normal(SHAPE)
    lo, hi = _ball([centre], radius)
    assert_contained(graph, payload, lo, hi, dtype)
