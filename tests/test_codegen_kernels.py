"""The packed matrix kernels: micro-kernels derived from the target, compile-time packed
weights, cache blocking, convolution as an implicit matrix product over the batch with
remainder tiles for any output extent, the direct depthwise kernel, the direct convolution
with output channels as the vector dimension (tests/test_conv_direct.py has its own cases) and
fused epilogues.

Shapes are chosen to reach every path: row tiles of their own height, a partial last panel,
several K blocks, output planes that are not whole vectors (so stores straddle two images),
staged (padded, strided) and direct inputs, runtime payloads. Each runs through the JIT for
an SSE, an AVX2 and an AVX-512 target where this CPU can (skipped with the reason otherwise)
against the reference interpreter; the assembly checks pin their CPU. Tolerances: f64 rtol
1e-11, f32 rtol 2e-5 (relative to the output's scale), the contractions' summation-order
tolerances of tests/op_records.py: the kernels reassociate sums over K of up to 1100 terms.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_codegen_targets import options, runnable

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import gemm
from tlc.codegen.gemm import micro_kernel
from tlc.codegen.jit import compile_graph
from tlc.codegen.lower import convolution
from tlc.codegen.lower.convolution import ConvFrame, _transposed_mk
from tlc.codegen.module import build_graph_module, pack_params
from tlc.codegen.target import Target, compile_ir, emit_assembly, target_info
from tlc.core.payload import Payload
from tlc.semantics.interpret import interpret

X86_64 = "x86_64-unknown-linux-gnu"
CPUS = ["x86-64-v2", "haswell", "znver4"]
DTYPES = {"f64": np.float64, "f32": np.float32}


def conv(shape: list[int], attrs: str, cin: int, cout: int, relu: bool = True) -> str:
    tail = "  %2 = relu(%1)\n  output %2" if relu else "  output %1"
    fields = f"{attrs}, channel_axis = 1, in_channels = {cin}, out_channels = {cout}"
    return f"tl.graph @c {{\n  %0 = input : {shape}\n  %1 = conv(%0) {{{fields}}}\n{tail}\n}}\n"


#: name -> (graph, the payload's field shapes for node 1).
GRAPHS = {
    # 37 rows: whole 8- or 6-row tiles and a remainder tile; 133 columns: a partial last
    # panel; k = 1100: two K blocks.
    "linear": (
        "tl.graph @l {\n  %0 = input : [37, 1100]\n  %1 = linear(%0) : [37, 133]\n"
        "  %2 = relu(%1) : [37, 133]\n  output %2\n}\n",
        {"weight": (133, 1100), "bias": (133,)},
    ),
    # 7x7 output planes over a batch of 3: stores straddle two images; the input read as it is.
    "conv_7x7": (
        conv([3, 5, 9, 9], "kernel = [3, 3], padding = [0, 0]", 5, 20),
        {"weight": (20, 5, 3, 3), "bias": (20,)},
    ),
    # 2x2 output planes (fewer columns than lanes) of a strided, padded convolution.
    "conv_small": (
        conv([5, 3, 4, 4], "kernel = [3, 3], stride = [2, 2], padding = [1, 1]", 3, 9),
        {"weight": (9, 3, 3, 3), "bias": (9,)},
    ),
    # 16-wide output rows: the tiles read the staged input directly (no packing).
    "conv_direct": (
        conv([2, 4, 16, 16], "kernel = [3, 3], padding = [1, 1]", 4, 12),
        {"weight": (12, 4, 3, 3), "bias": (12,)},
    ),
    # K = 32 * 9 = 288 per group: two K blocks of the convolution's product (partial sums
    # kept), with 7x7 output planes and a remainder row tile (two groups: the direct kernel
    # takes one group only).
    "conv_deep": (
        conv([2, 64, 7, 7], "kernel = [3, 3], padding = [1, 1], groups = 2", 64, 20),
        {"weight": (20, 32, 3, 3), "bias": (20,)},
    ),
    # 5x5 output planes of 128 channels over 2 images, a 1x1 stride-2 convolution: few
    # positions, many channels, computed as C^T = patches^T W^T on AVX2 and AVX-512
    # (`_transposed_mk`).
    "conv_transposed": (
        conv([2, 64, 10, 10], "kernel = [1, 1], stride = [2, 2]", 64, 128),
        {"weight": (128, 64, 1, 1), "bias": (128,)},
    ),
    # K = 32 * 9 = 288, one group, baked: the direct kernel (`conv_direct`: output channels as
    # the vector dimension), 9 x 11 output planes (edge tiles of their own shape) over 2
    # images, 40 channels (a partial last block of channels).
    "conv_channels": (
        conv([2, 32, 9, 11], "kernel = [3, 3], padding = [1, 1]", 32, 40),
        {"weight": (40, 32, 3, 3), "bias": (40,)},
    ),
    # A 1x1 convolution on 13x11 planes (143 positions, not whole vectors): on AVX-512 its
    # tiles read the input in place, the last vector of the plane under a mask.
    "conv_1x1": (
        conv([1, 24, 13, 11], "kernel = [1, 1]", 24, 40),
        {"weight": (40, 24, 1, 1), "bias": (40,)},
    ),
    # A 1x1 convolution over one image read in place with K = 600 (over CONV_KC): one block
    # of its 63 positions with K whole, no partial sums (`convolution._whole_in_place`).
    "conv_1x1_deep": (
        conv([1, 600, 9, 7], "kernel = [1, 1]", 600, 20),
        {"weight": (20, 600, 1, 1), "bias": (20,)},
    ),
    # 1x1 convolutions over 3 images of 9 x 11 (297 columns, too many for C^T), at stride 1
    # and 2 (phase 0 staged): packed from their planes by whole vectors, those reaching into
    # the next image in two masked loads (`convolution._pack_planes`).
    "conv_1x1_batch": (
        conv([3, 20, 9, 11], "kernel = [1, 1]", 20, 24),
        {"weight": (24, 20, 1, 1), "bias": (24,)},
    ),
    "conv_1x1_s2_batch": (
        conv([3, 12, 18, 22], "kernel = [1, 1], stride = [2, 2]", 12, 16),
        {"weight": (16, 12, 1, 1), "bias": (16,)},
    ),
    # A 1x1 convolution read in place with more output channels (320) than positions (300):
    # each row tile runs over every panel (`convolution._rows_outer`).
    "conv_1x1_tall": (
        conv([1, 16, 15, 20], "kernel = [1, 1]", 16, 320),
        {"weight": (320, 16, 1, 1), "bias": (320,)},
    ),
    # A 1x1 convolution whose weights have more than TRANSPOSE_WEIGHTS elements (260 x 1010):
    # C^T whatever the cycles, over 2 images of 3 x 3.
    "conv_1x1_wide": (
        conv([2, 260, 3, 3], "kernel = [1, 1]", 260, 1010),
        {"weight": (1010, 260, 1, 1), "bias": (1010,)},
    ),
    # 42-wide output rows, padded to 44 in the staged planes (2 columns of 44 computed for
    # nothing): the tiles read whole staged rows in place ("wide"), over 2 images; and 41-wide
    # rows of a stride-2 convolution, one stride phase 42 wide.
    "conv_wide": (
        conv([2, 4, 42, 42], "kernel = [3, 3], padding = [1, 1]", 4, 12),
        {"weight": (12, 4, 3, 3), "bias": (12,)},
    ),
    "conv_wide_s2": (
        conv([1, 3, 82, 82], "kernel = [3, 3], stride = [2, 2], padding = [1, 1]", 3, 8),
        {"weight": (8, 3, 3, 3), "bias": (8,)},
    ),
    # Depthwise (one input channel per group, two outputs each), strided and padded.
    "depthwise": (
        conv(
            [2, 6, 11, 13], "kernel = [3, 3], stride = [2, 2], padding = [1, 1], groups = 6", 6, 12
        ),
        {"weight": (12, 1, 3, 3), "bias": (12,)},
    ),
    # Pooling in vector strips: 3x3 stride 2 over staged stride phases, rows of 11 and 6
    # (wider and narrower than a vector, the last strip moved back or masked), padding.
    "max_pool": (
        "tl.graph @p {\n  %0 = input : [2, 5, 23, 12]\n"
        "  %1 = max_pool(%0) {kernel = [3, 3], stride = [2, 2], padding = [1, 1]}\n"
        "  output %1\n}\n",
        {},
    ),
    "avg_pool": (
        "tl.graph @p {\n  %0 = input : [3, 19, 37]\n"
        "  %1 = avg_pool(%0) {kernel = [2, 3], stride = [1, 2], padding = [1, 0]}\n"
        "  output %1\n}\n",
        {},
    ),
    # One window over each whole 13x13 plane: a reduction in vectors, the last one masked.
    "global_pool": (
        "tl.graph @p {\n  %0 = input : [1, 7, 13, 13]\n"
        "  %1 = avg_pool(%0) {kernel = [13, 13]}\n  output %1\n}\n",
        {},
    ),
}


def case(name: str, dtype: type) -> tuple:
    text, fields = GRAPHS[name]
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(11)
    payload = Payload({1: {f: rng.normal(size=shape) for f, shape in fields.items()}} if fields
                      else {})  # fmt: skip
    x = rng.normal(size=graph.nodes[0].declared_shape).astype(dtype)
    return text, graph, payload, x, interpret(graph, payload, x, dtype).output


def close(got: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    rtol = 1e-11 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_packed_kernels_compute_the_reference(name: str, dtype: str, cpu: str) -> None:
    target = options(runnable(cpu))
    text, _, payload, x, expected = case(name, DTYPES[dtype])
    close(tlc.compile(text, payload, dtype, **target)(x), expected, DTYPES[dtype])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_runtime_payloads_read_the_row_major_fields(name: str) -> None:
    """A runtime payload keeps the C ABI's row-major layout (`pack_params`): linear runs the
    dot-product tiles on it, convolution reads W row by row (f32, this machine's CPU)."""
    _, graph, payload, x, expected = case(name, np.float32)
    f = compile_graph(graph, None, np.float32, runtime_payload=True)
    close(f(x, pack_params(graph, payload, np.float32)), expected, np.float32)


@pytest.mark.parametrize(
    ("cpu", "itemsize", "m", "n", "tile"),
    [
        ("haswell", 4, 240, 1024, (6, 2, 8)),  # 6x16 on 16 ymm registers
        ("haswell", 4, 256, 1024, (4, 3, 8)),  # 4x24: no row past the edge
        ("znver3", 8, 240, 1024, (6, 2, 4)),
        ("znver4", 4, 256, 1024, (8, 2, 16)),  # 8x32 on 32 zmm registers
        ("skylake-avx512", 4, 256, 1024, (8, 2, 16)),
        ("znver4", 4, 1, 1024, (1, 4, 16)),  # batch 1: one row, four vectors
        ("x86-64-v2", 4, 240, 1024, (6, 2, 4)),
    ],
)
def test_micro_kernels_come_from_the_target(
    cpu: str, itemsize: int, m: int, n: int, tile: tuple[int, int, int]
) -> None:
    info = target_info(Target(cpu, triple=X86_64))
    mk = micro_kernel(info, itemsize, m, n)
    assert (mk.mr, mk.nv, mk.lanes) == tile
    assert mk.mr * mk.nv + mk.nv + 1 <= info.vector_registers


@pytest.mark.parametrize(
    ("shape", "stride", "cout", "transposed"),
    [((2, 32, 10, 10), 2, 128, True), ((1, 512, 7, 7), 1, 512, True),
     ((1, 64, 56, 56), 1, 64, False), ((1, 256, 14, 14), 1, 256, False)],
)  # fmt: skip
def test_few_positions_and_many_channels_compute_c_transposed(
    shape: tuple[int, ...], stride: int, cout: int, transposed: bool
) -> None:
    """On AVX-512, a 7x7 plane's 49 positions fill 7-row tiles exactly where 32-column panels
    over them would compute 64 columns for 49; a 56x56 plane stays C = W patches, and so does
    14x14 (196 positions: C^T would save only 12.5% of the cycles, less than it costs)."""
    attrs = f"kernel = [3, 3], stride = [{stride}, {stride}], padding = [1, 1]"
    text = conv(list(shape), attrs, shape[1], cout)
    node = checked_graph(tlc.parse(text)).nodes[1]
    out = node.infer([shape])
    info = target_info(Target("znver4", triple=X86_64))
    assert (_transposed_mk(info, 4, ConvFrame.of(node, shape, out)) is not None) == transposed


@pytest.mark.parametrize(
    ("shape", "cout", "stride", "transposed"),
    [((1, 512, 13, 13), 1000, 1, (True, True)), ((2, 512, 13, 13), 1000, 1, (True, True)),
     ((4, 512, 13, 13), 1000, 1, (False, True)), ((1, 512, 13, 13), 64, 1, (False, False)),
     ((1, 512, 26, 26), 1000, 2, (False, False))],
)  # fmt: skip
def test_1x1_convolutions_over_wide_weights_compute_c_transposed(
    shape: tuple[int, ...], cout: int, stride: int, transposed: tuple[bool, bool]
) -> None:
    """A 1x1 convolution read in place with more than TRANSPOSE_WEIGHTS weights runs as C^T
    for up to TRANSPOSE_WIDE_ROWS positions, where the cycle model alone keeps C (squeezenet's
    classifier 512 -> 1000 on 13 x 13, at batch 1 and in a row task of 2 images: C^T at 0.94
    of C's cycles, measured 12% faster); not over 4 images (676 positions) in AVX-512 code
    (znver4), but in AVX2 code (znver3) there, whose C would read 64 KiB of planes per panel
    (`_deep_in_place`); nor with narrow weights (64 channels), nor staged (stride 2)."""
    text = conv(list(shape), f"kernel = [1, 1], stride = [{stride}, {stride}]", shape[1], cout)
    node = checked_graph(tlc.parse(text)).nodes[1]
    frame = ConvFrame.of(node, shape, node.infer([shape]))
    for cpu, expected in zip(("znver4", "znver3"), transposed, strict=True):
        info = target_info(Target(cpu, triple=X86_64))
        assert (_transposed_mk(info, 4, frame) is not None) == expected, cpu


def test_1x1_convolutions_in_place_take_k_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1x1 convolution reading one image's planes in place is one block of its positions
    with K whole (up to IN_PLACE_KC) where its patches fit IN_PLACE_BLOCK: it packs nothing,
    so blocks only re-stream its weights and K blocks add partial sums' round trips (384 -> 64
    on 27 x 27, Zen 4: 0.444 -> 0.428 ms; 16 -> 64 on 54 x 54 0.095 -> 0.079). Over two
    images, or staged, the blocks stay. The bytes are those of the K-blocked product."""
    node, shape, out = _conv_node([1, 384, 27, 27], "kernel = [1, 1]", 64)
    assert convolution.ConvPlan.of(ConvFrame.of(node, shape, out), 8) == convolution.ConvPlan(
        1, 729, 384
    )
    # Its parts share out tiles of output channels, none counted as re-packing the block.
    assert convolution._conv_parts(node, [shape], out) == convolution.MAX_PARTS
    two = ConvFrame.of(*_conv_node([2, 384, 27, 27], "kernel = [1, 1]", 64))
    assert convolution.ConvPlan.of(two, 8).kc == convolution.CONV_KC
    staged = ConvFrame.of(*_conv_node([1, 384, 28, 28], "kernel = [1, 1], stride = [2, 2]", 64))
    assert convolution.ConvPlan.of(staged, 8).kc == convolution.CONV_KC
    _, graph, payload, x, _ = case("conv_1x1_deep", np.float32)
    runnable("haswell")
    whole = compile_graph(graph, payload, np.float32)(x)
    monkeypatch.setattr(convolution, "IN_PLACE_BLOCK", 0)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the constants are not in the caches' keys
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    assert compile_graph(graph, payload, np.float32)(x).tobytes() == whole.tobytes()


def _conv_node(shape: list[int], attrs: str, cout: int) -> tuple:
    """A convolution node of `conv`'s graph, its input shape and its output shape."""
    node = checked_graph(tlc.parse(conv(shape, attrs, shape[1], cout))).nodes[1]
    return node, tuple(shape), node.infer([tuple(shape)])


