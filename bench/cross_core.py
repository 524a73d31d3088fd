"""What slows a two-thread region's parts: the other core's work, or the other core's data.

    python bench/cross_core.py [--models squeezenet1_0] [--size 224] [--calls 10] [--rounds 3]

`bench/thread_trace.py` found a batch-1 call's parts slower while both threads run. This tells
the candidate causes apart by thread CPU time, which a loaded machine leaves about intact (a
two-thread wall time there mostly says how often the other core was free). The JIT is built
against the traced runtime of `thread_trace` (a clock read around every range of parts), its
pool's worker pinned to CPU 1 and the caller to CPU 0, idle threads sleeping at once (SPIN_NS
0, so that no poller works beside a part). Per model, at batch 1, in alternating rounds of
`--calls` calls, each region's parts' thread CPU time (the median call's) when:

- `in turn`: every region's parts run on the caller, the other core left to the machine;
- `memory`: the same, with a process on CPU 1 copying 64 MiB arrays (memory bandwidth);
- `compute`: the same, with a process on CPU 1 in an interpreter loop (no memory traffic);
- `alternate`: whole regions on the caller and on the worker by turns, never both at once, so
  every region reads what the other core's cache holds;
- `pool`: the real pool, both threads at once.

ONNX Runtime's one-thread call (intra-op threads 1) runs in the first three too, the same
calls, as the yardstick: what slows both alike is the machine. Then the regions, each against
`in turn`. docs/threads-memory.md ("What the second core costs") has figures. Needs two CPUs
and torchvision (tests/torchvision_models.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_networks import workload  # noqa: E402
from thread_model import entry_point, jitted, parts_regions  # noqa: E402
from thread_trace import traced_calls, traced_helper, traced_runtime  # noqa: E402

from tlc.codegen import runtime  # noqa: E402

#: (what the traced runtime says, what this one says instead): the worker pinned to CPU 1,
#: and `tlc_alternate(1)`: odd parts regions on the worker alone (the caller sleeps in 5 us
#: naps until every part is taken), even ones on the caller alone.
PATCHES = (
    (
        "    int64_t id = (int64_t)(intptr_t)arg;\n",
        "    int64_t id = (int64_t)(intptr_t)arg;\n"
        "    cpu_set_t one;\n    CPU_ZERO(&one);\n    CPU_SET(1, &one);\n"
        "    pthread_setaffinity_np(pthread_self(), sizeof one, &one);\n",
    ),
    (
        "static int64_t take_parts(",
        "static int alternate, on_worker;\nstatic int64_t alternated;\n"
        "RT void tlc_alternate(int on) { alternate = on, alternated = 0; }\n"
        "static int64_t take_parts(",
    ),
    (
        "    if (trace_serial) { /* each thread's range in its owner's halves */",
        "    on_worker = alternate && (++alternated & 1);\n"
        "    if (trace_serial || (alternate && !on_worker)) {",
    ),
    (
        "    run_tasks(0);\n    trace_event(2",
        """    while (on_worker) { /* until the worker has taken every part */
        int64_t left = 0;
        for (int64_t t = 0; t <= job_helpers; t++) {
            uint64_t w = __atomic_load_n(&ranges[t], __ATOMIC_ACQUIRE);
            left += w % RANGE_END < w / RANGE_END;
        }
        if (left == 0) break;
        struct timespec nap = {0, 5000};
        nanosleep(&nap, NULL);
    }
    if (!on_worker) run_tasks(0);
    trace_event(2""",
    ),
)

#: The neighbours (Python source run on CPU 1): each prints a line once it is working.
NEIGHBOURS = {
    "memory": "import numpy as np\na = np.ones(16 << 20, np.float32)\nb = np.empty_like(a)\n"
    "print(flush=True)\nwhile True:\n    np.copyto(b, a)\n",
    "compute": "print(flush=True)\nx = 0\nwhile True:\n    x = (x * 3 + 1) & 0xFFFF\n",
}
#: condition -> (neighbour, tlc_trace_serial, tlc_alternate)
CONDITIONS = {
    "in turn": (None, 1, 0),
    "memory": ("memory", 1, 0),
    "compute": ("compute", 1, 0),
    "alternate": (None, 0, 1),
    "pool": (None, 0, 0),
}


def cross_core_runtime(directory: str) -> str:
    """`thread_trace`'s traced runtime (idle threads sleeping at once) with `PATCHES`."""
    path = traced_runtime(directory, 0)
    source = Path(path).read_text()
    for old, new in PATCHES:
        assert source.count(old) == 1, f"the runtime changed: {old!r}"
        source = source.replace(old, new)
    Path(path).write_text(source)
    return path


def neighbour(kind: str | None) -> subprocess.Popen | None:
    """The neighbour `kind` started on CPU 1, once it works (None: none)."""
    if kind is None:
        return None
    process = subprocess.Popen([sys.executable, "-c", NEIGHBOURS[kind]], stdout=subprocess.PIPE,
                               preexec_fn=lambda: os.sched_setaffinity(0, {1}))  # fmt: skip
    assert process.stdout is not None
    process.stdout.readline()
    return process


def model(name: str, size: int, calls: int, rounds: int) -> None:
    import onnxruntime as ort

    work = workload(name, size, 1)
    module, tracker = jitted(work)
    lib = traced_helper()
    entry = entry_point(module, tracker, 2)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    session = ort.InferenceSession(work.model, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: work.x}
    cpu: dict[str, list[list[float]]] = {c: [] for c in CONDITIONS}  # per call, per region
    theirs: dict[str, list[float]] = {c: [] for c, (_, serial, _) in CONDITIONS.items() if serial}
    for _ in range(rounds):
        for condition, (kind, serial, alternate) in CONDITIONS.items():
            process = neighbour(kind)
            try:
                lib.tlc_trace_serial(serial)
                lib.tlc_alternate(alternate)
                entry(work.x)
                for _, regions in traced_calls(entry, work.x, lib, calls):
                    cpu[condition].append([sum(c.cpu for c in r.chunks) for r in regions])
                    if condition in theirs:
                        start = time.thread_time()
                        session.run(None, feed)
                        theirs[condition].append((time.thread_time() - start) * 1e3)
            finally:
                if process is not None:
                    process.kill()
                    process.wait()
    median = {c: np.median(np.array(v), axis=0) for c, v in cpu.items()}
    base = median["in turn"]
    print(f"{name}, batch 1 (load {os.getloadavg()[0]:.1f}), the parts' thread CPU summed over "
          f"the call's {len(base)} regions (medians of {rounds} x {calls} calls); ORT one "
          f"thread, whole call:")  # fmt: skip
    for condition, per in median.items():
        ort_ms = (
            f"; ORT {statistics.median(theirs[condition]):.2f} ms" if condition in theirs else ""
        )
        print(f"  {condition:9s} {per.sum():6.2f} ms ({per.sum() / base.sum():.2f}x){ort_ms}")
    names = parts_regions(module.plan)
    if len(names) != len(base):
        return
    print("  per region, ms (x in turn): " + ", ".join(CONDITIONS))
    for name, *per in zip(names, *median.values(), strict=True):
        shares = " ".join(f"{v:6.3f} ({v / per[0]:.2f})" for v in per)
        print(f"    {name}: {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="squeezenet1_0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not {0, 1} <= os.sched_getaffinity(0):
        sys.exit("cross_core.py needs CPUs 0 and 1")
    os.environ["TLC_OBJECT_CACHE"] = "0"  # the patched runtime is in no cache key
    os.sched_setaffinity(0, {0})  # the caller; the pool's worker pins itself to CPU 1
    original = runtime.SOURCE
    with tempfile.TemporaryDirectory() as directory:
        runtime.SOURCE = cross_core_runtime(directory)
        for name in args.models.split(","):
            model(name, args.size, args.calls, args.rounds)
    runtime.SOURCE = original


if __name__ == "__main__":
    main()
