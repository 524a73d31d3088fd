"""The tool server the lit suite and the doc tests run the tools on (tests/toolserver.py): a
command run through it prints, reads and exits as the installed script run as a new process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import toolserver

ROOT = Path(__file__).parent.parent
MLP = str(ROOT / "examples" / "mlp.tlir")
BIN = os.path.dirname(sys.executable)


def both(command: list[str], stdin: str = "") -> tuple[subprocess.CompletedProcess[str], ...]:
    """`command` run by the installed script and through the server, in the same directory."""
    (served,) = toolserver.commands() or pytest.skip("TLC_FRESH_TOOLS=1: no server to compare")
    runs = []
    for first in (BIN, served):
        env = {**os.environ, "PATH": os.pathsep.join([first, BIN, os.environ.get("PATH", "")])}
        runs.append(
            subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                check=False,
                timeout=300,
            )
        )
    return tuple(runs)


@pytest.mark.parametrize(
    ("command", "stdin", "code"),
    [
        (["tlc-opt", MLP, "-p", "verify-structure,infer-shapes", "--emit", "listing"], "", 0),
        (["tlc-opt", "-", "--emit", "listing"], "tl.graph @g {\n  %0 = input : [2\n}\n", 1),
        (["tlc-opt", MLP, "--emitt", "listing"], "", 2),
        (["tlc-run", MLP, "--input", "0.3,-0.2,0.1,0.4", "--print-values"], "", 0),
        (["filecheck", str(ROOT / "tests/lit/ops/softmax.tlir")], "tl.graph @other\n", 1),
    ],
    ids=["listing", "diagnostic-from-stdin", "usage", "run", "filecheck-mismatch"],
)
def test_served_command_behaves_as_the_script(command: list[str], stdin: str, code: int) -> None:
    fresh, served = both(command, stdin)
    assert fresh.returncode == code, fresh.stderr
    assert (served.returncode, served.stdout, served.stderr) == (
        fresh.returncode, fresh.stdout, fresh.stderr,
    )  # fmt: skip


def test_served_command_sees_its_directory_and_environment(tmp_path: Path) -> None:
    """-o relative to the command's directory; TLC_MAX_ELEMENTS read from its environment (the
    server was started without it)."""
    (served,) = toolserver.commands() or pytest.skip("TLC_FRESH_TOOLS=1: no server to compare")
    env = {**os.environ, "PATH": os.pathsep.join([served, BIN, os.environ.get("PATH", "")])}
    done = subprocess.run(
        ["tlc-opt", MLP, "-o", "out.tlir"], cwd=tmp_path, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.tlir").read_text().startswith("tl.graph @mlp")
    done = subprocess.run(
        ["tlc-run", MLP, "--input", "0.3,-0.2,0.1,0.4"], cwd=tmp_path, capture_output=True,
        env={**env, "TLC_MAX_ELEMENTS": "3"}, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "has 4 elements, over the element budget of 3 (set TLC_MAX_ELEMENTS" in done.stderr
