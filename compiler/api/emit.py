"""Output formats of `tlc-opt --emit` and `tlc-translate`, by name."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import ModuleOp

from tlc.dialect.ops import GraphOp
from tlc.dialect.printer import print_dot, print_listing, print_mlir_op, print_tlir


def _per_graph(render: Callable[[GraphOp], str]) -> Callable[[ModuleOp], str]:
    def emit(module: ModuleOp) -> str:
        graphs = [op for op in module.ops if isinstance(op, GraphOp)]
        if len(graphs) == 1:
            return render(graphs[0]).rstrip("\n") + "\n"
        return "\n".join(f"// @{g.graph_name}\n{render(g).rstrip()}\n" for g in graphs)

    return emit


def _plan(graph: GraphOp) -> str:
    """The kernel plan in the seed's form (tlc.semantics.capsules, imported only when asked
    for: the kernel registry costs start-up time every other format does without)."""
    from tlc.semantics.capsules import plan_text

    return plan_text(graph)


EMITTERS: dict[str, Callable[[ModuleOp], str]] = {
    "tlir": print_tlir,
    "mlir": lambda module: print_mlir_op(module, debuginfo=False),
    "listing": _per_graph(print_listing),
    "dot": _per_graph(print_dot),
    "plan": _per_graph(_plan),
}
"""The formats of tlc-opt and tlc-translate that need no target; tlc-opt adds `llvm` and `asm`
(tlc.tools.opt, which compiles for the --target-* options)."""
