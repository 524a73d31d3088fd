"""Convolution and its gradients: per leading index and group, a patch matrix (staged input
rows, packed panels or read in place) times the packed weights; depthwise convolution and
the window ops by `window_strips`; the input and weight gradients as a transposed product
and a correlation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I1, I32, I64, Buf, KernelBuilder, strides
from tlc.codegen.gemm import (
    MAX_PANEL,
    Epilogue,
    MicroKernel,
    avx2_tiles,
    emit_broadcast_tiles,
    emit_dot_tiles,
    emit_packed_block,
    emit_packed_linear,
    kernel_cycles,
    lane_mask,
    linear_scratch,
    load_vector,
    micro_kernel,
    multiply_add,
    pack_panels,
    pad_to,
    prefetch_read,
    product_cycles,
    splat,
    store_lanes,
    store_vector,
    stride_phase,
    tile_kernel,
)
from tlc.codegen.lower.channel_blocks import WIDEST_BLOCK, ChannelBlocks
from tlc.codegen.lower.conv_direct import (
    DIRECT_DEPTH,
    DirectPlane,
    DirectTile,
    EdgeReads,
    chunk_band,
    chunk_rows,
    direct_tile,
    direct_units,
    edge_flags,
    emit_direct,
    transpose_lanes,
    unit_rows,
)
from tlc.codegen.lower.elementwise import epilogue
from tlc.codegen.lower.layout import gather
from tlc.codegen.lower.reductions import NormStage, norm_stage
from tlc.codegen.lower.rules import ParamSpec, Step, balanced_parts, register
from tlc.codegen.lower.windows import NSW, Axis, Combine, Window, each_tap, scatter_taps, zero
from tlc.codegen.target import TargetInfo
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel


@dataclass(frozen=True)
class ConvFrame:
    """A convolution's static geometry, shared by conv and its two gradients: the input
    lead + [cin] + in_sp, the output lead + [cout] + out_sp, and per group the patch matrix
    [depth = cin/groups * taps, positions] that im2col gathers and col2im scatters back."""

    lead: int
    groups: int
    cin: int
    cout: int
    in_plane: int
    positions: int
    window: Window

    @staticmethod
    def of(node: NodeOp, x: Shape, y: Shape) -> ConvFrame:
        """`x` the convolution's input shape, `y` its output's."""
        m = node.metadata()
        axis = m["channel_axis"]
        in_sp, out_sp = x[axis + 1 :], y[axis + 1 :]
        window = Window(in_sp, out_sp, tuple(m["stride"]), tuple(m["dilation"]),
                        tuple(m["padding"]), tuple(m["kernel"]))  # fmt: skip
        return ConvFrame(numel(x[:axis]), m["groups"], m["in_channels"], m["out_channels"],
                         numel(in_sp), numel(out_sp), window)  # fmt: skip

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    @property
    def depth(self) -> int:
        return self.cin_g * self.window.taps

    def input_block(self, k: KernelBuilder, x: Buf, lead: ir.Value, g: ir.Value) -> Buf:
        """Group g's input planes [cin/groups, in_plane] at one leading index."""
        first = k.b.add(k.b.mul(lead, k.i64(self.cin)), k.b.mul(g, k.i64(self.cin_g)))
        return Buf(k.at(x, k.b.mul(first, k.i64(self.in_plane))), (self.cin_g, self.in_plane))

    def output_block(self, k: KernelBuilder, y: Buf, lead: ir.Value, g: ir.Value) -> Buf:
        """Group g's output planes [cout/groups, positions] at one leading index."""
        first = k.b.add(k.b.mul(lead, k.i64(self.cout)), k.b.mul(g, k.i64(self.cout_g)))
        return Buf(k.at(y, k.b.mul(first, k.i64(self.positions))), (self.cout_g, self.positions))

    def patch_taps(
        self, k: KernelBuilder, visit: Callable[[ir.Value, ir.Value, list[Axis]], None]
    ) -> None:
        """visit(plane offset in the input block, patch row offset, tap geometry) for every
        input channel of a group and every kernel tap (rows are channel-major, as in W)."""
        with k.loop(self.cin_g, "ic") as ic:
            plane = k.b.mul(ic, k.i64(self.in_plane))

            def tap_row(t: ir.Value, geometry: list[Axis]) -> None:
                row = k.b.add(k.b.mul(ic, k.i64(self.window.taps), flags=NSW), t, flags=NSW)
                visit(plane, k.b.mul(row, k.i64(self.positions), flags=NSW), geometry)

            each_tap(k, self.window, tap_row)

    @property
    def staged(self) -> bool:
        """Whether im2col reads a staged copy of the input (with padding or a stride) rather
        than the input itself."""
        return not self.window.inside or any(st > 1 for st in self.window.stride)

    @property
    def subsampled(self) -> bool:
        """Whether the window is one tap, unpadded and strided (resnet's 1x1 stride-2
        downsamples): it reads only stride phase 0, the only phase staged."""
        w = self.window
        return w.taps == 1 and w.inside and not any(w.padding) and any(st > 1 for st in w.stride)

    @property
    def staged_plane(self) -> int:
        """Elements of one input plane's staged copy: the zero-padded plane split into its
        stride phases (as many elements as the padded plane, rounded up to whole strides);
        `subsampled`, its phase 0 alone (the output plane's positions)."""
        w = self.window
        if self.subsampled:
            return numel(w.phases)
        return numel(w.stride) * numel(w.phases) if self.staged else 0

    def stage(
        self,
        k: KernelBuilder,
        x_block: Buf,
        staged: Buf,
        rows: tuple[ir.Value, ir.Value] | None = None,
    ) -> None:
        """Copy the input planes into their zeroed staged copies: input position i goes to
        padded position p = i + padding, phase p % stride, element p // stride. Leading axes
        loop over input rows (with `rows`, only the input rows [lo, hi) of the first axis:
        what one part of a split convolution reads, `stage_rows`); along the last axis each
        row is a contiguous copy, or with a stride a de-interleave of whole vectors by
        shuffles (`_split_row`)."""
        if self.subsampled:
            self._stage_phase(k, x_block, staged, rows)
            return
        w, b = self.window, k.b
        phase_block = [step * numel(w.phases) for step in strides(w.stride)]
        element_steps = strides(w.phases)
        size, st, pad = w.in_sp[-1], w.stride[-1], w.padding[-1]
        with k.loop(self.cin_g, "ic") as ic, self._input_rows(k, rows) as rows:
            dst = b.mul(ic, k.i64(self.staged_plane), flags=NSW)
            for i, pad_d, st_d, block, step in zip(rows, w.padding, w.stride, phase_block,
                                                   element_steps, strict=False):  # fmt: skip
                p = b.add(i, k.i64(pad_d), flags=NSW)
                dst = b.add(dst, b.mul(b.urem(p, k.i64(st_d)), k.i64(block)), flags=NSW)
                dst = b.add(dst, b.mul(b.udiv(p, k.i64(st_d)), k.i64(step)), flags=NSW)
            src = b.add(b.mul(ic, k.i64(self.in_plane), flags=NSW),
                        k.linear_index(rows, strides(w.in_sp)[:-1]), flags=NSW)  # fmt: skip
            # Input i is padded position i + pad (< the padded extent: `Window.padded`).
            if st == 1:
                k.copy_run(staged, b.add(dst, k.i64(pad)), x_block, src, size)
            else:
                _split_row(k, x_block, staged, src, dst, (st, pad, size), phase_block[-1])

    def _stage_phase(
        self, k: KernelBuilder, x_block: Buf, staged: Buf, rows: tuple[ir.Value, ir.Value] | None
    ) -> None:
        """`stage` of a `subsampled` window: element e (row-major in the output plane) of
        phase 0 from input e * stride, every element written (no padding, nothing to zero),
        for the phase rows of input rows [lo, hi) of the first axis (`rows`). Along the last
        axis, lanes * stride consecutive inputs per step, phase 0's lanes picked by a shuffle;
        the last step reads up to the last input it keeps (none past the row). A quarter of
        the copies of four phases at stride 2, and half the input rows read."""
        w, b = self.window, k.b
        size, st, length = w.in_sp[-1], w.stride[-1], w.phases[-1]
        lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
        wide = ir.VectorType(k.T, lanes * st)
        whole = min(length, size // st) // lanes * lanes
        first = None
        if rows is not None:
            lo, hi = (b.udiv(b.add(r, k.i64(w.stride[0] - 1)), k.i64(w.stride[0])) for r in rows)
            first = (lo, hi)
        in_steps = strides(w.in_sp)[:-1]
        with k.loop(self.cin_g, "ic") as ic, self._input_rows(k, first, w.phases[:-1]) as es:
            dst = b.add(b.mul(ic, k.i64(self.staged_plane), flags=NSW),
                        k.linear_index(es, strides(w.phases)[:-1]), flags=NSW)  # fmt: skip
            src = b.mul(ic, k.i64(self.in_plane), flags=NSW)
            for e, st_d, step in zip(es, w.stride, in_steps, strict=False):
                src = b.add(src, b.mul(e, k.i64(st_d * step), flags=NSW), flags=NSW)

            def pick_lanes(e: ir.Value, count: int, reach: int) -> None:
                """Elements e.. (`count`) from the `reach` inputs from e * stride on."""
                at = b.add(src, b.mul(e, k.i64(st), flags=NSW), flags=NSW)
                inputs = load_vector(k, wide, k.at(x_block, at), reach)
                store_vector(k, stride_phase(k, inputs, st), k.at(staged, b.add(dst, e, flags=NSW)),
                             count)  # fmt: skip

            with k.loop(whole, "e", step=lanes) as e:  # (e + lanes) * stride <= size
                pick_lanes(e, lanes, lanes * st)
            if length > whole:
                pick_lanes(k.i64(whole), length - whole, (length - whole - 1) * st + 1)

    @contextmanager
    def _input_rows(
        self, k: KernelBuilder, first: tuple[ir.Value, ir.Value] | None,
        extents: Shape | None = None,
    ) -> Iterator[list[ir.Value]]:  # fmt: skip
        """Loops over the input rows (every spatial axis but the last; or over `extents`),
        the first axis only over [lo, hi) when `first` is given."""
        lead = self.window.in_sp[:-1] if extents is None else extents
        if first is None:
            with k.nest(lead, "row") as rows:
                yield rows
            return
        with k.loop(first[1], "row0", start=first[0]) as r0, k.nest(lead[1:], "row_") as rest:
            yield [r0, *rest]

    def stage_rows(self, k: KernelBuilder, lo: ir.Value, hi: ir.Value) -> tuple[ir.Value, ...]:
        """What a part of a split convolution computing output rows [lo, hi) of the first
        spatial axis reads (one image, at least two spatial axes): the elements [e_lo, e_hi)
        of every stride phase along that axis, and the input rows [i_lo, i_hi) they come
        from (as `stage`'s `rows`). Output row o's taps read phase elements o + tap *
        dilation // stride."""
        w, b = self.window, k.b
        st, pad = w.stride[0], w.padding[0]
        e_lo, e_hi = lo, b.add(hi, k.i64((w.kernel[0] - 1) * w.dilation[0] // st))
        i_lo = b.sub(b.mul(e_lo, k.i64(st)), k.i64(pad))
        i_hi = b.sub(b.mul(e_hi, k.i64(st)), k.i64(pad))
        i_lo = b.select(b.icmp_signed("<", i_lo, k.i64(0)), k.i64(0), i_lo)
        i_hi = b.select(b.icmp_signed(">", i_hi, k.i64(w.in_sp[0])), k.i64(w.in_sp[0]), i_hi)
        return e_lo, e_hi, i_lo, b.select(b.icmp_signed("<", i_hi, i_lo), i_lo, i_hi)

    def zero_rows(self, k: KernelBuilder, staged: Buf, e_lo: ir.Value, e_hi: ir.Value) -> None:
        """Zero the elements [e_lo, e_hi) along the first spatial axis of every stride phase
        of every staged plane (`stage_rows`): contiguous runs of whole phase rows."""
        w, b = self.window, k.b
        row = numel(w.phases[1:])
        start, end = b.mul(e_lo, k.i64(row)), b.mul(e_hi, k.i64(row))
        with k.loop(self.cin_g * (self.staged_plane // numel(w.phases)), "plane") as q:
            base = b.mul(q, k.i64(numel(w.phases)))
            with k.loop(b.add(base, end), "z", start=b.add(base, start)) as z:
                k.store(k.const(0), staged, z)

    @property
    def extents(self) -> Shape:
        """The spatial extents of the planes im2col reads: one stride phase of the staged
        plane, or the input plane itself."""
        return self.window.phases if self.staged else self.window.in_sp

    @property
    def plane(self) -> int:
        """Elements between the planes im2col reads (staged or input)."""
        return self.staged_plane if self.staged else self.in_plane

    def tap_offset(self, k: KernelBuilder, ic: ir.Value, position: list[ir.Value]) -> ir.Value:
        """Where output position 0 of tap `position` (kernel indices) of input channel `ic`
        reads in the planes im2col reads; output position o reads `o` (in `extents`
        row-major) further on: padded position o * stride + offset is phase (offset %
        stride)'s element o + offset // stride."""
        w, b = self.window, k.b
        src = b.mul(ic, k.i64(self.plane), flags=NSW)
        phase = []
        for pos, st, dil, step in zip(position, w.stride, w.dilation, strides(self.extents),
                                      strict=True):  # fmt: skip
            off = b.mul(pos, k.i64(dil), flags=NSW)
            phase.append(b.urem(off, k.i64(st)))
            src = b.add(src, b.mul(b.udiv(off, k.i64(st)), k.i64(step)), flags=NSW)
        at = b.mul(k.linear_index(phase, strides(w.stride)), k.i64(numel(self.extents)))
        return b.add(src, at, flags=NSW)

    def tap_table(self) -> np.ndarray:
        """`tap_offset` of every patch row (input channel, tap) at compile time, as i32."""
        w = self.window
        taps = np.stack(np.unravel_index(np.arange(w.taps), w.kernel), axis=1)
        off = taps * np.array(w.dilation)
        stride = np.array(w.stride)
        phase = (off % stride) @ np.array(strides(w.stride), dtype=np.int64)
        shift = (off // stride) @ np.array(strides(self.extents), dtype=np.int64)
        per_tap = phase * numel(self.extents) + shift
        table = (np.arange(self.cin_g)[:, None] * self.plane + per_tap[None, :]).reshape(-1)
        assert table.max(initial=0) < 2**31, "patch offsets fit in 32 bits"
        return table.astype(np.int32)

    def im2col(self, k: KernelBuilder, x_block: Buf, patches: Buf, staging: ir.Value) -> None:
        """Gather the shifted input planes into the patch matrix.

        With padding or a stride, the input planes are first staged at `staging` ([cin/groups,
        staged_plane]): zero-padded and split into stride phases, so that each tap reads one
        phase contiguously: padded position o * stride + offset is phase (offset % stride)'s
        element o + offset // stride. Every tap's loops then have constant bounds, no test,
        and unit stride, which LLVM vectorises; the strided reads happen once per input
        element instead of once per tap."""
        w, b = self.window, k.b
        source = x_block
        if self.staged:
            source = Buf(staging, (self.cin_g, self.staged_plane))
            zero(k, source)
            self.stage(k, x_block, source)
        in_steps, out_steps = strides(self.extents), strides(w.out_sp)
        with k.loop(self.cin_g, "ic") as ic, k.nest(w.kernel, "tap") as position:
            src = self.tap_offset(k, ic, position)
            tap = k.linear_index(position, strides(w.kernel))
            row = b.add(b.mul(ic, k.i64(w.taps), flags=NSW), tap, flags=NSW)
            dst = b.mul(row, k.i64(self.positions), flags=NSW)
            # Output position o reads element o + offset // stride: rows of the last axis
            # are runs of contiguous elements on both sides.
            with k.nest(w.out_sp[:-1], "o") as lead:
                to = b.add(dst, k.linear_index(lead, out_steps[:-1]))
                start = b.add(src, k.linear_index(lead, in_steps[:-1]))
                k.copy_run(patches, to, source, start, w.out_sp[-1])

    def col2im(self, k: KernelBuilder, cols: Buf, dx_block: Buf) -> None:
        """The adjoint of im2col: add every patch entry back onto the input position it was
        gathered from (taps in row-major order, like the reference); padding drops out."""
        self.patch_taps(
            k,
            lambda plane, row, geometry: scatter_taps(
                k, cols, row, dx_block, plane, geometry, k.b.fadd
            ),
        )


def _split_row(
    k: KernelBuilder, x_block: Buf, staged: Buf, src: ir.Value, dst: ir.Value,
    geometry: tuple[int, int, int], phase_row: int,
) -> None:  # fmt: skip
    """`ConvFrame.stage` along a strided last axis: one input row (at `src`) into its rows of
    the stride phases (at `dst`, `phase_row` elements apart). Input i is padded position
    i + pad: phase (i + pad) % stride, element (i + pad) // stride. The row is read a vector
    of lanes * stride consecutive inputs at a time from its first input, de-interleaved by
    shuffles (LLVM leaves the strided scalar loop scalar): its lanes q, q + stride, ... fill
    consecutive elements of phase (q + pad) % stride, so every input is copied once and
    nothing else is written (the padding stays zero); only the row's last, partial step
    masks. Aligned at the phases' elements instead (every phase from the same element,
    inputs e * stride - pad on), a padded row took a masked step and a scalar copy per phase
    at each end: the bench CNN's 16 -> 32 stride-2 layer over rows of 32 staged each row in
    a masked 15-lane step and two scalar copies, where this is one whole step."""
    st, pad, size = geometry
    b = k.b
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    wide = ir.VectorType(k.T, lanes * st)
    steps, rest = divmod(size, lanes * st)

    def split(step: ir.Value, count: int) -> None:
        """Inputs step * lanes * stride.. (`count` of them) into their phases."""
        first = b.add(src, b.mul(step, k.i64(lanes * st), flags=NSW))
        inputs = load_vector(k, wide, k.at(x_block, first), count)
        for q in range(st):
            r, shift = (q + pad) % st, (q + pad) // st
            at = b.add(dst, b.add(b.mul(step, k.i64(lanes), flags=NSW),
                                  k.i64(r * phase_row + shift)), flags=NSW)  # fmt: skip
            store_vector(k, stride_phase(k, inputs, st, q), k.at(staged, at), -(-(count - q) // st))

    with k.loop(steps, "e") as step:
        split(step, lanes * st)
    if rest:
        split(k.i64(steps), rest)


#: Bytes of the packed patch panels convolution fills per block of columns (they stay in
#: L2 while the tiles of the weights pass over them).
PACK_BLOCK = 256 * 1024
#: Columns a group of images reaches for when its output planes leave a partial panel, and
#: the bytes of staged input planes it may hold for that (`ConvPlan.of`).
GROUP_COLUMNS, STAGE_BLOCK = 1024, 1024 * 1024
#: The vector bytes from which the tiles read B under a mask (`packed_tile`'s `b_mask`): AVX2
#: and AVX-512 have masked vector loads, SSE has none (LLVM would load lane by lane).
MASKED_LOADS = 32
#: The share of a wide convolution's columns past the output rows it may compute (`_conv_product`).
WIDE_WASTE = 0.05
#: Steps along k of one K block of a convolution's product: longer products (deep layers,
#: 3x3 over 256 channels = 2304) keep partial sums of the block's columns in scratch, so the
#: weights' K slice (cout x 256, in L2) is read once per block of columns instead of once
#: per panel.
CONV_KC = 256
#: Elements ahead of each vector a 1x1 convolution reads in place that its first row tile
#: prefetches when its input is over AHEAD_BYTES: each k step reads another input plane, more
#: streams than the hardware prefetchers follow once the planes come from L3 or memory
#: (squeezenet's 96 -> 16 squeeze on 54 x 54 at batch 16, 18 MB, AVX-512: 4.5 -> 2.9 ms;
#: 384 bytes of float32 ahead, 2 of its panels). At batch 1 (1.1-1.5 MB, in L2 and L3) its
#: squeezes took the same time with and without.
IN_PLACE_AHEAD, AHEAD_BYTES = 96, 2 * 1024 * 1024


@dataclass(frozen=True)
class ConvPlan:
    """How a convolution's implicit matrix product is blocked, independent of the target:
    the columns are (leading index, output position) pairs, taken `images` leading indices at
    a time (a group, whose input planes are staged together), in blocks of `columns` that are
    packed into panels before the tiles run over them."""

    images: int
    columns: int
    #: Steps along k of one K block.
    kc: int = CONV_KC

    @staticmethod
    def of(f: ConvFrame, itemsize: int) -> ConvPlan:
        """Blocks of PACK_BLOCK bytes of one K block of patches (CONV_KC rows at most). When
        an output plane is not a whole number of the widest panels, a group's last panel is
        partly padding, so groups take images up to GROUP_COLUMNS columns (staging at most
        STAGE_BLOCK bytes of planes): 7x7 planes, 49 columns, one image per group computed
        64 columns for 49. A 1x1 convolution over one image's planes read in place
        (`_whole_in_place`) is one block of its positions with K whole."""
        if _whole_in_place(f, itemsize):
            return ConvPlan(1, f.positions, f.depth)
        target = max(PACK_BLOCK // max(min(f.depth, CONV_KC) * itemsize, 1), 1)
        P = max(f.positions, 1)
        images = max(target // P, 1)
        if P % MAX_PANEL:
            staged = STAGE_BLOCK // max(f.cin_g * f.staged_plane * itemsize, 1)
            images = max(images, min(-(-GROUP_COLUMNS // P), staged or 1))
        images = min(images, max(f.lead, 1))
        return ConvPlan(images, min(images * f.positions, target))

    def partials(self, f: ConvFrame) -> int:
        """Elements of partial sums a block of columns keeps when K is blocked (rows padded to
        a whole tile of at most 32), else 0."""
        return (self.columns + MAX_PANEL) * (f.cout_g + 32) if f.depth > self.kc else 0


#: A 1x1 convolution reading one image's planes in place (`_whole_in_place`) takes them as
#: one block of columns with K whole when its patches (depth x positions, in doubles) are at
#: most IN_PLACE_BLOCK bytes and its depth at most IN_PLACE_KC: it packs nothing, so its
#: blocks only set how often the weights stream through the caches (once per block) and K
#: blocks add round trips of partial sums.
IN_PLACE_BLOCK, IN_PLACE_KC = 4 * 1024 * 1024, 1024


def _whole_in_place(f: ConvFrame, itemsize: int) -> bool:
    return (f.window.taps == 1 and not f.staged and f.groups == 1 and f.positions > 0
            and f.lead <= 1 and f.depth <= IN_PLACE_KC
            and f.depth * f.positions * itemsize <= IN_PLACE_BLOCK)  # fmt: skip


def _column_parts(f: ConvFrame) -> bool:
    """Whether a split 1x1 convolution read in place (`_whole_in_place`) with fewer than
    MAX_PARTS tiles of 8 output channels splits into runs of whole panels of columns, each
    part every output channel over its columns (at least MAX_PARTS panels of MAX_PANEL
    columns of them), not into its tiles: a squeeze to 16 channels then splits into 6 parts,
    not 2, and a part reads only its columns of the input, not every input element for its
    channels (half of them written by the other thread). Layers of 64 channels or more keep
    their tiles (the 1x1 expansions on 54 x 54 measured 10-20% slower by columns). Where the
    tiles read the columns in place (AVX2, AVX-512: `MASKED_LOADS`) it packs nothing, so the
    parts repeat no copy, and one call over every part is the kernel unsplit (one block of
    every column); code that packs its block (SSE) splits the same count of parts by
    tiles."""
    return (_whole_in_place(f, 8) and -(-f.cout_g // 8) < MAX_PARTS
            and f.lead * f.positions >= MAX_PARTS * MAX_PANEL)  # fmt: skip


def _depthwise(f: ConvFrame) -> bool:
    """Convolutions run by the direct kernel: one input channel per group (depthwise)."""
    return f.groups > 1 and f.cin_g == 1


def _conv_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """The packed panels of one block of columns and, with padding or a stride, the staged
    input planes of a group of images (depthwise: one staged plane)."""
    f = ConvFrame.of(node, parents[0], out)
    if _depthwise(f):
        return f.staged_plane
    plan = ConvPlan.of(f, 8)
    staging = plan.images * f.cin_g * f.staged_plane
    normal = (plan.columns + MAX_PANEL) * f.depth + staging + MAX_PANEL + plan.partials(f)
    if _direct(f):
        blocked = _blocked_images(f) * ChannelBlocks.of(f.window, f.cin, WIDEST_BLOCK).plane
        normal = max(normal, _direct_images(f) * f.cin * f.staged_plane, blocked)
    if not _transposable(f):
        return normal
    rows = f.lead * f.positions
    return max(normal, rows * f.cout + linear_scratch(rows, f.depth) + f.lead * f.staged_plane
               * f.cin)  # fmt: skip


#: Most output positions (of all leading indices) a convolution computed as C^T may have: its
#: product is then small enough to keep whole in scratch.
TRANSPOSE_ROWS = 256
#: C^T is chosen when its tiles take at most this share of C's cycles: it packs its rows
#: element by element through two tables, and writes the product transposed (on Zen 4, 3x3
#: over 256 channels of 14x14, C^T at 0.875 of C's cycles ran at 78 GFLOP/s, C at 91).
TRANSPOSE_GAIN = 0.8


#: A 1x1 convolution read in place whose weights have more than TRANSPOSE_WEIGHTS elements
#: runs as C^T for up to TRANSPOSE_WIDE_ROWS positions (of all leading indices), whatever
#: the cycles: C streams the weights (its A) through the caches once per block of columns,
#: C^T (where they are B's panels) once per block of rows. squeezenet1_0's classifier, 512 ->
#: 1000 on 13 x 13 (2 MB of weights), Zen 4: 2.11 -> 1.84 ms at batch 1, 4.66 -> 4.10 at 2.
TRANSPOSE_WEIGHTS, TRANSPOSE_WIDE_ROWS = 256 * 1024, 512


def _wide_weights(f: ConvFrame) -> bool:
    return f.window.taps == 1 and not f.staged and f.cout * f.depth > TRANSPOSE_WEIGHTS


#: In AVX2 code, a 1x1 convolution read in place whose C = W patches reads more than
#: DEEP_BYTES of input planes per panel of 16 columns (a line of each of `depth` planes, or
#: two where the planes are not whole lines: its vectors then straddle them) runs as C^T, for
#: up to DEEP_ROWS positions, when it has at least 2 x MAX_PANEL output channels (C^T's parts
#: split them by MAX_PANEL: mobilenet_v2's 576 -> 96 on 14 x 14, parts of 64 and 32, left two
#: threads uneven, the network 0.94 on two threads). C's first row tile of each panel
#: streams those lines from L2 and the others read them again, no longer from L1; C^T packs
#: its rows and reads them in order. Measured on Zen 3 (znver3 code, one thread, batch 1, 9
#: paired rounds, C^T against C): 1024 -> 256 on 14 x 14 1.28-1.34, 384 -> 128 on 27 x 27
#: 1.23, 1024 -> 256 on 28 x 28 1.17; at or under the bound 192 -> 64 on 14 x 14 1.01,
#: 256 -> 32 on 27 x 27 1.01, 512 -> 128 on 28 x 28 (whole lines) 0.94 (kernel-design.md).
DEEP_BYTES, DEEP_ROWS, CACHE_LINE = 32 * 1024, 1024, 64


def _deep_in_place(f: ConvFrame) -> bool:
    """Whether AVX2 code runs this convolution as C^T (`DEEP_BYTES`): a 1x1 window read in
    place, at least 2 x MAX_PANEL output channels, at most DEEP_ROWS positions, and C's panel
    of columns reading more than DEEP_BYTES of its planes (counted in lines of float32)."""
    if f.window.taps != 1 or f.staged or f.cout < 2 * MAX_PANEL or f.groups != 1:
        return False
    lines = 1 if f.in_plane * 4 % CACHE_LINE == 0 else 2
    return f.depth * lines * CACHE_LINE > DEEP_BYTES and f.lead * f.positions <= DEEP_ROWS


def _few_rows(f: ConvFrame) -> bool:
    """Whether every target may run the convolution as C^T by its rows: few enough for the
    product kept whole in scratch (`TRANSPOSE_ROWS`, or `TRANSPOSE_WIDE_ROWS`)."""
    return 0 < f.lead * f.positions <= (TRANSPOSE_WIDE_ROWS if _wide_weights(f) else TRANSPOSE_ROWS)


def _transposable(f: ConvFrame) -> bool:
    """Whether some target may run the convolution as C^T (its scratch and parts allow for
    it)."""
    return f.groups == 1 and (_few_rows(f) or _deep_in_place(f)) and f.depth > 0


def _transposed_mk(info: TargetInfo, itemsize: int, f: ConvFrame) -> MicroKernel | None:
    """The micro-kernel of the convolution as C^T = patches^T W^T (rows: output positions,
    columns: output channels, W^T packed in panels like a linear layer's) when that covers
    the product in fewer cycles than C = W patches: few positions, many channels (a 7x7
    plane of 512 channels: 7 x 32 tiles cover 49 positions exactly, 8 x 32 tiles over the
    positions compute 64 columns for 49), or a 1x1 convolution's weights are wide
    (`_wide_weights`), or AVX2 code reads too many input planes per panel of C
    (`_deep_in_place`). None: C = W patches."""
    if not _transposable(f):
        return None
    rows = f.lead * f.positions
    if avx2_tiles(info) and _deep_in_place(f):
        return micro_kernel(info, itemsize, rows, f.cout)
    if not _few_rows(f):
        return None
    if not _wide_weights(f) and product_cycles(
        info, itemsize, rows, f.cout
    ) >= TRANSPOSE_GAIN * kernel_cycles(_conv_mk(info, itemsize, f), f.cout, rows):
        return None
    return micro_kernel(info, itemsize, rows, f.cout)


def _conv_mk(info: TargetInfo, itemsize: int, f: ConvFrame) -> MicroKernel:
    """The micro-kernel of a convolution's product: rows are output channels (of a group),
    columns every output position of every leading index."""
    if avx2_tiles(info) and f.window.taps == 1 and f.depth >= NARROW_DEPTH:
        return tile_kernel(info, itemsize, *AVX2_CONV_TILE)
    return micro_kernel(info, itemsize, f.cout_g, max(f.lead * f.positions, 1))


#: The shortest patch row (input channels) from which a 1x1 convolution's C = W patches runs
#: AVX2_CONV_TILE (MR x NV) in AVX2 code, whatever the issue model scores: each step's vectors
#: of B are a new input plane, streaming through L1, so the model's near-ties between 4 x 3,
#: 5 x 2 and 6 x 2 tiles go to the one loading the fewest of them per FMA. Measured on Zen 4
#: (znver3 code, one thread, in one process, GFLOP/s; 4 x 3 the model's choice):
#: squeezenet1_0's 384 -> 64 on 27 x 27 4 x 3 61.4, 5 x 2 59.3, 6 x 2 69.7 (78.4 against
#: 81.5 in 21 quieter rounds); 256 -> 32 62.3, 57.9, 69.1; 32 -> 128 on 54 x 54 4 x 3 81.7,
#: 6 x 2 88.1; 96 -> 16 73.9, 79.2; resnet18's 64 -> 128 stride 2 77.0, 76.6; but 16 -> 64
#: (a patch row of 16, where the stores weigh most) 61.0, 54.2. Wider windows keep the
#: model's tile: their B vectors are packed panels or staged rows read again by the next
#: taps (resnet18's 64 -> 64 3x3 on 56 x 56: 4 x 3 103.4-104.8, 6 x 2 101.2-102.0).
NARROW_DEPTH, AVX2_CONV_TILE = 32, (6, 2)


def _direct_tile(info: TargetInfo, itemsize: int, f: ConvFrame) -> DirectTile | None:
    """The direct kernel's tile (`conv_direct`) when the convolution runs it with weights
    packed at compile time (baked, or held by the JIT): `_direct`'s shapes whose output rows
    are not whole vectors of the target; None: the product kernels. Whole-vector rows are
    read in place by the product kernel, with no packing and nothing past the edge, and
    there it measured as fast or faster (3x3 64 -> 64 on 56 x 56 in AVX2 code: 90 GFLOP/s
    against 73 direct; on 32 x 32: 98 against 89, on AVX-512 105 against 102). With two
    512-bit FMA units, `DUAL_FMA_STAGED`'s tiles wherever the input is staged: in channel
    blocks (`_channel_blocked`), or in planes the single-vector tile would not read in place.
    In AVX2 code in channel blocks, whole-vector rows run the direct kernel too: 64 -> 64 on 56
    x 56 1.10 times as fast as the product kernel on Zen 3."""
    out_sp, blocked = f.window.out_sp, _channel_blocked(info, f)
    whole_rows = out_sp[-1] % max(info.vector_bytes // itemsize, 1) == 0
    if not _direct(f) or (whole_rows and not (avx2_tiles(info) and blocked)):
        return None
    tile = direct_tile(info, itemsize, out_sp[0], out_sp[1], f.cout)
    staged = blocked or not _in_place_direct(f, tile, itemsize)
    if info.dual_fma512 and staged:
        return direct_tile(info, itemsize, out_sp[0], out_sp[1], f.cout, staged=True)
    return tile


def _channel_blocked(info: TargetInfo, f: ConvFrame) -> bool:
    """Whether the direct kernel reads its input staged in blocks of channels
    (`channel_blocks`) rather than in planes: on targets with two 512-bit FMA units
    (`TargetInfo.dual_fma512`), every direct convolution, with `DUAL_FMA_STAGED`'s tiles;
    in AVX2 code, every direct convolution, with its own tiles.
    Measured on a Sapphire Rapids-class Xeon (one thread, batch 1, in one process, 11 rounds
    in random order; the median of each round's time ratio, against the planes' rule as it
    was: in place 1 x 28 x 1 for 3x3 stride 1, staged two-vector tiles for stride 2):
    resnet18's 64 -> 64 on 56 x 56 1.12 (1 x 14 x 2), 128 -> 128 on 28 x 28 1.12, 256 -> 256
    on 14 x 14 1.08, 512 -> 512 on 7 x 7 0.98 (2 x 7 x 2; its 9.4 MB of weights bound it),
    stride 2: 64 -> 128 on 56 x 56 1.15, 128 -> 256 on 28 x 28 1.06, 256 -> 512 on 14 x 14
    1.07. And in AVX2 code (`avx2_tiles`), in blocks of 8 channels with its own tiles,
    measured on an AMD EPYC Zen 3 the same way against the staged planes: 64 -> 128 stride 2
    on 56 x 56 1.08-1.14, 128 -> 128 on 28 x 28 1.07, 256 -> 256 on 14 x 14 1.10-1.22,
    256 -> 512 stride 2 on 14 x 14 1.36, 512 -> 512 on 7 x 7 0.98-0.99; squeezenet1_0's
    32 -> 128 on 54 x 54 1.10. Elsewhere the planes stay (unmeasured there: Zen 4's one FMA
    unit ran the in-place single-vector tiles at 0.96-0.98 of the staged copy's time). Not
    where the last block's padding channels would add more than BLOCK_WASTE of the FMAs
    (counted in blocks of the target's float32 lanes): an 11x11 stride-4 stem over 3
    channels (AlexNet's) ran 0.26 times as fast in blocks of 16, 29 channels (in blocks of
    32) 1.27."""
    lanes = info.vector_bytes // 4
    padded = -(-f.cin // lanes) * lanes
    return (info.dual_fma512 or avx2_tiles(info)) and padded <= f.cin * (1 + BLOCK_WASTE)


#: The share of a convolution's FMAs the padding channels of channel blocks may add
#: (`_channel_blocked`).
BLOCK_WASTE = 1 / 8


def _direct(f: ConvFrame) -> bool:
    """One group, two spatial axes, a window of more than one tap and patch rows of at least
    DIRECT_DEPTH (measured)."""
    w = f.window
    return (f.groups == 1 and len(w.out_sp) == 2 and w.taps > 1 and f.depth >= DIRECT_DEPTH
            and f.positions > 0)  # fmt: skip


def _conv_direct(k: KernelBuilder, s: Step, f: ConvFrame, tile: DirectTile) -> None:
    """The direct kernel over groups of images (`_direct_images`), their input planes staged
    together in scratch when padded or strided (read in place by `_direct_in_place` when
    `_in_place_direct`, staged in blocks of channels by `_direct_blocked` when
    `_channel_blocked`); a split call shares out the units of each
    group (`direct_units`), and a part over one image stages only the input rows its units
    read (`unit_rows`)."""
    x, b = s.args[0], k.b
    out_sp = (f.window.out_sp[0], f.window.out_sp[1])
    units = s.part_range(k, direct_units(tile, out_sp, f.cout))
    stage = norm_stage(k, s, f.cout, -(-f.cout // tile.nr) * tile.nr)
    if _channel_blocked(k.info, f):
        _direct_blocked(k, s, f, tile, units, stage)
        return
    if _in_place_direct(f, tile, k.dtype.itemsize):
        _direct_in_place(k, s, f, tile, units, stage)
        return
    group = _direct_images(f)
    assert s.scratch is not None and s.scratch.size >= group * f.cin * f.staged_plane
    taps = k.global_constant("taps", f.tap_table(), I32)
    staging = Buf(s.scratch.ptr, (group * f.cin, f.staged_plane))
    rows = None
    if f.staged and s.parts > 1 and f.lead == 1:
        e_lo, e_hi, i_lo, i_hi = f.stage_rows(k, *unit_rows(k, tile, units, out_sp))
        f.zero_rows(k, staging, e_lo, e_hi)
        rows = (i_lo, i_hi)
    elif f.staged:
        zero(k, staging)
    with _image_groups(k, f, group) as (b0, images):
        source, base, step = x, b.mul(b0, k.i64(f.cin * f.in_plane)), f.cin * f.in_plane
        if f.staged:
            with k.loop(images, "bi") as bi:
                at = k.at(staging, b.mul(bi, k.i64(f.cin * f.staged_plane)))
                f.stage(k, f.input_block(k, x, b.add(b0, bi), k.i64(0)),
                        Buf(at, (f.cin, f.staged_plane)), rows)  # fmt: skip
            source, base, step = staging, k.i64(0), f.cin * f.staged_plane
        plane = DirectPlane(source, base, step, images, (f.extents[-1], 1), taps, f.depth,
                            b.mul(b0, k.i64(f.cout)), out_sp, f.cout)  # fmt: skip
        emit_direct(k, tile, plane, (s.params["weight"], s.params["bias"]), s.out, units,
                    epilogue(k, s), stage)  # fmt: skip


#: The most rows of a direct tile that reads its input in place (`_in_place_direct`): each
#: patch row step of an in-place tile takes a select per tile row and per edge position (3
#: per row), against one FMA per position. Measured on Zen 4 (one thread, against the
#: staged copy in the same process, resnet18's layers, 3x3 padding 1): 64 -> 64 on 56 x 56
#: (1 x 28 tiles) 0.96-0.98 of the staged time at batch 16 and 0.97-0.98 at batch 1;
#: 128 -> 128 on 28 x 28 (1 x 28) 0.99; 256 -> 256 on 14 x 14 (2 x 14) 0.98-1.00; 512 ->
#: 512 on 7 x 7 (4 x 7, 12 selects a step, 162 KB staged) 1.00-1.01, so it stays staged.
IN_PLACE_ROWS = 2


def _in_place_direct(f: ConvFrame, tile: DirectTile, itemsize: int) -> bool:
    """Whether the direct kernel reads the input planes in place (`conv_direct.EdgeReads`)
    rather than a zero-padded staged copy: a 3x3 window, stride 1, dilation 1, padding 1
    (resnet's 3x3 convolutions but the downsampling ones), tiles of at most IN_PLACE_ROWS
    rows, on AVX-512 (the tiles whose FMAs take their broadcasts from memory,
    `conv_direct.FOLDED_POSITIONS`). In AVX2 code, where each position's broadcast is an
    instruction of its own and 16 registers hold the tile, the selects cost more than the
    copy: against the staged copy (znver3 code on Zen 4, one thread) 128 -> 128 on 28 x 28
    (1 x 6 x 2 vectors) 1.04 at batch 1, 256 -> 256 on 14 x 14 1.07-1.15, 512 -> 512 on 7 x 7
    (1 x 4 x 3) 1.22-1.49, squeezenet's 32 -> 128 on 27 x 27 1.18-1.21."""
    w = f.window
    return (w.kernel == (3, 3) and w.stride == (1, 1) and w.dilation == (1, 1)
            and w.padding == (1, 1) and tile.rows <= IN_PLACE_ROWS
            and tile.lanes * itemsize >= 64)  # fmt: skip


def _direct_in_place(
    k: KernelBuilder,
    s: Step,
    f: ConvFrame,
    tile: DirectTile,
    units: tuple[ir.Value, ir.Value],
    stage: NormStage | None,
) -> None:
    """The direct kernel over groups of images (as many as `_direct_images` stages together)
    reading their input planes in place: the taps' offsets are those of the unpadded planes
    from one row above and one column left of the output position, and a tap past the
    plane's edge reads zeros (`EdgeReads`)."""
    (oh, ow), b = f.window.out_sp, k.b
    ky, kx = np.divmod(np.arange(9), 3)
    taps = (np.arange(f.cin)[:, None] * f.in_plane + (ky * ow + kx)[None, :]).reshape(-1)
    table = k.global_constant("taps", taps.astype(np.int32), I32)
    edges = EdgeReads(k.global_constant("edges", edge_flags(f.cin), ir.IntType(8)),
                      k.global_constant("zeros", np.zeros(tile.cols, k.dtype)))  # fmt: skip
    group, step = _direct_images(f), f.cin * f.in_plane
    with _image_groups(k, f, group) as (b0, images):
        base = b.sub(b.mul(b0, k.i64(step)), k.i64(ow + 1))
        plane = DirectPlane(s.args[0], base, step, images, (ow, 1), table, f.depth,
                            b.mul(b0, k.i64(f.cout)), (oh, ow), f.cout, edges)  # fmt: skip
        emit_direct(k, tile, plane, (s.params["weight"], s.params["bias"]), s.out, units,
                    epilogue(k, s), stage)  # fmt: skip


@contextmanager
def _image_groups(
    k: KernelBuilder, f: ConvFrame, group: int
) -> Iterator[tuple[ir.Value, ir.Value]]:
    """A loop over the groups of `group` images: (the first image, the images in the group,
    the last group's the rest)."""
    b = k.b
    with k.loop(f.lead, "b0", step=group) as b0:
        left = b.sub(k.i64(f.lead), b0)
        yield b0, b.select(b.icmp_signed("<", left, k.i64(group)), left, k.i64(group))


def _direct_blocked(
    k: KernelBuilder,
    s: Step,
    f: ConvFrame,
    tile: DirectTile,
    units: tuple[ir.Value, ir.Value],
    stage: NormStage | None,
) -> None:
    """The direct kernel over groups of images (`_blocked_images`) whose input is staged in
    blocks of channels (`channel_blocks`); a split call over one image stages only the rows
    its units read."""
    w, b = f.window, k.b
    out_sp = (w.out_sp[0], w.out_sp[1])
    blocks = ChannelBlocks.of(w, f.cin, tile.lanes)
    group = _blocked_images(f)
    assert s.scratch is not None and s.scratch.size >= group * blocks.plane
    taps = k.global_constant("taps", blocks.tap_table(w), I32)
    staging = Buf(s.scratch.ptr, (group, blocks.plane))
    rows = None
    if s.parts > 1 and f.lead == 1:
        first, end = unit_rows(k, tile, units, out_sp)
        reach = b.add(b.mul(b.sub(end, k.i64(1)), k.i64(w.stride[0])),
                      k.i64((w.kernel[0] - 1) * w.dilation[0] + 1))  # fmt: skip
        rows = (b.mul(first, k.i64(w.stride[0])), reach)
    with _image_groups(k, f, group) as (b0, images):
        with k.loop(images, "bi") as bi:
            at = k.at(staging, b.mul(bi, k.i64(blocks.plane)))
            blocks.stage(k, w, f.cin, f.input_block(k, s.args[0], b.add(b0, bi), k.i64(0)),
                         Buf(at, (blocks.plane,)), rows)  # fmt: skip
        chunk = _direct_chunk(k.info, tile, blocks, w, k.dtype.itemsize)
        plane = DirectPlane(staging, k.i64(0), blocks.plane, images, blocks.steps(w), taps,
                            blocks.depth(w), b.mul(b0, k.i64(f.cout)), out_sp, f.cout,
                            chunk=chunk,
                            band=chunk_band(tile, out_sp[1], k.dtype.itemsize))  # fmt: skip
        emit_direct(k, tile, plane, (s.params["weight"], s.params["bias"]), s.out, units,
                    epilogue(k, s), stage)  # fmt: skip


def _direct_chunk(
    info: TargetInfo, tile: DirectTile, blocks: ChannelBlocks, window: Window, itemsize: int
) -> int:
    """The patch rows the tiles of a band of rows take at a time over channel blocks
    (`DirectPlane.chunk`; 0: all): in AVX2 code, `chunk_rows` (the rule's measurements are
    with CHUNK_ABOVE and BAND_BYTES). Unmeasured on the other targets (AVX-512's 32
    registers hold tiles of up to 28 positions, 2 tiles to a row)."""
    if not avx2_tiles(info):
        return 0
    return chunk_rows(tile, blocks.depth(window), window.taps * blocks.lanes, itemsize)


def _blocked_images(f: ConvFrame) -> int:
    """The images `_direct_blocked` stages and runs together: as many as STAGE_BLOCK bytes of
    their staged input hold (of doubles, in the widest blocks), at least one."""
    plane = ChannelBlocks.of(f.window, f.cin, WIDEST_BLOCK).plane
    return max(1, min(f.lead, STAGE_BLOCK // max(plane * 8, 1)))


def _direct_images(f: ConvFrame) -> int:
    """The images the direct kernel stages and runs together: as many as STAGE_BLOCK bytes
    of staged planes hold (of doubles; all of them when the input is read in place), at
    least one."""
    if not f.staged:
        return max(f.lead, 1)
    return max(1, min(f.lead, STAGE_BLOCK // max(f.cin * f.staged_plane * 8, 1)))


def kernel_name(info: TargetInfo, itemsize: int, f: ConvFrame) -> str:
    """The kernel a convolution with baked weights runs on the target and its register tile
    (bench/conv_layers.py prints it beside each layer)."""
    if _depthwise(f):
        return "depthwise window strips"
    direct = _direct_tile(info, itemsize, f)
    if direct is not None:
        reads = ", channel blocks" if _channel_blocked(info, f) else ""
        return f"direct {direct.rows}x{direct.cols} positions x {direct.nr} channels{reads}"
    transposed = _transposed_mk(info, itemsize, f)
    if transposed is not None:
        return f"C^T {transposed.mr}x{transposed.nr}"
    mk = _conv_mk(info, itemsize, f)
    return f"C {mk.mr}x{mk.nr}"


def _channel_panels(info: TargetInfo, itemsize: int, f: ConvFrame) -> int | None:
    """The width of the panels of output channels W^T is packed in for the direct kernel
    (`_direct_tile`) or C^T (`_transposed_mk`); None: panels of the product's rows."""
    direct = _direct_tile(info, itemsize, f)
    if direct is not None:
        return direct.nr
    transposed = _transposed_mk(info, itemsize, f)
    return None if transposed is None else transposed.nr


def _conv_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    """weight [out, in/groups, k...], bias [out]; baked, each group's weights as panels of the
    micro-kernel's rows: [groups, ceil(cout_g / MR), depth, MR], or (direct kernel, C^T) W^T
    in panels of NR output channels: [ceil(cout / NR), depth, NR], the bias padded to them."""
    m = node.metadata()
    cout = m["out_channels"]
    weight = (cout, m["in_channels"] // m["groups"], *m["kernel"])
    f = ConvFrame.of(node, parents[0], out)

    def pack(value: np.ndarray, info: TargetInfo) -> np.ndarray:
        itemsize = value.dtype.itemsize
        nr = _channel_panels(info, itemsize, f)
        if nr is not None:  # W^T [depth, cout] in panels of NR channels
            patches = value.reshape(cout, f.depth).T
            if _direct_tile(info, itemsize, f) is not None and _channel_blocked(info, f):
                blocks = ChannelBlocks.of(f.window, f.cin, max(info.vector_bytes // itemsize, 1))
                patches = blocks.blocked_rows(patches, f.window.taps)
            return pack_panels(patches, nr)
        mr = _conv_mk(info, value.dtype.itemsize, f).mr
        per_group = value.reshape(f.groups, f.cout_g, f.depth)
        return np.concatenate([pack_panels(w.T, mr).reshape(-1) for w in per_group])

    def pad(value: np.ndarray, info: TargetInfo) -> np.ndarray:
        nr = _channel_panels(info, value.dtype.itemsize, f)
        return value if nr is None else pad_to(value, -(-cout // nr) * nr)

    packing = None if _depthwise(f) else pack
    return {"weight": ParamSpec(weight, pack=packing),
            "bias": ParamSpec((cout,), 0.0, pack=None if _depthwise(f) else pad)}  # fmt: skip


#: Flops one element copied by a split convolution's parts costs, about: a split stops where
#: the copies the parts repeat (a shared block of columns re-packed, input rows staged by two
#: parts, a C^T part's packed rows) would exceed `DUPLICATE_SHARE` of the product's flops.
#: The copies cost only with threads: on one thread a split node runs its whole kernel
#: (`module.split_call`). Measured at batch 1 on two threads (Zen 4, quiet): 16 and 1/8 against
#: 64 and 1/32 took resnet18 from 0.61x to 0.75x ONNX Runtime, mobilenet_v2 from 0.58x to 0.74x.
COPY_FLOPS, DUPLICATE_SHARE = 16, 1 / 8
#: The most parts `_conv_parts` gives: as many as a plan takes (`plan.TASKS`), so the parts
#: `_split` balances are the parts that run (the plan keeps a balanced count as it is).
MAX_PARTS = 8


def _conv_parts(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """Into how many parts a convolution's call splits (depthwise: its groups): as many as
    its product's path allows, C = W patches (`_product_parts`) or, when the target may run
    it as C^T (`_transposable`), C^T (`_transposed_parts`); each path computes on as many
    of them as it allows, spread over them, and leaves the others empty (`_part_share`)."""
    f = ConvFrame.of(node, parents[0], out)
    if _depthwise(f):
        return f.groups
    return max(_product_parts(f), _transposed_parts(f) if _transposable(f) else 1)


def _split(units: int, repeated: Callable[[int], float], work: int) -> int:
    """Into how many parts (of at most `units`) to split: of the counts whose repeated copies
    stay under DUPLICATE_SHARE of the work, the one that balances threads best
    (`balanced_parts`: resnet18's 512-channel 3x3 layers on 7 x 7 at batch 1, C^T over 8
    panels of channels, were the 7 parts the copies allow, one of two threads computing 5
    panels; now 5 parts, 4 panels each)."""
    allowed = 1
    while allowed < min(units, MAX_PARTS) and repeated(allowed + 1) <= work * DUPLICATE_SHARE:
        allowed += 1
    return balanced_parts(units, allowed)


#: Output rows of a multiple of WHOLE_ROWS columns are whole vectors on every target (16
#: float32 lanes on AVX-512): `_conv_product`'s tiles read their columns in place from the
#: input or its staged planes and pack no block, so parts that share a block repeat no copy.
WHOLE_ROWS = 16


def _product_parts(f: ConvFrame) -> int:
    """C = W patches splits into (block of columns, tile of output channels) pairs, as many
    as the copies the parts repeat allow: on one thread a split call does that extra work
    too. Repeated are the blocks of columns two parts share (each packs it) and, as a part
    over one image stages only the input rows its columns read (`ConvFrame.stage_rows`), the
    staged rows two parts share; both counted exactly for tiles of 8 rows (no target's are
    narrower)."""
    plan = ConvPlan.of(f, 8)
    w, P = f.window, max(f.positions, 1)
    if _column_parts(f):
        return balanced_parts(-(-(f.lead * P) // MAX_PANEL), MAX_PARTS)
    blocks = -(-(plan.images * P) // plan.columns)
    tiles = -(-f.cout_g // 8)
    stage = f.groups * plan.images * f.cin_g * f.staged_plane
    limited = f.staged and plan.images == 1 and len(w.in_sp) >= 2
    # A 1x1 convolution read in place packs nothing on AVX2 and AVX-512 (`_whole_in_place`:
    # one block of columns, which every part would count as re-packed), nor does one whose
    # output rows are whole vectors on every target (`WHOLE_ROWS`).
    pack = (
        0
        if _whole_in_place(f, 8) or w.out_sp[-1] % WHOLE_ROWS == 0
        else f.groups * f.depth * plan.columns * -(-f.lead // plan.images)
    )
    row, halo = numel(w.out_sp[1:]), (w.kernel[0] - 1) * w.dilation[0] // w.stride[0]

    def repeated(parts: int) -> float:
        packed = staged = 0
        for part in range(parts):
            lo, hi = part * blocks * tiles // parts, (part + 1) * blocks * tiles // parts
            first, last = lo // tiles, -(-hi // tiles)
            packed += last - first
            rows = -(-min(last * plan.columns, P) // row) - first * plan.columns // row
            staged += max(rows, 0) + halo
        copies = (packed - blocks) / blocks * pack
        if f.staged:
            copies += (staged / w.phases[0] - 1) * stage if limited else (parts - 1) * stage
        return copies * COPY_FLOPS

    return _split(blocks * tiles, repeated, 2 * f.cout * f.depth * f.positions * f.lead)


def _transposed_parts(f: ConvFrame) -> int:
    """C^T splits into panels of output channels (at least 64 wide on any target); every
    part stages the whole input and packs all rows of patches, none counted for a 1x1
    window: the split is planned before the target is known, and the targets that read
    such rows in place (`_rows_in_place`) copy none; AVX2 code packs them in every part,
    at COPY_FLOPS 8 / (the part's channels) of its work, at most 1/8."""
    rows, whole = f.lead * f.positions, f.lead * f.cin * f.staged_plane
    packed = 0 if f.window.taps == 1 else rows * f.depth
    return _split(-(-f.cout // MAX_PANEL),
                  lambda parts: (parts - 1) * (packed + whole) * COPY_FLOPS,
                  2 * f.cout * f.depth * rows)  # fmt: skip


def _part_share(
    k: KernelBuilder, s: Step, units: int | ir.Value, parts: int
) -> tuple[ir.Value, ir.Value]:
    """The units [lo, hi) of `units` of the call's parts when its kernel computes on only
    `parts` of the call's `Step.parts` (`_conv_parts`): its parts spread over the call's
    (`_own_parts`), path part q starting at the units of the call's parts before the first
    one holding it (call part ceil(q * Step.parts / parts)), so a range of the call's parts
    holds about its share of the units. (Split as `Step.part_range` over the path's parts,
    mobilenet_v2's 960 -> 160 on 7 x 7, 5 panels in 3 C^T parts in 4, gave one thread's half
    1 panel and the other's 4.)"""
    assert s.part is not None and s.part_end is not None
    b, count = k.b, units if isinstance(units, ir.Value) else k.i64(units)
    total = k.i64(s.parts)

    def start(q: ir.Value) -> ir.Value:
        call = b.udiv(b.add(b.mul(q, total), k.i64(parts - 1)), k.i64(parts))
        return b.udiv(b.mul(call, count), total)

    first, after = _own_parts(k, s, parts)
    return start(first), start(after)


def _own_parts(k: KernelBuilder, s: Step, parts: int) -> tuple[ir.Value, ir.Value]:
    """The path's parts [lo, hi) (of its `parts`) in the call's parts [part, part_end) of
    `Step.parts`: call part p ends at the path's part p * parts // Step.parts. Spread, not the
    first ones: a thread's range of consecutive parts (`tlc_rt_parallel_parts`) then
    computes its share (mobilenet_v2's 960 -> 320 on 7 x 7: 5 panels in 6 parts, 3 of
    them, not 5 of 5 against 0, in a thread's half)."""
    assert s.part is not None and s.part_end is not None
    b, total = k.b, k.i64(s.parts)
    return (b.udiv(b.mul(s.part, k.i64(parts)), total),
            b.udiv(b.mul(s.part_end, k.i64(parts)), total))  # fmt: skip


@register(ops.ConvOp, params=_conv_params, scratch=_conv_scratch, fuses=True, parts=_conv_parts)
def _conv(k: KernelBuilder, s: Step) -> None:
    """Convolution as an implicit matrix product over the whole batch: out[oc, column] =
    W[oc, :] patches[:, column] + bias[oc], the columns running over every output position
    of every leading index. Per group of images (their input planes staged together when
    padded or strided) and block of columns, the patches are gathered straight into the
    micro-kernel's panels (`_pack_patches`), then the tiles of W (packed at compile time, or
    read row by row from a runtime payload) run over them; bias and a fused epilogue are
    applied as the tiles are stored (`_store_columns`). Depthwise convolutions have a direct
    kernel of their own (`_conv_depthwise`), and so do 3x3-like ones over many channels with
    baked weights (`conv_direct`: output channels as the vector dimension, the input
    broadcast in place)."""
    x, out = s.args[0], s.out
    assert s.scratch is not None
    f = ConvFrame.of(s.node, x.shape, out.shape)
    if _depthwise(f):
        assert not s.maps, "module.norm_stores leaves depthwise convolutions alone"
        _conv_depthwise(k, s, f)
        return
    direct = _direct_tile(k.info, k.dtype.itemsize, f) if s.packed else None
    if direct is not None:
        _conv_direct(k, s, f, direct)
        return
    transposed = _transposed_mk(k.info, k.dtype.itemsize, f) if s.packed else None
    if transposed is not None:
        used = min(s.parts, _transposed_parts(f))

        def emit(parts: int) -> None:
            _conv_transposed(k, s, f, transposed, parts)
    else:
        used = min(s.parts, _product_parts(f))

        def emit(parts: int) -> None:
            _conv_product(k, s, f, parts)

    if s.parts > used:  # call parts that hold none of this path's own do nothing
        first, after = _own_parts(k, s, used)
        with k.b.if_then(k.b.icmp_signed("<", first, after)):
            emit(used)
    else:
        emit(used)


def _unit_starts(columns: int, nc: int, nr: int, rows: int, mr: int, parts: int) -> np.ndarray:
    """Where each of `parts` parts of C = W patches starts among its units, (block of `nc`
    columns, tile of `mr` rows) pairs block-major, and where the last ends: whole units, each
    part about an equal share of the work, a unit's work being its panels of `nr` columns
    times its rows. Equal counts of units are not equal work when the last block or tile is
    partial: squeezenet1_0's 512 -> 1000 on 13 x 13 had parts of 0.47 and 0.18 ms, and a
    thread running consecutive parts (`tlc_rt_parallel_parts`) 3 of each."""
    blocks, tiles = -(-columns // nc), -(-rows // mr)
    work = [-(-min(nc, columns - cb * nc) // nr) * min(mr, rows - t * mr)
            for cb in range(blocks) for t in range(tiles)]  # fmt: skip
    done = np.concatenate([[0], np.cumsum(work)])
    share = done[-1] * np.arange(parts + 1) / parts
    return np.abs(done[None, :] - share[:, None]).argmin(axis=1).astype(np.int64)


def _block_columns(info: TargetInfo, f: ConvFrame, plan: ConvPlan, mk: MicroKernel) -> int:
    """The columns of a block of C = W patches: `plan.columns` rounded up to whole panels. In
    AVX2 code (`avx2_tiles`), whose panels are 24 columns, a group's last block of less than
    a panel is spread over the others (as long as their columns fit the block's scratch): a
    16 x 16 output plane, 256 columns in blocks of 227, was a block of 240 and one of 16, so a
    second pass over the weights for one panel two-thirds full, and at batch 1 on two threads
    the part holding it ran both blocks: its parts took 12.4 and 14.4 us against 12.7 and 12.7
    on AVX-512 (bench/run.py's CNN, its 16 -> 32 stride-2 layer); in one block of 264, 13.2
    and 13.6 (CPU time, Zen 4)."""
    nc = -(-plan.columns // mk.nr) * mk.nr
    total = plan.images * max(f.positions, 1)
    blocks = total // nc
    if not avx2_tiles(info) or blocks == 0 or total - blocks * nc >= mk.nr:
        return nc
    merged = -(-total // blocks // mk.nr) * mk.nr
    return merged if merged <= plan.columns + MAX_PANEL else nc


def _conv_product(k: KernelBuilder, s: Step, f: ConvFrame, parts: int) -> None:
    """C = W patches over `parts` of the call's parts (`_product_parts`)."""
    x, out = s.args[0], s.out
    assert s.scratch is not None
    b, P = k.b, f.positions
    mk = _conv_mk(k.info, k.dtype.itemsize, f)
    plan = ConvPlan.of(f, 8)
    nc = _block_columns(k.info, f, plan, mk)
    block = Buf(s.scratch.ptr, (nc * f.depth,))
    # The staged planes and MAX_PANEL elements after them, zeroed: what a wide column's tap
    # reads past the last plane.
    staging = Buf(k.at(s.scratch, (plan.columns + MAX_PANEL) * f.depth),
                  (plan.images * f.cin_g * f.staged_plane + MAX_PANEL,))  # fmt: skip
    sums = Buf(k.at(staging, staging.size), (plan.partials(f),))
    kc = min(f.depth, plan.kc)
    image = f.cin_g * f.plane if f.staged else f.cin * f.in_plane
    # Output rows of whole vectors: each vector of a panel's columns is contiguous in the
    # planes read, and the tiles load it there (no packing); else runs of `chunk` columns.
    # So is any vector of one image's columns of a 1x1 convolution read in place, whose
    # planes are its columns: the vectors reaching past an image's last column load only the
    # lanes before it (on AVX2 and AVX-512: `MASKED_LOADS`; planes of whole vectors need no
    # mask, on any target).
    in_place = not f.staged and f.window.taps == 1 and plan.images == 1
    flat = (in_place and f.positions % mk.lanes != 0
            and k.info.vector_bytes >= MASKED_LOADS)  # fmt: skip
    whole = in_place and f.positions % mk.lanes == 0
    direct = f.window.out_sp[-1] % mk.lanes == 0 or flat or whole
    ahead = (flat or whole) and f.lead * f.cin * f.in_plane * k.dtype.itemsize > AHEAD_BYTES
    # Wide: the columns of a 2-d staged convolution over one image run over whole rows of the
    # planes read (`extents`), ow of every E computed and stored: column oy * E + ox reads
    # the staged planes at itself plus the tap's offset, so every vector of columns is
    # contiguous there and the tiles load it in place; taken when the columns past ow are at
    # most WIDE_WASTE of them (3x3 over 56 x 56 padded: 2 of 58).
    extent = f.extents[-1] if f.extents else 1
    wide = (not direct and f.staged and len(f.window.in_sp) == 2 and plan.images == 1
            and extent >= mk.lanes
            and extent - f.window.out_sp[-1] <= WIDE_WASTE * extent)  # fmt: skip
    if wide:
        P, direct = f.window.out_sp[0] * extent, True
    chunk = mk.lanes
    # Packed from planes holding each image's columns in order: whole vectors (`_pack_planes`).
    planar = not direct and _planar(f, mk.lanes)
    taps = k.global_constant("taps", f.tap_table(), I32)
    if direct and not wide:
        table = k.global_constant("columns", _column_bases(f, plan.images, nc, chunk, image), I32)
    elif not direct and not planar:
        runs = [k.global_constant(name, column, I32) for name, column in
                zip(("run_first", "run_column", "run_source", "run_length"),
                    _column_runs(f, plan.images, nc, mk.lanes, image), strict=True)]  # fmt: skip
        zero(k, block)  # the padding columns of a last panel: never stored, but finite
    w, bias = s.params["weight"], s.params["bias"]
    tiles_m = -(-f.cout_g // mk.mr)
    fn = epilogue(k, s)
    stage = norm_stage(k, s, f.cout)
    vec = ir.VectorType(k.T, mk.lanes)
    # Whole vectors of columns never straddle two output planes: plain stores.
    aligned = P % mk.lanes == 0
    with b.goto_block(k.alloca_block):
        tile = b.alloca(ir.ArrayType(vec, mk.mr * mk.nv), name="tile")
    # Units of a split call: (block of columns, row tile) pairs, block-major, so a part
    # packs each block of columns it needs once and runs its share of the tiles on it.
    blocks = -(-(plan.images * P) // nc)

    def part_blocks(here: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value | None, ir.Value | None]:
        """The blocks of columns [lo, hi) (of `here` in this group of images) a part packs, and
        its units [lo, hi) (None: not split)."""
        if s.parts == 1:
            return k.i64(0), here, None, None
        first, after = _own_parts(k, s, parts)
        starts = k.global_constant("unit_starts", _unit_starts(
            plan.images * P, nc, mk.nr, f.cout_g, mk.mr, parts), I64)  # fmt: skip
        u_lo = b.load(b.gep(starts, [first], inbounds=True))
        u_hi = b.load(b.gep(starts, [after], inbounds=True))
        cb_hi = b.udiv(b.add(u_hi, k.i64(tiles_m - 1)), k.i64(tiles_m))
        return (b.udiv(u_lo, k.i64(tiles_m)), b.select(b.icmp_signed("<", cb_hi, here), cb_hi,
                                                       here), u_lo, u_hi)  # fmt: skip

    # A part of a split 1x1 convolution read in place (`_column_parts`): its run of panels
    # of columns, every row tile over them.
    span = None
    if s.parts > 1 and _column_parts(f) and direct:
        first, after = _own_parts(k, s, parts)
        count = k.i64(-(-P // mk.nr))
        span = tuple(b.mul(b.udiv(b.mul(q, count), k.i64(parts)), k.i64(mk.nr))
                     for q in (first, after))  # fmt: skip
    # A part of a split call over one image stages only the input rows its columns read.
    rows = None
    if f.staged and parts > 1 and plan.images == 1 and len(f.window.in_sp) >= 2:
        lo, hi, _, _ = part_blocks(k.i64(blocks))
        row = extent if wide else numel(f.window.out_sp[1:])
        first = b.udiv(b.mul(lo, k.i64(nc)), k.i64(row))
        end = b.mul(hi, k.i64(nc))
        end = b.select(b.icmp_signed("<", end, k.i64(P)), end, k.i64(P))
        last = b.udiv(b.add(end, k.i64(row - 1)), k.i64(row))
        e_lo, e_hi, i_lo, i_hi = f.stage_rows(k, first, b.select(b.icmp_signed("<", last, first),
                                                                 first, last))  # fmt: skip
        f.zero_rows(k, staging, e_lo, e_hi)
        rows = (i_lo, i_hi)
    elif f.staged:
        zero(k, staging)
    with k.loop(f.groups, "g") as g, k.loop(f.lead, "b0", step=plan.images) as b0:
        left = b.sub(k.i64(f.lead), b0)
        images = b.select(b.icmp_signed("<", left, k.i64(plan.images)), left,
                          k.i64(plan.images))  # fmt: skip
        valid = b.mul(images, k.i64(P))
        if f.staged:
            with k.loop(images, "bi") as bi:
                at = k.at(staging, b.mul(bi, k.i64(f.cin_g * f.staged_plane)))
                f.stage(k, f.input_block(k, x, b.add(b0, bi), g),
                        Buf(at, (f.cin_g, f.staged_plane)), rows)  # fmt: skip
            source = staging
        else:
            first = b.add(b.mul(b0, k.i64(f.cin)), b.mul(g, k.i64(f.cin_g)))
            source = Buf(k.at(x, b.mul(first, k.i64(f.in_plane))), (f.lead * image,))

        def a_at(ib: ir.Value, r: int, p: ir.Value) -> ir.Value:
            p = b.add(pc, p)
            if s.packed:
                tile = b.add(b.mul(g, k.i64(tiles_m)), ib)
                at = b.add(b.mul(tile, k.i64(f.depth * mk.mr)), b.mul(p, k.i64(mk.mr)))
                return k.at(w, b.add(at, k.i64(r)))
            row = b.add(b.mul(g, k.i64(f.cout_g)), b.add(b.mul(ib, k.i64(mk.mr)), k.i64(r)))
            return k.at(w, b.add(b.mul(row, k.i64(f.depth)), p))

        here = b.udiv(b.add(valid, k.i64(nc - 1)), k.i64(nc))
        cb_lo, cb_hi, u_lo, u_hi = part_blocks(here) if span is None else (k.i64(0), here,
                                                                           None, None)  # fmt: skip
        with k.loop(cb_hi, "cb", start=cb_lo) as cb:
            c0 = b.mul(cb, k.i64(nc)) if span is None else span[0]
            share = None
            if u_lo is not None and u_hi is not None:
                base = b.mul(cb, k.i64(tiles_m))
                t_lo, t_hi = b.sub(u_lo, base), b.sub(u_hi, base)
                share = (b.select(b.icmp_signed("<", t_lo, k.i64(0)), k.i64(0), t_lo),
                         b.select(b.icmp_signed(">", t_hi, k.i64(tiles_m)), k.i64(tiles_m),
                                  t_hi))  # fmt: skip
            rest = b.sub(valid, c0)
            cols = b.select(b.icmp_signed("<", rest, k.i64(nc)), rest, k.i64(nc))
            if span is not None:  # one block: the part's columns (none past `valid`)
                rest = b.sub(span[1], c0)
                cols = b.select(b.icmp_signed("<", rest, cols), rest, cols)
            panels = b.udiv(b.add(cols, k.i64(mk.nr - 1)), k.i64(mk.nr))
            if planar:
                _pack_planes(k, f, mk, block, source, cb, nc, panels, valid, image)
            elif not direct:
                _pack_runs(k, f, mk, block, source, runs, taps, cb, nc, valid)

            def b_at(jp: ir.Value, v: int, p: ir.Value) -> ir.Value:
                p = b.add(pc, p)
                if not direct:
                    row = b.add(b.mul(jp, k.i64(f.depth * mk.nr)), b.mul(p, k.i64(mk.nr)))
                    return k.at(block, b.add(row, k.i64(v * mk.lanes)))
                col = b.add(c0, b.add(b.mul(jp, k.i64(mk.nr)), k.i64(v * mk.lanes)))
                offset = b.sext(b.load(b.gep(taps, [p], inbounds=True)), ir.IntType(64))
                if wide:  # the column itself; past `valid`, the first
                    at = b.select(b.icmp_signed("<", col, valid), col, k.i64(0))
                else:
                    at = _column_start(k, table, col, chunk, valid)
                return k.at(source, b.add(at, offset))

            def column(jp: ir.Value, v: ir.Value) -> ir.Value:
                return b.add(c0, b.add(b.mul(jp, k.i64(mk.nr)), b.mul(v, k.i64(mk.lanes))))

            def inside(jp: ir.Value, v: int) -> ir.Value:
                """The lanes of vector v of panel jp before the image's last column."""
                left = b.sub(valid, column(jp, k.i64(v)))
                left = b.select(b.icmp_signed("<", left, k.i64(0)), k.i64(0), left)
                left = b.select(b.icmp_signed("<", left, k.i64(mk.lanes)), left,
                                k.i64(mk.lanes))  # fmt: skip
                return lane_mask(k, vec, ir.Constant(I32, 0), b.trunc(left, I32))

            def before_cut(jp: ir.Value) -> ir.Value:
                """Whether every column of panel jp lies before the image's last column."""
                return b.icmp_signed("<=", column(jp, k.i64(mk.nv)), valid)

            def put(channel: ir.Value, jp: ir.Value, v: ir.Value, value: ir.Value) -> None:
                """Store vector v of panel jp's row of output channel `channel`."""
                if wide:
                    _store_columns(k, f, out, value, b0, channel, column(jp, v), valid, fn,
                                   wide=True)  # fmt: skip
                elif aligned:
                    lanes = [(_plane_offset(k, f, b0, channel, column(jp, v)), None)]
                    if P % mk.nr == 0:  # every panel is whole: no column past `valid`
                        store_lanes(k, value, out, lanes, fn)
                    else:
                        with b.if_then(b.icmp_signed("<", column(jp, v), valid)):
                            store_lanes(k, value, out, lanes, fn)
                else:
                    _store_columns(k, f, out, value, b0, channel, column(jp, v), valid, fn)

            def finish(oc: ir.Value, jp: ir.Value, v: int, acc: ir.Value) -> None:
                channel = b.add(b.mul(g, k.i64(f.cout_g)), oc)
                value = b.fadd(acc, splat(k, vec, k.load(bias, channel)))
                if stage is None and (wide or aligned):
                    put(channel, jp, k.i64(v), value)
                else:  # stored (the maps and the epilogue applied) by `after`, once per tile
                    slot = b.add(b.mul(b.urem(oc, k.i64(mk.mr)), k.i64(mk.nv)), k.i64(v))
                    b.store(value, b.gep(tile, [k.i64(0), slot], inbounds=True))

            def after(row: ir.Value, jp: ir.Value, rows: int) -> None:
                """The tile's rows from the stack: a row's maps' operands read once for its
                vectors, and one copy of the stores for all of them (the maps at every store
                site made each function 280 lines longer). Without maps, the IR of before."""

                def channel(r: ir.Value) -> ir.Value:
                    return b.add(b.mul(g, k.i64(f.cout_g)), b.add(row, r))

                with k.loop(rows, "r") as r:
                    operands = stage.of(channel(r), vec) if stage is not None else []
                    with k.loop(mk.nv, "v") as v:
                        value = b.load(b.gep(tile, [k.i64(0), b.add(b.mul(r, k.i64(mk.nv)), v)]))
                        put(channel(r), jp, v, stage.apply(value, operands) if stage else value)

            def partial(row: ir.Value, jp: ir.Value, v: int) -> ir.Value:
                at = b.mul(b.add(b.mul(jp, k.i64(tiles_m * mk.mr)), row), k.i64(mk.nr))
                return k.at(sums, b.add(at, k.i64(v * mk.lanes)))

            blocked = f.depth > kc
            with k.loop(f.depth, "pc", step=kc) as pc:
                left_k = b.sub(k.i64(f.depth), pc)
                emit_packed_block(
                    k, mk, m=f.cout_g,
                    klen=b.select(b.icmp_signed("<", left_k, k.i64(kc)), left_k, k.i64(kc))
                    if blocked else k.i64(f.depth),  # a constant the tile loop unrolls by
                    a_at=a_at, b_at=b_at, panels=panels, finish=finish,
                    after=None if stage is None and (aligned or wide) else after,
                    partial=partial if blocked else None,
                    first=b.icmp_signed("==", pc, k.i64(0)),
                    last=b.icmp_signed("<=", left_k, k.i64(kc)), tiles=share,
                    b_mask=inside if flat else None, b_whole=before_cut,
                    prefetch=IN_PLACE_AHEAD if ahead else 0,
                    rows_outer=_rows_outer(f),
                )  # fmt: skip


def _conv_transposed(k: KernelBuilder, s: Step, f: ConvFrame, mk: MicroKernel, parts: int) -> None:
    """C^T = patches^T W^T (`_transposed_mk`): the packed linear kernel with its rows read
    from the input (staged when padded or strided) through a table of each output position's
    patch start plus the tap table, its panels the packed W^T; the product [positions,
    channels] is kept in scratch and written transposed into the output planes (a split call:
    its panels of channels)."""
    x, out, b = s.args[0], s.out, k.b
    assert s.scratch is not None
    fn = epilogue(k, s)
    # A fused map reading operands is applied as the product is written out (where they
    # are), others in the tiles (vectors, where the copy out is scalar): the same bits.
    # So are a batch norm and the maps after it (`Step.maps`), by output channel.
    stage = norm_stage(k, s, f.cout)
    late = (s.fused is not None and bool(s.fused.operands)) or stage is not None
    rows = f.lead * f.positions
    product = Buf(s.scratch.ptr, (rows * f.cout,))
    packed = Buf(k.at(s.scratch, product.size), (linear_scratch(rows, f.depth),))
    source, image = x, f.cin * f.in_plane
    if f.staged:
        staging = Buf(k.at(packed, packed.size), (f.lead * f.cin * f.staged_plane,))
        zero(k, staging)
        with k.loop(f.lead, "bi") as bi:
            at = k.at(staging, b.mul(bi, k.i64(f.cin * f.staged_plane)))
            f.stage(k, f.input_block(k, x, bi, k.i64(0)), Buf(at, (f.cin, f.staged_plane)))
        source, image = staging, f.cin * f.staged_plane
    starts = _column_bases(f, f.lead, 1, 1, image)
    bases = k.global_constant("rows", starts, I32)
    in_place = _rows_in_place(k.info, f)
    consecutive = not in_place and _tiles_consecutive(starts[:rows], mk.mr)
    taps = None if in_place else k.global_constant("taps", f.tap_table(), I32)

    def x_at(i: ir.Value, p: ir.Value) -> ir.Value:
        start = b.sext(b.load(b.gep(bases, [i], inbounds=True)), I64)
        if taps is None:  # patch row p is plane p: no table load per step
            return k.at(source, b.add(start, b.mul(p, k.i64(f.plane))))
        return k.at(source, b.add(start, b.sext(b.load(b.gep(taps, [p], inbounds=True)), I64)))

    panels = -(-f.cout // mk.nr)
    share = None if parts == 1 else (lambda units: _part_share(k, s, units, parts))
    emit_packed_linear(k, source, s.params["weight"], s.params["bias"], product, packed,
                       m=rows, n=f.cout, kk=f.depth, epilogue=None if late else fn, share=share,
                       x_at=x_at, in_place=in_place, consecutive=consecutive)  # fmt: skip
    lo, hi = k.i64(0), k.i64(f.cout)
    if share is not None:
        first, last = share(panels)
        lo, top = b.mul(first, k.i64(mk.nr)), b.mul(last, k.i64(mk.nr))
        hi = b.select(b.icmp_signed("<", top, hi), top, hi)
    _write_transposed(k, f, product, out, (lo, hi), mk.lanes, stage, fn if late else None)


def _write_transposed(
    k: KernelBuilder,
    f: ConvFrame,
    product: Buf,
    out: Buf,
    channels: tuple[ir.Value, ir.Value],
    lanes: int,
    stage: NormStage | None,
    fn: Epilogue | None,
) -> None:
    """C^T's product [positions of all leading indices, cout] written into the output
    planes for the output channels [lo, hi) (lo a multiple of `lanes`): blocks of `lanes`
    positions by `lanes` channels, read a row of channels per position, transposed in
    registers (`transpose_lanes`) and stored a vector of positions per channel, through
    `stage` and `fn`. (One element at a time, squeezenet1_0's 512 -> 1000 on 13 x 13 spent
    0.09 of its 1.62 ms here.)"""
    b, (lo, hi), P = k.b, channels, f.positions
    vec = ir.VectorType(k.T, lanes)
    zero = ir.Constant(vec, [0.0] * lanes)
    whole = b.add(lo, b.mul(b.udiv(b.sub(hi, lo), k.i64(lanes)), k.i64(lanes)))

    def block(
        img: ir.Value, oc0: ir.Value, pos0: ir.Value, count: int, mask: ir.Value | None
    ) -> None:
        first = b.add(b.mul(img, k.i64(P)), pos0)
        rows = [load_vector(k, vec, k.at(product, b.add(b.mul(b.add(first, k.i64(r)),
                                                              k.i64(f.cout)), oc0)),
                            lanes, mask) if r < count else zero
                for r in range(lanes)]  # fmt: skip
        stored = ir.Constant(ir.VectorType(I1, lanes), [r < count for r in range(lanes)])
        for j, value in enumerate(transpose_lanes(k, rows)):
            oc = b.add(oc0, k.i64(j))
            inside = ir.Constant(I1, 1) if mask is None else b.icmp_signed("<", oc, hi)
            with b.if_then(inside):
                at = b.add(b.mul(b.add(b.mul(img, k.i64(f.cout)), oc), k.i64(P)), pos0)
                store_lanes(k, stage(value, oc) if stage is not None else value, out,
                            [(at, None if count == lanes else stored)], fn)  # fmt: skip

    def channel_block(oc0: ir.Value, mask: ir.Value | None) -> None:
        with k.loop(f.lead, "img") as img:
            with k.loop(P - P % lanes, "pos0", step=lanes) as pos0:
                block(img, oc0, pos0, lanes, mask)
            if P % lanes:
                block(img, oc0, k.i64(P - P % lanes), P % lanes, mask)

    with k.loop(whole, "oc0", start=lo, step=lanes) as oc0:
        channel_block(oc0, None)
    if f.cout % lanes:  # the last channels, in the part that holds them
        with b.if_then(b.icmp_signed("<", whole, hi)):
            left = b.trunc(b.sub(hi, whole), I32)
            channel_block(whole, lane_mask(k, vec, ir.Constant(I32, 0), left))


def _rows_in_place(info: TargetInfo, f: ConvFrame) -> bool:
    """Whether C^T's tiles broadcast their rows of patches from the planes im2col reads (the
    input, or its staged copy: a 1x1 stride-2 layer's phase 0) rather than from rows packed
    per call (`emit_packed_linear`'s `in_place`): a 1x1 window, whose patch row p is plane p,
    except in AVX2 code. Wider windows keep their packed rows: a 3x3 layer's C^T reads 9 taps
    of each plane. In place, each step along k reads its MR elements from the next plane, a
    new cache line from L2 (the planes of a 7 x 7 layer are 196 bytes apart); an AVX2 tile's
    step is 5 x 2 vectors, 5 cycles of FMAs, too short to hide that, where packed rows are
    read in order. Measured on Zen 3 (znver3 code, one thread, batch 1, 11 paired rounds,
    packed against in place): mobilenet_v2's 960 -> 160 on 7 x 7 1.34, 960 -> 320 1.42,
    320 -> 1280 1.44, squeezenet1_0's 512 -> 1000 on 13 x 13 1.29, resnet18's 256 -> 512
    stride 2 on 14 x 14 1.38; whole networks mobilenet_v2 1.09, squeezenet1_0 1.09 (two
    threads, where every part packs the rows: 1.02 and 1.02). The AVX-512 tiles (7 x 32, a
    step of 14 FMAs) measured in place 5-8% faster on Zen 4; SSE code was mixed (0.98-1.21)."""
    return f.window.taps == 1 and not avx2_tiles(info)


def _tiles_consecutive(starts: np.ndarray, mr: int) -> bool:
    """Whether each tile of `mr` rows (from row 0; the last one shorter) starts its patches at
    consecutive elements (`starts`, a row's first element): a 1x1 convolution's positions over
    one image, unstaged or in its staged phase 0, so C^T's packing copies a tile's step as
    one vector (`emit_packed_linear`'s `consecutive`)."""
    steps = np.diff(starts.astype(np.int64)) == 1
    inside = np.arange(1, len(starts)) % mr != 0  # row i + 1 in the tile of row i
    return bool(np.all(steps | ~inside))


def _column_bases(f: ConvFrame, images: int, nc: int, chunk: int, image: int) -> np.ndarray:
    """For every `chunk` consecutive columns of a group of images (padded to whole blocks of
    `nc`), where the first one's patch starts in the planes im2col reads (before the tap's
    offset): `chunk` divides the output rows, so a chunk's positions are consecutive there."""
    columns = -(-(images * f.positions) // nc) * nc + MAX_PANEL
    c = np.arange(0, columns, chunk)
    img, pos = np.divmod(c, max(f.positions, 1))
    index = np.unravel_index(np.minimum(pos, max(f.positions - 1, 0)), f.window.out_sp)
    base = img * image + sum(i * st for i, st in zip(index, strides(f.extents), strict=True))
    base = np.where(c < images * f.positions, base, 0)
    assert base.max(initial=0) < 2**31, "column offsets fit in 32 bits"
    return base.astype(np.int32)


def _column_runs(
    f: ConvFrame, images: int, nc: int, lanes: int, image: int
) -> tuple[np.ndarray, ...]:
    """The columns of a group of images (blocks of `nc`) as runs that the packing copies with
    one masked vector each per patch row: consecutive columns of one output row (consecutive
    elements in the planes im2col reads) within one vector of a panel. Returns, as i32 tables:
    the first run of every block (and the end), each run's first column, where its patch
    starts (before the tap's offset) and its length."""
    P = max(f.positions, 1)
    ow = f.window.out_sp[-1] if f.window.out_sp else 1
    columns = np.arange(images * f.positions)
    starts = (columns % lanes == 0) | (columns % P % ow == 0)
    first_columns = columns[starts]
    lengths = np.diff(np.append(first_columns, columns.size))
    img, pos = np.divmod(first_columns, P)
    index = np.unravel_index(pos, f.window.out_sp)
    source = img * image + sum(i * st for i, st in zip(index, strides(f.extents), strict=True))
    blocks = -(-columns.size // nc)
    first = np.searchsorted(first_columns, np.arange(blocks + 1) * nc)
    assert max(source.max(initial=0), columns.size) < 2**31, "column offsets fit in 32 bits"
    return tuple(a.astype(np.int32) for a in (first, first_columns, source, lengths))


def _pack_runs(
    k: KernelBuilder,
    f: ConvFrame,
    mk: MicroKernel,
    block: Buf,
    source: Buf,
    runs: list[ir.Value],
    taps: ir.Value,
    cb: ir.Value,
    nc: int,
    valid: ir.Value,
) -> None:
    """Gather block `cb` of the patch matrix into its panels [depth, NR]: row p = (input
    channel, tap), as in W, reads `taps[p]` (`ConvFrame.tap_table`) further on than row 0;
    each run of columns (`_column_runs`) is one masked vector load and store per row. Runs
    past `valid` (a last, smaller group of images) are skipped."""
    b, nr = k.b, mk.nr
    vec = ir.VectorType(k.T, mk.lanes)
    first, column, start, length = runs

    def entry(table: ir.Value, i: ir.Value) -> ir.Value:
        return b.sext(b.load(b.gep(table, [i], inbounds=True)), I64)

    lo, hi = entry(first, cb), entry(first, b.add(cb, k.i64(1)))
    with k.loop(hi, "run", start=lo) as r:
        col = entry(column, r)
        with b.if_then(b.icmp_signed("<", col, valid)):
            at = b.sub(col, b.mul(cb, k.i64(nc)))
            panel, lane = b.udiv(at, k.i64(nr)), b.urem(at, k.i64(nr))
            dst = b.add(b.mul(panel, k.i64(f.depth * nr)), lane)
            src, count = entry(start, r), b.trunc(entry(length, r), I32)
            mask = lane_mask(k, vec, ir.Constant(I32, 0), count)
            with k.loop(f.depth, "row") as row:
                offset = b.add(src, entry(taps, row))
                value = load_vector(k, vec, k.at(source, offset), mk.lanes, mask)
                store_vector(k, value, k.at(block, b.add(dst, b.mul(row, k.i64(nr)))),
                             mk.lanes, mask)  # fmt: skip


#: Patch rows (input planes) ahead of the one it copies that `_pack_planes` prefetches: it
#: copies each plane's columns of the block in turn, one short run per plane, which the
#: hardware prefetchers do not run ahead of (zoo resnet50's 1024 -> 256 on 14 x 14 at batch
#: 16, Zen 4, one process: 18.66 -> 17.75 ms with 8, 18.01 with 16, 18.38 with 32).
PACK_AHEAD = 8


#: The most bytes of input planes (in doubles) a 1x1 convolution read in place may have to run
#: its row tiles outer (`_rows_outer`): each row tile reads them again, from L2 while they
#: stay there.
ROWS_OUTER_PLANES = 512 * 1024


def _rows_outer(f: ConvFrame) -> bool:
    """Whether a 1x1 convolution read in place (`_whole_in_place`) runs each row tile over
    every panel of columns (`emit_packed_block`'s `rows_outer`): where its weights are larger
    than its input planes (more output channels than positions) and the planes are at most
    ROWS_OUTER_PLANES bytes: the planes are then what the tiles read again, from L2,
    instead of the weights, from L3 or memory. zoo resnet50 at batch 1 on Zen 4, per node in
    the network: 256 -> 1024 on 14 x 14 (1 MiB of weights, 200 KiB of planes) 6.89 -> 6.64
    and 6.52 -> 6.21 ms in 6 layers, in AVX2 code 8.19 -> 7.75; 1024 -> 256 (800 KiB of
    planes) 5.21 -> 5.07 but in AVX2 code, whose 6-row tiles read the planes 43 times, 6.67 ->
    6.93, so it keeps panels outer. Warm and alone, where the weights stay in L3, level."""
    planes = f.depth * f.positions * 8
    return _whole_in_place(f, 8) and f.cout_g > f.positions and planes <= ROWS_OUTER_PLANES


def _planar(f: ConvFrame, lanes: int) -> bool:
    """Whether the planes a convolution's packing reads hold each image's columns as
    consecutive elements (one tap at the planes' first element, which are as wide as the
    output: a 1x1 window at stride 1, or the phase 0 a subsampled one stages) and a vector
    of `lanes` columns reaches into two images at most."""
    return f.window.taps == 1 and f.extents == f.window.out_sp and f.positions >= lanes


def _pack_planes(
    k: KernelBuilder,
    f: ConvFrame,
    mk: MicroKernel,
    block: Buf,
    source: Buf,
    cb: ir.Value,
    nc: int,
    panels: ir.Value,
    valid: ir.Value,
    image: int,
) -> None:
    """`_pack_runs` for a `_planar` convolution: the `panels` panels of block `cb` (of `nc`
    columns) patch row by patch row, each vector of a row one load from its plane, or two
    masked ones where its columns run on into the next image (whose first column lies
    `image` - positions elements after where this image's next one would), the lanes past
    `valid` zero; `PACK_AHEAD` planes ahead prefetched. Whole vectors instead of runs cut
    at every output row: zoo resnet50's 1024 -> 256 on 14 x 14 at batch 16 (6 images a group,
    runs of at most 14 columns) spent 2.3 of its 18.8 ms packing (Zen 4, one thread), and
    this took it to 17.75; its 512 -> 1024 stride-2 projection at batch 1 2.32 -> 2.21."""
    b, lanes, P = k.b, mk.lanes, f.positions
    vec = ir.VectorType(k.T, lanes)
    with k.loop(f.depth, "row") as row, k.loop(b.mul(panels, k.i64(mk.nv)), "slot") as slot:
        column = b.add(b.mul(cb, k.i64(nc)), b.mul(slot, k.i64(lanes)))
        count = b.sub(valid, column)
        count = b.select(b.icmp_signed("<", count, k.i64(lanes)), count, k.i64(lanes))
        count = b.select(b.icmp_signed("<", count, k.i64(0)), k.i64(0), count)
        pos = b.urem(column, k.i64(P))
        cut = b.sub(k.i64(P), pos)
        cut = b.select(b.icmp_signed("<", cut, count), cut, count)
        start = b.add(b.mul(b.udiv(column, k.i64(P)), k.i64(image)), pos)
        start = b.select(b.icmp_signed(">", count, k.i64(0)), start, k.i64(0))
        panel, v = b.udiv(slot, k.i64(mk.nv)), b.urem(slot, k.i64(mk.nv))
        dst = b.add(b.mul(panel, k.i64(f.depth * mk.nr)), b.mul(v, k.i64(lanes)))
        at = b.add(start, b.mul(row, k.i64(f.plane)))
        to = k.at(block, b.add(dst, b.mul(row, k.i64(mk.nr))))
        if PACK_AHEAD:
            prefetch_read(k, b.gep(k.at(source, at), [k.i64(PACK_AHEAD * f.plane)]))
        with b.if_else(b.icmp_signed("==", cut, k.i64(lanes))) as (whole, split):
            with whole:
                store_vector(k, load_vector(k, vec, k.at(source, at), lanes), to, lanes)
            with split:
                low = lane_mask(k, vec, ir.Constant(I32, 0), b.trunc(cut, I32))
                high = lane_mask(k, vec, b.trunc(cut, I32), b.trunc(count, I32))
                shift = b.select(b.icmp_signed(">", count, cut), k.i64(image - P), k.i64(0))
                first = load_vector(k, vec, k.at(source, at), lanes, low)
                value = load_vector(k, vec, k.at(source, b.add(at, shift)), lanes, high, first)
                store_vector(k, value, to, lanes)


def _column_start(
    k: KernelBuilder, table: ir.Value, column: ir.Value, chunk: int, valid: ir.Value
) -> ir.Value:
    """Where column `column`'s patch starts (`_column_bases`, for chunks of `chunk`
    columns); 0, the group's first element, past `valid`."""
    b = k.b
    entry = b.load(b.gep(table, [b.udiv(column, k.i64(chunk))], inbounds=True))
    inside = b.icmp_signed("<", column, valid)
    return b.select(inside, b.sext(entry, ir.IntType(64)), k.i64(0))


def _plane_offset(
    k: KernelBuilder, f: ConvFrame, b0: ir.Value, channel: ir.Value, column: ir.Value
) -> ir.Value:
    """The output offset of `column` of the group of images starting at leading index b0,
    in output channel `channel`."""
    b, P = k.b, f.positions
    image, pos = b.udiv(column, k.i64(P)), b.urem(column, k.i64(P))
    plane = b.add(b.mul(b.add(b0, image), k.i64(f.cout)), channel)
    return b.add(b.mul(plane, k.i64(P)), pos)


def _store_columns(
    k: KernelBuilder,
    f: ConvFrame,
    out: Buf,
    value: ir.Value,
    b0: ir.Value,
    channel: ir.Value,
    column: ir.Value,
    valid: ir.Value,
    fn: Epilogue | None,
    wide: bool = False,
) -> None:
    """Store the lanes of `value`, columns column.. of the group of images starting at b0,
    into output channel `channel` through the fused epilogue `fn` (`store_lanes`). The
    columns are rows of `pitch` columns of which the first `length` are outputs: each
    image's output plane, or with `wide`, each output row oy of the wide columns (E =
    extents[-1] >= lanes of them, ow kept: column oy * E + ox). A vector whose lanes all lie
    in one row is one plain store; else one masked store per row its lanes reach; columns
    past `valid` and a wide row's ow are dropped."""
    b, lanes = k.b, value.type.count
    P, ow = f.positions, f.window.out_sp[-1] if f.window.out_sp else 1
    pitch, length = (f.extents[-1], ow) if wide else (P, P)

    def place(col: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Column `col`'s position x in its row, and the output offset of x = 0."""
        r, x = b.udiv(col, k.i64(pitch)), b.urem(col, k.i64(pitch))
        if wide:  # row r of image b0's plane
            plane = b.mul(b.add(b.mul(b0, k.i64(f.cout)), channel), k.i64(P))
            return x, b.add(plane, b.mul(r, k.i64(ow)))
        plane = b.add(b.mul(b.add(b0, r), k.i64(f.cout)), channel)
        return x, b.mul(plane, k.i64(P))

    count = b.sub(valid, column)
    count = b.select(b.icmp_signed("<", count, k.i64(lanes)), count, k.i64(lanes))
    x, row = place(column)
    whole = b.icmp_signed("==", count, k.i64(lanes))
    whole = b.and_(whole, b.icmp_signed("<=", b.add(x, k.i64(lanes)), k.i64(length)))
    with b.if_else(whole) as (plain, pieces):
        with plain:
            store_lanes(k, value, out, [(b.add(row, x), None)], fn)
        with pieces:
            done = k.local(k.i64(0), "lane")
            with k.loop(2 if wide else min(lanes, -(-lanes // P) + 1), "piece"):
                lo = b.load(done)
                with b.if_then(b.icmp_signed("<", lo, count)):
                    x, row = place(b.add(column, lo))
                    left = b.sub(k.i64(length), x)
                    hi = b.add(lo, b.select(b.icmp_signed("<", left, k.i64(0)), k.i64(0), left))
                    hi = b.select(b.icmp_signed("<", hi, count), hi, count)
                    with b.if_then(b.icmp_signed("<", lo, hi)):
                        mask = lane_mask(k, value.type, b.trunc(lo, I32), b.trunc(hi, I32))
                        store_lanes(k, value, out, [(b.sub(b.add(row, x), lo), mask)], fn)
                    b.store(b.add(lo, b.sub(k.i64(pitch), x)), done)  # the next row's start


def _conv_depthwise(k: KernelBuilder, s: Step, f: ConvFrame) -> None:
    """A direct kernel for one input channel per group (`window_strips`): per output
    channel, the bias plus each tap's weight times the inputs it reads, then the fused
    epilogue. Explicit vectors: LLVM's vectoriser left rows of 28 or 54 positions scalar (3
    GFLOP/s)."""
    x, out, w, bias = s.args[0], s.out, s.params["weight"], s.params["bias"]
    b, taps = k.b, f.window.taps
    fn = epilogue(k, s)
    if _depthwise_in_place(f, k.info, k.dtype.itemsize):
        _depthwise_rows(k, s, f, fn)
        return
    if f.staged:
        assert s.scratch is not None
        staged = Buf(s.scratch.ptr, (1, f.staged_plane))
        zero(k, staged)
    g_lo, g_hi = s.part_range(k, f.groups)
    with k.loop(f.lead, "lead") as lead, k.loop(g_hi, "g", start=g_lo) as g:
        plane = f.input_block(k, x, lead, g)
        if f.staged:
            f.stage(k, plane, staged)
            plane = staged
        with k.loop(f.cout_g, "o") as o:
            channel = b.add(b.mul(g, k.i64(f.cout_g)), o)
            base = b.mul(b.add(b.mul(lead, k.i64(f.cout)), channel), k.i64(f.positions))

            def fold(acc: ir.Value, tap: ir.Value, inputs: ir.Value) -> ir.Value:
                weight = k.load(w, b.add(b.mul(channel, k.i64(taps)), tap))
                return multiply_add(k, splat(k, acc.type, weight), inputs, acc)

            window_strips(k, f, plane, out, base, k.load(bias, channel), fold, None, 0.0,
                          k.fadd_r, epilogue=fn, block=depthwise_rows(k.info, taps))  # fmt: skip


#: A window strip's fold: acc = fold(acc, tap number, the inputs the tap reads).
Fold = Callable[[ir.Value, ir.Value, ir.Value], ir.Value]
#: A cheaper fold and combine for a window op, with the lanes whose inputs they may get
#: wrong (`window_strips`' `fast`): a strip with such a lane is folded again exactly.
Fast = tuple[Fold, Combine, Callable[[ir.Value], ir.Value]]
#: Most elements a window op's plane computed as one flat run of strips may have (its
#: values pass through a stack buffer of that size).
FLAT_PLANE = 4096
#: Accumulators a window strip folds its taps into (tap t into t % CHAINS, or consecutive
#: blocks of taps, combined at the end): independent dependency chains. One chain of 9
#: maxima (llvm.maximum: 6 instructions each on x86) ran a 3x3 max pool at 0.57x ORT.
CHAINS = 3
#: Most output rows a depthwise strip computes at once (`depthwise_rows`): each input vector
#: is loaded once for every row whose taps read it (3x3, stride 1: 18 loads for 36 FMAs
#: instead of 36), where one row per strip was bound by its loads (a 512-bit load per cycle
#: on Zen 4, as many as FMAs).
DEPTHWISE_ROWS = 4


def depthwise_rows(info: TargetInfo, taps: int) -> int:
    """Output rows per depthwise strip: as many as keep every row's CHAINS accumulators,
    the taps' broadcast weights and 4 loaded vectors in the target's registers, at most
    DEPTHWISE_ROWS (AVX-512: 4 for 3x3; AVX2 and SSE: 1)."""
    chains = min(CHAINS, taps)
    return max(1, min(DEPTHWISE_ROWS, (info.vector_registers - taps - 4) // chains))


def _run_flat(f: ConvFrame, lanes: int) -> bool:
    """Whether `window_strips` runs a 2-D plane as one flat run of strips: its rows are
    narrower than a vector and that takes fewer strips than one run per row."""
    win = f.window
    if len(win.out_sp) != 2:
        return False
    rows, ow = win.out_sp
    run_all = (rows - 1) * f.extents[-1] + ow
    return ow < lanes and -(-run_all // lanes) < rows * -(-ow // lanes) <= FLAT_PLANE


def window_strips(
    k: KernelBuilder,
    f: ConvFrame,
    plane: Buf,
    out: Buf,
    base: ir.Value,
    start: ir.Value,
    fold: Callable[[ir.Value, ir.Value, ir.Value], ir.Value],
    finish: Callable[[ir.Value], ir.Value] | None,
    identity: float,
    combine: Combine,
    *,
    epilogue: Epilogue | None = None,
    ordered: bool = False,
    fast: Fast | None = None,
    block: int = 1,
) -> None:
    """One plane of a window op with one input plane per output plane (depthwise
    convolution, pooling), in strips of one vector register: the taps (in row-major order)
    are dealt round-robin to `CHAINS` accumulators (`ordered`: in consecutive blocks, so a
    combine that is associative but not commutative still folds them in row-major order),
    the first starting at `start` in every lane, the others at `identity`; acc = fold(acc,
    tap number, the inputs the tap reads for the strip) (contiguous in `plane`: the staged
    plane, or the input when nothing is padded or strided; each tap's offset from a
    compile-time table), then the accumulators are combined in order and finish(acc) is
    stored at out[base + position] through the fused `epilogue` (`store_lanes`).

    Each output row is a run of strips, or, when the rows are narrower than a vector and
    that takes fewer strips (a 7 x 7 plane: 4 strips of 16 lanes instead of 7), the whole
    2-D plane is one run over its positions laid out with the width of the planes read
    (output (oh, ow) at oh * width + ow: every tap then reads one contiguous run too, and
    the positions past a row's end compute values nobody keeps), copied row by row into
    `out` from a stack buffer (the epilogue applied as each row is copied, where its operands
    are). Either way every output is the same sequence of operations.

    With `block` > 1 (no `fast` fold; 2-D planes not run flat), each strip covers the same
    positions of `block` consecutive output rows (`_row_blocks`): every input vector their
    taps read is loaded once (the taps' offsets are compile-time constants: rows oh and oh + 1
    of a 3x3 window at stride 1 read the same input rows one row apart), and each row's
    accumulators take their taps in the same order as with one row: the same bits."""
    b, win = k.b, f.window
    ow = win.out_sp[-1]
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    vec = ir.VectorType(k.T, lanes)
    first, other = splat(k, vec, start), ir.Constant(vec, [identity] * lanes)
    offsets = k.global_constant("taps", f.tap_table(), I32)
    chains = min(CHAINS, win.taps)
    rounds, extra = divmod(win.taps, chains)

    # Chain c's first tap and the step between its taps, for round r (extra chains hold
    # one more tap, the last): round-robin, or consecutive blocks.
    blocks = [c * rounds + min(c, extra) for c in range(chains)]
    first_tap, step = (blocks, 1) if ordered else (list(range(chains)), chains)

    def strip(src: ir.Value, j: ir.Value, count: int, dest: Buf, to: ir.Value,
              then: Epilogue | None) -> None:  # fmt: skip
        """Positions j .. j+count of a run read from src + j, stored at dest[to..] through
        the epilogue `then`."""

        def taps(fold: Fold, combine: Combine, flag: Callable | None = None) -> ir.Value:
            accs = [k.local(first if c == 0 else other, "wacc") for c in range(chains)]
            flagged = k.local(ir.Constant(ir.VectorType(I1, lanes), None), "flag")

            def tap(acc: ir.AllocaInstr, t: ir.Value) -> None:
                shift = b.sext(b.load(b.gep(offsets, [t], inbounds=True)), I64)
                inputs = load_vector(k, vec, k.at(plane, b.add(b.add(src, shift), j)), count)
                b.store(fold(b.load(acc), t, inputs), acc)
                if flag is not None:
                    b.store(b.or_(b.load(flagged), flag(inputs)), flagged)

            with k.loop(rounds, "round") as r:
                for c, acc in enumerate(accs):
                    tap(acc, b.add(b.mul(r, k.i64(step)), k.i64(first_tap[c])))
            for c in range(extra):
                tap(accs[c], k.i64(rounds * step + first_tap[c]))
            value = b.load(accs[0])
            for acc in accs[1:]:
                value = combine(value, b.load(acc))
            if flag is None:
                return value
            held = k.local(value, "strip")
            any_flag = b.icmp_unsigned("!=", b.bitcast(b.load(flagged), ir.IntType(lanes)),
                                       ir.Constant(ir.IntType(lanes), 0))  # fmt: skip
            with b.if_then(any_flag, likely=False):
                b.store(taps(*exact), held)
            return b.load(held)

        exact = (fold, combine)
        value = taps(*fast) if fast is not None else taps(fold, combine)
        mask = None if count >= lanes else lane_mask(k, vec, ir.Constant(I32, 0),
                                                     ir.Constant(I32, count))  # fmt: skip
        store_lanes(k, finish(value) if finish is not None else value, dest, [(to, mask)],
                    then)  # fmt: skip

    def run(length: int, src: ir.Value, dest: Buf, target: Callable[[ir.Value], ir.Value],
            then: Epilogue | None) -> None:  # fmt: skip
        """Strips over a run of `length` positions; a run shorter than a vector is one
        masked strip, else whole strips, the last one moved back to end at the run's end (it
        recomputes a few positions, to the same values): one copy of the tap loop, no
        masks."""
        if length < lanes:
            strip(src, k.i64(0), length, dest, target(k.i64(0)), then)
            return
        with k.loop(-(-length // lanes), "strip") as t:
            j = b.mul(t, k.i64(lanes))
            j = b.select(b.icmp_signed(">", j, k.i64(length - lanes)), k.i64(length - lanes), j)
            strip(src, j, lanes, dest, target(j), then)

    width = f.extents[-1]
    rows = win.out_sp[0] if len(win.out_sp) == 2 else 0
    run_all = (rows - 1) * width + ow
    if _run_flat(f, lanes):
        with b.goto_block(k.alloca_block):
            slots = b.alloca(ir.ArrayType(k.T, run_all), name="flat")
        held = Buf(b.bitcast(slots, k.T.as_pointer()), (run_all,))
        run(run_all, k.i64(0), held, lambda j: j, None)
        with k.loop(rows, "row") as r:
            to, start = b.add(base, b.mul(r, k.i64(ow))), b.mul(r, k.i64(width))
            if epilogue is None:
                k.copy_run(out, to, held, start, ow)
            else:  # applied as each row is copied out: its operands are laid out like `out`
                row = load_vector(k, vec, k.at(held, start), ow)
                keep = lane_mask(k, vec, ir.Constant(I32, 0), ir.Constant(I32, ow))
                store_lanes(k, row, out, [(to, keep)], epilogue)
        return
    if block > 1 and fast is None and rows > 1:
        _row_blocks(k, f, plane, out, base, (first, other), fold, finish, combine, epilogue,
                    min(block, rows), _unrolled_taps(first_tap, step, rounds, extra))  # fmt: skip
        return
    in_steps, out_steps = strides(f.extents), strides(win.out_sp)
    with k.nest(win.out_sp[:-1], "row") as index:
        dst = b.add(base, k.linear_index(index, out_steps[:-1]))
        run(ow, k.linear_index(index, in_steps[:-1]), out, lambda j: b.add(dst, j), epilogue)


def _row_blocks(
    k: KernelBuilder,
    f: ConvFrame,
    plane: Buf,
    out: Buf,
    base: ir.Value,
    starts: tuple[ir.Value, ir.Value],
    fold: Fold,
    finish: Callable[[ir.Value], ir.Value] | None,
    combine: Combine,
    epilogue: Epilogue | None,
    rows: int,
    order: list[tuple[int, int]],
) -> None:
    """`window_strips` over blocks of `rows` output rows of a 2-D plane (the last block
    smaller), each strip one vector of positions of every row of the block (rows narrower
    than a vector: one masked strip each): the inputs that row r's tap t reads lie r * width
    + offset(t) after the block's first row's, so the taps of different rows reading the same
    vector share one load. The taps are folded into each row's chains in `window_strips`'
    order (`order`, `_unrolled_taps`)."""
    b, win = k.b, f.window
    height, ow = win.out_sp
    width = f.extents[-1]
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    vec = ir.VectorType(k.T, lanes)
    offsets = [int(o) for o in f.tap_table()]
    chains = len({c for _, c in order})
    n = min(ow, lanes)
    mask = None if n == lanes else lane_mask(k, vec, ir.Constant(I32, 0), ir.Constant(I32, n))

    def block(r0: ir.Value, count: int) -> None:
        """Output rows r0 .. r0 + count, strip by strip (the last moved back to end at
        the row's end, as `window_strips`' runs)."""
        with k.loop(-(-ow // lanes), "strip") as s:
            j = b.mul(s, k.i64(lanes))
            j = b.select(
                b.icmp_signed(">", j, k.i64(max(ow - lanes, 0))), k.i64(max(ow - lanes, 0)), j
            )
            src = b.add(b.mul(r0, k.i64(width)), j)
            loaded: dict[int, ir.Value] = {}
            accs = [[starts[0] if c == 0 else starts[1] for c in range(chains)]
                    for _ in range(count)]  # fmt: skip
            for t, c in order:
                for r in range(count):
                    at = r * width + offsets[t]
                    if at not in loaded:
                        loaded[at] = load_vector(k, vec, k.at(plane, b.add(src, k.i64(at))), n)
                    accs[r][c] = fold(accs[r][c], k.i64(t), loaded[at])
            for r in range(count):
                value = accs[r][0]
                for acc in accs[r][1:]:
                    value = combine(value, acc)
                to = b.add(base, b.add(b.mul(b.add(r0, k.i64(r)), k.i64(ow)), j))
                store_lanes(k, finish(value) if finish is not None else value, out,
                            [(to, mask)], epilogue)  # fmt: skip

    _each_row_block(k, height, rows, "rows", block)


def _unrolled_taps(
    first_tap: list[int], step: int, rounds: int, extra: int
) -> list[tuple[int, int]]:
    """The (tap, chain) pairs of `window_strips`' tap loop in its order, unrolled: round r
    folds tap r * step + first_tap[c] into chain c, then each chain c < extra its one more
    tap, rounds * step + first_tap[c]."""
    chains = len(first_tap)
    order = [(r * step + first_tap[c], c) for r in range(rounds) for c in range(chains)]
    return order + [(rounds * step + first_tap[c], c) for c in range(extra)]


def _each_row_block(
    k: KernelBuilder, height: int, rows: int, name: str, block: Callable[[ir.Value, int], None]
) -> None:
    """block(first row, count) over a plane `height` rows tall in blocks of `rows` rows:
    a loop over the whole blocks, then the last, shorter one (code of its own)."""
    whole = height // rows * rows
    with k.loop(whole, name, step=rows) as r0:
        block(r0, rows)
    if whole < height:
        block(k.i64(whole), height - whole)


def _depthwise_in_place(f: ConvFrame, info: TargetInfo, itemsize: int) -> bool:
    """Whether a depthwise convolution reads its input in place (`_depthwise_rows`) rather
    than from staged planes: 2-D planes run row by row (not one flat run, `_run_flat`), with
    a stride of at most 2 along the rows (one shuffle per tap picks its lanes). Always on
    AVX-512 (mask registers: masked loads cost as plain ones) and at stride 2 on AVX2 (its
    `vmaskmovps` loads beat staging's shuffles: 576 channels 14 x 14 -> 7 x 7 2.5x faster).
    Otherwise only rows with at least as many unmasked strips as masked ones
    (`_inner_strips`) on AVX2 and more on SSE, which has no masked loads (LLVM loads lane by
    lane): 384 channels on 14 x 14 in place, two masked strips a row, were 1.3x slower than
    staged on AVX2; SSE's 576 channels 14 x 14 -> 7 x 7 2.4x, its 192 channels 28 x 28 ->
    14 x 14 (two masked strips of four) 1.2x."""
    win = f.window
    lanes = max(info.vector_bytes // itemsize, 1)
    if len(win.out_sp) != 2 or win.stride[-1] > 2 or _run_flat(f, lanes):
        return False
    if info.vector_bytes >= 64 or (win.stride[-1] == 2 and info.vector_bytes >= 32):
        return True
    inner = len(_inner_strips(f, lanes))
    masked = -(-win.out_sp[-1] // lanes) - inner
    return inner > masked or (inner == masked and info.vector_bytes >= 32)


def _inner_strips(f: ConvFrame, lanes: int) -> range:
    """The strips of an output row `_depthwise_rows` computes without masks: every load of
    its taps (lanes * stride inputs from each even offset of its column taps at stride 2)
    inside the row, and all its outputs inside the output row."""
    win = f.window
    (_, width), (_, ow), (_, sw), (_, pw) = win.in_sp, win.out_sp, win.stride, win.padding
    reach = (win.kernel[-1] - 1) * win.dilation[-1] // sw * sw + lanes * sw
    inside = [t for t in range(-(-ow // lanes)) if t * lanes * sw >= pw
              and (t + 1) * lanes <= ow and t * lanes * sw - pw + reach <= width]  # fmt: skip
    return range(inside[0], inside[-1] + 1) if inside else range(0)


def each_strip(
    k: KernelBuilder, strips: int, inner: range, name: str, visit: Callable[[ir.Value, bool], None]
) -> None:
    """visit(strip, masked) for the `strips` strips of an output row read in place: the
    `inner` ones (`_inner_strips`) unmasked, each group in a loop of its own, those at the
    row's ends masked."""
    t_lo, t_hi = (inner.start, inner.stop) if inner else (0, 0)
    for first, end, masked in ((0, t_lo, True), (t_lo, t_hi, False), (t_hi, strips, True)):
        if end > first:
            with k.loop(end, name, start=first) as t:
                visit(t, masked)


def row_inputs(
    k: KernelBuilder,
    wide: ir.VectorType,
    ptr: ir.Value,
    start: ir.Value,
    width: int,
    masked: bool,
    outside: ir.Value | None = None,
) -> ir.Value:
    """The `wide` consecutive inputs at `ptr`, column `start` (it may be negative) of an
    input row `width` long; `masked`: only the columns inside the row are read, the others
    zero (or `outside`'s lanes)."""
    if not masked:
        return load_vector(k, wide, ptr, wide.count)
    b = k.b
    keep = lane_mask(k, wide, b.trunc(b.neg(start), I32), b.trunc(b.sub(k.i64(width), start), I32))
    return load_vector(k, wide, ptr, wide.count, keep, outside)


def _depthwise_rows(k: KernelBuilder, s: Step, f: ConvFrame, fn: Epilogue | None) -> None:
    """A depthwise convolution read in place: no staged copy of the input plane. Per output
    channel, blocks of `depthwise_rows` output rows in strips of one vector, as
    `_row_blocks`. A tap's inputs for a strip are one load of lanes * stride consecutive
    inputs of its row; at stride 2 one shuffle picks every other lane (`stride_phase`), and
    the column taps whose offsets differ by one read the two phases of the same load. Each
    load is shared by every row of the block and tap that reads it. The padding reads zeros:
    kernel rows above or below the plane read a constant row of zeros (a select of the row's
    address), and the strips at the rows' ends (`_inner_strips`) mask their loads to the
    columns inside the row (the others zero). A row's last strip is moved back to end at the
    row's end (it recomputes a few positions), so stores are masked only in rows narrower
    than a vector. Every output takes the staged kernel's operations in its order. Staging
    the 96 planes of 112 x 112 of mobilenet_v2's first stride-2 layer into four phases took
    about 40% of its time."""
    x, out, w, bias = s.args[0], s.out, s.params["weight"], s.params["bias"]
    b, win = k.b, f.window
    (h, width), (height, ow) = win.in_sp, win.out_sp
    (sh, sw), (ph, pw), (kh_n, kw_n), (dh, dw) = win.stride, win.padding, win.kernel, win.dilation
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    vec, wide = ir.VectorType(k.T, lanes), ir.VectorType(k.T, lanes * sw)
    zeros = k.global_constant("zero_row", np.zeros(width, k.dtype))
    chains = min(CHAINS, win.taps)
    order = _unrolled_taps(list(range(chains)), chains, *divmod(win.taps, chains))
    rows = min(depthwise_rows(k.info, win.taps), height)
    strips, inner = -(-ow // lanes), _inner_strips(f, lanes)

    def block(plane: ir.Value, base: ir.Value, weights: list[ir.Value], start: ir.Value,
              r0: ir.Value, count: int) -> None:  # fmt: skip
        """Output rows r0 .. r0 + count of one channel: each input row they read (or the
        zero row outside the plane), then the strips."""
        top = b.sub(b.mul(r0, k.i64(sh)), k.i64(ph))
        in_rows = []
        for i in range((count - 1) * sh + (kh_n - 1) * dh + 1):
            ih = b.add(top, k.i64(i))
            valid = b.icmp_unsigned("<", ih, k.i64(h))  # 0 <= ih < h
            in_rows.append(b.select(valid, b.gep(plane, [b.mul(ih, k.i64(width))]), zeros))

        def strip(t: ir.Value, masked: bool) -> None:
            j = b.mul(t, k.i64(lanes))
            if masked and ow >= lanes:  # the row's last strip ends at its end: unmasked stores
                j = b.select(b.icmp_signed(">", j, k.i64(ow - lanes)), k.i64(ow - lanes), j)
            col = b.sub(b.mul(j, k.i64(sw)), k.i64(pw))
            loaded: dict[tuple[int, int], ir.Value] = {}
            picked: dict[tuple[int, int], ir.Value] = {}

            def inputs(i: int, off: int) -> ir.Value:
                """Lanes col + off, col + off + stride, ... of input row i."""
                at = (i, off // sw * sw)
                if at not in loaded:
                    c0 = b.add(col, k.i64(at[1]))
                    ptr = b.gep(in_rows[i], [c0])  # may point before the row: masked
                    loaded[at] = row_inputs(k, wide, ptr, c0, width, masked)
                if (i, off) not in picked:
                    whole = loaded[at]
                    picked[i, off] = stride_phase(k, whole, sw, off % sw) if sw > 1 else whole
                return picked[i, off]

            accs = [[start if c == 0 else ir.Constant(vec, [0.0] * lanes)
                     for c in range(chains)] for _ in range(count)]  # fmt: skip
            for t_no, c in order:
                kh, kw = divmod(t_no, kw_n)
                weight = splat(k, vec, weights[t_no])
                for r in range(count):
                    value = inputs(r * sh + kh * dh, kw * dw)
                    accs[r][c] = multiply_add(k, weight, value, accs[r][c])
            mask = None
            if masked and ow < lanes:
                mask = lane_mask(k, vec, ir.Constant(I32, 0), b.trunc(b.sub(k.i64(ow), j), I32))
            for r in range(count):
                value = accs[r][0]
                for acc in accs[r][1:]:
                    value = k.fadd_r(value, acc)
                to = b.add(base, b.add(b.mul(b.add(r0, k.i64(r)), k.i64(ow)), j))
                store_lanes(k, value, out, [(to, mask)], fn)

        each_strip(k, strips, inner, "dstrip", strip)

    g_lo, g_hi = s.part_range(k, f.groups)
    with k.loop(f.lead, "lead") as lead, k.loop(g_hi, "g", start=g_lo) as g:
        plane = f.input_block(k, x, lead, g).ptr
        with k.loop(f.cout_g, "o") as o:
            channel = b.add(b.mul(g, k.i64(f.cout_g)), o)
            base = b.mul(b.add(b.mul(lead, k.i64(f.cout)), channel), k.i64(f.positions))
            weights = [k.load(w, b.add(b.mul(channel, k.i64(win.taps)), k.i64(t)))
                       for t in range(win.taps)]  # fmt: skip
            start = splat(k, vec, k.load(bias, channel))
            _each_row_block(
                k,
                height,
                rows,
                "drows",
                lambda r0, count: block(plane, base, weights, start, r0, count),
            )


def _conv_input_grad_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """W transposed per group ([groups, depth, cout/groups]: as many elements as W) and one
    group's patch-matrix cotangent."""
    f = ConvFrame.of(node, out, parents[0])
    return f.cout * f.depth + f.depth * f.positions


@register(bw.ConvInputGradOp, scratch=_conv_input_grad_scratch)
def _conv_input_grad(k: KernelBuilder, s: Step) -> None:
    """The transposed convolution: per leading index and group, the patch matrix's cotangent
    W_g^T G_g [depth, positions] (the broadcast kernel over W transposed once), scattered back
    onto the input planes it was gathered from (col2im)."""
    g_buf, w = s.args
    assert s.scratch is not None
    f = ConvFrame.of(s.node, s.out.shape, g_buf.shape)
    w_t = Buf(s.scratch.ptr, (f.groups, f.depth, f.cout_g))
    gather(k, w, w_t, [f.cout_g * f.depth, 1, f.depth])  # w_t[g, d, o] = W[g*cout_g + o, d]
    cols = Buf(k.at(s.scratch, f.cout * f.depth), (f.depth, f.positions))
    zero(k, s.out)
    with k.loop(f.lead, "lead") as lead, k.loop(f.groups, "g") as g:
        w_t_g = Buf(k.at(w_t, k.b.mul(g, k.i64(f.depth * f.cout_g))), (f.depth, f.cout_g))
        emit_broadcast_tiles(k, w_t_g, f.output_block(k, g_buf, lead, g), cols,
                             m=f.depth, n=f.positions, kk=f.cout_g)  # fmt: skip
        f.col2im(k, cols, f.input_block(k, s.out, lead, g))


def _conv_weight_grad_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """One group's patch matrix, its [cout/groups, depth] share of the kernel cotangent and,
    with padding or a stride, the group's staged input planes."""
    f = ConvFrame.of(node, parents[0], parents[1])
    return f.depth * f.positions + f.cout_g * f.depth + f.cin_g * f.staged_plane


@register(bw.ConvWeightGradOp, scratch=_conv_weight_grad_scratch)
def _conv_weight_grad(k: KernelBuilder, s: Step) -> None:
    """The kernel's cotangent, a correlation of the input with the output cotangent: per
    leading index and group, G_g [cout/groups, positions] times the patch matrix transposed
    (both contiguous along positions, so the dot-product tiles apply), summed over the
    leading indices."""
    x, g_buf = s.args
    assert s.scratch is not None
    f = ConvFrame.of(s.node, x.shape, g_buf.shape)
    patches = Buf(s.scratch.ptr, (f.depth, f.positions))
    part = Buf(k.at(s.scratch, f.depth * f.positions), (f.cout_g, f.depth))
    staging = k.at(s.scratch, f.depth * f.positions + f.cout_g * f.depth)
    zero(k, s.out)
    with k.loop(f.lead, "lead") as lead, k.loop(f.groups, "g") as g:
        f.im2col(k, f.input_block(k, x, lead, g), patches, staging)
        emit_dot_tiles(k, f.output_block(k, g_buf, lead, g), patches, part,
                       m=f.cout_g, n=f.depth, kk=f.positions, bias=None)  # fmt: skip
        dw = Buf(k.at(s.out, k.b.mul(g, k.i64(f.cout_g * f.depth))), part.shape)
        with k.loop(part.size, "e") as e:
            k.store(k.fadd_r(k.load(dw, e), k.load(part, e)), dw, e)
