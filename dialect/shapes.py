"""Shapes are dtype-free tuples of extents; this module holds their text forms and helpers.

The formats are TorchLean's (`repr` of a Lean `Shape`/`List Nat`), because diagnostics quote them:
`[4]`, `[]`, `[2, 3, 4]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

Shape = tuple[int, ...]

#: The extent `N` of a shape: the batch size, chosen when the graph runs (see tlc.dialect.batch).
#: The .tlir form spells it `N`, the MLIR form `?` (MLIR's dynamic extent).
BATCH = -1


class ShapeError(Exception):
    """A shape rule rejected its inputs; the message is TorchLean's text for that failure."""


def fmt_shape(shape: Sequence[int] | None) -> str:
    """`[2, 3, 4]`, `[N, 784]` with the batch extent; an unknown (omitted) shape prints as `?`."""
    if shape is None:
        return "?"
    return "[" + ", ".join("N" if d == BATCH else str(d) for d in shape) + "]"


def fmt_ids(ids: Sequence[int]) -> str:
    """A Lean `Array Nat` as printed in node summaries: `#[1, 2]`."""
    return "#[" + ", ".join(str(i) for i in ids) + "]"


def numel(shape: Sequence[int]) -> int:
    return prod(shape)


def check_axis(axis: int, shape: Shape) -> None:
    if not 0 <= axis < len(shape):
        raise ShapeError(f"invalid axis {axis} for rank {len(shape)}")


def can_broadcast_to(src: Shape, dst: Shape) -> bool:
    """NumPy/PyTorch broadcasting of `src` to exactly `dst` (trailing alignment)."""
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst), strict=False))
