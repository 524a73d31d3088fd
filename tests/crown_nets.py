"""Random networks for the bound tests and tools: ReLU MLPs as (W, b) layers and as traced
tlc graphs, written once for tests/test_crown.py and tests/test_verify.py."""

from __future__ import annotations

from typing import Any

import numpy as np

import tlc


def random_layers(sizes: list[int], seed: int, scale: float = 1.0) -> list[tuple[Any, Any]]:
    """He-scaled random (W, b) for widths `sizes` (input first)."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0, scale * np.sqrt(2 / n), (m, n)), rng.normal(0, 0.1, m))
        for n, m in zip(sizes, sizes[1:], strict=False)
    ]


def mlp(layers: list[tuple[Any, Any]], activation: str = "relu") -> Any:
    """The traced graph of x -> W_k act(... act(W_1 x + b_1) ...) + b_k."""

    def program(ops: Any, x: Any, params: Any) -> Any:
        for i, (w, b) in enumerate(params):
            x = ops.linear(x, w, b)
            if i + 1 < len(params):
                x = getattr(ops, activation)(x)
        return x

    return tlc.trace(program, (layers[0][0].shape[1],), layers, name="net")
