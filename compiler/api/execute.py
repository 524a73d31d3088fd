"""Executing a kernel plan: bind each node's capsule to a handler, then run node by node.

A handler is the executable side of a capsule: it belongs to one backend op, provider and
device, and `prepare(node, parent_shapes, record, dtype)` turns a node into a kernel, a callable
from the parents' values to the node's value (the llvm handler compiles the node here, once).
`bind` pairs a capsule with a handler and refuses a mismatch with the seed's messages, so a plan
never runs on code it did not select. `HANDLERS` has one factory per provider; the plan's
capsules are re-checked against the plan's policy before binding, because a plan read from text
may have been written by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.plan import kernel_of, policy_of
from tlc.dialect.shapes import Shape
from tlc.semantics.capsules import (
    KernelCapsule,
    KernelPolicy,
    TrustLevel,
    backend_op,
    find_capsule,
    rejection,
)

if TYPE_CHECKING:
    from tlc.api.evaluate import Source

Kernel = Callable[[list[np.ndarray]], np.ndarray]
Prepare = Callable[[NodeOp, list[Shape], "dict[str, np.ndarray] | None", Any], Kernel]


@dataclass(frozen=True)
class Handler:
    """Executable code for one (backend op, provider, device)."""

    op: str
    provider: str
    device: str
    prepare: Prepare

    @property
    def name(self) -> str:
        return f"{self.provider}.{self.op}@{self.device}"


@dataclass(frozen=True)
class BoundKernel:
    capsule: KernelCapsule
    handler: Handler


class BindError(DiagnosticError):
    """A handler does not match the capsule it was offered for."""


def bind(capsule: KernelCapsule, handler: Handler) -> BoundKernel:
    """Pair `capsule` with `handler` when op, provider and device agree."""
    for what, have, want in (
        ("op", handler.op, capsule.op),
        ("provider", handler.provider, capsule.provider),
        ("device", handler.device, capsule.device),
    ):
        if have != want:
            raise BindError.simple(
                f"handler `{handler.name}` uses {what} `{have}`, but capsule `{capsule.name}` "
                f"selects `{want}`"
            )
    return BoundKernel(capsule, handler)


# --------------------------------------------------------------------------------------------
# Handlers by provider
# --------------------------------------------------------------------------------------------


def _reference_prepare(node: NodeOp, shapes: list[Shape], record: Any, dtype: Any) -> Kernel:
    from tlc.semantics.interpret import REFERENCE

    rule = REFERENCE[type(node)]
    return lambda args: np.asarray(rule(node, args, record, dtype))


def _llvm_prepare(node: NodeOp, shapes: list[Shape], record: Any, dtype: Any) -> Kernel:
    from tlc.codegen.jit import node_kernel

    return node_kernel(node, shapes, record, dtype)


def _torch_prepare(node: NodeOp, shapes: list[Shape], record: Any, dtype: Any) -> Kernel:
    import torch

    from tlc.semantics.torch_kernels import TORCH

    rule = TORCH[type(node)]
    tensors = {k: torch.from_numpy(np.asarray(v, order="C")) for k, v in (record or {}).items()}

    def run(args: list[np.ndarray]) -> np.ndarray:
        inputs = [torch.from_numpy(np.asarray(a, order="C")) for a in args]
        with torch.no_grad():
            return np.asarray(rule(torch, node, inputs, tensors).numpy(), dtype=dtype)

    return run


#: provider -> its `prepare`; a provider's handlers exist for the devices it can drive.
HANDLERS: dict[str, tuple[Prepare, tuple[str, ...]]] = {
    "reference": (_reference_prepare, ("cpu",)),
    "llvm": (_llvm_prepare, ("cpu",)),
    "torch": (_torch_prepare, ("cpu",)),
}


def handler_for(capsule: KernelCapsule) -> Handler | None:
    """The handler this build has for `capsule`'s provider and device (None: not executable)."""
    entry = HANDLERS.get(capsule.provider)
    if entry is None or capsule.device not in entry[1]:
        return None
    return Handler(capsule.op, capsule.provider, capsule.device, entry[0])


# --------------------------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------------------------


