"""select-kernels: plan an admissible kernel capsule for every node that needs runtime work.

Options (xDSL pass fields): `device` (default cpu), `provider` (`auto`, `prefer:P`, `only:P`;
default auto, which prefers the reference denotation, then llvm, then torch) and
`allow-trusted-external` (default false). The plan is metadata: a `tl.kernel` attribute per
planned node and the policy on the graph (`tlc.dialect.plan`). Every graph is planned before
the IR changes, so a node without an admissible capsule leaves the module untouched; the error is
located at that node: `no admissible kernel capsule for op linear on device cuda`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.plan import set_kernel, set_policy
from tlc.dialect.verify import check_structure, run_on_graphs
from tlc.semantics.capsules import KernelCapsule, KernelPolicy, plan_graph


@dataclass(frozen=True)
class SelectKernelsPass(ModulePass):
    """Attach a kernel plan to every graph under one policy."""

    name = "select-kernels"

    device: str = "cpu"
    provider: str = "auto"
    allow_trusted_external: bool = False

    def __post_init__(self) -> None:
        self.policy()  # bad option values fail when the pipeline is built

    def policy(self) -> KernelPolicy:
        return KernelPolicy(self.device, self.provider, self.allow_trusted_external)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        policy = self.policy()
        plans: list[tuple[GraphOp, dict[NodeOp, KernelCapsule]]] = []

        def plan(graph: GraphOp) -> None:
            check_structure(graph)
            plans.append((graph, dict(plan_graph(graph, policy))))

        run_on_graphs(op, plan)
        for graph, planned in plans:
            set_policy(graph, policy.as_attrs())
            for node in graph.nodes:
                capsule = planned.get(node)
                set_kernel(node, capsule.name if capsule else None)
