"""Sources, views and elementwise maps: the graph input, constants and reshapes as views; every
pointwise op as a map over the flat buffers (`MAPS`, fused into producers' stores through
`EPILOGUES`); raw log with its domain check.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from tlc.codegen.builder import I1, Buf, KernelBuilder, Status
from tlc.codegen.gemm import Epilogue, store_lanes
from tlc.codegen.lower.rules import Fused, ParamSpec, Step, register
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel
from tlc.semantics.reference import uniform_draws


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
#: The scalar function of each `elementwise` op kind: the map kernels that take their length
#: as an argument (`tlc.codegen.module`) apply it.
MAPS: dict[type[NodeOp], Scalar] = {}


def elementwise(op_class: type[NodeOp], fn: Scalar) -> None:
    """`out[i] = fn(k, node, a[i], b[i], ...)` over the flat buffers; a scalar parent (safe_log's
    epsilon) is read once and broadcast."""
    IN_PLACE.add(op_class)
    MAPS[op_class] = fn

    def emit(k: KernelBuilder, s: Step) -> None:
        inputs = s.inputs
        scalars = {j: k.load(a, 0) for j, a in enumerate(inputs) if a.size == 1 < s.out.size}
        lo, hi = _element_range(k, s)
        then = epilogue(k, s)
        with k.loop(hi, start=lo) as i:
            xs = [scalars[j] if j in scalars else k.load(a, i) for j, a in enumerate(inputs)]
            store_lanes(k, fn(k, s.node, *xs), s.out, [(i, None)], then)

    # A relu after a map (an unfused residual add's) is applied in the same pass (`Step.fused`).
    register(op_class, parts=_element_parts, fuses=True)(emit)


#: Elements of a flat map's unit of parallel work (whole vectors of any target).
ELEMENT_BLOCK = 64


def _element_parts(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    return max(numel(out) // ELEMENT_BLOCK, 1)


def _element_range(k: KernelBuilder, s: Step) -> tuple[ir.Value | int, ir.Value | int]:
    """The flat elements [lo, hi) this call of a map computes (`Step.part`)."""
    if s.parts == 1:
        return 0, s.out.size
    lo, hi = s.part_range(k, _element_parts(s.node, [], s.out.shape))
    b, block = k.b, k.i64(ELEMENT_BLOCK)
    top = b.mul(hi, block)
    last = b.icmp_signed("==", hi, k.i64(_element_parts(s.node, [], s.out.shape)))
    return b.mul(lo, block), b.select(last, k.i64(s.out.size), top)


def maximum(k: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """The reference's max(a, b) (`tlc.dialect.minmax.maximum`), bit for bit, on scalars or
    vectors: a where a is NaN or a > b, else b (of equal values, -0.0 and +0.0 too, the
    second; of NaNs the first). `vmaxps` (a > b ? a : b) and a select of a where a is NaN.
    (`llvm.maximum` orders -0.0 below +0.0 and picks a NaN of its own.)"""
    bld = k.b
    return bld.select(bld.or_(bld.fcmp_unordered("uno", a, a), bld.fcmp_ordered(">", a, b)), a, b)


def minimum(k: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """The reference's min(a, b): a where a is NaN or a < b, else b (`maximum`'s rule)."""
    bld = k.b
    return bld.select(bld.or_(bld.fcmp_unordered("uno", a, a), bld.fcmp_ordered("<", a, b)), a, b)


def at_least(k: KernelBuilder, x: ir.Value, bound: float) -> ir.Value:
    """`maximum(x, bound)` for a constant bound: x where x is NaN or above it (x ugt bound:
    one compare, `vcmpnleps`), else the bound; a NaN bound needs the general form."""
    c = k.like(bound, x)
    if math.isnan(bound):
        return maximum(k, x, c)
    return k.b.select(k.b.fcmp_unordered(">", x, c), x, c)


def at_most(k: KernelBuilder, x: ir.Value, bound: float) -> ir.Value:
    """`minimum(x, bound)` for a constant bound: x where x is NaN or below it (x ult bound),
    else the bound; a NaN bound needs the general form."""
    c = k.like(bound, x)
    if math.isnan(bound):
        return minimum(k, x, c)
    return k.b.select(k.b.fcmp_unordered("<", x, c), x, c)


def _relu(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """max(x, 0): x where x is NaN or above 0, else +0.0 (so relu(-0.0) is +0.0): a compare
    and a masked move (llvm.maximum took three instructions)."""
    return at_least(k, x, 0.0)


def _clip(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """min(max(x, min), max) in one pass, the reference's `maximum` and `minimum` (NaN
    stays; a result equal to a bound is the bound, so clip {max = 0} of -0.0 is +0.0; an
    absent bound is infinite). Its decomposition materialised both bounds as full tensors:
    relu6 was a quarter of mobilenet_v2's time."""
    return at_most(k, at_least(k, x, node.meta("min")), node.meta("max"))


