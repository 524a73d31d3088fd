"""Where the second thread's time goes in real two-thread calls: the pool's regions traced.

    python bench/thread_trace.py [--models resnet18,mobilenet_v2] [--size 224] [--calls 20]
                                 [--top 8] [--spin-us 500] [--ab ROUNDS]

`bench/thread_model.py` says how a network's regions would share two threads if every task
took its one-thread time; this runs the real pool and says what happened. The JIT is built
against the runtime with a clock read (CLOCK_MONOTONIC) around every task, at every region's
open, at the moment its caller runs out of tasks and at its close, and at each worker's join
and leave (`TRACED`, patched into the runtime's source). Per model, at batch 1, two threads,
for the median call of `--calls` (by wall time):

- the call's wall time, the share in regions and the rest (serial nodes, entry, exit);
- the two threads' time in regions (twice their wall) as the tasks' thread CPU time, the tasks'
  time without a core (wall less CPU: preempted) and the time a thread ran no task (joining,
  waiting for the other, or idle at a range's end);
- in regions: the tasks' wall time on the caller and on the worker against the same tasks run
  in turn on one thread (the traced runtime with `tlc_trace_serial(1)`: every region's tasks
  on the caller), i.e. how much slower a task runs while the other core works;
- what the regions lose against an even share of their tasks: the worker's join latency
  (open to join, or the whole region when it never joined), the caller waiting for the worker
  after its last task, and regions the worker never joined;
- then the `--top` regions that lose most (wall time against half their tasks' time).

`--ab ROUNDS` times the runtime instead (untraced) against its policies before ranges were
shared out (`BEFORE`: each thread's range in one call, 4,000 polls without yielding), the
same generated code, alternating `ROUNDS` times `--calls` calls.

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_networks import workload  # noqa: E402
from thread_model import entry_point, jitted  # noqa: E402

from tlc.codegen import runtime  # noqa: E402
from tlc.codegen.loader import EntryPoint  # noqa: E402

#: The trace's log and clock, put before the pool's `run_tasks`.
TRACED = r"""
#include <time.h>
#define TRACE_WORDS (1 << 22)
static int64_t trace_log[TRACE_WORDS]; /* (kind, region, a, b, start, end, cpu, n) records */
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
/* kind 0: a task or a range of parts (a = its first, n = how many, b = worker; cpu: its
 * thread CPU time); 1: a region (a = its tasks or parts, b = 1 for parts); 2: its caller out
 * of tasks; 3: a worker inside it (b = worker); 4: the caller woke sleeping workers. */
