"""Every interpretation table covers every op kind: a rule (explicit or derived from the op's
facts) or a stated reason, never both, never neither. This one test replaces a coverage test
per table."""

from __future__ import annotations

import pytest

from tlc.api.tables import interpretation_tables
from tlc.core.rule_table import RuleTable
from tlc.dialect.registry import NODE_OPS

TABLES = interpretation_tables()


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.what)
def test_every_op_has_a_rule_or_a_reason(table: RuleTable[object]) -> None:
    missing = [op.TAG for op in table.missing(NODE_OPS)]
    assert not missing, f"{table.what}: no rule and no reason for {missing}"
    assert not set(table) & set(table.unsupported), f"{table.what}: a rule and a reason"
    assert all(reason.strip() for reason in table.unsupported.values()), table.what


def test_every_interpretation_has_a_table() -> None:
    names = {t.what for t in TABLES}
    expected = {"reference", "payload check", "interval", "JVP", "VJP", "LLVM lowering"}
    assert expected <= names, sorted(expected - names)


def test_leaky_relu_needs_no_explicit_rule() -> None:
    """The test of the design: an elementwise op stated by its facts gets every rule derived."""
    from tlc.dialect.ops import LeakyReluOp

    for table in TABLES:
        if LeakyReluOp in table:
            assert LeakyReluOp in table.derived, f"{table.what} has an explicit leaky_relu rule"
