"""torchvision models and a transformer encoder stack through tlc's importers, timed.

    python bench/real_networks.py [--models resnet18,...] [--routes fx,onnx,dynamo] [--size 32]
                                  [--no-compile]

For each model (random weights, batch 1, `--size` x `--size` input; the transformer 2 x 10 x 32)
and route (`fx`: tlc.from_torch on the float64 model; `onnx`: torch.onnx.export(dynamo=False)
then tlc.from_onnx; `dynamo`: the same with dynamo=True), prints one table row: the import time,
the reference denotation's time for one forward, `tlc.compile`'s time (the JIT, float64) and
the largest error relative to the largest output magnitude, of the reference and of the compiled
code, against PyTorch (float64 for fx, float32 for the exports). Needs torchvision (see
tests/torchvision_models.py for why its import needs a shim) and, for `dynamo`, onnxscript.
Figures drift on a loaded machine: compare rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from torchvision_models import NETWORKS, network  # noqa: E402

import tlc  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402


def relative(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def row(name: str, route: str, size: int, compile_too: bool) -> str:
    net, x = network(name, size)
    start = time.perf_counter()
    if route == "fx":
        net, x = net.double(), x.double()
        traced = tlc.from_torch(net, x)
    else:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            path = str(Path(tmp) / "m.onnx")
            torch.onnx.export(net, (x,), path, dynamo=route == "dynamo")
            start = time.perf_counter()
            traced = tlc.from_onnx(path)
    imported = time.perf_counter() - start
    with torch.no_grad():
        expected = net(x).numpy()
    xs = x.double().numpy()
    start = time.perf_counter()
    reference = interpret(traced.graph, traced.payload, xs).output
    forward = time.perf_counter() - start
    cells = [name, route, "yes", f"{imported:.2f}", f"{forward:.2f}"]
    error = relative(reference, expected)
    if compile_too:
        start = time.perf_counter()
        compiled = tlc.compile(traced)
        built = time.perf_counter() - start
        cells += [f"{built:.2f}", f"{error:.1e}", f"{relative(compiled(xs), expected):.1e}"]
    else:
        cells += ["-", f"{error:.1e}", "-"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(NETWORKS))
    parser.add_argument("--routes", default="fx,onnx,dynamo")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    print("| model | route | import | import s | reference s | tlc.compile s | "
          "rel. error ref | rel. error compiled |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for route in args.routes.split(","):
            try:
                print(row(name, route, args.size, not args.no_compile), flush=True)
            except Exception as exc:  # a refused import is a row, not the end of the table
                print(f"| {name} | {route} | no: {str(exc).splitlines()[0]} | | | | | |")


if __name__ == "__main__":
    main()
