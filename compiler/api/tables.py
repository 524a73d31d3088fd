"""Every interpretation's rule table, loaded: what the op reference and the exhaustiveness test
read. Each module below fills one or more `RuleTable`s when imported (tlc.core.rule_table.TABLES
collects them); importers of optional frameworks are skipped when the framework is missing."""

from __future__ import annotations

import importlib

from tlc.core.rule_table import TABLES, RuleTable

#: The modules defining interpretation tables, bottom layer first.
INTERPRETATIONS = (
    "tlc.semantics.reference",
    "tlc.semantics.payload_check",
    "tlc.semantics.ibp",
    "tlc.semantics.crown",
    "tlc.semantics.autodiff.rules",
    "tlc.semantics.torch_kernels",
    "tlc.semantics.capsules",
    "tlc.codegen.lower",
    "tlc.frontends.import_onnx",
    "tlc.frontends.export_onnx",
    "tlc.frontends.import_torch",
)
#: Frameworks whose absence skips a table rather than failing.
OPTIONAL = ("torch", "onnx", "onnxruntime")


def interpretation_tables() -> list[RuleTable[object]]:
    """Import every interpretation module that can be imported here and return all tables."""
    for name in INTERPRETATIONS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                raise
    return list(TABLES)
