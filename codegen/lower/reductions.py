"""Reductions along an axis (sum, mean, mse_loss) and the normalisations built on them (softmax,
log_softmax, masked softmax, layer norm, batch norm in evaluation): reassociated so they
vectorise, as the llvm capsules' numerical policy allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I8, Buf, KernelBuilder
from tlc.codegen.gemm import splat
from tlc.codegen.lower.elementwise import MAPS, epilogue
from tlc.codegen.lower.layout import split
from tlc.codegen.lower.rules import ParamSpec, Step, register
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel


def reduce_axis(k: KernelBuilder, x: Buf, out: Buf, axis: int, scale: float) -> None:
    """out = sum over `axis` (times `scale` unless 1). A contiguous axis reduces in a
    reassociated register accumulator; otherwise whole rows are added in order, vectorised
    along the row."""
    pre, n, post = split(x.shape, axis)

    def scaled(v: ir.Value) -> ir.Value:
        return v if scale == 1 else k.b.fmul(v, k.const(scale))

    with k.loop(pre, "p") as p:
        src_row = k.b.mul(p, k.i64(n * post))
        if post == 1:
            total = k.sum_over(n, lambda r: k.load(x, k.b.add(src_row, r)))
            k.store(scaled(total), out, p)
        else:
            row = k.b.mul(p, k.i64(post))
            with k.loop(post, "q") as q:
                k.store(k.const(0), out, k.b.add(row, q))
            with k.loop(n, "r") as r:
                base = k.b.add(src_row, k.b.mul(r, k.i64(post)))
                with k.loop(post, "q") as q:
                    dst = k.b.add(row, q)
                    k.store(k.b.fadd(k.load(out, dst), k.load(x, k.b.add(base, q))), out, dst)
            if scale != 1:
                with k.loop(post, "q") as q:
                    dst = k.b.add(row, q)
                    k.store(scaled(k.load(out, dst)), out, dst)


@register(ops.ReduceSumOp)
def _reduce_sum(k: KernelBuilder, s: Step) -> None:
    reduce_axis(k, s.args[0], s.out, s.node.meta("axis"), 1.0)


@register(ops.ReduceMeanOp)
def _reduce_mean(k: KernelBuilder, s: Step) -> None:
    axis = s.node.meta("axis")
    reduce_axis(k, s.args[0], s.out, axis, 1.0 / s.args[0].shape[axis])


@register(ops.SumOp)
def _sum(k: KernelBuilder, s: Step) -> None:
    x = s.args[0]
    reduce_axis(k, Buf(x.ptr, (x.size,)), s.out, 0, 1.0)


@register(ops.MseLossOp)
def _mse_loss(k: KernelBuilder, s: Step) -> None:
    a, b = s.args
    acc = k.local(k.const(0))
    with k.loop(a.size) as i:
        d = k.b.fsub(k.load(a, i), k.load(b, i))
        k.b.store(k.fadd_r(k.b.load(acc), k.b.fmul(d, d)), acc)
    # The mean over no elements is 0/0 = NaN, as in the reference.
    k.store(k.b.fdiv(k.b.load(acc), k.const(a.size)), s.out, 0)


# --------------------------------------------------------------------------------------------
# Normalisations along an axis
# --------------------------------------------------------------------------------------------


def along_axis(k: KernelBuilder, x: Buf, axis: int, body: Callable[[Callable], None]) -> None:
    """Run `body(offset)` once per line of `x` along `axis`; `offset(r)` is the flat index of
    the line's r-th element."""
    pre, n, post = split(x.shape, axis)
    with k.loop(pre, "p") as p, k.loop(post, "q") as q:
        base = k.b.add(k.b.mul(p, k.i64(n * post)), q)

        def offset(r: ir.Value) -> ir.Value:
            return k.b.add(base, k.b.mul(r, k.i64(post)))

        body(offset)


def line_max(k: KernelBuilder, x: Buf, n: int, offset: Callable) -> ir.Value:
    top = k.local(k.const(-math.inf), "top")
    with k.loop(n, "r") as r:
        k.b.store(k.intrinsic("maximum", k.b.load(top), k.load(x, offset(r))), top)
    return k.b.load(top)


@register(ops.SoftmaxOp)
def _softmax(k: KernelBuilder, s: Step) -> None:
    x, out, axis = s.args[0], s.out, s.node.meta("axis")
    n = x.shape[axis]

    def line(offset: Callable) -> None:
        top = line_max(k, x, n, offset)

        def exp_term(r: ir.Value) -> ir.Value:
            e = k.intrinsic("exp", k.b.fsub(k.load(x, offset(r)), top))
            k.store(e, out, offset(r))
            return e

        total = k.sum_over(n, exp_term)
        with k.loop(n, "r") as r:
            k.store(k.b.fdiv(k.load(out, offset(r)), total), out, offset(r))

    along_axis(k, x, axis, line)


