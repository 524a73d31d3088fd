"""Real models of the collections inside the onnx wheel through the ONNX import, as shipped
(opsets 6-12): the counts docs/onnx-models.md reports, which may only grow.

Tolerance: ONNX's backend-test rtol 1e-3, atol 1e-7 against the stored float32/float64 outputs
(`tlc.tools.onnx_models.RTOL`/`ATOL`); every model that imports must match in float64.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from tlc.tools.onnx_models import model_name, model_paths, report, run_model  # noqa: E402

#: (models, import, match f64, match f32) per collection, as measured; never lowered.
PYTORCH_COUNTS = {"pytorch-converted": (82, 82, 82, 82), "pytorch-operator": (35, 35, 35, 30)}


@pytest.mark.parametrize("collection", sorted(PYTORCH_COUNTS))
def test_pytorch_sets(collection: str) -> None:
    results = [run_model(collection, path) for path in model_paths(collection)]
    models, imported, match64, match32 = PYTORCH_COUNTS[collection]
    assert len(results) == models
    assert sum(r.imported for r in results) >= imported
    assert sum(bool(r.match64) for r in results) >= match64
    assert sum(bool(r.match32) for r in results) >= match32
    table = report(results).splitlines()
    assert table[2].startswith(f"| {collection} | {models} | ")
    for r in results:
        assert r.imported or r.reasons, f"{r.name} refused without a reason"
        if r.imported:
            assert r.match64, f"{r.name} imports but differs from its stored output"
            assert r.match32 or r.double, f"{r.name} differs in float32"


def test_every_light_zoo_model_imports() -> None:
    """Imports only (evaluating vgg19 takes minutes); three models' values are checked below."""
    for path in model_paths("light"):
        result = run_model("light", path, evaluate=False)
        assert result.imported, (result.name, result.reasons)


@pytest.mark.parametrize(
    "name", ["inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet"]
)
def test_light_model_matches_onnxruntime(name: str, capfd: pytest.CaptureFixture[str]) -> None:
    """inception_v1 through LRN, inception_v2, resnet50, shufflenet, and squeezenet through
    GlobalAveragePool. The filled weights keep the softmax unsaturated (`fill_weights` scales
    the classifier), so the probabilities compared are not just 0 and 1. ONNX Runtime's
    sessions print nothing (its default logger listed every initializer it removed)."""
    pytest.importorskip("onnxruntime")
    (path,) = [p for p in model_paths("light") if model_name(p) == name]
    result = run_model("light", path)
    assert result.match64 and result.match32, result
    assert "W:onnxruntime" not in capfd.readouterr().err
