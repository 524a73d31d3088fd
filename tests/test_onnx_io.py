"""The ONNX importer's I/O boundary: integer and float16 tensors held as reals (checked on each
run by `Traced.check_values`), and models with several outputs (one tl graph per output).

Values are compared with ONNX's reference evaluator (`onnx.reference`) exactly: integer
arithmetic within the checked range is exact in float64, and max/min of float16 values select
one of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.dialect.printer import print_tlir  # noqa: E402
from tlc.frontends.onnx_backend import TlcBackend  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402


def model_of(nodes, inputs, outputs, initializers=(), opset=21) -> onnx.ModelProto:
    """`inputs`/`outputs`: (name, element type, shape)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, n) for n, v in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def unchecked(traced, x):
    """A run's values without `tlc.run`'s check of them (which `check_values` then does)."""
    return interpret(traced.graph, traced.payload, x).values


def refusal(model) -> str:
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(model)
    return str(info.value)


I8, I64, U8, F16 = TensorProto.INT8, TensorProto.INT64, TensorProto.UINT8, TensorProto.FLOAT16

#: (x + y) * x - 3 on INT8, an integer computation every intermediate of which is an int8.
ARITHMETIC = model_of(
    [
        helper.make_node("Add", ["x", "y"], ["s"]),
        helper.make_node("Mul", ["s", "x"], ["p"]),
        helper.make_node("Sub", ["p", "three"], ["z"]),
    ],
    [("x", I8, [4]), ("y", I8, [4])],
    [("z", I8, [4])],
    [("three", np.array(3, np.int8))],
)


def test_integer_arithmetic_is_onnx_s_where_every_value_is_of_its_type() -> None:
    traced = tlc.from_onnx(ARITHMETIC)
    assert [(v.name, v.kind) for v in traced.source_types] == [
        ("x", "int8"), ("y", "int8"), ("s", "int8"), ("p", "int8"), ("z", "int8")
    ]  # fmt: skip
    x, y = np.array([1, -2, 3, 0], np.int8), np.array([4, 5, -6, 7], np.int8)
    table = tlc.run(traced, [x, y])
    traced.check_values(table.values)  # every value an int8: no wrap-around
    (expected,) = ReferenceEvaluator(ARITHMETIC).run(None, {"x": x, "y": y})
    np.testing.assert_array_equal(table.output.astype(np.int8), expected)
    assert table.output.tolist() == expected.astype(np.float64).tolist()


def test_a_value_outside_its_type_is_diagnosed_never_wrapped() -> None:
    """ONNX wraps (10 + 10) * 10 around to -56 in int8; tl's real value is 200: the check names
    the first value that left its type."""
    traced = tlc.from_onnx(ARITHMETIC)
    x = [np.array([10, 0, 0, 0]), np.array([10, 0, 0, 0])]
    with pytest.raises(DiagnosticError) as info:
        traced.check_values(unchecked(traced, x))
    assert str(info.value) == (
        "value 'p' (node 3, int8) is 200.0 at [0], outside [-128, 127]: tl computes on reals, "
        "and this is not what the source's int8 arithmetic gives"
    )
    with pytest.raises(DiagnosticError, match="value 'p'"):
        tlc.run(traced, x)  # tlc.run checks an import's values too
    rep = TlcBackend.prepare(ARITHMETIC)
    with pytest.raises(DiagnosticError, match="value 'p'"):
        rep.run([np.array([10, 0, 0, 0], np.int8), np.array([10, 0, 0, 0], np.int8)])