def test_1x1_convolutions_read_their_input_in_place() -> None:
    """On AVX2 and AVX-512 a 1x1 convolution's planes are its columns: the tiles load them
    from the input (the vectors reaching past the plane's end under a mask) instead of packing
    them by runs (a squeeze 96 -> 16 on 54 x 54 went from 65 to 92 GFLOP/s on AVX-512, 31 to
    58 in AVX2 code; ORT 66-71); SSE has no masked loads, and packs (whole vectors from the
    planes: `_pack_planes`, its loop over the vectors of a patch row named `slot`)."""
    _, graph, payload, _, _ = case("conv_1x1", np.float32)
    for cpu, lanes in (("znver4", 16), ("znver3", 8), ("x86-64-v2", 0)):
        ir_text = build_graph_module(graph, payload, np.float32,
                                     target=Target(cpu, triple=X86_64)).ir  # fmt: skip
        assert "run_first" not in ir_text, cpu
        assert ("slot.body" not in ir_text) == bool(lanes), cpu
        if lanes:
            assert f"llvm.masked.load.v{lanes}f32" in ir_text, cpu


def test_1x1_convolutions_read_in_place_prefetch_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1x1 convolution read in place loads each k step's vectors from another input plane,
    more streams than the hardware prefetchers follow: its first row tile prefetches
    IN_PLACE_AHEAD elements ahead when its input is over AHEAD_BYTES (a squeeze 96 -> 16 on
    54 x 54 at batch 16: 4.5 -> 2.9 ms, ORT 3.7-4.1); packed or staged convolutions do not.
    The prefetch changes no bits."""
    _, graph, payload, x, _ = case("conv_1x1", np.float32)
    assert "llvm.prefetch" not in build_graph_module(graph, payload, np.float32).ir  # 13 KiB
    monkeypatch.setattr(convolution, "PACK_AHEAD", 0)  # SSE's packing prefetches on its own
    monkeypatch.setattr(convolution, "AHEAD_BYTES", 0)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the constants are not in the caches' keys
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    for cpu, ahead in (("znver4", True), ("znver3", True), ("x86-64-v2", False)):
        ir_text = build_graph_module(graph, payload, np.float32,
                                     target=Target(cpu, triple=X86_64)).ir  # fmt: skip
        assert ("llvm.prefetch" in ir_text) == ahead, cpu
    _, staged, staged_payload, _, _ = case("conv_small", np.float32)
    assert "llvm.prefetch" not in build_graph_module(staged, staged_payload, np.float32).ir
    runnable("haswell")
    prefetched = compile_graph(graph, payload, np.float32)(x)
    monkeypatch.setattr(convolution, "IN_PLACE_AHEAD", 0)
    assert "llvm.prefetch" not in build_graph_module(graph, payload, np.float32).ir
    assert compile_graph(graph, payload, np.float32)(x).tobytes() == prefetched.tobytes()


@pytest.mark.parametrize("name", ["conv_1x1_batch", "conv_1x1_s2_batch"])
def test_1x1_convolutions_over_a_batch_pack_whole_vectors(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1x1 convolution packing the columns of several images (or the phase 0 a stride-2 one
    stages) reads each image's columns as consecutive elements of its planes: whole vectors,
    no table of runs, the next `PACK_AHEAD` planes prefetched (zoo resnet50's 1024 -> 256
    on 14 x 14 at batch 16: 18.66 -> 17.75 ms). The same bits as the packing by runs, for
    any thread count."""
    _, graph, payload, x, _ = case(name, np.float32)
    shape = graph.nodes[0].declared_shape
    frame = ConvFrame.of(graph.nodes[1], shape, graph.nodes[1].infer([shape]))
    assert convolution.ConvPlan.of(frame, 8).images == 3
    for cpu in CPUS:
        ir_text = build_graph_module(graph, payload, np.float32,
                                     target=Target(cpu, triple=X86_64)).ir  # fmt: skip
        assert "run_first" not in ir_text and "llvm.prefetch" in ir_text, cpu
    runnable("haswell")
    planes = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)]
    assert planes[0].tobytes() == planes[1].tobytes()
    monkeypatch.setattr(convolution, "_planar", lambda f, lanes: False)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the rules are not in the caches' keys
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    assert "run_first" in build_graph_module(graph, payload, np.float32).ir
    assert compile_graph(graph, payload, np.float32)(x).tobytes() == planes[0].tobytes()


