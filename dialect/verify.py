"""Checking a graph: structure (TorchLean's `Graph.checkWellFormed`) and shapes (`checkShapes`).

These are the checks behind the verify-structure and infer-shapes passes; the front end, the
interpreters and the importers call them directly on one graph.

A verified graph is trusted: once `infer_graph_shapes` has checked a graph (its structure and
every node's shape rule), the graph carries a mark holding every node's shape, and
`graph_shapes`, which every interpreter, pass and backend reads shapes with, returns it instead
of inferring again. Only a graph never verified is inferred (and checked) there. The mark is a
Python attribute of the graph op, not IR: it never prints, and a clone or a newly built graph
starts without it. Every pass that rewrites builds new graph ops (decompose, grad,
lower-program), so its output is verified afresh; the passes that keep graphs (verify-structure,
infer-shapes filling in omitted shapes, select-kernels attaching a plan) keep the mark valid.
Code that edits a verified graph in place calls `forget_verified`. Likewise a graph that passed
`check_structure` (the verify-structure pass) carries a mark, so that infer-shapes right after
it does not check the structure again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from tlc.core.diagnostics import Diagnostic, DiagnosticError, error
from tlc.dialect.metadata import MetadataError
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.dialect.shapes import Shape, ShapeError, fmt_shape


def check_metadata(graph: GraphOp, nodes: list[NodeOp] | None = None) -> None:
    """Every node's metadata present and typed. The .tlir parser guarantees this; a document
    read from the MLIR form is checked on loading (tlc.frontends.text), since no printer or pass can
    work on a node whose metadata cannot be read."""
    # Nodes share their metadata attributes (one per value), so each (field, attribute) pair
    # is read once; the ids stay valid while the nodes hold the attributes.
    read: set[tuple[int, int]] = set()
    for i, node in enumerate(graph.nodes if nodes is None else nodes):
        attributes = node.attributes
        for f in node.FIELDS:
            key = (id(f), id(attributes.get(f.name)))
            if key not in read:
                try:
                    node.meta(f.name)
                except MetadataError as exc:
                    raise error(f"IR graph: node {i}: {exc}", node) from None
                read.add(key)


#: The attribute of a graph op that passed check_structure (see the module doc).
_STRUCTURE_CHECKED = "_tlc_structure_checked"


def check_operands(graph: GraphOp) -> None:
    """Every operand of the graph's nodes and output is the result of a node of this graph.
    The .tlir parser only builds such graphs; the MLIR form can name a block argument or a
    value of another region, which no pass or backend could read (tlc.frontends.text checks
    it on loading)."""
    block = graph.body.block
    for op in block.ops:
        for k, value in enumerate(op.operands):
            owner = value.owner
            if not isinstance(owner, NodeOp) or owner.parent is not block:
                what = f"node {op.id}" if isinstance(op, NodeOp) else "the output"
                raise error(
                    f"IR graph: {what}: operand {k} is not the result of a node of graph "
                    f"@{graph.graph_name}",
                    op,
                )


def check_structure(graph: GraphOp) -> None:
    """Raise a located DiagnosticError for the first structural fault of `graph`; a graph that
    checks out gets the structure mark (see the module doc)."""
    _structure(graph, trust_mark=False)


def _structure(graph: GraphOp, trust_mark: bool = True) -> list[tuple[NodeOp, list[int]]]:
    """check_structure's work (skipped for a graph with the structure mark, if `trust_mark`);
    each node with its parent ids, read once, for infer_graph_shapes."""
    if trust_mark and getattr(graph, _STRUCTURE_CHECKED, False):
        return [(node, node.parent_ids()) for node in graph.nodes]
    nodes: list[NodeOp] = []
    outputs = 0
    for op in graph.body.block.ops:
        if isinstance(op, NodeOp):
            nodes.append(op)
        elif isinstance(op, OutputOp):
            outputs += 1
        else:
            raise error(f"IR graph: unexpected op '{op.name}' in graph @{graph.graph_name}", op)
    check_metadata(graph, nodes)
    checked: list[tuple[NodeOp, list[int]]] = []
    for i, node in enumerate(nodes):
        if node.id != i:
            raise error(
                f"IR graph: id discipline violated at index {i}: nodes[{i}].id = {node.id}", node
            )
        parents = node.parent_ids()
        low, high = node.ARITY
        got = len(parents)
        if got < low or (high is not None and got > high):
            expected = f"{low}..{high}" if high is not None else f"at least {low}"
            raise error(
                f"IR graph: node {i}: bad parent count for {node.TAG}: expected {expected}, "
                f"got {got} ({node.summary()})",
                node,
            )
        for pid in parents:
            if pid >= i:
                raise error(
                    f"IR graph: node {i}: parent id {pid} is not < {node.id} ({node.summary()})",
                    node,
                )
        checked.append((node, parents))
    if outputs != 1:
        raise error(
            f"IR graph: graph @{graph.graph_name} must select exactly one output, found {outputs}",
            graph,
        )
    setattr(graph, _STRUCTURE_CHECKED, True)
    return checked


def run_on_graphs(module: ModuleOp, check: Callable[[GraphOp], object]) -> None:
    """Apply `check(graph)` to every graph, collecting the first error of each."""
    diagnostics: list[Diagnostic] = []
    for op in _graphs(module):
        try:
            check(op)
        except DiagnosticError as exc:
            diagnostics.extend(exc.diagnostics)
    if diagnostics:
        raise DiagnosticError(*diagnostics)


def _graphs(op: Operation) -> Iterator[GraphOp]:
    """The graph ops in `op` and below, in the order of `op.walk()`, which visits each of a
    graph's nodes (a generator step apiece); ops without regions, such as nodes, are only
    passed over here."""
    if isinstance(op, GraphOp):
        yield op
    for region in op.regions:
        for block in region.blocks:
            child = block.first_op
            while child is not None:
                if child.regions:
                    yield from _graphs(child)
                child = child._next_op  # `next_op`, without the property call


#: The attribute of a verified graph op holding every node's shape (see the module doc).
_VERIFIED = "_tlc_verified_shapes"


def verified_shapes(graph: GraphOp) -> tuple[Shape, ...] | None:
    """Every node's shape if `graph` carries the verified mark, else None."""
    return getattr(graph, _VERIFIED, None)


