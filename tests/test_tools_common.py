"""The exit-code contract shared by every tool (`tlc.tools.common.run_tool`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
