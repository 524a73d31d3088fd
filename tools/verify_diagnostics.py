"""`--verify-diagnostics`: MLIR's expected-diagnostic annotations.

`// expected-error {{msg}}` expects an error on its own line; `@+N`/`@-N` shift the line,
`@above`/`@below` name the previous/next line. `expected-note`, `expected-warning` and
`expected-remark` work alike. A diagnostic matches when severity and line agree and `msg` is a
substring of its message. The run passes iff every expectation matched and nothing else was
emitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tlc.core.diagnostics import Diagnostic, Location

_ANNOTATION = re.compile(
    r"expected-(error|warning|note|remark)\s*(?:@(\+\d+|-\d+|above|below))?\s*\{\{(.*?)\}\}"
)


@dataclass
class Expectation:
    severity: str
    line: int
    message: str
    where: Location
    matched: bool = False


def parse_expectations(text: str, line_offset: int, filename: str) -> list[Expectation]:
    found = []
    for index, line in enumerate(text.splitlines()):
        physical = index + 1 + line_offset
        for m in _ANNOTATION.finditer(line):
            severity, shift, message = m.groups()
            target = physical
            if shift == "above":
                target -= 1
            elif shift == "below":
                target += 1
            elif shift:
                target += int(shift)
            found.append(
                Expectation(severity, target, message, Location(filename, physical, m.start() + 1))
            )
    return found


def check_expectations(
    text: str, line_offset: int, filename: str, emitted: list[Diagnostic]
) -> list[Diagnostic]:
    """The failures (unexpected diagnostics, unmet expectations) as diagnostics to print."""
    expectations = parse_expectations(text, line_offset, filename)
    failures: list[Diagnostic] = []
    flat = [d for diag in emitted for d in (diag, *diag.notes)]
    for diag in flat:
        line = diag.location.line if diag.location is not None else None
        match = next(
            (
                e
                for e in expectations
                if not e.matched
                and e.severity == diag.severity
                and e.line == line
                and e.message in diag.message
            ),
            None,
        )
        if match is None:
            failures.append(
                Diagnostic("error", f"unexpected {diag.severity}: {diag.message}", diag.location)
            )
        else:
            match.matched = True
    failures.extend(
        Diagnostic("error", f'expected {e.severity} "{e.message}" was not produced', e.where)
        for e in expectations
        if not e.matched
    )
    return failures