def test_1x1_convolutions_with_more_channels_than_positions_run_rows_outer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1x1 convolution read in place with more output channels than positions, and input
    planes of at most ROWS_OUTER_PLANES bytes, runs each row tile over every panel: the
    weights, larger than the planes, are read once (zoo resnet50 at batch 1, in the network:
    256 -> 1024 on 14 x 14 6.52 -> 6.21 ms in 6 layers); 1024 -> 256 (800 KiB of planes, read
    again by every row tile) and 28 x 28 planes keep panels outer. The same bits either
    way, for any thread count."""
    for shape, cout, outer in (((1, 256, 14, 14), 1024, True), ((1, 1024, 14, 14), 256, False),
                               ((1, 512, 28, 28), 128, False), ((1, 128, 28, 28), 512, False),
                               ((2, 256, 14, 14), 1024, False)):  # fmt: skip
        node, shape_in, out = _conv_node(list(shape), "kernel = [1, 1]", cout)
        assert convolution._rows_outer(ConvFrame.of(node, shape_in, out)) == outer, shape
    _, graph, payload, x, _ = case("conv_1x1_tall", np.float32)
    shape = graph.nodes[0].declared_shape
    frame = ConvFrame.of(graph.nodes[1], shape, graph.nodes[1].infer([shape]))
    assert convolution._rows_outer(frame)
    runnable("haswell")
    outer = [compile_graph(graph, payload, np.float32, threads=t)(x) for t in (1, 2)]
    assert outer[0].tobytes() == outer[1].tobytes()
    monkeypatch.setattr(convolution, "_rows_outer", lambda f: False)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the rules are not in the caches' keys
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    assert compile_graph(graph, payload, np.float32)(x).tobytes() == outer[0].tobytes()


@pytest.mark.parametrize("name", ["conv_wide", "conv_wide_s2"])
def test_wide_rows_are_read_in_place(name: str) -> None:
    """A staged convolution whose output rows are a few columns short of the staged rows runs
    over whole staged rows: no packing by runs, no table of column starts (3x3 64 -> 64 on
    56 x 56: 85.6 -> 90.3 GFLOP/s; squeezenet's 7x7 s2 stem 83.7 -> 90.8, ORT 86.3)."""
    _, graph, payload, _, _ = case(name, np.float32)
    for cpu in CPUS:
        ir_text = build_graph_module(graph, payload, np.float32,
                                     target=Target(cpu, triple=X86_64)).ir  # fmt: skip
        assert "run_first" not in ir_text and "columns" not in ir_text, cpu


@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
@pytest.mark.parametrize(
    ("h", "w", "kernel", "stride", "pad"),
    [(32, 32, 3, 2, 1), (9, 37, 3, 2, 1), (7, 70, 4, 3, 2), (5, 17, 2, 4, 3), (6, 5, 3, 2, 0),
     (4, 96, 3, 2, 1)],
)  # fmt: skip
def test_stride_phases_take_every_input_once(
    cpu: str, h: int, w: int, kernel: int, stride: int, pad: int
) -> None:
    """The staging of stride phases (`convolution._split_row`) copies each input to its
    phase's element, whatever the row's width against lanes * stride (whole steps, a masked
    last one, rows shorter than one step) and the padding: a convolution whose output channel
    c * taps + t is input channel c at tap t gives the zero-padded input there, exactly."""
    target = Target() if cpu == "host" else runnable(cpu)
    taps = kernel * kernel
    text = conv([2, 3, h, w], f"kernel = [{kernel}, {kernel}], stride = [{stride}, {stride}], "
                f"padding = [{pad}, {pad}]", 3, 3 * taps, relu=False)  # fmt: skip
    graph = checked_graph(tlc.parse(text))
    weight = np.zeros((3, taps, 3, taps))
    for c in range(3):
        weight[c, :, c, :] = np.eye(taps)
    payload = Payload({1: {"weight": weight.reshape(3 * taps, 3, kernel, kernel),
                           "bias": np.zeros(3 * taps)}})  # fmt: skip
    x = np.random.default_rng(h * w).normal(size=(2, 3, h, w)).astype(np.float32)
    got = compile_graph(graph, payload, np.float32, target=target)(x)
    oh, ow = got.shape[2:]
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad + stride), (pad, pad + stride)))
    for t in range(taps):
        dy, dx = divmod(t, kernel)
        expected = padded[:, :, dy : dy + oh * stride : stride, dx : dx + ow * stride : stride]
        np.testing.assert_array_equal(got[:, t::taps], expected)