@register(ops.LogSoftmaxOp)
def _log_softmax(k: KernelBuilder, s: Step) -> None:
    x, out, axis = s.args[0], s.out, s.node.meta("axis")
    n = x.shape[axis]

    def line(offset: Callable) -> None:
        top = line_max(k, x, n, offset)
        total = k.sum_over(n, lambda r: k.intrinsic("exp", k.b.fsub(k.load(x, offset(r)), top)))
        log_total = k.intrinsic("log", total)
        with k.loop(n, "r") as r:
            shifted = k.b.fsub(k.load(x, offset(r)), top)
            k.store(k.b.fsub(shifted, log_total), out, offset(r))

    along_axis(k, x, axis, line)


@register(ops.HardMaskedSoftmaxOp)
def _hard_masked_softmax(k: KernelBuilder, s: Step) -> None:
    """Softmax over the last axis among allowed entries (a compile-time mask); blocked entries
    and fully blocked rows give 0."""
    x, out = s.args[0], s.out
    n = x.shape[-1]
    allowed = np.array(s.node.meta("allowed"), dtype=np.int8)
    mask = k.global_constant("mask", allowed, I8)
    zero, neg_inf = k.const(0), k.const(-math.inf)

    def line(offset: Callable) -> None:
        def is_allowed(r: ir.Value) -> ir.Value:
            flag = k.b.load(k.b.gep(mask, [offset(r)], inbounds=True))
            return k.b.icmp_signed("!=", flag, ir.Constant(I8, 0))

        top = k.local(neg_inf, "top")
        with k.loop(n, "r") as r:
            v = k.b.select(is_allowed(r), k.load(x, offset(r)), neg_inf)
            k.b.store(k.intrinsic("maximum", k.b.load(top), v), top)
        top_v = k.b.load(top)
        finite = k.b.fcmp_ordered("one", k.intrinsic("fabs", top_v), k.const(math.inf))
        shift = k.b.select(finite, top_v, zero)

        def exp_term(r: ir.Value) -> ir.Value:
            e = k.intrinsic("exp", k.b.fsub(k.load(x, offset(r)), shift))
            e = k.b.select(is_allowed(r), e, zero)
            k.store(e, out, offset(r))
            return e

        total = k.sum_over(n, exp_term)
        positive = k.b.fcmp_ordered(">", total, zero)
        with k.loop(n, "r") as r:
            e = k.load(out, offset(r))
            k.store(k.b.select(positive, k.b.fdiv(e, total), zero), out, offset(r))

    along_axis(k, x, len(x.shape) - 1, line)


def _layernorm_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    suffix = parents[0][node.meta("axis") :]
    return {
        "gamma": ParamSpec(suffix, 1.0),
        "beta": ParamSpec(suffix, 0.0),
        "eps": ParamSpec((), 1e-5),
    }


@register(ops.LayernormOp, params=_layernorm_params)
def _layernorm(k: KernelBuilder, s: Step) -> None:
    """Rows of the [prod(s[:axis]), prod(s[axis:])] view: (x - mean) / sqrt(var + eps) * gamma
    + beta, with the biased variance (PyTorch's layer_norm)."""
    x, out = s.args[0], s.out
    axis = s.node.meta("axis")
    rows, n = numel(x.shape[:axis]), numel(x.shape[axis:])
    gamma, beta = s.params["gamma"], s.params["beta"]
    eps = k.load(s.params["eps"], 0)
    inv_n = k.const(1.0 / n)
    with k.loop(rows, "p") as p:
        base = k.b.mul(p, k.i64(n))
        mean = k.b.fmul(k.sum_over(n, lambda r: k.load(x, k.b.add(base, r))), inv_n)

        def centred(r: ir.Value) -> ir.Value:
            return k.b.fsub(k.load(x, k.b.add(base, r)), mean)

        var = k.b.fmul(k.sum_over(n, lambda r: k.b.fmul(centred(r), centred(r))), inv_n)
        denom = k.intrinsic("sqrt", k.b.fadd(var, eps))
        with k.loop(n, "r") as r:
            y = k.b.fmul(k.b.fdiv(centred(r), denom), k.load(gamma, r))
            k.store(k.b.fadd(y, k.load(beta, r)), out, k.b.add(base, r))


def _batch_norm_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    channels = (node.meta("channels"),)
    per_channel = {name: ParamSpec(channels) for name in ("gamma", "beta", "mean", "var")}
    return {**per_channel, "eps": ParamSpec((), 1e-5)}


def _norm_scale(k: KernelBuilder, p: dict[str, Buf], prefix: str, c: ir.Value) -> ir.Value:
    """Channel c's gamma / sqrt(var + eps) of the batch norm whose fields are `prefix` + name."""
    eps = k.load(p[f"{prefix}eps"], 0)
    var = k.b.fadd(k.load(p[f"{prefix}var"], c), eps)
    return k.b.fdiv(k.load(p[f"{prefix}gamma"], c), k.intrinsic("sqrt", var))


def _normalise(k: KernelBuilder, x: ir.Value, mean: ir.Value, scale: ir.Value,
               beta: ir.Value) -> ir.Value:  # fmt: skip
    """(x - mean) * scale + beta: a batch norm's value (scalars or vectors alike)."""
    return k.b.fadd(k.b.fmul(k.b.fsub(x, mean), scale), beta)


