"""Matrix products for linear and matmul: C[m, n] = A[m, k] B[k, n] (+ bias[n]).

A linear layer's weight is stored transposed, [n, k] (PyTorch's [out, in]): every output is a
dot product of two contiguous rows. `emit_dot_tiles` computes C in register tiles of MR rows of
A by NR rows of W: MR*NR vector accumulators run along k one vector at a time, each loaded
vector feeding MR or NR fused multiply-adds, and are reduced horizontally at the end. A's rows
are taken in blocks of ROW_BLOCK that stay in L2; within a block the tiles walk W (outer) and
A's rows (inner), so NR weight rows stay in L1. The reduction order (vector lanes, then a tree)
is reassociated: the llvm capsules' numerical policy is implementationDefined. Tile shapes and
the vector width come from the target (`KernelBuilder.info`), never from the build machine.

With B stored [k, n] (matmul, convolution's patch matrix) `emit_broadcast_tiles` is the classic
micro-kernel instead: one element of A broadcast against vectors of a row of B.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tlc.codegen.builder import REASSOC, Buf, KernelBuilder

#: Rows of A per cache block: the block (64 x k) stays in L2 while W's tiles pass over it.
ROW_BLOCK = 64


@dataclass(frozen=True)
class Tiles:
    """Register tiles for a target. Dot tiles: MR rows of A by NR rows of W, MR*NR vector
    accumulators plus MR+NR loaded vectors. Broadcast tiles: MR_B rows of A by NV vectors of
    B's columns, MR_B*NV accumulators plus NV loads and one broadcast."""

    mr: int
    nr: int
    mr_b: int
    nv: int


#: 32 vector registers (AVX-512, NEON): 4x4 dot tiles (24 live), 6x2 broadcast tiles.
#: 16 (SSE, AVX2): 3x3 dot tiles (15 live) so nothing spills; 6x2 broadcast (15 live).
TILES = {32: Tiles(4, 4, 6, 2), 16: Tiles(3, 3, 6, 2)}