static void trace_event(int64_t kind, int64_t a, int64_t b, int64_t start, int64_t end,
                        int64_t cpu, int64_t n) {
    int64_t at = __atomic_fetch_add(&traced, 8, __ATOMIC_ACQ_REL);
    if (at + 8 > TRACE_WORDS) return;
    int64_t *r = trace_log + at;
    r[0] = kind, r[1] = __atomic_load_n(&trace_region, __ATOMIC_ACQUIRE), r[2] = a, r[3] = b;
    r[4] = start, r[5] = end, r[6] = cpu, r[7] = n;
}
static int32_t traced_task(tlc_task task, void *ctx, int64_t i, int64_t worker) {
    int64_t t0 = trace_ns(), c0 = cpu_ns();
    int32_t status = task(ctx, i, worker);
    int64_t cpu = cpu_ns() - c0;
    trace_event(0, i, worker, t0, trace_ns(), cpu, 1);
    return status;
}
static int32_t traced_parts(tlc_parts_task task, void *ctx, int64_t first, int64_t end,
                            int64_t worker) {
    int64_t t0 = trace_ns(), c0 = cpu_ns();
    int32_t status = task(ctx, first, end, worker);
    int64_t cpu = cpu_ns() - c0;
    trace_event(0, first, worker, t0, trace_ns(), cpu, end - first);
    return status;
}
"""

#: (what the runtime says, what the traced runtime says instead); each must occur once.
PATCHES = (
    ("static int64_t take_parts(", TRACED + "static int64_t take_parts("),
    ("job_task(job_ctx, i, worker);", "traced_task(job_task, job_ctx, i, worker);"),
    (
        "job_parts(job_ctx, first, first + n, worker);",
        "traced_parts(job_parts, job_ctx, first, first + n, worker);",
    ),
    (
        "run_tasks(id);",
        "int64_t joined = trace_ns(); run_tasks(id);"
        " trace_event(3, 0, id, joined, trace_ns(), 0, 0);",
    ),
    (
        "    job_task = task;\n    job_parts = parts;\n",
        "    int64_t opened_at = trace_ns();\n"
        "    __atomic_add_fetch(&trace_region, 1, __ATOMIC_ACQ_REL);\n"
        "    job_task = task;\n    job_parts = parts;\n",
    ),
    (
        "    int64_t helpers = (threads < count ? threads : count) - 1;",
        """    if (trace_serial) {
        int64_t opened_at = trace_ns();
        __atomic_add_fetch(&trace_region, 1, __ATOMIC_ACQ_REL);
        for (int64_t i = 0; i < count; i++) traced_task(task, ctx, i, 0);
        trace_event(1, count, 0, opened_at, trace_ns(), 0, 0);
        return 0;
    }
    int64_t helpers = (threads < count ? threads : count) - 1;""",
    ),
    (
        "    int64_t helpers = (threads < parts ? threads : parts) - 1;",
        """    if (trace_serial) { /* each thread's range in its owner's halves */
        int64_t opened_at = trace_ns(), n = threads < parts ? threads : parts;
        __atomic_add_fetch(&trace_region, 1, __ATOMIC_ACQ_REL);
        for (int64_t t = 0; t < n; t++)
            for (int64_t lo = t * parts / n, hi = (t + 1) * parts / n, take; lo < hi;
                 lo += take) {
                take = (hi - lo + 1) / 2;
                traced_parts(task, ctx, lo, lo + take, t);
            }
        trace_event(1, parts, 1, opened_at, trace_ns(), 0, 0);
        return 0;
    }
    int64_t helpers = (threads < parts ? threads : parts) - 1;""",
    ),
    (
        "    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {",
        "    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {\n"
        "        trace_event(4, 0, 0, opened_at, trace_ns(), 0, 0);",
    ),
    (
        "    run_tasks(0);\n",
        "    run_tasks(0);\n    trace_event(2, 0, 0, opened_at, trace_ns(), 0, 0);\n",
    ),
    (
        "    int32_t status = job_status;\n    pthread_mutex_unlock(&region_lock);",
        "    trace_event(1, count, parts != NULL, opened_at, trace_ns(), 0, 0);\n"
        "    int32_t status = job_status;\n    pthread_mutex_unlock(&region_lock);",
    ),
)


def traced_runtime(directory: str, spin_us: int | None = None) -> str:
    """The runtime's source with `PATCHES` applied (and its workers polling for `spin_us`
    microseconds before they sleep), written to `directory`."""
    source = Path(runtime.SOURCE).read_text()
    if spin_us is not None:
        source = re.sub(r"#define SPIN_NS \d+", f"#define SPIN_NS {spin_us * 1000}", source)
    for old, new in PATCHES:
        assert source.count(old) == 1, f"the runtime changed: {old!r}"
        source = source.replace(old, new)
    path = os.path.join(directory, "runtime_traced.c")
    Path(path).write_text(source)
    return path


@dataclass
class Chunk:
    """A task, or a range of a parts region's parts, as one thread ran it."""

    first: int
    n: int
    worker: int
    wall: float  # ms
    cpu: float  # ms of the thread's CPU time


