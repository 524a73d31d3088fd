"""Filling a table of rules keyed by op class, one rule per class.

Every interpretation of tl (intervals, derivatives, ONNX export, torch kernels, payload checks,
...) is a dict from op class to rule, filled by a decorator placed next to each rule. This is
that decorator, written once, so a second rule for the same class is caught the same way in
every table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tlc.dialect.ops import NodeOp

R = TypeVar("R")


def registrar(table: dict[type[NodeOp], R], what: str) -> Callable[..., Callable[[R], R]]:
    """The decorator factory filling `table`: after `register = registrar(TABLE, "export")`,
    `@register(OpA, OpB)` makes the decorated rule the entry of OpA and OpB and returns it
    unchanged. A second rule for a class is a bug in tlc, hence an assertion."""

    def register(*op_classes: type[NodeOp]) -> Callable[[R], R]:
        def add(rule: R) -> R:
            for cls in op_classes:
                assert cls not in table, f"two {what} rules for {cls.__name__}"
                table[cls] = rule
            return rule

        return add

    return register
