"""Matrix products for linear and matmul: C[m, n] = A[m, k] B[k, n] (+ bias[n]).

B is either [k, n] (matmul) or stored transposed as [n, k] (a linear layer's weight, PyTorch's
[out, in] layout). The dot products are reassociated (the llvm capsules' numerical policy) so
LLVM vectorises them.
"""

from __future__ import annotations

from tlc.codegen.builder import Buf, KernelBuilder


def emit_gemm(
    k: KernelBuilder,
    a: Buf,
    b: Buf,
    out: Buf,
    *,
    m: int,
    n: int,
    kk: int,
    b_transposed: bool,
    bias: Buf | None,
) -> None:
    bb = k.b
    if b_transposed:
        with k.loop(m, "m") as i, k.loop(n, "n") as j:
            acc = k.local(k.const(0))
            a_row, b_row = bb.mul(i, k.i64(kk)), bb.mul(j, k.i64(kk))
            with k.loop(kk, "k") as p:
                prod = k.fmul_r(k.load(a, bb.add(a_row, p)), k.load(b, bb.add(b_row, p)))
                bb.store(k.fadd_r(bb.load(acc), prod), acc)
            value = bb.load(acc)
            if bias is not None:
                value = bb.fadd(value, k.load(bias, j))
            k.store(value, out, bb.add(bb.mul(i, k.i64(n)), j))
        return
    with k.loop(m, "m") as i:
        out_row = bb.mul(i, k.i64(n))
        with k.loop(n, "n") as j:
            k.store(k.load(bias, j) if bias is not None else k.const(0), out, bb.add(out_row, j))
        with k.loop(kk, "k") as p:
            a_ip = k.load(a, bb.add(bb.mul(i, k.i64(kk)), p))
            b_row = bb.mul(p, k.i64(n))
            with k.loop(n, "n") as j:
                at = bb.add(out_row, j)
                value = bb.fadd(k.load(out, at), bb.fmul(a_ip, k.load(b, bb.add(b_row, j))))
                k.store(value, out, at)