def test_dot_tiles_take_five_rows_of_w_where_they_fit() -> None:
    """A linear layer of few columns (the dot tiles) covers n = 10 with two 4 x 5 tiles on
    AVX-512 (29 of 32 registers) instead of 4 x 4, 4 x 4 and 4 x 2: the bench CNN's 64 x 8192
    -> 10 went from 0.127 to 0.110 ms. Not where it adds a partial tile (n = 32: 8 of 4, not
    6 of 5 and one of 2). AVX2 keeps 3 x 3 (3 x 4 would need 19 of 16)."""
    tiles_512, tiles_256 = gemm.TILES[32], gemm.TILES[16]
    avx512, avx2 = target_info(Target("znver4")), target_info(Target("znver3"))
    assert [gemm.dot_columns(avx512, tiles_512, n) for n in (10, 5, 8, 16, 15, 1, 32, 300)] == [
        5, 5, 4, 4, 5, 4, 4, 5]  # fmt: skip
    assert gemm.dot_columns(avx2, tiles_256, 10) == 3


@pytest.mark.parametrize(
    ("m", "depth", "n", "runtime"),
    [(64, 8192, 10, False), (7, 37, 15, False), (6, 50, 300, True)],
    ids=["bench CNN", "tails", "runtime payload"],
)
def test_wider_dot_tiles_give_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, m: int, depth: int, n: int, runtime: bool
) -> None:
    """Each output of the dot tiles is one accumulator whatever the tile: 4 x 5 tiles give
    the bits of 4 x 4 ones, with partial row tiles, scalar tails, a runtime payload (n = 300
    split in parts) and one or two threads."""
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    rng = np.random.default_rng(2)
    text = (f"tl.graph @l {{\n  %0 = input : [{m}, {depth}]\n"
            f"  %1 = linear(%0) : [{m}, {n}]\n  output %1\n}}\n")  # fmt: skip
    graph = checked_graph(tlc.parse(text))
    payload = Payload({1: {"weight": rng.normal(size=(n, depth)), "bias": rng.normal(size=n)}})
    x = rng.normal(size=(m, depth)).astype(np.float32)
    params = pack_params(graph, payload, np.float32)

    def run(threads: int) -> np.ndarray:
        monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
        if runtime:
            return compile_graph(graph, None, np.float32, runtime_payload=True,
                                 threads=threads)(x, params)  # fmt: skip
        return compile_graph(graph, payload, np.float32, threads=threads)(x)

    wide = run(2)
    expected = interpret(graph, payload, x, np.float32).output
    np.testing.assert_allclose(wide, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    with monkeypatch.context() as patch:
        patch.setattr(gemm, "dot_columns", lambda info, tiles, n: tiles.nr)
        assert run(1).tobytes() == wide.tobytes()


def test_rows_of_whole_steps_stage_unmasked() -> None:
    """The bench CNN's 16 -> 32 3x3 stride-2 layer over rows of 32: each row is one step of
    lanes * 2 inputs on AVX-512 (two on AVX2), de-interleaved into its two phases, with no
    masked load or store and no scalar copy (aligned at the phases' elements, every row took
    a masked 15-lane step and two scalar copies). The call's staging went from 8.4 to 5.4% of
    the network's samples on AVX-512, from 12.2 to 5.7% in AVX2 code."""
    text = conv([2, 16, 32, 32], "kernel = [3, 3], stride = [2, 2], padding = [1, 1]", 16, 32)
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(0)
    payload = Payload({1: {"weight": rng.normal(size=(32, 16, 3, 3)), "bias": rng.normal(size=32)}})
    for cpu in ("znver4", "znver3"):
        ir_text = build_graph_module(graph, payload, np.float32,
                                     target=Target(cpu, triple=X86_64)).ir  # fmt: skip
        assert "llvm.masked" not in ir_text, cpu


def hot_loop(asm: str) -> str:
    """The basic block with the most FMAs, up to its first branch (the micro-kernel's loop
    over k, up to its back edge)."""
    blocks = [re.split(r"\n\tj\w+\s", block)[0] for block in re.split(r"\n\.LBB\d+_\d+:", asm)]
    return max(blocks, key=lambda block: block.count("vfmadd"))


@pytest.mark.parametrize(("cpu", "reg", "fmas"), [("znver3", "ymm", 12), ("znver4", "zmm", 16)])
@pytest.mark.parametrize("name", ["linear", "conv_direct", "conv_7x7", "conv_channels"])
def test_micro_kernel_loops_are_fmas_on_full_registers(
    name: str, cpu: str, reg: str, fmas: int
) -> None:
    """The inner loop: FMAs on the target's full-width registers fed by broadcasts of A, no
    stack traffic (nothing spills) and no other vector width."""
    _, graph, payload, _, _ = case(name, np.float32)
    target = Target(cpu, triple=X86_64)
    built = build_graph_module(graph, payload, np.float32, target=target)
    asm = emit_assembly(compile_ir(built.ir, target), target)
    loop = hot_loop(asm)
    # The broadcast of A is a vbroadcastss from memory or folded into the FMA ({1to16}).
    source = rf"(%{reg}\d+|\S+\{{1to\d+\}})"
    assert len(re.findall(rf"vfmadd\d{{3}}ps\s+{source}, %{reg}\d+, %{reg}\d+", loop)) >= fmas
    assert re.search(rf"vbroadcastss\s+[^,]*\(.*%{reg}|\{{1to", loop), "A is broadcast"
    # The loop only loads: a vector register stored to memory is a spill.
    assert not re.search(r"vmov\w+\s+%[xyz]mm\d+, [^%\n]*\(", loop), f"spills:\n{loop}"
    other = "zmm" if reg == "ymm" else "ymm"
    assert other not in loop


@pytest.mark.parametrize(
    "activation", ["relu(%1)", "clip(%1) {min = 0.0, max = 6.0}", "hardswish(%1)"]
)
def test_relu_is_fused_into_the_stores(activation: str) -> None:
    """A relu (or relu6, a clip, or a hardswish: mobilenet_v3_small's, 2.9 -> 2.4 ms of its
    call) that is the only user of a linear or convolution is applied as the tiles are
    stored: the graph has no function for the relu node, and the values match."""
    for name in ("linear", "conv_7x7", "depthwise", "conv_transposed", "conv_channels"):
        text, _, payload, x, _ = case(name, np.float32)
        graph = checked_graph(tlc.parse(text.replace("relu(%1)", activation)))
        expected = interpret(graph, payload, x, np.float32).output
        built = build_graph_module(graph, payload, np.float32)
        assert re.search(r'@"tlc_\w\.n1"', built.ir), "the producer has a function"
        assert '.n2"' not in built.ir, f"{name}: relu compiled on its own"
        close(compile_graph(graph, payload, np.float32)(x), expected, np.float32)


def test_relu_with_a_second_user_is_not_fused() -> None:
    text = (
        "tl.graph @g {\n  %0 = input : [8, 300]\n  %1 = linear(%0) : [8, 300]\n"
        "  %2 = relu(%1) : [8, 300]\n  %3 = add(%1, %2) : [8, 300]\n  output %3\n}\n"
    )
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(2)
    payload = Payload({1: {"weight": rng.normal(size=(300, 300)), "bias": rng.normal(size=300)}})
    assert '@"tlc_g.n2"' in build_graph_module(graph, payload, np.float32).ir
    x = rng.normal(size=(8, 300)).astype(np.float32)
    expected = interpret(graph, payload, x, np.float32).output
    close(compile_graph(graph, payload, np.float32)(x), expected, np.float32)


@pytest.mark.parametrize("cpu", ["host", "znver3", "x86-64-v2"])
@pytest.mark.parametrize(
    ("h", "w", "kernel", "stride", "padding", "dilation"),
    [(112, 112, 3, 2, 1, 1), (17, 45, 3, 2, 1, 1), (13, 40, 3, 1, 1, 1), (16, 33, 5, 2, 2, 1),
     (12, 70, 3, 1, 2, 2), (11, 37, 3, 2, 0, 1), (3, 17, 3, 1, 1, 1)],
    ids=["mobilenet 112", "odd stride 2", "stride 1", "5x5 pad 2", "dilation 2", "no padding",
         "3 rows"],
)  # fmt: skip
def test_depthwise_convolutions_read_their_input_in_place(
    cpu: str, h: int, w: int, kernel: int, stride: int, padding: int, dilation: int
) -> None:
    """A depthwise convolution over 2-D planes run row by row reads its input in place
    (`_depthwise_rows`: the kernel rows in the padding read a row of zeros, the rows' end
    strips mask their loads and stores), at stride 1 or 2 (one shuffle picks every other
    lane): the reference's values (rtol 2e-5 as `close`: 9-25 terms reassociated), NaN where
    it has NaN (inputs and one weight NaN), the same bits for 1-3 threads, on AVX-512, AVX2
    and SSE; relu6 fused into its stores. (Without AVX-512, rows of mostly masked strips
    may stage instead: the same checks then cover the staged kernel.)"""
    target = runnable(cpu) if cpu != "host" else Target()
    c = 5
    attrs = (f"kernel = [{kernel}, {kernel}], stride = [{stride}, {stride}], "
             f"padding = [{padding}, {padding}], dilation = [{dilation}, {dilation}], "
             f"groups = {c}")  # fmt: skip
    text = conv([2, c, h, w], attrs, c, c, relu=False).replace(
        "  output %1", "  %2 = clip(%1) {min = 0.0, max = 6.0}\n  output %2"
    )
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(h * w)
    weight = rng.normal(size=(c, 1, kernel, kernel))
    weight[3, 0, 0, 0] = np.nan
    payload = Payload({1: {"weight": weight, "bias": rng.normal(size=c)}})
    x = (3 * rng.normal(size=(2, c, h, w))).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, 4)] = np.nan
    frame = ConvFrame.of(graph.nodes[1], x.shape, graph.nodes[1].require_declared())
    info = target_info(target)
    in_place = convolution._depthwise_in_place(frame, info, 4)
    assert in_place or info.vector_bytes < 64, "AVX-512: always"
    ir = build_graph_module(graph, payload, np.float32, target=target).ir
    assert ("zero_row" in ir) == in_place
    expected = interpret(graph, payload, x, np.float32).output
    runs = [compile_graph(graph, payload, np.float32, target=target, threads=n)(x)
            for n in (1, 2, 3)]  # fmt: skip
    np.testing.assert_array_equal(np.isnan(runs[0]), np.isnan(expected))
    assert np.isnan(expected[:, 3]).all()
    real = ~np.isnan(expected)
    close(runs[0][real], expected[real], np.float32)
    assert runs[1].tobytes() == runs[0].tobytes() == runs[2].tobytes()


