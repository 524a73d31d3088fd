"""IBP and CROWN bounds: time and width per network, and tlc-verify throughput.

    python bench/bounds.py [--repeats N] [--threads N]

Per network (random weights; the box [x - r, x + r]): `ibp` and `crown` are
`tlc.semantics.crown.PreparedCrown` calls (prepared once, method "ibp" / "crown"), `numpy` the
independent plain-numpy float64 CROWN of tests/crown_oracle.py (no rounding control, ReLU
MLPs only), `torch ibp` / `torch crown` the same two algorithms written here in PyTorch
(float64, one thread, no rounding control; PyTorch's auto_LiRPA does not install: its PyPI
releases 0.2 and 0.3 require torch < 1.13); `width` is the median over outputs of IBP width /
CROWN width; `batch 256` is tlc's CROWN for 256 boxes in one call, per box. Times are CPU
times of this thread (`time.thread_time`), minima of `--repeats`: wall time on a shared
machine measures the other processes too. Then `tlc-verify --instances` on 8 instances of the
ACAS-shaped network (robustness properties, radii 0.005 to 0.3: unsat and sat) at 1 and 2
workers, in instances per second (wall time, process start-up included), with the CPU time
the processes used (on a loaded machine the wall time is mostly waiting for a core).
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


def timings(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> list[float]:
    """`repeats` calls of `fn` timed by `clock`, in seconds."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return times


def cpu_time(fn: Callable[[], object], repeats: int) -> float:
    """The least CPU time of this thread over `repeats` calls, in seconds."""
    return min(timings(fn, repeats, time.thread_time))


def torch_bounds(layers: list, lo: np.ndarray, hi: np.ndarray, crown: bool) -> tuple:
    """IBP, or CROWN as tests/crown_oracle.py computes it (intermediate bounds by CROWN, each
    intersected with the interval bounds of the tightened layer before), in PyTorch float64."""
    import torch

    ws = [(torch.from_numpy(w), torch.from_numpy(b)) for w, b in layers]
    mid, rad = torch.from_numpy((lo + hi) / 2), torch.from_numpy((hi - lo) / 2)
    pre: list[tuple] = []

    def interval(k: int) -> tuple:
        w, b = ws[k]
        if k == 0:
            m, r = mid, rad
        else:
            a_lo, a_hi = pre[k - 1][0].clamp(min=0), pre[k - 1][1].clamp(min=0)
            m, r = (a_lo + a_hi) / 2, (a_hi - a_lo) / 2
        return w @ m + b - w.abs() @ r, w @ m + b + w.abs() @ r

    def lower(rows: torch.Tensor, last: int) -> torch.Tensor:
        const, lam = torch.zeros(rows.shape[0], dtype=torch.float64), rows
        for j in range(last, -1, -1):
            w, b = ws[j]
            const, lam = const + lam @ b, lam @ w
            if j == 0:
                break
            z_lo, z_hi = pre[j - 1]
            unstable, active = (z_lo < 0) & (z_hi > 0), z_lo >= 0
            slope = torch.where(unstable, z_hi / (z_hi - z_lo), active.double())
            low = torch.where(active | (unstable & (z_hi >= -z_lo)), 1.0, 0.0).double()
            const = const + lam.clamp(max=0) @ torch.where(unstable, -slope * z_lo, 0.0)
            lam = torch.where(lam >= 0, lam * low, lam * slope)
        return const + lam @ mid - lam.abs() @ rad

    for k in range(len(ws)):
        box = interval(k)
        if crown and k > 0:
            eye = torch.eye(len(box[0]), dtype=torch.float64)
            box = (torch.maximum(box[0], lower(eye, k)), torch.minimum(box[1], -lower(-eye, k)))
        pre.append(box)
    return pre[-1]


def bounds_table(repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    head = ["ibp ms", "crown ms", "numpy ms", "torch ibp", "torch crown", "batch 256", "width"]
    print(f"{'network':<24}" + "".join(f"{h:>12}" for h in head))
    for name, sizes, radius in NETWORKS:
        times, ratio = network_row(sizes, radius, repeats)
        print(f"{name:<24}" + "".join(f"{1e3 * t:>12.2f}" for t in times) + f"{ratio:>12.1f}")


def network_row(sizes: list[int], radius: float, repeats: int) -> tuple[list[float], float]:
    """The table's times (seconds) and width ratio for one network."""
    layers = random_layers(sizes, seed=1)
    prepared = prepared_bounds(mlp(layers))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, sizes[0])
    lo, hi = (x - radius)[None], (x + radius)[None]
    ibp = prepared(lo, hi, "ibp")
    crown = prepared(lo, hi, "crown")
    ratio = float(np.median((ibp.upper - ibp.lower) / (crown.upper - crown.lower)))
    many = rng.uniform(-1, 1, (256, sizes[0]))
    times = [
        cpu_time(lambda: prepared(lo, hi, "ibp"), repeats),
        cpu_time(lambda: prepared(lo, hi, "crown"), repeats),
        cpu_time(lambda: crown_mlp(layers, lo[0], hi[0]), repeats),
        cpu_time(lambda: torch_bounds(layers, lo[0], hi[0], False), repeats),
        cpu_time(lambda: torch_bounds(layers, lo[0], hi[0], True), repeats),
        cpu_time(lambda: prepared(many - radius, many + radius, "crown"), 1) / 256,
    ]
    return times, ratio


def wall_time(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time over `repeats` calls, in seconds (tlc-verify runs processes)."""
    return statistics.median(timings(fn, repeats, time.perf_counter))


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
            before = os.times()
            seconds = wall_time(
                lambda c=command: subprocess.run(c, check=True, capture_output=True), repeats
            )
            after = os.times()
            cpu = (after.children_user + after.children_system - before.children_user
                   - before.children_system) / repeats  # fmt: skip
            results = [line.split(",")[2] for line in (base / "out.csv").read_text().split()]
            print(f"tlc-verify, {workers} worker(s): {len(rows) / seconds:.2f} instances/s "
                  f"({seconds:.1f} s wall, {cpu:.1f} s CPU for {len(rows)}: "
                  f"{', '.join(results)})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1", help="BLAS threads (default 1)")
    args = p.parse_args()
    bounds_table(args.repeats)
    throughput(max(1, args.repeats // 5))


if __name__ == "__main__":
    main()
