"""Checking a payload against its graph, with the seed's messages (reference/torchlean-ir.md §2-3).

A payload can be internally consistent and still disagree with the graph it is used with: the
seed's example swaps the two linear records of the six-node MLP, so node 1 reads a [3, 5] matrix
and fails with `IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]`. Every
payload-reading op has one checker in `PAYLOAD_CHECKS`; a record for a node that reads no payload,
for a node that does not exist, or written for another op kind is reported too, since such a
record is always a mistake (a renumbered graph, a stale checkpoint). Errors are located at the
node and name it and both shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from tlc.core.diagnostics import error
from tlc.core.payload import Payload, Record
from tlc.core.rule_table import registrar
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.shapes import Shape, fmt_shape, numel
from tlc.dialect.verify import infer_graph_shapes
from tlc.semantics.reference import EvalError, eval_error

#: `check(node, parent shapes, output shape, record or None)`; raises EvalError.
Check = Callable[[NodeOp, list[Shape], Shape, "Record | None"], None]

PAYLOAD_CHECKS: dict[type[NodeOp], Check] = {}

#: Fields holding one number; stored as 0-d arrays after `prepare_records`.
SCALAR_FIELDS = frozenset({"eps"})


def check_payload(graph: GraphOp, payload: Payload, shapes: list[Shape] | None = None) -> None:
    """Raise a located EvalError for the first record that disagrees with `graph`.

    `shapes` are the nodes' inferred shapes (computed, with the structure check, if omitted).
    """
    if shapes is None:
        shapes = infer_graph_shapes(graph)
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


_register = registrar(PAYLOAD_CHECKS, "payload check")


def _require(node: NodeOp, record: Record | None) -> Record:
    if record is None:
        raise eval_error(f"IR eval: missing {node.TAG} payload for node {node.id}", node)
    return record


def _fields(
    node: NodeOp, record: Record, required: Collection[str], optional: Collection[str] = ()
) -> None:
    """Every required field present, nothing unknown, scalar fields holding one number."""
    for name in required:
        if name not in record:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: payload record lacks field '{name}'", node
            )
    known = [*required, *optional]
    for name, value in record.items():
        if name not in known:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: unknown payload field '{name}' "
                f"(expected {', '.join(known)})",
                node,
            )
        if name in SCALAR_FIELDS and value.size != 1:
            raise eval_error(
                f"IR eval: {node.TAG} {node.id}: payload field '{name}' must be one number, "
                f"got shape {fmt_shape(value.shape)}",
                node,
            )


def _field_shape(node: NodeOp, record: Record, name: str, expected: Shape) -> None:
    if name in record and record[name].shape != expected:
        raise eval_error(
            f"IR eval: {node.TAG} {node.id}: payload field '{name}' has shape "
            f"{fmt_shape(record[name].shape)}, expected {fmt_shape(expected)}",
            node,
        )


@_register(ops.LinearOp)
def _linear(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    record = _require(node, record)
    _fields(node, record, ["weight"], ["bias"])
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
    _field_shape(node, record, "bias", (out_dim,))


@_register(ops.ConstOp)
def _const(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    record = _require(node, record)
    _fields(node, record, ["value"])
    have, size = record["value"].size, numel(out)
    if have != size:
        raise eval_error(
            f"IR eval: const {node.id}: flat length mismatch: have {have}, expected {size}", node
        )


@_register(ops.ConvOp)
def _conv(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    record = _require(node, record)
    _fields(node, record, ["weight"], ["bias"])
    m = node.metadata()
    cout = m["out_channels"]
    expected = {
        "weight": (cout, m["in_channels"] // m["groups"], *m["kernel"]),
        "bias": (cout,),
    }
    for name, shape in expected.items():
        if name in record and record[name].shape != shape:
            raise eval_error(
                f"IR eval: conv {node.id}: payload does not match the node configuration: "
                f"{name} shape {fmt_shape(record[name].shape)} vs expected {fmt_shape(shape)}",
                node,
            )


@_register(ops.BatchNormEvalOp)
def _batch_norm(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    record = _require(node, record)
    per_channel = ["gamma", "beta", "mean", "var"]
    _fields(node, record, per_channel, ["eps"])
    for name in per_channel:
        _field_shape(node, record, name, (node.meta("channels"),))


@_register(ops.LayernormOp)
def _layernorm(node: NodeOp, parents: list[Shape], out: Shape, record: Record | None) -> None:
    """Optional record: without one gamma = 1, beta = 0, eps = 1e-5."""
    if record is None:
        return
    _fields(node, record, [], ["gamma", "beta", "eps"])
    suffix = parents[0][node.meta("axis") :]
    for name in ("gamma", "beta"):
        if name in record and record[name].shape != suffix:
            raise eval_error(
                f"IR eval: node {node.id}: layernorm payload shape "
                f"{fmt_shape(record[name].shape)} does not match normalized suffix "
                f"{fmt_shape(suffix)}",
                node,
            )
