"""Kernel capsules, select-kernels and plan execution (docs/kernels.md).

Tolerances of mixed plans against the reference denotation: f64 1e-9 relative (llvm reassociates
reductions and torch uses its own algorithms, both differing from numpy's pairwise sums and BLAS
by a few ULPs per accumulated term), f32 2e-5 (the same terms at float32's 6e-8 epsilon, over
graphs whose longest reduction has a few dozen terms).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tlc
from tlc.api.emit import EMITTERS
from tlc.api.execute import BindError, Handler, bind, bind_plan, handler_for
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.plan import kernel_of, set_kernel, set_policy
from tlc.dialect.printer import print_mlir_op, print_tlir
from tlc.dialect.registry import NODE_OPS
from tlc.passes.registry import build_pipeline
from tlc.semantics.capsules import (
    BACKEND_OP,
    BACKEND_OPS,
    DEVICES,
    KernelPolicy,
    ReductionPolicy,
    TrustLevel,
    backend_op,
    find_capsule,
    provider_capsules,
    registry,
)

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X0 = [0.3, -0.2, 0.1, 0.4]
SEED_PLAN = (
    '(#[1, 2, 3, 4, 5], #["reference.linear", "reference.relu", "reference.linear", '
    '"reference.reduce_sum", "reference.tanh"])\n'
)


def graph_of(module) -> GraphOp:
    return next(op for op in module.ops if isinstance(op, GraphOp))


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def test_every_op_maps_to_a_backend_op_or_none() -> None:
    assert set(BACKEND_OP) == set(NODE_OPS)
    assert {cls.TAG for cls, op in BACKEND_OP.items() if op is None} == {"input", "const", "detach"}
    assert all(op is None or op in BACKEND_OPS for op in BACKEND_OP.values())


@pytest.mark.parametrize(
    ("op_class", "expected"),
    [
        (ops.SumOp, "reduce_sum"),
        (ops.ReduceSumOp, "reduce_sum"),
        (ops.FlattenOp, "reshape"),
        (ops.ReshapeOp, "reshape"),
        (ops.TransposeOp, "permute"),
        (ops.LayernormOp, "layer_norm"),
        (ops.BatchNormEvalOp, "batch_norm"),
        (ops.MulElemOp, "mul"),
        (ops.LinearOp, "linear"),
        (ops.BroadcastToOp, "broadcast"),
    ],
)
def test_seed_backend_vocabulary(op_class: type, expected: str) -> None:
    assert backend_op(op_class) == expected


def test_reference_provider_registers_every_backend_op() -> None:
    covered = {c.op for c in provider_capsules("reference")}
    assert covered == set(BACKEND_OPS)


def test_llvm_capsules_follow_the_lowering_table() -> None:
    lower = pytest.importorskip("tlc.codegen.lower")
    lowered = {cls.TAG for cls in lower.LOWERINGS}
    for capsule in provider_capsules("llvm"):
        assert set(capsule.ir_ops) <= lowered
    planned = {tag for c in provider_capsules("llvm") for tag in c.ir_ops}
    assert planned == {cls.TAG for cls in lower.LOWERINGS if BACKEND_OP[cls] is not None}


def test_capsule_records() -> None:
    linear = find_capsule("reference.linear", "cpu")
    assert linear is not None
    assert (linear.op, linear.provider, linear.device) == ("linear", "reference", "cpu")
    assert linear.trust is TrustLevel.CHECKED and linear.supports_forward
    assert linear.reduction is ReductionPolicy.IMPLEMENTATION_DEFINED
    relu = find_capsule("reference.relu", "cpu")
    assert relu is not None and relu.reduction is ReductionPolicy.NOT_APPLICABLE
    reduce_sum = find_capsule("reference.reduce_sum", "cpu")
    assert reduce_sum is not None and reduce_sum.ir_ops == ("reduce_sum", "sum")
    assert all(c.device in DEVICES for c in registry())


def test_torch_is_trusted_external_and_registered_for_an_unavailable_device() -> None:
    pytest.importorskip("torch")
    linear = find_capsule("torch.linear", "cpu")
    assert linear is not None and linear.trust is TrustLevel.TRUSTED_EXTERNAL
    # registered != selectable: the cuda capsule exists, no policy can select it
    assert find_capsule("torch.linear", "cuda") is not None
    assert not DEVICES["cuda"]
    assert handler_for(find_capsule("torch.linear", "cuda")) is None  # nor execute it


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


def planned(provider: str = "auto", device: str = "cpu", trusted: bool = False) -> str:
    return EMITTERS["plan"](tlc.plan(MLP, device, provider, trusted))


def test_seed_plan() -> None:
    assert planned() == SEED_PLAN
    assert planned("only:reference") == SEED_PLAN


@pytest.mark.parametrize(
    ("provider", "trusted", "expected"),
    [
        ("auto", True, "reference"),  # auto prefers the checked reference denotation
        ("prefer:llvm", False, "llvm"),
        ("only:llvm", False, "llvm"),
        ("prefer:torch", False, "reference"),  # torch not admissible: fall back to auto's order
        ("prefer:torch", True, "torch"),
        ("only:torch", True, "torch"),
        ("prefer:cuDNN", False, "reference"),
    ],
)
def test_policy_variations(provider: str, trusted: bool, expected: str) -> None:
    if "torch" in provider:
        pytest.importorskip("torch")
    if "llvm" in provider:
        pytest.importorskip("tlc.codegen.lower")
    text = planned(provider, trusted=trusted)
    assert text.count(f'"{expected}.') == 5, text


@pytest.mark.parametrize(
    ("policy", "note"),
    [
        (KernelPolicy(device="cuda"), None),
        (KernelPolicy(provider="only:cuDNN"), "provider cuDNN is not part of this build"),
        (
            KernelPolicy(provider="only:torch"),
            "capsule `torch.linear` is trusted-external and the policy has "
            "allow-trusted-external=false",
        ),
    ],
)
def test_no_admissible_capsule(policy: KernelPolicy, note: str | None) -> None:
    if "torch" in policy.provider:
        pytest.importorskip("torch")
    module = tlc.parse(MLP, "mlp.tlir")
    before = print_tlir(module)
    with pytest.raises(DiagnosticError) as info:
        tlc.plan(module, policy.device, policy.provider, policy.allow_trusted_external)
    (diag,) = info.value.diagnostics
    assert diag.message == f"no admissible kernel capsule for op linear on device {policy.device}"
    assert diag.location is not None and (diag.location.line, diag.location.col) == (4, 3)
    if note is not None:
        assert note in [n.message for n in diag.notes]
    assert print_tlir(module) == before  # nothing planned


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("device=gpu", "unknown device 'gpu'"),
        ("provider=only:pytorch", "unknown kernel provider 'pytorch'"),
        ("provider=prefer:", "invalid kernel provider policy 'prefer:'"),
        ("provider=auto:llvm", "invalid kernel provider policy 'auto:llvm'"),
    ],
)
def test_bad_policy_options(options: str, message: str) -> None:
    with pytest.raises(DiagnosticError, match=message):
        build_pipeline(f"select-kernels{{{options}}}")


def test_pipeline_options() -> None:
    (pass_,) = build_pipeline(
        "select-kernels{device=cpu provider=prefer:llvm allow-trusted-external=true}"
    )
    assert pass_.policy() == KernelPolicy("cpu", "prefer:llvm", True)
    assert str(pass_.pipeline_pass_spec()) == (
        'select-kernels{provider="prefer:llvm" allow_trusted_external=true}'
    )


def test_plan_round_trips_in_tlir_and_mlir() -> None:
    module = tlc.plan(MLP)
    text = print_tlir(module)
    assert (
        'kernel_policy {device = "cpu", provider = "auto", allow_trusted_external = false}' in text
    )
    assert '%4 = sum(%3) : [] kernel "reference.reduce_sum"' in text
    again = tlc.parse(text)
    assert print_tlir(again) == text
    assert print_mlir_op(again) == print_mlir_op(module)
    from_mlir = tlc.parse(print_mlir_op(module), "x.mlir")
    assert EMITTERS["plan"](from_mlir) == SEED_PLAN


def test_replanning_clears_stale_kernels() -> None:
    module = tlc.parse(MLP)
    graph = graph_of(module)
    set_kernel(graph.nodes[0], "reference.linear")  # a hand-written mistake on the input node
    tlc.plan(module)
    assert kernel_of(graph.nodes[0]) is None


# --------------------------------------------------------------------------------------------
# Binding
# --------------------------------------------------------------------------------------------


def test_bind_accepts_the_matching_handler() -> None:
    capsule = find_capsule("reference.linear", "cpu")
    assert capsule is not None
    handler = handler_for(capsule)
    assert handler is not None
    assert bind(capsule, handler).capsule is capsule


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("op", "relu", "handler `reference.relu@cpu` uses op `relu`, but capsule "
         "`reference.linear` selects `linear`"),
        ("provider", "torch", "handler `torch.linear@cpu` uses provider `torch`, but capsule "
         "`reference.linear` selects `reference`"),
        ("device", "cuda", "handler `reference.linear@cuda` uses device `cuda`, but capsule "
         "`reference.linear` selects `cpu`"),
    ],
)  # fmt: skip
def test_bind_refuses_a_mismatch(field: str, value: str, message: str) -> None:
    capsule = find_capsule("reference.linear", "cpu")
    assert capsule is not None
    good = handler_for(capsule)
    assert good is not None
    fields = {"op": good.op, "provider": good.provider, "device": good.device, field: value}
    with pytest.raises(BindError) as info:
        bind(capsule, Handler(**fields, prepare=good.prepare))
    assert str(info.value) == message


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


def mixed_mlp(kernels: dict[int, str], trusted: bool = True):
    module = tlc.parse(MLP)
    graph = graph_of(module)
    set_policy(graph, KernelPolicy(allow_trusted_external=trusted).as_attrs())
    for node in graph.nodes:
        set_kernel(node, kernels.get(node.id))
    return module


def test_mixed_plan_runs_the_mlp() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tlc.codegen.jit")
    module = mixed_mlp({1: "llvm.linear", 2: "torch.relu", 3: "reference.linear",
                        4: "llvm.reduce_sum", 5: "torch.tanh"})  # fmt: skip
    plan = bind_plan(graph_of(module), payload_from_module(module, "mlp"))
    assert [b.capsule.provider for b, _ in plan.kernels.values()] == [
        "llvm", "torch", "reference", "llvm", "torch"
    ]  # fmt: skip
    table = plan(np.array(X0))
    reference = tlc.run(MLP, X0)
    assert f"{float(table.output):.6f}" == "0.027713"
    assert f"{float(table[4]):.6f}" == "0.027720"
    for got, want in zip(table.values, reference.values, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    f32 = tlc.execute_plan(module, X0, dtype="f32")
    assert f32.output.dtype == np.float32
    np.testing.assert_allclose(f32.output, reference.output, rtol=2e-5)


@pytest.mark.parametrize(
    ("kernels", "trusted", "message"),
    [
        ({1: "reference.relu"}, False,
         "node 1: capsule `reference.relu` does not implement op linear"),
        ({1: "nobody.linear"}, False,
         "node 1: no kernel capsule `nobody.linear` is registered for device cpu"),
        ({0: "reference.linear"}, False,
         "node 0: op input needs no kernel, but the plan names `reference.linear`"),
        ({}, False, "node 1: op linear has no kernel in the plan; run select-kernels first"),
        ({1: "torch.linear"}, False, "node 1: capsule `torch.linear` is trusted-external and the "
         "policy has allow-trusted-external=false"),
    ],
)  # fmt: skip
def test_executor_refuses_bad_plans(kernels: dict[int, str], trusted: bool, message: str) -> None:
    if any("torch" in k for k in kernels.values()):
        pytest.importorskip("torch")
    full = {1: "reference.linear", 2: "reference.relu", 3: "reference.linear",
            4: "reference.reduce_sum", 5: "reference.tanh"}  # fmt: skip
    module = mixed_mlp({**full, **kernels} if kernels else {}, trusted)
    with pytest.raises(DiagnosticError) as info:
        tlc.execute_plan(module, X0)
    assert info.value.diagnostics[0].message == message
    assert info.value.diagnostics[0].location is not None


# A graph over most op kinds; its payload is generated below.
MANY = """
tl.graph @many {
  %0 = input : [2, 3]
  %1 = const {shape = [2, 3]} : [2, 3]
  %2 = add(%0, %1)
  %3 = mul_elem(%2, %0)
  %4 = sub(%3, %1)
  %5 = tanh(%4)
  %6 = sigmoid(%5)
  %7 = softplus(%6)
  %8 = linear(%7) : [2, 4]
  %9 = relu(%8)
  %10 = softmax(%9) {axis = 1}
  %11 = layernorm(%10) {axis = 1}
  %12 = transpose(%11) {axis1 = 0, axis2 = 1}
  %13 = matmul(%12, %0)
  %14 = reduce_sum(%13) {axis = 0}
  %15 = exp(%14)
  %16 = flatten(%13) {shape = [4, 3]}
  %17 = reshape(%16) {from = [12], to = [1, 3, 4]}
  %18 = conv(%17) {kernel = [2], in_channels = 3, out_channels = 2, channel_axis = 1, padding = [1]}
  %19 = max_pool(%18) {kernel = [2]}
  %20 = avg_pool(%18) {kernel = [3], stride = [1], padding = [1]}
  %21 = batch_norm_eval(%20) {channel_axis = 1, channels = 2}
  %22 = gelu(%21)
  %23 = log_softmax(%22) {axis = 2}
  %24 = reduce_mean(%23) {axis = 2}
  %25 = abs(%24)
  %26 = sqrt(%25)
  %27 = max_elem(%26, %24)
  %28 = min_elem(%27, %25)
  %29 = sin(%28)
  %30 = cos(%29)
  %31 = inv(%30)
  %32 = permute(%19) {perm = [2, 0, 1]}
  %33 = broadcast_to(%15) {from = [3], to = [2, 3]}
  %34 = concat(%33, %0) {axis = 0}
  %35 = sum(%34) : []
  %36 = safe_log(%31, %35)
  %37 = mse_loss(%36, %31) : []
  %38 = detach(%37)
  %39 = rand_uniform {seed = 3} : [2, 3]
  %40 = const {shape = []} : []
  %41 = bernoulli_mask(%40) {seed = 5} : [2, 3]
  %42 = exp(%39)
  %43 = log(%42)
  %44 = hard_masked_softmax(%4) {mask_shape = [2, 3],
                                 allowed = [true, false, true, false, false, false]}
  %45 = sign(%4)
  output %38
}
"""


def many_payload(module) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "1.value": rng.normal(size=6),
        "8.weight": rng.normal(size=(4, 3)) * 0.5,
        "8.bias": rng.normal(size=4) * 0.1,
        "11.gamma": rng.normal(size=4),
        "11.beta": rng.normal(size=4),
        "18.weight": rng.normal(size=(2, 3, 2)) * 0.5,
        "18.bias": rng.normal(size=2),
        "21.gamma": rng.normal(size=2),
        "21.beta": rng.normal(size=2),
        "21.mean": rng.normal(size=2),
        "21.var": rng.uniform(0.5, 2.0, size=2),
        "40.value": np.array([0.5]),
    }


def providers_of(node) -> list[str]:
    return [c.provider for c in registry() if c.device == "cpu" and node.TAG in c.ir_ops]


@settings(max_examples=25, deadline=None)
@given(choice=st.data(), arithmetic=st.sampled_from(["f64", "f32"]))
def test_random_mixed_plans_give_the_reference_result(
    choice: st.DataObject, arithmetic: str
) -> None:
    pytest.importorskip("torch")
    module = tlc.parse(MANY)
    tlc.plan(module)  # fills in shapes, attaches a policy
    graph = graph_of(module)
    set_policy(graph, KernelPolicy(allow_trusted_external=True).as_attrs())
    for node in graph.nodes:
        if kernel_of(node) is not None:
            provider = choice.draw(st.sampled_from(providers_of(node)), label=f"node {node.id}")
            set_kernel(node, f"{provider}.{backend_op(node)}")
    payload = many_payload(module)
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    got = tlc.execute_plan(module, x, payload, arithmetic)
    want = tlc.run(MANY, x, payload, arithmetic)
    rtol = 1e-9 if arithmetic == "f64" else 2e-5
    for node, a, b in zip(graph.nodes, got.values, want.values, strict=True):
        assert a.dtype == b.dtype, node.summary()
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol, err_msg=node.summary())


def test_whole_graph_plans_per_provider() -> None:
    """only:llvm plans and runs every node of MANY natively; only:torch stops at the first op
    torch has no kernel for (rand_uniform), located there."""
    pytest.importorskip("tlc.codegen.jit")
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    module = tlc.plan(MANY, provider="only:llvm")
    assert set(EMITTERS["plan"](module).split('"')[1::2]) == {
        f"llvm.{backend_op(n)}" for n in graph_of(module).nodes if backend_op(n)
    }
    payload = many_payload(module)
    got = tlc.execute_plan(module, x, payload)
    want = tlc.run(MANY, x, payload)
    for a, b in zip(got.values, want.values, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    pytest.importorskip("torch")
    with pytest.raises(DiagnosticError) as info:
        tlc.plan(MANY, provider="only:torch", allow_trusted_external=True)
    message = "no admissible kernel capsule for op rand_uniform on device cpu"
    assert info.value.diagnostics[0].message == message
    # the rand_uniform node (MANY starts with a newline)
    assert info.value.diagnostics[0].location.line == 42


def test_a_hand_written_policy_is_checked_at_the_graph() -> None:
    text = MLP.replace("tl.graph @mlp {", 'tl.graph @mlp kernel_policy {device = "gpu"} {')
    with pytest.raises(DiagnosticError) as info:
        tlc.execute_plan(text, X0)
    (diag,) = info.value.diagnostics
    assert diag.message.startswith("unknown device 'gpu' (known: cpu, cuda,")
    assert diag.location is not None and diag.location.line == 2


LEAKY = """
tl.graph @leaky {
  %0 = input : [6]
  %1 = leaky_relu(%0) {negative_slope = 0.2}
  %2 = leaky_relu(%1) {negative_slope = 1.5}
  output %2
}
"""


@pytest.mark.parametrize("provider", ["reference", "llvm", "torch"])
@pytest.mark.parametrize("arithmetic", ["f64", "f32"])
def test_an_op_defined_by_its_facts_has_a_capsule_in_every_provider(
    provider: str, arithmetic: str
) -> None:
    """leaky_relu has no kernel rule of its own anywhere: the reference derives it from the
    numpy fact, llvm lowers its decomposition, torch calls its PyTorch spelling. Each runs the
    plan and selects the same values as the reference, bit for bit."""
    if provider == "torch":
        pytest.importorskip("torch")
    capsule = find_capsule(f"{provider}.leaky_relu", "cpu")
    assert capsule is not None and capsule.ir_ops == ("leaky_relu",)
    assert capsule.reduction is ReductionPolicy.NOT_APPLICABLE
    module = tlc.plan(LEAKY, provider=f"only:{provider}", allow_trusted_external=True)
    assert EMITTERS["plan"](module) == (
        f'(#[1, 2], #["{provider}.leaky_relu", "{provider}.leaky_relu"])\n'
    )
    x = [-3.0, -0.5, -0.0, 0.0, 0.7, 4.0]
    got = tlc.execute_plan(module, x, dtype=arithmetic).output
    want = tlc.run(LEAKY, x, dtype=arithmetic).output
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
