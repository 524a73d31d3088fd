"""grad: write a graph's reverse pass as a new tl graph, `@name_grad`, with its payload.

The gradient graph starts with the forward nodes (same ids, same payload records), then the
cotangent nodes the VJP rules emit (tlc.semantics.autodiff.rules through a GraphEmitter:
forward ops plus the few ops of tlc.dialect.backward_ops), seeded with ones at the output. A tl
graph selects one output, so the gradient graph's output is one flat vector, the concatenation of

    [ output, d input, d param_1, d param_2, ... ]

each flattened row-major: the forward output, the cotangent of the input node (of each input node,
in id order) and, unless `params=false`, the cotangent of every differentiated payload field in
node order then field order (`%1.weight`, `%1.bias`, `%3.weight`, ...;
`tlc.semantics.autodiff.rules.PARAMS`).
`GradLayout` names the pieces and cuts the vector back apart. Seeding with ones makes the pieces
the gradient of the output for a scalar output, and of the output's sum otherwise.

The payload of `@name_grad` is the forward payload plus the records of the new nodes (constants
such as kernels and batch-norm scales, transposed linear weights), so the pass needs the
forward payload: it reads the document's inline `tl.payload @name`. From Python,
`build_grad_graph(graph, payload)` takes any payload.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr
from xdsl.passes import ModulePass

from tlc.core.diagnostics import error
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.batch import has_batch
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp
from tlc.dialect.payload_section import payload_from_module, payload_op
from tlc.dialect.shapes import Shape, numel
from tlc.dialect.verify import graph_shapes
from tlc.semantics.autodiff.modes import backprop, input_ids, output_id, param_fields
from tlc.semantics.emitter import GraphEmitter
from tlc.semantics.payload_check import prepare_records


@dataclass(frozen=True)
class GradLayout:
    """The pieces of a gradient graph's output vector: (label, shape) in order."""

    pieces: tuple[tuple[str, Shape], ...]

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """`{"output": ..., "input": ..., "%1.weight": ...}` from the output vector."""
        result, start = {}, 0
        for label, shape in self.pieces:
            size = numel(shape)
            result[label] = np.asarray(flat[start : start + size]).reshape(shape)
            start += size
        return result


def build_grad_graph(
    graph: GraphOp, payload: Payload | None, params: bool = True, name: str | None = None
) -> tuple[GraphOp, Payload, GradLayout]:
    """The gradient graph of `graph` (checked first), its payload and its output layout."""
    payload = payload or Payload()
    if has_batch(graph):
        raise error(
            f"grad: graph @{graph.graph_name} has the batch extent N; a gradient graph is built "
            "for one batch size (write it, or import the model, with a fixed batch)",
            graph,
        )
    shapes = graph_shapes(graph)
    records = prepare_records(graph, payload, np.float64, shapes)
    grad = graph.clone()
    grad.sym_name = StringAttr(name or f"{graph.graph_name}_grad")
    for node, shape in zip(grad.nodes, shapes, strict=True):
        if node.declared_shape is None:
            node.set_declared_shape(shape)
    old_output = grad.output
    assert old_output is not None, "checked graphs have an output"
    old_output.detach()
    old_output.erase()
    grad_payload = Payload({nid: dict(rec) for nid, rec in payload.items()}, dict(payload.kinds))
    em = GraphEmitter(grad.body.block, grad_payload)
    forward: list[NodeOp] = grad.nodes
    out = output_id(graph)
    inputs, cotangents = backprop(em, graph, forward, em.full(shapes[out], 1.0), records)

    pieces: list[tuple[str, NodeOp]] = [("output", forward[out])]
    ids = input_ids(graph)
    for nid in ids:
        label = "input" if len(ids) == 1 else f"input %{nid}"
        ct = inputs.get(nid)
        pieces.append((label, em.full(shapes[nid], 0.0) if ct is None else ct))
    if params:
        for nid, field in param_fields(graph, records):
            ct = cotangents.get(nid, {}).get(field)
            zeros = em.full(records[nid][field].shape, 0.0) if ct is None else ct
            pieces.append((f"%{nid}.{field}", zeros))
    flat = [em.reshape(v, (numel(em.shape(v)),)) for _, v in pieces]
    packed = flat[0] if len(flat) == 1 else em.bind(ops.ConcatOp, flat, {"axis": 0})
    grad.body.block.add_op(OutputOp(packed.result))
    layout = GradLayout(tuple((label, em.shape(v)) for label, v in pieces))
    return grad, _drop_dead(grad, len(forward), grad_payload), layout


def _drop_dead(grad: GraphOp, first: int, payload: Payload) -> Payload:
    """Erase the backward nodes (ids >= first) the output does not read, such as parameter
    cotangents under `params=false`, renumber the rest densely; return the re-keyed payload."""
    output = grad.output
    assert output is not None and isinstance(output.value.owner, NodeOp)
    live: set[int] = set()
    stack = [output.value.owner]
    while stack:
        node = stack.pop()
        if node.id not in live:
            live.add(node.id)
            stack.extend(p.owner for p in node.parents if isinstance(p.owner, NodeOp))
    for node in reversed(grad.nodes):
        if node.id >= first and node.id not in live:
            grad.body.block.erase_op(node)
    kept = Payload()
    for new_id, node in enumerate(grad.nodes):
        if node.id in payload:
            kept.records[new_id] = payload[node.id]
            kept.kinds[new_id] = payload.kinds.get(node.id, node.TAG)
        node.attributes["id"] = IntegerAttr(new_id, 64)
    return kept


@dataclass(frozen=True)
class GradPass(ModulePass):
    """Add `@name_grad` (forward output and VJP, see the module doc) for each graph, or only
    for `graph`; `params=false` leaves the parameter cotangents out of the output."""

    name = "grad"

    graph: str = ""
    params: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        graphs = [g for g in op.ops if isinstance(g, GraphOp)]
        wanted = self.graph.removeprefix("@")
        chosen = [g for g in graphs if not wanted or g.graph_name == wanted]
        if wanted and not chosen:
            raise error(f"grad: no graph named @{wanted} in the module", op)
        names = {g.graph_name for g in graphs}
        built = []
        for graph in chosen:
            target = f"{graph.graph_name}_grad"
            if target in names:
                raise error(f"grad: the module already has a graph @{target}", graph)
            payload = payload_from_module(op, graph.graph_name)
            built.append(build_grad_graph(graph, payload, self.params, target))
        for grad, payload, _ in built:
            op.body.block.add_op(grad)
            if len(payload):
                op.body.block.add_op(payload_op(grad.graph_name, payload))
