"""ONNX import: torch.onnx.export'ed models, hand-built graphs checked against ONNX's own
reference evaluator (`onnx.reference`, an independent oracle), and the refusals.

Tolerances: hand-built graphs hold float64 tensors, evaluated by us and by onnx.reference in
float64: rtol 1e-10 (1e-8 for the chain of twelve transcendental functions, where libm
differences compound). Exported PyTorch models hold float32 weights (the exporter folds batch
norm into conv weights in float32), compared with the float32 model run by PyTorch: rtol 1e-5,
atol 1e-6 (float32 rounding over a few layers).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "models"))

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.dialect.printer import print_listing  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

D = TensorProto.DOUBLE


def export(model, example, path: Path) -> Path:
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(path), dynamo=False)
    return path


def test_seed_model_through_torch_onnx_export(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import seed_fx
    from test_import_torch import SEED_LISTING, X0

    traced = tlc.from_onnx(str(export(seed_fx.make(), torch.tensor(X0), tmp_path / "g.onnx")))
    assert print_listing(traced.graph) == SEED_LISTING  # MatMul + Add(bias) fused to linear
    assert f"{float(interpret(traced.graph, traced.payload, X0).output):.6f}" == "0.027713"


@pytest.mark.parametrize("factory,shape", [("cnn", (2, 3, 8, 8)), ("mlp", (3, 8))])
def test_models_through_torch_onnx_export(tmp_path: Path, factory: str, shape) -> None:
    torch = pytest.importorskip("torch")
    import torch_models

    model = getattr(torch_models, factory)()
    x = torch.randn(*shape)
    traced = tlc.from_onnx(str(export(model, x, tmp_path / "m.onnx")))
    with torch.no_grad():
        expected = model(x).numpy()
    got = interpret(traced.graph, traced.payload, x.numpy().astype(np.float64)).output
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def make_model(nodes, inputs, output, initializers=(), opset=21) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, D, s) for n, s in inputs],
        [_output(output)],
        [numpy_helper.from_array(np.asarray(v, np.float64), n) for n, v in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _output(name: str) -> onnx.ValueInfoProto:
    """A double output of unknown shape (a type without a shape field)."""
    info = onnx.ValueInfoProto(name=name)
    info.type.tensor_type.elem_type = D
    return info


def int_init(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


RNG = np.random.default_rng(0)
#: The cases of the ops added for real models draw from their own stream (the earlier cases'
#: samples stay as they were).
RNG2 = np.random.default_rng(1)
W = RNG.standard_normal((4, 3))
CASES = {
    "gemm_transB_bias": (
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)],
        [("x", (2, 3))], [("w", W), ("c", RNG.standard_normal(4))], "linear",
    ),
    "gemm_alpha_beta": (
        [helper.make_node("Gemm", ["x", "wt", "c"], ["y"], alpha=0.5, beta=2.0)],
        [("x", (2, 3))], [("wt", W.T), ("c", RNG.standard_normal((2, 4)))], "linear",
    ),
    "matmul_add_fused": (
        [helper.make_node("MatMul", ["x", "wt"], ["m"]),
         helper.make_node("Add", ["c", "m"], ["y"])],
        [("x", (5, 3))], [("wt", W.T), ("c", RNG.standard_normal(4))], "linear",
    ),
    "batchnorm_conv_pool": (
        [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 0, 1, 0], strides=[1, 2]),
         helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"],
                          epsilon=1e-3),
         helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2, 2],
                          count_include_pad=1, pads=[1, 1, 1, 1], strides=[2, 2])],
        [("x", (1, 2, 5, 6))],
        [("k", RNG.standard_normal((3, 2, 3, 2))), ("g", RNG.uniform(0.5, 1.5, 3)),
         ("b", RNG.standard_normal(3)), ("m", RNG.standard_normal(3)),
         ("v", RNG.uniform(0.5, 2, 3))],
        "conv",
    ),
    "conv_same_upper_groups": (
        [helper.make_node("Conv", ["x", "k", "kb"], ["y"], auto_pad="SAME_UPPER", group=2,
                          strides=[2])],
        [("x", (2, 4, 7))], [("k", RNG.standard_normal((6, 2, 4))),
                             ("kb", RNG.standard_normal(6))], "conv",
    ),
    "layernorm_softmax_flatten": (
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["l"], axis=-2),
         helper.make_node("Softmax", ["l"], ["sm"], axis=1),
         helper.make_node("Flatten", ["sm"], ["y"], axis=1)],
        [("x", (2, 3, 4))], [("s", RNG.standard_normal((3, 4))), ("b", RNG.standard_normal(4))],
        "layernorm",
    ),
    "reshape_transpose_reduce": (
        [helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
         helper.make_node("ReduceMean", ["t", "axes"], ["y"], keepdims=1)],
        [("x", (2, 3, 4))], [], "reduce_mean",
    ),
    "max_min_sub_mul_broadcast": (
        [helper.make_node("Max", ["x", "c", "z"], ["a"]),
         helper.make_node("Min", ["a", "d"], ["b"]),
         helper.make_node("Sub", ["b", "z"], ["s"]),
         helper.make_node("Mul", ["s", "c"], ["y"])],
        [("x", (2, 3)), ("z", (3,))], [("c", RNG.standard_normal((1, 3))), ("d", np.array(0.5))],
        "broadcast_to",
    ),
    "unary_chain_gelu": (
        [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
         helper.make_node("Log", ["s"], ["l"]), helper.make_node("Sin", ["l"], ["n"]),
         helper.make_node("Cos", ["n"], ["c"]), helper.make_node("Reciprocal", ["c"], ["r"]),
         helper.make_node("Gelu", ["r"], ["g"], approximate="tanh"),
         helper.make_node("Softplus", ["g"], ["p"]), helper.make_node("Exp", ["p"], ["e"]),
         helper.make_node("Sigmoid", ["e"], ["y0"]), helper.make_node("Concat", ["y0", "x"],
                                                                      ["y1"], axis=0),
         helper.make_node("LogSoftmax", ["y1"], ["y"], axis=0)],
        [("x", (3,))], [], "gelu",
    ),
    "reduce_mean_axes_attribute_opset13": (
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1, 0], keepdims=0)],
        [("x", (2, 3, 4))], [], "reduce_mean",
    ),
    "reduce_sum_opset13": (
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [("x", (2, 3, 4))], [], "reduce_sum",
    ),
    "avgpool_pads_not_counted_ceil": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 0, 2, 1],
                          strides=[2, 2], ceil_mode=1)],
        [("x", (1, 2, 6, 5))], [], "avg_pool",
    ),
    "avgpool_dilated_pads_not_counted": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 3], pads=[1, 1, 0, 2],
                          dilations=[2, 2])],
        [("x", (2, 3, 6, 7))], [], "conv",
    ),
    "leaky_relu_alpha_and_default": (
        [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.2),
         helper.make_node("LeakyRelu", ["a"], ["y"])],
        [("x", (2, 3))], [], "leaky_relu",
    ),
    "neg": ([helper.make_node("Neg", ["x"], ["y"])], [("x", (2, 3))], [], "neg"),
    "erf": ([helper.make_node("Erf", ["x"], ["y"])], [("x", (2, 3))], [], "erf"),
    "elu_alpha_and_default": (
        [helper.make_node("Elu", ["x"], ["a"], alpha=0.5),
         helper.make_node("Elu", ["a"], ["y"])],
        [("x", (2, 3))], [], "elu",
    ),
    "selu_default_attributes": (
        [helper.make_node("Selu", ["x"], ["a"]),
         helper.make_node("Selu", ["a"], ["y"], alpha=1.67326319217681884765625,
                          gamma=1.05070102214813232421875)],
        [("x", (2, 3))], [], "selu",
    ),
    "hardsigmoid_fields_and_defaults": (
        [helper.make_node("HardSigmoid", ["x"], ["a"], alpha=0.25, beta=0.25),
         helper.make_node("HardSigmoid", ["a"], ["y"])],
        [("x", (2, 3))], [], "hardsigmoid",
    ),
    "clip_constant_bounds": (
        [helper.make_node("Clip", ["x", "lo", "hi"], ["a"]),
         helper.make_node("Clip", ["a", "", "hi2"], ["b"]),
         helper.make_node("Clip", ["b", "lo2"], ["c"]),
         helper.make_node("Clip", ["c"], ["y"])],
        [("x", (2, 3))], [("lo", -0.5), ("hi", 1.0), ("hi2", 0.75), ("lo2", -0.25)], "clip",
    ),
    "global_pools": (
        [helper.make_node("GlobalAveragePool", ["x"], ["a"]),
         helper.make_node("GlobalMaxPool", ["x"], ["b"]),
         helper.make_node("Mul", ["a", "b"], ["y"])],
        [("x", (2, 3, 4, 5))], [], "avg_pool",
    ),
    "sum_variadic_broadcast": (
        [helper.make_node("Sum", ["x", "c", "x", "d"], ["y"])],
        [("x", (2, 3))], [("c", RNG.standard_normal(3)), ("d", RNG.standard_normal((2, 1)))],
        "add",
    ),
    "hardswish": ([helper.make_node("HardSwish", ["x"], ["y"])], [("x", (2, 3))], [],
                  "hardswish"),
    "layernorm_mean_output": (
        [helper.make_node("LayerNormalization", ["x", "s"], ["l", "mean", "inv"], axis=1),
         helper.make_node("Mul", ["mean", "inv"], ["y"])],
        [("x", (2, 3, 4))], [("s", RNG.standard_normal((3, 4)))], "reduce_mean",
    ),
    "div_broadcast": (
        [helper.make_node("Div", ["x", "c"], ["a"]), helper.make_node("Div", ["c", "a"], ["y"])],
        [("x", (2, 3))], [("c", RNG2.uniform(0.5, 2, 3))], "div",
    ),
    "prelu_per_channel": (
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [("x", (2, 3, 4))], [("slope", RNG2.standard_normal((3, 1)))], "prelu",
    ),
    "pow_constant_exponents": (
        [helper.make_node("Pow", ["x", "three"], ["a"]), helper.make_node("Abs", ["a"], ["b"]),
         helper.make_node("Pow", ["b", "e"], ["y"])],
        [("x", (2, 3))], [("three", np.array(3.0)), ("e", np.array([[0.75, 2.0, 0.75]]))], "pow",
    ),
    "pow_exponent_tensors": (
        [helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("Pow", ["a", "e"], ["p"]),
         helper.make_node("Pow", ["p", "z"], ["y"])],
        [("x", (2, 9)), ("z", (2, 9))], [("e", np.linspace(-2.0, 2.0, 9))], "pow_elem",
    ),
    "mean_variadic": (
        [helper.make_node("Mean", ["x", "c", "z"], ["y"])],
        [("x", (2, 3)), ("z", (3,))], [("c", RNG2.standard_normal((2, 1)))], "div",
    ),
    "tile": ([helper.make_node("Tile", ["x", "repeats"], ["y"])], [("x", (2, 3))], [],
             "broadcast_to"),
    "instance_norm": (
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
        [("x", (2, 3, 4, 5))], [("s", RNG2.standard_normal(3)), ("b", RNG2.standard_normal(3))],
        "layernorm",
    ),
    "group_norm": (
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2,
                          stash_type=TensorProto.DOUBLE)],
        [("x", (2, 4, 3))], [("s", RNG2.standard_normal(4)), ("b", RNG2.standard_normal(4))],
        "layernorm",
    ),
    "conv_transpose_strided_padded": (
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[3, 2],
                          pads=[1, 1, 1, 1], output_padding=[1, 1])],
        [("x", (1, 2, 4, 5))], [("w", RNG2.standard_normal((2, 3, 3, 3))),
                                ("b", RNG2.standard_normal(3))], "conv",
    ),
    "pad_modes_and_axes": (
        [helper.make_node("Pad", ["x", "pads", "v"], ["a"]),
         helper.make_node("Pad", ["a", "pads"], ["b"], mode="reflect"),
         helper.make_node("Pad", ["b", "pads1", "", "axes"], ["y"], mode="edge")],
        [("x", (2, 3, 4))], [("v", np.array(1.5))], "pad",
    ),
    "reduce_max_min": (
        [helper.make_node("ReduceMax", ["x", "axes"], ["a"], keepdims=0),
         helper.make_node("ReduceMin", ["x"], ["b"]),
         helper.make_node("Mul", ["a", "b"], ["y"])],
        [("x", (2, 3, 4))], [], "max_pool",
    ),
    "less_greater_where_cast_bool": (
        [helper.make_node("Less", ["x", "c"], ["l"]),
         helper.make_node("Neg", ["x"], ["n"]),
         helper.make_node("Where", ["l", "n", "x"], ["w"]),
         helper.make_node("Greater", ["x", "c"], ["g"]),
         helper.make_node("Cast", ["g"], ["gd"], to=TensorProto.DOUBLE),
         helper.make_node("Cast", ["w"], ["wb"], to=TensorProto.BOOL),
         helper.make_node("Where", ["wb", "gd", "c"], ["m"]),
         helper.make_node("Add", ["m", "w"], ["y"])],
        [("x", (2, 3))], [("c", RNG2.standard_normal(3) * 0.1)], "where",
    ),
    "reduce_l2": (
        [helper.make_node("ReduceL2", ["x", "axes"], ["a"]),
         helper.make_node("ReduceL2", ["x"], ["b"], keepdims=0),
         helper.make_node("Mul", ["a", "b"], ["y"])],
        [("x", (2, 3, 4))], [], "sqrt",
    ),
    "gather_nd": (
        [helper.make_node("GatherND", ["x", "rows"], ["a"]),
         helper.make_node("GatherND", ["x", "cells"], ["b"]),
         helper.make_node("Mul", ["a", "b"], ["y"])],
        [("x", (3, 2, 4))], [], "gather",
    ),
    "gather_nd_batch_dims": (
        [helper.make_node("GatherND", ["x", "per_image"], ["a"], batch_dims=1),
         helper.make_node("GatherND", ["x", "per_row"], ["b"], batch_dims=2),
         helper.make_node("Mul", ["a", "b"], ["y"])],
        [("x", (2, 3, 4, 5))], [], "gather",
    ),
    "max_pool_dilated": (
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 2],
                          dilations=[2, 1], pads=[1, 1, 1, 1])],
        [("x", (1, 2, 9, 10))], [], "max_pool",
    ),
    "max_pool_dilation_not_dividing_stride": (
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[1, 2],
                          dilations=[2, 3], pads=[1, 0, 2, 1], ceil_mode=1)],
        [("x", (1, 2, 9, 10))], [], "max_elem",
    ),
    "avgpool_ceil_counted_pads": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 2],
                          pads=[1, 1, 0, 1], ceil_mode=1, count_include_pad=1)],
        [("x", (1, 2, 6, 7))], [], "avg_pool",
    ),
    "avgpool_dilated_ceil_counted_pads": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 3],
                          dilations=[2, 1], pads=[0, 1, 1, 0], ceil_mode=1,
                          count_include_pad=1)],
        [("x", (1, 2, 8, 7))], [], "conv",
    ),
    "selu_constants": (
        [helper.make_node("Selu", ["x"], ["y"], alpha=2.0, gamma=3.0)],
        [("x", (2, 3))], [], "elu",
    ),
    "einsum_ellipsis_diagonal_three_operands": (
        [helper.make_node("Einsum", ["x", "x"], ["s"], equation="...ld,...sd->...ls"),
         helper.make_node("Einsum", ["s"], ["d"], equation="...ii->...i"),
         helper.make_node("Einsum", ["x", "w", "d"], ["y"], equation="bhld,de,bhl->bhe")],
        [("x", (2, 3, 4, 4))], [("w", RNG2.standard_normal((4, 5)))], "matmul",
    ),
    "batch_norm_training_mode": (
        [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"],
                          training_mode=1, momentum=0.8, epsilon=1e-3)],
        [("x", (3, 2, 4, 2))],
        [("g", RNG2.uniform(0.5, 1.5, 2)), ("b", RNG2.standard_normal(2)),
         ("m", RNG2.standard_normal(2)), ("v", RNG2.uniform(0.5, 2, 2))],
        "reduce_mean",
    ),
    "batch_norm_training_running_statistics": (
        [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n", "rm", "rv"],
                          training_mode=1),
         helper.make_node("Mul", ["rm", "rv"], ["y"])],
        [("x", (3, 2, 5))],
        [("g", RNG2.uniform(0.5, 1.5, 2)), ("b", RNG2.standard_normal(2)),
         ("m", RNG2.standard_normal(2)), ("v", RNG2.uniform(0.5, 2, 2))],
        "reduce_mean",
    ),
    "reduce_sum_of_nothing": (
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [("x", (2, 0, 3))], [], "const",
    ),
    "reduce_mean_of_nothing_opset13": (
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, 1], keepdims=0)],
        [("x", (2, 0, 3))], [], "const",
    ),
}  # fmt: skip
INT_INITIALIZERS = {
    "reshape_transpose_reduce": [int_init("shape", [4, 0, -1]), int_init("axes", [1, -1])],
    "reduce_sum_opset13": [int_init("axes", [0, 2])],
    "tile": [int_init("repeats", [2, 3])],
    "reduce_max_min": [int_init("axes", [0, -1])],
    "reduce_sum_of_nothing": [int_init("axes", [1])],
    "reduce_l2": [int_init("axes", [1, -1])],
    "gather_nd_batch_dims": [
        int_init("per_image", [[[2, -1], [0, 1], [1, 3]], [[0, 0], [-3, 2], [2, -4]]]),
        int_init("per_row", [[[3], [1], [-1]], [[0], [2], [1]]]),
    ],
    "gather_nd": [
        int_init("rows", [[[2], [-1]], [[0], [1]]]),
        int_init("cells", [[[2, 1], [0, 0]], [[-1, 1], [1, 0]]]),
    ],
    "pad_wrap_and_crop": [
        int_init("wraps", [1, 4, 0, 2, 1, 9]),  # more than an extent: wraps round several times
        int_init("crops", [-1, 1, -2, 0, -1, 1]),
    ],
    "pad_modes_and_axes": [
        int_init("pads", [0, 1, 2, 1, 0, 1]),
        int_init("pads1", [3, 0]),
        int_init("axes", [-1]),
    ],
}


def test_pad_attribute_form_of_opset_10() -> None:
    """Pad-2 (opsets 2-10) holds pads and value as attributes."""
    model = make_model(
        [helper.make_node("Pad", ["x"], ["y"], pads=[1, 0, 0, 2], value=-1.0)],
        [("x", (2, 3))], "y", opset=10,
    )  # fmt: skip
    x = np.random.default_rng(2).standard_normal((2, 3))
    traced = tlc.from_onnx(model)
    got = interpret(traced.graph, traced.payload, x).output
    np.testing.assert_array_equal(got, np.pad(x, [(1, 0), (0, 2)], constant_values=-1.0))


#: The cases of the ops added for real models (inputs drawn from RNG2).
REAL_MODEL_CASES = {
    "div_broadcast", "prelu_per_channel", "pow_constant_exponents", "mean_variadic", "tile",
    "instance_norm", "group_norm", "conv_transpose_strided_padded", "pad_modes_and_axes",
    "max_pool_dilated", "reduce_max_min", "less_greater_where_cast_bool",
    "max_pool_dilation_not_dividing_stride", "avgpool_ceil_counted_pads",
    "avgpool_dilated_ceil_counted_pads", "selu_constants", "reduce_sum_of_nothing",
    "einsum_ellipsis_diagonal_three_operands", "pow_exponent_tensors",
    "reduce_mean_of_nothing_opset13", "batch_norm_training_mode",
    "batch_norm_training_running_statistics",
}  # fmt: skip
#: Cases whose ONNX reference computes in float32 even on doubles (so agree to float32's
#: precision only): Erf's evaluator rounds to float32, HardSwish and Selu use float32 constants.
FLOAT32_REFERENCE = {"erf", "hardswish", "selu_default_attributes"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_built_graphs_match_onnx_reference(name: str) -> None:
    nodes, inputs, inits, expected_tag = CASES[name]
    model = make_model(nodes, inputs, "y", inits, opset=13 if "opset13" in name else 21)
    model.graph.initializer.extend(INT_INITIALIZERS.get(name, []))
    rng = RNG2 if name in REAL_MODEL_CASES else RNG
    xs = [rng.standard_normal(s) + (2.0 if name == "unary_chain_gelu" else 0.0) for _, s in inputs]
    (expected,) = ReferenceEvaluator(model).run(
        None, dict(zip((n for n, _ in inputs), xs, strict=True))
    )
    traced = tlc.from_onnx(model)
    assert expected_tag in [n.TAG for n in traced.graph.nodes]
    got = interpret(traced.graph, traced.payload, xs if len(xs) > 1 else xs[0]).output
    rtol = 1e-6 if name in FLOAT32_REFERENCE else 1e-8 if "chain" in name else 1e-10
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-12)


#: Ops whose `onnx.reference` implementation is wrong for these cases (LRN sums the channels
#: of the first N only; ConvTranspose with groups or output_shape raises; np.pad refuses Pad's
#: negative pads, which crop), compared with ONNX Runtime instead, in float32 (ORT's LRN and
#: ConvTranspose take float only): rtol 1e-5, atol 1e-6, float32 rounding over one sum of a few
#: dozen products.
ORT_CASES = {
    "lrn": (
        [helper.make_node("LRN", ["x"], ["a"], size=3, alpha=0.3, beta=0.75, bias=2.0),
         helper.make_node("LRN", ["a"], ["y"], size=5)],
        [("x", (2, 5, 3, 3))], [], "lrn",
    ),
    "conv_transpose_groups_dilated": (
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2, dilations=[2, 1],
                          strides=[2, 1])],
        [("x", (1, 4, 5, 3))], [("w", RNG2.standard_normal((4, 1, 3, 2)))], "conv",
    ),
    "conv_transpose_output_shape": (
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                          output_shape=[6, 6])],
        [("x", (1, 1, 3, 3))], [("w", RNG2.standard_normal((1, 2, 3, 3)))], "conv",
    ),
    "conv_transpose_output_shape_beyond_the_full_output": (
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                          output_shape=[8, 8])],
        [("x", (1, 1, 3, 3))],
        [("w", RNG2.standard_normal((1, 2, 3, 3))), ("b", RNG2.standard_normal(2))], "conv",
    ),
    "pad_wrap_and_crop": (
        [helper.make_node("Pad", ["x", "wraps"], ["a"], mode="wrap"),
         helper.make_node("Pad", ["a", "crops", "v"], ["b"]),
         helper.make_node("Pad", ["b", "crops"], ["y"], mode="edge")],
        [("x", (2, 3, 4))], [("v", np.array(-2.0))], "gather",
    ),
    "conv_transpose_pads_beyond_the_span": (
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 1],
                          pads=[3, 1, 4, 2])],
        [("x", (1, 1, 4, 5))], [("w", RNG2.standard_normal((1, 2, 3, 3)))], "conv",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ORT_CASES))
def test_hand_built_graphs_match_onnxruntime(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    nodes, inputs, inits, expected_tag = ORT_CASES[name]
    model = make_model(nodes, inputs, "y", inits)
    for t in [*model.graph.input, *model.graph.output]:
        t.type.tensor_type.elem_type = TensorProto.FLOAT
    for i, t in enumerate(model.graph.initializer):
        model.graph.initializer[i].CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
        )
    model.graph.initializer.extend(INT_INITIALIZERS.get(name, []))
    xs = [RNG2.standard_normal(s).astype(np.float32) for _, s in inputs]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, dict(zip((n for n, _ in inputs), xs, strict=True)))
    traced = tlc.from_onnx(model)
    assert expected_tag in [n.TAG for n in traced.graph.nodes]
    got = interpret(traced.graph, traced.payload, xs[0].astype(np.float64)).output
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _spelled_elementwise(op) -> bool:
    from tlc.dialect.families import BinaryOp, UnaryOp

    return issubclass(op, (UnaryOp, BinaryOp)) and op.ONNX is not None


#: The elementwise op kinds whose ONNX op type no hand-built case uses: each gets a derived
#: case from its spelling (`test_spelled_op_types_match_onnx_reference`).
SPELLED = {
    op.TAG: op
    for op in tlc.dialect.ops.FORWARD_OPS
    if _spelled_elementwise(op)
    and op.ONNX.op_type not in {n.op_type for nodes, *_ in CASES.values() for n in nodes}
}


#: Op types the preparation removes before import (tlc.frontends.onnx_prepare: Identity).
FOLDED_BEFORE_IMPORT = {"Identity"}


@pytest.mark.parametrize("tag", sorted(SPELLED))
def test_spelled_op_types_match_onnx_reference(tag: str) -> None:
    """The op kind's ONNX spelling as one node at ONNX's default attributes, on float64 inputs
    drawn inside the op's DOMAIN: it imports as that op kind (or is folded away before import)
    and agrees with onnx.reference to
    rtol 1e-10 (as the hand-built cases)."""
    op = SPELLED[tag]
    names = ["x", "x2"][: op.ARITY[0]]
    model = make_model(
        [helper.make_node(op.ONNX.op_type, names, ["y"])], [(n, (2, 3)) for n in names], "y"
    )
    rng = np.random.default_rng(0)
    domain = getattr(op, "DOMAIN", None)
    xs = [
        rng.standard_normal((2, 3)) if domain is None else domain[0] + rng.uniform(0.1, 3, (2, 3))
        for _ in names
    ]
    (expected,) = ReferenceEvaluator(model).run(None, dict(zip(names, xs, strict=True)))
    traced = tlc.from_onnx(model)
    folded = op.ONNX.op_type in FOLDED_BEFORE_IMPORT
    assert [n.TAG for n in traced.graph.nodes[len(names) :]] == ([] if folded else [tag])
    got = interpret(traced.graph, traced.payload, xs if len(xs) > 1 else xs[0]).output
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def _refusal(model) -> str:
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(model)
    return str(info.value)


def test_refusals_name_the_node_and_op_type() -> None:
    mish = make_model([helper.make_node("Mish", ["x"], ["y"], name="act")], [("x", (3,))], "y")
    assert _refusal(mish) == (
        "ONNX import: '<onnx model>' uses 1 unsupported op type:\n  Mish: 1 node ('act')"
    )
    odd = make_model([helper.make_node("Relu", ["x"], ["y"], foo=1)], [("x", (3,))], "y")
    assert _refusal(odd) == (
        "ONNX import: '<onnx model>' is not a valid ONNX model: Unrecognized attribute: foo for "
        "operator Relu ==> Context: Bad node spec for node. Name: OpType: Relu"
    )
    symbolic = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (3, "M"))], "y")
    assert _refusal(symbolic) == (
        "ONNX import: input 'x' has a symbolic or unknown shape [3, M]; give its static shape "
        "(tlc-translate --input-shape, tlc.from_onnx(..., input_shapes=[...]))"
    )
    assert tlc.from_onnx(symbolic, [(3, 2)]).graph.nodes[0].declared_shape == (3, 2)
    weights = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"])], [("x", (1, 2, 5)), ("w", (3, 2, 2))], "y"
    )
    assert _refusal(weights) == (
        "ONNX import: node #0 (Conv): W (input 1) must be an initializer or a Constant"
    )


def test_batch_norm_running_statistics_need_training_mode() -> None:
    model = make_model(
        [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n", "rm", "rv"]),
         helper.make_node("Mul", ["rm", "rm"], ["y"])],
        [("x", (3, 2))], "y", [(name, np.ones(2)) for name in "gbmv"],
    )  # fmt: skip
    assert _refusal(model) == (
        "ONNX import: node #0 (BatchNormalization): running_mean and running_var are outputs "
        "of training_mode=1 only"
    )


def test_einsum_refusals_name_the_equation() -> None:
    cases = [
        ("ijk->ijk", [(2, 3, 4, 5)], "an operand's labels do not match its rank"),
        ("iij->ij", [(2, 3, 4)], "label 'i' has extents 2 and 3"),
        ("ij,jk->il", [(2, 3), (3, 4)], "an output label repeated or not in any operand"),
        ("ij,jk", [(2, 3), (4, 4)], "label 'j' has extents 3 and 4"),
        ("ij,jk,kl", [(2, 3), (3, 4)], "3 operand(s) in the equation, 2 given"),
    ]
    for equation, shapes, reason in cases:
        names = [f"x{i}" for i in range(len(shapes))]
        node = helper.make_node("Einsum", names, ["y"], equation=equation)
        model = make_model([node], list(zip(names, shapes, strict=True)), "y")
        assert _refusal(model) == f"ONNX import: node #0 (Einsum): einsum '{equation}': {reason}"


def test_refusals_of_the_real_model_rules() -> None:
    """Each refusal of the rules added for real models names the node, the op type and why."""
    x4 = [("x", (1, 4, 3))]
    cases = [
        (
            [helper.make_node("Tile", ["x", "r"], ["y"])],
            x4,
            [],
            [int_init("r", [2, 2])],
            "node #0 (Tile): 2 repeats for an input of rank 3",
        ),
        (
            [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)],
            x4,
            [("s", np.ones(4)), ("b", np.ones(4))],
            [],
            "node #0 (GroupNormalization): num_groups=3 does not divide the 4 channels",
        ),
        (
            [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
            x4,
            [("s", np.ones(2)), ("b", np.ones(2))],
            [],
            "node #0 (GroupNormalization): scale and bias must have one entry per channel (4)",
        ),
        (
            [helper.make_node("PRelu", ["x", "s"], ["y"])],
            x4,
            [("s", np.ones(2))],
            [],
            "node #0 (PRelu): slope shape [2] neither broadcasts to [1, 4, 3] nor has one entry "
            "per channel",
        ),
        (
            [helper.make_node("Pad", ["x", "p"], ["y"], mode="circular")],
            x4,
            [],
            [int_init("p", [0] * 6)],
            "node #0 (Pad): mode='circular' (tl pads constant, reflect, edge or wrap)",
        ),
        (
            [helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
            x4,
            [],
            [int_init("p", [0, 0, -1, 0, 0, 1])],
            "node #0 (Pad): negative pads (cropping) with mode='reflect'",
        ),
        (
            [helper.make_node("Pad", ["x", "p", "", "a"], ["y"])],
            x4,
            [],
            [int_init("p", [1, 1, 1]), int_init("a", [1])],
            "node #0 (Pad): 3 pads for 1 axes (expected 2)",
        ),
        (
            [helper.make_node("Pad", ["x", "p"], ["y"])],
            x4,
            [],
            [int_init("p", [0, 0, -2, 0, 0, -2])],
            "node #0 (Pad): pads crop 4 elements from axis 2 of extent 3",
        ),
        (
            [helper.make_node("Pad", ["x", "p"], ["y"])],
            x4,
            [],
            [int_init("p", [1, 1])],
            "node #0 (Pad): 2 pads for an input of rank 3 (expected 6)",
        ),
        (
            [helper.make_node("GatherND", ["x", "i"], ["y"])],
            x4,
            [],
            [int_init("i", [[0, 4]])],
            "node #0 (GatherND): an index out of range for the data's leading axes [1, 4]",
        ),
        (
            [helper.make_node("GatherND", ["x", "i"], ["y"])],
            x4,
            [],
            [int_init("i", [[0, 1, 2, 0]])],
            "node #0 (GatherND): index rows of length 4 (1 to the data's rank after the batch "
            "axes, 3)",
        ),
        (
            [helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=2)],
            x4,
            [],
            [int_init("i", [[1]])],
            "node #0 (GatherND): batch_dims=2 (0 to one less than the smaller rank: data 3, "
            "indices 2)",
        ),
        (
            [helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
            x4,
            [],
            [int_init("i", [[1], [0]])],
            "node #0 (GatherND): the indices' batch axes [2] differ from the data's [1]",
        ),
    ]
    for nodes, inputs, inits, ints_, message in cases:
        model = make_model(nodes, inputs, "y", inits)
        model.graph.initializer.extend(ints_)
        assert _refusal(model) == f"ONNX import: {message}"


def test_every_onnx_spelling_is_imported_from_its_op_kind() -> None:
    """An op kind's `ONNX` spelling is an importable op type; unless an explicit rule covers
    the op type, the derived rule understands exactly the spelling's attributes."""
    from tlc.dialect.registry import NODE_OPS
    from tlc.frontends.import_onnx import DERIVED, RULES

    spelled = {op.ONNX.op_type: op for op in NODE_OPS if op.ONNX is not None}
    assert set(spelled) <= set(RULES)
    assert {"LeakyRelu", "Relu", "Sign", "Gelu", "Max"} <= DERIVED <= set(spelled)
    assert RULES["LeakyRelu"].attributes == {"alpha"}


