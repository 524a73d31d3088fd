"""Printers for a module of `tl` ops: .tlir text, TorchLean's listing, GraphViz dot, MLIR form.

`print_tlir` is the inverse of `parse_tlir`: printing then parsing gives the same module. Fields
equal to their default are left out, as a user would write them.
"""

from __future__ import annotations

import io
import math

import numpy as np
from xdsl.dialects.builtin import AnyFloat, DenseIntOrFPElementsAttr, Float64Type, ModuleOp
from xdsl.ir import Attribute, Operation
from xdsl.printer import Printer

from tlc.dialect.metadata import fmt_value
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp, PayloadOp, RecordOp
from tlc.dialect.plan import fmt_policy, kernel_of, policy_of, quote
from tlc.dialect.program_ops import ParamsOp, ProgramOp
from tlc.dialect.program_printer import params_tlir, program_tlir
from tlc.dialect.shapes import fmt_shape


def print_tlir(module: ModuleOp) -> str:
    chunks = []
    for op in module.ops:
        if isinstance(op, GraphOp):
            chunks.append(_graph_tlir(op))
        elif isinstance(op, PayloadOp):
            chunks.append(_payload_tlir(op))
        elif isinstance(op, ProgramOp):
            chunks.append(program_tlir(op))
        elif isinstance(op, ParamsOp):
            chunks.append(params_tlir(op))
        else:
            chunks.append(print_mlir_op(op))
    return "\n".join(chunks)


