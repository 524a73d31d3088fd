"""Writes ONNX models for the import tests: `nhwc OUT` builds an NHWC model with a symbolic
batch whose reshape target is computed by Shape -> Gather -> Unsqueeze -> Concat, `gaps OUT` a
model of opset 11 with two op types tl lacks (Hardmax twice, Det), `two OUT` a model with two
outputs (a scaled relu and its negation), `int8 OUT` an INT8 model ((x + x) * x)."""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def nhwc() -> onnx.ModelProto:
    weight = np.random.default_rng(0).normal(size=(4, 3, 3, 3))
    inits = {"w": weight, "zero": np.array(0), "axes": np.array([0]), "rest": np.array([-1])}
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"]),
        helper.make_node("Transpose", ["c"], ["u"], perm=[0, 2, 3, 1]),
        helper.make_node("Shape", ["u"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"]),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["u", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nhwc",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 6, 6, 3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 64])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def gaps() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Hardmax", ["r"], ["h"], name="hard1"),
        helper.make_node("Hardmax", ["h"], ["m"], name="hard2"),
        helper.make_node("Det", ["m"], ["y"], name="det"),
    ]
    graph = helper.make_graph(
        nodes,
        "gaps",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def two() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["scaled"]),
        helper.make_node("Neg", ["r"], ["negated"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("scaled", "negated")],
        [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def int8() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "int8",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


if __name__ == "__main__":
    models = {"gaps": gaps, "nhwc": nhwc, "two": two, "int8": int8}
    onnx.save(models[sys.argv[1]](), sys.argv[2])
