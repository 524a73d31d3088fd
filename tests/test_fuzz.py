"""A small fuzzing budget on every run (tlc.tools.fuzz has the generators; docs/security.md):
mutated .tlir/.mlir/.npz/.npy/params/.onnx/.vnnlib inputs and traced documents through the
tools, tlc-run's box options and tlc-verify's options drawn at random, graphs with zero-size,
huge and batch (N) extents (a hypothesis strategy) through tlc-run and tlc-compile, fuzzed
calls into the compiled libraries and libraries with forged metadata. Every case runs in a
worker process, so a crash (a signal) or a hang is counted rather than taking the test run
down; each must end `ok`: exit 0, 1 or 2 with no traceback, a call that returns or raises a
documented error."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.tools import fuzz

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the worker uses select on pipes")


@pytest.fixture(scope="module")
def fz() -> Iterator[fuzz.Fuzzer]:
    with fuzz.fuzzer(limit=60.0) as f:
        yield f


def _failures(f: fuzz.Fuzzer) -> list[Any]:
    found, f.failures[:] = list(f.failures), []
    return found


@pytest.mark.parametrize("fmt", fuzz.MUTATED)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_tools_survive_mutated_inputs(fz: fuzz.Fuzzer, fmt: str, seed: int) -> None:
    fz.mutated(fmt, random.Random(seed), seed)
    assert not _failures(fz)


@pytest.mark.parametrize("fmt", fuzz.GENERATED)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_tools_survive_drawn_options_and_forged_libraries(
    fz: fuzz.Fuzzer, fmt: str, seed: int
) -> None:
    """tlc-run's box options, tlc-verify's options, libraries with forged metadata."""
    getattr(fz, fmt)(random.Random(seed), seed)
    assert not _failures(fz)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=fuzz.graph_cases())
def test_generated_graphs_run(fz: fuzz.Fuzzer, case: fuzz.GraphCase) -> None:
    fz.graph(case, 0)
    assert not _failures(fz)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=fuzz.graph_cases())
def test_generated_graphs_compile_and_their_libraries_take_fuzzed_calls(
    fz: fuzz.Fuzzer, case: fuzz.GraphCase
) -> None:
    fz.compile(case, 0)
    assert not _failures(fz)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_compiled_libraries_take_fuzzed_calls(fz: fuzz.Fuzzer, seed: int) -> None:
    rng = random.Random(seed)
    fz.call(fuzz.call_spec(rng, rng.choice(fz.seed_libraries())), seed)
    assert not _failures(fz)


def test_calls_with_right_arguments_return(fz: fuzz.Fuzzer) -> None:
    """Calls with the right arguments return (the fuzzed ones are not all refused), and the
    null-pointer call is answered with a status, not a crash."""
    library = fz.seed_libraries()[0]
    right = {"graph": None, "input": "right", "out": "right", "params": "auto", "raw": False}
    reply = fz.worker.run({**fuzz.call_spec(random.Random(0), library), **right}, 60.0)
    assert reply == {"outcome": "ok", "code": 0}
    raw = fz.worker.run({**fuzz.call_spec(random.Random(0), library), "raw": True}, 60.0)
    assert raw["outcome"] == "ok"


def test_tool_outcome_tells_outcomes_apart() -> None:
    """The oracle itself: a traceback (exit 70, an escaping exception) and an unexpected exit
    are not `ok`."""

    def raises(_argv: list[str]) -> int:
        raise IndexError

    assert fuzz.tool_outcome([], lambda _argv: 1) == ("ok", "", 1)
    assert fuzz.tool_outcome([], lambda _argv: 70)[0] == "traceback"
    assert fuzz.tool_outcome([], raises) == ("traceback", "IndexError: ", 70)
    assert fuzz.tool_outcome([], lambda _argv: 3)[0] == "crash"


class _ScriptedWorker(fuzz.Worker):
    """A worker that is a tiny script: it says ready, then answers, dies by SIGSEGV, sleeps
    (a hang in wall time) or spins (a hang in CPU time)."""

    def __init__(self, directory: Path, action: str):
        super().__init__(directory)
        self.action = action

    def command(self) -> list[str]:
        script = (
            "import os, signal, sys, time\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            f"action = {self.action!r}\n"
            "if action == 'segv': os.kill(os.getpid(), signal.SIGSEGV)\n"
            "if action == 'sleep': time.sleep(60)\n"
            "while action == 'spin': pass\n"
            'print(\'{"outcome": "ok"}\', flush=True)\n'
        )
        return [sys.executable, "-c", script]


@pytest.mark.parametrize(
    ("action", "outcome"),
    [("answer", "ok"), ("segv", "crash"), ("sleep", "hang"), ("spin", "hang")],
)
def test_worker_counts_crashes_and_hangs(tmp_path: Path, action: str, outcome: str) -> None:
    worker = _ScriptedWorker(tmp_path, action)
    try:
        assert worker.run({"tool": "x", "argv": []}, 0.5)["outcome"] == outcome
        if action == "segv":
            assert worker.last_signal == 11
    finally:
        worker.close()
