"""Parser rules for the program form (`tl.program`, `tl.params`), mixed into the .tlir builder.

Names are resolved in order, so a use before the `let` that defines it, an unknown name and a
redefinition are reported where they are written. A nested call becomes an unnamed `tl.call`
placed just before its user (post-order), which is what the printer inlines again. What is
checked here is the program's form (`ProgramOp.verify_`); its shapes and parameter uses are
checked by the document's reader, which lowers it (`tlc.frontends.text.parse_source`), so a
program that is read also lowers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tlc.dialect.grammar  # noqa: F401  # first: it imports Lark (LARK_OPTIONAL hidden)

# isort: split
from lark import Token, v_args
from xdsl.ir import Operation, SSAValue

from tlc.core.diagnostics import Location, error
from tlc.dialect.program_ops import (
    BindOp,
    CallOp,
    FieldValue,
    ParamsOp,
    ProgramOp,
    ReturnOp,
    field_to_attr,
)
from tlc.dialect.shapes import Shape


@dataclass
class _Call:
    """A parsed call before name resolution."""

    callee: Token
    args: list[Any]  # Token (a name) or _Call
    attrs: list[tuple[str, Any, Location]]
    shape: Shape | None
    where: Location


@dataclass
class _Bind:
    """A parsed `%1 = linear {weight = %W1}` before its names are checked."""

    node: Token
    kind: Token
    fields: list[tuple[Token, Token]]
    where: Location


@dataclass
class _Let:
    name: Token
    call: _Call


class ProgramRules:
    """Transformer methods for the program rules of tlir.lark (see `_Builder` in parser.py)."""

    # The host transformer provides `_loc(meta)`, `_tok_loc(token)` and `_index(token, digits)`.
    _loc: Any
    _tok_loc: Any
    _index: Any

    def arg_decl(self, items: list[Any]) -> tuple[Token, Shape]:
        return items[0], items[1]

    def program_params(self, items: list[Any]) -> list[tuple[Token, Shape]]:
        return [] if items == [None] else items

    @v_args(meta=True)
    def call(self, meta: Any, items: list[Any]) -> _Call:
        callee, *args, attrs, shape = items
        args = [] if args == [None] else args
        return _Call(callee, args, attrs or [], shape, self._loc(meta))

    def let(self, items: list[Any]) -> _Let:
        return _Let(items[0], items[1])

    def return_(self, items: list[Token]) -> Token:
        return items[0]

    @v_args(meta=True)
    def program(self, meta: Any, items: list[Any]) -> ProgramOp:
        symbol, arg, params, *lets, ret = items
        decls = [arg, *(params or [])]
        later = {str(let.name): let for let in lets}
        scope: dict[str, SSAValue] = {}
        ops: list[Operation] = []

        def define(tok: Token, value: SSAValue) -> None:
            if str(tok) in scope:
                raise error(f"redefinition of value {tok}", self._tok_loc(tok))
            scope[str(tok)] = value

        def lookup(tok: Token) -> SSAValue:
            name = str(tok)
            if name in scope:
                return scope[name]
            if name in later:
                raise error(f"use of value {name} before its definition", self._tok_loc(tok))
            raise error(f"use of undefined value {name}", self._tok_loc(tok))

        def build(call: _Call, binding: str | None) -> SSAValue:
            args = [build(a, None) if isinstance(a, _Call) else lookup(a) for a in call.args]
            op = CallOp(str(call.callee), args, self._call_fields(call), binding, call.shape)
            op.location = call.where.to_attr()
            ops.append(op)
            return op.result

        program = ProgramOp(str(symbol)[1:], [(str(t)[1:], s) for t, s in decls], [])
        block = program.body.block
        for (tok, _), arg in zip(decls, block.args, strict=True):
            define(tok, arg)
        for let in lets:
            define(let.name, build(let.call, str(let.name)[1:]))
        ret_op = ReturnOp(lookup(ret))
        ret_op.location = self._tok_loc(ret).to_attr()
        block.add_ops([*ops, ret_op])
        program.location = self._loc(meta).to_attr()
        program.verify_()
        return program

    def _call_fields(self, call: _Call) -> dict[str, FieldValue]:
        fields: dict[str, FieldValue] = {}
        for name, value, loc in call.attrs:
            if name in fields:
                raise error(f"field '{name}' given twice", loc)
            try:
                field_to_attr(value)
            except ValueError as exc:
                raise error(f"{call.callee}: field '{name}' {exc}", loc) from None
            fields[name] = value
        return fields

    # -- tl.params -------------------------------------------------------------------------

    def bind_field(self, items: list[Token]) -> tuple[Token, Token]:
        return items[0], items[1]

    @v_args(meta=True)
    def bind(self, meta: Any, items: list[Any]) -> _Bind:
        value, kind, *fields = items
        return _Bind(value, kind, [] if fields == [None] else fields, self._loc(meta))

    @v_args(meta=True)
    def params(self, meta: Any, items: list[Any]) -> ParamsOp:
        symbol, *rest = items
        declared: dict[str, Shape] = {}
        binds: list[BindOp] = []
        for item in rest:
            if isinstance(item, tuple):
                tok, shape = item
                if str(tok)[1:] in declared:
                    raise error(f"redefinition of parameter {tok}", self._tok_loc(tok))
                declared[str(tok)[1:]] = shape
            elif isinstance(item, _Bind):
                binds.append(self._bind_op(item, declared))
        op = ParamsOp(str(symbol)[1:], list(declared.items()), binds)
        op.location = self._loc(meta).to_attr()
        return op

    def _bind_op(self, bind: _Bind, declared: dict[str, Shape]) -> BindOp:
        names: dict[str, str] = {}
        for field, param in bind.fields:
            if str(field) in names:
                raise error(f"field '{field}' given twice", self._tok_loc(field))
            if str(param)[1:] not in declared:
                raise error(f"use of undeclared parameter {param}", self._tok_loc(param))
            names[str(field)] = str(param)[1:]
        op = BindOp(self._index(bind.node, str(bind.node)[1:]), str(bind.kind), names)
        op.location = bind.where.to_attr()
        return op
