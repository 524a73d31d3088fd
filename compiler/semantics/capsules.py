"""Kernel capsules, providers, devices and the selection policy (reference/torchlean-ir.md §6).

A `KernelCapsule` describes a kernel contract: which backend op it implements, from which
provider, on which device, how far it is trusted and how its reductions round. It holds no code;
`tlc.api.execute` binds it to a handler before anything runs. Three questions stay apart:

- registered: a provider present in this build declares the capsule (the `torch` provider only
  when torch is installed; capsules may name devices this build cannot drive, such as cuda);
- selectable: the capsule is admissible for a node under a `KernelPolicy` (device available,
  provider allowed, trust level allowed, the node's op kind covered) - `select_capsule`;
- executable: a handler of the same op, provider and device exists and binds - `tlc.api.execute`.

IR ops map to the backend vocabulary through `BACKEND_OP`, a rule table: an op's backend op is
its tag unless TorchLean's vocabulary names it otherwise; ops that need no runtime work (input,
const, detach) map to None and get no capsule; several IR ops can share a backend op (`sum` and
`reduce_sum` plan as `reduce_sum`). A provider registers a capsule for every backend op one of
whose IR ops its table has a rule for: `reference` from the reference rules, `llvm` from the
lowerings (including those through a decomposition), `torch` from the torch kernels.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cache

from tlc.core.diagnostics import Diagnostic, DiagnosticError, error, location_of
from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops, ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.plan import kernel_of, policy_of
from tlc.dialect.registry import NODE_OPS

# --------------------------------------------------------------------------------------------
# The backend vocabulary
# --------------------------------------------------------------------------------------------

#: IR op -> backend op (None: no runtime work, no capsule). An op's backend op is its tag unless
#: the backend vocabulary (TorchLean's) names it otherwise, below.
BACKEND_OP: RuleTable[str | None] = RuleTable("backend op")
BACKEND_OP.register(ops.InputOp, ops.ConstOp, ops.DetachOp)(None)
for _name, _classes in (
    ("permute", (ops.PermuteOp, ops.TransposeOp)),
    ("bernoulli", (ops.BernoulliMaskOp,)),
    ("mul", (ops.MulElemOp,)),
    ("maximum", (ops.MaxElemOp,)),
    ("minimum", (ops.MinElemOp,)),
    ("reciprocal", (ops.InvOp,)),
    ("broadcast", (ops.BroadcastToOp,)),
    ("reduce_sum", (ops.ReduceSumOp, ops.SumOp)),
    ("batch_norm", (ops.BatchNormEvalOp,)),
    ("masked_softmax", (ops.HardMaskedSoftmaxOp,)),
    ("layer_norm", (ops.LayernormOp,)),
    ("reshape", (ops.ReshapeOp, ops.FlattenOp)),
    # the ops gradient graphs add
    ("gelu_backward", (backward_ops.GeluGradOp,)),
    ("max_pool_backward", (backward_ops.MaxPoolGradOp,)),
    ("avg_pool_backward", (backward_ops.AvgPoolGradOp,)),
    ("conv_backward_input", (backward_ops.ConvInputGradOp,)),
    ("conv_backward_weight", (backward_ops.ConvWeightGradOp,)),
):
    BACKEND_OP.register(*_classes)(_name)
BACKEND_OP.derive(NODE_OPS, lambda cls: cls.TAG)

#: Backend ops whose result sums many terms, so the summation order is a numerical policy.
REDUCING = frozenset(
    {"reduce_sum", "reduce_mean", "matmul", "linear", "conv", "softmax", "log_softmax",
     "masked_softmax", "layer_norm", "avg_pool", "mse_loss", "max_pool_backward",
     "avg_pool_backward", "conv_backward_input", "conv_backward_weight"}
)  # fmt: skip


def backend_op(node_or_class: NodeOp | type[NodeOp]) -> str | None:
    cls = node_or_class if isinstance(node_or_class, type) else type(node_or_class)
    return BACKEND_OP[cls]


def ir_ops_of(op: str) -> tuple[type[NodeOp], ...]:
    """The IR op classes that plan as backend op `op`."""
    return tuple(cls for cls in NODE_OPS if BACKEND_OP[cls] == op)


BACKEND_OPS: tuple[str, ...] = tuple(
    dict.fromkeys(op for cls in NODE_OPS if (op := BACKEND_OP[cls]) is not None)
)

# --------------------------------------------------------------------------------------------
# Capsule records
# --------------------------------------------------------------------------------------------


class TrustLevel(Enum):
    CHECKED = "checked"  # tlc's own code, tested against the reference denotation
    TRUSTED_EXTERNAL = "trustedExternal"  # someone else's library, taken on trust


class ReductionPolicy(Enum):
    """What an arithmetic bound may assume about the order in which a kernel sums."""

    FIXED_LEFT = "fixedLeft"  # ((x0 + x1) + x2) + ...
    IMPLEMENTATION_DEFINED = "implementationDefined"  # pairwise, blocked, reassociated, BLAS...
    NOT_APPLICABLE = "notApplicable"  # the op sums nothing


class VjpMode(Enum):
    """Where a capsule's reverse-mode derivative would come from."""

    NONE = "none"  # forward only: no capsule registered here runs a VJP yet


