"""tl -> LLVM IR: one lowering rule per op kind, in one table.

`LOWERINGS[OpClass]` is a `Lowering`: `emit(k, step)` writes the node's value into `step.out`
(or, for a view, returns the buffer it aliases), and `params` names the payload fields the node
reads with their shapes and defaults, so a library built with `--runtime-payload` knows its
parameter layout without the values. `UNSUPPORTED` lists the ops with no lowering and why; the
two tables together cover `NODE_OPS` (tests check it), and compiling an unsupported op is a
located error naming the op and the node, never a fallback.

Semantics follow the reference rules (`tlc.passes.reference_ops`) operation for operation.
Reductions (sum, mean, dot products, softmax denominators) are reassociated so they vectorise:
the llvm capsules' numerical policy is "implementationDefined". Elementwise maps run over the
flat buffer; layout ops compute a source offset per output index; convolution and pooling unroll
the kernel window at compile time so every inner loop has constant bounds and no padding tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tlc.codegen.builder import I1, I8, Buf, KernelBuilder, Status, strides
from tlc.codegen.gemm import emit_broadcast_tiles, emit_dot_tiles
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel
from tlc.passes.reference_ops import uniform_draws


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


LOWERINGS: dict[type[NodeOp], Lowering] = {}

UNSUPPORTED: dict[type[NodeOp], str] = {}


def register(
    *op_classes: type[NodeOp],
    view: bool = False,
    params: ParamLayout = _none,
    scratch: ScratchSize = _no_scratch,
):
    """Decorator: `emit` lowers each of `op_classes`."""

    def add(emit: Emit) -> Emit:
        for cls in op_classes:
            assert cls not in LOWERINGS, f"two lowerings for {cls.__name__}"
            LOWERINGS[cls] = Lowering(emit, view, params, scratch)
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


def elementwise(op_class: type[NodeOp], fn: Scalar) -> None:
    """`out[i] = fn(k, node, a[i], b[i], ...)` over the flat buffers; a scalar parent (safe_log's
    epsilon) is read once and broadcast."""

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
    k.store(k.b.fdiv(k.b.load(acc), k.const(max(a.size, 1))), s.out, 0)


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
    m = x.size // n_in
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


def window_range(size: int, out: int, stride: int, offset: int) -> tuple[int, int]:
    """The output positions o in [0, out) whose tap o*stride + offset lies inside [0, size)."""
    lo = max(0, -(offset // stride))  # ceil(-offset / stride)
    hi = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return lo, max(lo, hi)


#: One spatial axis of a window: (input extent, output extent, stride, tap offset).
Axis = tuple[int, int, int, int]


def window_taps(
    k: KernelBuilder,
    x: Buf,
    x_base: ir.Value,
    out: Buf,
    out_base: ir.Value,
    geometry: list[Axis],
    combine: Callable[[ir.Value, ir.Value], ir.Value],
) -> None:
    """For one kernel tap: out[o] = combine(out[o], x[o*stride + offset]) over the output
    positions where the tap falls inside the input; the bounds are compile-time constants, so
    padding needs no test."""
    in_steps = strides([g[0] for g in geometry])
    out_steps = strides([g[1] for g in geometry])
    ranges = [window_range(*g) for g in geometry]
    if any(lo >= hi for lo, hi in ranges):
        return

    def nest(axis: int, src: ir.Value, dst: ir.Value) -> None:
        if axis == len(geometry):
            k.store(combine(k.load(out, dst), k.load(x, src)), out, dst)
            return
        _, _, st, off = geometry[axis]
        lo, hi = ranges[axis]
        with k.loop(hi, f"o{axis}", start=lo) as o:
            pos = k.b.add(k.b.mul(o, k.i64(st)), k.i64(off))
            nest(
                axis + 1,
                k.b.add(src, k.b.mul(pos, k.i64(in_steps[axis]))),
                k.b.add(dst, k.b.mul(o, k.i64(out_steps[axis]))),
            )

    nest(0, x_base, out_base)


def kernel_positions(kernel: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in pos) for pos in np.ndindex(*kernel)]


def _conv_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    m = node.metadata()
    cout = m["out_channels"]
    weight = (cout, m["in_channels"] // m["groups"], *m["kernel"])
    return {"weight": ParamSpec(weight), "bias": ParamSpec((cout,), 0.0)}


def _conv_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """The patch matrix of one group: [in_channels/groups * taps, output positions]."""
    m = node.metadata()
    taps = numel(m["kernel"])
    return numel(out[m["channel_axis"] + 1 :]) * (m["in_channels"] // m["groups"]) * taps


@register(ops.ConvOp, params=_conv_params, scratch=_conv_scratch)
def _conv(k: KernelBuilder, s: Step) -> None:
    """Convolution as a matrix product (im2col): for each leading index and group, gather the
    shifted input planes into a [cin/groups * taps, positions] patch matrix (zero where a tap
    falls in the padding; the bounds are compile-time, so there are no tests), then
    out[oc, :] = W[oc, :] patches + bias[oc] with the register-tiled broadcast kernel."""
    m = s.node.metadata()
    x, out, w, bias = s.args[0], s.out, s.params["weight"], s.params["bias"]
    assert s.scratch is not None
    axis, groups, kernel = m["channel_axis"], m["groups"], tuple(m["kernel"])
    cin, cout = m["in_channels"], m["out_channels"]
    cin_g, cout_g = cin // groups, cout // groups
    in_sp, out_sp = x.shape[axis + 1 :], out.shape[axis + 1 :]
    in_plane, positions, taps = numel(in_sp), numel(out_sp), numel(kernel)
    depth = cin_g * taps
    patches = s.scratch
    dil, st, pad = m["dilation"], m["stride"], m["padding"]
    with k.loop(numel(x.shape[:axis]), "lead") as lead, k.loop(groups, "g") as g:
        with k.loop(positions * depth, "z") as z:
            k.store(k.const(0), patches, z)
        first = k.b.add(k.b.mul(lead, k.i64(cin)), k.b.mul(g, k.i64(cin_g)))
        with k.loop(cin_g, "ic") as ic:
            x_base = k.b.mul(k.b.add(first, ic), k.i64(in_plane))
            for t, pos in enumerate(kernel_positions(kernel)):
                geometry = [
                    (in_sp[d], out_sp[d], st[d], pos[d] * dil[d] - pad[d])
                    for d in range(len(kernel))
                ]
                row = k.b.mul(k.b.add(k.b.mul(ic, k.i64(taps)), k.i64(t)), k.i64(positions))
                window_taps(k, x, x_base, patches, row, geometry, lambda acc, v: v)
        oc0 = k.b.add(k.b.mul(lead, k.i64(cout)), k.b.mul(g, k.i64(cout_g)))
        out_g = Buf(k.at(out, k.b.mul(oc0, k.i64(positions))), (cout_g, positions))
        w_g = Buf(k.at(w, k.b.mul(g, k.i64(cout_g * depth))), (cout_g, depth))
        bias_g = Buf(k.at(bias, k.b.mul(g, k.i64(cout_g))), (cout_g,))
        emit_broadcast_tiles(k, w_g, Buf(patches.ptr, (depth, positions)), out_g,
                             m=cout_g, n=positions, kk=depth, row_bias=bias_g)  # fmt: skip


def _pool(k: KernelBuilder, s: Step, init: float, combine: Callable, scale: float) -> None:
    """Pooling over the spatial suffix: init the output, fold every in-bounds tap into it
    (padding never contributes: -inf for max, 0 for the average), then scale."""
    kernel, stride, padding = s.node.meta("kernel"), s.node.meta("stride"), s.node.meta("padding")
    x, out = s.args[0], s.out
    lead_rank = len(x.shape) - len(kernel)
    in_sp, out_sp = x.shape[lead_rank:], out.shape[lead_rank:]
    in_plane, out_plane = numel(in_sp), numel(out_sp)
    with k.loop(numel(x.shape[:lead_rank]), "lead") as lead:
        out_base, x_base = k.b.mul(lead, k.i64(out_plane)), k.b.mul(lead, k.i64(in_plane))
        with k.loop(out_plane, "o") as o:
            k.store(k.const(init), out, k.b.add(out_base, o))
        for pos in kernel_positions(tuple(kernel)):
            geometry = [
                (in_sp[d], out_sp[d], stride[d], pos[d] - padding[d]) for d in range(len(kernel))
            ]
            window_taps(k, x, x_base, out, out_base, geometry, combine)
        if scale != 1:
            with k.loop(out_plane, "o") as o:
                at = k.b.add(out_base, o)
                k.store(k.b.fdiv(k.load(out, at), k.const(scale)), out, at)


@register(ops.MaxPoolOp)
def _max_pool(k: KernelBuilder, s: Step) -> None:
    _pool(k, s, -math.inf, lambda acc, v: k.intrinsic("maximum", acc, v), 1.0)


@register(ops.AvgPoolOp)
def _avg_pool(k: KernelBuilder, s: Step) -> None:
    _pool(k, s, 0.0, lambda acc, v: k.b.fadd(acc, v), float(math.prod(s.node.meta("kernel"))))


_GRADIENT_ONLY = (
    "a gradient-graph op (tlc.dialect.backward_ops) with no LLVM lowering yet; run gradient "
    "graphs with the reference backend"
)
for _op in (
    bw.MaxPoolGradOp,
    bw.AvgPoolGradOp,
    bw.ConvInputGradOp,
    bw.ConvWeightGradOp,
):
    UNSUPPORTED[_op] = _GRADIENT_ONLY


def missing_ops() -> list[type[NodeOp]]:
    """Ops in neither table (the exhaustiveness test expects none)."""
    return [op for op in ops.NODE_OPS if op not in LOWERINGS and op not in UNSUPPORTED]
