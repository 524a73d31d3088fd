"""Peer runtimes' runners shared by the benches (builds for `isolated.Isolated`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def ort_runner(model: bytes, x: np.ndarray, threads: int) -> Callable[[], np.ndarray]:
    """ONNX Runtime on the ONNX file `model`, fed `x` as its first input: `threads` intra-op
    threads (its default spinning), one inter-op thread."""
    import onnxruntime as ort

    # No warnings about unused initializers (the zoo's old models list theirs as graph inputs,
    # densenet121 hundreds): they come from the default logger, which the session's
    # log_severity_level leaves alone.
    ort.set_default_logger_severity(3)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feed)[0]
