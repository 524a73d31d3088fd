"""Every torchvision classification model builder through tlc's importers, against PyTorch.

    python bench/torchvision_zoo.py [--models alexnet,...] [--routes fx,onnx,dynamo]
                                    [--max-params 100]

Each builder of `torchvision.models.list_models(module=torchvision.models)` is built with random
weights (seed 0) in eval mode and run on one image of the smallest size it accepts (`SIZES`; 32
x 32 otherwise); an all-zero weight (ViT's head) is made random (`built`). Routes: `fx` is
`tlc.from_torch` on the model converted to float64, compared with PyTorch in float64; `onnx` and
`dynamo` are `torch.onnx.export(dynamo=False / True)` of the float32 model then `tlc.from_onnx`,
evaluated in float64 and compared with PyTorch's float32 output. One table row per model and
route: whether the import succeeded (or the first line of its refusal; `TRACEBACK` marks an
exception that is not a located ImportFailure, a bug) and the largest error relative to the
largest output magnitude of the reference denotation. An export torch itself refuses is marked
`export failed`. Models over `--max-params` million parameters are skipped (their float64
reference evaluation needs several GB). Needs torchvision (see tests/torchvision_models.py for
its import shim) and, for `dynamo`, onnxscript.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from torchvision_models import model, torchvision  # noqa: E402

import tlc  # noqa: E402
from tlc.core.diagnostics import DiagnosticError  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402

#: The smallest square input of the builders that do not accept 32 x 32.
SIZES = {"alexnet": 63, "inception_v3": 75, "vit_b_16": 224, "vit_b_32": 224, "vit_l_16": 224,
         "vit_l_32": 224, "vit_h_14": 224, "maxvit_t": 224}  # fmt: skip


def names() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def relative(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def first_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).strip().splitlines())
    return (text or type(exc).__name__).replace("|", "/")[:240]


def _imported(net: Any, x: torch.Tensor, route: str) -> Any:
    if route == "fx":
        return tlc.from_torch(net, x)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "m.onnx")
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, (x,), path, dynamo=route == "dynamo")
        except Exception as exc:
            raise ExportFailed(first_line(exc)) from None
        return tlc.from_onnx(path)


class ExportFailed(Exception):
    pass


def built(name: str) -> Any:
    """The builder's model (seed 0, eval) with every all-zero weight (ViT's head, zeros by
    torchvision's initialisation, which would make the output 0) drawn from N(0, 0.02^2)."""
    net = model(name)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim > 1 and not p.any():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return net


def row(name: str, route: str) -> list[str]:
    size = SIZES.get(name, 32)
    net = built(name)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    if route == "fx":
        net, x = net.double(), x.double()
    try:
        traced = _imported(net, x, route)
    except DiagnosticError as exc:
        return [name, route, f"no: {first_line(exc)}", "-"]
    except ExportFailed as exc:
        return [name, route, f"export failed: {exc}", "-"]
    except Exception as exc:
        return [name, route, f"TRACEBACK {type(exc).__name__}: {first_line(exc)}", "-"]
    with torch.no_grad():
        expected = net(x).numpy()
    got = interpret(traced.graph, traced.payload, x.double().numpy()).output
    return [name, route, "yes", f"{relative(np.asarray(got), expected):.1e}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated builder names (default: all)")
    parser.add_argument("--routes", default="fx,onnx,dynamo")
    parser.add_argument("--max-params", type=float, default=100.0, help="millions")
    args = parser.parse_args()
    print("| model | input | route | import | rel. error |\n|---|---:|---|---|---:|")
    for name in args.models.split(",") if args.models else names():
        params = sum(p.numel() for p in model(name).parameters()) / 1e6
        size = SIZES.get(name, 32)
        if params > args.max_params:
            print(f"| {name} | {size} | - | skipped: {params:.0f} M parameters | - |")
            continue
        for route in args.routes.split(","):
            cells = row(name, route)
            cells.insert(1, str(size))
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
