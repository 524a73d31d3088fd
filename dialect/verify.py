"""Checking a graph: structure (TorchLean's `Graph.checkWellFormed`) and shapes (`checkShapes`).

These are the checks behind the verify-structure and infer-shapes passes; the front end, the
interpreters and the importers call them directly on one graph.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import ModuleOp

from tlc.core.diagnostics import Diagnostic, DiagnosticError, error
from tlc.dialect.metadata import MetadataError
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.dialect.shapes import Shape, ShapeError, fmt_shape


def check_metadata(graph: GraphOp) -> None:
    """Every node's metadata present and typed. The .tlir parser guarantees this; a document
    read from the MLIR form is checked on loading (tlc.frontends.text), since no printer or pass can
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


def infer_graph_shapes(graph: GraphOp) -> list[Shape]:
    """The inferred output shape of every node, or a located DiagnosticError. A graph declaring
    the batch extent `N` is checked at two batch sizes (`tlc.dialect.batch`)."""
    from tlc.dialect.batch import has_batch, infer_at_probes

    check_structure(graph)
    if has_batch(graph):
        return infer_at_probes(graph, _infer_static)
    return _infer_static(graph)


def _infer_static(graph: GraphOp) -> list[Shape]:
    inferred: list[Shape] = []
    for i, node in enumerate(graph.nodes):
        try:
            out = node.infer([inferred[pid] for pid in node.parent_ids()])
        except ShapeError as exc:
            raise error(str(exc), node) from None
        declared = node.declared_shape
        if declared is not None and declared != out:
            raise error(
                f"IR graph: node {i}: outShape mismatch: inferred={fmt_shape(out)}, "
                f"declared={fmt_shape(declared)} ({node.summary()})",
                node,
            )
        inferred.append(out)
    return inferred


def graph_shapes(graph: GraphOp) -> list[Shape]:
    """Every node's output shape, trusting a verified graph: the declared shapes when every
    node declares one (infer-shapes checked them), else `infer_graph_shapes`, which checks."""
    declared = [node.declared_shape for node in graph.nodes]
    if all(shape is not None for shape in declared):
        return declared  # type: ignore[return-value]
    return infer_graph_shapes(graph)
