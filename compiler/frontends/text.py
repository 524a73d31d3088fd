"""Reading documents: .tlir through the Lark front end, .mlir (generic form) through xDSL."""

from __future__ import annotations

import re
from functools import cache

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from tlc.core.diagnostics import DiagnosticError, Location, error
from tlc.dialect.parser import parse_tlir
from tlc.dialect.program_ops import TL_PROGRAM, ProgramOp
from tlc.dialect.registry import TL
from tlc.dialect.verify import check_metadata, check_operands, run_on_graphs


@cache
def context() -> Context:
    """An xDSL context with the builtin and `tl` dialects loaded."""
    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(TL)
    ctx.load_dialect(TL_PROGRAM)
    return ctx


def parse_source(
    text: str, filename: str = "<stdin>", line_offset: int = 0, mlir: bool | None = None
) -> ModuleOp:
    """Parse a document; the MLIR generic form when `mlir` (default: by the .mlir suffix).

    Each program (`tl.program`) is checked by lowering it, so a program that is read also
    lowers: shape and parameter errors are located diagnostics at their call."""
    if mlir is None:
        mlir = filename.endswith(".mlir")
    module = (
        _parse_mlir(text, filename, line_offset)
        if mlir
        else parse_tlir(text, filename, line_offset)
    )
    for op in module.ops:
        if isinstance(op, ProgramOp):
            from tlc.semantics.program_run import check_program  # start-up: only with programs

            check_program(op)
    return module


def _parse_mlir(text: str, filename: str, line_offset: int) -> ModuleOp:
    """The MLIR generic form through xDSL's parser, each op verified and the graphs' metadata
    checked."""
    source = "\n" * line_offset + text
    _check_string_literals(source, filename)
    _check_integer_types(source, filename)
    try:  # the parser lexes its first token when it is made
        parser = _LocatingParser(context(), source, filename)
        module = parser.parse_module()
    except ParseError as exc:
        raise error(exc.msg, _location(source, exc.span.start, filename)) from None
    except VerifyException as exc:  # an attribute built while parsing, e.g. `7 : i2`
        where = _location(source, parser.pos, filename)
        raise error(str(exc), where) from None
    for op in module.walk():
        try:
            op.verify_()
        except VerifyException as exc:
            raise error(str(exc), op) from None
    run_on_graphs(module, check_metadata)
    run_on_graphs(module, check_operands)
    return module


def _check_string_literals(source: str, filename: str) -> None:
    """Reject a string literal left open at the end of its line (or at a vertical tab or form
    feed, which xDSL's strings cannot hold either) before xDSL sees it: MLIR's strings never
    span lines, and xDSL 0.75's parser can loop forever on an unterminated one
    (e.g. `%0 = "tl.input{id = 0} : () -> !tl.tensor<[4]>` at the end of a file)."""
    start: int | None = None
    i = 0
    while i < len(source):
        c = source[i]
        if start is None and source.startswith("//", i):
            end = source.find("\n", i)
            i = len(source) if end < 0 else end
            continue
        if c == '"':
            start = i if start is None else None
        elif c == "\\" and start is not None:
            i += 1
        elif c in "\n\v\f" and start is not None:  # xDSL's strings hold none of them
            break
        i += 1
    if start is not None:
        raise error("unterminated string literal", _location(source, start, filename))


#: The widest integer type read: tlc's attributes are i64, and xDSL builds a width's range
#: eagerly (`i99999999999` exhausted memory, `i2147483647` took seconds and a gigabyte).
MAX_INT_WIDTH = 64
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_LONG_INT = re.compile(r"[0-9]{4001,}")
_INT_TYPE = re.compile(r"(?<![\w.$#%@!^-])[su]?i([0-9]+)\b")


def _check_integer_types(source: str, filename: str) -> None:
    """Reject an integer type wider than MAX_INT_WIDTH, and an integer literal too long to
    convert (outside string literals), before xDSL parses them."""
    blanked = _STRING.sub(lambda m: " " * len(m.group()), source)
    for match in _LONG_INT.finditer(blanked):  # Python's int() refuses over 4,300 digits
        raise error(
            f"integer literal of {len(match.group())} digits is too long",
            _location(source, match.start(), filename),
        )
    for match in _INT_TYPE.finditer(blanked):
        digits = match.group(1)
        if len(digits) > 3 or int(digits) > MAX_INT_WIDTH:
            raise error(
                f"integer type '{match.group()}' is wider than {MAX_INT_WIDTH} bits",
                _location(source, match.start(), filename),
            )


def _location(source: str, offset: int, filename: str) -> Location:
    before = source[:offset]
    return Location(filename, before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1)


class _LocatingParser(Parser):
    """xDSL's parser, giving each op without a `loc(...)` its position in the file (as mlir-opt
    does), so diagnostics on a .mlir input point at the op."""

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):
            source = self.lexer.input
            op.location = _location(source.content, start, source.name).to_attr()
        return op


def decode_source(data: bytes, name: str) -> str:
    """The text of a document read as bytes; bytes that are not UTF-8 are an error located at
    the first bad one."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        where = Location(name, line, col)
        raise error(f"invalid UTF-8 (byte 0x{data[exc.start]:02x})", where) from None


def read_document(path: str) -> str:
    """The text of the document at `path`; an unreadable file is a diagnostic naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DiagnosticError.simple(f"cannot read '{path}': {exc.strerror}") from None
    return decode_source(data, path)


def parse_file(path: str) -> ModuleOp:
    return parse_source(read_document(path), path)


__all__ = ["DiagnosticError", "context", "parse_file", "parse_source", "read_document"]