def test_int64_beyond_2_53_and_non_integers_are_diagnosed() -> None:
    pow_model = model_of(
        [helper.make_node("Pow", ["x", "e"], ["y"])],
        [("x", I64, [2])], [("y", I64, [2])], [("e", np.array(0.5, np.float32))],
    )  # fmt: skip
    traced = tlc.from_onnx(pow_model)
    with pytest.raises(DiagnosticError) as info:
        traced.check_values(unchecked(traced, np.array([4, 2])))
    assert "is 1.4142135623730951 at [1], not an integer" in str(info.value)
    big = model_of([helper.make_node("Neg", ["x"], ["y"])], [("x", I64, [1])], [("y", I64, [1])])
    traced = tlc.from_onnx(big)
    with pytest.raises(DiagnosticError) as info:
        traced.check_values(unchecked(traced, np.array([2.0**60])))
    assert str(info.value).startswith(
        "value 'x' (node 0, int64) is 1.152921504606847e+18 at [0], outside "
        "[-9007199254740991, 9007199254740991]"
    )


def test_float16_max_min_are_exact() -> None:
    model = model_of(
        [helper.make_node("Max", ["a", "b"], ["m"]), helper.make_node("Min", ["m", "b"], ["y"])],
        [("a", F16, [3]), ("b", F16, [3])],
        [("y", F16, [3])],
    )
    a = np.array([0.1, -2.5, 65504], np.float16)
    b = np.array([0.3, -7.0, 1e-4], np.float16)
    got = TlcBackend.prepare(model).run([a, b])[0]
    (expected,) = ReferenceEvaluator(model).run(None, {"a": a, "b": b})
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, expected)


def test_uint8_max_pool_and_comparisons() -> None:
    model = model_of(
        [
            helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2]),
            helper.make_node("Greater", ["p", "t"], ["y"]),
        ],
        [("x", U8, [1, 1, 5])],
        [("y", TensorProto.BOOL, [1, 1, 4])],
        [("t", np.array(100, np.uint8))],
    )
    x = np.array([[[3, 250, 7, 100, 101]]], np.uint8)
    got = TlcBackend.prepare(model).run([x])[0]
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)


def test_refusals_name_the_op_the_value_and_why() -> None:
    xi = [("x", TensorProto.INT32, [2, 2])]
    yi = [("y", TensorProto.INT32, [2, 2])]
    matmul = model_of([helper.make_node("MatMul", ["x", "x"], ["y"])], xi, yi)
    assert refusal(matmul) == (
        "ONNX import: node #0 (MatMul): input 'x' is INT32: tl computes on reals, and its "
        "float64 MatMul is not exact on integers in general (exact on integers: Add, Sub, Mul, "
        "Div, Pow and the ops that select values)"
    )
    half = [("x", F16, [2])]
    add = model_of([helper.make_node("Add", ["x", "x"], ["y"])], half, [("y", F16, [2])])
    assert refusal(add) == (
        "ONNX import: node #0 (Add): input 'x' is FLOAT16: tl computes in float64 and rounds "
        "to float16 only at the outputs, which is ONNX's float16 Add only for ops that select "
        "values (Max, Min, Where, Clip, max pooling, layout ops)"
    )
    cast = model_of(
        [helper.make_node("Cast", ["x"], ["y"], to=F16)],
        [("x", TensorProto.FLOAT, [2])], [("y", F16, [2])],
    )  # fmt: skip
    assert refusal(cast) == (
        "ONNX import: node #0 (Cast): cast to FLOAT16 from FLOAT (tl computes on reals and has "
        "no rounding to float16)"
    )
    big = model_of(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [("x", I64, [1])], [("y", I64, [1])], [("c", np.array([2**60], np.int64))],
    )  # fmt: skip
    assert refusal(big) == (
        "ONNX import: node #0 (Add): input 'c' holds 1152921504606846976 in magnitude, beyond "
        "2^53 where float64 does not hold every integer"
    )
    bf = model_of(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.BFLOAT16, [2])], [("y", TensorProto.BFLOAT16, [2])],
    )  # fmt: skip
    assert refusal(bf) == (
        "ONNX import: input 'x' has element type BFLOAT16 (tl graph inputs are FLOAT/DOUBLE, "
        "BOOL as 0 and 1, or integers and FLOAT16 held as reals)"
    )


