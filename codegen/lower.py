"""tl -> LLVM IR: one lowering rule per op kind, in one rule table.

`LOWERINGS[OpClass]` is a `Lowering`: `emit(k, step)` writes the node's value into `step.out`
(or, for a view, returns the buffer it aliases), and `params` names the payload fields the node
reads with their shapes and defaults, so a library built with `--runtime-payload` knows its
parameter layout without the values. Rules are written here for the ops that need code of their
own; an op without one that states a decomposition (`NodeOp.decompose`, such as leaky_relu's
`max_elem(x, s*x)`) is lowered through it: its node's kernel runs the lowerings of the ops the
decomposition emits, in order, on scratch storage (`decomposition_lowering`). Ops the table
refuses (`LOWERINGS.unsupported`) are a located error naming the op and the node when compiled,
never a fallback.

Semantics follow the reference rules (`tlc.semantics.reference`) operation for operation.
Reductions (sum, mean, dot products, softmax denominators) are reassociated so they vectorise:
the llvm capsules' numerical policy is "implementationDefined". Elementwise maps run over the
flat buffer; layout ops compute a source offset per output index; convolution and pooling loop
over the kernel's taps (never unrolled by the lowering, so the code's size does not depend on
the kernel's extent), each tap's loop over output positions bounded so padding needs no test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from xdsl.ir import Block

from tlc.codegen.builder import I1, I8, I32, Buf, KernelBuilder, Status, strides
from tlc.codegen.gemm import emit_broadcast_tiles, emit_dot_tiles
from tlc.core.diagnostics import error
from tlc.core.payload import Payload
from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.emitter import GraphEmitter
from tlc.semantics.reference import uniform_draws


@dataclass(frozen=True)
class ParamSpec:
    """A payload field a node reads: its shape, and its value when the record leaves it out
    (None: required)."""

    shape: Shape
    default: float | None = None


@dataclass
class Step:
    """One node being lowered: its parents' buffers, its payload fields, its destination."""

    node: NodeOp
    args: list[Buf]
    params: dict[str, Buf]
    out: Buf
    #: Temporary storage of `Lowering.scratch` elements (None when the lowering needs none).
    scratch: Buf | None = None


Emit = Callable[[KernelBuilder, Step], "Buf | None"]
ParamLayout = Callable[[NodeOp, list[Shape], Shape], dict[str, ParamSpec]]
ScratchSize = Callable[[NodeOp, list[Shape], Shape], int]


