"""bench/isolated.py, the benchmarks' runner processes: what a runner returns comes back, each
call is timed on the clock asked for, and a runner that fails says why in the parent."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from isolated import Isolated, VcpuSpeed, stolen_ticks, vcpu_speed  # noqa: E402


def doubling(xs: np.ndarray) -> Callable[[], object]:
    """A runner: its process id and twice its input (built in the child)."""
    return lambda: (os.getpid(), 2 * xs)


def busy(seconds: float) -> Callable[[], object]:
    """A runner that computes for `seconds` of CPU time on its calling thread."""

    def spin() -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    return spin


def failing() -> Callable[[], object]:
    raise ValueError("no such model")


def test_a_runner_runs_in_a_process_of_its_own_and_returns_its_result() -> None:
    xs = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Isolated(doubling, xs) as runner:
        pid, got = runner.call()
    assert pid != os.getpid()
    assert np.array_equal(got, 2 * xs)


@pytest.mark.parametrize("clock", ["cpu", "wall"])
def test_each_call_is_timed(clock: str) -> None:
    with Isolated(busy, 0.01) as runner:
        times = runner.time(4, clock)
    assert len(times) == 4
    assert all(0.009 < t < 1.0 for t in times), times


def test_a_failing_build_raises_with_the_childs_traceback() -> None:
    with pytest.raises(RuntimeError, match="(?s)the runner's process failed.*no such model"):
        Isolated(failing)


def test_the_stolen_share_is_a_share_of_the_turns_ticks() -> None:
    steal, ticks = stolen_ticks()
    assert 0 <= steal <= ticks
    with Isolated(busy, 0.05) as runner:
        runner.time(2, "wall")
        assert 0.0 <= runner.stolen() <= 1.0
        assert runner._ticks[1] > 0  # the turn's ticks were counted


def nothing() -> None:
    """A build with no runner here (as a peer whose package is missing)."""
    return None


def test_a_loop_is_timed_whole_and_a_missing_runner_is_said() -> None:
    with Isolated(busy, 0.01) as runner:
        assert runner.available
        assert 0.039 < runner.loop(4, "cpu") < 2.0
    with Isolated(nothing) as runner:
        assert not runner.available


def test_the_vcpu_probe_runs_before_each_timed_turn_and_leaves_the_affinity() -> None:
    """The probe is two speeds (GFLOP/s of a fixed loop and GB/s of a fixed read, over its
    threads' CPU time), taken before timed turns only; only its own threads were pinned, the
    parent's is not."""
    allowed = os.sched_getaffinity(0)
    speed = vcpu_speed()
    assert 0.5 < speed.gflops < 100_000
    assert 0.5 < speed.l3_gbs < 100_000
    assert os.sched_getaffinity(0) == allowed
    with Isolated(busy, 0.01) as runner:
        assert runner.vcpu() is None
        runner.loop(2, "cpu", settle=False)  # a calibration loop: no probe
        assert runner.vcpu() is None
        runner.time(2, "wall")
        runner.loop(1, "cpu")
        assert len(runner._speeds) == 2
        speeds = runner._speeds
        assert runner.vcpu() == VcpuSpeed((speeds[0].gflops + speeds[1].gflops) / 2,
                                          (speeds[0].l3_gbs + speeds[1].l3_gbs) / 2)  # fmt: skip
