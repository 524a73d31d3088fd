"""Where the second thread's time goes in real two-thread calls: the pool's regions traced.

    python bench/thread_trace.py [--models resnet18,mobilenet_v2] [--size 224] [--calls 20]
                                 [--top 8]

`bench/thread_model.py` says how a network's regions would share two threads if every task
took its one-thread time; this runs the real pool and says what happened. The JIT is built
against the runtime with a clock read (CLOCK_MONOTONIC) around every task, at every region's
open, at the moment its caller runs out of tasks and at its close, and at each worker's join
and leave (`TRACED`, patched into the runtime's source). Per model, at batch 1, two threads,
for the median call of `--calls` (by wall time):

- the call's wall time, the share in regions and the rest (serial nodes, entry, exit);
- in regions: the tasks' wall time on the caller and on the worker against the same tasks run
  in turn on one thread (the traced runtime with `tlc_trace_serial(1)`: every region's tasks
  on the caller), i.e. how much slower a task runs while the other core works;
- what the regions lose against an even share of their tasks: the worker's join latency
  (open to join, or the whole region when it never joined), the caller waiting for the worker
  after its last task, and regions the worker never joined;
- then the `--top` regions that lose most (wall time against half their tasks' time).

Wall time: run it on a quiet machine (print `uptime` beside it); on a loaded one the worker's
join latency is mostly the other processes. Needs torchvision (tests/torchvision_models.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_networks import workload  # noqa: E402

from tlc.codegen import runtime  # noqa: E402
from tlc.codegen.jit import jit_link  # noqa: E402
from tlc.codegen.loader import EntryPoint  # noqa: E402
from tlc.codegen.module import bakes_payload, build_graph_module  # noqa: E402

#: The trace's log and clock, put before the pool's `run_tasks`.
TRACED = r"""
#include <time.h>
#define TRACE_WORDS (1 << 22)
static int64_t trace_log[TRACE_WORDS]; /* (kind, region, a, b, start, end, cpu) records */
static int64_t traced;                 /* words written (atomic) */
static int64_t trace_region;           /* the region running, counted from 1 */
static int trace_serial;               /* run every region's tasks in turn on the caller */
RT int64_t *tlc_trace_log(void) { return trace_log; }
RT int64_t tlc_trace_words(void) { return __atomic_load_n(&traced, __ATOMIC_ACQUIRE); }
RT void tlc_trace_reset(void) { traced = 0; }
RT void tlc_trace_serial(int on) { trace_serial = on; }
static int64_t clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int64_t trace_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
static int64_t cpu_ns(void) { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }
/* kind 0: a task (a = index, b = worker; cpu: its thread CPU time); 1: a region (a = tasks);
 * 2: its caller out of tasks; 3: a worker inside it (b = worker). */
