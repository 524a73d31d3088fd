"""Max and average pooling (window strips over the staged plane, global pools as reductions)
and their gradients (the cotangent scattered back over each window's taps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from tlc.codegen.builder import I1, I32, Buf, KernelBuilder
from tlc.codegen.gemm import (
    lane_mask,
    load_vector,
    store_lanes,
    stride_phase,
)
from tlc.codegen.lower.convolution import ConvFrame, Fast, each_strip, row_inputs, window_strips
from tlc.codegen.lower.elementwise import maximum
from tlc.codegen.lower.rules import Step, register
from tlc.codegen.lower.windows import (
    Axis,
    Combine,
    Window,
    each_tap,
    scatter_taps,
    tap_positions,
    zero,
)
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel


@dataclass(frozen=True)
class PoolFrame:
    """A pooling's static geometry: `lead` planes of `in_plane` inputs and `out_plane` windows
    over the spatial suffix."""

    lead: int
    in_plane: int
    out_plane: int
    window: Window

    @staticmethod
    def of(node: NodeOp, x: Shape, y: Shape) -> PoolFrame:
        """`x` the pooling's input shape, `y` its output's."""
        kernel, stride, padding = node.meta("kernel"), node.meta("stride"), node.meta("padding")
        rank = len(x) - len(kernel)
        in_sp, out_sp = x[rank:], y[rank:]
        window = Window(in_sp, out_sp, tuple(stride), (1,) * len(kernel), tuple(padding),
                        tuple(kernel))  # fmt: skip
        return PoolFrame(numel(x[:rank]), numel(in_sp), numel(out_sp), window)

    def planes(self, k: KernelBuilder, lead: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The offsets of one leading index's input and output planes."""
        return k.b.mul(lead, k.i64(self.in_plane)), k.b.mul(lead, k.i64(self.out_plane))

    def conv_frame(self) -> ConvFrame:
        """The geometry as a depthwise convolution's, one plane per group: the forward
        kernels stage and read planes as that one does (`window_strips`)."""
        planes = max(self.lead, 1)  # one input plane per group, even with no planes
        return ConvFrame(1, planes, planes, planes, self.in_plane, self.out_plane, self.window)


def _pool_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """One staged input plane (padded, split into stride phases), when the window pads or
    strides."""
    return PoolFrame.of(node, parents[0], out).conv_frame().staged_plane


def _pool(k: KernelBuilder, s: Step, init: float, combine: Combine, scale: float,
          ordered: bool = False, fast: Fast | None = None) -> None:  # fmt: skip
    """Pooling, plane by plane in vector strips (`window_strips`): a padded or strided plane
    is first staged (padding filled with `init`, which never wins: -inf for max, 0 for the
    average; every input read once, split into stride phases), so each tap's inputs are
    contiguous; then out = combine over the taps from `init` (`ordered`: in row-major order,
    as consecutive blocks of taps), divided by `scale`. Global pooling (one window per
    plane) is a reduction over the plane instead. (The tap loops with strided scalar reads
    ran 3x3 stride-2 max pools at 0.57x ORT.)"""
    x, out = s.args[0], s.out
    f = PoolFrame.of(s.node, x.shape, out.shape)
    frame, b = f.conv_frame(), k.b
    lo, hi = s.part_range(k, f.lead)
    if not any(f.window.padding) and f.window.kernel == f.window.in_sp:
        if fast is None:
            _global_pool(k, f, x, out, (lo, hi), init, combine, scale)
        else:  # ordered: vmaxps, then `combine` in order where its ties or NaNs matter
            _global_pool(k, f, x, out, (lo, hi), init, fast[1], scale, exact=combine)
        return
    if frame.staged:
        assert s.scratch is not None
        staged = Buf(s.scratch.ptr, (1, frame.staged_plane))
        with k.loop(staged.size, "z") as z:
            k.store(k.const(init), staged, z)

    def finish(value: ir.Value) -> ir.Value:
        return b.fdiv(value, k.like(scale, value)) if scale != 1 else value

    with k.loop(hi, "lead", start=lo) as lead:
        x_base, out_base = f.planes(k, lead)
        plane = Buf(k.at(x, x_base), (1, f.in_plane))
        if frame.staged:
            frame.stage(k, plane, staged)
            plane = staged
        window_strips(k, frame, plane, out, out_base, k.const(init),
                      lambda acc, tap, inputs: combine(acc, inputs), finish, init,
                      combine, ordered=ordered, fast=fast)  # fmt: skip


