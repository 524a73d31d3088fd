"""Op-local metadata: the typed fields an op kind carries (axis, permutation, window geometry...).

Each op declares its fields once as `Field` records; the .tlir parser, the .tlir printer, the
listing printer and the shape rules all read metadata through this table, and values are stored
on the xDSL op as ordinary MLIR attributes (`i64` integers, `f64` floats, `array<i64: ...>`,
`array<i1: ...>`, strings), so the generic MLIR form carries them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from xdsl.dialects.builtin import (
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute

from tlc.dialect.shapes import BATCH


class Kind(Enum):
    """How a field's value is written in .tlir and stored as an attribute."""

    INT = "an integer"
    FLOAT = "a number"
    INTS = "a list of integers"
    BOOLS = "a list of booleans"
    STR = "a string"


@dataclass(frozen=True)
class Field:
    """One metadata field of an op kind.

    `default` is the value when the text omits the field: a constant (`0.01`), or a function
    computing it from the fields already read and the declared output shape (a conv's `dilation`
    defaults to ones); None means required. `choices` restricts a string field (an enum).
    """

    name: str
    kind: Kind
    default: Any = None
    choices: tuple[str, ...] = ()

    def default_value(self, fields: dict[str, Any], declared: tuple[int, ...] | None) -> Any:
        """The value an omitted field takes (None: the field is required)."""
        if callable(self.default):
            return self.default(fields, declared)
        return self.default


#: The largest integer a field, id or extent may hold: they are stored as MLIR `i64`.
MAX_INT = 2**63 - 1


def _is_index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT


#: The fields that hold a shape (a parent's or the result's extents), which may say `N`, the
#: batch extent (`BATCH`, tlc.dialect.batch), as a declared shape may.
EXTENT_FIELDS = frozenset({"from", "to", "shape", "mask_shape"})


class MetadataError(Exception):
    """A metadata value has the wrong kind; raised by `check_value`."""


def check_value(field: Field, value: Any) -> Any:
    """Validate a parsed Python value against the field's kind; return it normalised."""
    if field.kind is Kind.INT:
        if not _is_index(value):
            raise MetadataError(f"'{field.name}' must be a non-negative integer (at most 2^63-1)")
        return value
    if field.kind is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MetadataError(f"'{field.name}' must be a number")
        return float(value)
    if field.kind is Kind.INTS:
        extents = field.name in EXTENT_FIELDS
        if not isinstance(value, list) or not all(
            _is_index(v) or (extents and v == BATCH and not isinstance(v, bool)) for v in value
        ):
            raise MetadataError(
                f"'{field.name}' must be a list of non-negative integers (at most 2^63-1)"
            )
        return tuple(value)
    if field.kind is Kind.BOOLS:
        if not isinstance(value, list) or not all(isinstance(v, bool) for v in value):
            raise MetadataError(f"'{field.name}' must be a list of booleans")
        return tuple(value)
    if not isinstance(value, str):
        raise MetadataError(f"'{field.name}' must be a string")
    if field.choices and value not in field.choices:
        raise MetadataError(f"'{field.name}' must be one of {', '.join(field.choices)}")
    return value


def to_attr(field: Field, value: Any) -> Attribute:
    """The attribute storing `value`; equal values share one attribute object.

    xDSL attributes are immutable, so sharing is safe, and building one (with its verification)
    is what costs: a large graph repeats a handful of values (`axis = 1`) thousands of times.
    """
    if field.kind in (Kind.INTS, Kind.BOOLS):
        value = tuple(value)
    return _attr(field.kind, value)


@lru_cache(maxsize=4096, typed=True)
def _attr(kind: Kind, value: Any) -> Attribute:
    if kind is Kind.INT:
        return IntegerAttr(value, i64)
    if kind is Kind.FLOAT:
        return FloatAttr(value, f64)
    if kind is Kind.INTS:
        return DenseArrayBase.from_list(i64, list(value))
    if kind is Kind.BOOLS:
        return DenseArrayBase.from_list(i1, [int(v) for v in value])
    return StringAttr(value)


def from_attr(field: Field, attr: Attribute) -> Any:
    """Read a stored attribute back; raises MetadataError if it is not of the field's kind."""
    if field.kind is Kind.INT and isinstance(attr, IntegerAttr):
        return attr.value.data
    if field.kind is Kind.FLOAT and isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if field.kind in (Kind.INTS, Kind.BOOLS) and isinstance(attr, DenseArrayBase):
        width = attr.elt_type.width.data if isinstance(attr.elt_type, IntegerType) else 0
        values = tuple(attr.get_values())
        if field.kind is Kind.BOOLS and width == 1:
            return tuple(bool(v) for v in values)
        if field.kind is Kind.INTS and width == 64:
            return values
    if field.kind is Kind.STR and isinstance(attr, StringAttr):
        return attr.data
    raise MetadataError(f"attribute '{field.name}' must be {field.kind.value}")


def fmt_value(field: Field, value: Any) -> str:
    """The .tlir text of a value (also used inside describe strings)."""
    if field.kind is Kind.INT:
        return str(value)
    if field.kind is Kind.FLOAT:
        return fmt_float(value)
    if field.kind is Kind.INTS:
        return "[" + ", ".join("N" if v == BATCH else str(v) for v in value) + "]"
    if field.kind is Kind.BOOLS:
        return "[" + ", ".join("true" if v else "false" for v in value) + "]"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fmt_float(value: float) -> str:
    """The shortest text that reads back as the same double, always with a point or exponent so
    it is not taken for an integer (`0.01`, `1.0`, `1e-05`, `inf`, `nan`)."""
    text = repr(float(value))
    return text if any(c in text for c in ".ein") else text + ".0"
