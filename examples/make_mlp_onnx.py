"""Writes examples/mlp.onnx: the seed's MLP (examples/mlp.tlir with its inline payload) as an
ONNX model in float32, the model the README imports with `tlc-translate --import-onnx`.

    python examples/make_mlp_onnx.py [OUT.onnx]      (needs the onnx extra: pip install '.[onnx]')
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

import tlc

HERE = Path(__file__).parent


def main(out: str = str(HERE / "mlp.onnx")) -> None:
    model = tlc.to_onnx(HERE / "mlp.tlir", dtype="f32")
    onnx.save(model, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
