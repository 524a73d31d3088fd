"""ONNX export: every op with an ONNX form runs in ONNX Runtime and matches the reference
denotation, which makes ONNX Runtime an independent oracle for the interpreter.

Tolerances: ONNX Runtime runs the float32 export, so each op record's `tol32` applies (its
"float32 vs float64" tolerance: a few float32 ulp per step, more for reductions). A float64
export re-imported by `from_onnx` is the same graph up to layout reshapes, so it must agree
with the original to 1e-12 (summation order in the conv/pool reshapes is unchanged), except
where ONNX rounds a normalisation's epsilon to float32 (1e-7).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).parent))

from op_records import NOT_IN_TABLE, RECORDS  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.dialect import ops as tl  # noqa: E402
from tlc.dialect.backward_ops import SignOp  # noqa: E402
from tlc.dialect.registry import NODE_OPS  # noqa: E402
from tlc.frontends.export_onnx import EXPORT, to_onnx  # noqa: E402
from tlc.frontends.import_onnx import from_onnx  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

EXPORTED = [rec for rec in RECORDS if rec.op in EXPORT]


def run_ort(model: onnx.ModelProto, inputs: list[np.ndarray], dtype: type) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {n: np.asarray(x, dtype=dtype) for n, x in zip(names, inputs, strict=True)}
    return session.run(None, feed)[0]


def test_spelled_op_kinds_are_derived() -> None:
    """Every op kind with an ONNX spelling and no explicit rule is exported from it; one
    without a spelling (ONNX has no SiLU) is exported as its decomposition."""
    spelled = {op for op in NODE_OPS if op.ONNX is not None}
    decomposed = {op for op in NODE_OPS if op.defines("decompose")}
    assert {tl.LeakyReluOp, tl.ReluOp, tl.GeluOp, tl.MatmulOp, SignOp} <= EXPORT.derived
    assert {tl.SiluOp, tl.SeluOp} <= EXPORT.derived - spelled
    assert EXPORT.derived <= spelled | decomposed


def test_every_exported_op_is_tested() -> None:
    """Each exported op has an op record, or is in NOT_IN_TABLE and tested below."""
    untested = set(EXPORT) - {rec.op for rec in EXPORTED}
    assert untested <= set(NOT_IN_TABLE)
    assert untested == {tl.InputOp, SignOp}  # every graph has inputs; sign: test_sign below


LEAKY = """tl.graph @leaky {
  %0 = input : [2, 3]
  %1 = leaky_relu(%0) {negative_slope = 0.2} : [2, 3]
  %2 = leaky_relu(%1) : [2, 3]
  %3 = leaky_relu(%2) {negative_slope = 2.5} : [2, 3]
  output %3
}
"""


@pytest.mark.parametrize("decompose", [False, True])
def test_leaky_relu_runs_in_onnxruntime(decompose: bool) -> None:
    """LeakyRelu (alpha = the slope, left out at the default 0.01), or the op's decomposition
    max/min(x, s x) where asked: ONNX Runtime in float32 matches the float32 reference exactly
    (one rounded product, then a selection). In float64 a slope that is no float32 (0.2, 0.01)
    cannot be an ONNX attribute, so that node is written as its decomposition (a float64
    constant): ONNX's reference evaluator then matches the float64 reference exactly."""
    from onnx.reference import ReferenceEvaluator

    module = tlc.parse(LEAKY)
    graph = module.ops.first
    x = np.random.default_rng(3).standard_normal((2, 3))
    x[0, 0] = 0.0
    options = {"decompose": {tl.LeakyReluOp}} if decompose else {}
    model = to_onnx(graph, None, np.float32, **options)
    kinds = [n.op_type for n in model.graph.node]
    if decompose:
        assert "LeakyRelu" not in kinds and {"Max", "Min", "Mul"} <= set(kinds)
    else:
        assert kinds == ["LeakyRelu"] * 3 + ["Identity"]
        alphas = [[a.f for a in n.attribute] for n in model.graph.node[:3]]
        assert alphas == [[np.float32(0.2)], [], [np.float32(2.5)]]
    expected = interpret(graph, None, x.astype(np.float32), dtype=np.float32).output
    np.testing.assert_array_equal(run_ort(model, [x], np.float32), expected)
    model64 = to_onnx(graph, None, np.float64, **options)
    if not decompose:  # only 2.5 is a float32
        assert [n.op_type for n in model64.graph.node].count("LeakyRelu") == 1
    (got,) = ReferenceEvaluator(model64).run(None, {"x": x})
    np.testing.assert_array_equal(got, interpret(graph, None, x).output)