def _global_pool(k: KernelBuilder, f: PoolFrame, x: Buf, out: Buf,
                 planes: tuple[ir.Value, ir.Value], init: float, combine: Combine,
                 scale: float, exact: Combine | None = None) -> None:  # fmt: skip
    """One window over each whole plane: combine its elements in vectors (lane j takes
    elements j, j + lanes, ...; the last vector masked, its other lanes `init`), then the
    lanes in order, divided by `scale`. With `exact` (the max pool's `maximum`, whose ties
    and NaNs depend on the order) `combine` is `vmaxps` alone, right where the plane's
    maximum is not zero and no input is NaN (a nonzero value has one bit pattern). A plane
    that held a NaN (an unordered compare per vector flags it) is folded again element by
    element in row-major order with `exact`; one whose fold is zero takes its last zero (the
    later of equal values wins), a select per element with no chain through a compare."""
    b = k.b
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    vec = ir.VectorType(k.T, lanes)
    n = f.in_plane
    whole = n - n % lanes
    fill = ir.Constant(vec, [init] * lanes)
    flags = ir.VectorType(I1, lanes)
    with k.loop(planes[1], "lead", start=planes[0]) as lead:
        x_base, out_base = f.planes(k, lead)
        acc = k.local(fill, "gacc")
        nan = k.local(ir.Constant(flags, None), "gnan")

        def fold(inputs: ir.Value) -> None:
            b.store(combine(b.load(acc), inputs), acc)
            if exact is not None:
                b.store(b.or_(b.load(nan), b.fcmp_unordered("uno", inputs, inputs)), nan)

        if whole:
            with k.loop(whole, "e", step=lanes) as e:
                fold(load_vector(k, vec, k.at(x, b.add(x_base, e)), lanes))
        if n > whole:
            tail = load_vector(k, vec, k.at(x, b.add(x_base, k.i64(whole))), n - whole)
            keep = ir.Constant(flags, [j < n - whole for j in range(lanes)])
            fold(b.select(keep, tail, fill))
        total = b.load(acc)
        value = b.extract_element(total, k.i64(0))
        for j in range(1, lanes):
            value = combine(value, b.extract_element(total, k.i64(j)))
        if exact is not None:
            held = k.local(value, "gtop")
            seen = b.bitcast(b.load(nan), ir.IntType(lanes))
            any_nan = b.icmp_unsigned("!=", seen, ir.Constant(ir.IntType(lanes), 0))
            redo = b.or_(any_nan, b.fcmp_ordered("==", value, k.const(0)))
            with b.if_then(redo, likely=False), b.if_else(any_nan) as (with_nan, zero):
                with with_nan:
                    b.store(k.const(init), held)
                    with k.loop(n, "e") as e:
                        b.store(exact(b.load(held), k.load(x, b.add(x_base, e))), held)
                with zero, k.loop(n, "e") as e:  # the fold's zero is the plane's last zero
                    v = k.load(x, b.add(x_base, e))
                    b.store(b.select(b.fcmp_ordered("==", v, k.const(0)), v, b.load(held)), held)
            value = b.load(held)
        if scale != 1:
            value = b.fdiv(value, k.const(scale))
        k.store(value, out, out_base)