def test_leaky_relu_alpha_is_the_negative_slope() -> None:
    """`alpha` sets `negative_slope`; an absent alpha is ONNX's default, the field's 0.01. ONNX
    floats are float32, defaults too; any other attribute is refused."""
    model = make_model(
        [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.2),
         helper.make_node("LeakyRelu", ["a"], ["y"])],
        [("x", (3,))], "y",
    )  # fmt: skip
    first, second = tlc.from_onnx(model).graph.nodes[1:]
    assert first.meta("negative_slope") == float(np.float32(0.2))
    assert second.meta("negative_slope") == float(np.float32(0.01))
    odd = make_model([helper.make_node("LeakyRelu", ["x"], ["y"], beta=1.0)], [("x", (3,))], "y")
    assert _refusal(odd) == (
        "ONNX import: '<onnx model>' is not a valid ONNX model: Unrecognized attribute: beta for "
        "operator LeakyRelu ==> Context: Bad node spec for node. Name: OpType: LeakyRelu"
    )


def test_unreadable_file_is_a_diagnostic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(str(bad))
    assert str(info.value).startswith(f"cannot read ONNX model '{bad}'")


def test_malformed_models_are_diagnostics() -> None:
    """Issue 14's reproducers: undefined inputs and cycles were KeyErrors; initializers whose
    data does not match their dims or whose type is unknown, Expand to [2^31, 2^31, 2], a dim
    of -1 and a huge input shape were accepted or crashed."""
    undefined = make_model(
        [helper.make_node("Relu", ["nope"], ["y"], name="r")], [("x", (3,))], "y"
    )
    assert _refusal(undefined) == (
        "ONNX import: '<onnx model>' is not a valid ONNX model: Nodes in a graph must be "
        "topologically sorted, however input 'nope' of node: name: r OpType: Relu is not output "
        "of any previous nodes."
    )
    cycle = make_model(
        [helper.make_node("Relu", ["b"], ["a"], name="first"),
         helper.make_node("Relu", ["a"], ["b"], name="second")],
        [("x", (3,))], "b",
    )  # fmt: skip
    assert _refusal(cycle).endswith(
        "input 'b' of node: name: first OpType: Relu is not output of any previous nodes."
    )
    short = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", (3,))], "y")
    short.graph.initializer.append(
        onnx.TensorProto(name="w", data_type=TensorProto.DOUBLE, dims=[3], double_data=[1.0])
    )
    assert _refusal(short).startswith("ONNX import: initializer 'w': not valid ONNX:")
    unknown = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", (3,))], "y")
    unknown.graph.initializer.append(onnx.TensorProto(name="w", data_type=999, dims=[3]))
    assert _refusal(unknown).startswith("ONNX import: initializer 'w': not valid ONNX:")
    # Found by the fuzzer: with raw data the checker passes an unknown type (numpy_helper's
    # KeyError escaped).
    raw = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", (3,))], "y")
    raw.graph.initializer.append(
        onnx.TensorProto(name="w", data_type=86, dims=[3], raw_data=bytes(24))
    )
    assert _refusal(raw) == "ONNX import: initializer 'w': not valid ONNX: unknown data type 86"
    resized = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", (3,))], "y")
    resized.graph.initializer.append(  # ... nor raw data not matching the dims (a reshape)
        onnx.TensorProto(name="w", data_type=TensorProto.DOUBLE, dims=[3], raw_data=bytes(32))
    )
    assert _refusal(resized) == (
        "ONNX import: initializer 'w': not valid ONNX: 32 bytes of raw data for dims [3], which "
        "take 24"
    )
    for target in ([6, 0, 0], [-1, -1], [-2, 6]):  # a 0 past the rank was an IndexError
        bad_reshape = make_model(
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], [("x", (2, 3))], "y"
        )
        bad_reshape.graph.initializer.append(int_init("s", target))
        assert _refusal(bad_reshape) == (
            f"ONNX import: node 'r' (Reshape): cannot reshape [2, 3] to shape {target}"
        )
    huge_init = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", (3,))], "y")
    huge_init.graph.initializer.append(
        onnx.TensorProto(name="w", data_type=TensorProto.DOUBLE, dims=[2**31, 2**31])
    )
    assert _refusal(huge_init).startswith(
        "ONNX import: initializer 'w': tensor of shape [2147483648, 2147483648] has "
    )
    expand = make_model(
        [helper.make_node("Expand", ["x", "s"], ["y"], name="e")], [("x", (1,))], "y"
    )
    expand.graph.initializer.append(int_init("s", [2**31, 2**31, 2]))
    assert _refusal(expand).startswith(
        "ONNX import: node 'e' (Expand): output 'y': tensor of shape [2147483648, 2147483648, 2] "
        "has 9,223,372,036,854,775,808 elements, over the element budget"
    )
    negative = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (-1, 4))], "y")
    assert _refusal(negative) == "ONNX import: input 'x': negative extent in shape [-1, 4]"
    clash = make_model([helper.make_node("Add", ["x", "w"], ["y"], name="a")], [("x", (5,))], "y",
                       [("w", np.ones(3))])  # fmt: skip
    assert _refusal(clash) == (
        "ONNX import: node 'a' (Add): shapes [5], [3] do not broadcast together"
    )
    odd_type = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (4,))], "y")
    odd_type.graph.input[0].type.tensor_type.elem_type = 109
    assert _refusal(odd_type).startswith("ONNX import: input 'x' has element type #109 (unknown)")
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ("N", 4))], "y")
    with pytest.raises(DiagnosticError, match=r"input 'x': tensor of shape \[4611686018427387904"):
        tlc.from_onnx(relu, [(2**62, 4)])


def test_initializers_keep_their_names() -> None:
    """A payload field that is an initializer as stored is bound by its name (characters a
    .tlir name cannot hold become `_`); one computed from it (MatMul's transposed weight) is
    not."""
    from tlc.dialect.program_ops import ParamsOp

    nodes = [
        helper.make_node("Conv", ["x", "conv::w", "b"], ["c"]),
        helper.make_node("Flatten", ["c"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    inits = [("conv::w", RNG.standard_normal((2, 1, 2, 2))), ("b", RNG.standard_normal(2)),
             ("m", RNG.standard_normal((8, 3)))]  # fmt: skip
    traced = tlc.from_onnx(make_model(nodes, [("x", (1, 1, 3, 3))], "y", inits))
    (binding,) = [op for op in traced.module.ops if isinstance(op, ParamsOp)]
    assert binding.declared == {"conv__w": (2, 1, 2, 2), "b": (2,)}
    assert [b.field_params() for b in binding.binds] == [{"weight": "conv__w", "bias": "b"}]
