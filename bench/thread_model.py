"""How a network's split nodes would share two threads, measured without a second core.

    python bench/thread_model.py [--models resnet18,mobilenet_v2] [--size 224] [--threads 2]
                                 [--batch 1] [--calls 40] [--top 10]

On a loaded machine a two-thread wall time mostly says how often the other core was free.
This builds the JIT against a runtime whose `tlc_rt_parallel` runs every region's tasks in
turn on the calling thread and times each by thread CPU time, then deals each region's tasks,
in order, to the first free of `--threads` threads (as the pool's atomic counter does): per
model, at `--batch` images (default 1), the one-thread call, the tasks' CPU summed (what the
parts cost, copies repeated between them included), the busiest thread summed over the
regions against half the tasks (the balance), and the modelled call (the busiest threads
plus the rest of the call, which runs on the calling thread: serial nodes, the clock reads).
Each task's time, and the rest's, is its minimum over `--calls` calls. Then the `--top`
regions whose busiest thread loses most against an even share (at batch 1). The model leaves
out what two threads share: the L3 cache and the memory bandwidth. docs/codegen.md ("One
range of parts per thread") gives figures. Needs torchvision (see tests/torchvision_models.py).
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

from real_networks import workload  # noqa: E402

from tlc.codegen import runtime  # noqa: E402
from tlc.codegen.jit import jit_link  # noqa: E402
from tlc.codegen.loader import EntryPoint  # noqa: E402
from tlc.codegen.lower.rules import busiest  # noqa: E402
from tlc.codegen.module import bakes_payload, build_graph_module  # noqa: E402

#: What replaces `tlc_rt_parallel` in the runtime's source: the tasks in turn, each timed.
SERIAL = r"""
#include <time.h>
#define LOG_ENTRIES (1 << 20)
static int64_t task_log[LOG_ENTRIES]; /* (region, task, ns) triples */
static int64_t logged, regions;
RT int64_t *tlc_model_log(void) { return task_log; }
RT int64_t tlc_model_logged(void) { return logged; }
RT void tlc_model_reset(void) { logged = 0; }
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
        if (logged + 3 <= LOG_ENTRIES) {
            task_log[logged++] = regions;
            task_log[logged++] = i;
            task_log[logged++] = spent;
        }
        if (status != 0 && failed == 0) failed = status;
    }
    return failed;
}
"""


def serial_runtime(directory: str) -> str:
    """The runtime's source with `SERIAL` for its `tlc_rt_parallel`, written to `directory`."""
    source = Path(runtime.SOURCE).read_text()
    start = source.index("RT int32_t tlc_rt_parallel(")
    end = source.index("/* -- the arena cache")
    path = os.path.join(directory, "runtime_serial.c")
    Path(path).write_text(source[:start] + SERIAL + source[end:])
    return path


def model(name: str, size: int, threads: int, calls: int, top: int, batch: int = 1) -> None:
    work = workload(name, size, batch)
    graph, payload = work.traced.graph, work.traced.payload
    module = build_graph_module(graph, payload, np.float32,
                                bound_payload=not bakes_payload(graph, np.float32))  # fmt: skip
    tracker = jit_link(module.ir, [module.symbol])
    lib = runtime.helper()
    lib.tlc_model_log.restype = ctypes.POINTER(ctypes.c_int64)
    lib.tlc_model_logged.restype = ctypes.c_int64
    call_ns: dict[int, int] = {}
    task_ns: dict[tuple[int, int], int] = {}
    rest_ns: list[int] = []  # per call, the time outside its tasks
    for count in (1, threads) * 2:
        entry = EntryPoint(module.symbol, tracker[module.symbol], module.input_shape,
                           module.output_shape, module.dtype, None, owner=tracker,
                           bound=module.bound, threads=count)  # fmt: skip
        entry(work.x)
        for _ in range(calls // 2):
            lib.tlc_model_reset()
            start = time.thread_time_ns()
            entry(work.x)
            spent = time.thread_time_ns() - start
            call_ns[count] = min(call_ns.get(count, spent), spent)
            if count == 1:
                continue
            log = np.ctypeslib.as_array(lib.tlc_model_log(), (lib.tlc_model_logged(),))
            log = log.reshape(-1, 3)
            rest_ns.append(spent - int(log[:, 2].sum()))
            for region, task, ns in log - [log[0, 0], 0, 0] if len(log) else ():
                key = (int(region), int(task))
                task_ns[key] = min(task_ns.get(key, int(ns)), int(ns))
    regions: dict[int, list[float]] = {}
    for (region, _), ns in sorted(task_ns.items()):
        regions.setdefault(region, []).append(ns / 1e6)
    tasks = sum(sum(times) for times in regions.values())
    most = sum(busiest(times, threads) for times in regions.values())
    rest = min(rest_ns) / 1e6
    one = call_ns[1] / 1e6
    print(f"{name}, batch {batch} (load {os.getloadavg()[0]:.1f}): 1 thread {one:.2f} ms; "
          f"{threads} threads: tasks {tasks:.2f} ms in {sum(map(len, regions.values()))} "
          f"over {len(regions)} regions, busiest threads {most:.2f} ms (an even share "
          f"{tasks / threads:.2f}), rest of the call {rest:.2f}; modelled call "
          f"{most + rest:.2f} ms ({one / (most + rest):.2f}x)")  # fmt: skip
    split = [p for p in module.plan.nodes if p.parts > 1 and p.rows is None]
    if len(split) != len(regions):  # row regions too (not at batch 1): no node names
        return
    losses = sorted(((busiest(times, threads) - sum(times) / threads, p, times)
                     for p, times in zip(split, regions.values(), strict=True)),
                    key=lambda row: -row[0])  # fmt: skip
    for loss, p, times in losses[:top]:
        shares = " ".join(f"{t:.3f}" for t in times)
        print(f"  +{loss:.3f} ms  {p.node.TAG} %{p.node.id} -> {list(p.shape)}, "
              f"{p.parts} parts; tasks {shares}")  # fmt: skip


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
