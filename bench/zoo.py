"""The ONNX model zoo's "light" models (inside the onnx wheel) against ONNX Runtime in float32,
through tlc's reference interpreter and its compiled code, with the time each step takes.

    python bench/zoo.py [--model NAME ...] [--no-compile] [--fold-batch-norm]

Each model's stored weight shapes are filled with random values (`tlc.tools.onnx_models.
fill_weights`), ONNX Runtime runs the filled model on a random input (float32), and tlc imports
it (`tlc.from_onnx`), evaluates it by the reference denotation in float32 and JIT-compiles it in
float32 (`tlc.compile`; payloads over 16 MiB passed by pointer). Errors are the largest absolute
difference from ONNX Runtime's output, also relative to its largest magnitude. A row per model:

    | model | params | import s | reference f32 error | compile s | compiled f32 error | run ms |

The tolerance docs/onnx-models.md states is ONNX's backend-test one, rtol 1e-3 and atol 1e-7
per element; the relative figures here are far inside it.

`zoo_model(name, batch)` is a filled model for any batch size: `bench/real_networks.py
--speed --models zoo:NAME` times it beside ONNX Runtime and PyTorch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import numpy_helper

import tlc
from tlc.semantics.interpret import interpret
from tlc.tools.onnx_models import _light_data, fill_weights, model_name, model_paths


def zoo_model(name: str, batch: int = 1) -> onnx.ModelProto:
    """The light model `name` with its weights filled (`fill_weights`), for `batch` images:
    the zoo's models are stored for one image, so the data input's and the outputs' leading
    dimension and every constant Reshape target that starts with it (resnet50's [1, 2048]
    before its classifier) become `batch`."""
    paths = [p for p in model_paths("light") if model_name(p) == name]
    if not paths:
        names = ", ".join(model_name(p) for p in model_paths("light"))
        raise SystemExit(f"no zoo model {name}; the zoo has {names}")
    model = fill_weights(onnx.load(paths[0]))
    if batch == 1:
        return model
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    (data,) = [i for i in graph.input if i.name not in initializers]
    for value in (data, *graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    del graph.value_info[:]
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[1] in initializers:
            target = numpy_helper.to_array(initializers[node.input[1]]).copy()
            if target.size and target[0] == 1:
                target[0] = batch
                initializers[node.input[1]].CopyFrom(
                    numpy_helper.from_array(target, node.input[1]))  # fmt: skip
    return model


def measure(path: str, compile_it: bool, fold_batch_norm: bool = False) -> str:
    model = fill_weights(onnx.load(path))
    (x,), (expected,) = _light_data(model)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    start = time.perf_counter()
    traced = tlc.from_onnx(model)
    imported = time.perf_counter() - start
    scale = float(np.max(np.abs(expected)))

    def error(got: np.ndarray) -> str:
        e = float(np.max(np.abs(np.asarray(got, np.float64) - expected)))
        return f"{e:.1e} ({e / scale:.1e} rel.)"

    ref = interpret(traced.graph, traced.payload, x, np.float32).output
    row = f"| {model_name(path)} | {params / 1e6:.1f} M | {imported:.1f} | {error(ref)} |"
    if not compile_it:
        return row + " - | - | - |"
    start = time.perf_counter()
    fn = tlc.compile(traced.module, traced.payload, dtype="f32", fold_batch_norm=fold_batch_norm)
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    got = fn(x)
    ran = time.perf_counter() - start
    return row + f" {compiled:.1f} | {error(got)} | {ran * 1e3:.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", nargs="*", help="names (default: all nine)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--fold-batch-norm",
        action="store_true",
        help="compile with batch norms folded (tlc-opt.md)",
    )
    args = parser.parse_args()
    print("| model | params | import s | reference f32 error | compile s | compiled f32 error "
          "| run ms |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in model_paths("light"):
        if args.model and model_name(path) not in args.model:
            continue
        print(measure(path, not args.no_compile, args.fold_batch_norm), flush=True)


if __name__ == "__main__":
    main()