def test_an_integer_cast_between_integer_types_is_checked_at_the_narrower_type() -> None:
    model = model_of(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT8)],
        [("x", TensorProto.INT32, [2])], [("y", I8, [2])],
    )  # fmt: skip
    traced = tlc.from_onnx(model)
    assert [(v.name, v.kind) for v in traced.source_types] == [
        ("x", "int32"), ("y", "int8")
    ]  # fmt: skip
    traced.check_values(tlc.run(traced, np.array([5, -128])).values)
    with pytest.raises(DiagnosticError, match=r"value 'y' \(node 0, int8\) is 300.0"):
        traced.check_values(unchecked(traced, np.array([5, 300])))


def test_integer_div_truncates_and_a_cast_to_an_integer_too() -> None:
    """ONNX's integer Div rounds toward zero (-7 / 2 = -3), as does a cast from FLOAT to INT32;
    a division by zero (undefined in ONNX) is diagnosed."""
    i32 = TensorProto.INT32
    model = model_of(
        [
            helper.make_node("Div", ["a", "b"], ["q"]),
            helper.make_node("Cast", ["x"], ["t"], to=i32),
            helper.make_node("Add", ["q", "t"], ["y"]),
        ],
        [("a", i32, [6]), ("b", i32, [6]), ("x", F, [6])],
        [("y", i32, [6])],
    )
    a = np.array([-7, 7, -8, 2**30, -(2**31), 5], np.int32)
    b = np.array([2, -2, 3, 3, 7, 5], np.int32)
    x = np.array([-1.5, 1.5, -0.5, 2.9, -2.9, 0.0], np.float32)
    traced = tlc.from_onnx(model)
    assert "trunc" in [n.TAG for n in traced.graph.nodes]
    table = tlc.run(traced, [a, b, x])
    traced.check_values(table.values)
    (expected,) = ReferenceEvaluator(model).run(None, {"a": a, "b": b, "x": x})
    np.testing.assert_array_equal(table.output, expected)
    zero = unchecked(traced, [a, np.zeros(6), x])
    with pytest.raises(
        DiagnosticError, match=r"value 'q' \(node \d+, int32\) is -inf at \[0\], not finite"
    ):
        traced.check_values(zero)


@pytest.mark.parametrize("op", ["Floor", "Ceil"])
def test_floor_and_ceil(op: str) -> None:
    model = model_of(
        [helper.make_node(op, ["x"], ["y"])], [("x", TensorProto.DOUBLE, [7])],
        [("y", TensorProto.DOUBLE, [7])],
    )  # fmt: skip
    x = np.array([-2.5, -2.0, -0.25, 0.0, 0.75, 3.0, np.inf])
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(tlc.run(tlc.from_onnx(model), x).output, expected)


# --------------------------------------------------------------------------------------------
# Several outputs
# --------------------------------------------------------------------------------------------

F = TensorProto.FLOAT
#: Two outputs sharing a node, and one reading only the second input.
TWO = model_of(
    [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["y"]),
        helper.make_node("Neg", ["r"], ["1"]),
    ],
    [("x", F, [3])],
    [("y", F, [3]), ("1", F, [3])],
    [("w", np.array([1.0, 2.0, 3.0], np.float32))],
)


def test_several_outputs_import_as_one_graph_per_output(tmp_path: Path) -> None:
    traced = tlc.from_onnx(TWO)
    assert [t.graph.graph_name for t in traced.per_output] == ["y", "out_1"]
    assert traced.graph.graph_name == "y"
    x = np.array([-1.0, 0.5, 2.0])
    (want_y, want_n) = ReferenceEvaluator(TWO).run(None, {"x": x.astype(np.float32)})
    for part, want in zip(traced.per_output, (want_y, want_n), strict=True):
        np.testing.assert_array_equal(tlc.run(part, x).output, want)
        got = tlc.run(traced, x, graph=part.graph.graph_name).output  # the module's graph
        np.testing.assert_array_equal(got, want)
        compiled = tlc.compile(traced, graph=part.graph.graph_name)
        np.testing.assert_array_equal(compiled(x), want)
    with pytest.raises(DiagnosticError, match=r"2 graphs \(@y, @out_1\); choose one"):
        tlc.run(traced, x)
    # Each graph holds only the nodes its output needs.
    assert [n.TAG for n in traced.per_output[1].graph.nodes] == ["input", "relu", "neg"]
    path = tmp_path / "two.tlir"
    traced.save(path)
    text = path.read_text()
    assert text.count("tl.graph @") == 2 and text.count("tl.payload @") == 2
    np.testing.assert_array_equal(tlc.run(str(path), x, graph="y").output, want_y)
    assert print_tlir(tlc.parse(text)) == text


