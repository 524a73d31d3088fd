"""Checking a payload against its graph, with the seed's messages (reference/torchlean-ir.md §2-3).

A payload can be internally consistent and still disagree with the graph it is used with: the
seed's example swaps the two linear records of the six-node MLP, so node 1 reads a [3, 5] matrix
and fails with `IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]`. Every
payload-reading op has one checker in `PAYLOAD_CHECKS`, derived from its payload schema
(`NodeOp.PAYLOAD`: required and optional fields, scalar fields, each field's shape); four ops keep
an explicit checker for the seed's own messages (linear, conv, layernorm, const). A record for a
node that reads no payload,
for a node that does not exist, or written for another op kind is reported too, since such a
record is always a mistake (a renumbered graph, a stale checkpoint). Errors are located at the
node and name it and both shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from tlc.core.diagnostics import error
from tlc.core.payload import Payload, Record
from tlc.core.rule_table import RuleTable
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, fmt_shape, numel
from tlc.dialect.verify import graph_shapes
from tlc.semantics.reference import EvalError, eval_error

#: `check(node, parent shapes, output shape, record or None)`; raises EvalError.
Check = Callable[[NodeOp, list[Shape], Shape, "Record | None"], None]

PAYLOAD_CHECKS: RuleTable[Check] = RuleTable("payload check")

#: Fields holding one number (`Param.scalar` of any op); stored as 0-d arrays after
#: `prepare_records`.
SCALAR_FIELDS = frozenset(p.name for op in NODE_OPS for p in op.PAYLOAD if p.scalar)


def check_payload(graph: GraphOp, payload: Payload, shapes: list[Shape] | None = None) -> None:
    """Raise a located EvalError for the first record that disagrees with `graph`.

    `shapes` are the nodes' inferred shapes (if omitted: a verified graph's, else inferred with
    the structure check).
    """
    if shapes is None:
        shapes = graph_shapes(graph)
    nodes = graph.nodes
    for nid in sorted(payload):
        if nid >= len(nodes):
            raise EvalError(
                *error(
                    f"IR eval: payload record for node {nid}, but graph @{graph.graph_name} "
                    f"has {len(nodes)} nodes",
                    graph,
                ).diagnostics
            )
        node = nodes[nid]
        if type(node) not in PAYLOAD_CHECKS:
            raise eval_error(
                f"IR eval: payload record for node {nid}, but {node.TAG} reads no payload", node
            )
        kind = payload.kinds.get(nid)
        if kind is not None and kind != node.TAG:
            raise eval_error(
                f"IR eval: payload record for node {nid} is a {kind} record, "
                f"but node {nid} is {node.TAG}",
                node,
            )
    for node in nodes:
        check = PAYLOAD_CHECKS.get(type(node))
        if check is not None:
            parents = [shapes[pid] for pid in node.parent_ids()]
            check(node, parents, shapes[node.id], payload.get(node.id))


def prepare_records(
    graph: GraphOp, payload: Payload, dtype: type, shapes: list[Shape] | None = None
) -> dict[int, Record]:
    """Check `payload`, then cast every field to `dtype` (scalar fields to 0-d arrays)."""
    check_payload(graph, payload, shapes)
    return {
        nid: {name: _cast(name, value, dtype) for name, value in record.items()}
        for nid, record in payload.items()
    }


def _cast(name: str, value: np.ndarray, dtype: type) -> np.ndarray:
    shape = () if name in SCALAR_FIELDS else value.shape
    return np.asarray(value, dtype=dtype).reshape(shape)


# --------------------------------------------------------------------------------------------
# The checks a payload schema gives
# --------------------------------------------------------------------------------------------

#: The message for a field of the wrong shape: (node, field, its shape, the expected shape).
Mismatch = Callable[[NodeOp, str, Shape, Shape], str]


def _field_mismatch(node: NodeOp, name: str, got: Shape, expected: Shape) -> str:
    return (
        f"IR eval: {node.TAG} {node.id}: payload field '{name}' has shape "
        f"{fmt_shape(got)}, expected {fmt_shape(expected)}"
    )


def _require(node: NodeOp, record: Record | None) -> Record:
    if record is None:
        raise eval_error(f"IR eval: missing {node.TAG} payload for node {node.id}", node)
    return record


def _fields(node: NodeOp, record: Record) -> None:
    """Every required field present, nothing unknown, scalar fields holding one number."""
    schema = type(node).PAYLOAD
    required: Collection[str] = [p.name for p in schema if p.required]
    for name in required:
        if name not in record:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: payload record lacks field '{name}'", node
            )
    known = [*required, *(p.name for p in schema if not p.required)]
    scalar = {p.name for p in schema if p.scalar}
    for name, value in record.items():
        if name not in known:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: unknown payload field '{name}' "
                f"(expected {', '.join(known)})",
                node,
            )
        if name in scalar and value.size != 1:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: payload field '{name}' must be one number, "
                f"got shape {fmt_shape(value.shape)}",
                node,
            )


def _shapes(
    node: NodeOp,
    parents: list[Shape],
    out: Shape,
    record: Record,
    mismatch: Mismatch = _field_mismatch,
) -> None:
    """Every field the schema gives a shape (`Param.shape`) has that shape."""
    for param in type(node).PAYLOAD:
        expected = param.shape(node, parents, out)
        if expected is not None and param.name in record:
            got = record[param.name].shape
            if got != tuple(expected):
                raise eval_error(mismatch(node, param.name, got, tuple(expected)), node)


def check_schema(
    node: NodeOp,
    parents: list[Shape],
    out: Shape,
    record: Record | None,
    mismatch: Mismatch = _field_mismatch,
) -> None:
    """The check an op's payload schema gives: a record where one is required, its fields,
    their shapes."""
    if record is None:
        if type(node).payload_required():
            _require(node, record)
        return
    _fields(node, record)
    _shapes(node, parents, out, record, mismatch)


# --------------------------------------------------------------------------------------------
# The seed's own messages
# --------------------------------------------------------------------------------------------


@PAYLOAD_CHECKS.register(ops.LinearOp)
def _linear(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    """The weight's rank, the declared outShape and the in-dim, each with its own message,
    before the schema's shapes."""
    record = _require(node, record)
    _fields(node, record)
    weight = record["weight"]
    (x,) = parents
    if weight.ndim != 2:
        raise eval_error(
            f"IR eval: linear {node.id}: weight must be a matrix [out, in], "
            f"got shape {fmt_shape(weight.shape)}",
            node,
        )
    out_dim, in_dim = weight.shape
    expected = x[:-1] + (out_dim,)
    if out != expected:
        raise eval_error(
            f"IR eval: linear {node.id}: declared outShape mismatch: {fmt_shape(out)} "
            f"vs expected {fmt_shape(expected)}",
            node,
        )
    if in_dim != x[-1]:
        raise eval_error(
            f"IR eval: linear {node.id}: weight shape {fmt_shape(weight.shape)} does not match "
            f"input shape {fmt_shape(x)} (in-dim {in_dim} vs {x[-1]})",
            node,
        )
    _shapes(node, parents, out, record)