def tiles_for(k: KernelBuilder) -> tuple[Tiles, ir.VectorType]:
    """The register tiles and vector type the target of `k` calls for."""
    lanes = max(k.info.vector_bytes // k.dtype.itemsize, 1)
    return TILES[32 if k.info.vector_registers >= 32 else 16], ir.VectorType(k.T, lanes)


def emit_dot_tiles(
    k: KernelBuilder, a: Buf, w: Buf, out: Buf, *, m: int, n: int, kk: int, bias: Buf | None
) -> None:
    """out[i, j] = sum_p a[i, p] * w[j, p] (+ bias[j]) for i < m, j < n."""
    tiles, vec = tiles_for(k)
    MR, NR = tiles.mr, tiles.nr
    n_main, m_main = n - n % NR, m - m % MR
    for j_lo, j_hi, nr in ((0, n_main, NR), (n_main, n, n % NR)):
        if j_hi <= j_lo:
            continue
        if m_main:
            with k.loop(m_main, "ib", step=ROW_BLOCK) as ib:
                next_block = k.b.add(ib, k.i64(ROW_BLOCK))
                fits = k.b.icmp_signed("<", next_block, k.i64(m_main))
                end = k.b.select(fits, next_block, k.i64(m_main))
                with (
                    k.loop(j_hi, "j", start=j_lo, step=nr) as j0,
                    k.loop(end, "i", start=ib, step=MR) as i0,
                ):
                    _tile(k, vec, a, w, out, i0, j0, MR, nr, kk, n, bias)
        if m_main < m:
            with k.loop(j_hi, "j", start=j_lo, step=nr) as j0:
                _tile(k, vec, a, w, out, k.i64(m_main), j0, m - m_main, nr, kk, n, bias)


def _tile(
    k: KernelBuilder,
    vec: ir.VectorType,
    a: Buf,
    w: Buf,
    out: Buf,
    i0: ir.Value,
    j0: ir.Value,
    mr: int,
    nr: int,
    kk: int,
    n: int,
    bias: Buf | None,
) -> None:
    b = k.b
    lanes = vec.count
    rows_a = [b.mul(b.add(i0, k.i64(r)), k.i64(kk)) for r in range(mr)]
    rows_w = [b.mul(b.add(j0, k.i64(c)), k.i64(kk)) for c in range(nr)]
    acc = [[k.local(ir.Constant(vec, [0.0] * lanes), "vacc") for _ in range(nr)] for _ in range(mr)]
    fma = _fma(k, vec)
    vptr = vec.as_pointer()
    with k.loop(kk // lanes, "kv") as kv:
        p = b.mul(kv, k.i64(lanes))
        xs = [b.load(b.bitcast(k.at(a, b.add(row, p)), vptr), align=k.dtype.itemsize)
              for row in rows_a]  # fmt: skip
        ws = [b.load(b.bitcast(k.at(w, b.add(row, p)), vptr), align=k.dtype.itemsize)
              for row in rows_w]  # fmt: skip
        for r in range(mr):
            for c in range(nr):
                b.store(b.call(fma, [xs[r], ws[c], b.load(acc[r][c])]), acc[r][c])
    reduce = _reduce(k, vec)
    tail = kk - kk % lanes
    for r in range(mr):
        for c in range(nr):
            total = b.call(reduce, [k.const(0), b.load(acc[r][c])], fastmath=REASSOC)
            for p in range(tail, kk):
                x = k.load(a, b.add(rows_a[r], k.i64(p)))
                total = k.fadd_r(total, k.fmul_r(x, k.load(w, b.add(rows_w[c], k.i64(p)))))
            j = b.add(j0, k.i64(c))
            if bias is not None:
                total = b.fadd(total, k.load(bias, j))
            k.store(total, out, b.add(b.mul(b.add(i0, k.i64(r)), k.i64(n)), j))


def _fma(k: KernelBuilder, vec: ir.VectorType) -> ir.Function:
    """Multiply-add that fuses where the target has FMA (AVX2, AVX-512, NEON) and is a multiply
    and an add elsewhere: `llvm.fma` would become a libm call per element on x86-64-v2."""
    name = f"llvm.fmuladd.v{vec.count}{'f32' if k.dtype.itemsize == 4 else 'f64'}"
    func = k.module.globals.get(name)
    return func or ir.Function(k.module, ir.FunctionType(vec, [vec, vec, vec]), name)


def _reduce(k: KernelBuilder, vec: ir.VectorType) -> ir.Function:
    name = f"llvm.vector.reduce.fadd.v{vec.count}{'f32' if k.dtype.itemsize == 4 else 'f64'}"
    func = k.module.globals.get(name)
    return func or ir.Function(k.module, ir.FunctionType(k.T, [k.T, vec]), name)


def emit_broadcast_tiles(
    k: KernelBuilder,
    a: Buf,
    b_mat: Buf,
    out: Buf,
    *,
    m: int,
    n: int,
    kk: int,
    row_bias: Buf | None = None,
) -> None:
    """out[i, j] = sum_p a[i, p] * b[p, j] (+ row_bias[i]), B row-major [k, n].

    Register tiles of MR_B rows by NV vectors of columns: each step along k broadcasts one
    element of A per row and loads NV vectors of B's row, feeding MR_B * NV FMAs into
    accumulators that stay in registers. Columns past the last whole tile are done one by one.
    """
    tiles, vec = tiles_for(k)
    MR_B, lanes = tiles.mr_b, vec.count
    width = tiles.nv * lanes
    n_main, m_main = n - n % width, m - m % MR_B
    if n_main:
        with k.loop(n_main, "j", step=width) as j0:
            for i_lo, i_hi, mr in ((0, m_main, MR_B), (m_main, m, m % MR_B)):
                if i_hi > i_lo:
                    with k.loop(i_hi, "i", start=i_lo, step=mr) as i0:
                        _broadcast_tile(k, vec, a, b_mat, out, i0, j0, mr, tiles.nv, n, kk,
                                        row_bias)  # fmt: skip
    if n_main < n:
        with k.loop(m, "i") as i, k.loop(n, "j", start=n_main) as j:
            row = k.b.mul(i, k.i64(kk))
            total = k.sum_over(
                kk,
                lambda p: k.fmul_r(
                    k.load(a, k.b.add(row, p)), k.load(b_mat, k.b.add(k.b.mul(p, k.i64(n)), j))
                ),
            )
            if row_bias is not None:
                total = k.b.fadd(total, k.load(row_bias, i))
            k.store(total, out, k.b.add(k.b.mul(i, k.i64(n)), j))


def _broadcast_tile(
    k: KernelBuilder,
    vec: ir.VectorType,
    a: Buf,
    b_mat: Buf,
    out: Buf,
    i0: ir.Value,
    j0: ir.Value,
    mr: int,
    nv: int,
    n: int,
    kk: int,
    row_bias: Buf | None,
) -> None:
    b = k.b
    lanes = vec.count
    zero = ir.Constant(vec, [0.0] * lanes)
    acc = [[k.local(zero, "vacc") for _ in range(nv)] for _ in range(mr)]
    rows_a = [b.mul(b.add(i0, k.i64(r)), k.i64(kk)) for r in range(mr)]
    fma, vptr = _fma(k, vec), vec.as_pointer()
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)

    def splat(x: ir.Value) -> ir.Value:
        one = b.insert_element(ir.Constant(vec, ir.Undefined), x, k.i64(0))
        return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined), splat_mask)

    with k.loop(kk, "p") as p:
        row_b = b.add(b.mul(p, k.i64(n)), j0)
        bs = [
            b.load(b.bitcast(k.at(b_mat, b.add(row_b, k.i64(v * lanes))), vptr),
                   align=k.dtype.itemsize)
            for v in range(nv)
        ]  # fmt: skip
        for r in range(mr):
            x = splat(k.load(a, b.add(rows_a[r], p)))
            for v in range(nv):
                b.store(b.call(fma, [x, bs[v], b.load(acc[r][v])]), acc[r][v])
    for r in range(mr):
        row = b.add(b.mul(b.add(i0, k.i64(r)), k.i64(n)), j0)
        shift = splat(k.load(row_bias, b.add(i0, k.i64(r)))) if row_bias is not None else None
        for v in range(nv):
            value = b.load(acc[r][v])
            if shift is not None:
                value = b.fadd(value, shift)
            ptr = b.bitcast(k.at(out, b.add(row, k.i64(v * lanes))), vptr)
            b.store(value, ptr, align=k.dtype.itemsize)