def test_several_outputs_with_a_name_and_through_the_backend() -> None:
    traced = tlc.from_onnx(TWO, name="net")
    assert [t.graph.graph_name for t in traced.per_output] == ["net_y", "net_1"]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    got = TlcBackend.prepare(TWO).run([x])
    expected = ReferenceEvaluator(TWO).run(None, {"x": x})
    for ours, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_a_graph_without_outputs_is_refused() -> None:
    assert refusal(model_of([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [3])], [])) == (
        "ONNX import: the graph has no outputs"
    )


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_at_computed_indices_from_constant_data(axis: int) -> None:
    """An embedding lookup (token ids a graph input): one-hot rows times the data, exact; the
    compiled float32 code gives the same values (small integers and float32 data)."""
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5
    model = model_of(
        [helper.make_node("Gather", ["d", "i"], ["y"], axis=axis)],
        [("i", I64, [2, 2])], [("y", F, None)], [("d", data)],
    )  # fmt: skip
    traced = tlc.from_onnx(model)
    n = data.shape[axis]
    i = np.array([[0, -1], [n - 1, -n]])
    table = tlc.run(traced, i)
    traced.check_values(table.values)
    (expected,) = ReferenceEvaluator(model).run(None, {"i": i})
    np.testing.assert_array_equal(table.output, expected)
    np.testing.assert_array_equal(tlc.compile(traced)(i), expected)
    with pytest.raises(DiagnosticError) as info:
        traced.check_values(unchecked(traced, np.array([[0, n], [0, 0]])))
    assert str(info.value) == (
        f"value 'i' (node 0, int64) is {n} at [0, 1], outside [{-n}, {n - 1}]: the indices of "
        f"node #0 (Gather) into an axis of extent {n} (ONNX refuses the others)"
    )


def test_gather_at_computed_indices_refusals() -> None:
    inf = model_of(
        [helper.make_node("Gather", ["d", "i"], ["y"])],
        [("i", I64, [2])], [("y", F, None)], [("d", np.array([1.0, np.inf], np.float32))],
    )  # fmt: skip
    assert refusal(inf) == (
        "ONNX import: node #0 (Gather): data (input 0) holds a non-finite value (0 · inf is not 0)"
    )
    floats = model_of(
        [helper.make_node("Gather", ["d", "i"], ["y"])],
        [("i", F, [2])], [("y", F, None)], [("d", np.ones(3, np.float32))],
    )  # fmt: skip
    assert (
        refusal(floats) == "ONNX import: node #0 (Gather): indices (input 1) 'i' are not integers"
    )
    empty = model_of(
        [helper.make_node("Gather", ["d", "i"], ["y"])],
        [("i", I64, [2])], [("y", F, None)], [("d", np.ones((0, 3), np.float32))],
    )  # fmt: skip
    assert refusal(empty) == (
        "ONNX import: node #0 (Gather): data (input 0) has an empty axis 0: no index is valid"
    )


def test_bounds_of_one_output_of_several() -> None:
    traced = tlc.from_onnx(TWO)
    x = np.array([-1.0, 0.5, 2.0])
    lower = tlc.bounds(traced, x - 0.1, x + 0.1, graph="out_1").lower
    np.testing.assert_allclose(lower, [0.0, -0.6, -2.1], atol=1e-12)  # -relu(x), x - 0.1 < 0
