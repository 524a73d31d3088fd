"""tlc.tools.progress: a rich bar on a terminal, one summary line otherwise."""

from __future__ import annotations

import io
import os

from tlc.tools.progress import Progress


def test_no_terminal_gives_one_summary_line() -> None:
    stream = io.StringIO()
    with Progress(3, "instances", stream) as bar:
        for note in ("a: unsat", "b: sat", "c: unknown"):
            bar.advance(note)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("instances: 3/3 in ")


def test_terminal_gets_the_bar() -> None:
    leader, follower = os.openpty()
    with open(follower, "w", closefd=True) as tty, Progress(2, "instances", tty) as bar:
        bar.advance("p0.vnnlib: unsat")
        bar.advance("p1.vnnlib: sat")
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    drawn = b"".join(chunks).decode(errors="replace")
    assert "2/2" in drawn and "p1.vnnlib: sat" in drawn
    assert "instances: 2/2 in" not in drawn  # the summary line is for logs only
