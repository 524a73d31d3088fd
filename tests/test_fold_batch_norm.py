"""The fold-batch-norm pass (`tlc.passes.fold_batch_norm`, `tlc.compile(fold_batch_norm=True)`):
folded graphs against the unfolded ones, and real networks against PyTorch and ONNX Runtime.

Tolerances:
- Random conv / linear + batch norm (+ relu) graphs, per output element, against the unfolded
  graph: 2 (K + 6) u M, where K is the products each output sums (in/groups x kernel taps, or
  the input features), u the unit roundoff (2^-24 in float32, 2^-53 in float64) and M =
  |s| (|w| |x| + |b| + |mean|) + |beta| with s = gamma / sqrt(var + eps), which bounds the
  magnitudes every intermediate of either form sums. Each form is within (K + 6) u M of the
  exact value (the standard bound for a K-term dot product, Higham's gamma_K, plus the few
  roundings of the batch norm's own steps, of the folded weights' single rounding to float32
  and of the bias), so they are within twice that of each other.
- torchvision resnet18 through FX, float32, relative to the largest output magnitude against
  PyTorch: 1e-4, the bound tests/test_torchvision.py states for float32 (rounding of some 50
  layers); folding adds one rounding per weight.
- ONNX zoo resnet50 against ONNX Runtime: ONNX's backend-test rtol 1e-3, atol 1e-7 per
  element (`tlc.tools.onnx_models`), as docs/onnx-models.md states for the zoo.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp

import tlc
from tlc.core.payload import Payload
from tlc.passes.fold_batch_norm import fold_graph

U = {"f32": 2.0**-24, "f64": 2.0**-53}


def batch_norm_record(rng: np.random.Generator, channels: int) -> dict[str, np.ndarray]:
    return {
        "gamma": rng.uniform(-2.0, 2.0, channels),
        "beta": rng.normal(0.0, 1.0, channels),
        "mean": rng.normal(0.0, 1.0, channels),
        "var": rng.uniform(0.01, 4.0, channels),
        "eps": np.asarray(1e-3),
    }


@st.composite
def layers(draw: st.DrawFn) -> tuple[str, str, dict[str, np.ndarray], np.ndarray, int]:
    """(graph text, the same graph without its batch norm and relu as text, payload, input, K):
    a conv (rank 1 or 2, any groups, stride, padding, with or without bias) or a linear layer,
    then a batch norm, then a relu or nothing."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bias = draw(st.booleans())
    tail = "%3 = relu(%2)\n  output %3" if draw(st.booleans()) else "output %2"
    if draw(st.booleans()):
        features, out = draw(st.integers(1, 40)), draw(st.integers(1, 12))
        rows = draw(st.integers(1, 3))
        layer = f"%1 = linear(%0) : [{rows}, {out}]"
        shape, weight, k = (rows, features), rng.normal(0, 1, (out, features)), features
    else:
        groups = draw(st.sampled_from([1, 2, 3]))  # depthwise where in_channels = groups
        cin, cout = groups * draw(st.integers(1, 4)), groups * draw(st.integers(1, 4))
        rank, kernel = draw(st.sampled_from([1, 2])), draw(st.integers(1, 3))
        stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 1))
        shape = (draw(st.integers(1, 2)), cin) + (draw(st.integers(kernel, 7)),) * rank
        out = cout
        layer = (
            f"%1 = conv(%0) {{kernel = {[kernel] * rank}, stride = {[stride] * rank}, "
            f"padding = {[pad] * rank}, groups = {groups}, channel_axis = 1, "
            f"in_channels = {cin}, out_channels = {cout}}}"
        )
        weight = rng.normal(0, 1, (cout, cin // groups) + (kernel,) * rank)
        k = cin // groups * kernel**rank
    payload = {"1.weight": weight}
    if bias:
        payload["1.bias"] = rng.normal(0, 1, out)
    payload.update({f"2.{f}": v for f, v in batch_norm_record(rng, out).items()})
    head = f"tl.graph @g {{\n  %0 = input : {list(shape)}\n  {layer}\n"
    norm = f"  %2 = batch_norm_eval(%1) {{channel_axis = 1, channels = {out}}}\n"
    text = head + norm + f"  {tail}\n}}\n"
    alone = head + "  output %1\n}\n"
    return text, alone, payload, rng.normal(0, 1, shape), k


def magnitude(alone: str, payload: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """M = |s| (|w| |x| + |b| + |mean|) + |beta|, per output element (float64)."""
    absolute = {"1.weight": np.abs(payload["1.weight"])}
    if "1.bias" in payload:
        absolute["1.bias"] = np.abs(payload["1.bias"])
    sums = tlc.run(alone, np.abs(x), absolute).output
    view = (1, -1) + (1,) * (sums.ndim - 2)
    scale = np.abs(payload["2.gamma"]) / np.sqrt(payload["2.var"] + payload["2.eps"])
    mean, beta = np.abs(payload["2.mean"]), np.abs(payload["2.beta"])
    return scale.reshape(view) * (sums + mean.reshape(view)) + beta.reshape(view)


@settings(max_examples=40, deadline=None)
@given(layers())
def test_a_folded_graph_computes_the_unfolded_one(case: tuple) -> None:
    text, alone, payload, x, k = case
    (graph,) = tlc.parse(text).ops
    done = fold_graph(graph, Payload.from_flat(payload))
    assert done is not None
    assert "batch_norm_eval" not in [n.TAG for n in done.graph.nodes]
    bound = 2 * (k + 6) * magnitude(alone, payload, x)
    exact = tlc.run(text, x, payload).output
    folded = tlc.run(ModuleOp([done.graph]), x, done.payload).output
    assert np.all(np.abs(folded - exact) <= U["f64"] * bound)
    plain = tlc.compile(text, payload)(x)
    fast = tlc.compile(text, payload, fold_batch_norm=True)(x)
    assert np.all(np.abs(fast.astype(np.float64) - plain) <= U["f32"] * bound)


def test_resnet18_through_fx_folded_matches_pytorch() -> None:
    """Every batch norm of torchvision's resnet18 follows a convolution alone: all 20 fold.
    The batch norms get random statistics (torchvision's fresh ones are the identity)."""
    torch = pytest.importorskip("torch")
    from torchvision_models import network

    net, x = network("resnet18", 32)
    generator = torch.Generator().manual_seed(0)
    for layer in net.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            for values, low, high in ((layer.weight.data, 0.5, 1.5), (layer.running_var, 0.5, 2)):
                values.uniform_(low, high, generator=generator)
            layer.bias.data.normal_(0.0, 0.1, generator=generator)
            layer.running_mean.normal_(0.0, 0.1, generator=generator)
    traced = tlc.from_torch(net, x)
    done = fold_graph(traced.graph, traced.payload)
    assert done is not None and len(done.folded) == 20
    with torch.no_grad():
        expected = net(x).numpy()
    got = tlc.compile(traced, fold_batch_norm=True)(x.numpy())
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-4


def test_zoo_resnet50_through_onnx_folded_matches_onnxruntime() -> None:
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from tlc.tools.onnx_models import ATOL, RTOL, _light_data, fill_weights, model_name, model_paths

    (path,) = [p for p in model_paths("light") if model_name(p) == "resnet50"]
    model = fill_weights(onnx.load(path))
    (x,), (expected,) = _light_data(model)
    traced = tlc.from_onnx(model)
    done = fold_graph(traced.graph, traced.payload)
    assert done is not None and len(done.folded) == 53  # all of them
    got = tlc.compile(traced, fold_batch_norm=True)(x)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_a_refused_batch_norm_compiles_to_the_unfolded_bits() -> None:
    """The conv's output also feeds the add, so nothing folds: the same graph, the same bits."""
    text = """tl.graph @g {
  %0 = input : [1, 2, 3, 3]
  %1 = conv(%0) {kernel = [1, 1], channel_axis = 1, in_channels = 2, out_channels = 2}
  %2 = batch_norm_eval(%1) {channel_axis = 1, channels = 2}
  %3 = add(%1, %2)
  output %3
}
"""
    rng = np.random.default_rng(0)
    payload = {"1.weight": rng.normal(0, 1, (2, 2, 1, 1))}
    payload.update({f"2.{f}": v for f, v in batch_norm_record(rng, 2).items()})
    (graph,) = tlc.parse(text).ops
    assert fold_graph(graph, Payload.from_flat(payload)) is None
    x = rng.normal(0, 1, (1, 2, 3, 3))
    plain = tlc.compile(text, payload)(x)
    assert np.array_equal(tlc.compile(text, payload, fold_batch_norm=True)(x), plain)
