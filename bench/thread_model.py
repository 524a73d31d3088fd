"""How a network's split nodes would share two threads, measured without a second core.

    python bench/thread_model.py [--models resnet18,mobilenet_v2] [--size 224] [--threads 2]
                                 [--batch 1] [--calls 40] [--top 10]

On a loaded machine a two-thread wall time mostly says how often the other core was free. This
builds the JIT against a runtime whose `tlc_rt_parallel` runs every region's tasks in turn on
the calling thread and times each by thread CPU time, then deals each region's tasks, in order,
to the first free of `--threads` threads (as the pool's atomic counter does); a split node's
region (`tlc_rt_parallel_parts`) runs each thread's range in the calls its owner makes when no
thread takes from another (halves of what is left), on that thread: per model, at `--batch`
images (default 1), the one-thread call, the tasks' CPU summed (what the parts cost, copies
repeated between them included), the busiest thread summed over the regions against half the
tasks (the balance), and the modelled call (the busiest threads plus the rest of the call, which
runs on the calling thread: serial nodes, the clock reads); then what the runtime's taking from
each other's ranges changes, simulated on each part's time alone. Each task's time, and the
rest's, is its minimum over `--calls` calls. Then the `--top` regions whose busiest thread loses
most against an even share. The model leaves out what two threads share: the L3 cache and the
memory bandwidth. docs/threads-memory.md ("One range of parts per thread") gives figures. Needs
torchvision (see tests/torchvision_models.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llvmlite import binding as llvm  # noqa: E402
from real_networks import Workload, workload  # noqa: E402

from tlc.codegen import runtime  # noqa: E402
from tlc.codegen.jit import jit_link  # noqa: E402
from tlc.codegen.loader import EntryPoint  # noqa: E402
from tlc.codegen.lower.rules import busiest  # noqa: E402
from tlc.codegen.module import GraphModule, bakes_payload, build_graph_module  # noqa: E402
from tlc.codegen.plan import GraphPlan  # noqa: E402

#: What replaces `tlc_rt_parallel` and `tlc_rt_parallel_parts` in the runtime's source: the
#: tasks in turn, each timed; a parts region's ranges as the runtime starts them, each in the
#: owner's halves (what it runs when no thread takes from another).
SERIAL = r"""
#include <time.h>
#define LOG_ENTRIES (1 << 20)
static int64_t task_log[LOG_ENTRIES]; /* (region, task, ns, thread or -1) records */
static int64_t logged, regions;
RT int64_t *tlc_model_log(void) { return task_log; }
RT int64_t tlc_model_logged(void) { return logged; }
RT void tlc_model_reset(void) { logged = 0; }
static int singles; /* time each part of a parts region alone too */
RT void tlc_model_singles(int on) { singles = on; }
static int64_t thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
RT int32_t tlc_rt_parallel(tlc_task task, void *ctx, int64_t count, int32_t threads) {
    int32_t failed = 0;
    regions++;
    for (int64_t i = 0; i < count; i++) {
        int64_t start = thread_ns();
        int32_t status = task(ctx, i, 0);
        int64_t spent = thread_ns() - start;
        if (logged + 4 <= LOG_ENTRIES) {
            task_log[logged++] = regions;
            task_log[logged++] = i;
            task_log[logged++] = spent;
            task_log[logged++] = -1;
        }
        if (status != 0 && failed == 0) failed = status;
    }
    return failed;
}
RT int32_t tlc_rt_parallel_parts(tlc_parts_task task, void *ctx, int64_t parts,
                                 int32_t threads) {
    int32_t failed = 0;
    int64_t n = threads < parts ? threads : parts, calls = 0;
    regions++;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t lo = t * parts / n, hi = (t + 1) * parts / n; lo < hi;) {
            int64_t take = (hi - lo + 1) / 2, start = thread_ns();
            int32_t status = task(ctx, lo, lo + take, 0);
            int64_t spent = thread_ns() - start;
            if (logged + 4 <= LOG_ENTRIES) {
                task_log[logged++] = regions;
                task_log[logged++] = calls++;
                task_log[logged++] = spent;
                task_log[logged++] = t;
            }
            if (status != 0 && failed == 0) failed = status;
            lo += take;
        }
    }
    for (int64_t part = 0; singles && part < parts; part++) { /* each alone (thread -2) */
        int64_t start = thread_ns();
        task(ctx, part, part + 1, 0);
        int64_t spent = thread_ns() - start;
        if (logged + 4 <= LOG_ENTRIES) {
            task_log[logged++] = regions;
            task_log[logged++] = parts + part; /* after the region's calls */
            task_log[logged++] = spent;
            task_log[logged++] = -2;
        }
    }
    return failed;
}
"""


def serial_runtime(directory: str) -> str:
    """The runtime's source with `SERIAL` for its `tlc_rt_parallel` and
    `tlc_rt_parallel_parts`, written to `directory`."""
    source = Path(runtime.SOURCE).read_text()
    start = source.index("RT int32_t tlc_rt_parallel(")
    end = source.index("/* -- the arena cache")
    path = os.path.join(directory, "runtime_serial.c")
    Path(path).write_text(source[:start] + SERIAL + source[end:])
    return path


def jitted(work: Workload) -> tuple[GraphModule, llvm.ResourceTracker]:
    """`work`'s model (float32) through the JIT, linked against the runtime of
    `runtime.SOURCE` (run with `TLC_OBJECT_CACHE=0`: the source is in no cache key)."""
    graph, payload = work.traced.graph, work.traced.payload
    module = build_graph_module(graph, payload, np.float32,
                                bound_payload=not bakes_payload(graph, np.float32))  # fmt: skip
    return module, jit_link(module.ir, [module.symbol])


def entry_point(module: GraphModule, tracker: llvm.ResourceTracker, threads: int) -> EntryPoint:
    """The jitted model's entry at `threads` threads."""
    return EntryPoint(module.symbol, tracker[module.symbol], module.input_shape,
                      module.output_shape, module.dtype, None, owner=tracker,
                      bound=module.bound, threads=threads)  # fmt: skip


