"""Contractions: linear layers as packed products (weights in the micro-kernel's panels,
baked at compile time), matmul of two values by broadcast tiles.
"""

from __future__ import annotations

import numpy as np

from tlc.codegen.builder import Buf, KernelBuilder
from tlc.codegen.gemm import (
    MAX_PANEL,
    MicroKernel,
    emit_broadcast_tiles,
    emit_dot_tiles,
    emit_packed_linear,
    linear_scratch,
    micro_kernel,
    pack_panels,
    pad_to,
    store_lanes,
)
from tlc.codegen.lower.elementwise import epilogue
from tlc.codegen.lower.rules import ParamSpec, Step, register
from tlc.codegen.target import TargetInfo
from tlc.dialect import ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.shapes import Shape, numel

#: Panels a linear layer's product must have for the packed broadcast kernel: with fewer,
#: packing x's rows costs about as much as the product (each row element feeds NV FMAs per
#: panel), and the dot-product tiles over W's rows are faster (a 64 x 8192 x 10 product:
#: 73 GFLOP/s against 27 on Zen 4).
MIN_PANELS = 4


def _linear_kernel(info: TargetInfo, itemsize: int, m: int, n: int, kk: int) -> MicroKernel | None:
    """The micro-kernel of the packed product for an m x kk by kk x n product, or None for
    dot tiles (also with no input features: the result is the bias)."""
    mk = micro_kernel(info, itemsize, m, n)
    return mk if -(-n // mk.nr) >= MIN_PANELS and kk > 0 else None


def _linear_params(node: NodeOp, parents: list[Shape], out: Shape) -> dict[str, ParamSpec]:
    """weight [out, in] and bias [out]; baked for the packed kernel, W^T in the
    micro-kernel's panels and the bias padded to whole panels."""
    n, kk = out[-1], parents[0][-1]
    m = numel(parents[0][:-1])

    def weight(value: np.ndarray, info: TargetInfo) -> np.ndarray:
        mk = _linear_kernel(info, value.dtype.itemsize, m, n, kk)
        return value if mk is None else pack_panels(value.T, mk.nr)

    def bias(value: np.ndarray, info: TargetInfo) -> np.ndarray:
        mk = _linear_kernel(info, value.dtype.itemsize, m, n, kk)
        return value if mk is None else pad_to(value, -(-n // mk.nr) * mk.nr)

    return {"weight": ParamSpec((n, kk), pack=weight), "bias": ParamSpec((n,), 0.0, pack=bias)}


def _linear_scratch(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """The packed rows of x of one cache block (`emit_packed_linear`)."""
    return linear_scratch(numel(parents[0][:-1]), parents[0][-1])


def _linear_parts(node: NodeOp, parents: list[Shape], out: Shape) -> int:
    """A linear layer splits into blocks of output columns (as many as the widest panels,
    MAX_PANEL columns, so any target's kernel has at least as many units as parts)."""
    return -(-out[-1] // MAX_PANEL) if parents[0][-1] > 0 else 1


@register(
    ops.LinearOp, params=_linear_params, scratch=_linear_scratch, fuses=True, parts=_linear_parts
)
def _linear(k: KernelBuilder, s: Step) -> None:
    """y[m, :] = W x[m, :] + b for every leading index m. Baked weights of a wide enough
    layer: the packed, cache-blocked broadcast kernel (`emit_packed_linear`) with the bias
    and a fused epilogue applied as it stores; otherwise (a runtime payload: row-major W,
    or few output columns): register-tiled dot products."""
    x, out = s.args[0], s.out
    n_out, n_in = out.shape[-1], x.shape[-1]
    m = numel(x.shape[:-1])  # rows: also with no input features (the result is the bias)
    share = None if s.parts == 1 else (lambda units: s.part_range(k, units))
    if s.packed and _linear_kernel(k.info, k.dtype.itemsize, m, n_out, n_in) is not None:
        assert s.scratch is not None
        emit_packed_linear(k, x, s.params["weight"], s.params["bias"], out, s.scratch, m=m,
                           n=n_out, kk=n_in, epilogue=epilogue(k, s), share=share)  # fmt: skip
        return
    lo, hi = emit_dot_tiles(k, x, s.params["weight"], out, m=m, n=n_out, kk=n_in,
                            bias=s.params["bias"], share=share)  # fmt: skip
    fn = epilogue(k, s)
    if fn is not None:  # over the columns this call computed
        with k.loop(m, "i") as i, k.loop(hi, "j", start=lo) as j:
            at = k.b.add(k.b.mul(i, k.i64(n_out)), j)
            store_lanes(k, k.load(out, at), out, [(at, None)], fn)


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