def _none(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    return {}


def _no_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return 0


@dataclass(frozen=True)
class Lowering:
    emit: Emit
    #: The value aliases a parent, a parameter or a constant: no storage, nothing computed.
    view: bool = False
    params: ParamLayout = _none
    #: Elements of temporary storage the emitted code needs (convolution's patch matrix).
    scratch: ScratchSize = _no_scratch

    @property
    def uses_scratch(self) -> bool:
        """Whether the rule reads `Step.scratch` (then it gets a buffer even of size 0)."""
        return self.scratch is not _no_scratch


LOWERINGS: RuleTable[Lowering] = RuleTable("llvm")


def register(
    *op_classes: type[NodeOp],
    view: bool = False,
    params: ParamLayout = _none,
    scratch: ScratchSize = _no_scratch,
):
    """Decorator: `emit` lowers each of `op_classes`."""

    def add(emit: Emit) -> Emit:
        LOWERINGS.register(*op_classes)(Lowering(emit, view, params, scratch))
        return emit

    return add


# --------------------------------------------------------------------------------------------
# Sources and views
# --------------------------------------------------------------------------------------------


@register(ops.InputOp, view=True)
def _input(k: KernelBuilder, s: Step) -> Buf:
    """The graph input: the module builder passes the caller's buffer as the only argument."""
    return s.args[0]


@register(
    ops.ConstOp, view=True, params=lambda node, parents, out: {"value": ParamSpec((numel(out),))}
)
def _const(k: KernelBuilder, s: Step) -> Buf:
    return Buf(s.params["value"].ptr, s.out.shape)


@register(ops.DetachOp, ops.ReshapeOp, ops.FlattenOp, view=True)
def _same_elements(k: KernelBuilder, s: Step) -> Buf:
    """Row-major reshapes and detach move no data: the node aliases its parent."""
    return Buf(s.args[0].ptr, s.out.shape)


@register(ops.RandUniformOp, view=True)
def _rand_uniform(k: KernelBuilder, s: Step) -> Buf:
    """The seeded draws are known at compile time: a constant table of the reference's stream."""
    draws = uniform_draws(s.node.meta("seed"), s.out.shape, k.dtype.type)
    return Buf(k.global_constant("draws", draws), s.out.shape)


@register(ops.BernoulliMaskOp)
def _bernoulli(k: KernelBuilder, s: Step) -> None:
    draws = Buf(
        k.global_constant("draws", uniform_draws(s.node.meta("seed"), s.out.shape, k.dtype.type)),
        s.out.shape,
    )
    keep = k.load(s.args[0], 0)
    with k.loop(s.out.size) as i:
        kept = k.b.fcmp_ordered("<", k.load(draws, i), keep)
        k.store(k.b.select(kept, k.const(1), k.const(0)), s.out, i)


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------

Scalar = Callable[..., ir.Value]

#: Op kinds whose kernel is a map over the flat buffers (`elementwise`, raw log): element i of
#: the output is stored after element i of every input is loaded, so the output may overwrite
#: an input that dies at the node (the memory plan's in-place rule).
IN_PLACE: set[type[NodeOp]] = set()


def elementwise(op_class: type[NodeOp], fn: Scalar) -> None:
    """`out[i] = fn(k, node, a[i], b[i], ...)` over the flat buffers; a scalar parent (safe_log's
    epsilon) is read once and broadcast."""
    IN_PLACE.add(op_class)

    def emit(k: KernelBuilder, s: Step) -> None:
        scalars = {j: k.load(a, 0) for j, a in enumerate(s.args) if a.size == 1 < s.out.size}
        with k.loop(s.out.size) as i:
            xs = [scalars[j] if j in scalars else k.load(a, i) for j, a in enumerate(s.args)]
            k.store(fn(k, s.node, *xs), s.out, i)

    register(op_class)(emit)


def _relu(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """max(x, 0), NaN propagating like numpy's maximum."""
    return k.intrinsic("maximum", x, k.const(0))


def _sigmoid(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """The reference's stable form: e = exp(-|x|); x >= 0 ? 1/(1+e) : e/(1+e)."""
    e = k.intrinsic("exp", k.b.fneg(k.intrinsic("fabs", x)))
    denom = k.b.fadd(k.const(1), e)
    positive = k.b.fcmp_ordered(">=", x, k.const(0))
    return k.b.fdiv(k.b.select(positive, k.const(1), e), denom)


def _softplus(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|."""
    tail = k.libm("log1p", k.intrinsic("exp", k.b.fneg(k.intrinsic("fabs", x))))
    return k.b.fadd(k.intrinsic("maximum", x, k.const(0)), tail)


def _gelu(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """x/2 (1 + erf(x/sqrt 2)), or PyTorch's tanh approximation."""
    b = k.b
    if node.meta("approximate") == "tanh":
        cube = b.fmul(b.fmul(x, x), x)
        inner = b.fmul(k.const(math.sqrt(2 / math.pi)), b.fadd(x, b.fmul(k.const(0.044715), cube)))
        core = k.libm("tanh", inner)
    else:
        core = k.libm("erf", b.fmul(x, k.const(1 / math.sqrt(2))))
    return b.fmul(b.fmul(k.const(0.5), x), b.fadd(k.const(1), core))


def _sign(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """-1, 0 or 1 (NaN stays NaN, like numpy's sign)."""
    negative = k.b.select(k.b.fcmp_ordered("<", x, k.const(0)), k.const(-1), x)
    return k.b.select(k.b.fcmp_ordered(">", x, k.const(0)), k.const(1), negative)


def _gelu_grad(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """d gelu / dx: Phi(x) + x phi(x), or the derivative of the tanh form."""
    b = k.b
    if node.meta("approximate") == "tanh":
        c = math.sqrt(2 / math.pi)
        xx = b.fmul(x, x)
        u = b.fmul(k.const(c), b.fadd(x, b.fmul(b.fmul(k.const(0.044715), xx), x)))
        t = k.libm("tanh", u)
        du = b.fmul(k.const(c), b.fadd(k.const(1), b.fmul(k.const(3 * 0.044715), xx)))
        slope = b.fmul(b.fmul(b.fmul(k.const(0.5), x), b.fsub(k.const(1), b.fmul(t, t))), du)
        return b.fadd(b.fmul(k.const(0.5), b.fadd(k.const(1), t)), slope)
    cdf = b.fmul(k.const(0.5), b.fadd(k.const(1), k.libm("erf", b.fdiv(x, k.const(math.sqrt(2))))))
    pdf = b.fdiv(
        k.intrinsic("exp", b.fmul(b.fmul(k.const(-0.5), x), x)), k.const(math.sqrt(2 * math.pi))
    )
    return b.fadd(cdf, b.fmul(x, pdf))


for _op, _fn in (
    (ops.AddOp, lambda k, n, a, b: k.b.fadd(a, b)),
    (ops.SubOp, lambda k, n, a, b: k.b.fsub(a, b)),
    (ops.MulElemOp, lambda k, n, a, b: k.b.fmul(a, b)),
    (ops.MaxElemOp, lambda k, n, a, b: k.intrinsic("maximum", a, b)),
    (ops.MinElemOp, lambda k, n, a, b: k.intrinsic("minimum", a, b)),
    (ops.AbsOp, lambda k, n, x: k.intrinsic("fabs", x)),
    (ops.SqrtOp, lambda k, n, x: k.intrinsic("sqrt", x)),
    (ops.ReluOp, _relu),
    (ops.TanhOp, lambda k, n, x: k.libm("tanh", x)),
    (ops.SigmoidOp, _sigmoid),
    (ops.SoftplusOp, _softplus),
    (ops.ExpOp, lambda k, n, x: k.intrinsic("exp", x)),
    (ops.InvOp, lambda k, n, x: k.b.fdiv(k.const(1), x)),
    (ops.SinOp, lambda k, n, x: k.intrinsic("sin", x)),
    (ops.CosOp, lambda k, n, x: k.intrinsic("cos", x)),
    (ops.GeluOp, _gelu),
    (ops.ErfOp, lambda k, n, x: k.libm("erf", x)),
    (ops.SafeLogOp, lambda k, n, x, eps: k.intrinsic("log", k.b.fadd(_softplus(k, n, x), eps))),
    (bw.SignOp, _sign),
    (bw.GeluGradOp, _gelu_grad),
):
    elementwise(_op, _fn)


@register(ops.LogOp)
def _log(k: KernelBuilder, s: Step) -> None:
    """Raw log fails like the reference: status LOG_DOMAIN if any input is <= 0 or NaN."""
    bad = k.local(ir.Constant(I1, 0), "bad")
    with k.loop(s.out.size) as i:
        x = k.load(s.args[0], i)
        k.b.store(k.b.or_(k.b.load(bad), k.b.fcmp_unordered("<=", x, k.const(0))), bad)
        k.store(k.intrinsic("log", x), s.out, i)
    k.fail_if(k.b.load(bad), Status.LOG_DOMAIN)


IN_PLACE.add(ops.LogOp)


# --------------------------------------------------------------------------------------------
# Layout: every output element is one input element
# --------------------------------------------------------------------------------------------


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


@register(ops.BroadcastToOp)
def _broadcast_to(k: KernelBuilder, s: Step) -> None:
    """Trailing alignment; extent-1 and missing source axes get step 0."""
    src = s.args[0].shape
    pad = len(s.out.shape) - len(src)
    src_steps = strides(src)
    steps = [0] * pad + [0 if n == 1 else st for n, st in zip(src, src_steps, strict=True)]
    gather(k, s.args[0], s.out, steps)


@register(ops.ConcatOp)
def _concat(k: KernelBuilder, s: Step) -> None:
    """Each part is copied into its slab of the output along `axis`."""
    axis = s.node.meta("axis")
    out_steps = strides(s.out.shape)
    start = 0
    for part in s.args:
        window = Buf(s.out.ptr, part.shape)
        with k.nest(part.shape) as idx:
            dst = k.b.add(k.i64(start * out_steps[axis]), k.linear_index(idx, out_steps))
            k.store(k.load(part, k.linear_index(idx, strides(part.shape))), window, dst)
        start += part.shape[axis]


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------


def split(shape: Shape, axis: int) -> tuple[int, int, int]:
    """(pre, n, post): the shape viewed as [prod(before axis), extent, prod(after axis)]."""
    return numel(shape[:axis]), shape[axis], numel(shape[axis + 1 :])


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


@register(ops.BatchNormEvalOp, params=_batch_norm_params)
def _batch_norm_eval(k: KernelBuilder, s: Step) -> None:
    """(x - mean) * (gamma / sqrt(var + eps)) + beta per channel."""
    x, out, p = s.args[0], s.out, s.params
    pre, channels, post = split(x.shape, s.node.meta("channel_axis"))
    eps = k.load(p["eps"], 0)
    with k.loop(pre, "p") as i, k.loop(channels, "c") as c:
        scale = k.b.fdiv(
            k.load(p["gamma"], c), k.intrinsic("sqrt", k.b.fadd(k.load(p["var"], c), eps))
        )
        mean, beta = k.load(p["mean"], c), k.load(p["beta"], c)
        base = k.b.mul(k.b.add(k.b.mul(i, k.i64(channels)), c), k.i64(post))
        with k.loop(post, "q") as q:
            at = k.b.add(base, q)
            y = k.b.fadd(k.b.fmul(k.b.fsub(k.load(x, at), mean), scale), beta)
            k.store(y, out, at)


# --------------------------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------------------------


def _linear_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    return {"weight": ParamSpec((out[-1], parents[0][-1])), "bias": ParamSpec((out[-1],), 0.0)}


@register(ops.LinearOp, params=_linear_params)
def _linear(k: KernelBuilder, s: Step) -> None:
    """y[m, :] = W x[m, :] + b for every leading index m: register-tiled dot products."""
    x, out, weight = s.args[0], s.out, s.params["weight"]
    n_out, n_in = weight.shape
    m = numel(x.shape[:-1])  # rows: also with no input features (the result is the bias)
    emit_dot_tiles(k, x, weight, out, m=m, n=n_out, kk=n_in, bias=s.params["bias"])


@register(ops.MatmulOp)
def _matmul(k: KernelBuilder, s: Step) -> None:
    """(..., m, n) x (..., n, p): one product per leading index."""
    (a, b), out = s.args, s.out
    (*lead, m, n), p = a.shape, b.shape[-1]
    with k.loop(numel(lead), "batch") as t:

        def part(buf: Buf, rows: int, cols: int) -> Buf:
            return Buf(k.at(buf, k.b.mul(t, k.i64(rows * cols))), (rows, cols))

        emit_broadcast_tiles(k, part(a, m, n), part(b, n, p), part(out, m, p), m=m, n=p, kk=n)


#: Integer flags of index arithmetic that cannot overflow (offsets into static buffers).
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


def window_taps(
    k: KernelBuilder,
    x: Buf,
    x_base: ir.Value,
    out: Buf,
    out_base: ir.Value,
    geometry: list[Axis],
    combine: Combine,
) -> None:
    """Gather one tap: out[o] = combine(out[o], x[o*stride + offset]) (forward windows)."""

    def body(at_x: ir.Value, at_out: ir.Value) -> None:
        k.store(combine(k.load(out, at_out), k.load(x, at_x)), out, at_out)

    tap_positions(k, geometry, x_base, out_base, body)


def scatter_taps(
    k: KernelBuilder,
    src: Buf,
    src_base: ir.Value,
    dx: Buf,
    dx_base: ir.Value,
    geometry: list[Axis],
    combine: Combine,
) -> None:
    """Scatter one tap, the adjoint of `window_taps`: dx[o*stride + offset] =
    combine(dx[...], src[o]) (gradients flowing back into the window)."""

    def body(at_dx: ir.Value, at_src: ir.Value) -> None:
        k.store(combine(k.load(dx, at_dx), k.load(src, at_src)), dx, at_dx)

    tap_positions(k, geometry, dx_base, src_base, body)


def zero(k: KernelBuilder, buf: Buf) -> None:
    with k.loop(buf.size, "z") as z:
        k.store(k.const(0), buf, z)


# --------------------------------------------------------------------------------------------
# Convolution and its gradients: per leading index and group, a patch matrix
# --------------------------------------------------------------------------------------------


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
    def staged_plane(self) -> int:
        """Elements of one input plane's staged copy: the zero-padded plane split into its
        stride phases (as many elements as the padded plane, rounded up to whole strides)."""
        w = self.window
        return numel(w.stride) * numel(w.phases) if self.staged else 0

    def stage(self, k: KernelBuilder, x_block: Buf, staged: Buf) -> None:
        """Copy the input planes into their zeroed staged copies: input position i goes to
        padded position p = i + padding, phase p % stride, element p // stride. Leading axes
        loop over input rows; along the last axis the elements whose every phase is inside
        the input are a loop of constant bounds reading `stride` consecutive inputs per step
        (a contiguous copy, or a de-interleave LLVM vectorises with shuffles), the few at the
        edges are emitted one by one."""
        w, b = self.window, k.b
        phase_block = [step * numel(w.phases) for step in strides(w.stride)]
        element_steps = strides(w.phases)
        size, st, pad, length = w.in_sp[-1], w.stride[-1], w.padding[-1], w.phases[-1]
        with k.loop(self.cin_g, "ic") as ic, k.nest(w.in_sp[:-1], "row") as rows:
            dst = b.mul(ic, k.i64(self.staged_plane), flags=NSW)
            for i, pad_d, st_d, block, step in zip(rows, w.padding, w.stride, phase_block,
                                                   element_steps, strict=False):  # fmt: skip
                p = b.add(i, k.i64(pad_d), flags=NSW)
                dst = b.add(dst, b.mul(b.urem(p, k.i64(st_d)), k.i64(block)), flags=NSW)
                dst = b.add(dst, b.mul(b.udiv(p, k.i64(st_d)), k.i64(step)), flags=NSW)
            src = b.add(b.mul(ic, k.i64(self.in_plane), flags=NSW),
                        k.linear_index(rows, strides(w.in_sp)[:-1]), flags=NSW)  # fmt: skip
            # Element e of every phase r reads input e * st + r - pad: all inside for e in
            # [first, end).
            first = -(-pad // st)
            end = max(first, min(length, (size - st + pad) // st + 1))
            if st == 1 and end > first:
                k.copy_run(staged, b.add(dst, k.i64(first)), x_block,
                           b.add(src, k.i64(first - pad)), end - first)  # fmt: skip
            elif end > first:
                # A vector of lanes * st consecutive inputs per step, de-interleaved into one
                # vector per phase by shuffles (LLVM leaves the strided scalar loop scalar).
                lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
                wide, vec = ir.VectorType(k.T, lanes * st), ir.VectorType(k.T, lanes)
                whole = first + (end - first) // lanes * lanes
                with k.loop(whole, "e", start=first, step=lanes) as e:
                    at = b.add(src, b.sub(b.mul(e, k.i64(st), flags=NSW), k.i64(pad)), flags=NSW)
                    ptr = b.bitcast(k.at(x_block, at), wide.as_pointer())
                    inputs = b.load(ptr, align=k.dtype.itemsize)
                    for r in range(st):
                        mask = ir.Constant(ir.VectorType(I32, lanes),
                                           [r + st * j for j in range(lanes)])  # fmt: skip
                        phase = b.shuffle_vector(inputs, ir.Constant(wide, ir.Undefined), mask)
                        to = b.add(b.add(dst, k.i64(r * phase_block[-1]), flags=NSW), e)
                        b.store(phase, b.bitcast(k.at(staged, to), vec.as_pointer()),
                                align=k.dtype.itemsize)  # fmt: skip
                with k.loop(end, "e", start=whole) as e:
                    at = b.add(src, b.sub(b.mul(e, k.i64(st), flags=NSW), k.i64(pad)), flags=NSW)
                    for r in range(st):
                        to = b.add(dst, k.i64(r * phase_block[-1]), flags=NSW)
                        value = k.load(x_block, b.add(at, k.i64(r), flags=NSW))
                        k.store(value, staged, b.add(to, e, flags=NSW))
            for edge in [*range(min(first, length)), *range(end, length)]:
                for r in range(st):
                    if 0 <= edge * st + r - pad < size:
                        value = k.load(x_block, b.add(src, k.i64(edge * st + r - pad)))
                        k.store(value, staged, b.add(dst, k.i64(r * phase_block[-1] + edge)))

    def im2col(self, k: KernelBuilder, x_block: Buf, patches: Buf, staging: ir.Value) -> None:
        """Gather the shifted input planes into the patch matrix.

        With padding or a stride, the input planes are first staged at `staging` ([cin/groups,
        staged_plane]): zero-padded and split into stride phases, so that each tap reads one
        phase contiguously: padded position o * stride + offset is phase (offset % stride)'s
        element o + offset // stride. Every tap's loops then have constant bounds, no test,
        and unit stride, which LLVM vectorises; the strided reads happen once per input
        element instead of once per tap."""
        w, b = self.window, k.b
        source, plane = x_block, self.in_plane
        if self.staged:
            source, plane = Buf(staging, (self.cin_g, self.staged_plane)), self.staged_plane
            zero(k, source)
            self.stage(k, x_block, source)
        extents = w.phases if self.staged else w.in_sp
        in_steps, out_steps = strides(extents), strides(w.out_sp)
        with k.loop(self.cin_g, "ic") as ic, k.nest(w.kernel, "tap") as position:
            src = b.mul(ic, k.i64(plane), flags=NSW)
            phase = []
            for pos, st, dil, step in zip(position, w.stride, w.dilation, in_steps, strict=True):
                off = b.mul(pos, k.i64(dil), flags=NSW)
                phase.append(b.urem(off, k.i64(st)))
                src = b.add(src, b.mul(b.udiv(off, k.i64(st)), k.i64(step)), flags=NSW)
            at = b.mul(k.linear_index(phase, strides(w.stride)), k.i64(numel(extents)))
            src = b.add(src, at, flags=NSW)
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


def _conv_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    m = node.metadata()
    cout = m["out_channels"]
    weight = (cout, m["in_channels"] // m["groups"], *m["kernel"])
    return {"weight": ParamSpec(weight), "bias": ParamSpec((cout,), 0.0)}


def _conv_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """The patch matrix of one group and, with padding or a stride, its staged input planes."""
    f = ConvFrame.of(node, parents[0], out)
    return f.depth * f.positions + f.cin_g * f.staged_plane


@register(ops.ConvOp, params=_conv_params, scratch=_conv_scratch)
def _conv(k: KernelBuilder, s: Step) -> None:
    """Convolution as a matrix product (im2col): for each leading index and group, gather the
    patch matrix, then out[oc, :] = W[oc, :] patches + bias[oc] with the register-tiled
    broadcast kernel."""
    x, out, w, bias = s.args[0], s.out, s.params["weight"], s.params["bias"]
    assert s.scratch is not None
    f = ConvFrame.of(s.node, x.shape, out.shape)
    patches = Buf(s.scratch.ptr, (f.depth, f.positions))
    staging = k.at(s.scratch, f.depth * f.positions)
    with k.loop(f.lead, "lead") as lead, k.loop(f.groups, "g") as g:
        f.im2col(k, f.input_block(k, x, lead, g), patches, staging)
        w_g = Buf(k.at(w, k.b.mul(g, k.i64(f.cout_g * f.depth))), (f.cout_g, f.depth))
        bias_g = Buf(k.at(bias, k.b.mul(g, k.i64(f.cout_g))), (f.cout_g,))
        emit_broadcast_tiles(k, w_g, patches, f.output_block(k, out, lead, g),
                             m=f.cout_g, n=f.positions, kk=f.depth, row_bias=bias_g)  # fmt: skip


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


# --------------------------------------------------------------------------------------------
# Pooling and its gradients: over the spatial suffix, leading axes kept
# --------------------------------------------------------------------------------------------


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


def _pool(k: KernelBuilder, s: Step, init: float, combine: Combine, scale: float) -> None:
    """Pooling: init the output, fold every in-bounds tap into it (padding never
    contributes: -inf for max, 0 for the average), then scale."""
    x, out = s.args[0], s.out
    f = PoolFrame.of(s.node, x.shape, out.shape)
    with k.loop(f.lead, "lead") as lead:
        x_base, out_base = f.planes(k, lead)
        with k.loop(f.out_plane, "o") as o:
            k.store(k.const(init), out, k.b.add(out_base, o))

        def fold(_: ir.Value, geometry: list[Axis]) -> None:
            window_taps(k, x, x_base, out, out_base, geometry, combine)

        each_tap(k, f.window, fold)
        if scale != 1:
            with k.loop(f.out_plane, "o") as o:
                at = k.b.add(out_base, o)
                k.store(k.b.fdiv(k.load(out, at), k.const(scale)), out, at)


@register(ops.MaxPoolOp)
def _max_pool(k: KernelBuilder, s: Step) -> None:
    _pool(k, s, -math.inf, lambda acc, v: k.intrinsic("maximum", acc, v), 1.0)


@register(ops.AvgPoolOp)
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


# --------------------------------------------------------------------------------------------
# Ops defined by a decomposition
# --------------------------------------------------------------------------------------------


#: A region of a node's scratch: (offset in elements, shape).
Slot = tuple[int, Shape]


@dataclass(frozen=True)
class Decomposition:
    """A node's decomposition on its parents' shapes: `parts` are the emitted nodes, whose
    parent ids count the node's parents first (ids 0..n-1) then the parts; `result` is the
    id holding the node's value; `payload` the parts' records (constants)."""

    parts: tuple[NodeOp, ...]
    result: int
    payload: Payload

    @staticmethod
    def of(node: NodeOp, parents: list[Shape]) -> Decomposition:
        block = Block([ops.InputOp(i, [], shape) for i, shape in enumerate(parents)])
        payload = Payload()
        result = node.decompose(GraphEmitter(block, payload), *block.ops)
        parts = tuple(op for op in block.ops if isinstance(op, NodeOp))[len(parents) :]
        return Decomposition(parts, result.id, payload)

    def lowering(self, node: NodeOp, part: NodeOp) -> Lowering:
        cls = type(part)
        reason = LOWERINGS.unsupported.get(cls, None if cls in LOWERINGS else "no lowering")
        if reason is not None:
            raise error(
                f"codegen: cannot compile {node.TAG} node {node.id}: its decomposition uses "
                f"{part.TAG}: {reason}",
                node,
            )
        return LOWERINGS[cls]

    def layout(self, node: NodeOp, parents: list[Shape]) -> tuple[dict[int, Slot], int]:
        """Where the parts live in the node's scratch: the value of each part that computes
        into memory (but the result's, which goes to the node's output) under its id, its own
        scratch under -1 - id; with the total size."""
        shapes = [*parents, *(part.require_declared() for part in self.parts)]
        slots: dict[int, Slot] = {}
        total = 0

        def take(key: int, shape: Shape) -> None:
            nonlocal total
            slots[key] = (total, shape)
            total += numel(shape)

        for part in self.parts:
            lowering = self.lowering(node, part)
            if not lowering.view and part.id != self.result:
                take(part.id, shapes[part.id])
            extra = lowering.scratch(part, [shapes[p] for p in part.parent_ids()], shapes[part.id])
            if extra:
                take(-1 - part.id, (extra,))
        return slots, total


def _decomposition_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return Decomposition.of(node, parents).layout(node, parents)[1]


def _decomposed(k: KernelBuilder, s: Step) -> None:
    """Lower each part of the node's decomposition in order: intermediate values and the
    parts' own scratch live in the node's scratch, the result is written to the output, and
    the parts' payload fields (the decomposition's constants) are baked in."""
    d = Decomposition.of(s.node, [a.shape for a in s.args])
    slots, _ = d.layout(s.node, [a.shape for a in s.args])

    def scratch(key: int) -> Buf | None:
        if key not in slots:
            return None
        assert s.scratch is not None
        offset, shape = slots[key]
        return Buf(k.at(s.scratch, offset), shape)

    values = list(s.args)
    for part in d.parts:
        lowering = d.lowering(s.node, part)
        args = [values[p] for p in part.parent_ids()]
        shape = part.require_declared()
        record = d.payload.get(part.id) or {}
        params = {}
        for name, spec in lowering.params(part, [a.shape for a in args], shape).items():
            assert name in record or spec.default is not None, "emitted parts carry their payload"
            value = record[name] if name in record else np.full(spec.shape, spec.default)
            constant = np.asarray(value, dtype=k.dtype).reshape(spec.shape)
            params[name] = Buf(k.global_constant(f"{part.TAG}.{name}", constant), spec.shape)
        # A view's rule returns the buffer it aliases and writes nothing to `out`.
        out = s.out if part.id == d.result else scratch(part.id) or Buf(s.out.ptr, shape)
        value = lowering.emit(k, Step(part, args, params, out, scratch(-1 - part.id)))
        values.append(value if lowering.view else out)
    if values[d.result].ptr is not s.out.ptr:
        k.copy(s.out, values[d.result])


def decomposition_lowering(op_class: type[NodeOp]) -> Lowering | None:
    """The rule of an op without a lowering of its own that states a decomposition."""
    if not op_class.defines("decompose"):
        return None
    return Lowering(_decomposed, scratch=_decomposition_scratch)


LOWERINGS.derive(NODE_OPS, decomposition_lowering)
