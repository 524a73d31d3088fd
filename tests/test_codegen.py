"""LLVM code generation and the JIT: every op against the reference, decompositions, failures.

Per-op tolerances are the op records' own (tests/op_records.py): elementwise ops agree with the
reference to a few ulp (libm vs numpy's SIMD math), and reductions/contractions/normalisations
to the summation-order tolerance, because the llvm capsules reassociate sums (numerical policy
implementationDefined) where numpy sums pairwise or BLAS blocks. The windowed backward ops
(BACKWARD_RECORDS) run the same way: the pooling gradients add the same terms in the
reference's order (EXACT, in fact bit-identical), the convolution gradients are contractions
(SUMS: f64 rtol 1e-11, f32 rtol 2e-5 / atol 2e-6).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from op_records import BACKWARD_RECORDS, RECORDS, OpRecord

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen.jit import compile_graph, node_kernel
from tlc.codegen.lower import LOWERINGS
from tlc.codegen.module import build_graph_module, optimized_ir
from tlc.codegen.target import Target, compile_ir, emit_assembly
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect import ops
from tlc.dialect.payload_section import payload_from_module
from tlc.semantics.interpret import EvalError, interpret
from tlc.semantics.reference import LOG_MESSAGE

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text(encoding="utf-8")
X0 = np.array([0.3, -0.2, 0.1, 0.4])
DTYPES = (np.float64, np.float32)


def graph_of(text: str, name: str | None = None):
    module = tlc.parse(text)
    graph = checked_graph(module, name)
    return graph, payload_from_module(module, graph.graph_name)


@pytest.mark.parametrize("rec", RECORDS + BACKWARD_RECORDS, ids=lambda r: r.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_node_kernel_matches_reference(rec: OpRecord, dtype: type) -> None:
    graph = rec.graph()
    inputs, payload = rec.sample(np.random.default_rng(7))
    expected = interpret(graph, payload, inputs, dtype).output
    kernel = node_kernel(
        graph.nodes[rec.node_id], list(rec.parents), payload.get(rec.node_id), dtype
    )
    got = kernel([np.asarray(x, dtype) for x in inputs])
    assert got.dtype == dtype and got.shape == expected.shape
    tol = rec.tol64 if dtype == np.float64 else rec.tol32
    np.testing.assert_allclose(got, expected, **tol.kw())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_seed_mlp_jit(dtype: type) -> None:
    graph, payload = graph_of(MLP)
    f = compile_graph(graph, payload, dtype)
    out = f(X0.astype(dtype))
    assert out.shape == () and out.dtype == dtype
    assert f"{float(out):.6f}" == "0.027713"
    assert compile_graph(graph, payload, dtype) is f  # cached


def test_public_compile_api() -> None:
    f = tlc.compile(MLP, dtype="f32")
    assert f"{float(f(X0.astype(np.float32))):.6f}" == "0.027713"


LOG_GRAPH = """
tl.graph @g {
  %0 = input : [3]
  %1 = exp(%0) : [3]
  %2 = sub(%0, %1) : [3]
  %3 = log(%2) : [3]
  output %3
}
"""


def test_log_domain_error_matches_reference() -> None:
    """x - exp(x) < 0 always: the generated code returns LOG_DOMAIN and the JIT raises the
    reference's located error."""
    graph, payload = graph_of(LOG_GRAPH)
    f = compile_graph(graph, payload)
    with pytest.raises(EvalError) as compiled:
        f(np.array([0.5, 1.0, 2.0]))
    with pytest.raises(EvalError) as reference:
        interpret(graph, payload, np.array([0.5, 1.0, 2.0]))
    messages = [exc.value.diagnostics[0].message for exc in (compiled, reference)]
    assert messages == [LOG_MESSAGE, LOG_MESSAGE]
    assert compiled.value.diagnostics[0].location == reference.value.diagnostics[0].location


def test_log_nan_input_fails() -> None:
    graph, payload = graph_of(LOG_GRAPH.replace("%2 = sub(%0, %1)", "%2 = add(%0, %1)"))
    f = compile_graph(graph, payload)
    assert np.all(np.isfinite(f(np.array([0.5, 1.0, 2.0]))))
    with pytest.raises(EvalError, match=re.escape(LOG_MESSAGE)):
        f(np.array([0.5, np.nan, 2.0]))


