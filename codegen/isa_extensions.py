"""The x86-64 extensions beyond its psABI level a named CPU's code may use, and the probes
that tell them.

LLVM has no API listing the features a CPU name implies (`sapphirerapids` implies AVX512-FP16,
`znver4` SSE4A), yet a library built for the name may execute them, so `target_info` reads
them off LLVM's own code: each probe is a tiny function in plain LLVM IR that instruction
selection turns into the extension's instructions when, and only when, the target has it.
Only extensions instruction selection picks from generic IR are probed, because tlc emits no
x86 intrinsics.
"""

from __future__ import annotations


def _mask(indices: range | list[int]) -> str:
    """A shufflevector mask constant."""
    return f"<{len(indices)} x i32> <{', '.join(f'i32 {i}' for i in indices)}>"


def _byte_permute() -> str:
    """A cross-lane byte shuffle no word or dword shuffle makes: VBMI's VPERMB."""
    mask = _mask([i * 5 % 64 for i in range(64)])
    return "\n".join([
        "define <64 x i8> @avx512vbmi(<64 x i8> %a) #0 {",
        f"  %c = shufflevector <64 x i8> %a, <64 x i8> poison, {mask}",
        "  ret <64 x i8> %c",
        "}",
    ])  # fmt: skip


def _pmaddwd_add(lanes: int) -> str:
    """`acc + a[even] * b[even] + a[odd] * b[odd]` in i32 lanes: LLVM's PMADDWD pattern, which
    it folds with the add into VNNI's VPDPWSSD."""
    even, odd = _mask(range(0, 2 * lanes, 2)), _mask(range(1, 2 * lanes, 2))
    w, n = f"<{2 * lanes} x i16>", f"<{lanes} x i16>"
    lines = [f"define <{lanes} x i32> @{'avx512vnni' if lanes == 16 else 'avxvnni'}("
             f"<{lanes} x i32> %acc, {w} %a, {w} %b) #0 {{"]  # fmt: skip
    for x in "ab":
        for half, mask in (("e", even), ("o", odd)):
            lines.append(f"  %{x}{half} = shufflevector {w} %{x}, {w} poison, {mask}")
            lines.append(f"  %{x}{half}x = sext {n} %{x}{half} to <{lanes} x i32>")
    lines += [
        f"  %me = mul <{lanes} x i32> %aex, %bex",
        f"  %mo = mul <{lanes} x i32> %aox, %box",
        f"  %s = add <{lanes} x i32> %me, %mo",
        f"  %r = add <{lanes} x i32> %acc, %s",
        f"  ret <{lanes} x i32> %r",
        "}",
    ]
    return "\n".join(lines)


def _register_pressure() -> str:
    """Twenty values live at once, more than the 16 legacy GPRs (so APX's extra ones are used
    where the target has them), then a subtraction and compares (APX's three-operand, flag-less
    and zero-upper forms)."""
    live = range(20)
    return "\n".join([
        "define i64 @apxf(ptr %p, i64 %a, i64 %b) {",
        *(f"  %v{i} = load volatile i64, ptr %p" for i in live),
        *(f"  store volatile i64 %v{i}, ptr %p" for i in live),
        "  %x = icmp eq i64 %a, 0",
        "  %y = icmp eq i64 %b, 7",
        "  %z = and i1 %x, %y",
        "  %s = sub i64 %a, %b",
        "  %r = select i1 %z, i64 %s, i64 %a",
        "  %zx = zext i1 %z to i64",
        "  %t = add i64 %r, %zx",
        "  ret i64 %t",
        "}",
    ])  # fmt: skip


