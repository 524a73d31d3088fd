"""The exit-code contract shared by every tool (`tlc.tools.common.run_tool`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tlc.tools.common import run_tool

MLP = Path(__file__).parent.parent / "examples" / "mlp.tlir"


def test_closed_stdout_exits_quietly() -> None:
    """`tlc-run ... | head` where the reader has gone: no traceback, no internal-error exit 70."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the tool writes: the write fails with EPIPE
    try:
        done = subprocess.run(
            ["tlc-run", str(MLP), "--input", "0.3,-0.2,0.1,0.4"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 1


def test_out_of_memory_is_a_diagnostic(capsys: pytest.CaptureFixture[str]) -> None:
    """Below the element budget the machine can still run out: exit 1 with a message naming
    the budget, not a traceback."""

    def body() -> int:
        raise MemoryError

    assert run_tool(body, "tlc-test") == 1
    assert capsys.readouterr().err == (
        "error: out of memory (lower TLC_MAX_ELEMENTS to refuse such inputs early)\n"
    )


@pytest.mark.parametrize("digits", ["-1", "1000000000000", "1" * 5000, "six"])
def test_digits_out_of_range_is_a_usage_error(
    digits: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--digits=-1` and `--digits 1000000000000` were ValueErrors from the formatter."""
    from tlc.tools.run import main as run_main

    assert run_main([str(MLP), "--input", "1,2,3,4", f"--digits={digits}"]) == 2
    err = capsys.readouterr().err
    assert "argument --digits: expected an integer in [0, 100], got" in err
    assert "Traceback" not in err


def test_tool_runs_make_full_collections_rare() -> None:
    """During a tool run the collector's oldest generation is collected rarely (a parsed module
    is not rescanned); the thresholds are restored afterwards, also when the body fails."""
    import gc

    from tlc.tools.common import FULL_COLLECTION_EVERY

    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    def body() -> int:
        seen.append(gc.get_threshold())
        raise ValueError("a bug")

    assert run_tool(body, "tlc-test") == 70
    assert seen == [(before[0], before[1], max(before[2], FULL_COLLECTION_EVERY))]
    assert gc.get_threshold() == before
