"""Target machines and the optimisation pipeline every compiled module goes through.

A `Target` names what code is generated for: an LLVM triple, a CPU and feature flags, with
`Target()` meaning this host (the JIT's default). Nothing else in codegen may look at the host:
the vector width and register count the kernels are shaped by come from `target_info`, which
asks LLVM's own code generator for the target (it compiles tiny probe functions and reads the
registers they use), so a library built on an AVX-512 machine for `haswell` is AVX2 code.
The same probes tell the extensions beyond its x86-64 level a named CPU's code uses
(`EXTENSIONS`: `sapphirerapids` code has AVX512-FP16 adds), which `required_features` lists for
the checks a library and the JIT make.

Unknown CPU names and feature flags are checked before LLVM sees them, because LLVM reacts to
them with a warning on stderr and then a fatal error (an x86-64 CPU it does not know has no
64-bit mode) or an assertion failure (a flag without + or -): `resolve_target` probes a
non-trivial name in a child process and turns the warning into a diagnostic.

Code is position-independent (shared objects need it; harmless for the JIT) and goes through
LLVM's new-pass-manager O3 pipeline: without it loops stay scalar, the target machine's `opt=3`
only affects instruction selection.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm

from tlc.codegen.isa_extensions import EXTENSIONS, llvm_features
from tlc.codegen.isa_extensions import PROBES as EXTENSION_PROBES
from tlc.core.diagnostics import DiagnosticError

#: The x86-64 psABI micro-architecture levels above the baseline, best first.
X86_LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64-v2")
#: The baseline every x86-64 CPU runs (SSE2; LLVM's `x86-64` CPU): the last variant of a
#: default library, for CPUs below v2 (Core 2, AMD K8/K10, QEMU's default `qemu64` model).
X86_BASELINE = "x86-64"
#: LLVM features each level requires on top of the one below (x86-64 psABI, stable by design).
LEVEL_FEATURES = {
    "x86-64-v2": ("cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
#: How an AArch64 Linux library checks an LLVM feature when it loads: the `getauxval` word
#: (AT_HWCAP is 16, AT_HWCAP2 26) and the bits in it the kernel sets when the CPU has the
#: feature (arm64's asm/hwcap.h, a stable kernel ABI). AArch64 has no CPUID a program may read,
#: and GCC 12 no `__builtin_cpu_supports` there.
AARCH64_HWCAPS = {
    "fp-armv8": (16, 1 << 0), "neon": (16, 1 << 1), "aes": (16, 1 << 3),
    "sha2": (16, 1 << 6), "crc": (16, 1 << 7), "lse": (16, 1 << 8),
    "fullfp16": (16, 1 << 9 | 1 << 10), "rdm": (16, 1 << 12), "rcpc": (16, 1 << 15),
    "sha3": (16, 1 << 17), "dotprod": (16, 1 << 20), "sve": (16, 1 << 22),
    "fp16fml": (16, 1 << 23), "sve2": (26, 1 << 1), "i8mm": (26, 1 << 13),
    "bf16": (26, 1 << 14),
}  # fmt: skip
FEATURE_FLAG = re.compile(r"[+-][a-z0-9][a-z0-9.\-_]*\Z")


@dataclass(frozen=True)
class Target:
    """What to generate code for. `cpu="host"` is this machine's CPU with all its features
    (plus `features`); `triple=""` is this process's triple."""

    cpu: str = "host"
    features: str = ""
    triple: str = ""

    @property
    def full_triple(self) -> str:
        return self.triple or llvm.get_process_triple()

    @property
    def arch(self) -> str:
        return self.full_triple.split("-")[0]

    @property
    def is_host(self) -> bool:
        return self.cpu == "host" and not self.features and not self.triple

    def describe(self) -> str:
        text = self.cpu + (f" {self.features}" if self.features else "")
        return text + (f" ({self.triple})" if self.triple else "")

    def tag(self) -> str:
        """A C-identifier fragment naming this target (symbol suffixes)."""
        return re.sub(r"\W", "_", f"{self.cpu}{self.features}")


HOST = Target()


@dataclass(frozen=True)
class TargetInfo:
    """What the kernels are shaped by: the widest vector the target uses efficiently (LLVM's
    own choice, so `prefer-256-bit` CPUs get 32 bytes), how many vector registers it has, and
    the x86-64 level its instructions need (None off x86)."""

    vector_bytes: int
    vector_registers: int
    level: str | None
    #: Whether each core starts two full-width 512-bit FMAs a cycle, as Intel's server cores
    #: do (Zen 4 starts one, in two 256-bit halves): there the FMAs outrun a tile that loads
    #: one operand per FMA (`conv_direct.direct_tile`). Read off AVX512-FP16, which only
    #: Intel's Sapphire Rapids and later Xeons have (each of them with two FMA units); the
    #: CPU's name is no guide, as a VM's CPUID model often names a client core.
    dual_fma512: bool = False
    #: The extensions beyond `level` LLVM's code for the target uses (`EXTENSIONS`), which a
    #: named CPU implies and a CPU running the code must have too.
    extensions: tuple[str, ...] = ()


