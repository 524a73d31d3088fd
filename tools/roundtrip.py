"""`python -m tlc.tools.roundtrip FILE...`: print(parse(x)) must re-parse to the same module.

Used by the lit suite on every test file: for each `// -----` chunk that parses (a `.mlir` file as
MLIR generic form), the .tlir text printed from it is parsed again and must print identically, in
.tlir and in MLIR generic form.
"""

from __future__ import annotations

import sys

from tlc.core.diagnostics import DiagnosticError
from tlc.dialect.printer import print_mlir_op, print_tlir
from tlc.frontends.text import parse_source
from tlc.tools.opt import split_chunks


def roundtrip_file(path: str) -> list[str]:
    """Problems found in `path` (empty when every parseable chunk round-trips)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []
    for chunk in split_chunks(text, split=True):
        try:
            module = parse_source(chunk.text, path, chunk.line_offset)
        except DiagnosticError:
            continue  # chunks that test parse errors have nothing to round-trip
        printed = print_tlir(module)
        where = f"{path}:{chunk.line_offset + 1}"
        try:
            again = parse_source(printed, path, mlir=False)
        except DiagnosticError as exc:
            problems.append(f"{where}: printed chunk does not parse: {exc}")
            continue
        if print_tlir(again) != printed or print_mlir_op(again) != print_mlir_op(module):
            problems.append(f"{where}: chunk does not round-trip")
    return problems


def main() -> int:
    problems = [p for path in sys.argv[1:] for p in roundtrip_file(path)]
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
