"""Direct convolution with the output channels as the vector dimension (the formulation of
MLAS's NCHWc kernels, with the activations kept in NCHW).

Per tile of `DirectTile.rows` x `cols` output positions of one image and `nv` vectors of
output channels, for every patch row p = (input channel, tap): load the nv vectors of the
packed weights' row p ([ceil(cout / NR), depth, NR] at compile time: `pack_panels(W^T, NR)`,
as C^T packs them) and broadcast the input scalar each position of the tile reads, read in
place in the input planes (staged for padding or a stride, but for 3x3 padding 1 stride 1 on
AVX-512, where a tap past the plane's edge reads zeros instead: `EdgeReads`): position
(dy, dx) of the tile reads `taps[p] + dy * E + dx` past the tile's first position, a
compile-time offset, so the loop is loads and FMAs with nothing packed (no im2col, no patch
panels) and no position computed past the plane's edge (the tiles at the right and bottom
edges have their own, smaller shape). The finished accumulators (vectors of channels) are
transposed in registers (`transpose_lanes`: two-vector shuffles) into one vector of positions
per output channel, put on the stack, and stored by a loop over the tile's channels one tile
row at a time, with the bias and the fused epilogue applied to those vectors as every
convolution store applies them: one copy of the store code per tile shape, not one per
channel (resnet18 from an ONNX file: 3.67 MB of IR before, 2.32 MB; the same speed, paired).
`convolution._conv` chooses this kernel by `_direct_tile`, a measured rule (`DIRECT_DEPTH`),
and stages the input for it (or not: `_in_place_direct`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I1, I32, I64, Buf, KernelBuilder
from tlc.codegen.gemm import (
    FMA_PER_CYCLE,
    Epilogue,
    MicroKernel,
    packed_tile,
    reserved_registers,
    splat,
    step_cycles,
    store_lanes,
)
from tlc.codegen.lower.reductions import NormStage
from tlc.codegen.target import TargetInfo

#: The most output rows one tile spans.
TILE_ROWS = 4
#: The shortest patch row (input channels x taps) the direct kernel is chosen for. Measured
#: on Zen 4 (one thread, against the product kernel in the same process): 3x3 over 16
#: channels (144) on 32 x 32 ran at 67 GFLOP/s direct against 80 by the product kernel, the
#: bench CNN's 3 -> 16 (27) at 46 against 49 and mobilenet_v2's 3 -> 32 stem at 73 against 85:
#: over a short row, a tile's transposed stores and the staging weigh as much as packing;
#: from 288 (3x3 over 32 channels) on, direct was faster on every layer measured.
DIRECT_DEPTH = 256


#: The most positions of a single-vector tile on AVX-512, where the FMA takes its broadcast
#: from memory (`vfmadd231ps (mem){1to16}`): such a tile needs no broadcast register, and its
#: loop is one load of weights and one FMA per position. Measured on Zen 4 at batch 16 (one
#: thread, against the 2-vector tiles, 1 x 14 x 32 channels, in one process): 64 -> 64 on 56
#: x 56 36.4 -> 35.6 ms (1 x 28), 256 -> 256 on 14 x 14 37.2 -> 35.0 (2 x 14), 512 -> 512 on
#: 7 x 7 36.5 -> 34.3 (4 x 7), 256 -> 512 s2 on 14 x 14 20.3 -> 18.1; 28 accumulators and the
#: weights' vector leave LLVM 3 registers (no spills in the loop).
FOLDED_POSITIONS = 28
#: On a target with two 512-bit FMA units (`TargetInfo.dual_fma512`), a convolution whose
#: single-vector tile would stage its input (strided, padded other than by 1, or tiles of
#: more rows than `convolution.IN_PLACE_ROWS`) chooses again among tiles of one and two
#: vectors (`staged`), scored at this many times the issue model's FMA rate (the tile it
#: gets reads in place if it may: 2 x 7 x 2 over a 7 x 7 plane, padding 1): a
#: single-vector tile's one load per FMA then bounds it, and so does a two-vector tile of
#: few positions (1 x 7 x 2 over a 7 x 7 plane), so the model picks two vectors over 14 or
#: more positions. Measured on a Sapphire Rapids-class Xeon (one thread, batch 1, the tiles
#: in random order in one process, GFLOP/s): resnet18's stride-2 layers 64 -> 128 on 56 x 56
#: 1 x 28 x 1 48.7, 1 x 14 x 2 59.5; 128 -> 256 on 28 x 28 50.8 (2 x 14 x 1 54.9), 1 x 14 x 2
#: 67.1; 256 -> 512 on 14 x 14 4 x 7 x 1 54.5, 1 x 7 x 2 54.6, 2 x 7 x 2 60.4; 512 -> 512 on
#: 7 x 7 4 x 7 x 1 (staged) 54.5-59.7, 1 x 7 x 2 49.2-52.4, 2 x 7 x 2 (in place) 53.8-61.6.
#: Three and four vectors (1 x 7 x 3, 1 x 6 x 4, 2 x 3 x 4) ran 3-22% below the best
#: two-vector tile on each of those layers, so they are not candidates. The in-place tiles
#: keep the single-vector rule there: 64 -> 64 on 56 x 56 1 x 28 x 1 70.4, 1 x 14 x 2 63.1;
#: 128 -> 128 on 28 x 28 77.0, 74.2; 256 -> 256 on 14 x 14 2 x 14 x 1 73.7, 1 x 14 x 2 71.2.
DUAL_FMA_STAGED = 2


#: Bytes of packed weights one chunk of patch rows holds when the tiles of a band of rows take
#: the rows a chunk at a time (`DirectPlane.chunk`, `chunk_rows`): in L1 beside the input a
#: chunk reads.
CHUNK_BYTES = 16 * 1024
#: The block's weights (depth x NR) above which AVX2 code takes its patch rows in chunks: a
#: quarter of Zen 3's 512 KiB L2. Measured there (one thread, batch 1, 15 paired rounds, bands
#: of every row against no chunks or chunks a row of tiles at a time): 256 -> 512 stride 2 on
#: 14 x 14 (221 KB a block of 24 channels) 1.07, 256 -> 256 on 14 x 14 1.01; 128 -> 256
#: stride 2 on 28 x 28 (110 KB) 0.98 and 64 -> 64 on 56 x 56 (37 KB) 0.98, so they take none.
CHUNK_ABOVE = 128 * 1024
#: The partial sums of the rows of tiles that share a chunk (`chunk_band`): with a chunk's
#: weights, in L1. A band of every row against a row at a time, on Zen 3 (as CHUNK_ABOVE):
#: 512 -> 512 on 7 x 7 1.12-1.18.
BAND_BYTES = 32 * 1024


@dataclass(frozen=True)
class DirectTile:
    """The register tile of the direct kernel: `rows` x `cols` output positions (one
    broadcast each per step) by `nv` vectors of `lanes` output channels (one load each)."""

    rows: int
    cols: int
    nv: int
    lanes: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def _tiles(extent: int, size: int) -> list[tuple[int, int]]:
    """(count, size) of the tiles covering `extent`: whole ones and the remainder."""
    whole, rest = divmod(extent, size)
    return [(n, s) for n, s in ((whole, size), (1 if rest else 0, rest)) if n]


def tile_cycles(
    tile: DirectTile, oh: int, ow: int, cout: int, fmas: float = FMA_PER_CYCLE
) -> float:
    """Cycles per patch row of the tiles covering an oh x ow output plane of cout channels
    (`gemm.step_cycles`, the GEMM tiles' issue model, per tile, at `fmas` FMAs a cycle)."""
    rows, cols = _tiles(oh, tile.rows), _tiles(ow, tile.cols)
    per_block = sum(nr * nc * step_cycles(r * c, tile.nv, fmas)
                    for nr, r in rows for nc, c in cols)  # fmt: skip
    return -(-cout // tile.nr) * per_block


def direct_tile(
    info: TargetInfo, itemsize: int, oh: int, ow: int, cout: int, *, staged: bool = False
) -> DirectTile:
    """The tile for an oh x ow plane of cout channels on the target: every rows x cols x nv
    whose accumulators and `reserved_registers` (as the GEMM tiles count them) fit the
    target's vector registers (on AVX-512, every single-vector tile of at most
    `FOLDED_POSITIONS` positions, and only those: `DUAL_FMA_STAGED` is the exception) is
    scored by `tile_cycles`; ties go to fewer tile shapes (each edge tile is code of its own:
    2 x 7 tiles over a 7 x 7 plane compiled 0.4 s slower than 1 x 7 and ran no faster), then
    more accumulators (fewer loads of the weights), then fewer rows."""
    lanes = max(info.vector_bytes // itemsize, 1)
    regs = info.vector_registers
    folded = info.vector_bytes >= 64  # AVX-512: single-vector tiles (`FOLDED_POSITIONS`)
    dual = staged and info.dual_fma512
    fmas = FMA_PER_CYCLE * (DUAL_FMA_STAGED if dual else 1)
    shapes = [DirectTile(rows, cols, nv, lanes)
              for nv in ((1, 2) if dual else (1,) if folded else range(1, 5))
              for rows in range(1, min(oh, TILE_ROWS) + 1) for cols in range(1, ow + 1)
              if (rows * cols <= FOLDED_POSITIONS if folded and nv == 1
                  else rows * cols * nv + reserved_registers(nv) <= regs)]  # fmt: skip

    def score(t: DirectTile) -> tuple[float, int, int, int]:
        edges = len(_tiles(oh, t.rows)) * len(_tiles(ow, t.cols))
        return tile_cycles(t, oh, ow, cout, fmas), edges, -t.rows * t.cols * t.nv, t.rows

    return min(shapes, key=score)


#: A patch row's flags in an in-place read (`EdgeReads`): its tap reads the row above the
#: output position, the row below, the column left of it, the column right of it.
UP, DOWN, LEFT, RIGHT = 1, 2, 4, 8


def edge_flags(cin: int) -> np.ndarray:
    """UP | DOWN | LEFT | RIGHT of every patch row (input channel, tap) of a 3x3 window, as
    i8."""
    ky, kx = np.divmod(np.arange(9), 3)
    per_tap = UP * (ky == 0) | DOWN * (ky == 2) | LEFT * (kx == 0) | RIGHT * (kx == 2)
    return np.tile(per_tap, cin).astype(np.int8)


@dataclass(frozen=True)
class EdgeReads:
    """How the direct kernel reads unpadded input planes in place (a 3x3 window, stride 1,
    padding 1, `convolution._in_place_direct`): `flags`, an i8 table of every patch row's
    `edge_flags`; `zeros`, a constant of at least a tile row of zeros, which a tile row or
    position reads instead of the input when its tap falls past the plane's edge (the
    zeros the staged copy's padding holds: the same FMAs, the same bits)."""

    flags: ir.Value
    zeros: ir.Value


@dataclass(frozen=True)
class DirectPlane:
    """Where a group of `images` images' direct convolution reads and writes: `source` (their
    input planes, or their staged copies, `step` elements from one image to the next),
    `base` (the first image's first element there), `steps` (elements between the reads of
    output positions one row and one column apart: the planes' row length and 1, or in
    channel blocks the block's row and position strides, `channel_blocks`), `taps` (an i32
    table: patch row p's offset, `ConvFrame.tap_table` or `ChannelBlocks.tap_table`),
    `depth` (patch rows), `first` (the first image's first output plane in `out`), `out_sp`
    and `cout`."""

    source: Buf
    base: ir.Value
    step: int
    images: ir.Value
    steps: tuple[int, int]
    taps: ir.Value
    depth: int
    first: ir.Value
    out_sp: tuple[int, int]
    cout: int
    edges: EdgeReads | None = None
    #: Patch rows a band of rows of tiles runs at a time, every tile of the band over each
    #: such chunk before the next, their partial sums kept on the stack (0: all rows, tile by
    #: tile): a chunk of the weights then serves every tile of the band from L1 (`chunk_rows`).
    chunk: int = 0
    #: Rows of tiles that share each chunk (`chunk_band`; a unit's block's rows are cut into
    #: bands, the last shorter).
    band: int = 1


def chunk_rows(tile: DirectTile, depth: int, block_rows: int, itemsize: int) -> int:
    """The patch rows of a chunk (`DirectPlane.chunk`) where a block's weights (`depth` rows
    of the tile's NR channels) outgrow CHUNK_ABOVE: as many whole blocks of `block_rows` rows
    (taps x channels of a channel block) as CHUNK_BYTES of the weights hold, at least one;
    else 0, no chunks."""
    if depth * tile.nr * itemsize <= CHUNK_ABOVE:
        return 0
    return max(CHUNK_BYTES // (tile.nr * itemsize) // block_rows, 1) * block_rows


def chunk_band(tile: DirectTile, ow: int, itemsize: int) -> int:
    """The rows of tiles that share each chunk (`DirectPlane.band`): as many as BAND_BYTES of
    their partial sums hold, at least one."""
    return max(BAND_BYTES // (tile.rows * ow * tile.nr * itemsize), 1)


def direct_units(tile: DirectTile, out_sp: tuple[int, int], cout: int) -> int:
    """The units of an image a split call shares out: (block of NR channels, row of tiles)
    pairs, block-major."""
    return -(-cout // tile.nr) * -(-out_sp[0] // tile.rows)


def last_unit(k: KernelBuilder, units: tuple[ir.Value, ir.Value]) -> ir.Value:
    """The last of the units [lo, hi); lo when there are none."""
    b, (lo, hi) = k.b, units
    return b.sub(b.select(b.icmp_signed(">", hi, lo), hi, b.add(lo, k.i64(1))), k.i64(1))


def unit_rows(
    k: KernelBuilder, tile: DirectTile, units: tuple[ir.Value, ir.Value], out_sp: tuple[int, int]
) -> tuple[ir.Value, ir.Value]:
    """The output rows [first, end) the units [lo, hi) read for: their rows of tiles when they
    lie in one block of channels, else every row."""
    b, (lo, _), oh = k.b, units, out_sp[0]
    row_tiles = k.i64(-(-oh // tile.rows))
    last = last_unit(k, units)
    same = b.icmp_signed("==", b.udiv(lo, row_tiles), b.udiv(last, row_tiles))
    first = b.mul(b.urem(lo, row_tiles), k.i64(tile.rows))
    end = b.mul(b.add(b.urem(last, row_tiles), k.i64(1)), k.i64(tile.rows))
    end = b.select(b.icmp_signed("<", end, k.i64(oh)), end, k.i64(oh))
    return b.select(same, first, k.i64(0)), b.select(same, end, k.i64(oh))


def emit_direct(
    k: KernelBuilder,
    tile: DirectTile,
    plane: DirectPlane,
    params: tuple[Buf, Buf],
    out: Buf,
    units: tuple[ir.Value, ir.Value],
    fn: Epilogue | None,
    stage: NormStage | None = None,
) -> None:
    """The units [lo, hi) (`direct_units`) of a group of images: out = fn(stage(W patches +
    bias)) (`stage`: the per-channel maps `reductions.NormStage` applies, here to the
    accumulators, vectors of channels, before they are transposed) with
    `params` = (W^T packed as `pack_panels(W^T, tile.nr)`, bias padded to whole blocks).
    Each unit runs over every image of the group, so a block's weights are read from memory
    once per group, not once per image (512 -> 512 on 7 x 7: 9.4 MB). With `plane.chunk`,
    the tiles of a band of `plane.band` rows take the patch rows a chunk at a time, so each
    chunk of the block's weights is read from L2 once per band and then from L1, not once per
    tile (a block's weights, depth x NR, outgrow L2 beside the input: 442 KB for 512 -> 512
    in 24-channel blocks); each output still sums its patch rows in order, so the same
    bits."""
    b, lanes, nr = k.b, tile.lanes, tile.nr
    (oh, ow), cout, (row_step, col_step), taps = plane.out_sp, plane.cout, plane.steps, plane.taps
    row_tiles = -(-oh // tile.rows)
    vec = ir.VectorType(k.T, lanes)
    w, bias = params
    source = plane.source
    lo, hi = units

    zero = ir.Constant(vec, [0.0] * lanes)
    with b.goto_block(k.alloca_block):  # a tile's transposed sums: a vector per channel
        columns = b.alloca(ir.ArrayType(vec, nr), name="columns")

    def accumulate(block: ir.Value, nv: int, oy: ir.Value, ox: ir.Value, height: int,
                   width: int, image: ir.Value, rows: tuple[ir.Value, ir.Value] | None,
                   start: Callable[[int, int], ir.Value],
                   finish: Callable[[int, int, ir.Value], None]) -> None:  # fmt: skip
        """The tile's sums over patch rows [p0, p0 + count) (`rows`; None: all of them)."""
        base = b.add(plane.base, b.mul(image, k.i64(plane.step)))
        positions = height * width
        corner = b.add(base, b.add(b.mul(oy, k.i64(row_step)), b.mul(ox, k.i64(col_step))))
        offsets = [(r // width) * row_step + r % width * col_step for r in range(positions)]

        def row(p: ir.Value) -> ir.Value:
            return p if rows is None else b.add(rows[0], p)

        def a_at(r: int, p: ir.Value) -> ir.Value:
            tap = b.sext(b.load(b.gep(taps, [row(p)], inbounds=True)), I64)
            return k.at(source, b.add(b.add(corner, tap), k.i64(offsets[r])))

        if plane.edges is not None:
            assert col_step == 1 and rows is None, "in-place reads are of planes, whole"
            a_at = _edge_reads(k, plane.edges, a_at, (oy, ox), (height, width), (oh, ow))

        def b_at(v: int, p: ir.Value) -> ir.Value:
            at = b.mul(b.add(b.mul(block, k.i64(plane.depth)), row(p)), k.i64(nr))
            return k.at(w, b.add(at, k.i64(v * lanes)))

        count = k.i64(plane.depth) if rows is None else rows[1]
        mk = MicroKernel(positions, nv, lanes, 0)
        packed_tile(k, mk, positions, a_at, b_at, count, start, finish)

    def micro(block: ir.Value, nv: int, oy: ir.Value, ox: ir.Value, height: int, width: int,
              image: ir.Value) -> None:  # fmt: skip
        accs: dict[tuple[int, int], ir.Value] = {}

        def finish(r: int, v: int, acc: ir.Value) -> None:
            accs[r, v] = acc

        accumulate(block, nv, oy, ox, height, width, image, None, lambda r, v: zero, finish)
        store_tile(block, nv, oy, ox, height, width, image, accs)

    def store_tile(block: ir.Value, nv: int, oy: ir.Value, ox: ir.Value, height: int,
                   width: int, image: ir.Value,
                   accs: dict[tuple[int, int], ir.Value]) -> None:  # fmt: skip
        """The finished sums of a tile, vectors of channels: bias, maps, transposed, stored."""
        positions = height * width
        for v in range(nv):
            if stage is not None:  # the bias, then the maps, on vectors of channels
                c0 = b.add(b.mul(block, k.i64(nr)), k.i64(v * lanes))
                shift = b.load(b.bitcast(k.at(bias, c0), vec.as_pointer()), align=k.dtype.itemsize)
                operands = stage.channels(c0, vec)  # once for the tile's positions
                for r in range(positions):
                    accs[r, v] = stage.apply(b.fadd(accs[r, v], shift), operands)
        # Transposed, a vector of positions per channel, through the stack: one copy of
        # the stores (and of the epilogue) serves every channel of the tile. Channels past
        # cout (a last, partial block) are not stored.
        left = b.sub(k.i64(cout), b.mul(block, k.i64(nr)))
        count = b.select(b.icmp_signed("<", left, k.i64(nv * lanes)), left,
                         k.i64(nv * lanes))  # fmt: skip
        for g in range(0, positions, lanes):
            for v in range(nv):
                group = [accs.get((g + lane, v), zero) for lane in range(lanes)]
                for c, value in enumerate(transpose_lanes(k, group)):
                    b.store(value, b.gep(columns, [k.i64(0), k.i64(v * lanes + c)]))
            with k.loop(count, "oc") as c:
                oc = b.add(b.mul(block, k.i64(nr)), c)
                first = b.add(b.add(plane.first, b.mul(image, k.i64(cout))), oc)
                value = b.load(b.gep(columns, [k.i64(0), c]))
                _store_positions(k, out, value, first, (oy, ox), (g, width,
                                 min(positions, g + lanes)), (oh, ow),
                                 None if stage is not None else k.load(bias, oc),
                                 fn)  # fmt: skip

    whole = ow // tile.cols
    widths = [(whole, tile.cols, 0)] + ([(1, ow % tile.cols, whole * tile.cols)]
                                        if ow % tile.cols else [])  # fmt: skip
    band = max(min(plane.band, row_tiles), 1)  # rows of tiles sharing each chunk
    chunked = 0 < plane.chunk < plane.depth and band * sum(n for n, _, _ in widths) > 1
    if chunked:  # a band of rows of tiles' partial sums, [band * rows, ow, nr]
        with b.goto_block(k.alloca_block):
            partial = b.bitcast(b.alloca(ir.ArrayType(k.T, band * tile.rows * ow * nr)),
                                k.T.as_pointer())  # fmt: skip

    def tiles(each: Callable[[ir.Value, int], None]) -> None:
        """each(ox, width) for the tiles of a row of tiles, left to right."""
        for count, width, first in widths:
            if count == 1:
                each(k.i64(first), width)
                continue
            with k.loop(count, "ct") as ct:
                each(b.add(k.i64(first), b.mul(ct, k.i64(tile.cols))), width)

    def slot(row: ir.Value, ox: ir.Value, width: int, r: int, v: int) -> ir.Value:
        """Where position r, vector v of the tile at (row of the band, ox) keeps its sum."""
        at = b.add(b.mul(b.add(b.mul(row, k.i64(tile.rows * ow)), ox), k.i64(nr)),
                   k.i64(((r // width) * ow + r % width) * nr + v * lanes))  # fmt: skip
        return b.bitcast(b.gep(partial, [at], inbounds=True), vec.as_pointer())

    def partial_sum(row: ir.Value, ox: ir.Value, width: int, r: int, v: int) -> ir.Value:
        return b.load(slot(row, ox, width, r, v), align=k.dtype.itemsize)

    def each_row(rt: ir.Value, body: Callable[[ir.Value, int], None]) -> None:
        """body(oy, height) for row of tiles rt: the last may be shorter."""
        oy = b.mul(rt, k.i64(tile.rows))
        if not oh % tile.rows:
            body(oy, tile.rows)
            return
        with b.if_else(b.icmp_signed("==", rt, k.i64(row_tiles - 1))) as (edge, inner):
            with edge:
                body(oy, oh % tile.rows)
            with inner:
                body(oy, tile.rows)

    def chunks_of_band(block: ir.Value, nv: int, rows: tuple[ir.Value, ir.Value],
                       image: ir.Value) -> None:  # fmt: skip
        """Rows of tiles [first, end) of one image, every tile over each chunk of patch rows
        in turn, their sums carried on the stack; then each tile's finished sums stored."""
        first, end = rows
        with k.loop(plane.depth, "pc", step=plane.chunk) as pc:
            rest = b.sub(k.i64(plane.depth), pc)
            count = b.select(b.icmp_signed("<", rest, k.i64(plane.chunk)), rest,
                             k.i64(plane.chunk))  # fmt: skip
            start_chunk = b.icmp_signed("==", pc, k.i64(0))
            k.kept_in_memory(partial)  # the partial sums between chunks are memory

            def part(row: ir.Value, oy: ir.Value, height: int) -> None:
                def one(ox: ir.Value, width: int) -> None:
                    def start(r: int, v: int) -> ir.Value:
                        return b.select(start_chunk, zero, partial_sum(row, ox, width, r, v))

                    def finish(r: int, v: int, acc: ir.Value) -> None:
                        b.store(acc, slot(row, ox, width, r, v), align=k.dtype.itemsize)

                    accumulate(block, nv, oy, ox, height, width, image, (pc, count), start,
                               finish)  # fmt: skip

                tiles(one)

            with k.loop(end, "rt", start=first) as rt:
                each_row(rt, lambda oy, height: part(b.sub(rt, first), oy, height))

        def done(row: ir.Value, oy: ir.Value, height: int) -> None:
            def one(ox: ir.Value, width: int) -> None:
                accs = {(r, v): partial_sum(row, ox, width, r, v)
                        for r in range(height * width) for v in range(nv)}  # fmt: skip
                store_tile(block, nv, oy, ox, height, width, image, accs)

            tiles(one)

        with k.loop(end, "rt", start=first) as rt:
            each_row(rt, lambda oy, height: done(b.sub(rt, first), oy, height))

    # The vectors of a last, partial block of channels that hold channels.
    tail = -(-(cout % nr) // lanes) if cout % nr else tile.nv

    def by_block(block: ir.Value, body: Callable[[int], None]) -> None:
        """body(nv) for a block of channels: a last, partial block runs only the vectors
        that hold channels (`tail`), not NR's worth of FMAs (24-channel blocks over 256 or
        512 channels: 3% of them). Measured on Zen 3 (one thread, batch 1, 15 paired
        rounds against all NR): 512 -> 512 on 7 x 7 1.05, 256 -> 512 stride 2 on 14 x 14
        and 128 -> 256 stride 2 on 28 x 28 1.02, 256 -> 256 on 14 x 14 level; resnet18
        1.02 (two runs of 11 rounds), for 0.3-0.5 s more of its cold compile (the
        tail's tiles are code of their own)."""
        if tail == tile.nv:
            body(tile.nv)
            return
        with b.if_else(b.icmp_signed("==", block, k.i64(-(-cout // nr) - 1))) as (last, other):
            with last:
                body(tail)
            with other:
                body(tile.nv)

    if not chunked:
        with k.loop(hi, "u", start=lo) as u:
            block, rt = b.udiv(u, k.i64(row_tiles)), b.urem(u, k.i64(row_tiles))

            def unit(nv: int) -> None:
                with k.loop(plane.images, "im") as image:

                    def row(oy: ir.Value, height: int) -> None:
                        tiles(lambda ox, width: micro(block, nv, oy, ox, height, width, image))

                    each_row(rt, row)

            by_block(block, unit)
        return
    # Chunks: the units of each block in bands of `band` rows of tiles.
    last = b.udiv(last_unit(k, units), k.i64(row_tiles))
    with k.loop(b.add(last, k.i64(1)), "blk", start=b.udiv(lo, k.i64(row_tiles))) as block:
        at = b.mul(block, k.i64(row_tiles))
        first = b.sub(b.select(b.icmp_signed(">", lo, at), lo, at), at)
        end = b.sub(b.select(b.icmp_signed("<", hi, b.add(at, k.i64(row_tiles))), hi,
                             b.add(at, k.i64(row_tiles))), at)  # fmt: skip

        def bands(nv: int) -> None:
            with k.loop(end, "band", start=first, step=band) as r0:
                r1 = b.add(r0, k.i64(band))
                r1 = b.select(b.icmp_signed("<", r1, end), r1, end)
                with k.loop(plane.images, "im") as image:
                    chunks_of_band(block, nv, (r0, r1), image)

        by_block(block, bands)


def _edge_reads(
    k: KernelBuilder,
    edges: EdgeReads,
    a_at: Callable[[int, ir.Value], ir.Value],
    corner: tuple[ir.Value, ir.Value],
    shape: tuple[int, int],
    extents: tuple[int, int],
) -> Callable[[int, ir.Value], ir.Value]:
    """`a_at` of a tile (`shape` = (height, width) positions from `corner` = (oy, ox)) reading
    in place: per patch row, a tile row whose tap falls above or below the plane reads the
    zeros instead (one select for the row), and so do its first and last positions when the
    tap falls left or right of it (the tile's first column is the plane's first, its last
    the plane's last). Which edges the tile lies on is known before the patch row loop; each
    step loads the row's flags once."""
    b, (oy, ox), (height, width), (oh, ow) = k.b, corner, shape, extents
    i8 = ir.IntType(8)

    def flag(hit: ir.Value, bit: int) -> ir.Value:
        return b.select(hit, ir.Constant(i8, bit), ir.Constant(i8, 0))

    rows = []
    for dy in range(height):
        y = b.add(oy, k.i64(dy))
        rows.append(b.or_(flag(b.icmp_signed("==", y, k.i64(0)), UP),
                          flag(b.icmp_signed("==", y, k.i64(oh - 1)), DOWN)))  # fmt: skip
    left = flag(b.icmp_signed("==", ox, k.i64(0)), LEFT)
    right = flag(b.icmp_signed("==", b.add(ox, k.i64(width)), k.i64(ow)), RIGHT)
    step: dict[object, ir.Value] = {}  # of the current patch row: its flags, row pointers

    def inside(mask: ir.Value) -> ir.Value:
        return b.icmp_unsigned("==", b.and_(step["flags"], mask), ir.Constant(i8, 0))

    def read(r: int, p: ir.Value) -> ir.Value:
        if step.get("p") is not p:
            step.clear()
            step["p"], step["flags"] = p, b.load(b.gep(edges.flags, [p], inbounds=True))
        dy, dx = divmod(r, width)
        if dx in (0, width - 1):
            mask = b.or_(rows[dy], left) if dx == 0 else rows[dy]
            mask = b.or_(mask, right) if dx == width - 1 else mask
            return b.select(inside(mask), a_at(r, p), edges.zeros)
        if dy not in step:
            step[dy] = b.select(inside(rows[dy]), a_at(dy * width, p), edges.zeros)
        return b.gep(step[dy], [k.i64(dx)], inbounds=True)

    return read


def transpose_lanes(k: KernelBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The lanes x lanes transpose of `rows` (vectors of `lanes` lanes): out[c][r] = rows[r][c],
    by log2(lanes) rounds of two-vector shuffles exchanging blocks of h lanes (h = lanes/2,
    ..., 1), lanes / 2 pairs a round."""
    n, b = len(rows), k.b
    out, h = list(rows), n // 2
    while h:
        low = [j if not j & h else j - h + n for j in range(n)]
        high = [j + h if not j & h else j + n for j in range(n)]
        for i in (i for i in range(n) if not i & h):
            a, c = out[i], out[i + h]
            out[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, n), low))
            out[i + h] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, n), high))
        h //= 2
    return out


def _store_positions(
    k: KernelBuilder,
    out: Buf,
    value: ir.Value,
    plane: ir.Value,
    corner: tuple[ir.Value, ir.Value],
    lanes_at: tuple[int, int, int],
    extents: tuple[int, int],
    bias: ir.Value | None,
    fn: Epilogue | None,
) -> None:
    """Store the tile positions [first, end) (`lanes_at` = (first, width, end)) of one output
    channel: lane l of `value` is position first + l, row-major in a tile `width` wide whose
    corner is `corner` = (oy, ox) of output plane `plane` (of `extents`), stored after adding
    `bias` (None: added already) and applying `fn` (the fused epilogue, its operands read at
    the same lanes: `store_lanes`): one store per tile row the lanes reach, of that row's
    lanes."""
    b, lanes = k.b, value.type.count
    (oy, ox), (first, width, end), (oh, ow) = corner, lanes_at, extents
    row0 = b.add(b.mul(b.add(b.mul(plane, k.i64(oh)), oy), k.i64(ow)), ox)
    stores = []
    for dy in range(first // width, -(-end // width)):
        lo, hi = max(dy * width, first) - first, min((dy + 1) * width, end) - first
        # Lane l lands at row dy, column first + l - dy * width of the tile.
        at = b.add(row0, k.i64(dy * ow + first - dy * width))
        within = [lo <= j < hi for j in range(lanes)]
        stores.append((at, None if all(within) else ir.Constant(ir.VectorType(I1, lanes), within)))
    if bias is not None:
        value = b.fadd(value, splat(k, value.type, bias))
    store_lanes(k, value, out, stores, fn)