def test_sign() -> None:
    module = tlc.parse("tl.graph @s {\n  %0 = input : [5]\n  %1 = sign(%0) : [5]\n  output %1\n}\n")
    x = np.array([-2.0, -0.0, 0.0, 0.5, 3.0])
    model = tlc.to_onnx(module)
    np.testing.assert_array_equal(run_ort(model, [x], np.float32), [-1, 0, 0, 1, 1])


@pytest.mark.parametrize("rec", EXPORTED, ids=lambda r: r.name)
def test_onnxruntime_matches_the_denotation(rec) -> None:
    graph = rec.graph()
    inputs, payload = rec.sample(np.random.default_rng(7))
    expected = interpret(graph, payload, inputs).output
    model = to_onnx(graph, payload, np.float32)
    got = run_ort(model, [x for x in inputs], np.float32)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **rec.tol32.kw())


@pytest.mark.parametrize("rec", EXPORTED, ids=lambda r: r.name)
def test_float64_export_reimports_to_the_same_values(rec) -> None:
    graph = rec.graph()
    inputs, payload = rec.sample(np.random.default_rng(8))
    expected = interpret(graph, payload, inputs).output
    back = from_onnx(to_onnx(graph, payload, np.float64))
    got = interpret(back.graph, back.payload, inputs).output
    # ONNX stores epsilon as a float32 attribute: a rounded eps moves normalised values by up
    # to ~1e-8 relative; everything else round-trips to summation-order noise.
    rtol = 1e-7 if "eps" in rec.payload else 1e-12
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-14)


def test_seed_mlp_exports_and_runs_in_onnxruntime() -> None:
    text = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
    model = tlc.to_onnx(text)
    x0 = np.array([0.3, -0.2, 0.1, 0.4])
    assert f"{float(run_ort(model, [x0], np.float32)):.6f}" == "0.027713"
    assert [n.op_type for n in model.graph.node] == [
        "MatMul", "Add", "Relu", "MatMul", "Add", "ReduceSum", "Tanh", "Identity",
    ]  # fmt: skip


def test_unsupported_op_is_an_error_naming_the_node() -> None:
    module = tlc.parse("tl.graph @g {\n  %0 = rand_uniform {seed = 1} : [3]\n  output %0\n}\n")
    with pytest.raises(DiagnosticError) as info:
        tlc.to_onnx(module)
    assert info.value.diagnostics[0].message == (
        "ONNX export: node 0: rand_uniform has no ONNX form: ONNX's RandomUniform draws an "
        "implementation-defined stream, not tl's"
    )


@pytest.mark.parametrize("factory,shape", [("cnn", (2, 3, 8, 8)), ("mlp", (3, 8))])
def test_imported_pytorch_models_export_and_match_in_onnxruntime(factory: str, shape) -> None:
    """PyTorch -> tl (FX) -> ONNX -> ONNX Runtime (float32) against the denotation (float64):
    float32 rounding over about ten layers, rtol 1e-5, atol 1e-6."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent / "models"))
    import torch_models

    x = torch.randn(*shape)
    traced = tlc.from_torch(getattr(torch_models, factory)(), x)
    expected = interpret(traced.graph, traced.payload, x.double().numpy()).output
    got = run_ort(tlc.to_onnx(traced.graph, traced.payload), [x.numpy()], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_translate_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from tlc.tools.translate import main

    assert main([]) == 2
    assert "one of the arguments --import-torch" in capsys.readouterr().err