@cache
def _initialised() -> bool:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()
    return True


def resolve_target(cpu: str | None = None, features: str | None = None,
                   triple: str | None = None) -> Target:  # fmt: skip
    """A checked `Target` from command-line style options (None = host); raises a
    DiagnosticError naming the bad triple, CPU or feature."""
    target = Target(cpu or "host", (features or "").replace(" ", ""), triple or "")
    _initialised()
    try:
        llvm.Target.from_triple(target.full_triple)
    except RuntimeError as exc:
        raise DiagnosticError.simple(f"unknown target triple '{target.triple}': {exc}") from None
    for flag in filter(None, target.features.split(",")):
        if not FEATURE_FLAG.match(flag):
            raise DiagnosticError.simple(
                f"bad target feature '{flag}': write +name to enable or -name to disable, "
                "comma-separated (e.g. +avx2,-avx512f)"
            )
    if target.cpu == "host" and target.triple and target.arch != Target().arch:
        raise DiagnosticError.simple(
            f"--target-cpu host names this {Target().arch} machine; a {target.arch} triple "
            "needs a CPU name (e.g. generic)"
        )
    if not _trusted(target):
        complaints = _probe_in_child(target)
        if complaints:
            raise DiagnosticError.simple(
                f"target {target.describe()}: LLVM says: " + "; ".join(complaints)
            )
    return target


def target_from_options(args: argparse.Namespace) -> Target | None:
    """The checked target the options name, or None when none was given."""
    if args.target_cpu is None and args.target_features is None and args.target_triple is None:
        return None
    return resolve_target(args.target_cpu, args.target_features, args.target_triple)


def _trusted(target: Target) -> bool:
    """Targets LLVM is known to accept (no child-process probe needed)."""
    return not target.features and (
        target.cpu in ("host", "generic")
        or (target.arch == "x86_64" and target.cpu in (*X86_LEVELS, X86_BASELINE))
    )


_PROBE = """
import sys, llvmlite.binding as llvm
llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
cpu, features, triple = sys.argv[1:4]
if cpu == "host":
    cpu = llvm.get_host_cpu_name()
    features = ",".join(f for f in (llvm.get_host_cpu_features().flatten(), features) if f)
if triple.startswith("x86_64"):
    features = ",".join(f for f in (features, "+64bit") if f)
tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features)
m = llvm.parse_assembly("define i32 @f() { ret i32 0 }")
m.triple = triple
tm.emit_assembly(m)
"""


@cache
def _probe_in_child(target: Target) -> tuple[str, ...]:
    """LLVM's complaints about `target`, from a child process (they are fatal in-process)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, target.cpu, target.features, target.full_triple],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line.strip() for line in done.stderr.splitlines()]
    complaints = tuple(dict.fromkeys(line for line in lines if "not a recognized" in line))
    if done.returncode != 0 and not complaints:
        return (lines[-1] if lines else f"exit status {done.returncode}",)
    return complaints


@cache
def machine_cpu(target: Target = HOST) -> tuple[str, str]:
    """The CPU name and feature string LLVM's target machine for `target` is made with (the
    host's own name and every feature it has, for `host`)."""
    _initialised()
    cpu, features = target.cpu, target.features
    if cpu == "host":
        cpu = llvm.get_host_cpu_name()
        features = ",".join(f for f in (llvm.get_host_cpu_features().flatten(), features) if f)
    return cpu, features


@cache
def target_machine(target: Target = HOST) -> llvm.TargetMachine:
    """A PIC target machine at codegen level 3 (call `resolve_target` first for user input)."""
    cpu, features = machine_cpu(target)
    return llvm.Target.from_triple(target.full_triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default"
    )


#: Probe functions: what LLVM's instruction selection makes of them tells the target's shape.
_PROBES = """
define <16 x float> @width(<16 x float> %a, <16 x float> %b) {
  %c = fadd <16 x float> %a, %b
  ret <16 x float> %c
}
define <32 x i16> @avx512bw(<32 x i16> %a, <32 x i16> %b) #0 {
  %c = add <32 x i16> %a, %b
  ret <32 x i16> %c
}
define <8 x i32> @avx2(<8 x i32> %a, <8 x i32> %b) {
  %c = add <8 x i32> %a, %b
  ret <8 x i32> %c
}
define double @fma(double %a, double %b, double %c) {
  %d = call double @llvm.fma.f64(double %a, double %b, double %c)
  ret double %d
}
define i64 @popcnt(i64 %a) {
  %b = call i64 @llvm.ctpop.i64(i64 %a)
  ret i64 %b
}
declare double @llvm.fma.f64(double, double, double)
declare i64 @llvm.ctpop.i64(i64)
attributes #0 = { "min-legal-vector-width"="512" }
"""


