"""Diagnostics in MLIR's form: `file:line:col: error: message`, the source line and a caret.

Passes and the front end raise `DiagnosticError` carrying one or more `Diagnostic`s; tools render
them with a `SourceManager` and exit 1. A diagnostic knows its location (from the op's
`FileLineColLoc`, which the parser attaches to every op), never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, StringAttr
from xdsl.ir import Operation


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    col: int

    def to_attr(self) -> FileLineColLoc:
        return FileLineColLoc(_file_attr(self.file), IntAttr(self.line), IntAttr(self.col))

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@cache
def _file_attr(name: str) -> StringAttr:
    """One attribute per file name, shared by every location in the file."""
    return StringAttr(name)


def location_of(op: Operation) -> Location | None:
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

    @classmethod
    def simple(cls, message: str) -> DiagnosticError:
        """An error with no source location (bad command-line values, unreadable files)."""
        return cls(Diagnostic("error", message))


def error(message: str, where: Operation | Location | None = None) -> DiagnosticError:
    """An error located at an op (its parsed location) or at an explicit location."""
    loc = location_of(where) if isinstance(where, Operation) else where
    return DiagnosticError(Diagnostic("error", message, loc))


class SourceManager:
    """Remembers source texts by file name so diagnostics can quote the offending line."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, text: str) -> None:
        self._lines[name] = text.splitlines()

    def render(self, diag: Diagnostic) -> str:
        out = [self._render_one(diag)]
        out.extend(self._render_one(note) for note in diag.notes)
        return "\n".join(out)

    def _render_one(self, diag: Diagnostic) -> str:
        loc = diag.location
        if loc is None:
            return f"{diag.severity}: {diag.message}"
        head = f"{loc}: {diag.severity}: {diag.message}"
        lines = self._lines.get(loc.file)
        if lines is None or not 1 <= loc.line <= len(lines):
            return head
        source = lines[loc.line - 1]
        return f"{head}\n{source}\n{' ' * (loc.col - 1)}^"
