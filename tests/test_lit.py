"""Runs the lit suite from pytest, so a lit failure fails CI's pytest run."""

import os
import subprocess
import sys
from pathlib import Path

LIT_DIR = Path(__file__).parent / "lit"


def test_lit_suite() -> None:
    lit = Path(sys.executable).parent / "lit"
    proc = subprocess.run(
        [str(lit), "-sv", str(LIT_DIR)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    tail = proc.stdout[-20000:] + proc.stderr[-5000:]
    assert proc.returncode == 0, tail
    assert "Passed" in proc.stdout, tail
