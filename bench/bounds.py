"""IBP and CROWN bounds: time and width per network, and tlc-verify throughput.

    python bench/bounds.py [--repeats N] [--threads N]

Per network (random weights; the box [x - r, x + r]): `ibp` and `crown` are
`tlc.semantics.crown.PreparedCrown` calls (prepared once, method "ibp" / "crown"), `numpy` the
independent plain-numpy float64 CROWN of tests/crown_oracle.py (no rounding control, ReLU
MLPs only); `width` is the median over outputs of IBP width / CROWN width. PyTorch's
auto_LiRPA is not compared: its PyPI release (0.3) requires torch < 1.13 and does not install
beside torch 2.x and numpy 2. Then `tlc-verify --instances` on 8 instances of the ACAS-shaped
network (robustness properties, radii 0.005 to 0.3: unsat and sat) at 1 and 2 workers,
in instances per second (process start-up included). Times are medians of `--repeats`.
"""

from __future__ import annotations

import os
import sys


def _limit_threads(argv: list[str]) -> None:
    threads = argv[argv.index("--threads") + 1] if "--threads" in argv else "1"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)


_limit_threads(sys.argv)

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from crown_nets import mlp, onnx_mlp, random_layers, robustness_property  # noqa: E402
from crown_oracle import crown_mlp  # noqa: E402

from tlc.api.bounds import prepared_bounds  # noqa: E402

NETWORKS = [
    ("ACAS-shaped 5-6x50-5", [5] + [50] * 6 + [5], 0.02),
    ("MLP 8-20-20-3", [8, 20, 20, 3], 0.1),
    ("MLP 784-256-256-10", [784, 256, 256, 10], 0.005),
]


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bounds_table(repeats: int) -> None:
    print(f"{'network':<24}{'ibp ms':>10}{'crown ms':>10}{'numpy ms':>10}{'ibp/crown width':>17}")
    for name, sizes, radius in NETWORKS:
        layers = random_layers(sizes, seed=1)
        prepared = prepared_bounds(mlp(layers))
        x = np.random.default_rng(0).uniform(-1, 1, sizes[0])
        lo, hi = (x - radius)[None], (x + radius)[None]
        ibp = prepared(lo, hi, "ibp")
        crown = prepared(lo, hi, "crown")
        ratio = float(np.median((ibp.upper - ibp.lower) / (crown.upper - crown.lower)))
        t_ibp, t_crown = (
            median_time(lambda p=prepared, m=m, a=lo, b=hi: p(a, b, m), repeats)
            for m in ("ibp", "crown")
        )
        t_numpy = median_time(lambda n=layers, a=lo[0], b=hi[0]: crown_mlp(n, a, b), repeats)
        print(f"{name:<24}{1e3 * t_ibp:>10.2f}{1e3 * t_crown:>10.2f}{1e3 * t_numpy:>10.2f}"
              f"{ratio:>17.1f}")  # fmt: skip


def throughput(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        layers = random_layers([5] + [50] * 6 + [5], seed=1)
        onnx_mlp(layers, str(base / "acas.onnx"))
        centre = np.full(5, 0.2)
        prepared = prepared_bounds(mlp(layers))
        label = int(np.argmax(prepared(centre[None], centre[None], "ibp").lower))
        rows = []
        for i, radius in enumerate([0.005, 0.01, 0.02, 0.03, 0.1, 0.15, 0.2, 0.3]):
            text = robustness_property(centre - radius, centre + radius, label, 5)
            (base / f"p{i}.vnnlib").write_text(text)
            rows.append(f"acas.onnx,p{i}.vnnlib,60")
        (base / "instances.csv").write_text("\n".join(rows) + "\n")
        for workers in (1, 2):
            command = [sys.executable, "-m", "tlc.tools.verify", "--instances",
                       str(base / "instances.csv"), "--workers", str(workers),
                       "--results", str(base / "out.csv")]  # fmt: skip
            seconds = median_time(
                lambda c=command: subprocess.run(c, check=True, capture_output=True), repeats
            )
            results = [line.split(",")[2] for line in (base / "out.csv").read_text().split()]
            print(f"tlc-verify, {workers} worker(s): {len(rows) / seconds:.2f} instances/s "
                  f"({seconds:.1f} s for {len(rows)}: {', '.join(results)})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1", help="BLAS threads (default 1)")
    args = p.parse_args()
    bounds_table(args.repeats)
    throughput(max(1, args.repeats // 5))


if __name__ == "__main__":
    main()
