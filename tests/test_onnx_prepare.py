"""What the ONNX import does before mapping nodes (tlc.frontends.onnx_prepare): the checker,
opset conversion, input shapes, shape inference and constant folding, and the one diagnostic
that lists every unsupported op type and attribute.

Values are compared with ONNX's reference evaluator (`onnx.reference`) on the model as given,
in float64: rtol 1e-10 (the same arithmetic in a different order).
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.dialect.shapes import BATCH  # noqa: E402
from tlc.frontends.onnx_prepare import UnsupportedNodes, prepare, unsupported_report  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

D = TensorProto.DOUBLE


def model(nodes, inputs, output="y", initializers=(), opset=13, ir_version=7, out_shape=None):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, D, s) for n, s in inputs],
        [helper.make_tensor_value_info(output, D, out_shape)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers],  # lists: int64
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def refusal(m, shapes=None) -> str:
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(m, shapes)
    return str(info.value)


def matches_reference(m, x: np.ndarray, shapes=None) -> tlc.Traced:
    traced = tlc.from_onnx(m, shapes)
    (expected,) = ReferenceEvaluator(m).run(None, {m.graph.input[0].name: x})
    got = interpret(traced.graph, traced.payload, x).output
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    return traced


def nhwc_model() -> onnx.ModelProto:
    """What TensorFlow converters and `torch.onnx.export` with a dynamic batch write: NHWC input
    with a symbolic batch, Transposes to and from NCHW, and the batch read back by
    Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Transpose", ["r"], ["u"], perm=[0, 2, 3, 1]),
        helper.make_node("Shape", ["u"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["u", "target"], ["y"]),
    ]
    inits = [("w", rng.normal(size=(4, 3, 3, 3))), ("zero", np.array(0, np.int64)),
             ("axes", [0]), ("minus_one", [-1])]  # fmt: skip
    return model(nodes, [("x", ("N", 6, 6, 3))], initializers=inits, out_shape=("N", 64))


def test_symbolic_batch_imports_as_n_or_with_a_fixed_shape() -> None:
    m = nhwc_model()
    rng = np.random.default_rng(1)
    for batch in (1, 2, 5):  # the batch read back by Shape/Gather folds to N
        traced = matches_reference(m, rng.normal(size=(batch, 6, 6, 3)))
    assert traced.graph.nodes[0].declared_shape == (BATCH, 6, 6, 3)
    assert traced.graph.nodes[-1].describe() == "reshape(from=[N, 4, 4, 4], to=[N, 64])"
    traced = matches_reference(m, rng.normal(size=(2, 6, 6, 3)), [(2, 6, 6, 3)])
    tags = [n.TAG for n in traced.graph.nodes]
    assert tags == ["input", "permute", "conv", "relu", "permute", "reshape"]  # shapes folded
    assert traced.graph.nodes[-1].declared_shape == (2, 64)


def test_a_symbolic_batch_folded_into_values_is_refused() -> None:
    """`y = x * batch_size`: the batch read back as a number becomes a constant, which differs
    between the two batch sizes the importer tries."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["f"], to=D),
        helper.make_node("Mul", ["x", "f"], ["y"]),
    ]
    m = model(nodes, [("x", ("batch", 3))], initializers=[("zero", np.array(0, np.int64))])
    assert refusal(m) == (
        "ONNX import: the model's symbolic batch dimension does not stay the batch: the payload "
        "of node 1 (const) value differs at batch size 2 and at 3; give static input shapes "
        "(tlc-translate --input-shape, tlc.from_onnx(..., input_shapes=[...]))"
    )
    assert tlc.from_onnx(m, [(4, 3)]).graph.nodes[0].declared_shape == (4, 3)


def test_prepare_leaves_the_callers_model_alone() -> None:
    m = nhwc_model()
    before = m.SerializeToString()
    prepared = prepare(m, "m", 13, [(2, 6, 6, 3)]).model
    assert m.SerializeToString() == before
    assert [n.op_type for n in prepared.graph.node] == [
        "Transpose", "Conv", "Relu", "Transpose", "Reshape"
    ]  # fmt: skip


def test_old_opsets_are_converted() -> None:
    """An opset-7 model (the age of the public model collections): Gemm, Dropout and a
    ConstantOfShape-made bias, as the zoo files are written."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["b_shape"], ["b"],
            value=numpy_helper.from_array(np.array([0.5]), "v"),
        ),
        helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
        helper.make_node("Dropout", ["g"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]  # fmt: skip
    inits = [("w", rng.normal(size=(3, 4))), ("b_shape", np.array([3], np.int64))]
    m = model(nodes, [("x", (2, 4))], initializers=inits, opset=9, ir_version=4)
    traced = matches_reference(m, rng.normal(size=(2, 4)))
    assert [n.TAG for n in traced.graph.nodes] == ["input", "linear", "relu"]


def test_constants_casts_and_identities_fold() -> None:
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.arange(4.0))),
        helper.make_node("Cast", ["k"], ["k32"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["k32"], ["k64"], to=TensorProto.DOUBLE),
        helper.make_node("Identity", ["k64"], ["k2"]),
        helper.make_node("Mul", ["k2", "k2"], ["sq"]),
        helper.make_node("Identity", ["x"], ["xi"]),
        helper.make_node("Dropout", ["xi", "", "train"], ["xd", "mask"]),  # mask unread
        helper.make_node("Add", ["xd", "sq"], ["y"]),
    ]
    m = model(nodes, [("x", (4,))], initializers=[("train", np.array(False))])
    traced = matches_reference(m, np.array([1.0, -2.0, 3.0, 0.5]))
    assert [n.TAG for n in traced.graph.nodes] == ["input", "const", "add"]


