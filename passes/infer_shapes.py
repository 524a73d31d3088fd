"""infer-shapes: TorchLean's `Graph.checkShapes`, which also fills in omitted shapes.

Runs the structure check first, then each node's shape rule on its parents' inferred shapes. A
declared shape must equal the inferred one; an omitted shape (`!tl.unshaped`) is filled in. The
IR is changed only once every graph of the module has checked out, so a failing run never leaves
half-inferred IR behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.dialect.ops import GraphOp
from tlc.dialect.shapes import Shape
from tlc.dialect.verify import infer_graph_shapes, run_on_graphs


@dataclass(frozen=True)
class InferShapesPass(ModulePass):
    """Check every node's declared shape against its op's rule; fill in omitted shapes.

    `fill=false` only checks (TorchLean's `checkShapes`), leaving omitted shapes omitted.
    """

    name = "infer-shapes"
    fill: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        results: list[tuple[GraphOp, list[Shape]]] = []

        def check(graph: GraphOp) -> None:
            results.append((graph, infer_graph_shapes(graph)))

        run_on_graphs(op, check)
        if not self.fill:
            return
        for graph, shapes in results:
            for node, shape in zip(graph.nodes, shapes, strict=True):
                if node.declared_shape is None:
                    node.set_declared_shape(shape)
