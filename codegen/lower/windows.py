"""A sliding window's geometry over the spatial axes (`Window`, `Axis`) and the tap loops
convolution and pooling share: each tap's loop over output positions is bounded so padding
needs no test, and never unrolled, so code size does not depend on the kernel's extent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from tlc.codegen.builder import Buf, KernelBuilder, strides
from tlc.dialect.shapes import Shape

NSW = ("nsw",)


@dataclass(frozen=True)
class Window:
    """A sliding window's static geometry over the spatial axes, per axis: the input and
    output extents, stride, dilation, padding and kernel extent."""

    in_sp: Shape
    out_sp: Shape
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    padding: tuple[int, ...]
    kernel: tuple[int, ...]

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def padded(self) -> Shape:
        """The input extents with the padding on both sides: every tap of every output
        position lies inside."""
        return tuple(
            max(size + 2 * pad, (out - 1) * st + (kernel - 1) * dil + 1)
            for size, out, st, dil, pad, kernel in zip(self.in_sp, self.out_sp, self.stride,
                                                       self.dilation, self.padding, self.kernel,
                                                       strict=True)
        )  # fmt: skip

    @property
    def inside(self) -> bool:
        """Whether every tap of every output position lies inside the (unpadded) input."""
        return not any(self.padding) and self.padded == tuple(self.in_sp)

    @property
    def phases(self) -> Shape:
        """Per axis, the length of one stride phase of the padded input: padded position
        p = l * stride + r is phase r's element l."""
        return tuple(-(-e // st) for e, st in zip(self.padded, self.stride, strict=True))


@dataclass(frozen=True)
class Axis:
    """One spatial axis of one tap: the input and output extents, the stride, the tap's
    offset (position * dilation - padding) and the output positions [lo, hi) whose tap lies
    inside the input (i64 values of the tap loop)."""

    size: int
    out: int
    stride: int
    offset: ir.Value
    lo: ir.Value
    hi: ir.Value


def each_tap(
    k: KernelBuilder, window: Window, visit: Callable[[ir.Value, list[Axis]], None]
) -> None:
    """visit(tap number, geometry of every spatial axis) for every kernel tap in row-major
    order. The taps are a real loop nest, never unrolled here: the code (and LLVM's work on
    it) does not grow with the kernel's extent. Where the whole window lies inside the input
    the position bounds are the constants [0, out), which LLVM vectorises best."""
    b = k.b
    with k.nest(window.kernel, "tap") as position:
        geometry = []
        for size, out, st, dil, pad, pos in zip(window.in_sp, window.out_sp, window.stride,
                                                window.dilation, window.padding, position,
                                                strict=True):  # fmt: skip
            off = b.sub(b.mul(pos, k.i64(dil), flags=NSW), k.i64(pad), flags=NSW)
            if window.inside:
                lo, hi = k.i64(0), k.i64(out)
            else:
                # lo = ceil(-offset / stride) for a negative offset, else 0; hi = min(out,
                # (size - 1 - offset) // stride + 1), or 0 when the tap is past the end.
                before = b.icmp_signed("<", off, k.i64(0))
                lo = b.select(before, b.udiv(b.sub(k.i64(st - 1), off), k.i64(st)), k.i64(0))
                room = b.sub(k.i64(size - 1), off)
                last = b.add(b.udiv(room, k.i64(st)), k.i64(1))
                hi = b.select(b.icmp_signed("<", last, k.i64(out)), last, k.i64(out))
                hi = b.select(b.icmp_signed("<", room, k.i64(0)), k.i64(0), hi)
            geometry.append(Axis(size, out, st, off, lo, hi))
        visit(k.linear_index(position, strides(window.kernel)), geometry)


def tap_positions(
    k: KernelBuilder,
    geometry: list[Axis],
    in_base: ir.Value,
    out_base: ir.Value,
    body: Callable[[ir.Value, ir.Value], None],
) -> None:
    """For one kernel tap: `body(input offset, output offset)` for every output position o
    whose tap o*stride + offset lies inside the input (so padding needs no test)."""
    b = k.b
    in_steps = strides([axis.size for axis in geometry])
    out_steps = strides([axis.out for axis in geometry])

    def nest(d: int, src: ir.Value, dst: ir.Value) -> None:
        if d == len(geometry):
            body(src, dst)
            return
        axis = geometry[d]
        with k.loop(axis.hi, f"o{d}", start=axis.lo) as o:
            # No index wraps (nsw): LLVM then sees affine addresses and vectorises.
            pos = b.add(b.mul(o, k.i64(axis.stride), flags=NSW), axis.offset, flags=NSW)
            nest(
                d + 1,
                b.add(src, b.mul(pos, k.i64(in_steps[d]), flags=NSW), flags=NSW),
                b.add(dst, b.mul(o, k.i64(out_steps[d]), flags=NSW), flags=NSW),
            )

    nest(0, in_base, out_base)


Combine = Callable[[ir.Value, ir.Value], ir.Value]


def scatter_taps(
    k: KernelBuilder,
    src: Buf,
    src_base: ir.Value,
    dx: Buf,
    dx_base: ir.Value,
    geometry: list[Axis],
    combine: Combine,
) -> None:
    """Scatter one tap: dx[o*stride + offset] = combine(dx[...], src[o]) (gradients flowing
    back into a window)."""

    def body(at_dx: ir.Value, at_src: ir.Value) -> None:
        k.store(combine(k.load(dx, at_dx), k.load(src, at_src)), dx, at_dx)

    tap_positions(k, geometry, dx_base, src_base, body)


def zero(k: KernelBuilder, buf: Buf) -> None:
    with k.loop(buf.size, "z") as z:
        k.store(k.const(0), buf, z)