def shared_out(parts: list[float], threads: int, steal: bool = True) -> float:
    """When the last of `threads` threads finishes a parts region whose parts take `parts`
    (each's time alone; a range costs its parts' sum) under `tlc_rt_parallel_parts`' policy:
    thread t starts on the parts [t P / n, (t + 1) P / n), takes half of what is left of its
    range (rounded up) whenever it is free, and then (`steal`) the last half of what is left
    of the range with the most left."""
    n = min(threads, len(parts))
    ranges = [[t * len(parts) // n, (t + 1) * len(parts) // n] for t in range(n)]
    free, done = [0.0] * n, [False] * n  # done: nothing left for the thread to take
    while not all(done):
        t = min((f, t) for t, f in enumerate(free) if not done[t])[1]
        lo, hi = ranges[t]
        if lo < hi:
            take = (hi - lo + 1) // 2
            ranges[t][0] = lo + take
            free[t] += sum(parts[lo : lo + take])
            continue
        victim = max(range(n), key=lambda v: ranges[v][1] - ranges[v][0])
        lo, hi = ranges[victim]
        if not steal or lo >= hi:
            done[t] = True
            continue
        take = (hi - lo + 1) // 2
        ranges[victim][1] = hi - take
        free[t] += sum(parts[hi - take : hi])
    return max(free)


def model(name: str, size: int, threads: int, calls: int, top: int, batch: int = 1) -> None:
    work = workload(name, size, batch)
    module, tracker = jitted(work)
    lib = runtime.helper()
    lib.tlc_model_log.restype = ctypes.POINTER(ctypes.c_int64)
    lib.tlc_model_logged.restype = ctypes.c_int64
    call_ns: dict[int, int] = {}
    task_ns: dict[tuple[int, int], int] = {}
    thread_of: dict[tuple[int, int], int] = {}  # a parts region's call: its thread
    part_ns: dict[tuple[int, int], int] = {}  # a parts region's part, alone
    rest_ns: list[int] = []  # per call, the time outside its tasks
    for count in (1, threads, 1, threads, -threads):  # -threads: time the parts alone
        lib.tlc_model_singles(count < 0)
        entry = entry_point(module, tracker, abs(count))
        entry(work.x)
        for _ in range(calls // 2):
            lib.tlc_model_reset()
            start = time.thread_time_ns()
            entry(work.x)
            spent = time.thread_time_ns() - start
            log = np.ctypeslib.as_array(lib.tlc_model_log(), (lib.tlc_model_logged(),))
            log = log.reshape(-1, 4) - [log[0], 0, 0, 0] if len(log) else log.reshape(-1, 4)
            if count < 0:
                for region, part, ns, _ in log[log[:, 3] == -2]:
                    key = (int(region), int(part))
                    part_ns[key] = min(part_ns.get(key, int(ns)), int(ns))
                continue
            call_ns[count] = min(call_ns.get(count, spent), spent)
            if count == 1:
                continue
            rest_ns.append(spent - int(log[:, 2].sum()))
            for region, task, ns, thread in log:
                key = (int(region), int(task))
                task_ns[key] = min(task_ns.get(key, int(ns)), int(ns))
                thread_of[key] = int(thread)
    regions: dict[int, list[float]] = {}
    owners: dict[int, list[int]] = {}
    for (region, task), ns in sorted(task_ns.items()):
        regions.setdefault(region, []).append(ns / 1e6)
        owners.setdefault(region, []).append(thread_of[region, task])
    alone: dict[int, list[float]] = {}  # a parts region's parts, each run alone
    for (region, _), ns in sorted(part_ns.items()):
        alone.setdefault(region, []).append(ns / 1e6)

    def region_busiest(region: int) -> float:
        """The busiest thread of a region: of its tasks dealt in order to the first free
        thread, or of its parts' ranges, each on its thread."""
        times = regions[region]
        if owners[region][0] < 0:
            return busiest(times, threads)
        per = [0.0] * threads
        for t, owner in zip(times, owners[region], strict=True):
            per[owner] += t
        return max(per)

    tasks = sum(sum(times) for times in regions.values())
    most = sum(region_busiest(region) for region in regions)
    # the parts regions with the runtime's taking from each other, on the parts' times alone,
    # against the same times without it
    shared = sum(shared_out(alone[r], threads) - shared_out(alone[r], threads, steal=False)
                 for r in alone)  # fmt: skip
    rest = min(rest_ns) / 1e6
    one = call_ns[1] / 1e6
    print(f"{name}, batch {batch} (load {os.getloadavg()[0]:.1f}): 1 thread {one:.2f} ms; "
          f"{threads} threads: tasks {tasks:.2f} ms in {sum(map(len, regions.values()))} "
          f"over {len(regions)} regions, busiest threads {most:.2f} ms (an even share "
          f"{tasks / threads:.2f}), rest of the call {rest:.2f}; modelled call "
          f"{most + rest:.2f} ms ({one / (most + rest):.2f}x)")  # fmt: skip
    print(f"  the split nodes' parts, each alone, shared out as the runtime does: the busiest "
          f"threads {shared:+.3f} ms against each thread keeping its range")  # fmt: skip
    names = parts_regions(module.plan)
    if len(names) != len(regions):  # row regions too (not at batch 1): no node names
        return
    losses = sorted(((region_busiest(region) - sum(times) / threads, name, times)
                     for name, (region, times) in zip(names, regions.items(), strict=True)),
                    key=lambda row: -row[0])  # fmt: skip
    for loss, name, times in losses[:top]:
        shares = " ".join(f"{t:.3f}" for t in times)
        print(f"  +{loss:.3f} ms  {name}; tasks {shares}")


def parts_regions(plan: GraphPlan) -> list[str]:
    """The names of a call's parts regions, in order: each split node's (`conv %1 -> [1, 96,
    109, 109], 6 parts`)."""
    return [f"{p.node.TAG} %{p.node.id} -> {list(p.shape)}, {p.parts} parts"
            for p in plan.nodes if p.parts > 1 and p.rows is None]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,squeezenet1_0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    os.environ["TLC_OBJECT_CACHE"] = "0"  # the serial runtime is in no cache key
    with tempfile.TemporaryDirectory() as directory:
        runtime.SOURCE = serial_runtime(directory)
        for name in args.models.split(","):
            model(name, args.size, args.threads, args.calls, args.top, args.batch)


if __name__ == "__main__":
    main()
