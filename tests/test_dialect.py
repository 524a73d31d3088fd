"""The `tl` dialect's op table: every op is complete (tag, arity, fields, lit test, docs) and its
shape rule gives TorchLean's results and messages.

Shape rules are exercised directly (`op.infer(parent_shapes)`), without parsing, so a failure
names the rule; the lit tests under tests/lit/ops/ cover the same rules through tlc-opt.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.dialect import ops, registry
from tlc.dialect.metadata import MAX_INT, Field, Kind, MetadataError, check_value
from tlc.dialect.shapes import Shape, ShapeError, can_broadcast_to, fmt_shape
from tlc.dialect.verify import infer_graph_shapes
from tlc.tools import opdoc

ROOT = Path(__file__).parent.parent

#: The graph IR's op kinds (TorchLean's 41 and the ones tlc adds), defined in
#: tlc.dialect.ops. The gradient-only ops of tlc.dialect.backward_ops belong to the grad pass
#: and are tested with it.
FORWARD_OPS = list(ops.FORWARD_OPS)


def make(op_class: type[ops.NodeOp], declared: Shape | None = None, **fields: Any) -> ops.NodeOp:
    """A parentless node of `op_class` (infer takes the parent shapes as an argument)."""
    given = {f.name: fields[f.name] for f in op_class.FIELDS if f.name in fields}
    for f in op_class.FIELDS:
        if f.name not in given and f.default is not None:
            given[f.name] = f.default_value(given, declared)
    return op_class(1, [], declared, given)


# -- the table is complete ---------------------------------------------------------------------


def test_every_op_has_tag_name_and_docstring() -> None:
    assert set(registry.OPS_BY_TAG) == {op.TAG for op in registry.NODE_OPS}
    for op in registry.NODE_OPS:
        assert op.name == f"tl.{op.TAG}"
        assert op.__doc__ and f"{op.TAG}" in op.__doc__, op.TAG
        low, high = op.ARITY
        assert high is None or low <= high


def test_every_op_has_a_lit_test_with_valid_and_invalid_cases() -> None:
    for op in FORWARD_OPS:
        path = ROOT / "tests" / "lit" / "ops" / f"{op.TAG}.tlir"
        assert path.exists(), f"no lit test for {op.TAG}"
        text = path.read_text()
        assert "// RUN: %roundtrip %s" in text
        assert "expected-error" in text and "// CHECK-LABEL:" in text, op.TAG
        assert "--verify-diagnostics" in text and "--check-prefix=ERR" in text, op.TAG


def test_the_op_reference_is_generated_from_the_definitions() -> None:
    """docs/dialect.md's op reference is `python -m tlc.tools.opdoc`'s output: regenerating it
    changes nothing, and it names every op kind and field."""
    assert opdoc.main(["--root", str(ROOT), "--check"]) == 0
    doc = (ROOT / "docs" / "dialect.md").read_text()
    for op in FORWARD_OPS:
        assert re.search(rf"^### `{op.TAG}`", doc, re.M), f"docs/dialect.md lacks {op.TAG}"
        for f in op.FIELDS:
            assert f"`{f.name}`" in doc, f"docs/dialect.md lacks field {f.name} of {op.TAG}"


# -- shape rules: valid cases --------------------------------------------------------------------

VALID: list[tuple[type[ops.NodeOp], dict[str, Any], Shape | None, list[Shape], Shape]] = [
    (ops.InputOp, {}, (4,), [], (4,)),
    (ops.ConstOp, {"shape": (2, 2)}, None, [], (2, 2)),
    (ops.ConstOp, {}, (3,), [], (3,)),
    (ops.PermuteOp, {"perm": (2, 0, 1)}, None, [(2, 3, 4)], (4, 2, 3)),
    (ops.TransposeOp, {"axis1": 0, "axis2": 2}, None, [(2, 3, 4)], (4, 3, 2)),
    (ops.RandUniformOp, {"seed": 1}, (3,), [], (3,)),
    (ops.BernoulliMaskOp, {"seed": 1}, (2, 2), [()], (2, 2)),
    (ops.AddOp, {}, None, [(2, 3), (2, 3)], (2, 3)),
    (ops.ReluOp, {}, None, [(2, 3)], (2, 3)),
    (ops.GeluOp, {"approximate": "tanh"}, None, [()], ()),
    (ops.MaxPoolOp, {"kernel": (2, 2)}, None, [(3, 8, 8)], (3, 4, 4)),
    (ops.AvgPoolOp, {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}, None,
     [(1, 3, 7, 7)], (1, 3, 4, 4)),
    (ops.BroadcastToOp, {"from": (2, 1), "to": (4, 2, 5)}, None, [(2, 1)], (4, 2, 5)),
    (ops.ReduceSumOp, {"axis": 1}, None, [(2, 3, 4)], (2, 4)),
    (ops.ReduceMeanOp, {"axis": 0}, None, [(5,)], ()),
    (ops.SumOp, {}, None, [(2, 3)], ()),
    (ops.MatmulOp, {}, None, [(5, 2, 3), (5, 3, 4)], (5, 2, 4)),
    (ops.LinearOp, {}, (7, 2), [(7, 4)], (7, 2)),
    (ops.ConvOp, {"kernel": (3, 3), "padding": (1, 1), "in_channels": 3, "out_channels": 4},
     None, [(3, 8, 8)], (4, 8, 8)),
    (ops.ConvOp, {"kernel": (3,), "dilation": (2,), "padding": (1,), "padding_after": (0,),
                  "in_channels": 1, "out_channels": 2}, None, [(1, 10)], (2, 7)),
    (ops.ConvOp, {"kernel": (3, 3), "stride": (2, 2), "channel_axis": 1, "groups": 3,
                  "in_channels": 3, "out_channels": 6}, None, [(2, 3, 8, 8)], (2, 6, 3, 3)),
    (ops.BatchNormEvalOp, {"channel_axis": 1, "channels": 3}, None, [(2, 3, 4)], (2, 3, 4)),
    (ops.SafeLogOp, {}, None, [(2, 3), ()], (2, 3)),
    (ops.SoftmaxOp, {"axis": 1}, None, [(2, 3, 4)], (2, 3, 4)),
    (ops.LogSoftmaxOp, {"axis": 1}, None, [(2, 3, 4)], (2, 3, 4)),
    (ops.LayernormOp, {"axis": 1}, None, [(2, 3, 4)], (2, 3, 4)),
    (ops.HardMaskedSoftmaxOp, {"mask_shape": (2,), "allowed": (True, False)}, None, [(2,)], (2,)),
    (ops.ReshapeOp, {"from": (2, 3), "to": (3, 2)}, None, [(2, 3)], (3, 2)),
    (ops.FlattenOp, {"shape": (2, 3, 4)}, None, [(2, 3, 4)], (24,)),
    (ops.ConcatOp, {"axis": 1}, None, [(2, 3, 4), (2, 5, 4)], (2, 8, 4)),
    (ops.ConcatOp, {"axis": 0}, None, [(2,), (3,), (1,)], (6,)),
    (ops.MseLossOp, {}, None, [(4,), (4,)], ()),
]  # fmt: skip


@pytest.mark.parametrize(("op_class", "fields", "declared", "parents", "out"), VALID)
def test_shape_rule(
    op_class: type[ops.NodeOp],
    fields: dict[str, Any],
    declared: Shape | None,
    parents: list[Shape],
    out: Shape,
) -> None:
    assert make(op_class, declared, **fields).infer(parents) == out


# -- shape rules: every message ------------------------------------------------------------------

INVALID: list[tuple[type[ops.NodeOp], dict[str, Any], Shape | None, list[Shape], str]] = [
    (ops.InputOp, {}, None, [], "input: the output shape must be declared"),
    (ops.PermuteOp, {"perm": (1, 1)}, None, [(2, 3)], "permute: duplicate axis 1 in [1, 1]"),
    (ops.PermuteOp, {"perm": (0, 2)}, None, [(2, 3)],
     "permute: axis 2 out of range for rank 2 in [0, 2]"),
    (ops.TransposeOp, {"axis1": 0, "axis2": 2}, None, [(2, 3)],
     "transpose: axis 2 out of range for rank 2"),
    (ops.BernoulliMaskOp, {"seed": 0}, (2,), [(1,)],
     "bernoulli_mask: expected scalar keepProb parent, got [1]"),
    (ops.SubOp, {}, None, [(2, 3), (3,)], "sub: shape mismatch: [2, 3] vs [3]"),
    (ops.MaxPoolOp, {"kernel": (2, 2)}, None, [(4,)],
     "max_pool: kernel rank 2 exceeds input rank 1"),
    (ops.AvgPoolOp, {"kernel": (2, 0)}, None, [(4, 4)], "avg_pool: kernel extents must be nonzero"),
    (ops.BroadcastToOp, {"from": (3,), "to": (3, 2)}, None, [(3,)],
     "broadcast_to: invalid broadcast from [3] to [3, 2]"),
    (ops.ReduceSumOp, {"axis": 3}, None, [(2, 3, 4)],
     "invalid or empty reduction axis 3 for shape [2, 3, 4]"),
    (ops.ReduceMeanOp, {"axis": 1}, None, [(2, 0)],
     "invalid or empty reduction axis 1 for shape [2, 0]"),
    (ops.MatmulOp, {}, None, [(2, 3), (4, 5)], "matmul: inner dims mismatch: 3 vs 4"),
    (ops.MatmulOp, {}, None, [(5, 2, 3), (6, 3, 4)],
     "matmul: leading dimensions mismatch: [5] vs [6]"),
    (ops.MatmulOp, {}, None, [(3,), (3, 4)], "matmul: expected rank≥2 inputs, got [3] and [3, 4]"),
    (ops.LinearOp, {}, (6, 2), [(7, 4)],
     "linear: leading dimensions must be preserved: input=[7, 4], outShape=[6, 2]"),
    (ops.ConvOp, {"kernel": (3,), "groups": 2, "in_channels": 3, "out_channels": 4}, None,
     [(3, 8)], "conv: in_channels=3 is not divisible by groups=2"),
    (ops.ConvOp, {"kernel": (3, 3), "in_channels": 3, "out_channels": 4}, None, [(2, 8, 8)],
     "conv: input-channel mismatch: op=3 vs input=2"),
    (ops.ConvOp, {"kernel": (3, 3), "dilation": (2, 2), "in_channels": 1, "out_channels": 1},
     None, [(1, 4, 4)],
     "conv: axis 1 window does not fit padded input: input=4, padding=(0, 0), effectiveKernel=5"),
    (ops.BatchNormEvalOp, {"channel_axis": 1, "channels": 4}, None, [(2, 3, 4)],
     "batch_norm_eval: channel mismatch: op=4 vs input=3"),
    (ops.SafeLogOp, {}, None, [(2,), (1,)], "safe_log: epsilon must be scalar, got [1]"),
    (ops.SoftmaxOp, {"axis": 3}, None, [(2, 3, 4)], "invalid axis 3 for rank 3"),
    (ops.LayernormOp, {"axis": 3}, None, [(2, 3, 4)], "invalid axis 3 for rank 3"),
    (ops.ReshapeOp, {"from": (2, 3), "to": (5,)}, None, [(2, 3)],
     "reshape: numel mismatch: 6 vs 5"),
    (ops.ConcatOp, {"axis": 1}, None, [(2, 3, 4), (2, 5, 3)],
     "concat: non-axis dim mismatch at axis 2: expected 4, got 3"),
    (ops.ConcatOp, {"axis": 0}, None, [(2, 3), (2, 3, 1)], "concat: rank mismatch"),
    (ops.ConcatOp, {"axis": 3}, None, [(2, 3, 4), (2, 5, 4)], "invalid axis 3 for rank 3"),
    (ops.MseLossOp, {}, None, [(4,), (3,)], "mse_loss: yhat/target shape mismatch: [4] vs [3]"),
]  # fmt: skip


@pytest.mark.parametrize(("op_class", "fields", "declared", "parents", "message"), INVALID)
def test_shape_rule_message(
    op_class: type[ops.NodeOp],
    fields: dict[str, Any],
    declared: Shape | None,
    parents: list[Shape],
    message: str,
) -> None:
    with pytest.raises(ShapeError) as info:
        make(op_class, declared, **fields).infer(parents)
    assert str(info.value) == message


# -- shape rules: properties ---------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=5)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shapes, st.data())
def test_concat_sums_the_axis_and_keeps_the_rest(shape: Shape, data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1))
    extents = data.draw(st.lists(dims, min_size=2, max_size=4))
    parents = [shape[:axis] + (e,) + shape[axis + 1 :] for e in extents]
    out = make(ops.ConcatOp, axis=axis).infer(parents)
    assert out == shape[:axis] + (sum(extents),) + shape[axis + 1 :]


@settings(max_examples=60, deadline=None)
@given(shapes, st.data())
def test_permute_then_inverse_is_identity(shape: Shape, data: st.DataObject) -> None:
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    inverse = tuple(perm.index(i) for i in range(len(perm)))
    out = make(ops.PermuteOp, perm=perm).infer([shape])
    assert make(ops.PermuteOp, perm=inverse).infer([out]) == shape


@settings(max_examples=60, deadline=None)
@given(shapes, st.data())
def test_axis_rules_accept_exactly_the_valid_axes(shape: Shape, data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(shape) + 2))
    for op_class in (ops.SoftmaxOp, ops.LogSoftmaxOp, ops.LayernormOp):
        node = make(op_class, axis=axis)
        if axis < len(shape):
            assert node.infer([shape]) == shape
        else:
            with pytest.raises(ShapeError, match=f"^invalid axis {axis} for rank {len(shape)}$"):
                node.infer([shape])
    if axis < len(shape):
        assert make(ops.ReduceSumOp, axis=axis).infer([shape]) == shape[:axis] + shape[axis + 1 :]


@settings(max_examples=60, deadline=None)
@given(shapes, shapes)
def test_broadcastable_matches_numpy(src: Shape, dst: Shape) -> None:
    np = pytest.importorskip("numpy")
    try:
        ok = np.broadcast_shapes(src, dst) == dst
    except ValueError:
        ok = False
    assert can_broadcast_to(src, dst) == ok


def test_pool_output_is_torch_formula() -> None:
    # floor((n + 2p - k) / s) + 1 per spatial axis, leading axes kept.
    node = make(ops.MaxPoolOp, kernel=(3, 2), stride=(2, 1), padding=(1, 0))
    assert node.infer([(5, 9, 6)]) == (5, (9 + 2 - 3) // 2 + 1, (6 - 2) // 1 + 1)


# -- describe and summary strings (quoted by diagnostics and listings) ---------------------------


def test_describe_strings_are_torchleans() -> None:
    assert make(ops.LinearOp, (5,)).describe() == "linear(payload=node_id)"
    assert make(ops.SoftmaxOp, axis=1).describe() == "softmax(axis=1)"
    assert make(ops.SafeLogOp).describe() == "safe_log(epsilon=scalar_parent)"
    assert (
        make(ops.BatchNormEvalOp, channel_axis=0, channels=3).describe()
        == "batch_norm_eval(channelAxis=0, channels=3, payload=node_id)"
    )
    assert make(ops.ReluOp).describe() == "relu"


def test_summary_quotes_id_kind_parents_and_declared_shape() -> None:
    node = make(ops.ReluOp, (4,))
    assert node.summary() == "Node(id=1, kind=relu, parents=#[], outShape=[4])"
    assert fmt_shape(None) == "?"


# -- metadata kinds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "value", "ok"),
    [
        (Kind.INT, 3, True),
        (Kind.INT, MAX_INT, True),
        (Kind.INT, MAX_INT + 1, False),
        (Kind.INT, -1, False),
        (Kind.INT, True, False),
        (Kind.INT, 1.0, False),
        (Kind.INTS, [0, 2], True),
        (Kind.INTS, [0, -2], False),
        (Kind.INTS, 3, False),
        (Kind.BOOLS, [True, False], True),
        (Kind.BOOLS, [1, 0], False),
        (Kind.STR, "x", True),
        (Kind.STR, 1, False),
        (Kind.FLOAT, 0.01, True),
        (Kind.FLOAT, 2, True),
        (Kind.FLOAT, True, False),
        (Kind.FLOAT, "0.1", False),
    ],
)
def test_check_value(kind: Kind, value: Any, ok: bool) -> None:
    field = Field("f", kind)
    if ok:
        check_value(field, value)
    else:
        with pytest.raises(MetadataError):
            check_value(field, value)


def test_infer_graph_shapes_fills_in_every_node() -> None:
    from tlc.frontends.text import parse_source

    module = parse_source(
        "tl.graph @g {\n  %0 = input : [2, 3, 4]\n  %1 = input : [2, 5, 4]\n"
        "  %2 = concat(%0, %1) {axis = 1}\n  %3 = layernorm(%2) {axis = 1}\n  output %3\n}\n",
        "g.tlir",
    )
    graph = next(iter(module.ops))
    assert isinstance(graph, ops.GraphOp)
    assert infer_graph_shapes(graph) == [(2, 3, 4), (2, 5, 4), (2, 8, 4), (2, 8, 4)]
