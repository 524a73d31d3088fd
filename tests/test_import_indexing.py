"""Indexing, splitting, resampling and attention through both importers.

ONNX: Gather, Slice, Split, Squeeze/Unsqueeze, Tile and Resize (every nearest_mode and
coordinate_transformation_mode of the nearest, linear and cubic modes, antialiasing,
tf_crop_and_resize, scales and sizes) against ONNX's
own reference evaluator, which is the operator specification in code; old-opset forms (Slice-1
attributes, Upsample-9) through the version converter. PyTorch: getitem, split/chunk/unbind,
stack, repeat, interpolate (bicubic and antialiased too), adaptive pools with uneven windows,
scaled_dot_product_attention, einsum (with `...`, diagonals, three operands),
nn.MultiheadAttention and nn.TransformerEncoderLayer, compared with PyTorch in float64.

Tolerances: a gather moves values exactly, so ONNX's indexing and nearest resizing must agree
exactly (rtol 0); the PyTorch indexing cases add and reduce the gathered values (a reduction's
order may differ: 1e-12); linear interpolation, pooling averages and attention compute the same
formulas in float64 with a different association of the sums (a few ulp): rtol 1e-10,
atol 1e-12.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
import torch.nn.functional as F  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from torch import nn  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

D = TensorProto.DOUBLE
RNG = np.random.default_rng(7)


def onnx_model(nodes: list[Any], shape: tuple[int, ...], inits: dict[str, Any], opset: int = 21):
    output = onnx.ValueInfoProto(name="y")
    output.type.tensor_type.elem_type = D
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", D, shape)],
        [output],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def check_onnx(
    model: Any, shape: tuple[int, ...], rtol: float = 1e-12, atol: float | None = None
) -> Any:
    x = RNG.standard_normal(shape)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    traced = tlc.from_onnx(model)
    got = interpret(traced.graph, traced.payload, x).output
    assert got.shape == expected.shape
    if atol is None:
        atol = 1e-12 if rtol else 0
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    return traced


def i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


GATHERS = {
    "gather_matrix_of_indices": (
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        (2, 5, 3), {"i": np.asarray([[0, -1], [4, 4], [2, 0]], np.int64)},
    ),
    "gather_scalar_index": (
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=-1)], (2, 4),
        {"i": np.asarray(2, np.int64)},
    ),
    "slice_steps_and_clamping": (
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], (6, 7, 5),
        {"s": i64(-1, 1, -100), "e": i64(-100, 1000, 4), "a": i64(0, 1, 2),
         "st": i64(-2, 3, 1)},
    ),
    "slice_negative_step_start_past_the_end": (
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], (5, 4),
        {"s": i64(100), "e": i64(-100), "a": i64(1), "st": i64(-1)},
    ),
    "split_sizes_two_used": (
        [helper.make_node("Split", ["x", "sp"], ["a", "b", "c"], axis=1),
         helper.make_node("Concat", ["c", "a"], ["y"], axis=1)], (2, 6),
        {"sp": i64(1, 2, 3)},
    ),
    "split_num_outputs_uneven": (
        [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3),
         helper.make_node("Concat", ["c", "b", "a"], ["y"], axis=0)], (8, 2), {},
    ),
    "squeeze_unsqueeze": (
        [helper.make_node("Squeeze", ["x", "sa"], ["s"]),
         helper.make_node("Unsqueeze", ["s", "ua"], ["y"])], (1, 3, 1, 2),
        {"sa": i64(0, -2), "ua": i64(-1, 0)},
    ),
    "squeeze_every_unit_axis": (
        [helper.make_node("Squeeze", ["x"], ["y"])], (1, 3, 1), {},
    ),
    "tile": ([helper.make_node("Tile", ["x", "r"], ["y"])], (2, 3), {"r": i64(3, 2)}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_onnx_indexing_matches_the_reference(name: str) -> None:
    nodes, shape, inits = GATHERS[name]
    check_onnx(onnx_model(nodes, shape, inits, opset=18), shape, rtol=0)


TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
              "half_pixel_symmetric"]  # fmt: skip
ROUNDINGS = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def resize(shape: tuple[int, ...], by: str, values: list[float], **attrs: Any) -> Any:
    inputs = ["x", "", "scales"] if by == "scales" else ["x", "", "", "sizes"]
    dtype = np.float32 if by == "scales" else np.int64
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return onnx_model([node], shape, {by: np.asarray(values, dtype)}, opset=19)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_onnx_resize_nearest(transform: str, rounding: str) -> None:
    for by, values in (("scales", [1, 1, 2.5, 0.6]), ("sizes", [1, 2, 7, 3])):
        model = resize((1, 2, 3, 5), by, values, mode="nearest", nearest_mode=rounding,
                       coordinate_transformation_mode=transform)  # fmt: skip
        traced = check_onnx(model, (1, 2, 3, 5), rtol=0)
        assert {n.TAG for n in traced.graph.nodes} <= {"input", "gather", "reshape"}


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_onnx_resize_linear(transform: str) -> None:
    for by, values in (("scales", [1, 1, 2.0, 0.6]), ("sizes", [1, 2, 7, 3])):
        model = resize((1, 2, 3, 5), by, values, mode="linear",
                       coordinate_transformation_mode=transform)  # fmt: skip
        check_onnx(model, (1, 2, 3, 5), rtol=1e-12)


@pytest.mark.parametrize("transform", [*TRANSFORMS, "tf_crop_and_resize"])
@pytest.mark.parametrize(
    "mode,attrs",
    [
        ("cubic", {}),
        ("cubic", {"cubic_coeff_a": -0.5, "exclude_outside": 1}),
        ("cubic", {"antialias": 1}),
        ("cubic", {"antialias": 1, "exclude_outside": 1}),
        ("linear", {"antialias": 1}),
        ("nearest", {}),
    ],
)
def test_onnx_resize_cubic_antialias_and_crop(transform: str, mode: str, attrs: dict) -> None:
    """Cubic (cubic_coeff_a, exclude_outside), antialiased linear and cubic, and
    tf_crop_and_resize (a roi reaching past the input, so some outputs are
    extrapolation_value) against the reference, up- and downsampling in one model. Linear and
    nearest weights are the reference's, summed in another order: rtol 1e-12. The reference
    computes cubic weights in float32 (cubic_coeff_a is a float32 attribute and NumPy keeps
    float32 arithmetic), tl in float64: a weight takes about ten float32 operations (and the
    antialiased ones a normalisation), so it is off by up to ~1e-6 relative; the weights'
    magnitudes sum to at most 1.4 and the inputs are below 5 in magnitude: rtol and atol 1e-5."""
    if mode == "nearest" and transform != "tf_crop_and_resize":
        return  # nearest's other coordinate modes: test_onnx_resize_nearest
    roi = np.asarray([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3])  # double: the reference's in f64 too
    for by, values in (("scales", [1, 1, 2.5, 0.4]), ("sizes", [1, 2, 7, 2])):
        dtype = np.float32 if by == "scales" else np.int64
        inputs = ["x", "roi", "v", ""] if by == "scales" else ["x", "roi", "", "v"]
        node = helper.make_node(
            "Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode=transform,
            extrapolation_value=-3.5, **attrs,
        )  # fmt: skip
        inits = {"roi": roi, "v": np.asarray(values, dtype)}
        model = onnx_model([node], (1, 2, 4, 6), inits, opset=19)
        tolerance = 1e-5 if mode == "cubic" else 1e-12
        check_onnx(model, (1, 2, 4, 6), rtol=tolerance, atol=tolerance)


def test_onnx_cubic_einsum_and_pow_elem_compile_to_the_reference() -> None:
    """The import rules' graphs (weighted gathers, a batched matmul, pow_elem) through the LLVM
    backend, in float64: the compiled matmul sums in another order with fused multiply-adds
    (a few ulp over 12 terms), libm's pow is the reference's: rtol 1e-13."""
    nodes = [
        helper.make_node("Resize", ["x", "", "s"], ["r"], mode="cubic", antialias=1,
                         exclude_outside=1),
        helper.make_node("Einsum", ["r", "r"], ["e"], equation="...ij,...kj->...ik"),
        helper.make_node("Pow", ["e", "p"], ["y"]),
    ]  # fmt: skip
    inits = {"s": np.asarray([1, 1, 0.6, 1.5], np.float32), "p": np.asarray([[[[2, 3, 1, 2]]]])}
    traced = tlc.from_onnx(onnx_model(nodes, (1, 2, 8, 8), inits, opset=19))
    x = RNG.standard_normal((1, 2, 8, 8))
    expected = interpret(traced.graph, traced.payload, x).output
    compiled = tlc.compile(traced.module, traced.payload, dtype="f64")
    np.testing.assert_allclose(compiled(x), expected, rtol=1e-13, atol=0)


def test_onnx_old_opset_forms_are_converted() -> None:
    """Slice-1 (starts/ends as attributes) and Upsample-9 (scales as an input) are older forms
    onnx.version_converter rewrites to Slice-13 and Resize."""
    slice1 = onnx_model(
        [helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, 100], axes=[0, 2])],
        (4, 3, 5), {}, opset=9,
    )  # fmt: skip
    check_onnx(slice1, (4, 3, 5), rtol=0)
    upsample = onnx_model(
        [helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")], (1, 2, 3, 3),
        {"s": np.asarray([1, 1, 2, 3], np.float32)}, opset=9,
    )  # fmt: skip
    traced = tlc.from_onnx(upsample)
    x = RNG.standard_normal((1, 2, 3, 3))
    expected = np.repeat(np.repeat(x, 2, axis=2), 3, axis=3)
    np.testing.assert_array_equal(interpret(traced.graph, traced.payload, x).output, expected)


@pytest.mark.parametrize("opset", [7, 9, 10])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_onnx_old_resize_keeps_its_asymmetric_coordinates(opset: int, mode: str) -> None:
    """Upsample-7/9 and Resize-10 map coordinates as x / scale (nearest rounds down when
    upsampling, up when downsampling); onnx.version_converter's Resize-13 drops that (its
    default is half_pixel), so the importer states it. Checked against ONNX Runtime running
    the old operator itself (float32: rtol 1e-6)."""
    ort = pytest.importorskip("onnxruntime")
    scales = [1.0, 1.0, 0.5, 0.6] if opset == 10 and mode == "nearest" else [1.0, 1.0, 3.0, 2.5]
    inits = {} if opset == 7 else {"s": np.asarray(scales, np.float32)}
    op_type = "Resize" if opset == 10 else "Upsample"
    inputs = ["x"] if opset == 7 else ["x", "s"]
    attrs = {"scales": scales} if opset == 7 else {}
    node = helper.make_node(op_type, inputs, ["y"], mode=mode, **attrs)
    model = onnx_model([node], (1, 1, 4, 5), inits, opset=opset)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    x = RNG.standard_normal((1, 1, 4, 5)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    traced = tlc.from_onnx(model)
    got = interpret(traced.graph, traced.payload, x.astype(np.float64)).output
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_onnx_refusals_name_the_reason() -> None:
    area = resize((1, 1, 2, 2), "scales", [1, 1, 2, 2], mode="area")
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(area)
    assert str(info.value).endswith("(Resize): mode 'area' (nearest, linear or cubic)")
    crop = onnx_model(
        [helper.make_node("Resize", ["x", "roi", "s"], ["y"],
                          coordinate_transformation_mode="tf_crop_and_resize")], (1, 1, 4, 4),
        {"roi": np.asarray([0, 0, 1, 1], np.float32), "s": np.asarray([1, 1, 2, 2], np.float32)},
        opset=19,
    )  # fmt: skip
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(crop)
    assert str(info.value).endswith("(Resize): roi holds 4 values (expected 8)")
    smooth = resize((1, 1, 4, 4), "scales", [1, 1, 0.5, 0.5], mode="nearest", antialias=1)
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(smooth)
    assert str(info.value).endswith(
        "(Resize): antialias=1 with mode 'nearest' (linear and cubic only)"
    )
    mixed = onnx_model(
        [helper.make_node("Resize", ["x", "s"], ["y"], name="up_and_down")], (1, 1, 4, 4),
        {"s": np.asarray([1, 1, 2, 0.5], np.float32)}, opset=10,
    )  # fmt: skip
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(mixed)
    assert str(info.value) == (
        "ONNX import: '<onnx model>': Resize-10 node 'up_and_down': nearest resizing that both "
        "up- and downsamples (its rounding differs per axis)"
    )
    gather = onnx_model([helper.make_node("Gather", ["x", "i"], ["y"])], (3,), {"i": i64(3)})
    with pytest.raises(DiagnosticError) as info:
        tlc.from_onnx(gather)
    assert str(info.value).endswith("(Gather): index 3 out of range for axis 0 of shape [3]")


# --------------------------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------------------------


class Fn(nn.Module):
    def __init__(self, function: Any, **modules: nn.Module) -> None:
        super().__init__()
        self.function = function
        self.layers = nn.ModuleDict(modules)
        self.register_buffer("index", torch.tensor([2, 0, 2]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self, x)


def check_torch(model: nn.Module, x: torch.Tensor, rtol: float = 1e-10) -> Any:
    model = model.double().eval()
    traced = tlc.from_torch(model, x)
    with torch.no_grad():
        expected = model(x).numpy()
    got = interpret(traced.graph, traced.payload, x.numpy()).output
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-12 if rtol else 0)
    return traced


INDEXING = {
    "getitem": lambda m, x: x[:, 0] + x[1, :, None, 2:4].sum() + x[..., ::2, -1].mean(),
    "getitem_list_and_buffer": lambda m, x: x[:, [3, 0, 3]] * x[:, m.index],
    "index_select_narrow_select": lambda m, x: (
        torch.index_select(x, 1, m.index) + x.narrow(1, 1, 3) * x.select(2, -1)[:, :3, None]
    ),
    "split_chunk_unbind": lambda m, x: (
        torch.cat(x.split(2, dim=1)[::-1], 1)
        + torch.cat(x.chunk(3, 1), 1)
        + torch.stack(x.unbind(1), 1)
    ),
    "stack_repeat_tile_expand": lambda m, x: (
        torch.stack([x, x * 2], dim=-1).sum(-1)
        + x[:, :1].expand(-1, 4, -1)
        + x.repeat(1, 2, 1)[:, 2:6]
        + torch.tile(x, (2,))[..., :5]
    ),
    "repeat_interleave_flip": lambda m, x: x.repeat_interleave(2, dim=1)[:, ::2] + x.flip(1, 2),
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_torch_indexing_matches(name: str) -> None:
    traced = check_torch(Fn(INDEXING[name]), torch.randn(2, 4, 5, dtype=torch.float64), 1e-12)
    assert "gather" in [n.TAG for n in traced.graph.nodes]


RESAMPLING = {
    "nearest_scale": lambda m, x: F.interpolate(x, scale_factor=(2.0, 1.5)),
    "nearest_size": lambda m, x: F.interpolate(x, size=(3, 11)),
    "nearest_exact": lambda m, x: F.interpolate(x, size=(7, 4), mode="nearest-exact"),
    "bilinear": lambda m, x: F.interpolate(x, scale_factor=2.0, mode="bilinear"),
    "bilinear_size": lambda m, x: F.interpolate(x, size=(4, 9), mode="bilinear"),
    "bilinear_align_corners": lambda m, x: F.interpolate(
        x, size=(9, 4), mode="bilinear", align_corners=True
    ),
    "area": lambda m, x: F.interpolate(x, size=(2, 3), mode="area"),
    "bicubic": lambda m, x: F.interpolate(x, scale_factor=2.5, mode="bicubic"),
    "bicubic_size_down": lambda m, x: F.interpolate(x, size=(3, 5), mode="bicubic"),
    "bicubic_align_corners": lambda m, x: F.interpolate(
        x, size=(11, 4), mode="bicubic", align_corners=True
    ),
    "bicubic_antialias": lambda m, x: F.interpolate(
        x, size=(3, 3), mode="bicubic", antialias=True
    ) + F.interpolate(x, size=(9, 3), mode="bicubic", antialias=True)[:, :, ::4],
    "bilinear_antialias": lambda m, x: F.interpolate(
        x, scale_factor=0.3, mode="bilinear", antialias=True
    ),
    "antialias_align_corners": lambda m, x: F.interpolate(
        x, size=(3, 11), mode="bilinear", antialias=True, align_corners=True
    ) + F.interpolate(x, size=(3, 11), mode="bicubic", antialias=True, align_corners=True),
    "upsample_module": lambda m, x: m.layers["up"](x),
    "adaptive_uneven": lambda m, x: (
        F.adaptive_avg_pool2d(x, (4, 3)) + F.adaptive_max_pool2d(x, (4, 3))
        + m.layers["avg"](x)[..., :3]
    ),
    "adaptive_even": lambda m, x: F.adaptive_avg_pool2d(x, (5, 1)) * m.layers["max"](x),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RESAMPLING))
def test_torch_resampling_matches(name: str) -> None:
    modules = {
        "up": nn.Upsample(scale_factor=3, mode="bilinear"),
        "avg": nn.AdaptiveAvgPool2d((4, None)),
        "max": nn.AdaptiveMaxPool2d(1),
    }
    check_torch(Fn(RESAMPLING[name], **modules), torch.randn(1, 2, 5, 7, dtype=torch.float64))


ATTENTION = {
    "sdpa": lambda m, x: F.scaled_dot_product_attention(x, x * 0.5, x.flip(2)),
    "sdpa_causal_scale": lambda m, x: F.scaled_dot_product_attention(
        x, x, x, is_causal=True, scale=0.3
    ),
    "sdpa_bool_mask": lambda m, x: F.scaled_dot_product_attention(
        x, x, x, attn_mask=m.mask
    ),
    "einsum_attention": lambda m, x: torch.einsum(
        "bhls,bhsd->bhld", torch.einsum("bhld,bhsd->bhls", x, x).softmax(-1), x
    ),
    "einsum_sums_and_transposes": lambda m, x: (
        torch.einsum("bhld->ld", x) + torch.einsum("bhld,hd->bhl", x, x[0, :, 0])[..., None]
        + torch.einsum("bhld->bhdl", x).transpose(-1, -2)
    ),
    "einsum_ellipsis_attention": lambda m, x: torch.einsum(
        "...ls,...sd->...ld", torch.einsum("...ld,...sd->...ls", x, x).softmax(-1), x
    ),
    "einsum_ellipsis_broadcast_and_implicit": lambda m, x: (
        torch.einsum("...ld,...d->...l", x, x[:, :1, 0])[..., None]
        + torch.einsum("b...d,bd->b...", x, x[:, 0, 0])[..., None]
        + torch.einsum("...d", x)
    ),
    "einsum_three_operands_and_diagonal": lambda m, x: (
        torch.einsum("bhld,bhdk,bhkm->bhlm", x, x.transpose(-1, -2), x)
        + torch.einsum("bhii->bhi", x[..., :4, :4])[..., None, :]
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_torch_attention_matches(name: str) -> None:
    model = Fn(ATTENTION[name])
    model.register_buffer("mask", torch.rand(5, 5) > 0.3)
    model.mask[:, 0] = True  # every row attends somewhere
    check_torch(model, torch.randn(2, 3, 5, 4, dtype=torch.float64))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_traced_through(batch_first: bool) -> None:
    attention = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    model = Fn(lambda m, x: m.layers["mha"](x, x, x, need_weights=False)[0], mha=attention)
    traced = check_torch(model, torch.randn(3, 4, 8, dtype=torch.float64))
    assert "softmax" in [n.TAG for n in traced.graph.nodes]


def test_multihead_attention_weights_and_other_key_dims() -> None:
    """The attention weights (need_weights, averaged over heads), and separate key/value
    projections (kdim, vdim: the packed bias is split by `chunk`, folded as a constant)."""
    attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def both_outputs(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        output, weights = m.layers["mha"](x, x, x)
        return output.sum(-1) + weights.sum(-1)

    both = Fn(both_outputs, mha=attention)
    check_torch(both, torch.randn(2, 4, 8, dtype=torch.float64))

    class KeyValue(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2, kdim=6, vdim=5)

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.mha(q, k, v, need_weights=False)[0]

    model = KeyValue().double().eval()
    q, k, v = (torch.randn(*s, dtype=torch.float64) for s in ((3, 2, 8), (4, 2, 6), (4, 2, 5)))
    traced = tlc.from_torch(model, (q, k, v))
    with torch.no_grad():
        expected = model(q, k, v).numpy()
    got = interpret(traced.graph, traced.payload, [q.numpy(), k.numpy(), v.numpy()]).output
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_transformer_encoder_stack_is_traced_through() -> None:
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    traced = check_torch(model, torch.randn(2, 5, 16, dtype=torch.float64))
    assert [n.TAG for n in traced.graph.nodes].count("layernorm") == 4


def test_torch_refusals() -> None:
    def refusal(function: Any, x: torch.Tensor) -> str:
        with pytest.raises(DiagnosticError) as info:
            tlc.from_torch(Fn(function).eval(), x)
        return str(info.value)

    x = torch.randn(2, 3, 4, 4)
    assert refusal(lambda m, x: x[:, [0, 1], [1, 2]], x).endswith(
        "more than one index list or tensor (NumPy's advanced indexing)"
    )