def test_misuse_through_the_jit() -> None:
    graph, payload = graph_of(MLP)
    f = compile_graph(graph, payload)
    with pytest.raises(ValueError, match=r"input has shape \[5\], expected \[4\]"):
        f(np.zeros(5))
    with pytest.raises(TypeError, match="out has dtype float32, expected float64"):
        f(np.zeros(4), out=np.zeros((), dtype=np.float32))
    widened = f(np.array(X0, dtype=np.float32))  # inputs are cast, exactly widened here
    assert widened.dtype == np.float64 and widened == f(np.array(X0, np.float32).astype(float))
    with pytest.raises(ValueError, match="parameters are compiled in"):
        f(X0, params=np.zeros(3))


def test_missing_payload_is_a_located_error() -> None:
    graph, _ = graph_of(MLP)
    with pytest.raises(EvalError, match="IR eval: missing linear payload for node 1"):
        compile_graph(graph, tlc.core.payload.Payload())


BATCHED = """
tl.graph @b {
  %0 = input : [8, 4]
  %1 = linear(%0) : [8, 5]
  %2 = relu(%1) : [8, 5]
  %3 = softmax(%2) {axis = 1} : [8, 5]
  output %3
}
"""


def test_graph_with_leading_batch_dim() -> None:
    rng = np.random.default_rng(1)
    graph, _ = graph_of(BATCHED)
    payload = tlc.core.payload.Payload(
        {1: {"weight": rng.normal(size=(5, 4)), "bias": rng.normal(size=5)}}
    )
    x = rng.normal(size=(8, 4))
    got = compile_graph(graph, payload)(x)
    np.testing.assert_allclose(got, interpret(graph, payload, x).output, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_batch_maps_a_single_example_graph(dtype: type) -> None:
    graph, payload = graph_of(MLP)
    xs = np.random.default_rng(2).normal(size=(6, 4)).astype(dtype)
    f = compile_graph(graph, payload, dtype, batch=6)
    assert f.input_shape == (6, 4) and f.output_shape == (6,)
    expected = [interpret(graph, payload, x, dtype).output for x in xs]
    np.testing.assert_allclose(f(xs), expected, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_emit_llvm_signature() -> None:
    text = optimized_ir(tlc.parse(MLP))
    assert re.search(r"define .*i32 @tlc_mlp\(ptr .*, ptr .*\)", text)
    assert "@tanh" in text


LINEAR_256 = """
tl.graph @wide {
  %0 = input : [16, 256]
  %1 = linear(%0) : [16, 256]
  %2 = relu(%1) : [16, 256]
  output %2
}
"""


#: Pinned targets (never the host): the register class each level's hot loops must use.
#: (skylake-avx512 is left out: LLVM tunes it to prefer 256-bit vectors in loops.)
VECTOR_REGISTERS = {"znver3": "ymm", "haswell": "ymm", "znver4": "zmm"}


@pytest.mark.parametrize("cpu", sorted(VECTOR_REGISTERS))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_hot_loops_use_the_targets_vectors(dtype: type, cpu: str) -> None:
    """Linear, matmul and elementwise loops are vectorised to the target's widest registers:
    256-bit ymm on AVX2 CPUs, 512-bit zmm on AVX-512 ones, whatever machine runs the test."""
    graph, _ = graph_of(LINEAR_256)
    rng = np.random.default_rng(3)
    payload = tlc.core.payload.Payload(
        {1: {"weight": rng.normal(size=(256, 256)), "bias": rng.normal(size=256)}}
    )
    target = Target(cpu)
    built = build_graph_module(graph, payload, dtype, target=target)
    asm = emit_assembly(compile_ir(built.ir, target), target)
    reg = VECTOR_REGISTERS[cpu]
    assert re.search(rf"vfmadd\w+\s+.*%{reg}", asm), f"the GEMM should use {reg} FMAs"
    # relu: a compare with 0 (x ugt 0) and a select, the reference's max(x, 0)
    assert re.search(rf"vcmp\w+\s+.*%{reg}", asm), f"relu should be a {reg} compare"
    if reg == "ymm":
        assert "zmm" not in asm, "AVX2 code must not touch AVX-512 registers"


def test_unsupported_ops_are_refused() -> None:
    """No op is unsupported today; the refusal path is exercised with a temporary entry."""
    from tlc.dialect.ops import TanhOp

    graph, payload = graph_of(MLP)
    LOWERINGS.unsupported[TanhOp] = "a test pretends it has no lowering"
    try:
        with pytest.raises(DiagnosticError, match="codegen: cannot compile tanh node 5: a test"):
            build_graph_module(graph, payload)
    finally:
        del LOWERINGS.unsupported[TanhOp]


MATRICES = """
tl.graph @lin {
  %0 = input : [70, 33]
  %1 = linear(%0) : [70, 19]
  output %1
}
tl.graph @mm {
  %0 = input : [7, 9]
  %1 = const {shape = [9, 70]} : [9, 70]
  %2 = matmul(%0, %1) : [7, 70]
  output %2
}
"""


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", ["lin", "mm"])
def test_matrix_kernels_at_tile_edges(dtype: type, name: str) -> None:
    """Shapes that exercise every path of the tiled kernels: several row blocks of 64, row and
    column remainders, and (matmul) whole 2-vector column tiles plus a scalar tail."""
    graph, _ = graph_of(MATRICES, name)
    rng = np.random.default_rng(4)
    records = {"lin": {1: {"weight": rng.normal(size=(19, 33)), "bias": rng.normal(size=19)}},
               "mm": {1: {"value": rng.normal(size=9 * 70)}}}  # fmt: skip
    payload = tlc.core.payload.Payload(records[name])
    x = rng.normal(size=graph.nodes[0].declared_shape).astype(dtype)
    expected = interpret(graph, payload, x, dtype).output
    tol = {"rtol": 1e-11, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-5}
    np.testing.assert_allclose(compile_graph(graph, payload, dtype)(x), expected, **tol)


def test_run_backend_llvm_refuses_interval(capsys: pytest.CaptureFixture[str]) -> None:
    from tlc.tools.run import main as run_main

    path = str(Path(__file__).parent.parent / "examples" / "mlp.tlir")
    args = [path, "--input", "0.3,-0.2,0.1,0.4", "--backend", "llvm"]
    assert run_main([*args, "--arithmetic", "interval"]) == 2
    assert "--backend llvm runs compiled f64 or f32 code" in capsys.readouterr().err
    assert run_main(args) == 0
    assert capsys.readouterr().out == "node 5: 0.027713\n"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("op", ["sign", "gelu_grad", "gelu_grad_tanh"])
def test_gradient_elementwise_ops(dtype: type, op: str) -> None:
    """The elementwise ops of gradient graphs against their reference rules: libm ulps (f64
    rtol 1e-12, f32 2e-6), plus, in f32, an absolute 5e-6 where the tanh form cancels: the
    rounding of 1 - t^2 (about 1.2e-7) is multiplied by |x du / 2| <= 14 on [-6, 6]."""
    form = ' {approximate = "tanh"}' if op.endswith("tanh") else ""
    node = f"%1 = {op.removesuffix('_tanh')}(%0){form} : [40]"
    text = f"tl.graph @g {{\n  %0 = input : [40]\n  {node}\n  output %1\n}}\n"
    graph, payload = graph_of(text)
    x = np.concatenate([np.linspace(-6, 6, 38), [0.0, -0.0]]).astype(dtype)
    expected = interpret(graph, payload, x, dtype).output
    tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == np.float64 else {"rtol": 2e-6, "atol": 5e-6}
    np.testing.assert_allclose(compile_graph(graph, payload, dtype)(x), expected, **tol)


LEAKY = """
tl.graph @leaky {{
  %0 = input : [{n}]
  %1 = leaky_relu(%0) {{negative_slope = {slope}}} : [{n}]
  %2 = leaky_relu(%1) {{negative_slope = {slope}}} : [{n}]
  output %2
}}
"""
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, -1e-310, 3e38, -3e38]


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint64 if x.dtype == np.float64 else np.uint32)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("slope", [0.2, 1.5, 0.01])
def test_leaky_relu_compiles_through_its_decomposition(
    tmp_path: Path, dtype: type, slope: float
) -> None:
    """leaky_relu has no lowering of its own: its kernel runs max_elem(x, s*x) (min_elem above
    slope 1), which selects exactly what the reference computes, so the JIT, the shared library
    and the single-node kernel agree with it bit for bit (positive slopes: see
    tests/test_decompose.py for the inputs where a slope <= 0 differs). The slope constant is
    baked into the code: a --runtime-payload build has no parameters."""
    from tlc.codegen.loader import load
    from tlc.codegen.shared_lib import build_library

    n = 45
    graph, payload = graph_of(LEAKY.format(n=n, slope=slope))
    assert ops.LeakyReluOp in LOWERINGS.derived
    rng = np.random.default_rng(5)
    x = np.concatenate([SPECIAL, rng.normal(scale=3, size=n - len(SPECIAL))])
    x = x.astype(dtype) if dtype == np.float64 else np.clip(x, -3e38, 3e38).astype(dtype)
    expected = interpret(graph, payload, x, dtype).output
    library = build_library([(graph, payload)], str(tmp_path / "libleaky.so"), dtype)
    for got in (
        compile_graph(graph, payload, dtype)(x),
        load(library.library)(x),
        compile_graph(graph, payload, dtype, runtime_payload=True)(x, np.zeros(0, dtype)),
    ):
        assert got.dtype == dtype
        np.testing.assert_array_equal(bits(got), bits(expected))
    kernel = node_kernel(graph.nodes[1], [(n,)], None, dtype)
    np.testing.assert_array_equal(bits(kernel([x])), bits(interpret(graph, payload, x, dtype)[1]))
    assert build_graph_module(graph, payload, dtype, runtime_payload=True).params == ()