@dataclass(frozen=True)
class KernelCapsule:
    """A selected kernel contract. `ir_ops` (the shape contract) lists the IR op kinds whose
    nodes it accepts: a provider may implement `reshape` for `flatten` nodes only."""

    op: str
    provider: str
    device: str
    trust: TrustLevel
    ir_ops: tuple[str, ...]
    reduction: ReductionPolicy
    supports_forward: bool = True
    vjp: VjpMode = VjpMode.NONE

    @property
    def name(self) -> str:
        return f"{self.provider}.{self.op}"


# --------------------------------------------------------------------------------------------
# Devices and providers
# --------------------------------------------------------------------------------------------

#: Every device name tlc knows, with whether this build can execute on it.
DEVICES: dict[str, bool] = {
    "cpu": True,
    "cuda": False,
    "rocm": False,
    "metal": False,
    "wasm": False,
    "tpu": False,
    "trainium": False,
    "custom": False,
    "external": False,
}


@dataclass(frozen=True)
class Provider:
    """A source of kernels. `rules` names its rule table as `module:attribute`; the IR op
    classes it implements are that table's keys (`covers()`). The table is resolved by name,
    on first use: a provider is configuration naming its implementation, like an entry point,
    so this layer never imports the code generator or torch and planning with the reference
    provider loads neither. `present()` says whether this build has the provider at all."""

    name: str
    trust: TrustLevel
    devices: tuple[str, ...]
    rules: str
    present: Callable[[], bool]
    #: The summation order of its reducing kernels.
    reduction: ReductionPolicy

    def covers(self) -> frozenset[type[NodeOp]]:
        module, _, attribute = self.rules.partition(":")
        return frozenset(getattr(importlib.import_module(module), attribute))


def _codegen_present() -> bool:
    """tlc's own code generator: present when its module is; a broken one fails loudly."""
    return importlib.util.find_spec("tlc.codegen.lower") is not None


def _torch_imports() -> bool:
    """An external library counts only if it imports (checked once, when first needed)."""
    try:
        import torch  # noqa: F401
    except Exception:  # a broken installation is as absent as a missing one
        return False
    return True


