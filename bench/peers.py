"""Peer runtimes' runners shared by the benches (builds for `isolated.Isolated`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def ort_runner(model: bytes, x: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    """ONNX Runtime on the ONNX file `model`, fed `x` as its first input: `threads` intra-op
    threads (its default spinning), one inter-op thread, its warnings off (tlc's zoo tool's
    session)."""
    from tlc.tools.onnx_models import ort_session

    session = ort_session(model, threads)
    feed = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feed)[0]
