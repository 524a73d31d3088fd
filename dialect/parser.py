"""The .tlir front end: Lark (LALR) parses the text, a transformer builds the xDSL module.

Every op gets a `FileLineColLoc`. The parser accepts structurally wrong graphs (forward
references, ids out of order, wrong parent counts, wrong shapes) so that verify-structure and
infer-shapes can report them; it rejects only what cannot be represented: syntax errors,
undefined or redefined values, unknown op kinds and ill-typed metadata.
"""

from __future__ import annotations

import gc
import re
import warnings
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
from xdsl.dialects.builtin import (
    BytesAttr,
    DenseIntOrFPElementsAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    f64,
)
from xdsl.ir import Operation, SSAValue

from tlc.core.attrs import file_loc
from tlc.core.decimals import read_decimals
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
        module = _Scanner(text, filename, line_offset).module()
        if module is not None:
            return module
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
    """Pause Python's cyclic garbage collector while a document is parsed, and hand what was
    built to its oldest generation.

    Parsing allocates several objects per node and frees almost none of them, so the collector
    keeps triggering and rescans the growing heap: on bench/frontend.py's 10,000-node graph that
    was half of the parse time (1.9 s -> 1.0 s without it). Pausing alone only defers the work:
    everything allocated meanwhile sits in the youngest generation, and the first collection
    after the pause scans all of it (0.3 s for 100,000 nodes). `gc.freeze()` followed by
    `gc.unfreeze()` moves every tracked object to the oldest generation instead, which is
    where a survivor of two collections would end up anyway, and which is scanned only after
    the heap has grown by a quarter. Cyclic garbage, if any, is collected as usual by the next
    full collection. (Skipped if the application itself has frozen objects.)
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
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
    """Builds ops bottom-up; a graph resolves its operands once all its nodes exist.

    Nodes come in document order, so a node whose operands are all defined above it gets them
    when it is built (`values`, reset by each graph); only forward references, which
    verify-structure then reports, are bound by the graph."""

    def __init__(self, filename: str, line_offset: int):
        super().__init__()
        self.filename = filename
        self.offset = line_offset
        self.file_attr = StringAttr(filename)
        self.values: dict[str, SSAValue] = {}
        self.redefined = False  # some value of the graph being read is defined twice

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
    def node(self, meta: Any, items: list[Any]) -> tuple[NodeOp, list[Token] | None]:
        value, kind, operands, attrs, shape, kernel = items
        op_class = OPS_BY_TAG.get(kind)  # tokens are strings: no copy to look them up
        if op_class is None:
            hint = did_you_mean(str(kind), OPS_BY_TAG)
            raise error(f"unknown op kind '{kind}'{hint}", self._tok_loc(kind))
        fields = self._fields(op_class, attrs or [], shape, kind)
        location = file_loc(self.file_attr, meta.line + self.offset, meta.column)
        node_id = self._index(value, value[1:])
        refs: list[Token] | None = operands or []
        parents = [self.values.get(t) for t in refs]
        if None in parents:
            parents = []  # a forward reference: the graph binds the operands
        else:
            refs = None
        op = op_class(node_id, parents, shape, fields, location)
        (result,) = op.results
        name = f"%{node_id}"
        if name in self.values:
            self.redefined = True  # reported by the graph, once all its nodes are read
        else:
            self.values[name] = result
        if kernel is not None:
            set_kernel(op, kernel)
        return op, refs

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
        kind: Token,
    ) -> dict[str, Any]:
        if not op_class.FIELDS and not attrs:
            return {}
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
            value = given[f.name] if f.name in given else f.default_value(fields, declared)
            if value is None:
                where = self._tok_loc(kind)
                raise error(f"op '{op_class.TAG}' requires metadata field '{f.name}'", where)
            fields[f.name] = value
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
        if self.redefined:
            defined: set[str] = set()
            for op, _ in nodes:
                name = f"%{op.id}"
                if name in defined:
                    raise error(f"redefinition of value {name}", op)
                defined.add(name)
        values = self.values  # every node's value, by name
        self.values, self.redefined = {}, False

        def lookup(tok: Token) -> SSAValue:
            target = values.get(str(tok))
            if target is None:
                raise error(f"use of undefined value {tok}", self._tok_loc(tok))
            return target

        for op, refs in nodes:
            if refs is not None:  # not bound when the node was built
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
    """A payload field (number, nested list, or the float64 array the scanner read) as a dense
    f64 tensor attribute; its data are the array's bytes."""
    if isinstance(raw, np.ndarray) and raw.dtype == np.float64:
        array = raw
    else:
        try:
            if not _all_numbers(raw):
                raise ValueError
            array = np.asarray(raw, dtype=np.float64)
        except ValueError:
            raise error(
                f"payload field '{name}' is not a rectangular array of numbers", loc
            ) from None
        except OverflowError:  # an integer literal beyond float64's range
            raise error(f"payload field '{name}' has a number out of float64 range", loc) from None
    data = BytesAttr(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return DenseIntOrFPElementsAttr(TensorType(f64, array.shape), data)


# --------------------------------------------------------------------------------------------
# The scanner: the fast path for graphs and payloads
# --------------------------------------------------------------------------------------------
#
# Lark's LALR parser costs about 4 us per token and its tree another 5 us per node, which made a
# 100,000-node graph take 13 s to read and an inline payload ~900 bytes and 40 us per number. The
# scanner reads the common documents (graphs and payloads; no programs, parameter bindings or
# kernel policies) with one regular expression per node and numpy for dense number lists, and
# hands the pieces to the same `_Builder` methods the Lark tree goes through, so ops, metadata
# checks and defaults are built by one code path. It only ever accepts: whatever it does not
# recognise, and every error it meets (syntax or meaning), makes it give up, and the document is
# read again by Lark, which reports the located diagnostic. tests/test_parser.py checks that
# both paths build the same module from every lit test and example.

_WS = r"(?:[ \t\f\r\n]|//[^\n]*)*+"
_NAME_RE = r"[A-Za-z_][A-Za-z0-9_]*"
_STRING_RE = r'"(?:[^"\\]|\\.)*"'
_ITEM = re.compile(_WS + r"(tl\.graph|tl\.payload)" + _WS + "@(" + _NAME_RE + ")" + _WS + r"\{")
_NODE = re.compile(
    _WS + "(%([0-9]+))" + _WS + "=" + _WS + "(" + _NAME_RE + ")"
    + "(?:" + _WS + r"\(([^()]*)\))?"
    + "(?:" + _WS + r"\{((?:[^{}\"]|" + _STRING_RE + r")*+)\})?"
    + "(?:" + _WS + ":" + _WS + r"\[([^\[\]]*)\])?"
    + "(?:" + _WS + "kernel" + _WS + "(" + _STRING_RE + "))?"
)  # fmt: skip
_OUTPUT = re.compile(_WS + "(output)" + _WS + "%([0-9]+)" + _WS + r"\}")
_RECORD = re.compile(_WS + "(%([0-9]+))" + _WS + "=" + _WS + "(" + _NAME_RE + ")" + _WS + r"\{")
_END = re.compile(_WS + r"\}")
_EOF = re.compile(_WS + r"\Z")
# Operand lists and shapes as the node pattern captured them, read only without comments: a
# comment there may hide the `)` or `]` the pattern stopped at.
_BLANK = "[ \t\f\r\n]*"
_VALUES = re.compile(_BLANK + "(?:%[0-9]+" + _BLANK + "(?:," + _BLANK + "%[0-9]+" + _BLANK + ")*)?")
_VALUE_IDS = re.compile("%([0-9]+)")
_INTS = re.compile(_BLANK + "(?:[0-9]+" + _BLANK + "(?:," + _BLANK + "[0-9]+" + _BLANK + ")*)?")
_DIGITS = re.compile("[0-9]+")
_TOKEN = re.compile(
    _WS + r"(?:(?P<num>-?(?:inf|nan|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?))"
    + "|(?P<str>" + _STRING_RE + ")|(?P<name>" + _NAME_RE + r")|(?P<punct>[\[\],=}]))"
)  # fmt: skip
#: A dense number list: brackets, commas, blanks and number characters only.
_DENSE = re.compile(r"\[[-+0-9.eEinfa\[\], \t\r\n]*")
_BRACKETS = re.compile(r"[\[\]]")
_STRAY_PLUS = re.compile(r"(?<![eE])\+")
#: The characters of numbers, each as `0` (blanks are deleted with this table).
_NUMBER_MARKS = bytes.maketrans(b"0123456789.eEinfa+-", b"0" * 19)
#: The characters of numbers and blanks: what is left without them is a list's skeleton.
_NUMBER_CHARS_AND_BLANKS = b"0123456789.eEinfa+- \t\r\n"
_UNBRACKET = bytes.maketrans(b"[]", b"  ")
#: `-0` as an integer, which is 0 (numpy's float parser reads -0.0).
_INTEGER_MINUS_ZERO = re.compile(rb"(?<![eE])-0+(?![0-9.eE])")
#: A number out of its place in a list of numbers marked by `_NUMBER_MARKS`: right after a `]`
#: or before a `[` (`[[1, ]2, [3, 4]]` has the brackets and commas of a 2 x 2 list), or an
#: empty place (`[1, , 2]` and `[[1], []]`, which numpy reads as if -1 stood there). Each
#: pattern starts with a bracket or comma, which the search finds fast, rather than with the
#: number mark, which is almost everywhere.
_MISPLACED = tuple(
    re.compile(p) for p in (rb"\]0", rb"\[(?<=0\[)", rb"\[,", rb"\](?<=,\])", rb",,", rb"\[\]")
)
#: The deepest number list read by numpy (tensors have a handful of axes).
MAX_DENSE_RANK = 32
#: How many `]` `_closing_run` looks at one by one before searching for the closing run.
_CLOSING_LOOKS = 4096


class _Tok(str):
    """A token for the `_Builder` methods: the text, without a position (the builder reads one
    only to report an error, and on any error the document is read again by Lark)."""

    line = column = start_pos = None


class _GiveUp(Exception):
    """The scanner does not read this document; Lark will."""


class _Meta:
    """The position `_Builder` methods read from Lark's `meta`."""

    __slots__ = ("column", "line")

    def __init__(self, line: int, column: int):
        self.line, self.column = line, column


class _Scanner:
    def __init__(self, text: str, filename: str, line_offset: int):
        self.text = text
        self.builder = _Builder(filename, line_offset)
        self.line, self.line_start, self.counted = 1, 0, 0
        self.attr_cache: dict[str, list[tuple[str, Any, None]]] = {}
        self.shape_cache: dict[str, tuple[int, ...]] = {}

    def module(self) -> ModuleOp | None:
        try:
            return self._document()
        except (_GiveUp, DiagnosticError, RecursionError):
            return None

    def _meta(self, pos: int) -> _Meta:
        """Line and column of `pos` (positions only increase, so newlines are counted once)."""
        text = self.text
        self.line += text.count("\n", self.counted, pos)
        newline = text.rfind("\n", self.counted, pos)
        if newline >= 0:
            self.line_start = newline + 1
        self.counted = pos
        return _Meta(self.line, pos - self.line_start + 1)

    def _document(self) -> ModuleOp:
        text, pos, items = self.text, 0, []
        while _EOF.match(text, pos) is None:
            m = _ITEM.match(text, pos)
            if m is None:
                raise _GiveUp
            meta, symbol = self._meta(m.start(1)), _Tok("@" + m.group(2))
            if m.group(1) == "tl.graph":
                graph, pos = self._graph(m.end())
                items.append(self.builder.graph(meta, [symbol, None, *graph]))
            else:
                records, pos = self._records(m.end())
                items.append(self.builder.payload(meta, [symbol, *records]))
        return self.builder.start(items)

    def _graph(self, pos: int) -> tuple[list[Any], int]:
        text, builder, nodes = self.text, self.builder, []
        shapes, attrs = self.shape_cache, self.attr_cache
        node_re, node = _NODE.match, builder.node
        while (m := node_re(text, pos)) is not None:
            value, _, kind, operands, body, shape, kernel = m.groups()
            if operands is not None:
                if _VALUES.fullmatch(operands) is None:
                    raise _GiveUp
                operands = [_Tok("%" + d) for d in _VALUE_IDS.findall(operands)]
            if body is not None:
                if body not in attrs:
                    entries, end = self._attrs(body + "}", 0, dense=False)
                    if end != len(body) + 1:  # a `}` inside a comment ended the entries early
                        raise _GiveUp
                    attrs[body] = entries
                body = attrs[body]
            if shape is not None:
                if shape not in shapes:
                    shapes[shape] = self._shape(shape)
                shape = shapes[shape]
            if kernel is not None:
                kernel = builder.string([_Tok(kernel)])
            items = [_Tok(value), _Tok(kind), operands, body, shape, kernel]
            nodes.append(node(self._meta(m.start(1)), items))
            pos = m.end()
        m = _OUTPUT.match(text, pos)
        if m is None:
            raise _GiveUp
        output = builder.output(self._meta(m.start(1)), [None])
        return [*nodes, (output[0], _Tok("%" + m.group(2)))], m.end()

    def _shape(self, text: str) -> tuple[int, ...]:
        if _INTS.fullmatch(text) is None:
            raise _GiveUp
        digits = _DIGITS.findall(text)
        if any(len(d) > 18 and (len(d) > 19 or int(d) > MAX_INT) for d in digits):
            raise _GiveUp  # over i64: the builder's message, located by Lark
        return tuple(int(d) for d in digits)

    def _records(self, pos: int) -> tuple[list[RecordOp], int]:
        text, records = self.text, []
        while (m := _RECORD.match(text, pos)) is not None:
            attrs, pos = self._attrs(text, m.end(), dense=True)
            items = [_Tok(m.group(1)), _Tok(m.group(3)), attrs]
            records.append(self.builder.record(self._meta(m.start(1)), items))
        m = _END.match(text, pos)
        if m is None:
            raise _GiveUp
        return records, m.end()

    def _attrs(self, text: str, pos: int, dense: bool) -> tuple[list[Any], int]:
        """`name = value, ...}` from `pos` (just after the `{`): the entries and the position
        after the `}`. With `dense`, number lists are read by numpy into float64 arrays."""
        entries: list[Any] = []
        while True:
            m = _TOKEN.match(text, pos)
            if m is None:
                raise _GiveUp
            pos = m.end()
            if m.group("punct") == "}" and not entries:
                return entries, pos
            name = m.group("name")
            m = _TOKEN.match(text, pos)
            if name is None or m is None or m.group("punct") != "=":
                raise _GiveUp
            value, pos = self._value(text, m.end(), dense)
            entries.append((name, value, None))
            pos, closed = _comma_or(text, pos, "}")
            if closed:
                return entries, pos

    def _value(self, text: str, pos: int, dense: bool) -> tuple[Any, int]:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _GiveUp
        if m.group("punct") == "[":
            if dense:
                found = self._dense(text, m.start("punct"))
                if found is not None:
                    return found
            return self._list(text, m.end(), dense)
        if m.group("num") is not None:
            return self.builder.number([_Tok(m.group("num"))]), m.end()
        if m.group("str") is not None:
            return self.builder.string([_Tok(m.group("str"))]), m.end()
        if m.group("name") in ("true", "false"):
            return m.group("name") == "true", m.end()
        raise _GiveUp

    def _list(self, text: str, pos: int, dense: bool) -> tuple[list[Any], int]:
        items: list[Any] = []
        m = _TOKEN.match(text, pos)
        if m is not None and m.group("punct") == "]":
            return items, m.end()
        while True:
            value, pos = self._value(text, pos, dense)
            items.append(value)
            pos, closed = _comma_or(text, pos, "]")
            if closed:
                return items, pos

    def _dense(self, text: str, start: int) -> tuple[np.ndarray, int] | None:
        """A rectangular list of numbers at `start` as a float64 array read by numpy, and the
        position after it; None where it is not one (strings, booleans, ragged, odd numbers),
        which the token-by-token reader then takes."""
        end = _closing_run(text, start)
        found = None if end is None else _dense_values(text, start, end)
        if found is not None:
            return found
        # Not in the printer's layout (blanks between brackets, say): the list ends within the
        # run of characters a number list may hold.
        run = _DENSE.match(text, start)
        assert run is not None
        end = run.end()
        while text[end - 1] in ", \t\r\n":
            end -= 1
        if text.count("[", start, end) != text.count("]", start, end):  # past the list's end
            balanced = _balanced_end(text, start, run.end())
            if balanced is None:
                return None
            end = balanced
        return _dense_values(text, start, end)


def _closing_run(text: str, start: int) -> int | None:
    """Where the list at `start` ends if it is written as the printer writes it: at the first
    run of as many `]` as it opens with `[` (`_dense_values` checks the list it delimits)."""
    opening = text[start : start + MAX_DENSE_RANK + 1]
    depth = len(opening) - len(opening.lstrip("["))
    run = "]" * depth
    # str.find of a run of two or more is some 20x slower than of one `]` (memchr), and a
    # literal has one `]` per row: look at each `]` up to a bound, then search for the run.
    close = text.find("]", start)
    for _ in range(_CLOSING_LOOKS):
        if close < 0 or text.startswith(run, close):
            break
        close = text.find("]", close + 1)
    else:
        close = text.find(run, close)
    return None if close < 0 else close + depth


def _dense_values(text: str, start: int, end: int) -> tuple[np.ndarray, int] | None:
    """The list `text[start:end]` as a float64 array and `end`, or None (see `_Scanner._dense`).

    Its structure is checked on its bytes with each number marked `0`: the brackets and commas
    left must be those of a rectangular list, with a number in each place and none elsewhere
    (`_MISPLACED`; tlc.core.decimals checks the same as it reads the numbers in bulk)."""
    literal = text[start:end]
    try:
        raw = literal.encode("ascii")
    except UnicodeEncodeError:
        return None
    skeleton = raw.translate(None, _NUMBER_CHARS_AND_BLANKS).decode()
    if b"+" in raw and _STRAY_PLUS.search(literal):
        return None
    shape = _dense_shape(literal, skeleton)
    if shape is None or skeleton != _skeleton(shape):
        return None
    count = int(np.prod(shape))
    if count == 0:
        if len(skeleton) != len(raw.translate(None, b" \t\r\n")):  # a number in `[[], [5]]`
            return None
        values = np.zeros(0)
    else:
        values = read_decimals(raw, count)  # checks that each number is in its place
        if values is None:  # not in the form read in bulk (inf, nan): numpy's float parser
            marked = raw.translate(_NUMBER_MARKS, b" \t\r\n")
            if any(p.search(marked) for p in _MISPLACED) or _INTEGER_MINUS_ZERO.search(raw):
                return None
            if b"-nan" in raw:  # numpy's NaN has no sign, `float("-nan")` has
                return None
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    values = np.fromstring(raw.translate(_UNBRACKET), np.float64, sep=",")
                except (ValueError, DeprecationWarning):
                    return None
        if values.size != count:
            return None
        # A value that is not finite without an `inf` or `nan` literal was a number out of
        # float64's range: Lark's path reports an integer one as an error.
        infinite = count - int(np.count_nonzero(np.isfinite(values)))
        if infinite and infinite > raw.count(b"inf") + raw.count(b"nan"):
            return None
    return values.reshape(shape), end


def _comma_or(text: str, pos: int, closer: str) -> tuple[int, bool]:
    """After an item at `pos`: `,` or `closer` (which ends the list); the position after it."""
    m = _TOKEN.match(text, pos)
    if m is None or m.group("punct") not in (",", closer):
        raise _GiveUp
    return m.end(), m.group("punct") == closer


def _balanced_end(text: str, start: int, stop: int) -> int | None:
    """The position after the `]` closing the `[` at `start`, looking no further than `stop`."""
    depth = 0
    for b in _BRACKETS.finditer(text, start, stop):
        depth += 1 if b.group() == "[" else -1
        if depth == 0:
            return b.end()
    return None


def _dense_shape(literal: str, skeleton: str) -> tuple[int, ...] | None:
    """The shape a rectangular literal has, read off its first element at every depth
    (`_skeleton` then checks the whole literal against it)."""
    depth = len(skeleton) - len(skeleton.lstrip("["))
    if depth > MAX_DENSE_RANK:  # Lark's path says the document nests too deeply
        return None
    shape = []
    for level in range(1, depth):
        close = skeleton.find("]" * (depth - level + 1), level - 1)
        if close < 0:
            return None
        separator = "]" * (depth - level) + "," + "[" * (depth - level)
        shape.append(skeleton.count(separator, level - 1, close) + 1)
    first = literal.find("]")
    innermost = literal[literal.rfind("[", 0, first) + 1 : first]
    shape.append(innermost.count(",") + 1 if innermost.strip() else 0)
    return tuple(shape)


def _skeleton(shape: tuple[int, ...]) -> str:
    """The brackets and commas of a literal of `shape` (`[[,],[,]]` for [2, 2])."""
    if not shape:
        return ""
    inner = _skeleton(shape[1:])
    return "[" + ",".join([inner] * shape[0]) + "]"
