"""A small fuzzing budget on every run (tlc.tools.fuzz has the generators; docs/security.md):
mutated .tlir/.mlir/.npz/.npy/.onnx inputs and graphs with zero-size and huge extents must end
in exit 0 or 1 without a traceback, within the time limit."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.tools import fuzz

_DIR = Path(tempfile.mkdtemp(prefix="tlc-fuzz-test-"))
_SEEDS = fuzz.make_seeds(_DIR)


@pytest.mark.parametrize("fmt", fuzz.FORMATS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_tools_survive_mutated_inputs(fmt: str, seed: int) -> None:
    outcome = fuzz.one_case(fmt, _SEEDS, random.Random(seed), _DIR, limit=30.0)
    assert outcome == "ok", f"{fmt} case with seed {seed}: {outcome}"


def test_run_case_tells_outcomes_apart() -> None:
    """The oracle itself: a traceback (exit 70) and an unexpected exit are not `ok`."""

    def internal_error(_argv: list[str]) -> int:
        return 70

    def odd_exit(_argv: list[str]) -> int:
        return 3

    assert fuzz.run_case([], lambda _argv: 1, 5.0) == "ok"
    assert fuzz.run_case([], internal_error, 5.0) == "traceback"
    assert fuzz.run_case([], odd_exit, 5.0) == "crash"
