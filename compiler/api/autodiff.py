"""`tlc.jvp`, `tlc.vjp`, `tlc.grad`: the autodiff entry points over a graph or a document.

`graph` is a `tl.graph` op (checked here) or a document (.tlir text or a parsed module, whose
only graph, or the one named by `name`, is used); `payload` is a Payload, an .npz path or
`{"1.weight": array}`, by default the document's inline payload.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from tlc.api.evaluate import shape_single_input
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.dialect.shapes import fmt_shape
from tlc.semantics.autodiff import modes
from tlc.semantics.program import Traced

Source = GraphOp | ModuleOp | str | os.PathLike[str] | Traced


def resolve(graph: Source, payload: Any, name: str | None = None) -> tuple[GraphOp, Payload]:
    """The checked graph and its payload."""
    from tlc.api.evaluate import choose, resolve_payload

    if isinstance(graph, GraphOp):
        module = graph.parent_op()
        if not isinstance(module, ModuleOp):
            module = ModuleOp([])
        return graph, resolve_payload(module, graph, Payload() if payload is None else payload)
    return choose(graph, name, payload)


def jvp(
    graph: Source,
    payload: Any,
    x: Any,
    tangent: Any,
    param_tangents: Mapping[int, Mapping[str, Any]] | None = None,
    name: str | None = None,
) -> modes.Tangents:
    chosen, records = resolve(graph, payload, name)
    x = shape_single_input(chosen, x, "input")
    tangent = shape_single_input(chosen, tangent, "tangent")
    return modes.jvp(chosen, records, x, tangent, param_tangents)


def vjp(
    graph: Source, payload: Any, x: Any, cotangent: Any = None, name: str | None = None
) -> modes.Cotangents:
    chosen, records = resolve(graph, payload, name)
    if cotangent is None:
        out = chosen.nodes[modes.output_id(chosen)]
        if out.declared_shape != ():
            raise ValueError(
                f"tlc.vjp: the output (node {out.id}) of @{chosen.graph_name} has shape "
                f"{fmt_shape(out.declared_shape)}; pass a cotangent of that shape (without one, "
                "vjp is the gradient of a scalar output)"
            )
    return modes.vjp(chosen, records, shape_single_input(chosen, x, "input"), cotangent)


def grad(graph: Source, payload: Any = None, params: bool = True, name: str | None = None) -> Any:
    """(gradient graph, its payload, its output layout); see tlc.passes.grad."""
    from tlc.passes.grad import build_grad_graph

    chosen, records = resolve(graph, payload, name)
    return build_grad_graph(chosen, records, params)
