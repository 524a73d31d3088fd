"""The batch extent `N` (tlc.dialect.batch): its spellings, shape checking at two batch sizes,
running at any batch size (reference, intervals, tlc-run, compiled code), fixing it for a
library, the importers' symbolic batch, and every message a mistake gives."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import tlc
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect.printer import print_tlir
from tlc.dialect.shapes import BATCH
from tlc.semantics.ibp import ibp
from tlc.semantics.interpret import interpret
from tlc.tools.compile import main as compile_main

MLP = """tl.graph @mlp {
  %0 = input : [N, 4]
  %1 = linear(%0) : [N, 5]
  %2 = relu(%1)
  %3 = linear(%2) : [N, 3]
  %4 = reduce_sum(%3) {axis = 1}
  output %4
}
"""
RNG = np.random.default_rng(0)
W1, B1, W2 = RNG.normal(size=(5, 4)), RNG.normal(size=5), RNG.normal(size=(3, 5))
PAYLOAD = {"1.weight": W1, "1.bias": B1, "3.weight": W2}


def numpy_mlp(x: np.ndarray) -> np.ndarray:
    return (np.maximum(x @ W1.T + B1, 0) @ W2.T).sum(axis=1)


def graph(text: str = MLP, payload: dict | None = None):  # noqa: ANN201
    from tlc.api.evaluate import choose

    return choose(text, None, PAYLOAD if payload is None else payload)


def refusal(text: str) -> str:
    with pytest.raises(DiagnosticError) as info:
        tlc.run(text, np.zeros((2, 4)), PAYLOAD)
    return str(info.value)


# -- spelling and shape checking -------------------------------------------------------------


def test_infer_shapes_propagates_n() -> None:
    chosen, _ = graph()
    assert [n.declared_shape for n in chosen.nodes] == [
        (BATCH, 4), (BATCH, 5), (BATCH, 5), (BATCH, 3), (BATCH,)
    ]  # fmt: skip
    assert "%4 = reduce_sum(%3) {axis = 1} : [N]" in print_tlir(chosen.parent_op())


def test_mlir_spells_n_as_a_dynamic_extent_and_reads_it_back() -> None:
    from tlc.api.emit import EMITTERS

    module = tlc.parse(MLP)
    mlir = EMITTERS["mlir"](module)
    assert "!tl.tensor<[?, 4]>" in mlir
    assert print_tlir(tlc.parse(mlir, "m.mlir")) == print_tlir(module)


def test_shape_metadata_may_hold_n() -> None:
    text = (
        "tl.graph @g {\n  %0 = input : [N, 2, 3]\n"
        "  %1 = reshape(%0) {from = [N, 2, 3], to = [N, 6]}\n  output %1\n}\n"
    )
    assert tlc.run(text, np.arange(12.0).reshape(2, 2, 3)).output.shape == (2, 6)
    assert "to = [N, 6]} : [N, 6]" in print_tlir(graph(text, {})[0].parent_op())


def test_another_name_for_an_extent_is_refused() -> None:
    assert refusal(MLP.replace("[N, 4]", "[B, 4]")) == (
        "<string>:2:17: error: unexpected 'B'; expected ']', N (the batch size) or a "
        "non-negative integer\n"
        "  %0 = input : [B, 4]\n"
        "                ^"
    )


def test_n_in_a_field_that_is_not_a_shape_is_refused() -> None:
    text = "tl.graph @g {\n  %0 = input : [N, 4]\n  %1 = softmax(%0) {axis = N}\n  output %1\n}\n"
    assert refusal(text) == (
        "<string>:3:21: error: softmax: 'axis' must be a non-negative integer (at most 2^63-1)\n"
        "  %1 = softmax(%0) {axis = N}\n"
        "                    ^"
    )


def test_an_extent_following_n_in_another_way_is_refused() -> None:
    text = (
        "tl.graph @g {\n  %0 = input : [N, 4]\n  %1 = flatten(%0) {shape = [N, 4]}\n"
        "  output %1\n}\n"
    )
    assert refusal(text).splitlines()[0] == (
        "<string>:3:3: error: IR graph: node 1: extent 0 of its output depends on the batch size "
        "N without being N (8 at N = 2, 12 at N = 3); only the batch extent itself may vary"
    )


def test_a_rule_holding_at_one_batch_size_only_names_it() -> None:
    text = (
        "tl.graph @g {\n  %0 = input : [N, 4]\n  %1 = input : [2, 4]\n"
        "  %2 = add(%0, %1)\n  output %2\n}\n"
    )
    with pytest.raises(DiagnosticError) as info:
        tlc.plan(text)
    assert str(info.value).splitlines()[0] == (
        "<string>:4:3: error: add: shape mismatch: [3, 4] vs [2, 4] (with the batch size N = 3)"
    )


# -- running at any batch size -----------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3, 7, 0])
def test_the_reference_runs_at_any_batch_size(batch: int) -> None:
    x = RNG.normal(size=(batch, 4))
    np.testing.assert_allclose(tlc.run(MLP, x, PAYLOAD).output, numpy_mlp(x), rtol=1e-12)
    chosen, payload = graph()
    assert interpret(chosen, payload, x).output.shape == (batch,)


def test_a_flat_input_gives_the_batch_size_and_a_bad_count_is_refused() -> None:
    x = RNG.normal(size=(2, 4))
    flat = tlc.run(MLP, x.ravel().tolist(), PAYLOAD).output
    np.testing.assert_array_equal(flat, tlc.run(MLP, x, PAYLOAD).output)
    with pytest.raises(DiagnosticError) as info:
        tlc.run(MLP, [1.0] * 7, PAYLOAD)
    assert str(info.value) == "input: expected a multiple of 4 values for input shape [N, 4], got 7"


def test_inputs_disagreeing_on_n_are_refused() -> None:
    text = (
        "tl.graph @g {\n  %0 = input : [N, 4]\n  %1 = input : [N, 4]\n"
        "  %2 = add(%0, %1)\n  output %2\n}\n"
    )
    assert tlc.run(text, [np.ones((3, 4)), np.ones((3, 4))]).output.shape == (3, 4)
    with pytest.raises(DiagnosticError) as info:
        tlc.run(text, [np.ones((2, 4)), np.ones((3, 4))])
    assert str(info.value).splitlines()[0] == (
        "<string>:3:3: error: IR eval: the inputs give two batch sizes N: 2 (input 0) and 3 "
        "(input 1)"
    )


def test_interval_bounds_at_any_batch_size() -> None:
    x = RNG.normal(size=(3, 4))
    box = tlc.ibp(MLP, x, 0.01, PAYLOAD)[-1]
    assert box.lo.shape == (3,)
    assert np.all(box.lo <= numpy_mlp(x)) and np.all(numpy_mlp(x) <= box.hi)
    chosen, payload = graph()
    direct = ibp(chosen, payload, x - 0.01, x + 0.01)[-1]  # the semantics' own entry point
    assert np.all(direct.lo <= numpy_mlp(x)) and np.all(numpy_mlp(x) <= direct.hi)


def test_tlc_run_takes_the_batch_size_from_input(tmp_path: Path) -> None:
    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    npz = tmp_path / "p.npz"
    np.savez(npz, **PAYLOAD)
    x = RNG.normal(size=(2, 4)).round(3)
    values = ",".join(str(v) for v in x.ravel())
    for backend in ("reference", "llvm"):
        done = subprocess.run(
            ["tlc-run", str(path), "--payload", str(npz), "--input", values, "--backend", backend,
             "--arithmetic", "f64"],  # numpy_mlp computes in float64
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        expected = ", ".join(f"{v:.6f}" for v in numpy_mlp(x))
        assert (done.returncode, done.stdout) == (0, f"node 4: [{expected}]\n"), done.stderr


# -- compiled code -----------------------------------------------------------------------------


def test_compiled_code_is_specialised_per_batch_size() -> None:
    f = tlc.compile(MLP, PAYLOAD, dtype="f64")
    assert repr(f) == "<compiled @mlp: [N, 4] -> [N], float64, per batch size>"
    for batch in (1, 5, 5, 2):
        x = RNG.normal(size=(batch, 4))
        np.testing.assert_allclose(f(x), numpy_mlp(x), rtol=1e-12)
    assert sorted(f.per_batch.built) == [1, 2, 5]  # one compile per batch size
    with pytest.raises(ValueError, match=r"^tlc_mlp: input has shape \[2, 3\], expected \[N, 4\]$"):
        f(np.zeros((2, 3)))


def test_a_library_needs_the_batch_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    npz = tmp_path / "p.npz"
    np.savez(npz, **PAYLOAD)
    out = tmp_path / "libmlp.so"
    assert compile_main([str(path), "--payload", str(npz), "-o", str(out)]) == 1
    assert (
        f"{path}:1:1: error: codegen: graph @mlp has the batch extent N in its shapes: compile "
        "it for one batch size (tlc-compile --batch N; tlc.compile compiles per batch size at "
        "call time)"
    ) in capsys.readouterr().err
    args = [str(path), "--payload", str(npz), "--batch", "6", "--dtype", "f64", "-o", str(out)]
    assert compile_main(args) == 0
    lib = tlc.load(out)
    assert repr(lib).endswith("<compiled @mlp: [6, 4] -> [6], float64>>")
    x = RNG.normal(size=(6, 4))
    np.testing.assert_allclose(lib(x), numpy_mlp(x), rtol=1e-12)


# -- importers -------------------------------------------------------------------------------


def test_fx_import_with_a_dynamic_batch() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 5)
    ).eval()
    traced = tlc.from_torch(model, torch.randn(2, 3, 8, 8), dynamic_batch=True)
    assert traced.graph.nodes[0].declared_shape == (BATCH, 3, 8, 8)
    compiled = tlc.compile(traced)
    for batch in (1, 4):
        x = torch.randn(batch, 3, 8, 8)
        expected = model(x).detach().numpy()
        np.testing.assert_allclose(tlc.run(traced, x).output, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compiled(x), expected, rtol=1e-4, atol=1e-5)  # f32


def test_fx_import_of_a_model_computing_with_its_batch_size_is_refused() -> None:
    torch = pytest.importorskip("torch")

    class Scaled(torch.nn.Module):
        def forward(self, x):  # noqa: ANN001, ANN202
            return x * x.size(0)

    with pytest.raises(DiagnosticError) as info:
        tlc.from_torch(Scaled(), torch.randn(2, 3), dynamic_batch=True)
    assert str(info.value).startswith(
        "PyTorch graph import: the model does not keep its batch dimension: "
    )
    assert str(info.value).endswith(
        "; import it without dynamic_batch (the example's batch size is then fixed)"
    )


def test_crown_bounds_and_kernel_plans_at_any_batch_size() -> None:
    x = RNG.normal(size=(3, 4))
    result = tlc.bounds(MLP, center=x, radius=0.01, method="crown", payload=PAYLOAD)
    assert np.all(result.lower <= numpy_mlp(x)) and np.all(numpy_mlp(x) <= result.upper)
    batched = tlc.bounds(MLP, center=np.stack([x, x]), radius=0.01, payload=PAYLOAD)
    assert batched.upper.shape == (2, 3)
    plan = tlc.plan(MLP)
    np.testing.assert_allclose(tlc.execute_plan(plan, x, PAYLOAD).output, numpy_mlp(x), rtol=1e-12)


def _dims(info) -> list:  # noqa: ANN001 (an onnx ValueInfoProto)
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def test_onnx_export_writes_n_and_imports_back() -> None:
    """N is the inputs' and output's `dim_param` "N"; shapes the model computes with (a
    reshape's target) come from the input's batch size, so ONNX Runtime runs it at any batch,
    and `from_onnx` reads the same graph back."""
    ort = pytest.importorskip("onnxruntime")
    model = tlc.to_onnx(MLP, PAYLOAD, dtype="f64")
    assert (_dims(model.graph.input[0]), _dims(model.graph.output[0])) == (["N", 4], ["N"])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = RNG.normal(size=(batch, 4))
        np.testing.assert_allclose(session.run(None, {"x": x})[0], numpy_mlp(x), rtol=1e-12)
    back = tlc.from_onnx(model)
    assert [n.declared_shape for n in back.graph.nodes] == [
        n.declared_shape for n in graph()[0].nodes
    ]
    x = RNG.normal(size=(7, 4))
    np.testing.assert_allclose(tlc.run(back, x).output, numpy_mlp(x), rtol=1e-12)
    assert _dims(tlc.to_onnx(MLP, PAYLOAD, batch=5).graph.input[0]) == [5, 4]
    # batch norm over axis 2 of [N, 2, 3, 4] is exported over a [2N, 3, 4] view: k N extents
    bn = """tl.graph @bn {
  %0 = input : [N, 2, 3, 4]
  %1 = batch_norm_eval(%0) {channel_axis = 2, channels = 3}
  output %1
}
"""
    stats = {f"1.{f}": RNG.random(3) + 0.5 for f in ("gamma", "beta", "mean", "var")}
    model = tlc.to_onnx(bn, stats, dtype="f64")
    assert [n.op_type for n in model.graph.node][:3] == ["Shape", "Mul", "Concat"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 4):
        x = RNG.normal(size=(batch, 2, 3, 4))
        expected = tlc.run(bn, x, stats).output
        # ONNX Runtime's BatchNormalization folds its own scale and shift: measured 6e-13
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, atol=1e-11)


def test_onnx_export_refuses_what_depends_on_the_batch_otherwise() -> None:
    from onnx import TensorProto, helper, numpy_helper

    from tlc.frontends.export_batch import export_with_batch

    def export(batch: int):  # noqa: ANN202 (a model whose constant is batch + 1)
        x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch]) for n in "xy")
        c = numpy_helper.from_array(np.full(batch, batch + 1.0, np.float32), "c")
        node = helper.make_node("Add", ["x", "c"], ["y"])
        return helper.make_model(helper.make_graph([node], "g", [x], [y], [c]))

    with pytest.raises(DiagnosticError) as info:
        export_with_batch(export, graph()[0])
    assert str(info.value).splitlines()[0] == (
        "<string>:1:1: error: ONNX export: graph @mlp: the constant 'c' depends on the batch "
        "size, which an ONNX shape cannot say; export it for one batch size "
        "(tlc.to_onnx(..., batch=64))"
    )


def test_gradients_need_one_batch_size() -> None:
    with pytest.raises(DiagnosticError) as info:
        tlc.grad(MLP, PAYLOAD)
    assert str(info.value).splitlines()[0] == (
        "<string>:1:1: error: grad: graph @mlp has the batch extent N; a gradient graph is built "
        "for one batch size (write it, or import the model, with a fixed batch)"
    )
