"""One interpretation's rules, keyed by op class: explicit, derived from op facts, or refused.

Every interpretation of tl (reference values, intervals, derivatives, lowering, kernels, importers,
exporters, payload checks) is a `RuleTable`. Its module fills it in three ways, in this order:
- `@TABLE.register(OpA, OpB)` beside a rule written for those ops;
- `TABLE.derive(op_classes, make)` for every other op whose facts (`UnaryOp.numpy`, a
  decomposition, an ONNX spelling, ...) give a rule: `make(op_class)` returns the rule or None;
- `TABLE.refuse(OpC, "because ...")` for an op the interpretation does not support, with the reason
  users and the exhaustiveness test see.
Afterwards the table reads as a mapping from op class to rule. A second rule for a class is a bug
in tlc, hence an assertion; so is an op left without a rule or a reason (tests/test_rule_tables.py
checks every table against every op kind).

This module imports nothing of tlc: op classes are plain keys here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

R = TypeVar("R")

#: Every table made, so one test can check them all (`RuleTable.what` names each).
TABLES: list[RuleTable[Any]] = []


class RuleTable(Mapping[type, R], Generic[R]):
    """Rules of the interpretation `what`, keyed by op class."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._rules: dict[type, R] = {}
        #: Op classes whose rule was derived from their facts (the rest are explicit).
        self.derived: set[type] = set()
        #: Op classes this interpretation does not support, with the reason.
        self.unsupported: dict[type, str] = {}
        TABLES.append(self)

    # -- filling ---------------------------------------------------------------------------

    def register(self, *op_classes: type) -> Callable[[R], R]:
        """Decorator: the decorated rule is the entry of each of `op_classes`."""

        def add(rule: R) -> R:
            for cls in op_classes:
                self._add(cls, rule)
            return rule

        return add

    def derive(self, op_classes: Iterable[type], make: Callable[[type], R | None]) -> None:
        """Give every op of `op_classes` that has no rule yet the rule `make(op)` returns
        (None: its facts give none; it needs an explicit rule or a reason)."""
        for cls in op_classes:
            if cls in self._rules or cls in self.unsupported:
                continue
            rule = make(cls)
            if rule is not None:
                self._add(cls, rule)
                self.derived.add(cls)

    def refuse(self, reason: str, *op_classes: type) -> None:
        """Record that this interpretation does not support `op_classes`, and why."""
        for cls in op_classes:
            assert cls not in self._rules, f"{cls.__name__} has a {self.what} rule and a reason"
            self.unsupported[cls] = reason

    def _add(self, cls: type, rule: R) -> None:
        assert cls not in self._rules, f"two {self.what} rules for {cls.__name__}"
        assert cls not in self.unsupported, f"{cls.__name__} has a {self.what} rule and a reason"
        self._rules[cls] = rule

    # -- reading ---------------------------------------------------------------------------

    def __getitem__(self, cls: type) -> R:
        return self._rules[cls]

    def __iter__(self) -> Iterator[type]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def missing(self, op_classes: Iterable[type]) -> list[type]:
        """The ops of `op_classes` with neither a rule nor a reason (should be none)."""
        return [c for c in op_classes if c not in self._rules and c not in self.unsupported]