@dataclass
class Region:
    """One region of a traced call (times in ms from its open)."""

    count: int  # its tasks, or its parts
    parts: bool  # a split node's (tlc_rt_parallel_parts)
    wall: float  # open to close
    chunks: list[Chunk] = field(default_factory=list)
    caller_done: float = 0.0  # open to the caller's last task's end
    joined: float | None = None  # open to the worker's join (None: it never joined)
    woke: bool = False  # the caller woke a sleeping worker

    def busy(self, worker: bool) -> float:
        return sum(c.wall for c in self.chunks if (c.worker != 0) == worker)

    def taken(self, threads: int) -> int:
        """Parts run by a thread other than their range's owner (thread t's range: the parts
        from t count / n on, n = min(threads, count))."""
        if not self.parts:
            return 0
        n = min(threads, self.count)

        def owner(part: int) -> int:
            return max(t for t in range(n) if t * self.count // n <= part)

        return sum(c.worker != owner(part) for c in self.chunks
                   for part in range(c.first, c.first + c.n))  # fmt: skip


def regions_of(log: np.ndarray) -> list[Region]:
    """The regions of one call's log, in order."""
    found: dict[int, Region] = {}
    opened: dict[int, int] = {}
    for kind, region, a, b, start, end, _cpu, _n in log:
        if kind == 1:
            opened[region] = start
            found[region] = Region(int(a), bool(b), (end - start) / 1e6)
    for kind, region, a, b, start, end, cpu, n in log:
        r, t0 = found[region], opened[region]
        if kind == 0:
            r.chunks.append(Chunk(int(a), int(n), int(b), (end - start) / 1e6, cpu / 1e6))
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
        done.append((wall, regions_of(log.reshape(-1, 8).copy())))
    return done


def minima(calls: list[tuple[float, list[Region]]], of: str) -> np.ndarray:
    """Per region, the minimum over `calls` of its chunks' summed `of` (wall or cpu)."""
    return np.min([[sum(getattr(c, of) for c in r.chunks) for r in regions]
                   for _, regions in calls], axis=0)  # fmt: skip


def traced_helper() -> ctypes.CDLL:
    """The runtime helper of `runtime.SOURCE` (a traced runtime), its trace log readable."""
    lib = runtime.helper()
    lib.tlc_trace_log.restype = ctypes.POINTER(ctypes.c_int64)
    lib.tlc_trace_words.restype = ctypes.c_int64
    return lib


def model(name: str, size: int, calls: int, top: int) -> None:
    work = workload(name, size, 1)
    module, tracker = jitted(work)
    lib = traced_helper()
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
    base = minima(serial, "wall")  # each region's tasks run in turn on one thread
    wall, regions = sorted(pooled, key=lambda c: c[0])[len(pooled) // 2]
    in_regions = sum(r.wall for r in regions)
    half = base.sum() / 2
    latency = sum(r.joined if r.joined is not None else r.wall for r in regions)
    waiting = sum(r.wall - r.caller_done for r in regions)
    alone_ms = statistics.median(alone)
    print(
        f"{name}, batch 1 (load {os.getloadavg()[0]:.1f}): 1 thread {alone_ms:.2f} ms; "
        f"2 threads {wall:.2f} ms ({alone_ms / wall:.2f}x; median of {calls}), "
        f"{len(regions)} regions {in_regions:.2f} ms, the rest {wall - in_regions:.2f} ms"
    )
    print(f"  tasks' wall: caller {sum(r.busy(False) for r in regions):.2f} ms, worker "
          f"{sum(r.busy(True) for r in regions):.2f}; run in turn {base.sum():.2f}, half "
          f"{half:.2f}; the regions lose {in_regions - half:+.2f} ms against half")  # fmt: skip
    print(f"  tasks' CPU, minima: in turn {minima(serial, 'cpu').sum():.2f} ms, in the pool "
          f"{minima(pooled, 'cpu').sum():.2f} ms")  # fmt: skip
    cpu = sum(c.cpu for r in regions for c in r.chunks)
    busy = sum(r.busy(False) + r.busy(True) for r in regions)
    print(f"  the two threads' {2 * in_regions:.2f} ms in regions: tasks' CPU {cpu:.2f}, tasks "
          f"without a core {busy - cpu:.2f}, no task {2 * in_regions - busy:.2f}")  # fmt: skip
    print(f"  worker join latency {latency:.2f} ms summed, never joined "
          f"{sum(r.joined is None for r in regions)} of {len(regions)}, woken from sleep "
          f"{sum(r.woke for r in regions)}; caller waiting after its last task "
          f"{waiting:.2f} ms; parts run off their range's thread "
          f"{sum(r.taken(2) for r in regions)}")  # fmt: skip
    losses = sorted(((r.wall - b / 2, i, r) for i, (r, b) in enumerate(zip(regions, base,
                     strict=True))), key=lambda t: -t[0])  # fmt: skip
    for loss, i, r in losses[:top]:
        joined = f"{r.joined * 1e3:.0f} us" if r.joined is not None else "never"
        chunks = " ".join(f"{'w' if c.worker else 'c'}[{c.first},{c.first + c.n}){c.wall:.3f}"
                          for c in r.chunks)  # fmt: skip
        print(
            f"  region {i}: {r.wall:.3f} ms, +{loss:.3f} over half its tasks; worker "
            f"{'woken, ' if r.woke else ''}joined {joined}, caller done at "
            f"{r.caller_done:.3f}; {chunks}"
        )


#: The runtime's policies before ranges were shared out (`--ab`): a thread takes its whole
#: range at once (so another takes it only untouched) and polls 4,000 times without yielding.
BEFORE = (
    ("int64_t n = (hi - lo + 1) / 2;", "int64_t n = hi - lo;"),
    (
        "static int polling(int64_t since, int64_t i) {\n",
        "static int polling(int64_t since, int64_t i) {\n    (void)since;\n    return i < 4000;\n",
    ),
)


def ab(name: str, size: int, calls: int, rounds: int, directory: str) -> None:
    """Two-thread wall time of the runtime against `BEFORE`'s, the same code, alternating."""
    work = workload(name, size, 1)
    source = Path(runtime.SOURCE).read_text()
    before = source
    for old, new in BEFORE:
        assert before.count(old) == 1, f"the runtime changed: {old!r}"
        before = before.replace(old, new)
    entries = {}
    for label, text in (("before", before), ("now", source)):
        path = os.path.join(directory, f"runtime_{label}.c")
        Path(path).write_text(text)
        runtime.SOURCE = path  # a helper of its own: its own pool
        module, tracker = jitted(work)
        entries[label] = (entry_point(module, tracker, 2), tracker)
    outputs = {label: entry(work.x).tobytes() for label, (entry, _) in entries.items()}
    assert len(set(outputs.values())) == 1
    times: dict[str, list[float]] = {label: [] for label in entries}
    for _ in range(rounds):
        for label, (entry, _) in entries.items():
            for _ in range(3):
                entry(work.x)
            for _ in range(calls):
                start = time.perf_counter()
                entry(work.x)
                times[label].append((time.perf_counter() - start) * 1e3)
    median = {label: statistics.median(t) for label, t in times.items()}
    print(f"{name}, batch 1, 2 threads (load {os.getloadavg()[0]:.1f}): before "
          f"{median['before']:.2f} ms, now {median['now']:.2f} ms (medians of {rounds} x "
          f"{calls} calls): {median['before'] / median['now']:.3f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,squeezenet1_0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--spin-us", type=int, help="the pool's SPIN_NS / 1000, replaced")
    parser.add_argument("--ab", type=int, metavar="ROUNDS",
                        help="time the runtime against BEFORE's instead, untraced")  # fmt: skip
    args = parser.parse_args()
    os.environ["TLC_OBJECT_CACHE"] = "0"  # the traced runtime is in no cache key
    original = runtime.SOURCE
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models.split(","):
            runtime.SOURCE = original
            if args.ab:
                ab(name, args.size, args.calls, args.ab, directory)
                continue
            runtime.SOURCE = traced_runtime(directory, args.spin_us)
            model(name, args.size, args.calls, args.top)


if __name__ == "__main__":
    main()
