"""Building xDSL attributes whose parameters are already known to be valid.

xDSL verifies every attribute it builds (`ParametrizedAttribute.__post_init__` runs the IRDL
constraints of each parameter). For the two attributes every parsed node carries, its id
(`IntegerAttr` of type i64) and its location (`FileLineColLoc`), that verification was a third
of the time to read a large graph, and it can never fail there: the parser has checked that
the id fits i64 and lines and columns are positive. `trusted` builds such an attribute the way
`ParametrizedAttribute.new` does, minus the verification; only callers holding checked values
use it, and the result is an ordinary attribute (equal to, and hashing like, the verified one).

`init_single_result` does the same for the ops of a graph: it fills in an op the way xDSL's
`Operation.__init__` does for an op with one result and no properties, successors or regions,
without the generic bookkeeping (property setters over empty lists, IRDL's pass for attribute
defaults), which was a third of the time to read a large graph. tests/test_parser.py checks
that it leaves an op in the same state as xDSL's constructor. `block_of` is `Block(ops)`
without a containment check per op (each op is checked to be unattached, which is all that
check can find for a new op).
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from xdsl.dialects.builtin import (
    FileLineColLoc,
    IntAttr,
    IntegerAttr,
    LocationAttr,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, OpResult, ParametrizedAttribute, SSAValue
from xdsl.ir.core import SSAValues, Use

A = TypeVar("A", bound=ParametrizedAttribute)


def trusted(cls: type[A], *params: Any) -> A:
    """`cls.new(params)` without verifying the parameters (see the module docstring)."""
    attr = cls.__new__(cls)
    attr.__dict__.update(zip(_names(cls), params, strict=True))  # as object.__setattr__ would
    return attr


@cache
def _names(cls: type[ParametrizedAttribute]) -> tuple[str, ...]:
    return tuple(name for name, _ in cls.get_irdl_definition().parameters)


def int_attr(value: int) -> IntAttr:
    """`IntAttr(value)` for an int (which is all its verification checks); small values, such
    as columns, share one attribute apiece (attributes are immutable values)."""
    if 0 <= value < len(_SMALL):
        return _SMALL[value]
    return _int_attr(value)


def _int_attr(value: int) -> IntAttr:
    attr = IntAttr.__new__(IntAttr)
    attr.__dict__["data"] = value
    return attr


_SMALL = tuple(_int_attr(i) for i in range(1024))


def id_attr(value: int) -> IntegerAttr:
    """A node id, 0 <= value < 2^63 (checked by the caller), as `value : i64`."""
    return trusted(IntegerAttr, int_attr(value), i64)


def file_loc(file: StringAttr, line: int, col: int) -> FileLineColLoc:
    """`loc("file":line:col)` for a positive line and column."""
    return trusted(FileLineColLoc, file, int_attr(line), int_attr(col))


def init_single_result(
    op: Operation,
    operands: tuple[SSAValue, ...],
    result_type: Attribute,
    attributes: dict[str, Attribute],
    location: LocationAttr,
) -> None:
    """`Operation.__init__(op, operands=..., result_types=[result_type], attributes=...,
    location=...)` for an op whose class has no properties, successors, regions or attribute
    defaults (see the module docstring); `attributes` becomes the op's own dict."""
    values = SSAValues(operands)
    uses = tuple([Use(op, k) for k in range(len(values))])
    for value, use in zip(values, uses, strict=True):
        value.add_use(use)
    op._operands = values  # the storage behind xDSL's operand setter
    op._operand_uses = uses
    op.results = SSAValues((OpResult(result_type, op, 0),))
    op.properties = {}
    op.attributes = attributes
    op.location = location
    op._successors = ()
    op._successor_uses = ()
    op.regions = ()


def block_of(ops: list[Operation]) -> Block:
    """`Block(ops)` for ops attached to no block (see the module docstring)."""
    block = Block()
    prev: Operation | None = None
    for op in ops:
        if op.parent is not None:
            raise ValueError("Can't add to a block an operation already attached to a block.")
        op.parent = block
        op._prev_op, op._next_op = prev, None
        if prev is not None:
            prev._next_op = op
        prev = op
    if ops:
        block._first_op, block._last_op = ops[0], ops[-1]
    return block
