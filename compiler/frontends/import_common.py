"""What the PyTorch and ONNX importers share: a graph builder with several inputs, and the
PyTorch/NumPy conventions tl spells out explicitly (broadcasting, multi-axis reductions,
matmul on vectors and batches).

Both importers build through `tlc.semantics.program.GraphBuilder` (the program interface over a
`GraphEmitter`), so every node they make is checked by its op's own shape rule and every payload
record by the reference denotation's payload check as it is made; an importer never assembles
nodes by hand. tl has no implicit broadcasting: where the source framework broadcasts, an
explicit `broadcast_to` node appears.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location
from tlc.dialect import ops as tl
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.semantics.program import GraphBuilder, Traced


class ImportFailure(DiagnosticError):
    """A model tlc cannot import faithfully (unsupported op, attribute, dtype, ...)."""


def import_error(prefix: str, message: str) -> ImportFailure:
    return ImportFailure(*DiagnosticError.simple(f"{prefix}: {message}").diagnostics)


def new_builder(
    name: str, input_shapes: Sequence[Shape], at: Location
) -> tuple[GraphBuilder, list[SSAValue]]:
    """A builder whose first nodes are one input node per shape (ids 0, 1, ...), none for a
    graph without inputs (a constant)."""
    builder = GraphBuilder(name, input_shapes, at)
    builder.at = at
    return builder, list(builder.inputs)


def finish(builder: GraphBuilder, result: SSAValue) -> Traced:
    from xdsl.dialects.builtin import ModuleOp

    from tlc.dialect.verify import graph_shapes
    from tlc.semantics.payload_check import check_payload

    assert builder.at is not None, "new_builder sets the location"
    graph = builder.finish(result, builder.at)
    check_payload(graph, builder.payload, graph_shapes(graph))
    return Traced(ModuleOp([graph]), graph, builder.payload)


def generalise_batch(make: Callable[[int], Traced], refuse: Callable[[str], Exception]) -> Traced:
    """The model `make(batch)` imports, with its batch extent `N` (tlc.dialect.batch): imported
    at both `PROBES`, the two graphs must be the same nodes with the same metadata (shape fields
    aside, which are joined like shapes) and payload, every extent equal at both or the batch
    size at both. What the importer folded from the batch size (a constant 2, a slice of 2 rows)
    differs between the two and is refused: `refuse(reason)` is the importer's own exception
    saying why."""
    from tlc.dialect.batch import PROBES, join, join_metadata
    from tlc.dialect.verify import infer_graph_shapes

    first, second = (make(probe) for probe in PROBES)
    p, q = PROBES
    one, two = first.graph.nodes, second.graph.nodes
    if len(one) != len(two):
        raise refuse(f"it imports as {len(one)} nodes at batch size {p} but as {len(two)} at {q}")
    try:
        for a, b in zip(one, two, strict=True):
            if a.TAG != b.TAG or a.parent_ids() != b.parent_ids() or not join_metadata(a, b):
                raise refuse(
                    f"node {a.id} is {a.describe()} at batch size {p} but {b.describe()} at {q}"
                )
            shapes = (a.declared_shape, b.declared_shape)
            assert shapes[0] is not None and shapes[1] is not None, "importers declare shapes"
            a.set_declared_shape(join(a, *shapes))
        for nid, record in first.payload.items():
            other = second.payload.get(nid, {})
            for field, value in record.items():
                if field not in other or not np.array_equal(value, other[field]):
                    raise refuse(
                        f"the payload of node {nid} ({one[nid].TAG}) {field} differs at batch "
                        f"size {p} and at {q}"
                    )
        infer_graph_shapes(first.graph)
    except ImportFailure:
        raise
    except DiagnosticError as exc:
        raise refuse(exc.diagnostics[0].message) from None
    return first


def ints(values: Any) -> list[int]:
    """Python ints (metadata fields reject numpy integers)."""
    return [int(v) for v in values]


def norm_axis(axis: int, rank: int) -> int:
    return int(axis) + rank if int(axis) < 0 else int(axis)


def lift(builder: GraphBuilder, value: Any) -> SSAValue:
    """A graph value: tensors pass through, arrays and numbers become `const` nodes."""
    if isinstance(value, SSAValue):
        return value
    return builder.const(np.asarray(value, dtype=np.float64))


def broadcast_to(builder: GraphBuilder, value: Any, target: Shape) -> SSAValue:
    value = lift(builder, value)
    if builder.shape_of(value) == tuple(target):
        return value
    return builder.broadcast_to(value, to=ints(target))


def broadcast_all(builder: GraphBuilder, values: Sequence[Any]) -> list[SSAValue]:
    """NumPy/PyTorch/ONNX multidirectional broadcasting, as explicit `broadcast_to` nodes."""
    lifted = [lift(builder, v) for v in values]
    shapes = [builder.shape_of(v) for v in lifted]
    try:
        target = np.broadcast_shapes(*shapes)
    except ValueError:
        raise DiagnosticError.simple(
            f"shapes {', '.join(fmt_shape(s) for s in shapes)} do not broadcast together"
        ) from None
    return [broadcast_to(builder, v, target) for v in lifted]


def elementwise(builder: GraphBuilder, op: type[tl.NodeOp], values: Sequence[Any]) -> SSAValue:
    """A binary op folded left over `values` (ONNX Max/Min are variadic), broadcasting first."""
    parts = broadcast_all(builder, values)
    result = parts[0]
    for part in parts[1:]:
        result = builder.apply(op, [result, part])
    return result


def reshape(builder: GraphBuilder, value: SSAValue, target: Sequence[int]) -> SSAValue:
    source = builder.shape_of(value)
    target = tuple(ints(target))
    if source == target:
        return value
    if len(target) == 1 and len(source) != 1:
        return builder.flatten(value)
    return builder.reshape(value, to=list(target))


def pad(
    builder: GraphBuilder,
    value: SSAValue,
    first: int,
    lo: Sequence[int],
    hi: Sequence[int],
    fill: float,
) -> SSAValue:
    """Pad axes first, first+1, ... with `fill`: `const` blocks concatenated on each side."""
    for i, (before, after) in enumerate(zip(lo, hi, strict=True)):
        axis = first + i

        def block(extent: int, axis: int = axis, like: SSAValue = value) -> SSAValue:
            shape = list(builder.shape_of(like))
            shape[axis] = extent
            return builder.const(np.full(shape, fill))

        parts = ([block(before)] if before else []) + [value] + ([block(after)] if after else [])
        if len(parts) > 1:
            value = builder.concat(*parts, axis=axis)
    return value


def ceil_mode_extra(n: int, lo: int, hi: int, k: int, s: int) -> int:
    """Padding after an axis that makes tl's rounding down give the extent of ceil_mode in
    PyTorch and ONNX, whose last window must start inside the input or the padding before it."""
    total = n + lo + hi
    out = -(-(total - k) // s) + 1
    if (out - 1) * s >= n + lo:
        out -= 1
    return max(0, (out - 1) * s + k - total)


def reduce(
    builder: GraphBuilder,
    op: type[tl.ReductionOp],
    value: SSAValue,
    axes: Sequence[int] | None,
    keepdims: bool,
) -> SSAValue:
    """Reduce over several axes (all of them for None) by one node per axis, last axis first;
    `keepdims` reshapes the reduced axes back to extent 1. Summing every axis is `sum`."""
    shape = builder.shape_of(value)
    rank = len(shape)
    chosen = sorted({norm_axis(a, rank) for a in (range(rank) if axes is None else axes)})
    kept = [1 if i in chosen else d for i, d in enumerate(shape)]
    if not chosen:
        return value
    if op is tl.ReduceSumOp and len(chosen) == rank and not keepdims:
        return builder.sum(value)
    for axis in reversed(chosen):
        value = builder.apply(op, [value], {"axis": axis})
    return reshape(builder, value, kept) if keepdims else value


def matmul(builder: GraphBuilder, a: Any, b: Any) -> SSAValue:
    """NumPy's matmul: vectors are promoted to matrices and back, batch dims broadcast."""
    a, b = lift(builder, a), lift(builder, b)
    sa, sb = builder.shape_of(a), builder.shape_of(b)
    if len(sa) == 1:
        a = reshape(builder, a, (1, sa[0]))
    if len(sb) == 1:
        b = reshape(builder, b, (sb[0], 1))
    ra, rb = builder.shape_of(a), builder.shape_of(b)
    batch = tuple(np.broadcast_shapes(ra[:-2], rb[:-2]))
    a = broadcast_to(builder, a, batch + ra[-2:])
    b = broadcast_to(builder, b, batch + rb[-2:])
    result = builder.matmul(a, b)
    out = batch + ((ra[-2],) if len(sa) > 1 else ()) + ((rb[-1],) if len(sb) > 1 else ())
    return reshape(builder, result, out)


__all__ = [
    "ImportFailure",
    "Traced",
    "broadcast_all",
    "broadcast_to",
    "elementwise",
    "finish",
    "import_error",
    "ints",
    "lift",
    "matmul",
    "new_builder",
    "norm_axis",
    "reduce",
    "reshape",
]
