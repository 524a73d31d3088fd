"""Building xDSL attributes whose parameters are already known to be valid.

xDSL verifies every attribute it builds (`ParametrizedAttribute.__post_init__` runs the IRDL
constraints of each parameter). For the two attributes every parsed node carries, its id
(`IntegerAttr` of type i64) and its location (`FileLineColLoc`), that verification was a third
of the time to read a large graph, and it can never fail there: the parser has checked that
the id fits i64 and lines and columns are positive. `trusted` builds such an attribute the way
`ParametrizedAttribute.new` does, minus the verification; only callers holding checked values
use it, and the result is an ordinary attribute (equal to, and hashing like, the verified one).
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import ParametrizedAttribute

A = TypeVar("A", bound=ParametrizedAttribute)


def trusted(cls: type[A], *params: Any) -> A:
    """`cls.new(params)` without verifying the parameters (see the module docstring)."""
    attr = cls.__new__(cls)
    for name, param in zip(_names(cls), params, strict=True):
        object.__setattr__(attr, name, param)
    return attr


@cache
def _names(cls: type[ParametrizedAttribute]) -> tuple[str, ...]:
    return tuple(name for name, _ in cls.get_irdl_definition().parameters)


def int_attr(value: int) -> IntAttr:
    """`IntAttr(value)` for an int (which is all its verification checks)."""
    attr = IntAttr.__new__(IntAttr)
    object.__setattr__(attr, "data", value)
    return attr


def id_attr(value: int) -> IntegerAttr:
    """A node id, 0 <= value < 2^63 (checked by the caller), as `value : i64`."""
    return trusted(IntegerAttr, int_attr(value), i64)


def file_loc(file: StringAttr, line: int, col: int) -> FileLineColLoc:
    """`loc("file":line:col)` for a positive line and column."""
    return trusted(FileLineColLoc, file, int_attr(line), int_attr(col))
