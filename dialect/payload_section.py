"""The inline payload section: `tl.payload @graph { records }` to and from a `Payload`."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, ModuleOp

from tlc.core.diagnostics import error
from tlc.core.payload import Payload, Record
from tlc.dialect.ops import PayloadOp, RecordOp
from tlc.dialect.printer import dense_to_numpy


def payload_from_module(module: ModuleOp, graph_name: str) -> Payload:
    """The inline `tl.payload @graph_name` section (empty if there is none)."""
    payload = Payload()
    for op in module.ops:
        if isinstance(op, PayloadOp) and op.graph_name == graph_name:
            for record in op.records:
                nid = record.node.value.data
                if nid in payload.records:
                    raise error(f"duplicate payload record for node {nid}", record)
                payload.records[nid] = {
                    name: dense_to_numpy(attr)
                    for name, attr in record.fields.data.items()
                    if isinstance(attr, DenseIntOrFPElementsAttr)
                }
                payload.kinds[nid] = record.kind.data
    return payload


def payload_op(graph_name: str, payload: Payload) -> PayloadOp:
    """The inline `tl.payload @graph_name` section holding `payload`, the inverse of
    `payload_from_module`: records in node id order, each with its remembered kind (else
    `const`). Importers and the grad pass use it to put a built payload in the document."""
    return PayloadOp(
        graph_name,
        [
            RecordOp(nid, payload.kinds.get(nid, "const"), record_attrs(payload[nid]))
            for nid in sorted(payload)
        ],
    )


def record_attrs(record: Record) -> dict[str, DenseIntOrFPElementsAttr]:
    """A payload record as the dense f64 attributes of a `tl.record` op."""
    from tlc.dialect.parser import dense_attr  # the parser (lark) loads only when needed

    return {name: dense_attr(np.asarray(v).tolist(), name, None) for name, v in record.items()}
