"""What running a document needs besides the denotation: choosing the graph, its payload, its input.

Shared by `tlc.run` and the `tlc-run` tool (and by any other scalar context run over a parsed
document, such as interval bound propagation), so both accept the same things and report the
same diagnostics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.core.diagnostics import DiagnosticError
from tlc.core.npyio import read_npy
from tlc.core.payload import Payload, load_npz
from tlc.dialect.ops import GraphOp, InputOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.shapes import fmt_shape, numel
from tlc.frontends.text import parse_source

if TYPE_CHECKING:
    from tlc.semantics.interpret import ValueTable


def as_module(source: str | ModuleOp, filename: str = "<string>") -> ModuleOp:
    """A parsed module: `source` is a module already or .tlir text."""
    if isinstance(source, ModuleOp):
        return source
    return parse_source(source, filename)


def select_graph(module: ModuleOp, name: str | None = None) -> GraphOp:
    """The graph `@name` (the leading `@` is optional), or the only graph of the module."""
    graphs = [op for op in module.walk() if isinstance(op, GraphOp)]
    if name is None:
        if len(graphs) != 1:
            names = ", ".join(f"@{g.graph_name}" for g in graphs) or "none"
            raise DiagnosticError.simple(
                f"the document has {len(graphs)} graphs ({names}); choose one with --graph @name"
            )
        return graphs[0]
    wanted = name.removeprefix("@")
    for graph in graphs:
        if graph.graph_name == wanted:
            return graph
    raise DiagnosticError.simple(f"no graph named @{wanted} in the document")


def checked_graph(module: ModuleOp, name: str | None = None) -> GraphOp:
    """The graph to run (see `select_graph`), checked as verify-structure and infer-shapes
    would, with omitted shapes filled in. Other graphs of the document are left alone, so one
    broken graph does not stop its neighbours from running."""
    from tlc.dialect.verify import infer_graph_shapes

    graph = select_graph(module, name)
    for node, shape in zip(graph.nodes, infer_graph_shapes(graph), strict=True):
        if node.declared_shape is None:
            node.set_declared_shape(shape)
    return graph


def resolve_payload(
    module: ModuleOp, graph: GraphOp, payload: Payload | Mapping[str, Any] | str | None
) -> Payload:
    """The payload to run with: the given one (a Payload, an .npz path or `{"1.weight": ...}`),
    else the document's inline `tl.payload` section for the graph."""
    if payload is None:
        return payload_from_module(module, graph.graph_name)
    if isinstance(payload, Payload):
        return payload
    if isinstance(payload, str | os.PathLike):
        return load_npz(os.fspath(payload))
    return Payload.from_flat(payload)


def choose(
    source: str | ModuleOp, graph: str | None, payload: Payload | Mapping[str, Any] | str | None
) -> tuple[GraphOp, Payload]:
    """Parse `source` if it is text, then the checked graph `graph` (see `checked_graph`) and the
    payload to run it with (see `resolve_payload`): what every Python entry point starts with."""
    module = as_module(source)
    chosen = checked_graph(module, graph)
    return chosen, resolve_payload(module, chosen, payload)


def dtype_of(arithmetic: str) -> type:
    """The numpy scalar type of `arithmetic` (f64, f32). A Python API argument, so a bad name is
    a ValueError listing the choices, not a diagnostic about the document."""
    from tlc.semantics.interpret import DTYPES

    if arithmetic not in DTYPES:
        raise ValueError(f"arithmetic must be one of {', '.join(DTYPES)}, got {arithmetic!r}")
    return DTYPES[arithmetic]


def parse_input_text(text: str) -> np.ndarray:
    """`--input` values: a comma-separated list of numbers, or the path of a `.npy` file."""
    if text.endswith(".npy"):
        return read_npy(text, "input").astype(np.float64)
    items = [item.strip() for item in text.split(",")]
    values = []
    for i, item in enumerate(items):
        try:
            values.append(float(item))
        except ValueError:
            raise DiagnosticError.simple(f"--input: item {i} ('{item}') is not a number") from None
    return np.array(values, dtype=np.float64)


def shape_input(value: np.ndarray, shape: tuple[int, ...], what: str = "--input") -> np.ndarray:
    """A flat list of numbers reshaped to the input node's shape (row-major), if the count fits."""
    if value.shape == shape:
        return value
    if value.ndim == 1 and value.size == int(np.prod(shape)):
        return value.reshape(shape)
    got = f"{value.size}" if value.ndim == 1 else f"an array of shape {fmt_shape(value.shape)}"
    raise DiagnosticError.simple(
        f"{what}: expected {numel(shape)} values for input shape {fmt_shape(shape)}, got {got}"
    )


def shape_single_input(graph: GraphOp, x: Any, what: str = "input") -> Any:
    """`x` for a graph with one input node, a flat list reshaped to that node's shape (see
    `shape_input`); the other forms (a list per input, `{node id: value}`) pass unchanged."""
    inputs = [n for n in graph.nodes if isinstance(n, InputOp)]
    if len(inputs) != 1 or isinstance(x, Mapping):
        return x
    declared = inputs[0].declared_shape
    assert declared is not None, "infer-shapes fills in every shape"
    return shape_input(np.asarray(x, dtype=np.float64), declared, what)


def prepare(
    source: str | ModuleOp,
    x: Any,
    payload: Payload | Mapping[str, Any] | str | None,
    graph: str | None,
) -> tuple[GraphOp, Payload, Any]:
    """Check the document, choose the graph and its payload, and shape a flat single input: the
    common start of `tlc.run`, `tlc.ibp` and `tlc.check_samples`."""
    chosen, records = choose(source, graph, payload)
    return chosen, records, shape_single_input(chosen, x)


def run(
    source: str | ModuleOp,
    x: Any,
    payload: Payload | Mapping[str, Any] | str | None = None,
    arithmetic: str = "f64",
    graph: str | None = None,
) -> ValueTable:
    """`tlc.run`: check the document, then evaluate graph `graph` on `x` in `arithmetic`.

    `x` is the input value (a flat list is reshaped to the input node's shape), or for a graph
    with several input nodes a list (in node order) or `{node id: value}`.
    """
    from tlc.semantics.interpret import interpret

    dtype = dtype_of(arithmetic)
    chosen, records, x = prepare(source, x, payload, graph)
    return interpret(chosen, records, x, dtype)
