"""Benchmark runners each in a process of its own, timed in turns from one parent.

Why: runners in one process are each other's neighbours. ONNX Runtime's pool threads spin for
about 50 ms after each run (a two-thread squeezenet1_0 session's process took 42 ms of CPU in
the 50 ms after its last call, then nothing), libgomp's (PyTorch's) spin too, and the runner
timed next starts with its second core taken: tlc's timed loop right after ORT's took
1.12-1.26x as long as after a pause. In a process of its own, a runner keeps its own
allocator, caches and pool, and the parent waits `SETTLE_S` before each turn, so the threads
of the runner before it have stopped spinning.

A runner is built in its process by a `build` function of a module the child can import (the
main script, under the `spawn` start method), which returns the callable to time. Each turn
reads the clock around every call: the parent gets each call's time, not only a turn's mean,
so it can take medians per call (a shared VM steals time in bursts, which a mean of a turn
takes in whole). Each runner also keeps the share of the machine's CPU time the hypervisor
reported stolen during its turns (`steal` of /proc/stat), so that a cell whose runners' turns
were stolen from unequally shows it. (This VM also has phases in which two-thread calls take
nearly twice as long, both threads on their own vCPU and busy: mobilenet_v2 at batch 1 8.5 ms
a call in one process and 4.9 in the next, the same code; many short turns in alternation
spread them over the runners.)

The steal counter does not see every slow phase. A fixed float32 matrix product loop, timed
by its thread's CPU time, ran at 93-107 GFLOP/s here in 64 of 66 minutes logged; in one it
ran at 44 on one vCPU alone, with its CPU time accounted in full (the vCPU itself ran at half
speed, so even a CPU-time figure halves), and in five it ran at 40-75 on both vCPUs at once,
once while it ran at 96 alone. The parent therefore runs that loop on all of its CPUs at
once before every timed turn (`vcpu_speed`, about 3 ms with the read below) and keeps the
slowest CPU's rate for the runner whose turn follows (`Isolated.vcpu`): a cell whose runners'
turns saw different speeds is not a comparison. The same probe reads an 8 MiB array on every
CPU at once, for phases in which the caches are slow and the FMA loop in L1 is not.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

#: Seconds the parent waits before each turn: after a turn ONNX Runtime's pool threads spin
#: for about 50 ms, libgomp's (PyTorch's) and OpenBLAS's (numpy's) for 25-100 ms (their
#: processes' CPU time, read every 25 ms after a turn), IREE's not at all.
SETTLE_S = 0.1
#: The probe of `vcpu_speed`: products of float32 matrices of this order, this many a CPU, each
#: on its calling thread (OpenBLAS held to one thread: its Haswell kernels, which it runs on
#: Zen 3, thread a product this small, and two probes' products then fought over both pools
#: there, reading 5-17 GFLOP/s where each vCPU alone ran 60-70).
PROBE_ORDER, PROBE_PRODUCTS = 96, 60
#: Its memory half: this many reads of a float32 array of this many bytes a CPU, beyond any L2
#: of these machines (1 MiB a core on Zen 4, 512 KiB on Zen 3) and, for two CPUs, half the L3
#: (32 MiB): the reach of the MLP's 7.3 MB of weights at batch 1.
PROBE_BYTES, PROBE_READS = 8 << 20, 4


@dataclass(frozen=True)
class VcpuSpeed:
    """What `vcpu_speed` measured: `gflops` of the FMA loop and `l3_gbs`, GB/s read from L3,
    each on the slowest CPU."""

    gflops: float
    l3_gbs: float


#: Each CPU's L3 probe array, kept between probes: allocating 8 MiB faults its pages in again.
_l3_arrays: dict[int | None, np.ndarray] = {}


def vcpu_speed() -> VcpuSpeed:
    """How fast the VM's vCPUs run together right now, whatever else holds them: on every CPU
    this process may run on at once, one thread pinned to each and timed by its own CPU clock,
    a fixed FMA-bound loop of matrix products and a read of an L3-sized array (`max`, which
    streams at the cache's rate), each CPU's slowest rate. Why both: the FMA loop runs in L1
    and misses a phase in which only the caches and memory are slow (the MLP at batch 1 took
    83-98 us a call in one stop's runs against 48 in the last, ONNX Runtime alike, while the
    loop read its usual rate). numpy leaves the GIL during a product and a reduction."""
    pinned = hasattr(os, "sched_setaffinity")
    cpus: list[int | None] = sorted(os.sched_getaffinity(0)) if pinned else [None]
    flops = 2 * PROBE_ORDER**3 * PROBE_PRODUCTS
    together = threading.Barrier(len(cpus))
    rates = [(0.0, 0.0)] * len(cpus)

    def probe(slot: int, cpu: int | None) -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # this thread's
        a = np.full((PROBE_ORDER, PROBE_ORDER), 0.5, np.float32)
        line = _l3_arrays.get(cpu)
        if line is None:
            line = _l3_arrays[cpu] = np.ones(PROBE_BYTES // 4, np.float32)
        together.wait()
        start = time.thread_time()
        for _ in range(PROBE_PRODUCTS):
            a @ a
        gflops = flops / max(time.thread_time() - start, 1e-9) / 1e9
        line.max()  # back into L3 after the runner's turn
        together.wait()
        start = time.thread_time()
        for _ in range(PROBE_READS):
            line.max()
        gbs = PROBE_BYTES * PROBE_READS / max(time.thread_time() - start, 1e-9) / 1e9
        rates[slot] = (gflops, gbs)

    threads = [threading.Thread(target=probe, args=(i, cpu)) for i, cpu in enumerate(cpus)]
    with threadpool_limits(limits=1, user_api="blas"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return VcpuSpeed(min(r[0] for r in rates), min(r[1] for r in rates))


def stolen_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of every CPU so far, from /proc/stat's `cpu` line; (0, 0)
    where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    return fields[7], sum(fields)


def _serve(conn: Connection) -> None:
    """The child: build the runner from the first message (a build may return None: no
    runner here, e.g. a package missing), then answer `call` (the output), `time` (each of n
    calls' seconds on the named clock) and `loop` (the n calls' seconds) until `stop`."""
    try:
        build, args = conn.recv()
        start = time.perf_counter()
        run = build(*args)
        conn.send(("ok", (time.perf_counter() - start, run is not None)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    clocks = {"cpu": time.thread_time, "wall": time.perf_counter}
    while True:
        request = conn.recv()
        try:
            if request[0] == "stop":
                return
            if request[0] == "call":
                conn.send(("ok", run()))
                continue
            what, n, clock_name = request
            clock = clocks[clock_name]
            if what == "loop":  # one clock read around the n calls (calls of microseconds)
                start = clock()
                for _ in range(n):
                    run()
                conn.send(("ok", clock() - start))
                continue
            times = []
            for _ in range(n):
                start = clock()
                run()
                times.append(clock() - start)
            conn.send(("ok", times))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class Isolated:
    """A runner in a child process: `built_s` is the seconds its build took there and
    `available` whether it built a runner at all (a build may return None), `call()`
    runs it once and returns what it returned, `time(n, clock)` runs it n times after
    `SETTLE_S` and returns each call's seconds on `clock` ("cpu": the child's calling
    thread's CPU time, or "wall"), `loop(n, clock)` their sum; `stolen()` is the share of the
    machine's CPU time stolen by the hypervisor during its turns so far, and `vcpu()` the mean
    `vcpu_speed` measured before its timed turns."""

    def __init__(self, build: Callable[..., Callable[[], Any]], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._conn.send((build, args))
        self.built_s, self.available = self._answer()
        self._ticks = [0, 0]  # steal, all, over the turns
        self._speeds: list[VcpuSpeed] = []  # vcpu_speed before each timed turn

    def _answer(self) -> Any:
        status, value = self._conn.recv()
        if status == "error":
            self.close()
            raise RuntimeError(f"the runner's process failed:\n{value}")
        return value

    def call(self) -> Any:
        self._conn.send(("call",))
        return self._answer()

    def time(self, n: int, clock: str) -> list[float]:
        return self._turn("time", n, clock, settle=True)

    def loop(self, n: int, clock: str, settle: bool = True) -> float:
        """Seconds of n calls in one loop on `clock`: one clock read around them, for calls
        too short for a read around each (`settle=False`: no pause first, for a loop that only
        calibrates n)."""
        return self._turn("loop", n, clock, settle)

    def _turn(self, what: str, n: int, clock: str, settle: bool) -> Any:
        """Ask the child for a `time` or `loop` turn, after `SETTLE_S` and a `vcpu_speed`
        probe if `settle`, and count the machine's stolen ticks during it."""
        if settle:
            time.sleep(SETTLE_S)
            self._speeds.append(vcpu_speed())
        steal, ticks = stolen_ticks()
        self._conn.send((what, n, clock))
        answer = self._answer()
        steal_after, ticks_after = stolen_ticks()
        self._ticks[0] += steal_after - steal
        self._ticks[1] += ticks_after - ticks
        return answer

    def stolen(self) -> float:
        return self._ticks[0] / max(self._ticks[1], 1)

    def vcpu(self) -> VcpuSpeed | None:
        """The mean vCPU speeds (`vcpu_speed`) before this runner's timed turns, or None
        before the first."""
        if not self._speeds:
            return None
        return VcpuSpeed(statistics.fmean(s.gflops for s in self._speeds),
                         statistics.fmean(s.l3_gbs for s in self._speeds))  # fmt: skip

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop",))
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