def _pool_parts(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """Pooling splits into its planes (leading indices: the channels at batch 1)."""
    return PoolFrame.of(node, parents[0], out).lead


def _in_place(node: NodeOp, x: Shape) -> bool:
    """Whether a max pool reads its input planes in place (`_max_pool_rows`): 2-D windows
    but for a global one (a reduction, `_global_pool`)."""
    kernel = tuple(node.meta("kernel"))
    return len(kernel) == 2 and (any(node.meta("padding")) or kernel != tuple(x[-2:]))


def _max_pool_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return 0 if _in_place(node, parents[0]) else _pool_scratch(node, parents, out)


def _max_pool_rows(k: KernelBuilder, s: Step, larger: Combine, exact: Combine) -> None:
    """A 2-D max pool read in place, output row by output row in strips of one vector:
    each kernel row inside the input folds its taps (strip lane l of tap column kw reads
    input column (j + l) * stride + kw - padding: `stride` vectors of consecutive inputs,
    one lane in `stride` picked by a shuffle), then the rows are combined in order.
    Kernel rows in the padding are skipped, and in the strips at a row's ends the columns
    outside the input are masked to -inf: -inf is the identity of the reference's maximum on both
    sides, so this is the reference's fold over the padded window. Where a window's last
    row is the next one's first (3x3 stride 2) that row's fold is kept, per strip, for the
    window below (6 row taps per output strip instead of 9). Rows fold with `larger` (one
    `vmaxps`), flagging the lanes whose inputs are NaN; a strip with a flagged lane, or
    below one (whose kept row may hold the NaN), is folded again with `exact`
    (`maximum`) from its inputs. No staged copy: staging squeezenet1_0's planes into
    stride phases took half its max pools' time."""
    x, out, b = s.args[0], s.out, k.b
    f = PoolFrame.of(s.node, x.shape, out.shape)
    (h, w), (oh_n, ow) = f.window.in_sp, f.window.out_sp
    (sh, sw), (ph, pw), (kh_n, kw_n) = f.window.stride, f.window.padding, f.window.kernel
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    vec, wide = ir.VectorType(k.T, lanes), ir.VectorType(k.T, lanes * sw)
    floor, outside = (
        ir.Constant(vec, [-math.inf] * lanes),
        ir.Constant(wide, [-math.inf] * lanes * sw),
    )
    strips = -(-ow // lanes)
    # Strip t needs no mask when every tap's `lanes * sw` inputs lie inside its row.
    inside = [t for t in range(strips) if t * lanes * sw >= pw and (t + 1) * lanes <= ow
              and t * lanes * sw - pw + kw_n - 1 + lanes * sw <= w]  # fmt: skip
    inner = range(inside[0], inside[-1] + 1) if inside else range(0)

    carry = kh_n - sh == 1  # a window's last row is the next one's first (3x3 stride 2)
    no_nan = ir.Constant(ir.VectorType(I1, lanes), None)

    def fold_row(at_row: ir.Value, col: ir.Value, masked: bool, step: Combine,
                 flagged: ir.AllocaInstr | None) -> ir.Value:  # fmt: skip
        """One kernel row's taps for one strip (at_row: the row's offset in x), folded by
        `step`; the lanes of NaN inputs or'ed into `flagged`."""
        acc = k.local(floor, "prow")
        with k.loop(kw_n, "kw") as kw:
            start = b.add(col, kw)
            ptr = b.gep(x.ptr, [b.add(at_row, start)])  # may point before the row
            inputs = row_inputs(k, wide, ptr, start, w, masked, outside)
            if sw > 1:
                inputs = stride_phase(k, inputs, sw)
            b.store(step(b.load(acc), inputs), acc)
            if flagged is not None:
                b.store(b.or_(b.load(flagged), b.fcmp_unordered("uno", inputs, inputs)), flagged)
        return b.load(acc)

    def any_lane(flags: ir.Value) -> ir.Value:
        return b.icmp_unsigned("!=", b.bitcast(flags, ir.IntType(lanes)),
                               ir.Constant(ir.IntType(lanes), 0))  # fmt: skip

    with b.goto_block(k.alloca_block):  # per strip: the row kept, whether it follows a NaN
        kept_rows = b.alloca(ir.ArrayType(vec, strips), name="kept")
        agains = b.alloca(ir.ArrayType(I1, strips), name="again")

    def slots(t: ir.Value) -> tuple[ir.Value, ir.Value]:
        return b.gep(kept_rows, [k.i64(0), t]), b.gep(agains, [k.i64(0), t])

    def window(x_base: ir.Value, out_base: ir.Value, oh: ir.Value, t: ir.Value,
               masked: bool) -> None:  # fmt: skip
        """Strip t of output row oh; with `carry`, the window's last row (folded) is kept
        for the next window's first, and whether the window had a NaN (its last row's then
        may be among them: the next window is folded exactly too)."""
        j = b.mul(t, k.i64(lanes))
        col = b.sub(b.mul(j, k.i64(sw)), k.i64(pw))
        kept, again = slots(t)
        top = b.sub(b.mul(oh, k.i64(sh)), k.i64(ph))  # the window's first input row
        kh_lo = b.select(b.icmp_signed("<", top, k.i64(0)), b.neg(top), k.i64(0))
        room = b.sub(k.i64(h), top)
        kh_hi = b.select(b.icmp_signed("<", room, k.i64(kh_n)), room, k.i64(kh_n))
        row = b.add(x_base, b.mul(top, k.i64(w)))

        def fold(step: Combine, flagged: ir.AllocaInstr | None, first: ir.Value,
                 reuse: bool) -> ir.Value:  # fmt: skip
            total = k.local(b.load(kept) if reuse else floor, "pool")
            if reuse:
                b.store(floor, kept)
            with k.loop(kh_hi, "kh", start=first) as kh:
                value = fold_row(b.add(row, b.mul(kh, k.i64(w))), col, masked, step, flagged)
                b.store(step(b.load(total), value), total)
                if reuse:
                    last = b.icmp_signed("==", kh, k.i64(kh_n - 1))
                    b.store(b.select(last, value, floor), kept)
            return b.load(total)

        flagged = k.local(no_nan, "nan")
        if carry:
            first = b.select(b.icmp_signed("<", kh_lo, k.i64(1)), k.i64(1), kh_lo)
            value = fold(larger, flagged, first, True)
        else:
            value = fold(larger, flagged, kh_lo, False)
        held = k.local(value, "strip")
        nan = any_lane(b.load(flagged))
        with b.if_then(b.or_(nan, b.load(again)), likely=False):
            b.store(fold(exact, None, kh_lo, False), held)
        b.store(nan, again)
        mask = None
        if masked:
            mask = lane_mask(k, vec, ir.Constant(I32, 0), b.trunc(b.sub(k.i64(ow), j), I32))
        store_lanes(k, b.load(held), out, [(b.add(b.add(out_base, b.mul(oh, k.i64(ow))), j), mask)])

    lo, hi = s.part_range(k, f.lead)
    with k.loop(hi, "lead", start=lo) as lead:
        x_base, out_base = f.planes(k, lead)

        def begin(t: ir.Value, masked: bool) -> None:
            """Before output row 0: its first row kept when it is input row 0."""
            kept, again = slots(t)
            b.store(floor, kept)
            b.store(ir.Constant(I1, 0), again)
            if carry and ph == 0:
                first_nan = k.local(no_nan, "first_nan")
                col = b.sub(b.mul(t, k.i64(lanes * sw)), k.i64(pw))
                b.store(fold_row(x_base, col, masked, larger, first_nan), kept)
                b.store(any_lane(b.load(first_nan)), again)

        each_strip(k, strips, inner, "pstrip", begin)
        with k.loop(oh_n, "orow") as oh:
            each_strip(k, strips, inner, "pstrip",
                       lambda t, masked: window(x_base, out_base, oh, t, masked))  # fmt: skip


@register(ops.MaxPoolOp, parts=_pool_parts, scratch=_max_pool_scratch)
def _max_pool(k: KernelBuilder, s: Step) -> None:
    """The reference's max over each window (its `maximum` folded over the taps in row-major
    order): `maximum` over consecutive blocks of taps, combined in order. Where no input of
    a strip is NaN that is one `vmaxps` a tap (a > x ? a : x: the later of equal values, as
    the reference), so each strip folds with it first, flagging the lanes whose
    inputs are NaN (one unordered compare per pair of inputs), and a strip with a flagged
    lane is folded again exactly (`window_strips`' `fast`)."""
    b = k.b

    def larger(acc: ir.Value, x: ir.Value) -> ir.Value:  # one maxps: `maximum` without NaN
        return b.select(b.fcmp_ordered(">", acc, x), acc, x)

    if _in_place(s.node, s.args[0].shape):
        _max_pool_rows(k, s, larger, lambda acc, v: maximum(k, acc, v))
        return
    fast = (lambda acc, tap, x: larger(acc, x), larger, lambda x: b.fcmp_unordered("uno", x, x))
    _pool(k, s, -math.inf, lambda acc, v: maximum(k, acc, v), 1.0, ordered=True,
          fast=fast)  # fmt: skip


@register(ops.AvgPoolOp, parts=_pool_parts, scratch=_pool_scratch)
def _avg_pool(k: KernelBuilder, s: Step) -> None:
    _pool(k, s, 0.0, lambda acc, v: k.b.fadd(acc, v), float(math.prod(s.node.meta("kernel"))))


def _max_pool_grad_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """Per window of one plane: the best value so far and the tap that gave it."""
    return 2 * PoolFrame.of(node, parents[0], parents[1]).out_plane


@register(bw.MaxPoolGradOp, scratch=_max_pool_grad_scratch)
def _max_pool_grad(k: KernelBuilder, s: Step) -> None:
    """Each window's cotangent goes to its first maximum, exactly as in the reference: a pass
    over the taps in row-major order keeps per window the best value and its tap number
    (strictly greater wins, so ties keep the first; padding and NaN never win; tap 0 stands
    when nothing beats -inf), then a pass over the taps adds g where the tap won (0
    elsewhere), so overlapping windows accumulate in the reference's order."""
    x, g = s.args
    assert s.scratch is not None
    f = PoolFrame.of(s.node, x.shape, g.shape)
    best = Buf(s.scratch.ptr, (f.out_plane,))
    winner = Buf(k.at(s.scratch, f.out_plane), (f.out_plane,))
    origin = k.i64(0)
    zero(k, s.out)
    with k.loop(f.lead, "lead") as lead:
        x_base, g_base = f.planes(k, lead)
        with k.loop(f.out_plane, "o") as o:
            k.store(k.const(-math.inf), best, o)
            k.store(k.const(0), winner, o)

        def keep(tap: ir.Value, geometry: list[Axis]) -> None:
            j = k.b.uitofp(tap, k.T)

            def body(at_x: ir.Value, o: ir.Value) -> None:
                v, top = k.load(x, at_x), k.load(best, o)
                better = k.b.fcmp_ordered(">", v, top)
                k.store(k.b.select(better, v, top), best, o)
                k.store(k.b.select(better, j, k.load(winner, o)), winner, o)

            tap_positions(k, geometry, x_base, origin, body)

        def route(tap: ir.Value, geometry: list[Axis]) -> None:
            j = k.b.uitofp(tap, k.T)

            def body(at_x: ir.Value, o: ir.Value) -> None:
                won = k.b.fcmp_ordered("==", k.load(winner, o), j)
                share = k.b.select(won, k.load(g, k.b.add(g_base, o)), k.const(0))
                k.store(k.b.fadd(k.load(s.out, at_x), share), s.out, at_x)

            tap_positions(k, geometry, x_base, origin, body)

        each_tap(k, f.window, keep)
        each_tap(k, f.window, route)


@register(bw.AvgPoolGradOp)
def _avg_pool_grad(k: KernelBuilder, s: Step) -> None:
    """Each window position receives cotangent / prod(kernel), taps in the reference's order
    (padding counts in the divisor and receives nothing)."""
    g, out = s.args[0], s.out
    f = PoolFrame.of(s.node, out.shape, g.shape)
    size = k.const(math.prod(s.node.meta("kernel")))
    zero(k, out)
    with k.loop(f.lead, "lead") as lead:
        x_base, g_base = f.planes(k, lead)

        def spread(_: ir.Value, geometry: list[Axis]) -> None:
            scatter_taps(k, g, g_base, out, x_base, geometry,
                         lambda acc, v: k.b.fadd(acc, k.b.fdiv(v, size)))  # fmt: skip

        each_tap(k, f.window, spread)
