"""The reference interpreter against plain numpy on an MLP 784-1024-1024-10.

    python bench/interpret.py [--repeats N] [--threads N]

Plain numpy is the same computation written by hand (`relu(x W1^T + b1)` ...). `interpret` is
the full call (checks the graph and payload every time); `prepared` is `prepare(...)` once, then
calls (the fold over the nodes only). `ibp` is `tlc.semantics.ibp.ibp` on the box
[x - RADIUS, x + RADIUS] (the full call), `ibp prep` is `prepare_ibp(...)` once, then calls.
Times are medians of `--repeats` timed loops; ratios are tlc / numpy (aim: prepared within
1.5x), ibp / interpret (full calls) and ibp prep / interp prep (prepared forms; aim: within
4x). BLAS threads default to 1 so the ratio measures the interpreter, not thread scheduling on
a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable


def _limit_threads(argv: list[str]) -> None:
    """BLAS reads its thread count when numpy loads, so set it before the import."""
    threads = argv[argv.index("--threads") + 1] if "--threads" in argv else "1"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)


_limit_threads(sys.argv)

import numpy as np  # noqa: E402

from tlc.core.payload import Payload  # noqa: E402
from tlc.dialect import ops  # noqa: E402
from tlc.dialect.ops import GraphOp, OutputOp  # noqa: E402
from tlc.semantics.ibp import ibp, prepare_ibp  # noqa: E402
from tlc.semantics.interpret import interpret, prepare  # noqa: E402

DIMS = (784, 1024, 1024, 10)
RADIUS = 0.01


def mlp(batch: int, rng: np.random.Generator) -> tuple[GraphOp, Payload]:
    """linear-relu-linear-relu-linear over DIMS, input [batch, 784]."""
    nodes: list[ops.NodeOp] = [ops.InputOp(0, [], (batch, DIMS[0]))]
    payload = Payload()
    for i, (d_in, d_out) in enumerate(zip(DIMS, DIMS[1:], strict=False)):
        layer = ops.LinearOp(len(nodes), [nodes[-1].result], (batch, d_out))
        nodes.append(layer)
        payload.records[layer.id] = {
            "weight": rng.standard_normal((d_out, d_in)) / np.sqrt(d_in),
            "bias": rng.standard_normal(d_out),
        }
        if i < len(DIMS) - 2:
            nodes.append(ops.ReluOp(len(nodes), [layer.result], (batch, d_out)))
    return GraphOp("mlp", [*nodes, OutputOp(nodes[-1].result)]), payload


def plain_numpy(payload: Payload, dtype: type) -> Callable[[np.ndarray], np.ndarray]:
    layers = [
        (rec["weight"].astype(dtype), rec["bias"].astype(dtype))
        for _, rec in sorted(payload.items())
    ]

    def run(x: np.ndarray) -> np.ndarray:
        for i, (w, b) in enumerate(layers):
            x = x @ w.T + b
            if i < len(layers) - 1:
                x = np.maximum(x, 0)
        return x

    return run


def median_time(fn: Callable[[], object], repeats: int, budget: float = 0.05) -> float:
    fn()
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > budget or n >= 1 << 16:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"MLP {'-'.join(map(str, DIMS))}, BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}")
    print(f"{'dtype':6} {'batch':>5} {'numpy us':>10} {'interpret':>10} {'prepared':>10} "
          f"{'ratio':>6} {'ratio prep':>10} {'ibp':>10} {'ibp/interp':>10} {'ibp prep':>10} "
          f"{'prep/prep':>9}")  # fmt: skip
    for dtype in (np.float64, np.float32):
        for batch in (1, 64):
            graph, payload = mlp(batch, rng)
            x = rng.standard_normal((batch, DIMS[0])).astype(dtype)
            numpy_fn = plain_numpy(payload, dtype)
            prepared = prepare(graph, payload, dtype)
            np.testing.assert_allclose(prepared(x).output, numpy_fn(x), rtol=1e-4, atol=1e-5)
            t_np = median_time(lambda: numpy_fn(x), args.repeats)  # noqa: B023
            t_full = median_time(lambda: interpret(graph, payload, x, dtype), args.repeats)  # noqa: B023
            t_prep = median_time(lambda: prepared(x), args.repeats)  # noqa: B023
            lo, hi = x - RADIUS, x + RADIUS
            t_ibp = median_time(lambda: ibp(graph, payload, lo, hi, dtype), args.repeats)  # noqa: B023
            bounds = prepare_ibp(graph, payload, dtype)
            t_ibp_prep = median_time(lambda: bounds(lo, hi), args.repeats)  # noqa: B023
            name = np.dtype(dtype).name
            print(f"{name:6} {batch:5d} {t_np * 1e6:10.1f} {t_full * 1e6:10.1f} "
                  f"{t_prep * 1e6:10.1f} {t_full / t_np:6.2f} {t_prep / t_np:10.2f} "
                  f"{t_ibp * 1e6:10.1f} {t_ibp / t_full:10.2f} {t_ibp_prep * 1e6:10.1f} "
                  f"{t_ibp_prep / t_prep:9.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
