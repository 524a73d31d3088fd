"""Real models through the ONNX import: the model collections shipped inside the onnx wheel.

- `light`: ONNX's model zoo "light" models (`onnx/backend/test/data/light/*.onnx`: alexnet,
  densenet121, inception v1/v2, resnet50, shufflenet, squeezenet, vgg19, zfnet512), opset 9.
  They store each weight's shape only (a `ConstantOfShape` of a shape initializer); the runner
  fills every such weight with random values (`fill_weights`) and compares tlc's reference
  evaluation with ONNX Runtime on the filled model, on a random input.
- `pytorch-converted`, `pytorch-operator`: ONNX's small models converted from PyTorch
  (`onnx/backend/test/data/pytorch-*/*/model.onnx`, opsets 6-12), each with stored inputs and
  outputs (`test_data_set_0`), compared with those.

Every model is imported as shipped (any opset, through `tlc.from_onnx`); one that imports is
evaluated by the reference denotation in float64 and (for FLOAT models: a DOUBLE model's
stored values need not fit float32) in float32, and compared at `RTOL`/`ATOL` (ONNX's own
backend-test tolerances; NaN matches NaN). A refused model records each reason: every gap an
unsupported-nodes report lists (`LRN`, `MaxPool attribute 'foo'`) or the diagnostic's text.

    python -m tlc.tools.onnx_models            # the markdown of docs/onnx-models.md

tests/test_onnx_models.py keeps the counts (they may only grow).
"""

from __future__ import annotations

import glob
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tlc.core.diagnostics import DiagnosticError
from tlc.core.progress import Progress
from tlc.frontends.onnx_prepare import UnsupportedNodes

#: ONNX's backend-test tolerances (`onnx.backend.test.runner`), for float32 stored outputs.
RTOL, ATOL = 1e-3, 1e-7
SETS = ("light", "pytorch-converted", "pytorch-operator")


@cache
def data_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def model_paths(collection: str) -> list[str]:
    """The model files of one collection, sorted by name."""
    if collection == "light":
        return sorted(glob.glob(os.path.join(data_dir(), "light", "*.onnx")))
    return sorted(glob.glob(os.path.join(data_dir(), collection, "*", "model.onnx")))


def model_name(path: str) -> str:
    base = os.path.basename(path)
    if base == "model.onnx":
        return os.path.basename(os.path.dirname(path))
    return base.removesuffix(".onnx").removeprefix("light_")


#: The inputs of these op types (by index) that hold offsets: biases and batch-norm means, filled
#: with small zero-mean values so that they neither drift the activations up layer after layer
#: nor switch whole ReLU channels off.
OFFSETS = {"Conv": (2,), "Gemm": (2,), "BatchNormalization": (2, 3), "ConvTranspose": (2,)}
#: Ops through which a layer's output reaches the logits scaled by the same positive factor
#: (positively homogeneous of degree 1), so scaling that layer's weight and bias scales them.
HOMOGENEOUS = {
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Dropout", "Relu", "MaxPool",
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Identity",
}  # fmt: skip
#: The spread the classifier's logits are scaled to (their standard deviation over the classes):
#: the softmax then spreads over many classes (the largest probability ~0.1 of 1000), so its
#: values say something where random weights would otherwise saturate it to 0 and 1.
LOGIT_STD = 2.0


