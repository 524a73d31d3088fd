"""Forward and reverse mode over a whole graph: `jvp`, `vjp`, and `backprop` (shared with `grad`).

Forward mode folds over the nodes in order, pushing tangents through each node's JVP rule; a node
none of whose parents (or parameters) carries a tangent gets none, so only the part of the graph
that depends on what moves is differentiated. Reverse mode runs the forward pass once (the value
table is the tape: every rule reads the forward values it needs from it), then walks the nodes
backwards from the output, applying each node's VJP rule to its cotangent and accumulating
(adding) cotangents where a value feeds several consumers (fan-out).

Parameter (co)tangents are keyed like the payload: node id -> field -> array, for the fields
`rules.PARAMS` lists (linear/conv weight and bias, layernorm gamma/beta, batch norm
gamma/beta/mean/var, const value); `eps` is never differentiated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np

from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.payload import Payload, Record
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.dialect.verify import graph_shapes
from tlc.semantics.autodiff.rules import JVP, PARAMS, VJP
from tlc.semantics.emitter import Emitter, NumpyEmitter
from tlc.semantics.interpret import REFERENCE, interpret
from tlc.semantics.payload_check import prepare_records

V = TypeVar("V")
ParamArrays = Mapping[int, Mapping[str, Any]]


class Tangents(NamedTuple):
    """`jvp`'s result: the output and its tangent."""

    output: np.ndarray
    tangent: np.ndarray


class Cotangents(NamedTuple):
    """`vjp`'s result: the input's cotangent (a dict by input node id where the input was given
    as one, or the graph has several input nodes) and the parameters' cotangents, keyed like
    the payload."""

    input: Any
    params: Payload


def not_differentiable(node: NodeOp) -> DiagnosticError:
    return error(
        f"autodiff: cannot differentiate through {node.TAG} (node {node.id}): "
        f"{VJP.unsupported[type(node)]}",
        node,
    )


def output_id(graph: GraphOp) -> int:
    output = graph.output
    assert output is not None and isinstance(output.value.owner, NodeOp), "checked graph"
    return output.value.owner.id


def input_ids(graph: GraphOp) -> list[int]:
    return [n.id for n in graph.nodes if isinstance(n, ops.InputOp)]


def _per_input(graph: GraphOp, value: Any, what: str) -> dict[int, np.ndarray]:
    """`value` for a single-input graph, or a mapping input node id -> array."""
    ids = input_ids(graph)
    given = dict(value) if isinstance(value, Mapping) else dict.fromkeys(ids[:1], value)
    if len(ids) > 1 and not isinstance(value, Mapping):
        raise DiagnosticError.simple(
            f"{what}: graph @{graph.graph_name} has {len(ids)} input nodes; "
            "give a mapping from input node id to array"
        )
    return {i: np.asarray(given[i], dtype=np.float64) for i in ids if i in given}


def _check_shape(what: str, got: Shape, expected: Shape) -> None:
    if got != expected:
        raise DiagnosticError.simple(
            f"{what}: shape {fmt_shape(got)} does not match {fmt_shape(expected)}"
        )


def _check_param_tangents(graph: GraphOp, records: dict[int, Record], given: ParamArrays) -> None:
    nodes = graph.nodes
    for nid, fields in given.items():
        known = PARAMS.get(type(nodes[nid])) if 0 <= nid < len(nodes) else None
        for name, value in fields.items():
            if known is None or name not in known or name not in records.get(nid, {}):
                raise DiagnosticError.simple(f"jvp: node {nid} has no parameter '{name}'")
            _check_shape(f"jvp: tangent of {nid}.{name}", np.shape(value), records[nid][name].shape)


def jvp(
    graph: GraphOp,
    payload: Payload | None,
    x: Any,
    tangent: Any,
    param_tangents: ParamArrays | None = None,
) -> Tangents:
    """The output at x and its directional derivative along (tangent, param_tangents)."""
    table = interpret(graph, payload, x)
    shapes = graph_shapes(graph)
    records = prepare_records(graph, payload or Payload(), np.float64, shapes)
    given = param_tangents or {}
    _check_param_tangents(graph, records, given)
    seeds = _per_input(graph, tangent, "jvp")
    em = NumpyEmitter(REFERENCE)
    tangents: list[np.ndarray | None] = []
    for node in graph.nodes:
        tangents.append(_push(em, node, table.values, tangents, seeds, records, given))
    out = output_id(graph)
    moved = tangents[out]
    return Tangents(table.output, np.zeros_like(table.output) if moved is None else moved)


