"""The batch extent `N`: graphs whose leading dimension is chosen when they run.

A graph may declare `N` (`BATCH` in a `Shape`) in place of an extent, normally the leading one
of its inputs (`%0 = input : [N, 784]`). Shape rules are written over concrete extents, so a
graph with `N` is checked at two batch sizes (`PROBES`): every node's shape must come out the
same at both, except extents that are the batch size itself at both, which are `N`. An extent
that varies with the batch in another way (a flatten over the batch axis: 12 N) is refused at
its node, as is a graph whose rules hold at one batch size only (an `add` of `[N, 4]` and
`[2, 4]`). Everything that runs a graph (the reference, intervals, compiled code) runs a
`specialise`d copy, with `N` replaced by the batch size of the input it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Generic, TypeVar

from tlc.core.diagnostics import DiagnosticError, error
from tlc.dialect.metadata import EXTENT_FIELDS, Field, to_attr
from tlc.dialect.ops import GraphOp, InputOp, NodeOp
from tlc.dialect.shapes import BATCH, Shape
from tlc.dialect.types import shape_of_type

T = TypeVar("T")

#: The batch sizes a graph with `N` is checked at: two, so an extent that follows the batch is
#: told from one that does not; neither 1, which broadcasts against any extent.
PROBES = (2, 3)


def has_batch(graph: GraphOp, nodes: Sequence[NodeOp] | None = None) -> bool:
    """Whether some node of `graph` (its `nodes`, if the caller has them) declares the batch
    extent `N` (in its shape or in a shape field of its metadata)."""
    seen: set[int] = set()  # nodes share their result types (one per shape): read each once
    for node in graph.nodes if nodes is None else nodes:
        (result,) = node.results
        if id(result.type) not in seen:
            seen.add(id(result.type))
            if BATCH in (shape_of_type(result.type) or ()):
                return True
        if _shape_fields(type(node)) and any(
            BATCH in node.meta(f.name) for f in _extent_fields(node)
        ):
            return True
    return False


def _extent_fields(node: NodeOp) -> list[Field]:
    return [f for f in _shape_fields(type(node)) if f.name in node.attributes]


@cache
def _shape_fields(kind: type[NodeOp]) -> tuple[Field, ...]:
    """The fields of an op kind that hold a shape."""
    return tuple(f for f in kind.FIELDS if f.name in EXTENT_FIELDS)


def concrete(shape: Shape, batch: int) -> Shape:
    """`shape` with `N` replaced by `batch`."""
    return tuple(batch if d == BATCH else d for d in shape)


def specialise(graph: GraphOp, batch: int) -> GraphOp:
    """A copy of `graph` (same names, node ids and locations) with every `N` replaced by
    `batch`: a graph of static shapes, which every interpretation and codegen can run."""
    copy = graph.clone()
    for node in copy.nodes:
        declared = node.declared_shape
        if declared is not None and BATCH in declared:
            node.set_declared_shape(concrete(declared, batch))
        for field in _extent_fields(node):
            value = node.meta(field.name)
            if BATCH in value:
                node.attributes[field.name] = to_attr(field, concrete(value, batch))
    return copy


def infer_at_probes(graph: GraphOp, infer: Callable[[GraphOp], list[Shape]]) -> list[Shape]:
    """The shapes of a graph with `N`: `infer` (the static shape check) on the graph specialised
    to each of `PROBES`, joined by `join`. A rule failing at one batch size only (or with a
    message that quotes the batch size) fails here with that batch size named."""
    inferred: list[list[Shape]] = []
    failures: list[tuple[int, DiagnosticError]] = []
    for probe in PROBES:
        try:
            inferred.append(infer(specialise(graph, probe)))
        except DiagnosticError as exc:
            failures.append((probe, exc))
    if failures:
        probe, exc = failures[0]
        messages = {tuple(d.message for d in e.diagnostics) for _, e in failures}
        if len(failures) < len(PROBES) or len(messages) > 1:
            exc.diagnostics = [
                replace(d, message=f"{d.message} (with the batch size N = {probe})")
                for d in exc.diagnostics
            ]
            exc.args = ("\n".join(d.message for d in exc.diagnostics),)
        raise exc
    return [join(node, *shapes) for node, *shapes in zip(graph.nodes, *inferred, strict=True)]


def join(node: NodeOp, *shapes: Shape, what: str = "its output") -> Shape:
    """One node's shape (or shape field, `what`) from its values at `PROBES`: extents equal at
    every probe stay, extents equal to the probe at every probe are `N`; any other dependence on
    the batch is refused."""
    if len({len(s) for s in shapes}) != 1:
        raise error(
            f"IR graph: node {node.id}: the rank of {what} depends on the batch size N", node
        )
    joined = []
    for axis, extents in enumerate(zip(*shapes, strict=True)):
        if len(set(extents)) == 1:
            joined.append(extents[0])
        elif extents == PROBES:
            joined.append(BATCH)
        else:
            at = ", ".join(f"{e} at N = {p}" for e, p in zip(extents, PROBES, strict=True))
            raise error(
                f"IR graph: node {node.id}: extent {axis} of {what} depends on the batch size "
                f"N without being N ({at}); only the batch extent itself may vary",
                node,
            )
    return tuple(joined)


def join_metadata(node: NodeOp, *others: NodeOp) -> bool:
    """Give `node` (at `PROBES[0]`) the shape fields joined (see `join`) with the same node at
    the other probes; False when some other field differs, so the node computes with the batch
    size rather than over it."""
    for field in node.FIELDS:
        values = [n.meta(field.name) for n in (node, *others)]
        if all(v == values[0] for v in values):
            continue
        if field.name not in EXTENT_FIELDS:
            return False
        joined = join(node, *values, what=f"'{field.name}'")
        node.attributes[field.name] = to_attr(field, joined)
    return True


def batch_of(graph: GraphOp, values: Mapping[int, Shape]) -> int:
    """The batch size `N` that the shapes of the given input values (input node id -> shape)
    mean for `graph`'s declared input shapes; a value whose rank or static extents do not fit
    is left for the caller's shape check to report (with `N` replaced by the batch found)."""
    found: dict[int, int] = {}
    for node in graph.nodes:
        declared = node.declared_shape
        shape = values.get(node.id)
        if not isinstance(node, InputOp) or declared is None or shape is None:
            continue
        if len(shape) == len(declared):
            for d, extent in zip(declared, shape, strict=True):
                if d == BATCH:
                    found.setdefault(node.id, extent)
                    if found[node.id] != extent:
                        raise _disagree(graph, {node.id: found[node.id]}, node.id, extent)
    sizes = set(found.values())
    if len(sizes) > 1:
        first = min(found)
        other = next(nid for nid in sorted(found) if found[nid] != found[first])
        raise _disagree(graph, {first: found[first]}, other, found[other])
    return sizes.pop() if sizes else PROBES[0]


