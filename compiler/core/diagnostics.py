"""Diagnostics in MLIR's form: `file:line:col: error: message`, the source line and a caret.

Passes and the front end raise `DiagnosticError` carrying one or more `Diagnostic`s; tools render
them with a `SourceManager` and exit 1. A diagnostic knows its location (from the op's
`FileLineColLoc`, which the parser attaches to every op), never the other way round.
"""

from __future__ import annotations

import difflib
import linecache
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # xdsl is imported where an op is at hand: a compile worker never is
    from xdsl.dialects.builtin import FileLineColLoc, StringAttr
    from xdsl.ir import Operation


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    col: int

    def to_attr(self) -> FileLineColLoc:
        from tlc.core.attrs import file_loc

        return file_loc(_file_attr(self.file), self.line, self.col)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@cache
def _file_attr(name: str) -> StringAttr:
    """One attribute per file name, shared by every location in the file."""
    from xdsl.dialects.builtin import StringAttr

    return StringAttr(name)


def location_of(op: Operation) -> Location | None:
    from xdsl.dialects.builtin import FileLineColLoc

    loc = op.location
    if isinstance(loc, FileLineColLoc):
        return Location(loc.filename.data, loc.line.data, loc.column.data)
    return None


@dataclass
class Diagnostic:
    severity: str  # "error", "warning", "note" or "remark"
    message: str
    location: Location | None = None
    notes: list[Diagnostic] = field(default_factory=list)


class DiagnosticError(Exception):
    """Bad input: one or more diagnostics to show the user (exit code 1)."""

    def __init__(self, *diagnostics: Diagnostic):
        super().__init__("\n".join(d.message for d in diagnostics))
        self.diagnostics = list(diagnostics)
        #: The texts the diagnostics point into, when known (the Python API sets it), so that
        #: `str(exc)` quotes the source line with a caret as the tools print it.
        self.sources: SourceManager | None = None

    def __str__(self) -> str:
        """The diagnostics as the tools print them: `file:line:col: error: message`, then the
        source line and a caret where the text is known."""
        manager = self.sources or SourceManager(from_disk=True)
        return "\n".join(manager.render(d) if d.location else d.message for d in self.diagnostics)

    @classmethod
    def simple(cls, message: str) -> DiagnosticError:
        """An error with no source location (bad command-line values, unreadable files)."""
        return cls(Diagnostic("error", message))


def error(message: str, where: Operation | Location | None = None) -> DiagnosticError:
    """An error located at an op (its parsed location) or at an explicit location."""
    loc = where if where is None or isinstance(where, Location) else location_of(where)
    return DiagnosticError(Diagnostic("error", message, loc))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'sigmoid'?` when a known name is close to a misspelt `word` (difflib's
    ratio >= 0.6, as the standard library's own NameError hints), else the empty string: the
    tail every "unknown X" message appends."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


class SourceManager:
    """Remembers source texts by file name so diagnostics can quote the offending line.

    `from_disk`: quote files it was not given from disk (Python API errors, where no tool read
    the text); the tools give it every text they read and quote nothing else."""

    def __init__(self, from_disk: bool = False) -> None:
        self._texts: dict[str, str] = {}
        self._lines: dict[str, list[str]] = {}
        self._from_disk = from_disk

    def add(self, name: str, text: str) -> None:
        """Remember `text` (split into lines only if a diagnostic quotes it: a 30 MB document
        that reads fine is never split)."""
        self._texts[name] = text
        self._lines.pop(name, None)

    def render(self, diag: Diagnostic) -> str:
        out = [self._render_one(diag)]
        out.extend(self._render_one(note) for note in diag.notes)
        return "\n".join(out)

    def _render_one(self, diag: Diagnostic) -> str:
        loc = diag.location
        if loc is None:
            return f"{diag.severity}: {diag.message}"
        head = f"{loc}: {diag.severity}: {diag.message}"
        source = self._line(loc)
        if source is None:
            return head
        return f"{head}\n{source}\n{' ' * (loc.col - 1)}^"

    def _line(self, loc: Location) -> str | None:
        if loc.file in self._texts and loc.file not in self._lines:
            self._lines[loc.file] = self._texts[loc.file].splitlines()
        lines = self._lines.get(loc.file)
        if lines is None:
            line = linecache.getline(loc.file, loc.line) if self._from_disk else ""
            return line.rstrip("\n") if line else None
        return lines[loc.line - 1] if 1 <= loc.line <= len(lines) else None