HARD = """
tl.graph @hard {{
  %0 = input : [{n}]
  %1 = hardswish(%0) : [{n}]
  %2 = hardsigmoid(%1) {{alpha = 0.2, beta = 0.5}} : [{n}]
  %3 = hardsigmoid(%0) {{alpha = {third}, beta = 0.5}} : [{n}]
  %4 = add(%2, %3) : [{n}]
  output %4
}}
"""


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_hard_sigmoid_and_swish_are_one_pass_maps(dtype: type) -> None:
    """hardswish and hardsigmoid are maps of their own (mobilenet_v3_small's hardswishes ran
    through their decomposition, beta, 0 and 1 materialised as full tensors and a pass over
    memory per op: a third of its call), computing the reference's operations in its order:
    bit for bit at the corners (-3, 3, the clamps), zeros, infinities and NaN."""
    n = 600
    graph, payload = graph_of(HARD.format(n=n, third=1 / 3))
    plan = build_graph_module(graph, payload, dtype).plan
    assert plan is not None and all(plan.nodes[i].scratch == 0 for i in (1, 2, 3))
    assert not {ops.HardSwishOp, ops.HardSigmoidOp} & LOWERINGS.derived
    corners = [-3.0, 3.0, -2.5, 2.5, -1.5, 1.5, 6.0, -6.0, 1 / 3, -1 / 3]
    rng = np.random.default_rng(8)
    x = np.concatenate([SPECIAL, corners, rng.normal(scale=4, size=n - len(SPECIAL) - 10)])
    x = x.astype(dtype) if dtype == np.float64 else np.clip(x, -3e38, 3e38).astype(dtype)
    expected = interpret(graph, payload, x, dtype)
    got = compile_graph(graph, payload, dtype)(x)
    np.testing.assert_array_equal(bits(got), bits(expected.output))
    for i in (1, 2, 3):
        kernel = node_kernel(graph.nodes[i], [(n,)], None, dtype)
        np.testing.assert_array_equal(bits(kernel([expected[i - 1 if i < 3 else 0]])),
                                      bits(expected[i]))  # fmt: skip


