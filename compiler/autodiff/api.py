"""`tlc.jvp`, `tlc.vjp`, `tlc.grad`: the autodiff entry points over a graph or a document.

`graph` is a `tl.graph` op (checked here) or a document (.tlir text or a parsed module, whose
only graph, or the one named by `name`, is used); `payload` is a Payload, an .npz path or
`{"1.weight": array}`, by default the document's inline payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.autodiff import modes
from tlc.dialect.ops import GraphOp
from tlc.payload import Payload

Source = GraphOp | ModuleOp | str


def resolve(graph: Source, payload: Any, name: str | None = None) -> tuple[GraphOp, Payload]:
    """The checked graph and its payload."""
    from tlc.evaluate import as_module, checked_graph, resolve_payload

    if isinstance(graph, GraphOp):
        module = graph.parent_op()
        if not isinstance(module, ModuleOp):
            module = ModuleOp([])
        return graph, resolve_payload(module, graph, Payload() if payload is None else payload)
    module = as_module(graph)
    chosen = checked_graph(module, name)
    return chosen, resolve_payload(module, chosen, payload)


def shaped(graph: GraphOp, value: Any, what: str) -> Any:
    """A flat list or array for a single-input graph, reshaped to the input's shape."""
    from tlc.evaluate import shape_input

    ids = modes.input_ids(graph)
    if len(ids) != 1 or isinstance(value, Mapping):
        return value
    declared = graph.nodes[ids[0]].declared_shape
    assert declared is not None, "checked graphs have every shape"
    return shape_input(np.asarray(value, dtype=np.float64), declared, what)


def jvp(
    graph: Source,
    payload: Any,
    x: Any,
    tangent: Any,
    param_tangents: Mapping[int, Mapping[str, Any]] | None = None,
    name: str | None = None,
) -> modes.Tangents:
    chosen, records = resolve(graph, payload, name)
    x, tangent = shaped(chosen, x, "input"), shaped(chosen, tangent, "tangent")
    return modes.jvp(chosen, records, x, tangent, param_tangents)


def vjp(
    graph: Source, payload: Any, x: Any, cotangent: Any = None, name: str | None = None
) -> modes.Cotangents:
    chosen, records = resolve(graph, payload, name)
    return modes.vjp(chosen, records, shaped(chosen, x, "input"), cotangent)


def grad(graph: Source, payload: Any = None, params: bool = True, name: str | None = None) -> Any:
    """(gradient graph, its payload, its output layout); see tlc.passes.grad."""
    from tlc.passes.grad import build_grad_graph

    chosen, records = resolve(graph, payload, name)
    return build_grad_graph(chosen, records, params)