#: The providers of this build, in `auto` order: checked before trusted-external, and among the
#: checked ones the reference denotation first (it is the oracle, so a default plan means exactly
#: the graph's semantics; ask for native code with `prefer:llvm`).
PROVIDERS: tuple[Provider, ...] = (
    # numpy's sums are pairwise and its matmul is BLAS: the order is numpy's, not a left fold.
    Provider("reference", TrustLevel.CHECKED, ("cpu",), "tlc.semantics.interpret:REFERENCE",
             lambda: True,
             ReductionPolicy.IMPLEMENTATION_DEFINED),
    # the generated loops may be vectorised with reassociated partial sums (see tlc.codegen).
    Provider("llvm", TrustLevel.CHECKED, ("cpu",), "tlc.codegen.lower:LOWERINGS",
             _codegen_present,
             ReductionPolicy.IMPLEMENTATION_DEFINED),
    # ATen chooses its own blocking and threading; cuda capsules are registered, not selectable.
    Provider("torch", TrustLevel.TRUSTED_EXTERNAL, ("cpu", "cuda"),
             "tlc.semantics.torch_kernels:TORCH", _torch_imports,
             ReductionPolicy.IMPLEMENTATION_DEFINED),
)  # fmt: skip

#: Provider names a policy may mention that this build never has (TorchLean's vocabulary).
ABSENT_PROVIDERS = ("torchLean", "nativeCuda", "libTorch", "aten", "mps", "webGpu",
                    "cuBLAS", "cuDNN", "cuFFT", "xla")  # fmt: skip

KNOWN_PROVIDERS = tuple(p.name for p in PROVIDERS) + ABSENT_PROVIDERS


PROVIDERS_BY_NAME = {p.name: p for p in PROVIDERS}


@cache
def provider_capsules(name: str) -> tuple[KernelCapsule, ...]:
    """The capsules provider `name` registers (none when this build lacks it), one per
    (op, device). Built on first use, so planning with the reference provider never imports
    the code generator or torch."""
    provider = PROVIDERS_BY_NAME.get(name)
    if provider is None or not provider.present():
        return ()
    covered = provider.covers()
    capsules = []
    for op in BACKEND_OPS:
        tags = tuple(cls.TAG for cls in ir_ops_of(op) if cls in covered)
        if tags:
            reduction = provider.reduction if op in REDUCING else ReductionPolicy.NOT_APPLICABLE
            capsules.extend(
                KernelCapsule(op, provider.name, device, provider.trust, tags, reduction)
                for device in provider.devices
            )
    return tuple(capsules)


def registry() -> tuple[KernelCapsule, ...]:
    """Every registered capsule of this build."""
    return tuple(c for p in PROVIDERS for c in provider_capsules(p.name))


def find_capsule(name: str, device: str) -> KernelCapsule | None:
    provider = name.partition(".")[0]
    return next(
        (c for c in provider_capsules(provider) if c.name == name and c.device == device), None
    )


# --------------------------------------------------------------------------------------------
# Policy and selection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelPolicy:
    """TorchLean's KernelPolicy. `provider` is `auto`, `prefer:P` or `only:P`."""

    device: str = "cpu"
    provider: str = "auto"
    allow_trusted_external: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise DiagnosticError.simple(
                f"unknown device '{self.device}' (known: {', '.join(DEVICES)})"
            )
        mode, _, name = self.provider.partition(":")
        if self.provider != "auto" and (mode not in ("prefer", "only") or not name):
            raise DiagnosticError.simple(
                f"invalid kernel provider policy '{self.provider}': "
                "expected auto, prefer:P or only:P"
            )
        if name and name not in KNOWN_PROVIDERS:
            raise DiagnosticError.simple(
                f"unknown kernel provider '{name}' (known: {', '.join(KNOWN_PROVIDERS)})"
            )

    @property
    def mode(self) -> str:
        return self.provider.partition(":")[0]

    @property
    def named(self) -> str | None:
        """The provider of `prefer:P` / `only:P`."""
        return self.provider.partition(":")[2] or None

    def as_attrs(self) -> dict[str, str | bool]:
        return {
            "device": self.device,
            "provider": self.provider,
            "allow_trusted_external": self.allow_trusted_external,
        }

    @staticmethod
    def from_attrs(attrs: dict[str, str | bool] | None) -> KernelPolicy:
        return KernelPolicy(**attrs) if attrs else KernelPolicy()  # type: ignore[arg-type]

    def order(self) -> tuple[str, ...]:
        """The providers to try, best first."""
        default = tuple(p.name for p in PROVIDERS)
        if self.named is None:
            return default
        if self.mode == "only":
            return (self.named,)
        return (self.named,) + tuple(p for p in default if p != self.named)