def test_a_decomposition_into_an_unsupported_op_is_refused() -> None:
    """A decomposition is lowered op by op: one the table refuses is a located error naming the
    decomposed node."""
    graph, payload = graph_of(LEAKY.format(n=3, slope=0.5))
    LOWERINGS.unsupported[ops.MaxElemOp] = "a test pretends it has no lowering"
    try:
        message = (
            "codegen: cannot compile leaky_relu node 1: its decomposition uses max_elem: "
            "a test pretends"
        )
        with pytest.raises(DiagnosticError, match=message):
            build_graph_module(graph, payload)
    finally:
        del LOWERINGS.unsupported[ops.MaxElemOp]


#: One node of every window kind, as a function of its kernel extent k (a k x k window on
#: 3x16x16 planes); gradients take their other operands from constants.
WINDOWS = {
    "conv": "conv(%0) {{kernel = [{k}, {k}], stride = [2, 2], padding = [1, 1], "
    "in_channels = 3, out_channels = 4}}",
    "conv_valid": "conv(%0) {{kernel = [{k}, {k}], in_channels = 3, out_channels = 4}}",
    # A fixed stride: the staging of stride phases (one shuffle per phase) grows with it.
    "max_pool": "max_pool(%0) {{kernel = [{k}, {k}], stride = [2, 2], padding = [1, 1]}}",
    "avg_pool": "avg_pool(%0) {{kernel = [{k}, {k}], stride = [2, 2]}}",
    "conv_input_grad": "conv_input_grad(%1, %2) {{kernel = [{k}, {k}], padding = [{p}, {p}], "
    "in_channels = 3, out_channels = 4}} : [3, 16, 16]",
    "conv_weight_grad": "conv_weight_grad(%0, %1) {{kernel = [{k}, {k}], padding = [{p}, {p}], "
    "in_channels = 3, out_channels = 4}}",
    "max_pool_grad": "max_pool_grad(%0, %3) {{kernel = [{k}, {k}], padding = [{p}, {p}], "
    "stride = [1, 1]}}",
    "avg_pool_grad": "avg_pool_grad(%3) {{kernel = [{k}, {k}], padding = [{p}, {p}], "
    "stride = [1, 1]}} : [3, 16, 16]",
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize(
    ("axis", "parts"),
    [(1, [(2, 3, 8), (2, 1, 8), (2, 5, 8)]), (0, [(4, 9), (1, 9)]), (2, [(2, 2, 20), (2, 2, 3)])],
    ids=["rows and a short row", "whole blocks", "last axis"],
)
def test_concat_copies_rows_exactly(axis: int, parts: list, dtype: type) -> None:
    """Rows of at least `COPY_RUN` elements are copied whole (one memcpy each), shorter ones
    element by element: either way the output is numpy's concatenation, bit for bit."""
    out = list(parts[0])
    out[axis] = sum(p[axis] for p in parts)
    size = sum(int(np.prod(p)) for p in parts)
    lines = [f"  %0 = input : [{size}]"]
    start, ids = 0, []
    for i, shape in enumerate(parts):
        n = int(np.prod(shape))
        lines.append(
            f"  %{2 * i + 1} = gather(%0) {{axis = 0, indices = {list(range(start, start + n))}}}"
        )
        lines.append(f"  %{2 * i + 2} = reshape(%{2 * i + 1}) {{from = [{n}], to = {list(shape)}}}")
        ids.append(f"%{2 * i + 2}")
        start += n
    lines.append(f"  %{2 * len(parts) + 1} = concat({', '.join(ids)}) {{axis = {axis}}} : {out}")
    graph, payload = graph_of(
        "tl.graph @c {\n" + "\n".join(lines) + f"\n  output %{2 * len(parts) + 1}\n}}"
    )
    x = np.random.default_rng(0).normal(size=size).astype(dtype)
    pieces, start = [], 0
    for shape in parts:
        n = int(np.prod(shape))
        pieces.append(x[start : start + n].reshape(shape))
        start += n
    got = compile_graph(graph, payload, dtype)(x)
    assert got.tobytes() == np.concatenate(pieces, axis=axis).tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_maps_of_every_size_share_one_kernel(dtype: type, monkeypatch) -> None:
    """In a graph of more than INLINE_NODES nodes, relus of 35 sizes (and tanhs of 35) run two
    functions that take the length as an argument, with the values of per-node kernels."""
    from tlc.codegen import module as codegen_module

    lines, parts, nid = ["  %0 = input : [400]"], [], 0
    for i in range(35):
        n = 256 + 3 * i
        lines.append(f"  %{nid + 1} = gather(%0) {{axis = 0, indices = {list(range(n))}}}")
        lines.append(f"  %{nid + 2} = {'relu' if i % 2 else 'tanh'}(%{nid + 1})")
        parts.append(f"%{nid + 2}")
        nid += 2
    total = sum(256 + 3 * i for i in range(35))
    lines.append(f"  %{nid + 1} = concat({', '.join(parts)}) {{axis = 0}} : [{total}]")
    text = "tl.graph @maps {\n" + "\n".join(lines) + f"\n  output %{nid + 1}\n}}"
    graph, payload = graph_of(text)
    assert len(graph.nodes) > codegen_module.INLINE_NODES
    ir_text = build_graph_module(graph, payload, dtype).ir
    assert len(re.findall(r"^define .*@\"?tlc_maps\.map\.relu", ir_text, re.M)) == 1
    assert len(re.findall(r"^define .*@\"?tlc_maps\.map\.tanh", ir_text, re.M)) == 1
    x = np.random.default_rng(1).normal(size=400).astype(dtype)
    shared = compile_graph(graph, payload, dtype)(x)
    monkeypatch.setattr(codegen_module, "MAP_ELEMENTS", 10**9)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the constant is not in the JIT's cache key
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    per_node = compile_graph(graph, payload, dtype)(x)
    assert "map.relu" not in build_graph_module(graph, payload, dtype).ir
    assert shared.tobytes() == per_node.tobytes()
    want = np.concatenate([x[: 256 + 3 * i] for i in range(35)])
    odd = np.concatenate([np.full(256 + 3 * i, i % 2, bool) for i in range(35)])
    np.testing.assert_array_equal(shared[odd], np.maximum(want[odd], 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("nodes", [5, 71], ids=["own kernels", "size-generic maps"])
def test_a_relu_after_an_add_is_applied_in_its_pass(nodes: int, dtype: type) -> None:
    """add + relu (a residual block's end) is one pass: the relu is fused into the add's
    kernel, or into the size-generic map kernel of graphs over INLINE_NODES nodes, which
    then has no relu function; the values are numpy's, bit for bit."""
    lines = ["  %0 = input : [300]"]
    for i in range((nodes - 1) // 2):
        lines += [f"  %{2 * i + 1} = add(%{2 * i}, %0)", f"  %{2 * i + 2} = relu(%{2 * i + 1})"]
    graph, payload = graph_of("tl.graph @r {\n" + "\n".join(lines) + f"\n  output %{nodes - 1}\n}}")
    built = build_graph_module(graph, payload, dtype)
    assert all(p.fused_into == p.node.id - 1 for p in built.plan.nodes[2::2])
    assert "relu" not in built.ir
    assert ("map.add" in built.ir) == (nodes > 64)
    x = np.random.default_rng(2).normal(size=300).astype(dtype)
    want = x
    for _ in range((nodes - 1) // 2):
        want = np.maximum(want + x, 0)
    assert compile_graph(graph, payload, dtype)(x).tobytes() == want.tobytes()


@pytest.mark.parametrize("op", sorted(WINDOWS))
def test_window_code_does_not_grow_with_the_kernel(op: str) -> None:
    """Kernel taps are loops, never unrolled by the lowering: a 7x7 window's IR is the size of
    a 3x3 one's (unrolled taps made it 3-5x larger, and one 5x5 convolution took LLVM over a
    minute to optimise). Output extents differ, so the matrix kernels' remainder paths may
    add a little."""

    def ir_lines(k: int) -> int:
        text = f"""tl.graph @w {{
  %0 = input : [3, 16, 16]
  %1 = const {{shape = [4, 16, 16]}} : [4, 16, 16]
  %2 = const {{shape = [4, 3, {k}, {k}]}} : [4, 3, {k}, {k}]
  %3 = const {{shape = [3, 16, 16]}} : [3, 16, 16]
  %4 = {WINDOWS[op].format(k=k, p=k // 2)}
  output %4
}}"""
        graph = checked_graph(tlc.parse(text), None)
        built = build_graph_module(graph, None, np.float64, runtime_payload=True)
        return built.ir.count("\n")

    small, large = ir_lines(3), ir_lines(7)
    assert large <= small * 1.15, f"{op}: {small} IR lines for a 3x3 window, {large} for 7x7"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize(
    "attrs",
    [
        "kernel = [5, 5], stride = [2, 2], padding = [2, 2]",
        "kernel = [3, 4], stride = [3, 2], padding = [1, 2], dilation = [2, 1]",
        "kernel = [5, 3], stride = [1, 3], padding = [0, 1], groups = 2",
        "kernel = [7, 7]",
    ],
)
def test_convolution_staging_paths(dtype: type, attrs: str) -> None:
    """im2col's staging (zero padding, stride phases split by whole vectors of lanes * stride
    inputs and a masked last step) and the direct path agree with the reference on widths
    that leave every remainder."""
    text = f"""tl.graph @c {{
  %0 = input : [2, 4, 23, 37]
  %1 = conv(%0) {{{attrs}, channel_axis = 1, in_channels = 4, out_channels = 6}}
  output %1
}}"""
    graph, _ = graph_of(text)
    node = graph.nodes[1]
    groups = node.meta("groups")
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(6, 4 // groups, *node.meta("kernel")))
    payload = tlc.core.payload.Payload({1: {"weight": weight, "bias": rng.normal(size=6)}})
    x = rng.normal(size=(2, 4, 23, 37)).astype(dtype)
    expected = interpret(graph, payload, x, dtype).output
    tol = {"rtol": 1e-11, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-5}
    np.testing.assert_allclose(compile_graph(graph, payload, dtype)(x), expected, **tol)