@pytest.mark.parametrize(
    ("c", "h", "stride", "sse", "avx2", "avx512"),
    [(32, 112, 1, True, True, True), (144, 56, 1, True, True, True),
     (384, 14, 1, False, False, True), (192, 28, 1, True, True, True),
     (192, 28, 2, False, True, True),
     (576, 14, 2, False, True, False), (960, 7, 1, False, False, False)],
)  # fmt: skip
def test_depthwise_in_place_without_avx512_needs_mostly_unmasked_strips(
    c: int, h: int, stride: int, sse: bool, avx2: bool, avx512: bool
) -> None:
    """mobilenet_v2's depthwise layers: in place on AVX-512 (mask registers: masked loads and
    stores cost as plain ones) unless the plane runs flat (7 x 7 outputs: staged), and at
    stride 2 on AVX2; otherwise only when a row has at least as many unmasked strips as
    masked ones on AVX2, more on SSE (`_inner_strips`: 192 on 28 x 28 has 2 of 4 on AVX2,
    5 of 7 on SSE; 384 on 14 x 14 0 of 2 on AVX2, 2 of 4 on SSE; 192 28 x 28 -> 14 x 14 2 of
    4 on SSE). The IR pins the AVX2 target."""
    attrs = f"kernel = [3, 3], stride = [{stride}, {stride}], padding = [1, 1], groups = {c}"
    graph = checked_graph(tlc.parse(conv([1, c, h, h], attrs, c, c)))
    node = graph.nodes[1]
    frame = ConvFrame.of(node, graph.nodes[0].require_declared(), node.require_declared())
    decided = [convolution._depthwise_in_place(frame, target_info(Target(cpu, triple=X86_64)), 4)
               for cpu in CPUS]  # fmt: skip
    assert decided == [sse, avx2, avx512]
    rng = np.random.default_rng(c)
    payload = Payload({1: {"weight": rng.normal(size=(c, 1, 3, 3)), "bias": rng.normal(size=c)}})
    ir = build_graph_module(graph, payload, np.float32, target=Target("znver3", triple=X86_64)).ir
    assert ("zero_row" in ir) == avx2