static void trace_event(int64_t kind, int64_t a, int64_t b, int64_t start, int64_t end,
                        int64_t cpu) {
    int64_t at = __atomic_fetch_add(&traced, 7, __ATOMIC_ACQ_REL);
    if (at + 7 > TRACE_WORDS) return;
    int64_t *r = trace_log + at;
    r[0] = kind, r[1] = __atomic_load_n(&trace_region, __ATOMIC_ACQUIRE), r[2] = a, r[3] = b;
    r[4] = start, r[5] = end, r[6] = cpu;
}
/* Task `i` of the region, timed. */
static int32_t traced_task(tlc_task task, void *ctx, int64_t i, int64_t worker) {
    int64_t t0 = trace_ns(), c0 = cpu_ns();
    int32_t status = task(ctx, i, worker);
    int64_t cpu = cpu_ns() - c0;
    trace_event(0, i, worker, t0, trace_ns(), cpu);
    return status;
}
"""

#: (what the runtime says, what the traced runtime says instead); each must occur once.
PATCHES = (
    ("static void run_tasks(int64_t worker) {", TRACED + "static void run_tasks(int64_t worker) {"),
    ("job_task(job_ctx, i, worker);", "traced_task(job_task, job_ctx, i, worker);"),
    (
        "run_tasks(id);",
        "int64_t joined = trace_ns(); run_tasks(id); trace_event(3, 0, id, joined, trace_ns(), 0);",
    ),
    (
        "    int64_t helpers = (threads < count ? threads : count) - 1;",
        """    int64_t opened_at = trace_ns();
    __atomic_add_fetch(&trace_region, 1, __ATOMIC_ACQ_REL);
    if (trace_serial) {
        for (int64_t i = 0; i < count; i++) traced_task(task, ctx, i, 0);
        trace_event(1, count, 0, opened_at, trace_ns(), 0);
        return 0;
    }
    int64_t helpers = (threads < count ? threads : count) - 1;""",
    ),
    (
        "    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {",
        "    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {\n"
        "        trace_event(4, 0, 0, opened_at, trace_ns(), 0);",
    ),
    (
        "    run_tasks(0);\n",
        "    run_tasks(0);\n    trace_event(2, 0, 0, opened_at, trace_ns(), 0);\n",
    ),
    (
        "    int32_t status = job_status;\n    pthread_mutex_unlock(&region_lock);",
        "    trace_event(1, count, 0, opened_at, trace_ns(), 0);\n"
        "    int32_t status = job_status;\n    pthread_mutex_unlock(&region_lock);",
    ),
)


def traced_runtime(directory: str, spins: int | None = None) -> str:
    """The runtime's source with `PATCHES` applied (and `spins` for its SPINS), written to
    `directory`."""
    source = Path(runtime.SOURCE).read_text()
    if spins is not None:
        source = re.sub(r"#define SPINS \d+", f"#define SPINS {spins}", source)
    for old, new in PATCHES:
        assert source.count(old) == 1, f"the runtime changed: {old!r}"
        source = source.replace(old, new)
    path = os.path.join(directory, "runtime_traced.c")
    Path(path).write_text(source)
    return path


@dataclass
class Region:
    """One region of a traced call (times in ms from its open)."""

    tasks: list[float]  # each task's wall time, by index
    cpu: list[float]  # and its thread CPU time
    on_worker: list[bool]  # whether the worker ran it
    wall: float  # open to close
    caller_done: float  # open to the caller's last task's end
    joined: float | None  # open to the worker's join (None: it never joined)
    woke: bool = False  # the caller woke a sleeping worker


def regions_of(log: np.ndarray) -> list[Region]:
    """The regions of one call's log, in order."""
    found: dict[int, Region] = {}
    opened: dict[int, int] = {}
    for kind, region, a, _b, start, end, _cpu in log:
        if kind == 1:
            opened[region] = start
            found[region] = Region([0.0] * int(a), [0.0] * int(a), [False] * int(a),
                                   (end - start) / 1e6, 0.0, None)  # fmt: skip
    for kind, region, a, b, start, end, cpu in log:
        r, t0 = found[region], opened[region]
        if kind == 0:
            r.tasks[a], r.cpu[a], r.on_worker[a] = (end - start) / 1e6, cpu / 1e6, b != 0
        elif kind == 2:
            r.caller_done = (end - t0) / 1e6
        elif kind == 3:
            r.joined = (start - t0) / 1e6
        elif kind == 4:
            r.woke = True
    return [found[k] for k in sorted(found)]


def traced_calls(entry: EntryPoint, x: np.ndarray, lib: ctypes.CDLL, calls: int
                 ) -> list[tuple[float, list[Region]]]:  # fmt: skip
    """`calls` calls of `entry`: each one's wall time (ms) and regions."""
    done = []
    for _ in range(calls):
        lib.tlc_trace_reset()
        start = time.perf_counter()
        entry(x)
        wall = (time.perf_counter() - start) * 1e3
        log = np.ctypeslib.as_array(lib.tlc_trace_log(), (lib.tlc_trace_words(),))
        done.append((wall, regions_of(log.reshape(-1, 7).copy())))
    return done


def entry_point(module, tracker, threads: int) -> EntryPoint:
    return EntryPoint(module.symbol, tracker[module.symbol], module.input_shape,
                      module.output_shape, module.dtype, None, owner=tracker,
                      bound=module.bound, threads=threads)  # fmt: skip


