"""The .tlir front end: Lark (LALR) parses the text, a transformer builds the xDSL module.

Every op gets a `FileLineColLoc`. The parser accepts structurally wrong graphs (forward
references, ids out of order, wrong parent counts, wrong shapes) so that verify-structure and
infer-shapes can report them; it rejects only what cannot be represented: syntax errors,
undefined or redefined values, unknown op kinds and ill-typed metadata.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

import numpy as np

from tlc.dialect.grammar import build_parser  # first: it imports Lark (LARK_OPTIONAL hidden)

# isort: split
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError
from lark.lexer import PatternStr
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, ModuleOp, TensorType, f64
from xdsl.ir import Operation, SSAValue

from tlc.core.diagnostics import DiagnosticError, Location, did_you_mean, error
from tlc.dialect.metadata import MAX_INT, MetadataError, check_value
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp, PayloadOp, RecordOp
from tlc.dialect.plan import Policy, check_policy_field, set_kernel, set_policy
from tlc.dialect.program_parser import ProgramRules
from tlc.dialect.registry import OPS_BY_TAG
from tlc.dialect.shapes import BATCH

#: Longest integer literal read: Python's int() refuses more than 4,300 digits.
MAX_LITERAL_DIGITS = 4000


@cache
def _lark() -> Lark:
    return build_parser()


def parse_tlir(text: str, filename: str = "<stdin>", line_offset: int = 0) -> ModuleOp:
    """Parse a .tlir document into a module of `tl.graph` and `tl.payload` ops.

    `line_offset` shifts every location (used for `--split-input-file` chunks so diagnostics
    carry the physical line numbers of the whole file).
    """
    with _collector_paused():
        try:
            tree = _lark().parse(text)
        except UnexpectedInput as exc:
            raise _syntax_error(exc, text, filename, line_offset) from None
        try:
            return _Builder(filename, line_offset).transform(tree)
        except VisitError as exc:
            if isinstance(exc.orig_exc, DiagnosticError):
                raise exc.orig_exc from None
            if not isinstance(exc.orig_exc, RecursionError):
                raise
        except RecursionError:
            pass
    raise error("the document nests too deeply", Location(filename, 1 + line_offset, 1))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a document is parsed.

    Parsing allocates a few objects per character (tokens, tree nodes, attributes, ops) and
    frees almost none of them, so the collector keeps triggering and rescans the growing heap:
    on bench/frontend.py's 10,000-node graph that was half of the parse time (1.9 s -> 1.0 s
    without it). Everything built here is either kept or freed by reference counting; cyclic
    garbage, if any, is collected as usual once the collector runs again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _syntax_error(exc: UnexpectedInput, text: str, filename: str, offset: int) -> DiagnosticError:
    """A friendly message for Lark's exception: what was found, what could have come instead.

    Terminal names never reach the user: literals show as themselves (`'}'`), the named regex
    terminals as a phrase (`a value like %0`).
    """
    line, col = max(exc.line, 1), max(exc.column, 1)
    if isinstance(exc, UnexpectedCharacters):
        found = f"character {text[exc.pos_in_stream]!r}"
    elif isinstance(exc, UnexpectedEOF) or exc.token.type == "$END":  # type: ignore[attr-defined]
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        found = "end of input"
    else:
        found = repr(_word_at(text, exc.token))  # type: ignore[attr-defined]
    message = f"unexpected {found}"
    expected = _acceptable(exc)
    shown = sorted({_describe_terminal(name) for name in expected})
    if shown:
        message += "; expected " + _join_or(shown)
    return error(message, Location(filename, line + offset, col))


def _acceptable(exc: UnexpectedInput) -> set[str]:
    """The terminals that could have come instead. LALR's merged states over-approximate the
    expected set (a `shape` state also expects `)` from a program's parameter list), so ask the
    parser which terminals it would really accept here."""
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        return set(interactive.accepts())
    return set(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())


def _word_at(text: str, token: Token) -> str:
    """The token, widened to the whole dotted word in the source (`tl.graf`, not `tl`)."""
    start = token.start_pos
    if start is None:
        return str(token)
    m = _WORD.match(text, start)
    return m.group(0) if m and len(m.group(0)) > len(str(token)) else str(token)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")

#: Phrases for the grammar's regex terminals (a test checks every terminal has a description).
_TERMINAL_PHRASES = {
    "VALUE": "a value like %0",
    "SYMBOL": "a symbol like @name",
    "NAME": "a name",
    "BATCH_EXTENT": "N (the batch size)",
    "INT": "a non-negative integer",
    "NUMBER": "a number",
    "STRING": "a string",
    "NAMED": "a named value like %x",
    "$END": "end of input",
}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_PHRASES:
        return _TERMINAL_PHRASES[name]
    pattern = next(t.pattern for t in _lark().terminals if t.name == name)
    if isinstance(pattern, PatternStr):
        return repr(pattern.value)
    return f"text matching /{pattern.value}/"


def _join_or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


class _Builder(ProgramRules, Transformer[Token, ModuleOp]):
    """Builds ops bottom-up; a graph resolves its operands once all its nodes exist."""

    def __init__(self, filename: str, line_offset: int):
        super().__init__()
        self.filename = filename
        self.offset = line_offset

    def _loc(self, meta: Any) -> Location:
        return Location(self.filename, meta.line + self.offset, meta.column)

    def _tok_loc(self, tok: Token) -> Location:
        return Location(self.filename, (tok.line or 1) + self.offset, tok.column or 1)

    # -- values ----------------------------------------------------------------------------

    def number(self, items: list[Token]) -> int | float:
        text = str(items[0])
        if any(c in text for c in ".eEin"):
            return float(text)
        if len(text) > MAX_LITERAL_DIGITS:  # Python refuses to convert it (and it is no i64)
            raise error(
                f"integer literal of {len(text)} digits is too long", self._tok_loc(items[0])
            )
        return int(text)

    def string(self, items: list[Token]) -> str:
        try:
            return bytes(str(items[0])[1:-1], "utf-8").decode("unicode_escape")
        except UnicodeDecodeError as exc:
            raise error(
                f"invalid escape in string: {exc.reason}", self._tok_loc(items[0])
            ) from None

    def _index(self, tok: Token, digits: str) -> int:
        """A node id or shape extent: a non-negative integer that fits MLIR's i64."""
        value = int(digits) if len(digits) <= MAX_LITERAL_DIGITS else MAX_INT + 1
        if value > MAX_INT:
            shown = digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"
            raise error(f"integer {shown} is too large (at most {MAX_INT})", self._tok_loc(tok))
        return value

    def batch_extent(self, _items: list[Any]) -> int:
        return BATCH

    def true(self, _items: list[Any]) -> bool:
        return True

    def false(self, _items: list[Any]) -> bool:
        return False

    def list(self, items: list[Any]) -> list[Any]:
        return [] if items == [None] else items

    def shape(self, items: list[Token | None]) -> tuple[int, ...]:
        return tuple(self._extent(t) for t in items if t is not None)

    def _extent(self, tok: Token) -> int:
        return self._index(tok, str(tok)) if tok.type == "INT" else BATCH

    def shape_decl(self, items: list[tuple[int, ...]]) -> tuple[int, ...]:
        return items[0]

    @v_args(meta=True)
    def entry(self, meta: Any, items: list[Any]) -> tuple[str, Any, Location]:
        return (str(items[0]), items[1], self._loc(meta))

    def attrdict(self, items: list[Any]) -> list[tuple[str, Any, Location]]:
        return [] if items == [None] else items

    def operands(self, items: list[Token | None]) -> list[Token]:
        return [t for t in items if t is not None]

    # -- graphs ----------------------------------------------------------------------------

    @v_args(meta=True)
    def node(self, meta: Any, items: list[Any]) -> tuple[NodeOp, list[Token]]:
        value, kind, operands, attrs, shape, kernel = items
        op_class = OPS_BY_TAG.get(str(kind))
        if op_class is None:
            hint = did_you_mean(str(kind), OPS_BY_TAG)
            raise error(f"unknown op kind '{kind}'{hint}", self._tok_loc(kind))
        fields = self._fields(op_class, attrs or [], shape, self._tok_loc(kind))
        op = op_class(self._index(value, str(value)[1:]), [], shape, fields)
        op.location = self._loc(meta).to_attr()
        set_kernel(op, kernel)
        return op, operands or []

    def kernel(self, items: list[Token]) -> str:
        return self.string(items)

    def kernel_policy(self, items: list[Any]) -> Policy:
        """`kernel_policy {device = "cpu", ...}`, checked for unknown fields and their types."""
        policy: Policy = {}
        for name, value, loc in items[0] or []:
            problem = check_policy_field(name, value)
            if name in policy:
                problem = f"kernel policy field '{name}' given twice"
            if problem is not None:
                raise error(problem, loc)
            policy[name] = value
        return policy

    def _fields(
        self,
        op_class: type[NodeOp],
        attrs: list[tuple[str, Any, Location]],
        declared: tuple[int, ...] | None,
        where: Location,
    ) -> dict[str, Any]:
        known = {f.name: f for f in op_class.FIELDS}
        given: dict[str, Any] = {}
        for name, value, loc in attrs:
            if name not in known:
                hint = did_you_mean(name, known) or _fields_hint(known)
                raise error(f"unknown metadata field '{name}' for op '{op_class.TAG}'{hint}", loc)
            if name in given:
                raise error(f"metadata field '{name}' given twice", loc)
            try:
                given[name] = check_value(known[name], value)
            except MetadataError as exc:
                raise error(f"{op_class.TAG}: {exc}", loc) from None
        fields: dict[str, Any] = {}
        for f in op_class.FIELDS:
            if f.name in given:
                fields[f.name] = given[f.name]
            elif f.default_value(fields, declared) is not None:
                fields[f.name] = f.default_value(fields, declared)
            else:
                raise error(f"op '{op_class.TAG}' requires metadata field '{f.name}'", where)
        return fields

    @v_args(meta=True)
    def output(self, meta: Any, items: list[Token]) -> tuple[OutputOp, Token]:
        # The operand is bound when the graph resolves names; a placeholder keeps the op valid.
        return self._located(OutputOp.__new__(OutputOp), meta), items[0]

    def _located(self, op: Operation, meta: Any) -> Operation:
        op.location = self._loc(meta).to_attr()
        return op

    @v_args(meta=True)
    def graph(self, meta: Any, items: list[Any]) -> GraphOp:
        symbol, policy, *nodes, (output_stub, output_ref) = items
        defined: dict[str, NodeOp] = {}
        for op, _ in nodes:
            name = f"%{op.id}"
            if name in defined:
                raise error(f"redefinition of value {name}", op)
            defined[name] = op

        def lookup(tok: Token) -> SSAValue:
            target = defined.get(str(tok))
            if target is None:
                raise error(f"use of undefined value {tok}", self._tok_loc(tok))
            return target.result

        for op, refs in nodes:
            op.operands = [lookup(t) for t in refs]
        output = OutputOp(lookup(output_ref))
        output.location = output_stub.location
        graph = GraphOp(str(symbol)[1:], [op for op, _ in nodes] + [output])
        graph.location = self._loc(meta).to_attr()
        if policy is not None:
            set_policy(graph, policy)
        return graph

    # -- payloads --------------------------------------------------------------------------

    @v_args(meta=True)
    def record(self, meta: Any, items: list[Any]) -> RecordOp:
        value, kind, attrs = items
        fields = {}
        for name, raw, loc in attrs or []:
            if name in fields:
                raise error(f"payload field '{name}' given twice", loc)
            fields[name] = dense_attr(raw, name, loc)
        op = RecordOp(self._index(value, str(value)[1:]), str(kind), fields)
        op.location = self._loc(meta).to_attr()
        return op

    @v_args(meta=True)
    def payload(self, meta: Any, items: list[Any]) -> PayloadOp:
        symbol, *records = items
        op = PayloadOp(str(symbol)[1:], records)
        op.location = self._loc(meta).to_attr()
        return op

    def start(self, items: list[GraphOp | PayloadOp]) -> ModuleOp:
        seen: set[tuple[str, str]] = set()
        for op in items:
            key = (op.name, op.graph_name)
            if key in seen:
                raise error(f"redefinition of {op.name} @{op.graph_name}", op)
            seen.add(key)
        return ModuleOp(items)

    def __default__(self, data: str, children: list[Any], meta: Any) -> Tree[Any]:
        return Tree(data, children, meta)


def _fields_hint(known: Mapping[str, Any]) -> str:
    """What to say after an unknown metadata field with no close match: the op's fields (so
    `dim` on softmax, PyTorch's name, leads to `axis`)."""
    if not known:
        return " (it has no metadata fields)"
    return f" (its fields: {', '.join(known)})"


def _all_numbers(raw: Any) -> bool:
    if isinstance(raw, list):
        return all(_all_numbers(x) for x in raw)
    return isinstance(raw, int | float) and not isinstance(raw, bool)


def dense_attr(raw: Any, name: str, loc: Location | None) -> DenseIntOrFPElementsAttr:
    """A payload field (number or nested list) as a dense f64 tensor attribute."""
    try:
        if not _all_numbers(raw):
            raise ValueError
        array = np.asarray(raw, dtype=np.float64)
    except ValueError:
        raise error(f"payload field '{name}' is not a rectangular array of numbers", loc) from None
    return DenseIntOrFPElementsAttr.from_list(
        TensorType(f64, array.shape), array.reshape(-1).tolist()
    )
