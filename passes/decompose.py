"""decompose: replace nodes by their op's decomposition into other ops.

An op kind may define itself by a decomposition (`NodeOp.decompose`, written in the emitter
vocabulary: `leaky_relu` is `max_elem(x, mul_elem(x, const s))` for slopes up to 1). The pass
rewrites each such node as the ops its decomposition emits, through the same `GraphEmitter` the
grad pass uses: the new nodes are appended in order, so node ids stay positions; constants the
decomposition creates get payload records under their new ids; the records of the other nodes
move to their new ids and the output follows its node.

By default every node whose op has a decomposition is rewritten; `missing-in=NAME` rewrites only
the ops the interpretation NAME has no rule for (NAME is a rule table's name, such as `torch` or
`interval`), which is how an interpretation falls back to the decomposition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.payload import Payload
from tlc.core.rule_table import TABLES
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp, PayloadOp
from tlc.dialect.payload_section import payload_from_module, payload_op
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.dialect.verify import graph_shapes
from tlc.semantics.emitter import GraphEmitter

Chooser = Callable[[type[NodeOp]], bool]


def decomposable(op_class: type[NodeOp]) -> bool:
    return op_class.defines("decompose")


class _Rewriter(GraphEmitter):
    """A GraphEmitter that also knows the shapes of copied nodes, which may be undeclared."""

    def __init__(self, block: Block, payload: Payload):
        super().__init__(block, payload)
        self.shapes: dict[int, Shape] = {}

    def copy(self, node: NodeOp, parents: list[NodeOp], shape: Shape) -> NodeOp:
        """`node` with its parents replaced and the next id; attributes and location kept."""
        mapper: dict[SSAValue, SSAValue] = {
            old: new.result for old, new in zip(node.parents, parents, strict=True)
        }
        copy = node.clone(value_mapper=mapper)
        copy.attributes["id"] = IntegerAttr(self.next_id(), i64)
        self.block.add_op(copy)
        self.shapes[self.next_id()] = shape
        self._next_id += 1
        return copy

    def shape(self, value: NodeOp) -> Shape:
        return self.shapes[value.id] if value.id in self.shapes else super().shape(value)


def decompose_graph(
    graph: GraphOp, payload: Payload | None, chosen: Chooser = decomposable
) -> tuple[GraphOp, Payload] | None:
    """`graph` with every node whose op has a decomposition and is `chosen` replaced by it, and
    the payload re-keyed to the new ids; None when no node qualifies (nothing to rewrite)."""
    if not any(decomposable(type(n)) and chosen(type(n)) for n in graph.nodes):
        return None
    payload = payload or Payload()
    shapes = graph_shapes(graph)
    rewritten = GraphOp(graph.graph_name, [])
    block = rewritten.body.block
    new_payload = Payload()
    em = _Rewriter(block, new_payload)
    value: list[NodeOp] = []
    for node in graph.nodes:
        parents = [value[pid] for pid in node.parent_ids()]
        if decomposable(type(node)) and chosen(type(node)):
            first = em.next_id()
            result = node.decompose(em, *parents)
            for part in list(block.ops)[first:]:
                part.location = node.location  # diagnostics point at the decomposed node
            got = em.shape(result)
            if got != shapes[node.id]:
                raise error(
                    f"decompose: the decomposition of {node.TAG} node {node.id} has shape "
                    f"{fmt_shape(got)}, expected {fmt_shape(shapes[node.id])}",
                    node,
                )
        else:
            result = em.copy(node, parents, shapes[node.id])
            if node.id in payload:
                new_payload.records[result.id] = payload[node.id]
                new_payload.kinds[result.id] = payload.kinds.get(node.id, node.TAG)
        value.append(result)
    output = graph.output
    assert output is not None and isinstance(output.value.owner, NodeOp), "checked graph"
    block.add_op(OutputOp(value[output.value.owner.id].result))
    return rewritten, new_payload


def missing_in(name: str) -> Chooser:
    """The ops the rule table `name` has no rule for (refused ones included)."""
    table = next((t for t in TABLES if t.what == name), None)
    if table is None:
        known = ", ".join(sorted(t.what for t in TABLES))
        raise DiagnosticError.simple(
            f"decompose: no interpretation named '{name}' (known: {known})"
        )
    return lambda op_class: op_class not in table


def load_tables() -> None:
    """Import the interpretations this layer may name, so their tables are in `TABLES`."""
    import tlc.semantics.autodiff.rules
    import tlc.semantics.ibp
    import tlc.semantics.reference
    import tlc.semantics.torch_kernels  # noqa: F401


@dataclass(frozen=True)
class DecomposePass(ModulePass):
    """Replace nodes by their op's decomposition (see the module doc); `missing-in=NAME` only
    those the interpretation NAME has no rule for."""

    name = "decompose"

    missing_in: str = ""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        chosen: Chooser = decomposable
        if self.missing_in:
            load_tables()
            chosen = missing_in(self.missing_in)
        for graph in [g for g in op.ops if isinstance(g, GraphOp)]:
            done = decompose_graph(graph, payload_from_module(op, graph.graph_name), chosen)
            if done is None:
                continue
            rewritten, payload = done
            op.body.block.insert_op_before(rewritten, graph)
            op.body.block.erase_op(graph)
            sections = [
                p for p in op.ops if isinstance(p, PayloadOp) and p.graph_name == graph.graph_name
            ]
            if len(payload):
                new_section = payload_op(graph.graph_name, payload)
                if sections:
                    op.body.block.insert_op_before(new_section, sections[0])
                else:
                    op.body.block.insert_op_after(new_section, rewritten)
            for section in sections:
                op.body.block.erase_op(section)