def _disagree(graph: GraphOp, seen: dict[int, int], nid: int, extent: int) -> DiagnosticError:
    ((first, size),) = seen.items()
    return error(
        f"IR eval: the inputs give two batch sizes N: {size} (input {first}) and {extent} "
        f"(input {nid})",
        graph.nodes[nid],
    )


def batch_of_value(declared: Shape, shape: Shape) -> int | None:
    """The batch size an array of `shape` gives an input declared `declared` (with `N`): an
    array of that rank whose other extents match, or a flat array of a multiple of the other
    extents' product (`N` once); None if it fits no batch size."""
    if len(shape) == len(declared):
        batches = {e for d, e in zip(declared, shape, strict=True) if d == BATCH}
        if len(batches) == 1 and shape == concrete(declared, next(iter(batches))):
            return batches.pop()
    if len(shape) != 1 or declared.count(BATCH) != 1:
        return None
    rest = 1
    for d in declared:
        rest *= 1 if d == BATCH else d
    return shape[0] // rest if rest and shape[0] % rest == 0 else None


class PerBatch(Generic[T]):
    """What `build` makes of `graph` specialised to each batch size, built on first use and
    kept: the prepared reference of a graph with `N`, its compiled code per batch size."""

    def __init__(self, graph: GraphOp, build: Callable[[GraphOp], T]):
        self.graph = graph
        self.build = build
        self.built: dict[int, T] = {}

    def at(self, batch: int) -> T:
        if batch not in self.built:
            self.built[batch] = self.build(specialise(self.graph, batch))
        return self.built[batch]

    def for_inputs(self, shapes: Mapping[int, Shape]) -> T:
        """The specialisation for the batch size the input shapes (node id -> shape) give."""
        return self.at(batch_of(self.graph, shapes))