def rejection(node: NodeOp, capsule: KernelCapsule, policy: KernelPolicy) -> str | None:
    """Why `capsule` is not admissible for `node` under `policy` (None: it is)."""
    if capsule.op != backend_op(node) or node.TAG not in capsule.ir_ops:
        return f"capsule `{capsule.name}` does not implement op {node.TAG}"
    if capsule.device != policy.device:
        return f"capsule `{capsule.name}` is for device {capsule.device}, not {policy.device}"
    if not DEVICES[capsule.device]:
        return f"capsule `{capsule.name}`: device {capsule.device} is not available in this build"
    if policy.mode == "only" and capsule.provider != policy.named:
        return (
            f"capsule `{capsule.name}`: provider {capsule.provider} excluded by {policy.provider}"
        )
    if capsule.trust is TrustLevel.TRUSTED_EXTERNAL and not policy.allow_trusted_external:
        return (
            f"capsule `{capsule.name}` is trusted-external and the policy has "
            "allow-trusted-external=false"
        )
    if not capsule.supports_forward:
        return f"capsule `{capsule.name}` has no forward kernel"
    return None


def select_capsule(node: NodeOp, policy: KernelPolicy) -> KernelCapsule | None:
    """The capsule planned for `node` (None for ops without runtime work); a located error with
    one note per registered-but-rejected capsule when nothing is admissible."""
    op = backend_op(node)
    if op is None:
        return None
    for provider in policy.order():
        for capsule in provider_capsules(provider):
            same_op = capsule.op == op and capsule.device == policy.device
            if same_op and rejection(node, capsule, policy) is None:
                return capsule
    message = f"no admissible kernel capsule for op {op} on device {policy.device}"
    where = location_of(node)
    candidates = [
        c
        for p in policy.order()
        for c in provider_capsules(p)
        if c.op == op and c.device == policy.device
    ]
    reasons = [reason for c in candidates if (reason := rejection(node, c, policy))]
    if policy.mode == "only" and not provider_capsules(policy.named or ""):
        reasons.append(f"provider {policy.named} is not part of this build")
    elif not candidates:
        reasons.append(f"no provider of this build registers op {op} on device {policy.device}")
    notes = [Diagnostic("note", reason, where) for reason in reasons]
    raise DiagnosticError(Diagnostic("error", message, where, notes))


def plan_graph(graph: ops.GraphOp, policy: KernelPolicy) -> list[tuple[NodeOp, KernelCapsule]]:
    """The capsule of every node that needs runtime work, in node order."""
    return [(node, c) for node in graph.nodes if (c := select_capsule(node, policy)) is not None]


def format_plan(planned: list[tuple[int, str]]) -> str:
    """The seed's form: `(#[1, 2], #["reference.linear", "reference.relu"])`."""
    ids = ", ".join(str(i) for i, _ in planned)
    names = ", ".join(f'"{n}"' for _, n in planned)
    return f"(#[{ids}], #[{names}])"


def plan_text(graph: ops.GraphOp) -> str:
    """The plan attached to `graph` in the seed's form (`tlc-opt --emit plan`)."""
    if policy_of(graph) is None:
        raise error(
            f"graph @{graph.graph_name} has no kernel plan; run select-kernels first", graph
        )
    planned = [(n.id, name) for n in graph.nodes if (name := kernel_of(n)) is not None]
    return format_plan(planned)