def level_features(level: str) -> set[str]:
    """The LLVM features x86-64 level `level` and those below it require (none for another
    name)."""
    levels = X86_LEVELS[X86_LEVELS.index(level) :] if level in LEVEL_FEATURES else ()
    return {f for name in levels for f in LEVEL_FEATURES[name]}


@cache
def target_info(target: Target = HOST) -> TargetInfo:
    """Vector width, register count, x86-64 level and extensions of `target`, read off LLVM's
    code for the probe functions (see the module docstring), all in one module."""
    x86 = target.arch == "x86_64"
    module = llvm.parse_assembly(_PROBES + (EXTENSION_PROBES if x86 else ""))
    module.triple = target_machine(target).triple
    asm = target_machine(target).emit_assembly(module)
    bodies = dict(re.findall(r"^(\w+):[^\n]*\n(.*?)(?=^\s*\.cfi_endproc|^\.Lfunc_end)", asm,
                             re.M | re.S))  # fmt: skip
    width = bodies.get("width", "")
    vector_bytes = 64 if "zmm" in width else 32 if "ymm" in width else 16
    if not x86:
        return TargetInfo(vector_bytes, 32, None)
    has = {
        "x86-64-v4": re.search(r"vpaddw\s+%zmm", bodies.get("avx512bw", "")) is not None,
        "x86-64-v3": re.search(r"vpaddd\s+%ymm", bodies.get("avx2", "")) is not None
        and "vfmadd" in bodies.get("fma", ""),
        "x86-64-v2": "popcnt" in bodies.get("popcnt", ""),
    }
    level = next((name for name in X86_LEVELS if has[name]), X86_BASELINE)
    implied = level_features(level)
    extensions = tuple(
        feature
        for feature, pattern in EXTENSIONS.items()
        if feature not in implied
        and re.search(pattern, bodies.get(feature.replace(".", "_"), ""), re.M)
    )
    dual = has["x86-64-v4"] and "avx512fp16" in extensions
    return TargetInfo(vector_bytes, 32 if has["x86-64-v4"] else 16, level, dual, extensions)


def required_features(target: Target) -> tuple[str, ...]:
    """Feature names a CPU needs to run code for `target` (LLVM's, which are also GCC's
    `__builtin_cpu_supports` names where GCC has one; `apxf` stands for `APX`): its x86-64
    level, the extensions beyond it its code uses (a named CPU's, read off probes:
    `EXTENSIONS`), then each feature it enables explicitly."""
    info = target_info(target)
    needed = [info.level] if info.level not in (None, X86_BASELINE) else []
    needed += info.extensions
    needed += [f[1:] for f in target.features.split(",") if f.startswith("+")]
    return tuple(dict.fromkeys(needed))


def host_lacks(target: Target) -> list[str]:
    """The features of `required_features(target)` this machine does not have (LLVM names)."""
    if target.is_host:
        return []
    if target.arch != Target().arch:
        return [f"the {target.arch} architecture"]
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    missing = []
    for name in required_features(target):
        needs = level_features(name) or set(llvm_features(name))
        if not needs <= host:
            missing.append(name)
    return missing


def parse_ir(text: str, target: Target = HOST) -> llvm.ModuleRef:
    """Parse and verify textual LLVM IR for `target`."""
    tm = target_machine(target)
    module = llvm.parse_assembly(text)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    module.verify()
    return module


#: What `optimize` and the target machines do, as the object cache's key names it (change it
#: with them, so entries made by another pipeline are never read).
PIPELINE = "new-pm O3 +loop-vectorize +slp-vectorize +unroll; codegen O3 pic default-model"


def optimize(module: llvm.ModuleRef, target: Target = HOST) -> None:
    """Run the O3 module pipeline (inlining, loop and SLP vectorisation, unrolling) in place."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(target_machine(target), pto)
    pb.getModulePassManager().run(module, pb)


def compile_ir(text: str, target: Target = HOST) -> llvm.ModuleRef:
    """Parsed, verified and optimised module, ready for `emit_object` or assembly."""
    module = parse_ir(text, target)
    optimize(module, target)
    return module


def emit_object(module: llvm.ModuleRef, target: Target = HOST) -> bytes:
    return target_machine(target).emit_object(module)


def emit_assembly(module: llvm.ModuleRef, target: Target = HOST) -> str:
    return target_machine(target).emit_assembly(module)
