"""The AVX2 code's own rules (`--target-cpu znver3`: 16 ymm registers, no mask registers): the
product tiles of more than one vector of columns (`gemm.avx2_tiles`), 1x1 convolutions' 6 x 2
tiles (`convolution.AVX2_CONV_TILE`), and stores of one run of lanes as plain stores of
pieces instead of `vmaskmovps` (`gemm.PIECE_STORES`). The rules
change no AVX-512 or SSE choice. Execution checks run the AVX2 code when this CPU has AVX2, and
compare bits exactly where the rule changes only how the same values are stored; against the
reference the tolerance is tests/test_conv_direct.py's (f32 rtol 2e-5 of the output's scale:
the kernels sum each patch row in their own order).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvmlite import ir
from test_codegen_targets import options, runnable
from test_conv_direct import close, conv_case, frame, reference

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import gemm, objcache
from tlc.codegen.builder import I1
from tlc.codegen.gemm import _lane_run, micro_kernel
from tlc.codegen.lower.convolution import kernel_name
from tlc.codegen.module import build_graph_module
from tlc.codegen.target import Target, compile_ir, emit_assembly, target_info
from tlc.core.payload import Payload

X86_64 = "x86_64-unknown-linux-gnu"


@pytest.mark.parametrize(
    ("cpu", "m", "n", "tile"),
    [
        ("znver3", 512, 49, (5, 2, 8)),  # 9 x 1 before: 38.6 GFLOP/s against 59.7
        ("haswell", 960, 49, (6, 2, 8)),
        ("znver3", 64, 8, (8, 1, 8)),  # one vector covers n: the single-vector tile stays
        ("znver4", 512, 49, (8, 2, 16)),  # AVX-512 and SSE choose as before
        ("znver4", 64, 16, (16, 1, 16)),
        ("x86-64-v2", 512, 49, (5, 2, 4)),
    ],
)
def test_avx2_products_wider_than_a_vector_take_two_vectors(
    cpu: str, m: int, n: int, tile: tuple[int, int, int]
) -> None:
    info = target_info(Target(cpu, triple=X86_64))
    mk = micro_kernel(info, 4, m, n)
    assert (mk.mr, mk.nv, mk.lanes) == tile
    assert gemm.avx2_tiles(info) == (cpu in ("znver3", "haswell"))


@pytest.mark.parametrize(
    ("cpu", "cin", "cout", "size", "attrs", "kind"),
    [
        # resnet18's 256 -> 512 1x1 stride 2 on 14 x 14 and mobilenet_v2's 160 -> 960 on 7 x 7:
        # C with 9 x 1 tiles before (its low model cycles kept C^T out), now C^T
        ("znver3", 256, 512, (14, 14), "stride = [2, 2]", "C^T 5x16"),
        ("znver3", 160, 960, (7, 7), "stride = [1, 1]", "C^T 5x16"),
        ("znver4", 256, 512, (14, 14), "stride = [2, 2]", "C^T 7x32"),
    ],
)
def test_few_positions_run_c_transposed_on_avx2(
    cpu: str, cin: int, cout: int, size: tuple[int, int], attrs: str, kind: str
) -> None:
    text, _, _ = conv_case(1, cin, cout, size, attrs, (1, 1))
    assert kernel_name(target_info(Target(cpu, triple=X86_64)), 4, frame(text)) == kind


@pytest.mark.parametrize(
    ("cpu", "cin", "cout", "size", "kernel", "kind"),
    [
        ("znver3", 384, 64, 27, 1, "C 6x16"),  # the model's 4 x 3 before: 61.4 -> 69.7 GFLOP/s
        ("znver3", 96, 16, 54, 1, "C 6x16"),
        ("znver3", 16, 64, 54, 1, "C 4x24"),  # a patch row of 16: the model's tile
        ("znver3", 24, 64, 56, 3, "C 4x24"),  # 3x3 under DIRECT_DEPTH: the model's tile
        ("znver4", 384, 64, 27, 1, "C 8x32"),
        ("x86-64-v2", 384, 64, 27, 1, "C 4x12"),
    ],
)
def test_avx2_1x1_convolutions_take_six_by_two_tiles(
    cpu: str, cin: int, cout: int, size: int, kernel: int, kind: str
) -> None:
    """In AVX2 code a 1x1 convolution's C = W patches over NARROW_DEPTH input channels or more
    runs 6 x 2 vectors (AVX2_CONV_TILE), which loads the fewest vectors of B per FMA."""
    pad = kernel // 2
    text, _, _ = conv_case(1, cin, cout, (size, size), f"padding = [{pad}, {pad}]",
                           (kernel, kernel))  # fmt: skip
    assert kernel_name(target_info(Target(cpu, triple=X86_64)), 4, frame(text)) == kind


def test_lane_runs_known_at_compile_time() -> None:
    def mask(*bits: bool) -> ir.Constant:
        return ir.Constant(ir.VectorType(I1, len(bits)), list(bits))

    assert _lane_run(None, 6, 8) == (0, 6)
    assert _lane_run(mask(False, True, True, False), 0, 4) == (1, 3)
    assert _lane_run(mask(False, False, True, True), 0, 4) == (2, 4)
    assert _lane_run(mask(False, False, False, False), 0, 4) == (0, 0)
    assert _lane_run(mask(True, False, True, True), 0, 4) is None  # two runs: masked
    variable = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), [mask(True).type]), "f")
    assert _lane_run(variable.args[0], 0, 1) is None


def _masked_stores(asm: str) -> list[str]:
    """`vmaskmovps`/`vmaskmovpd` stores (a register, the mask, then memory)."""
    return re.findall(r"vmaskmovp[sd]\s+%ymm\d+, %ymm\d+, [^\n]*\(", asm)


def test_avx2_direct_tiles_store_their_partial_rows_without_masks() -> None:
    """resnet18's 128 -> 128 3x3 on 28 x 28 (scaled down to 32 -> 16 channels, patch rows of
    288: the direct kernel, 1 x 6 tiles): its tile rows of 6 and 4 positions are stored as 8
    lanes; on AVX2 as plain stores of 4 and 2 lanes, no `vmaskmovps` store; the same bits as
    the masked stores, and the reference's values."""
    text, payload, x = conv_case(1, 32, 16, (28, 28), "padding = [1, 1]", (3, 3))
    target = Target("znver3", triple=X86_64)
    assert kernel_name(target_info(target), 4, frame(text)).startswith("direct 1x6")
    graph = tlc.parse(text)
    built = build_graph_module(checked_graph(graph), payload, np.float32, target=target)
    assert not _masked_stores(emit_assembly(compile_ir(built.ir, target), target))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm, "PIECE_STORES", 0)
        masked = build_graph_module(checked_graph(graph), payload, np.float32, target=target)
    assert _masked_stores(emit_assembly(compile_ir(masked.ir, target), target))
    znver3 = options(runnable("znver3"))
    got = tlc.compile(text, payload, "f32", **znver3)(x)
    close(got, reference(text, payload, x, np.float32), np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        patch.setattr(gemm, "PIECE_STORES", 0)
        before = tlc.compile(text, payload, "f32", **znver3)(x)
    np.testing.assert_array_equal(got, before)


@pytest.mark.parametrize("cpu", ["znver3", "x86-64-v3"])
def test_chunked_direct_tiles_keep_their_accumulators_in_registers(cpu: str) -> None:
    """512 -> 512 on 7 x 7 runs its rows of tiles in chunks of patch rows (AVX2), the partial
    sums on the stack between chunks (`KernelBuilder.kept_in_memory`). Each tile's loop over
    a chunk stores no vector register: in x86-64-v3 code, the default library's AVX2 variant,
    LLVM had carried the partial sums in registers and spilled an accumulator in the loop
    (28.9 GFLOP/s against 64.0 on a Zen 3)."""
    text, payload, _ = conv_case(1, 512, 512, (7, 7), "padding = [1, 1]", (3, 3))
    target = Target(cpu, triple=X86_64)
    graph = checked_graph(tlc.parse(text))
    built = build_graph_module(graph, payload, np.float32, target=target, bound_payload=True)
    asm = emit_assembly(compile_ir(built.ir, target), target)
    blocks = [re.split(r"\n\tj\w+\s", block)[0] for block in re.split(r"\n\.LBB\d+_\d+:", asm)]
    loops = [block for block in blocks if block.count("vfmadd") >= 9]
    assert len(loops) >= 2, "a tile of 4 positions and one of 3"
    for loop in loops:
        assert not re.search(r"vmov\w+\s+%ymm\d+, [^%\n]*\(", loop), f"spills:\n{loop}"


@pytest.mark.parametrize(("cpu", "fmas"), [("x86-64-v3", 36), ("haswell", 36), ("znver4", 0)])
def test_avx2_tile_loops_are_unrolled_on_every_cpu(cpu: str, fmas: int) -> None:
    """resnet18's 256 -> 256 on 14 x 14 (scaled to 64 -> 48 channels; 2 x 2 x 3 tiles, 12
    FMAs a step): its AVX2 tile loop holds 3 steps (`gemm.micro_unroll`) for CPUs whose
    scheduling model would not unroll it (x86-64-v3, the default library's AVX2 variant:
    1 step before, 256 -> 256 at 0.91 of znver3 code, now 1.00); AVX-512 loops are LLVM's."""
    text, payload, _ = conv_case(1, 64, 48, (14, 14), "padding = [1, 1]", (3, 3))
    target = Target(cpu, triple=X86_64)
    built = build_graph_module(checked_graph(tlc.parse(text)), payload, np.float32,
                               target=target)  # fmt: skip
    assert ("llvm.loop.unroll.count" in built.ir) == bool(fmas)
    if fmas:
        asm = emit_assembly(compile_ir(built.ir, target), target)
        blocks = [re.split(r"\n\tj\w+\s", b)[0] for b in re.split(r"\n\.LBB\d+_\d+:", asm)]
        assert max(block.count("vfmadd") for block in blocks) == fmas


@pytest.mark.parametrize(
    ("cin", "cout", "size", "attrs", "kernel"),
    [(32, 40, (13, 13), "padding = [1, 1]", (3, 3)),  # direct, a partial channel block
     (48, 96, (7, 7), "stride = [1, 1]", (1, 1)),  # C^T
     (24, 20, (11, 9), "stride = [2, 2], padding = [1, 1]", (3, 3))],
)  # fmt: skip
def test_avx2_code_gives_the_same_bits_on_one_and_two_threads(
    cin: int, cout: int, size: tuple[int, int], attrs: str, kernel: tuple[int, int]
) -> None:
    text, payload, x = conv_case(2, cin, cout, size, attrs, kernel, seed=cin)
    znver3 = options(runnable("znver3"))
    one = tlc.compile(text, payload, "f32", **znver3, threads=1)(x)
    two = tlc.compile(text, payload, "f32", **znver3, threads=2)(x)
    np.testing.assert_array_equal(one, two)
    close(one, reference(text, payload, x, np.float32), np.float32)


@pytest.mark.parametrize(
    ("cpu", "cin", "size", "attrs", "columns"),
    [
        # bench/run.py's CNN's 16 -> 32 stride 2 to 16 x 16: 256 columns in blocks of 227,
        # 240 and 16 before (a pass over the weights for one panel two-thirds full)
        ("znver3", 16, (32, 32), "stride = [2, 2], padding = [1, 1]", 264),
        ("znver4", 16, (32, 32), "stride = [2, 2], padding = [1, 1]", 256),  # one block
        ("x86-64-v2", 16, (32, 32), "stride = [2, 2], padding = [1, 1]", 228),  # SSE as before
        # 17 x 17 (289 columns) in blocks of 240: the last block of 49 is two panels, kept
        ("znver3", 16, (34, 34), "stride = [2, 2], padding = [1, 1]", 240),
        # rows of 19 and 22 columns, packed: 247 columns in one block, 484 in two, not three
        ("znver3", 16, (13, 19), "padding = [1, 1]", 264),
        ("znver3", 16, (22, 22), "padding = [1, 1]", 264),
    ],
)
def test_avx2_blocks_take_a_short_last_block_into_the_others(
    cpu: str, cin: int, size: tuple[int, int], attrs: str, columns: int
) -> None:
    """In AVX2 code a group's last block of C = W patches under one panel is spread over the
    others (`convolution._block_columns`), read in place or packed; the same bits as the
    blocks before, at 1 and 2 threads, and the reference's values."""
    from tlc.codegen.lower import convolution

    text, payload, x = conv_case(1, cin, 32, size, attrs, (3, 3), seed=size[1])
    f = frame(text)
    info = target_info(Target(cpu, triple=X86_64))
    mk = convolution._conv_mk(info, 4, f)
    assert convolution._block_columns(info, f, convolution.ConvPlan.of(f, 8), mk) == columns
    if cpu != "znver3":
        return
    znver3 = options(runnable("znver3"))
    one = tlc.compile(text, payload, "f32", **znver3, threads=1)(x)
    two = tlc.compile(text, payload, "f32", **znver3, threads=2)(x)
    np.testing.assert_array_equal(one, two)
    close(one, reference(text, payload, x, np.float32), np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        patch.setattr(convolution, "_block_columns",
                      lambda info, f, plan, mk: -(-plan.columns // mk.nr) * mk.nr)  # fmt: skip
        before = tlc.compile(text, payload, "f32", **znver3, threads=2)(x)
    np.testing.assert_array_equal(one, before)


def _linear_case(batch: int, n_in: int, n_out: int) -> tuple[str, Payload, np.ndarray]:
    rng = np.random.default_rng(n_in)
    text = (f"tl.graph @l {{\n  %0 = input : [{batch}, {n_in}]\n"
            f"  %1 = linear(%0) : [{batch}, {n_out}]\n  output %1\n}}\n")  # fmt: skip
    payload = Payload({1: {"weight": rng.normal(size=(n_out, n_in)) / np.sqrt(n_in),
                           "bias": rng.normal(size=n_out)}})  # fmt: skip
    return text, payload, rng.normal(size=(batch, n_in))


def test_avx2_dot_tiles_over_few_rows_take_the_widest_tiles() -> None:
    """In AVX2 code the dot tiles of a product with fewer rows than the tile's (batch 1 and
    2: a linear layer of under 4 panels, bench/run.py's 8192 -> 10 and the MLP's 1024 -> 10)
    take as many rows of W as the registers allow, in equal tiles (`gemm.row_columns`): 10
    columns in two passes over x of 5, not four of 3, 3, 3 and 1 (8192 -> 10: 5.4 -> 4.2 us
    on Zen 4, one thread). Each output is still one accumulator: the same bits as the tiles of
    3, at any count of rows; AVX-512 and SSE code is unchanged."""
    avx2 = target_info(Target("znver3", triple=X86_64))
    assert [gemm.row_columns(avx2, 1, n) for n in (1, 7, 8, 10, 14, 15)] == [1, 7, 4, 5, 7, 5]
    assert gemm.row_columns(avx2, 2, 10) == 4  # 8 accumulators, 2 + 4 loads: 14 registers
    for cpu in ("znver4", "x86-64-v2"):
        text, payload, _ = _linear_case(1, 300, 10)
        target = Target(cpu, triple=X86_64)
        graph = checked_graph(tlc.parse(text))
        before = str(build_graph_module(graph, payload, np.float32, target=target).ir)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gemm, "row_columns", lambda info, m, n: 1)
            assert str(build_graph_module(graph, payload, np.float32, target=target).ir) == before
    znver3 = options(runnable("znver3"))
    for batch, n_in in ((1, 8192), (1, 300), (2, 1027)):  # 300, 1027: a tail of k past vectors
        text, payload, x = _linear_case(batch, n_in, 10)
        got = tlc.compile(text, payload, "f32", **znver3)(x)
        expected = x @ payload[1]["weight"].T + payload[1]["bias"]
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(objcache.ENV_SWITCH, "0")
            patch.setattr(gemm, "row_columns", lambda info, m, n: 3)  # the tiles before
            before = tlc.compile(text, payload, "f32", **znver3)(x)
        np.testing.assert_array_equal(got, before)