def forget_verified(graph: GraphOp) -> None:
    """Drop the verified marks (after an edit in place): the next reader infers and checks."""
    for mark in (_VERIFIED, _STRUCTURE_CHECKED):
        if hasattr(graph, mark):
            delattr(graph, mark)


def infer_graph_shapes(graph: GraphOp) -> list[Shape]:
    """The inferred output shape of every node, or a located DiagnosticError. A graph that
    checks out gets the verified mark (see the module doc). A graph declaring the batch extent
    `N` is checked at two batch sizes (`tlc.dialect.batch`)."""
    from tlc.dialect.batch import has_batch, infer_at_probes

    checked = _structure(graph)  # the structure first: has_batch reads every node's metadata
    if has_batch(graph, [node for node, _ in checked]):
        inferred = infer_at_probes(graph, _infer_static)
    else:
        inferred = _infer_static(graph, checked)
    setattr(graph, _VERIFIED, tuple(inferred))
    return inferred


def _infer_static(
    graph: GraphOp, checked: list[tuple[NodeOp, list[int]]] | None = None
) -> list[Shape]:
    """Every node's shape by its rule, checked against its declared one; `checked` is what
    `_structure(graph)` returned, if the caller has it."""
    inferred: list[Shape] = []
    for i, (node, parents) in enumerate(_structure(graph) if checked is None else checked):
        try:
            out = node.infer([inferred[pid] for pid in parents])
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
    """Every node's output shape, trusting a verified graph (its mark); a graph never verified
    is checked by `infer_graph_shapes` (structure, shape rules), which marks it."""
    marked = verified_shapes(graph)
    return list(marked) if marked is not None else infer_graph_shapes(graph)