@register(ops.BatchNormEvalOp, params=_batch_norm_params, fuses=True)
def _batch_norm_eval(k: KernelBuilder, s: Step) -> None:
    """(x - mean) * (gamma / sqrt(var + eps)) + beta per channel, then the per-channel maps
    (`Step.maps`) and the fused epilogue, each as its own node computes it, in one pass."""
    x, out, p = s.args[0], s.out, s.params
    pre, channels, post = split(x.shape, s.node.meta("channel_axis"))
    then = epilogue(k, s)
    with k.loop(pre, "p") as i, k.loop(channels, "c") as c:
        scale = _norm_scale(k, p, "", c)
        mean, beta = k.load(p["mean"], c), k.load(p["beta"], c)
        operands = [k.load(p[f"map{j}"], c) for j in range(len(s.maps))]
        base = k.b.mul(k.b.add(k.b.mul(i, k.i64(channels)), c), k.i64(post))
        with k.loop(post, "q") as q:
            at = k.b.add(base, q)
            y = _normalise(k, k.load(x, at), mean, scale, beta)
            for node, operand in zip(s.maps, operands, strict=True):
                y = MAPS[type(node)](k, node, y, operand)
            k.store(then(y, lambda b: k.load(b, at)) if then is not None else y, out, at)


class NormStage:
    """The maps `Step.maps` of a producer that applies a batch norm and the per-channel maps
    after it as it stores (`module.norm_stores`: a convolution's), each as its own kernel
    computes it, so the bits are the unfused graph's: called as (value, channel) -> value on
    a scalar or a vector of one channel, or `apply(value, operands)` with the operands read
    once for many values: one channel's (`of`) or those of consecutive channels
    (`channels`). The batch norm's fields are params `map0.<field>`,
    map j's operand param `map{j}`; once per call, the batch norm's mean, scale gamma /
    sqrt(var + eps) and beta and the maps' operands are copied into tables on the stack,
    zero past the channels up to `padded` (whole vectors of channels read there)."""

    def __init__(self, k: KernelBuilder, s: Step, channels: int, padded: int) -> None:
        assert isinstance(s.maps[0], ops.BatchNormEvalOp)
        p, b = s.params, k.b
        self.k, self.maps = k, s.maps[1:]
        sources = ["map0.mean", "map0.beta", *(f"map{j}" for j in range(1, len(s.maps)))]
        tables = []
        with b.goto_block(k.alloca_block):
            for name in ["scale", *sources]:
                slots = b.alloca(ir.ArrayType(k.T, padded), name=f"norm_{name}")
                tables.append(Buf(b.bitcast(slots, k.T.as_pointer()), (padded,)))
        self.scale, self.mean, self.beta, *self.operands = tables
        with k.loop(channels, "c") as c:
            k.store(_norm_scale(k, p, "map0.", c), self.scale, c)
            for name, table in zip(sources, tables[1:], strict=True):
                k.store(k.load(p[name], c), table, c)
        if padded > channels:
            with k.loop(padded, "c", start=channels) as c:
                for table in tables:
                    k.store(k.const(0), table, c)

    @property
    def tables(self) -> list[Buf]:
        """mean, scale, beta and the maps' operands: what `apply` takes, in that order."""
        return [self.mean, self.scale, self.beta, *self.operands]

    def apply(self, value: ir.Value, operands: list[ir.Value]) -> ir.Value:
        """`value` through the batch norm and the maps, with `operands` read from `tables`
        (each of value's type: `of` reads one channel's once for all of its vectors)."""
        mean, scale, beta, *rest = operands
        y = _normalise(self.k, value, mean, scale, beta)
        for node, operand in zip(self.maps, rest, strict=True):
            y = MAPS[type(node)](self.k, node, y, operand)
        return y

    def of(self, channel: ir.Value, kind: ir.Type) -> list[ir.Value]:
        """Channel `channel`'s operands for `apply` on values of type `kind` (a scalar or a
        vector of one channel, splat)."""
        values = [self.k.load(table, channel) for table in self.tables]
        if isinstance(kind, ir.VectorType):
            return [splat(self.k, kind, x) for x in values]
        return values

    def __call__(self, value: ir.Value, channel: ir.Value) -> ir.Value:
        return self.apply(value, self.of(channel, value.type))

    def channels(self, first: ir.Value, kind: ir.VectorType) -> list[ir.Value]:
        """The operands for `apply` on vectors of type `kind` of the consecutive channels
        from `first` (the tables are padded to whole vectors)."""
        b, align = self.k.b, self.k.dtype.itemsize
        return [b.load(b.bitcast(self.k.at(table, first), kind.as_pointer()), align=align)
                for table in self.tables]  # fmt: skip


def norm_stage(k: KernelBuilder, s: Step, channels: int, padded: int = 0) -> NormStage | None:
    """The `NormStage` of `s.maps` over `channels` output channels (its tables `padded` long
    when longer), its tables filled here; None: no maps."""
    return NormStage(k, s, channels, max(channels, padded)) if s.maps else None
