"""verify-structure: TorchLean's `Graph.checkWellFormed`, node by node.

For each node in order: its metadata is present and typed (a document read from the MLIR form
may lack it), its id equals its position, its parent count suits its op, and every parent id is
smaller than its own. The first failure in a graph is reported at that node; every graph of the
module is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.diagnostics import Diagnostic, DiagnosticError, error
from tlc.dialect.metadata import MetadataError
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp


def check_metadata(graph: GraphOp) -> None:
    """Every node's metadata present and typed. The .tlir parser guarantees this; a document
    read from the MLIR form is checked on loading (tlc.frontend), since no printer or pass can
    work on a node whose metadata cannot be read."""
    for i, node in enumerate(graph.nodes):
        try:
            node.metadata()
        except MetadataError as exc:
            raise error(f"IR graph: node {i}: {exc}", node) from None


def check_structure(graph: GraphOp) -> None:
    """Raise a located DiagnosticError for the first structural fault of `graph`."""
    for op in graph.body.block.ops:
        if not isinstance(op, NodeOp | OutputOp):
            raise error(f"IR graph: unexpected op '{op.name}' in graph @{graph.graph_name}", op)
    check_metadata(graph)
    for i, node in enumerate(graph.nodes):
        if node.id != i:
            raise error(
                f"IR graph: id discipline violated at index {i}: nodes[{i}].id = {node.id}", node
            )
        low, high = node.ARITY
        got = len(node.parents)
        if got < low or (high is not None and got > high):
            expected = f"{low}..{high}" if high is not None else f"at least {low}"
            raise error(
                f"IR graph: node {i}: bad parent count for {node.TAG}: expected {expected}, "
                f"got {got} ({node.summary()})",
                node,
            )
        for pid in node.parent_ids():
            if pid >= node.id:
                raise error(
                    f"IR graph: node {i}: parent id {pid} is not < {node.id} ({node.summary()})",
                    node,
                )
    outputs = [op for op in graph.body.block.ops if isinstance(op, OutputOp)]
    if len(outputs) != 1:
        raise error(
            f"IR graph: graph @{graph.graph_name} must select exactly one output, "
            f"found {len(outputs)}",
            graph,
        )


def run_on_graphs(module: ModuleOp, check: Callable[[GraphOp], object]) -> None:
    """Apply `check(graph)` to every graph, collecting the first error of each."""
    diagnostics: list[Diagnostic] = []
    for op in module.walk():
        if isinstance(op, GraphOp):
            try:
                check(op)
            except DiagnosticError as exc:
                diagnostics.extend(exc.diagnostics)
    if diagnostics:
        raise DiagnosticError(*diagnostics)


@dataclass(frozen=True)
class VerifyStructurePass(ModulePass):
    """Check ids, parent counts and topological order of every graph (checkWellFormed)."""

    name = "verify-structure"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        run_on_graphs(op, check_structure)