def fill_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of `model` whose `ConstantOfShape` nodes with a constant shape are initializers
    of random values: He-scaled normals for kernels and matrices, normals of standard deviation
    0.1 for offsets (`OFFSETS`), uniform in [0.5, 1.5] for the other vectors (batch-norm scales
    and variances, which must be positive). Where the model ends in a Softmax fed (through
    `HOMOGENEOUS` ops) by a Gemm or Conv, that layer's weight and bias are then scaled so that
    its logits on a random input have a standard deviation of `LOGIT_STD` (ONNX Runtime runs the
    filled model once to measure them)."""
    rng = np.random.default_rng(seed)
    filled = onnx.ModelProto()
    filled.CopyFrom(model)
    graph = filled.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    offsets = {
        node.input[i]
        for node in graph.node
        for i in OFFSETS.get(node.op_type, ())
        if i < len(node.input)
    }
    kept = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        if len(shape) >= 2:
            value = rng.standard_normal(shape, np.float32)
            value *= np.float32(np.sqrt(2.0 / int(np.prod(shape[1:]))))
        elif node.output[0] in offsets:
            value = rng.normal(0.0, 0.1, shape).astype(np.float32)
        else:
            value = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        if filled.ir_version < 4:  # initializers are graph inputs too before IR version 4
            graph.input.append(onnx.helper.make_tensor_value_info(
                node.output[0], onnx.TensorProto.FLOAT, shape))  # fmt: skip
    del graph.node[:]
    graph.node.extend(kept)
    _scale_logits(filled, np.random.default_rng(seed + 1))
    return filled


def _scale_logits(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    """Scale the classifier feeding the final Softmax (see `fill_weights`), in place."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    last = producer.get(graph.output[0].name)
    if last is None or last.op_type != "Softmax":
        return
    logits = last.input[0]
    node = producer.get(logits)
    while node is not None and node.op_type in HOMOGENEOUS:
        node = producer.get(node.input[0])
    initializers = {t.name: t for t in graph.initializer}

    def stored(name: str) -> str | None:
        """The initializer a layer's parameter is, or is reshaped from."""
        while name not in initializers and name in producer:
            if producer[name].op_type not in ("Reshape", "Flatten", "Transpose", "Identity"):
                return None
            name = producer[name].input[0]
        return name if name in initializers else None

    if node is None or node.op_type not in ("Gemm", "Conv") or stored(node.input[1]) is None:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.ValueInfoProto(name=logits))
    (data,) = [i for i in graph.input if i.name not in initializers]
    x = rng.normal(size=[d.dim_value for d in data.type.tensor_type.shape.dim])
    session = ort_session(probe.SerializeToString())
    (values,) = session.run([logits], {data.name: x.astype(np.float32)})
    spread = float(np.std(values.reshape(values.shape[0], -1), axis=1).mean())
    if not spread > 0:
        return
    factor = np.float32(LOGIT_STD / spread)
    for name in {stored(given) for given in node.input[1:3]} - {None}:
        scaled = numpy_helper.to_array(initializers[name]) * factor
        initializers[name].CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), name))


@dataclass
class Result:
    collection: str
    name: str
    opset: int
    imported: bool = False
    #: float64 / float32 evaluation within tolerance of the expected outputs (None: not run).
    match64: bool | None = None
    match32: bool | None = None
    error64: float | None = None
    #: Whether the model computes in DOUBLE (not evaluated in float32).
    double: bool = False
    reasons: list[str] = field(default_factory=list)


def stored_data(path: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The inputs and outputs of a model's test_data_set_0."""
    folder = os.path.join(os.path.dirname(path), "test_data_set_0")

    def read(kind: str) -> list[np.ndarray]:
        files = sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                       key=lambda f: int(f.rsplit("_", 1)[1].split(".")[0]))  # fmt: skip
        return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]

    return read("input"), read("output")


