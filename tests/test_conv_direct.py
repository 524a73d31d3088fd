"""The direct convolution kernel (`tlc.codegen.lower.conv_direct`): output channels as the
vector dimension, the input broadcast in place, tiles of output positions of their own shape at
the plane's edges, the accumulators transposed in registers before the stores.

Random convolutions (channels, planes 1..30, stride 1/2, padding, dilation, kernels 3x3 and
others, batch) run through the JIT against the reference interpreter with the kernel's rule
lowered to every patch row length (`DIRECT_DEPTH`; the object cache and the process's table
are off, so the patched rule is what builds), and at the real rule's sizes on the SSE, AVX2
and AVX-512 targets this CPU can run; a split call gives the same bits at 1, 2 and 3 threads.
Tolerances: f64 rtol 1e-11, f32 rtol 2e-5 of the output's scale (the summation-order
tolerances of tests/op_records.py: the kernel sums the patch row in its own order).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codegen_targets import options, runnable

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import module as codegen_module
from tlc.codegen import objcache
from tlc.codegen.gemm import reserved_registers
from tlc.codegen.jit import compile_graph
from tlc.codegen.lower import convolution
from tlc.codegen.lower.channel_blocks import ChannelBlocks
from tlc.codegen.lower.conv_direct import FOLDED_POSITIONS, DirectTile, direct_tile
from tlc.codegen.lower.convolution import ConvFrame, kernel_name
from tlc.codegen.lower.windows import Window
from tlc.codegen.module import build_graph_module, pack_params
from tlc.codegen.target import Target, TargetInfo, target_info
from tlc.core.payload import Payload
from tlc.semantics.interpret import interpret

X86_64 = "x86_64-unknown-linux-gnu"


def conv_case(
    batch: int, cin: int, cout: int, size: tuple[int, int], attrs: str, kernel: tuple[int, int],
    seed: int = 0,
) -> tuple[str, Payload, np.ndarray]:  # fmt: skip
    """A conv + relu graph (batch, cin, size) -> cout channels, random weights and input."""
    fields = (f"kernel = [{kernel[0]}, {kernel[1]}], {attrs}, channel_axis = 1, "
              f"in_channels = {cin}, out_channels = {cout}")  # fmt: skip
    text = (f"tl.graph @c {{\n  %0 = input : [{batch}, {cin}, {size[0]}, {size[1]}]\n"
            f"  %1 = conv(%0) {{{fields}}}\n  %2 = relu(%1)\n  output %2\n}}\n")  # fmt: skip
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(cout, cin, *kernel)) / np.sqrt(cin * kernel[0] * kernel[1])
    payload = Payload({1: {"weight": weight, "bias": rng.normal(size=cout)}})
    return text, payload, rng.normal(size=(batch, cin, *size))


def close(got: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    rtol = 1e-11 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def frame(text: str) -> ConvFrame:
    graph = checked_graph(tlc.parse(text))
    node, x = graph.nodes[1], graph.nodes[0].declared_shape
    return ConvFrame.of(node, x, node.infer([x]))


def reference(text: str, payload: Payload, x: np.ndarray, dtype: type) -> np.ndarray:
    return interpret(checked_graph(tlc.parse(text)), payload, x.astype(dtype), dtype).output


@st.composite
def convolutions(draw: st.DrawFn) -> tuple:
    kernel = draw(st.sampled_from([(3, 3), (2, 3), (5, 5), (3, 1)]))
    stride = draw(st.sampled_from([1, 2]))
    dilation = draw(st.sampled_from([1, 1, 2]))
    padding = [draw(st.integers(0, 2)), draw(st.integers(0, 2))]
    # Output planes of 1..30 positions a side (inputs whose padding is wider than themselves
    # have fewer).
    out = [draw(st.integers(1, 30)) for _ in kernel]
    size = tuple(max((o - 1) * stride + (k - 1) * dilation + 1 - 2 * p, 1)
                 for o, k, p in zip(out, kernel, padding, strict=True))  # fmt: skip
    attrs = (f"stride = [{stride}, {stride}], padding = [{padding[0]}, {padding[1]}], "
             f"dilation = [{dilation}, {dilation}]")  # fmt: skip
    return (draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 40)), size,
            attrs, kernel)  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(convolutions(), st.sampled_from([np.float32, np.float64]), st.booleans(),
       st.sampled_from([0, 1, 5, 72]))  # fmt: skip
def test_direct_kernel_computes_the_reference(
    conv: tuple, dtype: type, blocked: bool, chunk: int
) -> None:
    """Any batch, channels, plane, stride, padding, dilation and kernel, with the rule taking
    every patch row length (`DIRECT_DEPTH` = 1), reading the input in planes or in channel
    blocks (`channel_blocks`, on any target: blocks of its vector's lanes), over blocks in
    chunks of `chunk` patch rows (`DirectPlane.chunk`; 0: the target's rule)."""
    text, payload, x = conv_case(*conv)
    f = frame(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        patch.setattr(convolution, "DIRECT_DEPTH", 1)
        if blocked:
            patch.setattr(convolution, "_channel_blocked", lambda info, f: True)
        if chunk:
            patch.setattr(convolution, "_direct_chunk", lambda *args: chunk)
        info, itemsize = target_info(), np.dtype(dtype).itemsize
        if f.window.taps > 1 and f.window.out_sp[-1] % (info.vector_bytes // itemsize):
            assert kernel_name(info, itemsize, f).startswith("direct")
        got = tlc.compile(text, payload, "f32" if dtype == np.float32 else "f64")(x)
    close(got, reference(text, payload, x, dtype), dtype)


@pytest.mark.parametrize("cpu", ["x86-64-v2", "haswell", "znver4", "sapphirerapids"])
@pytest.mark.parametrize(
    ("batch", "cin", "cout", "size", "attrs"),
    [(1, 32, 64, (14, 14), "padding = [1, 1]"),
     (2, 29, 37, (9, 13), "stride = [2, 2], padding = [1, 1]"),
     (1, 64, 48, (7, 7), "padding = [1, 1]")],
)  # fmt: skip
def test_the_rule_runs_the_direct_kernel_on_every_target(
    cpu: str, batch: int, cin: int, cout: int, size: tuple[int, int], attrs: str
) -> None:
    """3x3 over 29 channels or more (patch rows of at least DIRECT_DEPTH), f32 and f64, on
    SSE, AVX2 and AVX-512 code, and with two 512-bit FMA units (`DUAL_FMA_STAGED`, channel
    blocks; run where the CPU has AVX512-FP16, which names them); and every target's code
    reading channel blocks (blocks of its lanes: 4, 8 or 16 float32)."""
    text, payload, x = conv_case(batch, cin, cout, size, attrs, (3, 3), seed=cin)
    features = "+avx512fp16" if cpu == "sapphirerapids" else ""
    info = target_info(Target(cpu, features, triple=X86_64))
    assert kernel_name(info, 4, frame(text)).startswith("direct"), cpu
    target = options(runnable(cpu, features))
    for blocked in (convolution._channel_blocked, lambda info, f: True):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(objcache.ENV_SWITCH, "0")
            patch.setattr(convolution, "_channel_blocked", blocked)
            for dtype in (np.float32, np.float64):
                name = "f32" if dtype == np.float32 else "f64"
                got = tlc.compile(text, payload, name, **target)(x)
                close(got, reference(text, payload, x, dtype), dtype)


@pytest.mark.parametrize("cpu", ["x86-64-v2", "haswell", "znver4"])
@pytest.mark.parametrize(
    ("batch", "cin", "cout", "size", "attrs"),
    [(1, 512, 48, (7, 7), "padding = [1, 1]"),  # 2 tiles a row on AVX2
     (2, 40, 40, (9, 13), "stride = [2, 2], padding = [1, 1]"),
     (1, 64, 32, (14, 14), "padding = [2, 2], dilation = [2, 2]")],
)  # fmt: skip
def test_chunks_of_patch_rows_keep_the_bits(
    cpu: str, batch: int, cin: int, cout: int, size: tuple[int, int], attrs: str
) -> None:
    """The tiles of a band of rows taking the patch rows a chunk at a time
    (`DirectPlane.chunk`: whole channel blocks, or 5 rows, a chunk that ends mid-block and a
    last chunk shorter than the others; `DirectPlane.band`: every row of tiles, 2 rows, a
    last band shorter than the others, or one) give the bytes of the whole patch row tile by
    tile, on 1 and 2 threads; the rule chunks the blocks whose weights outgrow CHUNK_ABOVE in
    AVX2 code (221 KB for 256 -> 256 on 7 x 7) and nothing smaller."""
    text, payload, x = conv_case(batch, cin, cout, size, attrs, (3, 3), seed=cin)
    target = options(runnable(cpu))
    outputs = []
    for chunk, band in ((None, None), (0, None), (5, None), (9 * 8, None), (9 * 8, 2), (5, 1)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(objcache.ENV_SWITCH, "0")
            patch.setattr(convolution, "_channel_blocked", lambda info, f: True)
            if chunk is not None:
                patch.setattr(convolution, "_direct_chunk", lambda *args, chunk=chunk: chunk)
            if band is not None:
                patch.setattr(convolution, "chunk_band", lambda *args, band=band: band)
            for threads in (1, 2):
                compiled = tlc.compile(text, payload, "f32", threads=threads, **target)
                outputs.append(compiled(x))
    for got in outputs[1:]:
        np.testing.assert_array_equal(got, outputs[0])
    close(outputs[0], reference(text, payload, x, np.float32), np.float32)
    info = target_info(Target("znver3", triple=X86_64))
    for c, n, expected in (
        (512, 512, 2 * 9 * 8),
        (512, 48, 2 * 9 * 8),
        (256, 256, 2 * 9 * 8),
        (64, 64, 0),
    ):
        text = conv_case(1, c, n, (7, 7), "padding = [1, 1]", (3, 3))[0]
        f = frame(text)
        tile = convolution._direct_tile(info, 4, f)
        assert tile is not None
        blocks = ChannelBlocks.of(f.window, f.cin, tile.lanes)
        assert convolution._direct_chunk(info, tile, blocks, f.window, 4) == expected, (c, n)


@pytest.mark.parametrize(
    ("cin", "kernel", "attrs", "size", "kind"),
    [(16, (3, 3), "padding = [1, 1]", 28, "C "),  # patch rows of 144: the product kernel
     (64, (1, 1), "stride = [1, 1]", 28, "C "),  # 1x1: read in place by the product kernel
     (64, (3, 3), "padding = [1, 1], groups = 2", 28, "C "),  # groups
     (32, (3, 3), "padding = [1, 1]", 28, "direct"),
     # output rows of whole vectors (32 = 2 x 16): the product kernel reads them in place
     (32, (3, 3), "padding = [1, 1]", 32, "C ")],
)  # fmt: skip
def test_which_convolutions_run_direct(
    cin: int, kernel: tuple[int, int], attrs: str, size: int, kind: str
) -> None:
    text, _, _ = conv_case(1, cin, 64, (size, size), attrs, kernel)
    info = target_info(Target("znver4", triple=X86_64))
    assert kernel_name(info, 4, frame(text)).startswith(kind)


def test_runtime_payloads_run_the_product_kernel() -> None:
    """A runtime payload keeps W row-major (the C ABI's layout): the product kernel reads it
    row by row; the direct kernel needs W^T packed at compile time."""
    text, payload, x = conv_case(1, 32, 40, (10, 10), "padding = [1, 1]", (3, 3))
    graph = checked_graph(tlc.parse(text))
    f = compile_graph(graph, None, np.float32, runtime_payload=True)
    got = f(x.astype(np.float32), pack_params(graph, payload, np.float32))
    close(got, reference(text, payload, x, np.float32), np.float32)


@pytest.mark.parametrize(
    ("cpu", "oh", "ow", "cout", "staged", "tile"),
    [("znver4", 14, 14, 256, False, (2, 14, 1)),  # one vector: broadcasts folded into the FMAs
     ("znver4", 7, 7, 512, False, (4, 7, 1)),  # 28 positions: a tile of 4 rows and one of 3
     ("znver4", 56, 56, 64, False, (1, 28, 1)),
     ("znver4", 28, 28, 128, True, (1, 28, 1)),  # one FMA unit: staged or not
     ("sapphirerapids", 56, 56, 64, False, (1, 28, 1)),  # in place: as Zen 4
     ("sapphirerapids", 28, 28, 128, True, (1, 14, 2)),  # two FMA units, staged: two vectors
     ("sapphirerapids", 7, 7, 512, True, (2, 7, 2)),  # not 1 x 7 x 2: 14 positions at least
     ("sapphirerapids", 27, 27, 128, True, (1, 14, 2)),
     ("znver3", 28, 28, 128, False, (1, 6, 2)),  # 12 of 16 ymm registers
     ("znver3", 14, 14, 256, True, (2, 2, 3))],  # no AVX-512: `staged` changes nothing
)  # fmt: skip
def test_tiles_come_from_the_target(
    cpu: str, oh: int, ow: int, cout: int, staged: bool, tile: tuple[int, int, int]
) -> None:
    info = target_info(Target(cpu, triple=X86_64))
    got = direct_tile(info, 4, oh, ow, cout, staged=staged)
    assert (got.rows, got.cols, got.nv) == tile
    if info.vector_bytes < 64 or got.nv > 1:
        assert got.rows * got.cols * got.nv + reserved_registers(got.nv) <= info.vector_registers
    else:  # one vector of weights, the broadcasts in the FMAs: FOLDED_POSITIONS accumulators
        assert got.rows * got.cols <= FOLDED_POSITIONS < info.vector_registers


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize(("batch", "attrs", "size"),
                         [(1, "padding = [1, 1]", 20), (3, "padding = [1, 1]", 20),
                          (1, "stride = [2, 2], padding = [2, 2]", 44)])  # fmt: skip
def test_split_calls_give_the_same_bits(batch: int, attrs: str, size: int, blocked: bool) -> None:
    """At batch 1 the call is split into parts over (block of channels, row of tiles) units,
    each staging only the input rows it reads (of planes or of channel blocks); at batch 3
    into row tasks of images: the bytes are those of one thread either way."""
    text, payload, x = conv_case(batch, 64, 96, (size, size), attrs, (3, 3))
    graph = checked_graph(tlc.parse(text))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        patch.setattr(convolution, "_channel_blocked", lambda info, f: blocked)
        plan = build_graph_module(graph, payload, np.float32).plan
        assert plan is not None
        node = next(p for p in plan.nodes if p.node.id == 1)
        assert (node.parts > 1) if batch == 1 else node.rows is not None, node
        xs = x.astype(np.float32)
        outputs = [tlc.compile(text, payload, "f32", threads=t)(xs).tobytes() for t in (1, 2, 3)]
    assert outputs[0] == outputs[1] == outputs[2]
    close(
        np.frombuffer(outputs[0], np.float32).reshape(batch, 96, -1),
        reference(text, payload, x, np.float32).reshape(batch, 96, -1),
        np.float32,
    )


def test_a_payload_over_the_bake_limit_is_held_in_the_kernels_layout() -> None:
    """The JIT passes a payload over BAKE_LIMIT by pointer, laid out as baked fields are
    (`module.bound_params`: here W^T in panels of NR channels, the bias padded to them, each
    field 64-byte aligned), so the direct kernel runs on it as on baked weights (resnet18's
    44 MB): the held array is at least the packed fields' size, which the row-major layout
    (40 x 32 x 9 + 40) is not."""
    text, payload, x = conv_case(1, 32, 40, (10, 10), "padding = [1, 1]", (3, 3))
    graph = checked_graph(tlc.parse(text))
    assert kernel_name(target_info(), 4, frame(text)).startswith("direct")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        patch.setattr(codegen_module, "BAKE_LIMIT", 64)
        f = compile_graph(graph, payload, np.float32)
    nr = direct_tile(target_info(), 4, 10, 10, 40).nr
    assert f.bound is not None and f.bound.size >= -(-40 // nr) * nr * (32 * 9 + 1) > 40 * 289
    close(f(x.astype(np.float32)), reference(text, payload, x, np.float32), np.float32)


@pytest.mark.parametrize(
    ("cpu", "attrs", "size", "cout", "in_place", "nv"),
    [("znver4", "padding = [1, 1]", (56, 56), 64, True, 1),  # 1 x 28 tiles
     ("znver4", "padding = [1, 1]", (14, 14), 256, True, 1),  # 2 x 14
     ("znver4", "padding = [1, 1]", (7, 7), 512, False, 1),  # 4 x 7: over IN_PLACE_ROWS
     ("znver4", "stride = [2, 2], padding = [1, 1]", (56, 56), 128, False, 1),
     ("znver4", "padding = [2, 2]", (13, 13), 64, False, 1),
     ("znver4", "padding = [2, 2], dilation = [2, 2]", (14, 14), 64, False, 1),
     ("znver4", "padding = [0, 0]", (16, 16), 64, False, 1),
     ("znver3", "padding = [1, 1]", (28, 28), 128, False, 2),  # AVX2: 1 x 6 x 2 vectors
     ("znver3", "padding = [1, 1]", (7, 7), 512, False, 3)],  # 1 x 4 x 3
)  # fmt: skip
def test_which_direct_convolutions_read_in_place(
    cpu: str, attrs: str, size: tuple[int, int], cout: int, in_place: bool, nv: int
) -> None:
    """3x3, stride 1, dilation 1, padding 1, tiles of at most `IN_PLACE_ROWS` rows, on AVX-512
    read the input planes in place; the others read a staged copy (AVX2's in channel blocks:
    `test_avx2_and_two_fma_units_read_channel_blocks`)."""
    text, _, _ = conv_case(1, 64, cout, size, attrs, (3, 3))
    f, info = frame(text), target_info(Target(cpu, triple=X86_64))
    tile = convolution._direct_tile(info, 4, f)
    assert tile is not None and convolution._channel_blocked(info, f) == (cpu == "znver3")
    assert (convolution._in_place_direct(f, tile, 4), tile.nv) == (in_place, nv)


@pytest.mark.parametrize(
    ("cpu", "features", "attrs", "size", "cout", "blocked", "tile"),
    [("sapphirerapids", "", "padding = [1, 1]", (56, 56), 64, True, (1, 14, 2)),
     ("sapphirerapids", "", "padding = [1, 1]", (7, 7), 512, True, (2, 7, 2)),
     ("graniterapids", "", "stride = [2, 2], padding = [1, 1]", (56, 56), 128, True, (1, 14, 2)),
     ("rocketlake", "+avx512fp16", "padding = [2, 2], dilation = [2, 2]", (27, 27), 64, True,
      (1, 14, 2)),
     ("znver4", "", "padding = [1, 1]", (56, 56), 64, False, (1, 28, 1)),
     ("skylake-avx512", "", "stride = [2, 2], padding = [1, 1]", (56, 56), 128, False,
      (1, 28, 1)),
     ("znver3", "", "padding = [1, 1]", (28, 28), 128, True, (1, 6, 2)),
     ("haswell", "", "stride = [2, 2], padding = [1, 1]", (56, 56), 128, True, (1, 6, 2)),
     # rows of whole AVX2 vectors: direct in blocks, not the product kernel
     ("znver3", "", "padding = [1, 1]", (56, 56), 64, True, (2, 3, 2)),
     ("x86-64-v3", "", "padding = [1, 1]", (7, 7), 512, True, (1, 4, 3))],
)  # fmt: skip
def test_avx2_and_two_fma_units_read_channel_blocks(
    cpu: str, features: str, attrs: str, size: tuple[int, int], cout: int, blocked: bool,
    tile: tuple[int, int, int],
) -> None:  # fmt: skip
    """With two 512-bit FMA units (`TargetInfo.dual_fma512`) a direct convolution reads
    its input staged in channel blocks, with tiles of one or two vectors (`DUAL_FMA_STAGED`);
    AVX2 code reads blocks of 8 channels with its own tiles, also where the output rows are
    whole vectors; other targets keep the planes and their tiles."""
    text, _, _ = conv_case(1, 64, cout, size, attrs, (3, 3))
    f, info = frame(text), target_info(Target(cpu, features, triple=X86_64))
    got = convolution._direct_tile(info, 4, f)
    assert got is not None and (got.rows, got.cols, got.nv) == tile
    assert convolution._channel_blocked(info, f) == blocked
    assert kernel_name(info, 4, f).endswith("channel blocks") == blocked


@pytest.mark.parametrize(
    ("cpu", "cin", "kernel", "attrs", "blocked"),
    [("sapphirerapids", 3, (11, 11), "stride = [4, 4], padding = [2, 2]", False),  # 3 of 16
     ("sapphirerapids", 29, (3, 3), "padding = [1, 1]", True),  # 32 for 29: 10% more
     ("sapphirerapids", 40, (3, 3), "padding = [1, 1]", False),  # 48 for 40: 20% more
     ("sapphirerapids", 144, (3, 3), "padding = [1, 1]", True),
     ("znver3", 3, (11, 11), "stride = [4, 4], padding = [2, 2]", False),  # 3 of 8
     ("znver3", 40, (3, 3), "padding = [1, 1]", True),  # 5 whole blocks of 8
     ("znver3", 30, (3, 3), "padding = [1, 1]", True),  # 32 for 30: 7% more
     ("znver3", 33, (3, 3), "padding = [1, 1]", False)],  # 40 for 33: 21% more
)  # fmt: skip
def test_channel_blocks_waste_few_fmas(
    cpu: str, cin: int, kernel: tuple[int, int], attrs: str, blocked: bool
) -> None:
    """Blocks pad the input channels to whole blocks of the target's float32 lanes (16 with
    AVX-512, 8 with AVX2): where that would add more than BLOCK_WASTE of the FMAs, the target
    keeps the planes (and still runs the direct kernel: an 11x11 stem's patch rows of 363)."""
    text, _, _ = conv_case(1, cin, 64, (224 if kernel[0] == 11 else 28,) * 2, attrs, kernel)
    f, info = frame(text), target_info(Target(cpu, triple=X86_64))
    tile = convolution._direct_tile(info, 4, f)
    assert tile is not None and convolution._channel_blocked(info, f) == blocked
    if info.dual_fma512:  # staged in blocks, or in planes not read in place: two vectors
        assert tile.nv == (2 if blocked or not convolution._in_place_direct(f, tile, 4) else 1)


@pytest.mark.parametrize(
    ("batch", "cin", "cout", "size", "attrs"),
    [(1, 64, 128, (28, 28), "stride = [2, 2], padding = [1, 1]"),  # 1 x 14 x 2
     (2, 32, 40, (14, 14), "stride = [2, 2], padding = [1, 1]"),  # 7 x 7: 2 x 7 x 2
     (1, 48, 64, (7, 7), "padding = [1, 1]"),  # 2 x 7 x 2
     (1, 32, 24, (27, 27), "padding = [2, 2], dilation = [2, 2]"),  # 1 x 14 and 1 x 13 tiles
     (1, 30, 20, (3, 2), "stride = [2, 2], padding = [1, 1]")],  # a 2 x 1 plane
)  # fmt: skip
def test_two_vector_staged_tiles_compute_the_reference(
    batch: int, cin: int, cout: int, size: tuple[int, int], attrs: str
) -> None:
    """The tiles of a target with two 512-bit FMA units (`DUAL_FMA_STAGED`) over its input
    in channel blocks, run on any AVX-512 CPU by reading its `target_info` as such (the
    object cache off, so the patched rule builds), f32 and f64, against the reference."""
    target = runnable("x86-64-v4")
    text, payload, x = conv_case(batch, cin, cout, size, attrs, (3, 3), seed=cout)
    chosen = convolution._direct_tile

    def dual(info: TargetInfo, itemsize: int, f: ConvFrame) -> DirectTile | None:
        return chosen(replace(info, dual_fma512=True), itemsize, f)

    for dtype in (np.float32, np.float64):
        tile = dual(target_info(target), np.dtype(dtype).itemsize, frame(text))
        assert tile is not None and tile.nv == 2, tile
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(objcache.ENV_SWITCH, "0")
            patch.setattr(convolution, "_direct_tile", dual)
            patch.setattr(convolution, "_channel_blocked", lambda info, f: True)
            got = tlc.compile(text, payload, "f32" if dtype == np.float32 else "f64",
                              target_cpu="x86-64-v4")(x)  # fmt: skip
        close(got, reference(text, payload, x, dtype), dtype)


def staged_and_in_place(text: str, payload: Payload, x: np.ndarray, dtype: type,
                        target: Target) -> tuple[bytes, bytes]:  # fmt: skip
    """The outputs of the direct kernel with the in-place reads and with the staged copy."""
    outputs = []
    for rule in (convolution._in_place_direct, lambda f, tile, itemsize: False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(objcache.ENV_SWITCH, "0")
            patch.setattr(convolution, "_in_place_direct", rule)
            name = "f32" if dtype == np.float32 else "f64"
            outputs.append(tlc.compile(text, payload, name, **options(target))(x).tobytes())
    return outputs[0], outputs[1]


@pytest.mark.parametrize(
    ("batch", "cin", "cout", "size"),
    [(1, 32, 40, (14, 14)), (3, 29, 37, (9, 13)), (1, 32, 16, (1, 5)), (2, 30, 20, (2, 1)),
     (1, 32, 24, (2, 2)), (1, 64, 64, (28, 28))],
)  # fmt: skip
def test_in_place_reads_give_the_staged_bits(
    batch: int, cin: int, cout: int, size: tuple[int, int]
) -> None:
    """A tap past the plane's edge reads a zero as the staged copy's padding gives it: the
    same FMAs, the same bytes, for planes of one or two rows or columns, AVX-512 tiles of one
    and two rows, f32 and f64; and both are the reference's values."""
    text, payload, x = conv_case(batch, cin, cout, size, "padding = [1, 1]", (3, 3), seed=cout)
    znver4 = runnable("znver4")
    f, info = frame(text), target_info(Target("znver4", triple=X86_64))
    for dtype in (np.float32, np.float64):
        itemsize = np.dtype(dtype).itemsize
        tile = convolution._direct_tile(info, itemsize, f)
        assert tile is not None and convolution._in_place_direct(f, tile, itemsize)
        in_place, staged = staged_and_in_place(text, payload, x.astype(dtype), dtype, znver4)
        assert in_place == staged, dtype
        got = np.frombuffer(in_place, dtype).reshape(batch, cout, *size)
        close(got, reference(text, payload, x, dtype), dtype)


@pytest.mark.parametrize("cout", [40, 48, 56])
def test_a_partial_last_block_runs_only_its_vectors(cout: int) -> None:
    """A last block of channels that the tile's NR does not fill (40 and 56 channels in
    24-channel blocks: 16 and 8 left) runs tiles of only the vectors that hold channels:
    the tile loops' FMAs per step are positions x NR / 8 for the whole blocks and positions
    x the vectors left for the last; 48 channels (whole blocks) have no such tiles."""
    text, payload, _ = conv_case(1, 64, cout, (7, 7), "padding = [1, 1]", (3, 3))
    haswell = Target("haswell", triple=X86_64)
    tile = convolution._direct_tile(target_info(haswell), 4, frame(text))
    assert tile is not None and tile.nr == 24
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        ir = build_graph_module(checked_graph(tlc.parse(text)), payload, np.float32,
                                target=haswell).ir  # fmt: skip
    steps = {
        block.count('call <8 x float> @"llvm.fmuladd.v8f32"')
        for block in re.split(r"\n(?=\S+:)", ir)
    }
    positions = {h * w for h in {tile.rows, 7 % tile.rows} - {0}
                 for w in {tile.cols, 7 % tile.cols} - {0}}  # fmt: skip
    vectors = {tile.nv, -(-(cout % 24) // 8) or tile.nv}
    assert steps - {0} == {n * v for n in positions for v in vectors}


def test_an_in_place_read_copies_nothing() -> None:
    """The staged copy of a stride-1 plane is an `llvm.memcpy` per input row (the kernel's
    staging loops, its whole and split calls); an in-place kernel has none of them, and reads
    the edge flags and zeros tables instead."""
    text, payload, _ = conv_case(1, 32, 40, (14, 14), "padding = [1, 1]", (3, 3))
    graph = checked_graph(tlc.parse(text))
    znver4 = Target("znver4", triple=X86_64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(objcache.ENV_SWITCH, "0")
        ir_in_place = build_graph_module(graph, payload, np.float32, target=znver4).ir
        patch.setattr(convolution, "_in_place_direct", lambda f, tile, itemsize: False)
        ir_staged = build_graph_module(graph, payload, np.float32, target=znver4).ir
    copies = [text.count('call void @"llvm.memcpy') for text in (ir_in_place, ir_staged)]
    assert copies[0] == 0 < copies[1], copies
    assert '@"edges"' not in ir_staged and '@"edges"' in ir_in_place


@pytest.mark.parametrize(
    ("cin", "kernel", "stride", "dilation", "padding", "lanes"),
    [(64, (3, 3), (1, 1), (1, 1), (1, 1), 16), (29, (3, 3), (2, 2), (1, 1), (1, 1), 16),
     (20, (5, 3), (1, 2), (2, 1), (2, 0), 8), (3, (2, 2), (2, 1), (1, 1), (0, 1), 4)],
)  # fmt: skip
def test_channel_blocks_are_the_convolution(
    cin: int, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
    padding: tuple[int, int], lanes: int,
) -> None:  # fmt: skip
    """The layout `channel_blocks` stages, its tap table, position steps and weight order,
    taken as numpy takes them: every output position (oy, ox) is the sum over the patch rows
    q of W_blocked[q] * staged[taps[q] + oy * steps[0] + ox * steps[1]], which is the
    convolution (float64, against torch's; channels past cin are zero in the copy and in
    the weights)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(cin)
    size = (11, 9)
    geometry = zip(size, padding, dilation, kernel, stride, strict=True)
    out_sp = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in geometry)
    window = Window(size, out_sp, stride, dilation, padding, kernel)
    blocks = ChannelBlocks.of(window, cin, lanes)
    x, w = rng.normal(size=(cin, *size)), rng.normal(size=(5, cin, *kernel))
    staged = np.zeros((blocks.blocks * lanes, blocks.rows, blocks.cols))
    staged[:cin, padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]] = x
    staged = staged.reshape(blocks.blocks, lanes, blocks.rows, blocks.cols).transpose(0, 2, 3, 1)
    assert staged.size == blocks.plane
    flat, taps, steps = staged.reshape(-1), blocks.tap_table(window), blocks.steps(window)
    rows = blocks.blocked_rows(w.reshape(5, -1).T, window.taps)
    assert rows.shape == (blocks.depth(window), 5) == (taps.size, 5)
    got = np.stack([flat[taps + oy * steps[0] + ox * steps[1]] @ rows
                    for oy in range(out_sp[0]) for ox in range(out_sp[1])], axis=1)  # fmt: skip
    expected = torch.nn.functional.conv2d(torch.tensor(x[None]), torch.tensor(w), stride=stride,
                                          padding=padding, dilation=dilation)  # fmt: skip
    np.testing.assert_allclose(got.reshape(5, *out_sp), expected[0].numpy(), rtol=1e-12,
                               atol=1e-12)  # fmt: skip
