"""Layout ops, where every output element is one input element: permutes, transposes, pads,
broadcasts, concatenations and gathers, all through one strided `gather`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I64, Buf, KernelBuilder, strides
from tlc.codegen.lower.rules import Step, register
from tlc.dialect import ops
from tlc.dialect.shapes import Shape, numel


def split(shape: Shape, axis: int) -> tuple[int, int, int]:
    """(pre, n, post): the shape viewed as [prod(before axis), extent, prod(after axis)]."""
    return numel(shape[:axis]), shape[axis], numel(shape[axis + 1 :])


def gather(k: KernelBuilder, src: Buf, out: Buf, steps: list[int], base: int = 0) -> None:
    """out[idx] = src[base + sum(idx * steps)] over out's shape."""
    with k.nest(out.shape) as idx:
        offset = k.b.add(k.i64(base), k.linear_index(idx, steps))
        k.store(k.load(src, offset), out, k.linear_index(idx, strides(out.shape)))


def _permuted(k: KernelBuilder, s: Step, perm: list[int]) -> None:
    src = strides(s.args[0].shape)
    gather(k, s.args[0], s.out, [src[p] for p in perm])


@register(ops.PermuteOp)
def _permute(k: KernelBuilder, s: Step) -> None:
    _permuted(k, s, list(s.node.meta("perm")))


@register(ops.TransposeOp)
def _transpose(k: KernelBuilder, s: Step) -> None:
    perm = list(range(len(s.out.shape)))
    a, b = s.node.meta("axis1"), s.node.meta("axis2")
    perm[a], perm[b] = perm[b], perm[a]
    _permuted(k, s, perm)


@register(ops.PadOp)
def _pad(k: KernelBuilder, s: Step) -> None:
    """out[i] = x[source(i)] per axis: i - before, clamped (edge), mirrored (reflect), or the
    value where a constant pad has no source (its index clamped so the load stays inside)."""
    node, src = s.node, s.args[0].shape
    before, mode = node.meta("before"), node.meta("mode")
    b = k.b
    with k.nest(s.out.shape) as idx:
        inside: ir.Value | None = None
        sources = []
        for i, n, lo in zip(idx, src, before, strict=True):
            j = b.sub(i, k.i64(lo)) if lo else i
            below, above = b.icmp_signed("<", j, k.i64(0)), b.icmp_signed(">", j, k.i64(n - 1))
            if mode == "reflect":
                j = b.select(below, b.neg(j), j)
                j = b.select(b.icmp_signed(">", j, k.i64(n - 1)), b.sub(k.i64(2 * (n - 1)), j), j)
            else:
                if mode == "constant":
                    ok = b.not_(b.or_(below, above))
                    inside = ok if inside is None else b.and_(inside, ok)
                j = b.select(above, k.i64(n - 1), b.select(below, k.i64(0), j))
            sources.append(j)
        value = k.load(s.args[0], k.linear_index(sources, strides(src)))
        if inside is not None:
            value = b.select(inside, value, k.const(node.meta("value")))
        k.store(value, s.out, k.linear_index(idx, strides(s.out.shape)))


@register(ops.BroadcastToOp)
def _broadcast_to(k: KernelBuilder, s: Step) -> None:
    """Trailing alignment; extent-1 and missing source axes get step 0."""
    src = s.args[0].shape
    pad = len(s.out.shape) - len(src)
    src_steps = strides(src)
    steps = [0] * pad + [0 if n == 1 else st for n, st in zip(src, src_steps, strict=True)]
    gather(k, s.args[0], s.out, steps)


#: A concatenated part whose rows (its extents from the axis on) are at least this many
#: elements is copied a row at a time (`copy_run`); shorter rows element by element.
COPY_RUN = 16


@register(ops.ConcatOp)
def _concat(k: KernelBuilder, s: Step) -> None:
    """Each part is copied into its slab of the output along `axis`: viewed as [pre, row], a
    part's row i (its extents from `axis` on, contiguous) lands at row i of the output's
    [pre, out_row] view, offset by the extents of the parts before it. A long row is one
    memcpy (a channel concatenation of one image is one copy per part); LLVM's work on it
    does not grow with the part's rank or extents."""
    axis = s.node.meta("axis")
    out_steps = strides(s.out.shape)
    pre, out_row = numel(s.out.shape[:axis]), numel(s.out.shape[axis:])
    start = 0
    for part in s.args:
        row = numel(part.shape[axis:])
        offset = start * out_steps[axis]
        start += part.shape[axis]
        if row == 0 or pre == 0:
            continue
        if row >= COPY_RUN:
            with k.loop(pre, "p") as p:
                src = k.b.mul(p, k.i64(row))
                dst = k.b.add(k.b.mul(p, k.i64(out_row)), k.i64(offset))
                k.copy_run(s.out, dst, part, src, row)
            continue
        window = Buf(s.out.ptr, part.shape)
        with k.nest(part.shape) as idx:
            dst = k.b.add(k.i64(offset), k.linear_index(idx, out_steps))
            k.store(k.load(part, k.linear_index(idx, strides(part.shape))), window, dst)


@register(ops.GatherOp)
def _gather(k: KernelBuilder, s: Step) -> None:
    """Viewed as [pre, n, post] -> [pre, len(indices), post]: row j of each block is row
    indices[j] of the input block, copied whole; the indices are a constant table."""
    x, indices = s.args[0], s.node.meta("indices")
    pre, n, post = split(x.shape, s.node.meta("axis"))
    count = len(indices)
    if not count or not post or not pre:
        return
    table = k.global_constant("indices", np.asarray(indices, dtype=np.int64), I64)
    with k.loop(pre, "p") as p, k.loop(count, "j") as j:
        row = k.b.load(k.b.gep(table, [j]))
        src = k.b.mul(k.b.add(k.b.mul(p, k.i64(n)), row), k.i64(post))
        dst = k.b.mul(k.b.add(k.b.mul(p, k.i64(count)), j), k.i64(post))
        if post == 1:
            k.store(k.load(x, src), s.out, dst)
        else:
            k.copy_run(s.out, dst, x, src, post)
