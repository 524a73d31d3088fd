"""verify-structure: TorchLean's `Graph.checkWellFormed`, node by node.

For each node in order: its metadata is present and typed (a document read from the MLIR form
may lack it), its id equals its position, its parent count suits its op, and every parent id is
smaller than its own. The first failure in a graph is reported at that node; every graph of the
module is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.dialect.verify import check_structure, run_on_graphs


@dataclass(frozen=True)
class VerifyStructurePass(ModulePass):
    """Check ids, parent counts and topological order of every graph (checkWellFormed)."""

    name = "verify-structure"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        run_on_graphs(op, check_structure)
