"""Reading documents: .tlir through the Lark front end, .mlir (generic form) through xDSL."""

from __future__ import annotations

from functools import cache

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError

from tlc.diagnostics import DiagnosticError, Location, error
from tlc.dialect.ops import TL
from tlc.dialect.parser import parse_tlir


@cache
def context() -> Context:
    """An xDSL context with the builtin and `tl` dialects loaded."""
    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(TL)
    return ctx


def parse_source(
    text: str, filename: str = "<stdin>", line_offset: int = 0, mlir: bool | None = None
) -> ModuleOp:
    """Parse a document; the MLIR generic form when `mlir` (default: by the .mlir suffix)."""
    if mlir is None:
        mlir = filename.endswith(".mlir")
    if not mlir:
        return parse_tlir(text, filename, line_offset)
    try:
        module = Parser(context(), "\n" * line_offset + text, filename).parse_module()
    except ParseError as exc:
        before = str(exc.span.input.content[: exc.span.start])
        line = before.count("\n") + 1
        col = exc.span.start - (before.rfind("\n") + 1) + 1
        raise error(exc.msg, Location(filename, line, col)) from None
    return module


def parse_file(path: str) -> ModuleOp:
    with open(path, encoding="utf-8") as f:
        return parse_source(f.read(), path)


__all__ = ["DiagnosticError", "context", "parse_file", "parse_source"]