def test_depthwise_planes_run_flat_are_staged() -> None:
    """A 7 x 7 output plane on AVX-512 runs as one flat run of strips over the staged
    plane's width (`_run_flat`: 4 strips of 16 lanes instead of 7): it stages its input, at
    stride 1 and 2, and reads no zero row."""
    target = runnable("znver4")
    for h, stride in ((7, 1), (14, 2)):
        attrs = f"kernel = [3, 3], stride = [{stride}, {stride}], padding = [1, 1], groups = 4"
        graph = checked_graph(tlc.parse(conv([1, 4, h, h], attrs, 4, 4)))
        rng = np.random.default_rng(h)
        payload = Payload({1: {"weight": rng.normal(size=(4, 1, 3, 3)),
                               "bias": rng.normal(size=4)}})  # fmt: skip
        assert "zero_row" not in build_graph_module(graph, payload, np.float32, target=target).ir
        x = rng.normal(size=(1, 4, h, h)).astype(np.float32)
        close(compile_graph(graph, payload, np.float32, target=target)(x),
              interpret(graph, payload, x, np.float32).output, np.float32)  # fmt: skip


@pytest.mark.parametrize("n", [10, 300])
def test_a_linear_without_input_features_is_its_bias(n: int) -> None:
    """k = 0 (dot tiles for any width): every row is the bias, exactly."""
    text = f"tl.graph @z {{\n  %0 = input : [5, 0]\n  %1 = linear(%0) : [5, {n}]\n  output %1\n}}\n"
    bias = np.arange(n, dtype=np.float64)
    f = tlc.compile(text, Payload({1: {"weight": np.zeros((n, 0)), "bias": bias}}), "f32")
    got = f(np.zeros((5, 0), np.float32))
    np.testing.assert_array_equal(got, np.tile(bias, (5, 1)).astype(np.float32))