def model(name: str, size: int, calls: int, top: int) -> None:
    work = workload(name, size, 1)
    graph, payload = work.traced.graph, work.traced.payload
    module = build_graph_module(graph, payload, np.float32,
                                bound_payload=not bakes_payload(graph, np.float32))  # fmt: skip
    tracker = jit_link(module.ir, [module.symbol])
    lib = runtime.helper()
    lib.tlc_trace_log.restype = ctypes.POINTER(ctypes.c_int64)
    lib.tlc_trace_words.restype = ctypes.c_int64
    entry, one = entry_point(module, tracker, 2), entry_point(module, tracker, 1)
    for _ in range(3):
        entry(work.x)
    lib.tlc_trace_serial(1)
    serial = traced_calls(entry, work.x, lib, calls)
    lib.tlc_trace_serial(0)
    pooled = traced_calls(entry, work.x, lib, calls)
    alone = []
    for _ in range(calls):
        start = time.perf_counter()
        one(work.x)
        alone.append((time.perf_counter() - start) * 1e3)
    # each task's one-thread wall and CPU time: its minimum over the serial calls
    base = [np.min(np.array([c[1][i].tasks for c in serial]), axis=0)
            for i in range(len(serial[0][1]))]  # fmt: skip
    base_cpu = [np.min(np.array([c[1][i].cpu for c in serial]), axis=0)
                for i in range(len(serial[0][1]))]  # fmt: skip
    # each task's CPU time in the pool: its minimum over the pooled calls
    pool_cpu = [np.min(np.array([c[1][i].cpu for c in pooled]), axis=0)
                for i in range(len(pooled[0][1]))]  # fmt: skip
    wall, regions = sorted(pooled, key=lambda c: c[0])[len(pooled) // 2]
    in_regions = sum(r.wall for r in regions)

    def summed(times: list, worker: bool) -> float:
        return sum(t for r, ts in zip(regions, times, strict=True)
                   for t, w in zip(ts, r.on_worker, strict=True) if w == worker)  # fmt: skip

    now = [r.tasks for r in regions]
    half = sum(b.sum() for b in base) / 2
    latency = sum(r.joined if r.joined is not None else r.wall for r in regions)
    waiting = sum(r.wall - r.caller_done for r in regions)
    alone_ms = statistics.median(alone)
    print(
        f"{name}, batch 1 (load {os.getloadavg()[0]:.1f}): 1 thread {alone_ms:.2f} ms; "
        f"2 threads {wall:.2f} ms ({alone_ms / wall:.2f}x; median of {calls}), "
        f"{len(regions)} regions {in_regions:.2f} ms, the rest {wall - in_regions:.2f} ms"
    )
    print(f"  tasks' wall: caller {summed(now, False):.2f} ms (alone {summed(base, False):.2f}),"
          f" worker {summed(now, True):.2f} (alone {summed(base, True):.2f}); half the alone"
          f" times {half:.2f} ms; the regions lose {in_regions - half:+.2f} ms")  # fmt: skip
    print(f"  tasks' CPU, minima: alone {sum(b.sum() for b in base_cpu):.2f} ms, in the pool "
          f"{sum(c.sum() for c in pool_cpu):.2f} ms")  # fmt: skip
    print(f"  worker join latency {latency:.2f} ms summed, never joined "
          f"{sum(r.joined is None for r in regions)} of {len(regions)}, woken from sleep "
          f"{sum(r.woke for r in regions)}; caller waiting after its last task "
          f"{waiting:.2f} ms")  # fmt: skip
    losses = sorted(((r.wall - b.sum() / 2, i, r, b)
                     for i, (r, b) in enumerate(zip(regions, base, strict=True))),
                    key=lambda t: -t[0])  # fmt: skip
    for loss, i, r, b in losses[:top]:
        joined = f"{r.joined * 1e3:.0f} us" if r.joined is not None else "never"
        tasks = " ".join(f"{'w' if w else 'c'}{t:.3f}/{t0:.3f}"
                         for t, w, t0 in zip(r.tasks, r.on_worker, b, strict=True))  # fmt: skip
        print(
            f"  region {i}: {r.wall:.3f} ms, +{loss:.3f} over half its tasks; worker "
            f"{'woken, ' if r.woke else ''}joined {joined}, caller done at "
            f"{r.caller_done:.3f}; tasks (now/alone) {tasks}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,squeezenet1_0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--spins", type=int, help="the pool's SPINS, replaced")
    args = parser.parse_args()
    os.environ["TLC_OBJECT_CACHE"] = "0"  # the traced runtime is in no cache key
    with tempfile.TemporaryDirectory() as directory:
        runtime.SOURCE = traced_runtime(directory, args.spins)
        for name in args.models.split(","):
            model(name, args.size, args.calls, args.top)


if __name__ == "__main__":
    main()