def _hard_sigmoid(k: KernelBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    """min(max(alpha x + beta, 0), 1): the reference's operations in its order (alpha and
    beta rounded to the dtype; `maximum` and `minimum`)."""
    t = k.b.fadd(k.b.fmul(x, k.like(alpha, x)), k.like(beta, x))
    return at_most(k, at_least(k, t, 0.0), 1.0)


def _prelu(k: KernelBuilder, node: NodeOp, x: ir.Value, slope: ir.Value) -> ir.Value:
    """The reference's select, slope x where x <= 0, else x (a NaN x itself): one compare (x
    ugt 0) and a select. Its decomposition, relu(x) + slope min(x, 0), which the intervals
    keep for its tighter boxes, gives +0.0 where slope x is -0.0."""
    return k.b.select(k.b.fcmp_unordered(">", x, k.like(0, x)), x, k.b.fmul(x, slope))


def _hardsigmoid(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """In one pass: its decomposition materialised beta, 0 and 1 as full tensors, and each
    of its four maps passed over memory (mobilenet_v3_small's hardswishes, which ran through
    it, were a third of its call)."""
    return _hard_sigmoid(k, x, node.meta("alpha"), node.meta("beta"))


def _hardswish(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """x hardsigmoid(x) {alpha = 1/6, beta = 1/2}, in one pass."""
    return k.b.fmul(x, _hard_sigmoid(k, x, 1 / 6, 0.5))


def _sigmoid(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """The reference's stable form: e = exp(-|x|); x >= 0 ? 1/(1+e) : e/(1+e)."""
    e = k.intrinsic("exp", k.b.fneg(k.intrinsic("fabs", x)))
    denom = k.b.fadd(k.const(1), e)
    positive = k.b.fcmp_ordered(">=", x, k.const(0))
    return k.b.fdiv(k.b.select(positive, k.const(1), e), denom)


def _softplus(k: KernelBuilder, node: NodeOp, x: ir.Value) -> ir.Value:
    """max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|."""
    tail = k.libm("log1p", k.intrinsic("exp", k.b.fneg(k.intrinsic("fabs", x))))
    return k.b.fadd(at_least(k, x, 0.0), tail)


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
    """-1, +0.0 or 1; a NaN x stays (`tlc.dialect.minmax.sign`: -0.0 gives +0.0)."""
    b = k.b
    zero = b.select(b.fcmp_unordered("uno", x, x), x, k.const(0))
    negative = b.select(b.fcmp_ordered("<", x, k.const(0)), k.const(-1), zero)
    return b.select(b.fcmp_ordered(">", x, k.const(0)), k.const(1), negative)


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
    (ops.MaxElemOp, lambda k, n, a, b: maximum(k, a, b)),
    (ops.MinElemOp, lambda k, n, a, b: minimum(k, a, b)),
    (ops.ClipOp, _clip),
    (ops.AbsOp, lambda k, n, x: k.intrinsic("fabs", x)),
    (ops.SqrtOp, lambda k, n, x: k.intrinsic("sqrt", x)),
    (ops.ReluOp, _relu),
    (ops.PreluOp, _prelu),
    (ops.TanhOp, lambda k, n, x: k.libm("tanh", x)),
    (ops.SigmoidOp, _sigmoid),
    (ops.HardSigmoidOp, _hardsigmoid),
    (ops.HardSwishOp, _hardswish),
    (ops.SoftplusOp, _softplus),
    (ops.ExpOp, lambda k, n, x: k.intrinsic("exp", x)),
    (ops.InvOp, lambda k, n, x: k.b.fdiv(k.const(1), x)),
    (ops.DivOp, lambda k, n, a, b: k.b.fdiv(a, b)),
    (
        ops.LessOp,
        lambda k, n, a, b: k.b.select(k.b.fcmp_ordered("<", a, b), k.const(1), k.const(0)),
    ),
    (ops.WhereOp, lambda k, n, c, a, b: k.b.select(k.b.fcmp_unordered("!=", c, k.const(0)), a, b)),
    (ops.PowOp, lambda k, n, x: k.intrinsic("pow", x, k.const(n.meta("exponent")))),
    (ops.PowElemOp, lambda k, n, a, b: k.intrinsic("pow", a, b)),
    (ops.SinOp, lambda k, n, x: k.intrinsic("sin", x)),
    (ops.CosOp, lambda k, n, x: k.intrinsic("cos", x)),
    (ops.GeluOp, _gelu),
    (ops.ErfOp, lambda k, n, x: k.libm("erf", x)),
    (ops.TruncOp, lambda k, n, x: k.intrinsic("trunc", x)),
    (ops.SafeLogOp, lambda k, n, x, eps: k.intrinsic("log", k.b.fadd(_softplus(k, n, x), eps))),
    (bw.SignOp, _sign),
    (bw.GeluGradOp, _gelu_grad),
):
    elementwise(_op, _fn)


#: Elementwise ops a producer with `Lowering.fuses` applies as it stores (their rules work on
#: scalars and vectors alike): the node becomes a view of its producer's value. Binary ones
#: read their other operand where the value is stored (the residual add's shortcut).
EPILOGUES: dict[type[NodeOp], Scalar] = {
    ops.ReluOp: _relu,
    ops.ClipOp: _clip,
    ops.HardSwishOp: _hardswish,
    ops.AddOp: MAPS[ops.AddOp],
}


def fused_epilogue(k: KernelBuilder, fused: Fused | None, operands: list[Buf]) -> Epilogue | None:
    """The map the chain `fused` applies, for `k`'s code, its binary nodes' other operands
    in `operands` (`Fused.operands`' buffers); None when nothing is fused. Each node is its
    unfused map, on the value its producer would have stored: the same operations in the
    same order, so the fused and unfused results are the same bits."""
    if fused is None:
        return None
    chain = fused

    def apply(value: ir.Value, operand: Callable[[Buf], ir.Value]) -> ir.Value:
        others = iter(operands)
        for node, slot in zip(chain.nodes, chain.slots, strict=True):
            xs = [operand(next(others)) for _ in range(len(node.parent_ids()) - 1)]
            xs.insert(slot, value)
            value = EPILOGUES[type(node)](k, node, *xs)
        return value

    return apply


def epilogue(k: KernelBuilder, s: Step) -> Epilogue | None:
    """The map `s.fused` applies, for `k`'s code (None when nothing is fused)."""
    return fused_epilogue(k, s.fused, s.args[len(s.inputs) :])


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