@pytest.mark.parametrize(
    ("h", "w", "stride"),
    [(13, 40, 1), (14, 14, 1), (9, 40, 2), (3, 17, 1)],
    ids=["last block of 1", "rows narrower than a vector", "stride 2", "one block of 3"],
)
def test_depthwise_strips_cover_blocks_of_rows(
    monkeypatch: pytest.MonkeyPatch, h: int, w: int, stride: int
) -> None:
    """A 3x3 depthwise strip computes `depthwise_rows` output rows at once on AVX-512 (4),
    each input vector loaded once for the rows whose taps read it; AVX2 and SSE keep one row
    (the accumulators and weights would not fit 16 registers). The bits are those of one row
    per strip, relu6 (clip) fused: a last block of fewer rows, rows narrower than a vector
    (one masked strip each), stride 2 (read in place, `_depthwise_rows`)."""
    assert [convolution.depthwise_rows(target_info(Target(cpu, triple=X86_64)), 9)
            for cpu in CPUS] == [1, 1, 4]  # fmt: skip
    c, attrs = 5, "kernel = [3, 3], stride = [{0}, {0}], padding = [1, 1], groups = 5"
    text = conv([2, c, h, w], attrs.format(stride), c, c, relu=False).replace(
        "  output %1", "  %2 = clip(%1) {min = 0.0, max = 6.0}\n  output %2"
    )
    graph = checked_graph(tlc.parse(text))
    rng = np.random.default_rng(7)
    payload = Payload({1: {"weight": rng.normal(size=(c, 1, 3, 3)), "bias": rng.normal(size=c)}})
    x = (3 * rng.normal(size=(2, c, h, w))).astype(np.float32)
    target = runnable("znver4")
    blocked = compile_graph(graph, payload, np.float32, target=target)(x)
    close(blocked, interpret(graph, payload, x, np.float32).output, np.float32)
    monkeypatch.setattr(convolution, "DEPTHWISE_ROWS", 1)
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")  # the constants are not in the caches' keys
    monkeypatch.setattr("tlc.codegen.jit._graph_cache", {})
    assert (
        compile_graph(graph, payload, np.float32, target=target)(x).tobytes() == blocked.tobytes()
    )