#: The probes of `PROBES` written out (the long ones are generated above).
_FIXED_PROBES = """
define <16 x float> @avx512f(<16 x float> %a, <16 x float> %b) #0 {
  %c = fadd <16 x float> %a, %b
  ret <16 x float> %c
}
define <16 x i32> @avx512cd(<16 x i32> %a) #0 {
  %c = call <16 x i32> @llvm.ctlz.v16i32(<16 x i32> %a, i1 false)
  ret <16 x i32> %c
}
define <32 x half> @avx512fp16(<32 x half> %a, <32 x half> %b) #0 {
  %c = fadd <32 x half> %a, %b
  ret <32 x half> %c
}
define <16 x bfloat> @avx512bf16(<16 x float> %a) #0 {
  %c = fptrunc <16 x float> %a to <16 x bfloat>
  ret <16 x bfloat> %c
}
define <8 x bfloat> @avxneconvert(<8 x float> %a) {
  %c = fptrunc <8 x float> %a to <8 x bfloat>
  ret <8 x bfloat> %c
}
define <32 x i16> @avx512vbmi2(<32 x i16> %a, <32 x i16> %b, <32 x i16> %s) #0 {
  %c = call <32 x i16> @llvm.fshl.v32i16(<32 x i16> %a, <32 x i16> %b, <32 x i16> %s)
  ret <32 x i16> %c
}
define <16 x i32> @avx512vpopcntdq(<16 x i32> %a) #0 {
  %c = call <16 x i32> @llvm.ctpop.v16i32(<16 x i32> %a)
  ret <16 x i32> %c
}
define <64 x i8> @avx512bitalg(<64 x i8> %a) #0 {
  %c = call <64 x i8> @llvm.ctpop.v64i8(<64 x i8> %a)
  ret <64 x i8> %c
}
define <16 x i8> @gfni(<16 x i8> %a) {
  %c = call <16 x i8> @llvm.bitreverse.v16i8(<16 x i8> %a)
  ret <16 x i8> %c
}
define i1 @avx10_2(double %a, double %b) {
  %c = fcmp oeq double %a, %b
  ret i1 %c
}
define <2 x i64> @sse4a(<2 x i64> %a) {
  %b = bitcast <2 x i64> %a to <16 x i8>
  %c = shufflevector <16 x i8> %b, <16 x i8> zeroinitializer, <16 x i32> <i32 2, i32 3,
      i32 4, i32 5, i32 16, i32 16, i32 16, i32 16, i32 undef, i32 undef, i32 undef,
      i32 undef, i32 undef, i32 undef, i32 undef, i32 undef>
  %d = bitcast <16 x i8> %c to <2 x i64>
  ret <2 x i64> %d
}
define <4 x i32> @xop(<4 x i32> %a, <4 x i32> %s) {
  %c = call <4 x i32> @llvm.fshl.v4i32(<4 x i32> %a, <4 x i32> %a, <4 x i32> %s)
  ret <4 x i32> %c
}
define <2 x double> @fma4(<2 x double> %a, <2 x double> %b, <2 x double> %c) {
  %d = call <2 x double> @llvm.fma.v2f64(<2 x double> %a, <2 x double> %b, <2 x double> %c)
  ret <2 x double> %d
}
define i32 @tbm(i32 %a) {
  %b = add i32 %a, 1
  %c = and i32 %a, %b
  ret i32 %c
}
declare <32 x i16> @llvm.fshl.v32i16(<32 x i16>, <32 x i16>, <32 x i16>)
declare <4 x i32> @llvm.fshl.v4i32(<4 x i32>, <4 x i32>, <4 x i32>)
declare <16 x i32> @llvm.ctlz.v16i32(<16 x i32>, i1)
declare <16 x i32> @llvm.ctpop.v16i32(<16 x i32>)
declare <64 x i8> @llvm.ctpop.v64i8(<64 x i8>)
declare <16 x i8> @llvm.bitreverse.v16i8(<16 x i8>)
declare <2 x double> @llvm.fma.v2f64(<2 x double>, <2 x double>, <2 x double>)
"""
#: Extensions a named CPU has beyond its x86-64 level, as probe functions in plain LLVM IR and
#: a regex on their assembly that matches only when LLVM used the extension. LLVM has no API
#: listing the features a CPU name implies, so they are read off its code the way the level
#: is. Only extensions instruction selection picks from generic IR are probed: tlc emits no
#: x86 intrinsics, so no other extension (AMX, VP2INTERSECT, AES, ...) appears in its code.
#: AVX512-IFMA and AVX-IFMA are absent: LLVM 20 has no combine that makes VPMADD52 of plain
#: IR. Function names are the features with `.` as `_`; `#0` is the attribute the target's
#: level probes define (`tlc.codegen.target`), which compiles both in one module.
PROBES = "\n".join(
    [_FIXED_PROBES, _byte_permute(), _pmaddwd_add(16), _pmaddwd_add(8), _register_pressure()]
)
#: Each extension of `PROBES` (LLVM's name, which is GCC's `__builtin_cpu_supports`
#: name where GCC has one) and the instructions that show it, in `required_features` order.
EXTENSIONS = {
    "avx512f": r"\bvaddps\s+%zmm",  # x86-64-v4's, on a v3 core (Knights Landing)
    "avx512cd": r"\bvplzcnt[dq]\s",
    "avx512fp16": r"\bvaddph\s+%zmm",  # half arithmetic
    "avx512bf16": r"^\s*vcvtneps2bf16\s+%zmm",  # float -> bfloat, 16 lanes (EVEX)
    "avx512vbmi": r"\bvperm[it]?2?b\s",  # any byte permute
    "avx512vbmi2": r"\bvpsh[lr]dv?[wdq]\s",  # funnel shifts of i16/i32/i64 lanes
    "avx512vpopcntdq": r"\bvpopcnt[dq]\s",
    "avx512bitalg": r"\bvpopcnt[bw]\s",
    "avx512vnni": r"^\s*vpdpwssd\s+%zmm",  # PMADDWD + add
    "avxvnni": r"\{vex\}\s*vpdpwssd",  # the same, VEX-encoded (AVX2-class cores)
    "avxneconvert": r"\{vex\}\s*vcvtneps2bf16",  # float -> bfloat, VEX-encoded
    "gfni": r"\bv?gf2p8affine",  # i8 bit reversal as an affine transform
    "avx10.2": r"\bv(u?comx|minmax)",  # AVX10.2's scalar compares
    "apxf": r"%r(1[6-9]|2\d|3[01])\b|\{nf\}|\b(push2|pop2|pushp|popp|setzu|ccmp|ctest)"
    r"|^\s*(add|sub|and|or|xor|imul)[bwlq]?\s+%\w+,\s*%\w+,\s*%\w+",  # APX (see APX)
    "sse4a": r"\b(extrq|insertq)\b",  # AMD: byte shuffles
    "xop": r"\bvp(rot|cmov|perm|sh[al])",  # AMD Bulldozer: vector rotates
    "fma4": r"\bvfmadd\w+\s+(%xmm\d+,\s*){3}%xmm",  # AMD Bulldozer: 4-operand FMA
    "tbm": r"\bblcfill",  # AMD Piledriver: x & (x + 1)
}
#: The LLVM features of Intel APX, which one CPUID bit announces (GCC 14's "apxf"): register
#: allocation uses its 16 extra GPRs (egpr) and instruction selection its three-operand and
#: flag-less forms (ndd, nf) without any special IR; `apxf` in `required_features` needs them
#: all.
APX = ("egpr", "push2pop2", "ppx", "ndd", "ccmp", "nf", "cf", "zu")


def llvm_features(name: str) -> tuple[str, ...]:
    """The LLVM features an extension of `EXTENSIONS` (or an explicit feature) stands for, as a
    CPU must have them and `-feature` flags turn them off: `apxf` for all of `APX`, any other
    name for itself."""
    return APX if name == "apxf" else (name,)
