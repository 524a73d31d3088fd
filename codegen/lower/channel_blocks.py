"""Input planes staged in blocks of channels (NCHWc) for the direct convolution kernel.

The direct kernel (`conv_direct`) broadcasts one input scalar per output position and patch
row. Read from planes (NCHW), consecutive patch rows (taps, then input channels) jump between
three rows of every input plane, so each step of a tile touches two or three cache lines of
its own: a 1 x 14 tile over 64 channels reads about 400 short runs. Staged in blocks of
`lanes` channels, element (block, row, column, channel) of the zero-padded planes at
((block * rows + row) * cols + column) * lanes + channel, with the patch rows in the order
(block, tap, channel) (the weights packed to match, `blocked_rows`), `lanes` consecutive steps
read one cache line per position and use all of it; the padding is in the copy, so no tap
reads past an edge (no selects), and a stride only lengthens the step between positions (no
stride phases). The copy is a transpose of `lanes` x `lanes` blocks in registers
(`conv_direct.transpose_lanes`): with the call, 0.7-4% of a 3x3 layer's time on a Sapphire
Rapids-class Xeon (resnet18's, batch 1: 2.6% for 64 -> 64 on 56 x 56, 0.7% on 7 x 7, 4% for
its 64 -> 128 stride 2, which computes a quarter of the positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import Buf, KernelBuilder
from tlc.codegen.gemm import load_vector
from tlc.codegen.lower.conv_direct import transpose_lanes
from tlc.codegen.lower.windows import Window

#: The most channels a block holds on any target (64-byte vectors of float32): what scratch
#: is sized for, before the target is known.
WIDEST_BLOCK = 16


@dataclass(frozen=True)
class ChannelBlocks:
    """One image's input staged in `blocks` blocks of `lanes` channels (the last zero-filled
    past the input's channels), each a zero-padded `rows` x `cols` plane of positions holding
    `lanes` channels each."""

    lanes: int
    blocks: int
    rows: int
    cols: int

    @staticmethod
    def of(window: Window, cin: int, lanes: int) -> ChannelBlocks:
        rows, cols = window.padded
        return ChannelBlocks(lanes, -(-cin // lanes), rows, cols)

    @property
    def plane(self) -> int:
        """Elements of one image's staged input."""
        return self.blocks * self.rows * self.cols * self.lanes

    def depth(self, window: Window) -> int:
        """Patch rows (block, tap, channel), the padding channels included."""
        return self.blocks * window.taps * self.lanes

    def steps(self, window: Window) -> tuple[int, int]:
        """Elements between the reads of output positions one row and one column apart."""
        (sy, sx) = window.stride
        return sy * self.cols * self.lanes, sx * self.lanes

    def tap_table(self, window: Window) -> np.ndarray:
        """Where output position (0, 0) reads for every patch row (block, tap, channel), as
        i32."""
        ky, kx = np.divmod(np.arange(window.taps), window.kernel[1])
        (dy, dx) = window.dilation
        per_tap = (ky * dy * self.cols + kx * dx) * self.lanes
        block = np.arange(self.blocks) * self.rows * self.cols * self.lanes
        channel = np.arange(self.lanes)
        table = block[:, None, None] + per_tap[None, :, None] + channel[None, None, :]
        assert table.max(initial=0) < 2**31, "patch offsets fit in 32 bits"
        return table.reshape(-1).astype(np.int32)

    def blocked_rows(self, patches: np.ndarray, taps: int) -> np.ndarray:
        """`patches` ([cin * taps, ...]: rows (input channel, tap), as W^T holds them) in the
        order (block, tap, channel), zero rows for the padding channels."""
        cin = patches.shape[0] // taps
        rows = np.zeros((self.blocks * self.lanes, taps, *patches.shape[1:]), patches.dtype)
        rows[:cin] = patches.reshape(cin, taps, *patches.shape[1:])
        rows = rows.reshape(self.blocks, self.lanes, taps, *patches.shape[1:]).swapaxes(1, 2)
        return rows.reshape(-1, *patches.shape[1:])

    def stage(
        self,
        k: KernelBuilder,
        window: Window,
        cin: int,
        x_block: Buf,
        staged: Buf,
        rows: tuple[ir.Value, ir.Value] | None = None,
    ) -> None:
        """Write the staged rows [lo, hi) (`rows`; all by default) of every block from the
        input planes `x_block` ([cin, in_plane]): padding rows and columns zero, and along an
        input row `lanes` positions at a time, one vector of positions per channel loaded,
        transposed into one vector of channels per position and stored. Every element of
        the rows is written, so the staged buffer needs no zeroing first."""
        b, lanes = k.b, self.lanes
        (pad_y, pad_x), (height, width) = window.padding, window.in_sp
        vec = ir.VectorType(k.T, lanes)
        zero = ir.Constant(vec, [0.0] * lanes)
        vptr = vec.as_pointer()
        first, end = rows if rows is not None else (k.i64(0), k.i64(self.rows))

        def put(value: ir.Value, at: ir.Value) -> None:
            b.store(value, b.bitcast(k.at(staged, at), vptr), align=k.dtype.itemsize)

        def zeros(row_at: ir.Value, lo: int, hi: int) -> None:
            with k.loop(hi, "zc", start=lo) as col:
                put(zero, b.add(row_at, b.mul(col, k.i64(lanes))))

        def positions(block: ir.Value, y: ir.Value, row_at: ir.Value, x0: ir.Value,
                      count: int) -> None:  # fmt: skip
            """Input positions x0 .. x0 + count of row y, one vector per position."""
            columns = []
            for c in range(lanes):
                channel = b.add(b.mul(block, k.i64(lanes)), k.i64(c))
                if cin % lanes:  # the last block's padding channels read channel 0, then zero
                    real = b.icmp_signed("<", channel, k.i64(cin))
                    channel = b.select(real, channel, k.i64(0))
                src = b.add(b.mul(channel, k.i64(height * width)),
                            b.add(b.mul(y, k.i64(width)), x0))  # fmt: skip
                value = load_vector(k, vec, k.at(x_block, src), count)
                columns.append(b.select(real, value, zero) if cin % lanes else value)
            for j, value in enumerate(transpose_lanes(k, columns)[:count]):
                put(value, b.add(row_at, b.mul(b.add(x0, k.i64(pad_x + j)), k.i64(lanes))))

        whole = width // lanes * lanes
        with k.loop(self.blocks, "cb") as block, k.loop(end, "srow", start=first) as row:
            row_at = b.mul(b.add(b.mul(block, k.i64(self.rows)), row), k.i64(self.cols * lanes))
            y = b.sub(row, k.i64(pad_y))
            with b.if_else(b.icmp_unsigned("<", y, k.i64(height))) as (inside, outside):
                with inside:
                    zeros(row_at, 0, pad_x)
                    with k.loop(whole, "sx", step=lanes) as x0:
                        positions(block, y, row_at, x0, lanes)
                    if width > whole:
                        positions(block, y, row_at, k.i64(whole), width - whole)
                    zeros(row_at, pad_x + width, self.cols)
                with outside:
                    zeros(row_at, 0, self.cols)
