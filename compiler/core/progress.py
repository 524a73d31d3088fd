"""A progress bar on stderr for long work: `tlc-verify --instances`, `tlc-compile`'s per-graph,
per-CPU-level code generation, the ONNX conformance and model-set runners.

    with Progress(total, "instances") as bar:
        for ...:
            bar.advance("p3.vnnlib: unsat")

The bar is drawn with `rich` (imported on first use: it costs start-up time) only when the
stream (default stderr) is a terminal, so lit, pytest, pipes and logs never see it. Off a
terminal the only output is, with `summary=True`, one line at the end
(`instances: 8/8 in 4.2 s`); tools whose stderr is otherwise checked pass `summary=False`.
`transient=True` erases the bar when the work is done (a compile's bar has no result to keep).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO


class Progress:
    """`total` steps; `advance(note)` marks one done, the note shown beside the bar."""

    def __init__(
        self,
        total: int,
        what: str,
        stream: TextIO | None = None,
        *,
        summary: bool = True,
        transient: bool = False,
    ) -> None:
        self.total, self.what = total, what
        self.stream = stream if stream is not None else sys.stderr
        self.summary, self.transient = summary, transient
        self._bar: Any = None
        self._task: Any = None
        self.done = 0
        self._start = time.monotonic()

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                console=Console(file=self.stream), transient=self.transient,
            )  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total, note="")
        return self

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, note=note)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.summary:
            seconds = time.monotonic() - self._start
            self.stream.write(f"{self.what}: {self.done}/{self.total} in {seconds:.1f} s\n")