def _push(
    em: NumpyEmitter,
    node: NodeOp,
    values: list[np.ndarray],
    tangents: list[np.ndarray | None],
    seeds: dict[int, np.ndarray],
    records: dict[int, Record],
    given: ParamArrays,
) -> np.ndarray | None:
    """One node's tangent, or None where nothing it depends on moves."""
    if node.id in seeds:
        what = f"jvp: tangent of input {node.id}"
        _check_shape(what, seeds[node.id].shape, values[node.id].shape)
        return seeds[node.id]
    pids = node.parent_ids()
    rt = {k: np.asarray(v, dtype=np.float64) for k, v in given.get(node.id, {}).items()}
    if all(tangents[p] is None for p in pids) and not rt:
        return None
    rule = JVP.get(type(node))
    if rule is None:
        raise not_differentiable(node)
    ts = [np.zeros_like(values[p]) if tangents[p] is None else tangents[p] for p in pids]
    ins = [values[p] for p in pids]
    return np.asarray(rule(em, node, ins, values[node.id], ts, records.get(node.id), rt))


def backprop(
    em: Emitter[V], graph: GraphOp, values: list[V], seed: V, records: dict[int, Record]
) -> tuple[dict[int, V], dict[int, dict[str, V]]]:
    """Cotangents of the input nodes and of the parameters, from `seed` at the output.

    Works in either emitter: numerically (values are the value table) or as graph nodes
    (values are the forward nodes of a gradient graph).
    """
    cotangents: dict[int, V] = {output_id(graph): seed}
    inputs: dict[int, V] = {}
    params: dict[int, dict[str, V]] = {}
    for node in reversed(graph.nodes):
        g = cotangents.pop(node.id, None)
        if g is None:
            continue
        if isinstance(node, ops.InputOp):
            inputs[node.id] = g
            continue
        rule = VJP.get(type(node))
        if rule is None:
            raise not_differentiable(node)
        pids = node.parent_ids()
        record = records.get(node.id)
        ins = [values[p] for p in pids]
        to_parents, to_params = rule(em, node, ins, values[node.id], g, record)
        for pid, ct in zip(pids, to_parents, strict=True):
            if ct is not None:
                cotangents[pid] = em.add(cotangents[pid], ct) if pid in cotangents else ct
        if to_params:
            assert record is not None, "parameter cotangents come from payload-reading nodes"
            params[node.id] = {k: em.reshape(v, record[k].shape) for k, v in to_params.items()}
    return inputs, params


def param_fields(graph: GraphOp, records: dict[int, Record]) -> list[tuple[int, str]]:
    """Every differentiated parameter, (node id, field), in node then `PARAMS` order."""
    return [
        (node.id, name)
        for node in graph.nodes
        for name in PARAMS.get(type(node), ())
        if name in records.get(node.id, {})
    ]


def vjp(graph: GraphOp, payload: Payload | None, x: Any, cotangent: Any = None) -> Cotangents:
    """Cotangents of the input and parameters for `cotangent` at the output (default: ones,
    which for a scalar output is the gradient)."""
    table = interpret(graph, payload, x)
    records = prepare_records(graph, payload or Payload(), np.float64, graph_shapes(graph))
    out = table.output
    seed = np.ones_like(out) if cotangent is None else np.asarray(cotangent, dtype=np.float64)
    _check_shape("vjp: cotangent", seed.shape, out.shape)
    inputs, params = backprop(NumpyEmitter(REFERENCE), graph, table.values, seed, records)
    by_input = {i: inputs.get(i, np.zeros_like(table[i])) for i in input_ids(graph)}
    result = Payload()
    for nid, name in param_fields(graph, records):
        value = params.get(nid, {}).get(name)
        result.records.setdefault(nid, {})[name] = (
            np.zeros_like(records[nid][name]) if value is None else value
        )
        result.kinds[nid] = graph.nodes[nid].TAG
    if isinstance(x, Mapping) or len(by_input) != 1:
        return Cotangents(by_input, result)
    return Cotangents(next(iter(by_input.values())), result)
