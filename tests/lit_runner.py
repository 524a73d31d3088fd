"""The lit run behind tests/test_lit.py: one lit process over the selected lit files, and each
file's result as lit reports it.

One lit process runs every selected file in parallel in lexical order, which is the order
pytest collects them in; a reader thread records each file's result as lit prints it, and each
test waits only for its own file. It is started once per session, on the selected files only,
as soon as collection finishes (tests/conftest.py), and the lit tests are moved to the end of
the session, so lit runs beside the rest of the suite rather than after it or in its middle:
pytest's other tests run one at a time on one core, and lit takes the cores they leave (`-j` =
cores - 1, or every core when only lit files are selected). The tools the lit files run are
forks of a server that has imported them (tests/toolserver.py, started by lit.cfg.py): lit's
CPU time went from 366 s to ~80 s, under half of the rest of the suite's (~210 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LIT_DIR = Path(__file__).parent / "lit"
SUITE = "tlc"
LIT_FILES = sorted(
    path.relative_to(LIT_DIR).as_posix()
    for path in LIT_DIR.rglob("*")
    if path.suffix in (".tlir", ".mlir") and not {"Inputs", "Output"} & set(path.parts)
)
# lit -v: `PASS: tlc :: ops/softmax.tlir (3 of 97)`; a failure is followed by its output between
# `******************** TEST 'tlc :: ops/softmax.tlir' FAILED ********************` and a rule.
RESULT_LINE = re.compile(rf"^([A-Z]+): {SUITE} :: (\S+) \(\d+ of \d+\)$")
FAILED_BLOCK = re.compile(rf"^\*{{20}} TEST '{SUITE} :: (\S+)' \w+ \*{{20}}$")
BLOCK_END = "*" * 20
PASSING = {"PASS", "XFAIL"}


@dataclass
class LitRun:
    """One lit process over the selected files, and each file's result as it arrives."""

    files: list[str]
    jobs: int = 1
    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)
    done: threading.Condition = field(default_factory=threading.Condition)
    finished: bool = False
    proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        command = [
            sys.executable, "-c", "from lit.main import main; main()",
            "-v", "--order=lexical", f"-j{self.jobs}",
            *(str(LIT_DIR / name) for name in self.files),
        ]  # fmt: skip
        # `sys.executable -c`, not a `lit` script: lit.cfg.py puts this interpreter's directory
        # first on PATH, so the tools under test are the ones installed beside it.
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        self.proc = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def stop(self) -> None:
        """End lit if it still runs (the session ended early: -x, Ctrl-C)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        lines = iter(proc.stdout)
        for line in lines:
            line = line.rstrip("\n")
            self.transcript.append(line)
            if m := RESULT_LINE.match(line):
                status, name = m.groups()
                if status in PASSING or status == "UNSUPPORTED":
                    self._record(name, status, "")
            elif m := FAILED_BLOCK.match(line):
                self._record(m.group(1), "FAIL", "\n".join(self._block(lines)))
        proc.wait()
        with self.done:
            self.finished = True
            self.done.notify_all()

    def _block(self, lines: Iterator[str]) -> Iterator[str]:
        for line in lines:
            line = line.rstrip("\n")
            self.transcript.append(line)
            if line == BLOCK_END:
                return
            yield line

    def _record(self, name: str, status: str, output: str) -> None:
        with self.done:
            self.results[name] = (status, output)
            self.done.notify_all()

    def result(self, name: str) -> tuple[str, str]:
        """(lit's status, its output for a failure) of one file, once lit has reported it."""
        with self.done:
            self.done.wait_for(lambda: name in self.results or self.finished)
            if name in self.results:
                return self.results[name]
        tail = "\n".join(self.transcript[-200:])
        return "NO RESULT", f"lit ended without reporting {name}:\n{tail}"


def lit_run_for(session: pytest.Session) -> LitRun | None:
    """The session's lit run over its selected `test_lit` items, started on first use; None
    when no lit file is selected."""
    run = session.stash.get(LIT_RUN, None)
    if run is None:
        selected = [
            item.callspec.params["name"]
            for item in session.items
            if getattr(item, "originalname", None) == "test_lit" and hasattr(item, "callspec")
        ]
        if not selected:
            return None
        # beside other tests (which run one at a time), lit takes the cores they leave
        beside = len(selected) < len(session.items)
        run = LitRun(selected, max(1, (os.cpu_count() or 1) - beside))
        run.start()
        session.stash[LIT_RUN] = run
    return run


LIT_RUN = pytest.StashKey[LitRun]()