def run_model(collection: str, path: str, evaluate: bool = True) -> Result:
    """Import one model as shipped and, unless `evaluate` is false, compare its values."""
    import tlc
    from tlc.semantics.interpret import interpret

    model = onnx.load(path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    result = Result(collection, model_name(path), opset)
    if collection == "light" and evaluate:  # the stored constant weights import the same
        model = fill_weights(model)
    try:
        traced = tlc.from_onnx(model)
    except UnsupportedNodes as exc:
        result.reasons = [f"unsupported {gap}" for gap in exc.gaps]
        return result
    except DiagnosticError as exc:
        result.reasons = [_reason(str(exc))]
        return result
    result.imported = True
    if not evaluate:
        return result
    inputs, expected = _light_data(model) if collection == "light" else stored_data(path)
    graphs = traced.per_output or [traced]  # one per output
    if len(expected) != len(graphs):
        result.reasons = [f"{len(expected)} stored outputs for {len(graphs)} graph outputs"]
        return result
    result.double = model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    for dtype in (np.float64,) if result.double else (np.float64, np.float32):
        feed = [np.asarray(a, dtype) for a in inputs]
        oks, errors = [], []
        try:
            for part, stored in zip(graphs, expected, strict=True):
                table = interpret(
                    part.graph, part.payload, feed if len(feed) > 1 else feed[0], dtype
                )
                part.check_values(table.values, dtype)
                got, want = np.asarray(table.output), np.asarray(stored, np.float64)
                same = got.shape == want.shape
                oks.append(same and np.allclose(got, want, RTOL, ATOL, equal_nan=True))
                if same:
                    errors.append(float(np.nanmax(np.abs(got - want), initial=0.0)))
        except DiagnosticError as exc:
            result.reasons.append(f"evaluation ({np.dtype(dtype).name}): {_reason(str(exc))}")
            continue
        if dtype is np.float64:
            result.match64 = all(oks)
            result.error64 = max(errors) if errors else None
        else:
            result.match32 = all(oks)
    return result


def _light_data(model: onnx.ModelProto) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A random input for the filled zoo model and ONNX Runtime's output on it."""
    initializers = {t.name for t in model.graph.initializer}
    (data,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    return [x], ort_session(model.SerializeToString()).run(None, {data.name: x})


def ort_session(model: bytes, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session on `model`, its warnings off: the zoo's old models list
    their initializers as graph inputs, and ORT's default logger printed a line for each it
    removed (39 for squeezenet, hundreds for densenet121), which no session option silences.
    `threads`: that many intra-op threads and one inter-op (the benches' matched counts);
    None leaves ORT's defaults."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _reason(message: str) -> str:
    """A refusal's cause without the model's file name or node names (so equal causes
    count together)."""
    text = message.removeprefix("ONNX import: ").splitlines()[0]
    if text.startswith("node "):
        text = text.split(": ", 1)[-1] if ": " in text else text
        return f"{message.split('(', 1)[1].split(')', 1)[0]}: {text}"
    if text.startswith("input '"):
        return "input " + text.split("' ", 1)[1]
    return text


def run_all(collections: tuple[str, ...] = SETS) -> list[Result]:
    """Every model of `collections`, with a progress bar on a terminal (stdout stays the
    report)."""
    jobs = [(c, path) for c in collections for path in model_paths(c)]
    results = []
    with Progress(len(jobs), "models", summary=False) as bar:
        for collection, path in jobs:
            results.append(run_model(collection, path))
            bar.advance(f"{collection}/{model_name(path)}")
    return results


def report(results: list[Result]) -> str:
    """The markdown tables of docs/onnx-models.md."""
    lines = [
        "| collection | models | opsets | import | match f64 | match f32 (of FLOAT models) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for collection in dict.fromkeys(r.collection for r in results):
        rs = [r for r in results if r.collection == collection]
        opsets = ", ".join(str(v) for v in sorted({r.opset for r in rs}))
        lines.append(
            f"| {collection} | {len(rs)} | {opsets} | {sum(r.imported for r in rs)} | "
            f"{sum(bool(r.match64) for r in rs)} | {sum(bool(r.match32) for r in rs)} of "
            f"{sum(r.imported and not r.double for r in rs)} |"
        )
    reasons = Counter(reason for r in results for reason in dict.fromkeys(r.reasons))
    lines += ["", "Refusal reasons (models refused for each; a model can have several):", ""]
    lines += ["| reason | models |", "|---|---:|"]
    lines += [f"| {_cell(reason)} | {n} |" for reason, n in sorted(
        reasons.items(), key=lambda item: (-item[1], item[0]))]  # fmt: skip
    lines += ["", "Models that import:", ""]
    lines += ["| collection | model | opset | max abs error f64 | f64 | f32 |",
              "|---|---|---:|---:|---|---|"]  # fmt: skip
    for r in results:
        if r.imported:
            error = "" if r.error64 is None else f"{r.error64:.1e}"
            lines.append(f"| {r.collection} | {r.name} | {r.opset} | {error} | "
                         f"{_mark(r.match64)} | {_mark(r.match32)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("match" if ok else "differs")


def main() -> int:
    sys.stdout.write(report(run_all()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