@dataclass
class PlannedGraph:
    """A planned graph with every kernel bound and prepared; call it on inputs."""

    graph: GraphOp
    dtype: Any
    shapes: list[Shape]
    records: dict[int, dict[str, np.ndarray]]
    #: node id -> (bound kernel, prepared code); nodes without runtime work are absent.
    kernels: dict[int, tuple[BoundKernel, Kernel]]

    def __call__(self, x: Any) -> Any:
        from tlc.semantics.interpret import REFERENCE, ValueTable, bind_inputs, check_produced

        inputs = bind_inputs(self.graph, self.shapes, x, self.dtype)
        values: list[np.ndarray] = []
        for node in self.graph.nodes:
            args = [values[pid] for pid in node.parent_ids()]
            if node.id in inputs:
                value = inputs[node.id]
            elif node.id in self.kernels:
                value = self._run(node, args)
            else:  # no runtime work: const reads the payload, detach passes its value on
                value = REFERENCE[type(node)](node, args, self.records.get(node.id), self.dtype)
            check_produced(node, value, self.shapes[node.id])
            values.append(value)
        output = self.graph.output
        assert output is not None and isinstance(output.value.owner, NodeOp)
        return ValueTable(values, output.value.owner.id)

    def _run(self, node: NodeOp, args: list[np.ndarray]) -> np.ndarray:
        bound, kernel = self.kernels[node.id]
        if bound.capsule.trust is not TrustLevel.TRUSTED_EXTERNAL:
            return np.asarray(kernel(args), dtype=self.dtype)
        try:
            return np.asarray(kernel(args), dtype=self.dtype)
        except Exception as exc:
            # An external library refusing an input is reported, not taken for a tlc bug.
            raise error(
                f"IR eval: node {node.id}: kernel `{bound.capsule.name}` failed: {exc}", node
            ) from None


def bind_plan(
    graph: GraphOp, payload: Payload | None = None, dtype: Any = np.float64
) -> PlannedGraph:
    """Check `graph` and its plan, bind every capsule to a handler and prepare its kernel."""
    from tlc.dialect.verify import graph_shapes
    from tlc.semantics.interpret import prepare_records

    shapes = graph_shapes(graph)
    records = prepare_records(graph, payload or Payload(), dtype, shapes)
    try:
        policy = KernelPolicy.from_attrs(policy_of(graph))
    except DiagnosticError as exc:  # a hand-written policy naming an unknown device, say
        raise error(exc.diagnostics[0].message, graph) from None
    kernels = {}
    for node in graph.nodes:
        capsule = planned_capsule(node, policy)
        if capsule is None:
            continue
        handler = handler_for(capsule)
        if handler is None:
            raise error(
                f"kernel capsule `{capsule.name}` on device {capsule.device} is registered but "
                "has no handler in this build",
                node,
            )
        try:
            bound = bind(capsule, handler)
        except BindError as exc:
            raise error(exc.diagnostics[0].message, node) from None
        parent_shapes = [shapes[pid] for pid in node.parent_ids()]
        kernels[node.id] = (
            bound,
            handler.prepare(node, parent_shapes, records.get(node.id), dtype),
        )
    return PlannedGraph(graph, dtype, shapes, records, kernels)


def planned_capsule(node: NodeOp, policy: KernelPolicy) -> KernelCapsule | None:
    """The capsule the plan names for `node`, checked to be registered and admissible."""
    name = kernel_of(node)
    op = backend_op(node)
    if op is None:
        if name is not None:
            raise error(
                f"node {node.id}: op {node.TAG} needs no kernel, but the plan names `{name}`", node
            )
        return None
    if name is None:
        raise error(
            f"node {node.id}: op {node.TAG} has no kernel in the plan; run select-kernels first",
            node,
        )
    capsule = find_capsule(name, policy.device)
    if capsule is None:
        raise error(
            f"node {node.id}: no kernel capsule `{name}` is registered for device {policy.device}",
            node,
        )
    reason = rejection(node, capsule, policy)
    if reason is not None:
        raise error(f"node {node.id}: {reason}", node)
    return capsule


def execute_plan(graph: GraphOp, payload: Payload | None, x: Any, dtype: Any = np.float64) -> Any:
    """Run `graph` by its kernel plan on input `x`; returns the value table (like `interpret`)."""
    return bind_plan(graph, payload, dtype)(x)


def plan_module(
    source: Source,
    device: str = "cpu",
    provider: str = "auto",
    allow_trusted_external: bool = False,
) -> ModuleOp:
    """`tlc.plan`: check the document (structure, shapes) and attach a kernel plan to each graph."""
    from tlc.api.evaluate import as_module, quoting
    from tlc.frontends.text import context
    from tlc.passes.infer_shapes import InferShapesPass
    from tlc.passes.select_kernels import SelectKernelsPass

    module = as_module(source)
    select = SelectKernelsPass(device, provider, allow_trusted_external)
    with quoting(module):
        for pass_ in (InferShapesPass(), select):
            pass_.apply(context(), module)
    return module


def run_plan(
    source: Source,
    x: Any,
    payload: Any = None,
    arithmetic: str = "f64",
    graph: str | None = None,
) -> Any:
    """`tlc.execute_plan`: like `tlc.run`, but each node runs on the kernel its plan selected.
    `x` must have the input node's shape (or be `{node id: value}` for several inputs)."""
    from tlc.api.evaluate import choose, dtype_of, for_batch, quoting
    from tlc.dialect.batch import has_batch

    dtype = dtype_of(arithmetic)
    chosen, records = choose(source, graph, payload)
    if has_batch(chosen):  # `N`: the batch size of `x`
        chosen = for_batch(chosen, x)
    with quoting(chosen):
        return execute_plan(chosen, records, x, dtype)