@PAYLOAD_CHECKS.register(ops.ConstOp)
def _const(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    """Only the number of values counts: any shape of numel(out) values is accepted."""
    record = _require(node, record)
    _fields(node, record)
    have, size = record["value"].size, numel(out)
    if have != size:
        raise eval_error(
            f"IR eval: const {node.id}: flat length mismatch: have {have}, expected {size}", node
        )


def _conv_mismatch(node: NodeOp, name: str, got: Shape, expected: Shape) -> str:
    return (
        f"IR eval: conv {node.id}: payload does not match the node configuration: "
        f"{name} shape {fmt_shape(got)} vs expected {fmt_shape(expected)}"
    )


def _layernorm_mismatch(node: NodeOp, name: str, got: Shape, expected: Shape) -> str:
    return (
        f"IR eval: node {node.id}: layernorm payload shape {fmt_shape(got)} does not match "
        f"normalized suffix {fmt_shape(expected)}"
    )


PAYLOAD_CHECKS.register(ops.ConvOp)(
    lambda node, parents, out, record: check_schema(node, parents, out, record, _conv_mismatch)
)
PAYLOAD_CHECKS.register(ops.LayernormOp)(
    lambda node, parents, out, record: check_schema(node, parents, out, record, _layernorm_mismatch)
)

PAYLOAD_CHECKS.derive(NODE_OPS, lambda op: check_schema if op.reads_payload() else None)
PAYLOAD_CHECKS.refuse(
    "reads no payload: a record for its node is reported as one",
    *(op for op in NODE_OPS if not op.reads_payload()),
)