def test_folding_runs_to_the_fixed_point() -> None:
    """Twelve Pads whose pads are computed from the shape of the previous one (as swin's
    per-block padding is): shape inference reveals one more each round, and all fold."""
    nodes, last = [], "x"
    for i in range(12):
        nodes += [
            helper.make_node("Shape", [last], [f"s{i}"]),
            helper.make_node("Div", [f"s{i}", f"s{i}"], [f"one{i}"]),
            helper.make_node("Concat", [f"one{i}", f"one{i}"], [f"pads{i}"], axis=0),
            helper.make_node("Pad", [last, f"pads{i}"], [f"p{i}"]),
        ]
        last = f"p{i}"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    m = model(nodes, [("x", (2,))])
    traced = matches_reference(m, np.array([1.0, -2.0]))
    assert [n.TAG for n in traced.graph.nodes].count("pad") == 12


def test_training_dropout_is_not_removed() -> None:
    nodes = [helper.make_node("Dropout", ["x", "", "train"], ["y"], name="drop")]
    m = model(nodes, [("x", (4,))], initializers=[("train", np.array(True))])
    assert refusal(m) == (
        "ONNX import: '<onnx model>' uses 1 unsupported op type:\n  Dropout: 1 node ('drop')"
    )


def test_every_unsupported_op_is_listed_at_once() -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["e0"], name="hard0")]
    nodes += [helper.make_node("Hardmax", [f"e{i}"], [f"e{i + 1}"], name=f"hard{i + 1}")
              for i in range(6)]  # fmt: skip
    nodes += [
        helper.make_node("Shrink", ["e6"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("ThresholdedRelu", ["r"], ["y"], name="thresholded"),
    ]
    assert refusal(model(nodes, [("x", (3,))])) == (
        "ONNX import: '<onnx model>' uses 3 unsupported op types:\n"
        "  Hardmax: 7 nodes ('hard0', 'hard1', 'hard2', 'hard3', 'hard4', ... (2 more))\n"
        "  Shrink: 1 node (#7)\n"
        "  ThresholdedRelu: 1 node ('thresholded')"
    )


def test_unsupported_attributes_and_domains_are_listed() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="a"),
        helper.make_node("Softmax", ["r"], ["s"], axis=0, name="b"),
        helper.make_node("Custom", ["s"], ["y"], domain="com.example", name="c"),
    ]
    m = model(nodes, [("x", (3,))])
    report = unsupported_report(m, {"Relu": frozenset(), "Softmax": frozenset()}, "m.onnx")
    assert isinstance(report, UnsupportedNodes)
    assert report.gaps == {"com.example.Custom": ["c"], "Softmax attribute 'axis'": ["b"]}
    assert str(report) == (
        "ONNX import: 'm.onnx' uses 1 unsupported op type and 1 unsupported attribute:\n"
        "  com.example.Custom: 1 node ('c')\n"
        "  Softmax attribute 'axis': 1 node ('b')"
    )
    assert (
        unsupported_report(m, {"Relu": frozenset(), "Softmax": {"axis"}, "Custom": set()}, "m.onnx")
        is not None
    )  # fmt: skip  (the domain still counts)


def test_malformed_model_is_a_diagnostic() -> None:
    m = model([helper.make_node("Relu", ["nowhere"], ["y"], name="act")], [("x", (3,))])
    assert refusal(m) == (
        "ONNX import: '<onnx model>' is not a valid ONNX model: Nodes in a graph must be "
        "topologically sorted, however input 'nowhere' of node: name: act OpType: Relu is not "
        "output of any previous nodes."
    )


def test_failed_conversion_says_what_was_tried() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], broadcast=1)]
    inits = [("w", np.ones((4, 2))), ("c", np.ones(2))]
    m = model(nodes, [("x", (1, 1, 2, 2))], initializers=inits, opset=6, ir_version=4)
    message = refusal(m)
    assert message.startswith(
        "ONNX import: '<onnx model>' is opset 6; the importer maps opset 13 and later, and "
        "onnx.version_converter could not convert it to opset 13: "
    )
    assert "Gemm input A must have exactly 2 dimensions" in message


@pytest.mark.parametrize(
    ("inputs", "name", "text", "bad", "reason"),
    [
        # Found by fuzzing: onnx.checker raised UnicodeDecodeError when its complaint quoted a
        # name that is not UTF-8 (here an undefined input; protobuf strings must be UTF-8).
        (["QQQQ"], "", b"QQQQ", b"Q\xcfQQ", "invalid continuation byte"),
        # Found by tlc.tools.fuzz: protobuf hands such a string over as bytes, and the checker
        # does not read the graph name: `re.sub` raised TypeError on it.
        (["x"], "GRAPHNAME", b"GRAPHNAME", b"GRAPH\x8dAME", "invalid start byte"),
    ],
)
def test_a_string_that_is_not_utf8_is_a_diagnostic(
    tmp_path, inputs: list[str], name: str, text: bytes, bad: bytes, reason: str
) -> None:
    data = model([helper.make_node("Relu", inputs, ["y"], name="r")], [("x", (3,))])
    if name:
        data.graph.name = name
    path = tmp_path / "bad.onnx"
    path.write_bytes(data.SerializeToString().replace(text, bad))
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(str(path))
    assert info.value.diagnostics[0].message == (
        f"ONNX import: '{path}' is not a valid ONNX model: a string is not UTF-8 ({reason})"
    )