def _graph_tlir(graph: GraphOp) -> str:
    policy = policy_of(graph)
    header = f" kernel_policy {fmt_policy(policy)}" if policy is not None else ""
    lines = [f"tl.graph @{graph.graph_name}{header} {{"]
    # The text after a node's operands depends only on its kind, result type and attributes
    # other than the id, which a large graph shares among many nodes (attributes and types are
    # immutable values built once per value): each such combination is formatted once. Keys are
    # object ids, which stay valid while the graph holds the objects.
    tails: dict[tuple[object, ...], str] = {}
    output: OutputOp | None = None
    for node in graph.body.block.ops:  # the nodes, and the first output
        if not isinstance(node, NodeOp):
            if output is None and isinstance(node, OutputOp):
                output = node
            continue
        (result,) = node.results
        attributes = [(name, id(a)) for name, a in node.attributes.items() if name != "id"]
        key = (type(node), id(result.type), *attributes)
        tail = tails.get(key)
        if tail is None:
            tail = tails[key] = _node_tail(node)
        lines.append(f"  {_node_head(node)}{tail}")
    if output is not None:
        lines.append(f"  output %{_value_id(output.value.owner)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _value_id(owner: object) -> int:
    assert isinstance(owner, NodeOp)
    return owner.id


def node_tlir(node: NodeOp) -> str:
    return _node_head(node) + _node_tail(node)


def _node_head(node: NodeOp) -> str:
    """`%3 = add(%1, %2)`: the node up to its operands."""
    text = f"%{node.id} = {node.TAG}"
    if node.operands or node.ARITY[0] > 0:
        text += "(" + ", ".join([f"%{pid}" for pid in node.parent_ids()]) + ")"
    return text


def _node_tail(node: NodeOp) -> str:
    """` {axis = 1} : [8, 16]`: the node's metadata, shape and kernel."""
    text = ""
    declared = node.declared_shape
    if node.FIELDS:
        fields = _non_default_fields(node, declared)
        if fields:
            text += " {" + ", ".join(f"{name} = {value}" for name, value in fields) + "}"
    if declared is not None:
        text += f" : {fmt_shape(declared)}"
    kernel = kernel_of(node)
    if kernel is not None:
        text += f" kernel {quote(kernel)}"
    return text


def _non_default_fields(node: NodeOp, declared: tuple[int, ...] | None) -> list[tuple[str, str]]:
    values = node.metadata()
    shown: list[tuple[str, str]] = []
    seen: dict[str, object] = {}
    for f in node.FIELDS:
        value = values[f.name]
        default = f.default_value(seen, declared)
        seen[f.name] = value
        if default is None or tuple_or(value) != tuple_or(default):
            shown.append((f.name, fmt_value(f, value)))
    return shown


def tuple_or(value: object) -> object:
    return tuple(value) if isinstance(value, list | tuple) else value


def _payload_tlir(payload: PayloadOp) -> str:
    lines = [f"tl.payload @{payload.graph_name} {{"]
    lines.extend(f"  {_record_tlir(r)}" for r in payload.records)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _record_tlir(record: RecordOp) -> str:
    fields = ", ".join(
        f"{name} = {_array_text(dense_to_numpy(attr))}"
        for name, attr in record.fields.data.items()
        if isinstance(attr, DenseIntOrFPElementsAttr)
    )
    return f"%{record.node.value.data} = {record.kind.data} {{{fields}}}"


def dense_to_numpy(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The attribute's values as a float64 array (a copy, so callers may write to it); f64 data
    is read straight from the attribute's bytes."""
    shape = attr.get_shape()
    data = attr.data.data
    if isinstance(attr.get_element_type(), Float64Type) and len(data) == 8 * math.prod(shape):
        return np.frombuffer(data, dtype="<f8").astype(np.float64).reshape(shape)
    return np.array(attr.get_values(), dtype=np.float64).reshape(shape)


def _array_text(array: np.ndarray) -> str:
    if array.ndim == 0:
        return _float_text(float(array))
    return "[" + ", ".join(_array_text(row) for row in array) + "]"


def _float_text(x: float) -> str:
    """Shortest text that reads back as the same float64."""
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def print_listing(graph: GraphOp) -> str:
    """TorchLean's `Graph.pretty`: `1: linear(payload=node_id) parents=[0] out=[5]`."""
    return "\n".join(
        f"{n.id}: {n.describe()} parents={fmt_shape(n.parent_ids())} "
        f"out={fmt_shape(n.declared_shape)}"
        for n in graph.nodes
    )


def print_dot(graph: GraphOp) -> str:
    """TorchLean's `Graph.toDot`: boxes `id: describe\\nout=shape`, edges producer -> consumer."""

    def escape(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = [(n.id, f"{n.id}: {n.describe()}", fmt_shape(n.declared_shape)) for n in graph.nodes]
    lines = [f'  n{i} [label="{escape(head)}\\nout={escape(out)}"];' for i, head, out in labels]
    lines += [f"  n{pid} -> n{n.id};" for n in graph.nodes for pid in n.parent_ids()]
    return (
        "digraph IR {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n"
        + "\n".join(lines)
        + "\n}\n"
    )


def print_mlir_op(op: Operation, debuginfo: bool = False) -> str:
    """MLIR's generic form, by xDSL's printer (readable back by xDSL and MLIR tools)."""
    buf = io.StringIO()
    _RoundTripPrinter(stream=buf, print_generic_format=True, print_debuginfo=debuginfo).print_op(op)
    return buf.getvalue() + "\n"


class _RoundTripPrinter(Printer):
    """xDSL's printer, with f64 payload values that xDSL's parser reads back exactly.

    xDSL 0.75 prints a float whose `%.17g` form has no point (1000001.0, 1e+300, inf) as a bare
    hex bit pattern, and its parser reads that back as an integer *value*. Finite values get the
    shortest decimal with a point instead; tensors holding inf or nan are printed in MLIR's
    hex-string form `dense<"0x...">`, which both read as raw little-endian bytes.
    """

    def print_float(self, value: float, type: AnyFloat) -> None:
        if not (isinstance(type, Float64Type) and math.isfinite(value)):
            super().print_float(value, type)
            return
        short = f"{value:.5e}".replace("e", "0e", 1)  # xDSL's and mlir-opt's usual form
        if float(short) == value:
            self.print_string(short)
            return
        mantissa, _, exponent = repr(value).partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        self.print_string(mantissa + (f"e{exponent}" if exponent else ""))

    def print_attribute(self, attribute: Attribute) -> None:
        if (
            isinstance(attribute, DenseIntOrFPElementsAttr)
            and isinstance(attribute.get_element_type(), Float64Type)
            and not all(math.isfinite(v) for v in attribute.get_values())
        ):
            self.print_string(f'dense<"0x{attribute.data.data.hex().upper()}"> : ')
            self.print_attribute(attribute.type)
            return
        super().print_attribute(attribute)
