"""Targets: kernels shaped by the target CPU, the --target-* options, multi-level libraries,
refusal on a CPU lacking the features, and aarch64 code.

IR and assembly checks pin a CPU (one AVX2, one AVX-512) so they hold on any build machine;
checks that execute code run only for targets this machine supports and skip otherwise, with
the reason.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
from test_codegen import MATRICES  # the tile-edge graphs, one definition

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen.isa_extensions import EXTENSIONS, llvm_features
from tlc.codegen.shared_lib import (
    build_library,
    library_compiler,
    library_variants,
    unknown_to_compiler,
)
from tlc.codegen.target import (
    X86_BASELINE,
    X86_LEVELS,
    Target,
    host_lacks,
    required_features,
    resolve_target,
    target_info,
)
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect.payload_section import payload_from_module
from tlc.semantics.interpret import interpret
from tlc.tools.compile import main as compile_main

ROOT = Path(__file__).parent.parent
MLP_PATH = ROOT / "examples" / "mlp.tlir"
X86 = Target().arch == "x86_64"
needs_x86 = pytest.mark.skipif(not X86, reason="x86-64 levels need an x86-64 build machine")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def runnable(cpu: str, features: str = "") -> Target:
    """`Target(cpu, features)`, or skip the test when this machine cannot run its code. The
    extensions beyond its level a named CPU implies and this machine lacks (`znver3`'s SSE4A
    on an Intel core) are turned off instead: they shape no kernel (`target_info` reads the
    same widths, registers and level), so the code still is that CPU's kernels."""
    target = Target(cpu, features)
    missing = host_lacks(target)
    if missing and set(missing) <= set(target_info(target).extensions):
        target = Target(cpu, ",".join([*filter(None, [features]), *(f"-{m}" for m in missing)]))
        missing = host_lacks(target)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {target.describe()}")
    return target


def options(target: Target) -> dict[str, str | None]:
    """`tlc.compile`'s keywords for `target` (a `runnable` one, its extensions turned off)."""
    return {"target_cpu": target.cpu, "target_features": target.features or None}


@pytest.mark.parametrize(
    ("cpu", "vector_bytes", "registers", "level", "dual_fma512"),
    [
        ("x86-64-v2", 16, 16, "x86-64-v2", False),
        ("haswell", 32, 16, "x86-64-v3", False),
        ("znver3", 32, 16, "x86-64-v3", False),
        ("znver4", 64, 32, "x86-64-v4", False),
        ("skylake-avx512", 64, 32, "x86-64-v4", False),
        ("sapphirerapids", 64, 32, "x86-64-v4", True),  # AVX512-FP16
        ("graniterapids", 64, 32, "x86-64-v4", True),
        ("rocketlake", 64, 32, "x86-64-v4", False),  # a client core: one 512-bit FMA unit
    ],
)
def test_target_info_comes_from_the_target(
    cpu: str, vector_bytes: int, registers: int, level: str, dual_fma512: bool
) -> None:
    info = target_info(Target(cpu, triple="x86_64-unknown-linux-gnu"))
    got = (info.vector_bytes, info.vector_registers, info.level, info.dual_fma512)
    assert got == (vector_bytes, registers, level, dual_fma512)


def test_dual_fma_units_follow_the_features_not_the_name() -> None:
    """A CPU named for a client core with AVX512-FP16 added (what a VM on a Sapphire Rapids
    host reports) is read as two FMA units; the server core without it is not."""
    x86 = "x86_64-unknown-linux-gnu"
    assert target_info(Target("rocketlake", "+avx512fp16", x86)).dual_fma512
    assert not target_info(Target("sapphirerapids", "-avx512fp16", x86)).dual_fma512


X86_TRIPLE = "x86_64-unknown-linux-gnu"
AVX512_ICELAKE = ("avx512vbmi", "avx512vbmi2", "avx512vpopcntdq", "avx512bitalg", "avx512vnni")


@pytest.mark.parametrize(
    ("cpu", "features", "required"),
    [
        ("x86-64-v4", "", ("x86-64-v4",)),
        ("skylake-avx512", "", ("x86-64-v4",)),
        ("haswell", "", ("x86-64-v3",)),
        ("x86-64", "", ()),
        ("knl", "", ("x86-64-v3", "avx512f", "avx512cd")),
        ("icelake-server", "", ("x86-64-v4", *AVX512_ICELAKE, "gfni")),
        ("sapphirerapids", "",
         ("x86-64-v4", "avx512fp16", "avx512bf16", *AVX512_ICELAKE, "avxvnni", "gfni")),
        ("sapphirerapids", "-avx512fp16",
         ("x86-64-v4", "avx512bf16", *AVX512_ICELAKE, "avxvnni", "gfni")),
        ("znver4", "", ("x86-64-v4", "avx512bf16", *AVX512_ICELAKE, "gfni", "sse4a")),
        ("znver5", "",
         ("x86-64-v4", "avx512bf16", *AVX512_ICELAKE, "avxvnni", "gfni", "sse4a")),
        ("alderlake", "", ("x86-64-v3", "avxvnni", "gfni")),
        ("sierraforest", "", ("x86-64-v3", "avxvnni", "avxneconvert", "gfni")),
        ("x86-64-v4", "+avx512fp16", ("x86-64-v4", "avx512fp16")),
        ("x86-64-v4", "+amx-tile,+avx512fp16", ("x86-64-v4", "avx512fp16", "amx-tile")),
    ],
)  # fmt: skip
def test_required_features_include_a_named_cpus_extensions(
    cpu: str, features: str, required: tuple[str, ...]
) -> None:
    """The level, the extensions LLVM's code for the CPU uses, then the explicit features
    (each once): what a library's dispatcher checks and the JIT asks of this machine."""
    assert required_features(Target(cpu, features, X86_TRIPLE)) == required


#: For each probed extension: a CPU LLVM gives it and the level that CPU is at.
EXTENSION_CPUS = {
    "avx512f": ("knl", "x86-64-v3"),
    "avx512cd": ("knl", "x86-64-v3"),
    "avx512fp16": ("sapphirerapids", "x86-64-v4"),
    "avx512bf16": ("cooperlake", "x86-64-v4"),
    "avx512vbmi": ("cannonlake", "x86-64-v4"),
    "avx512vbmi2": ("icelake-server", "x86-64-v4"),
    "avx512vpopcntdq": ("icelake-server", "x86-64-v4"),
    "avx512bitalg": ("icelake-server", "x86-64-v4"),
    "avx512vnni": ("cascadelake", "x86-64-v4"),
    "avxvnni": ("alderlake", "x86-64-v3"),
    "avxneconvert": ("sierraforest", "x86-64-v3"),
    "gfni": ("alderlake", "x86-64-v3"),
    "avx10.2": ("diamondrapids", "x86-64-v4"),
    "apxf": ("diamondrapids", "x86-64-v4"),
    "sse4a": ("znver3", "x86-64-v3"),
    "xop": ("bdver2", "x86-64-v2"),
    "fma4": ("bdver2", "x86-64-v2"),
    "tbm": ("bdver2", "x86-64-v2"),
}


def test_every_probe_has_a_cpu() -> None:
    assert set(EXTENSION_CPUS) == set(EXTENSIONS)


@pytest.mark.parametrize("feature", list(EXTENSION_CPUS))
def test_each_probe_fires_only_where_llvm_uses_the_extension(feature: str) -> None:
    """On a CPU LLVM gives the extension, not on its plain level, and not with -feature."""
    cpu, level = EXTENSION_CPUS[feature]
    off = ",".join(f"-{f}" for f in llvm_features(feature))
    assert target_info(Target(cpu, triple=X86_TRIPLE)).level == level
    assert feature in target_info(Target(cpu, triple=X86_TRIPLE)).extensions
    assert feature not in target_info(Target(level, triple=X86_TRIPLE)).extensions
    assert feature not in target_info(Target(cpu, off, X86_TRIPLE)).extensions


@pytest.mark.parametrize("cpu", ["x86-64-v2", "haswell", "znver4"])
@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("name", ["lin", "mm"])
def test_each_levels_kernels_compute_the_reference(cpu: str, dtype: str, name: str) -> None:
    """The tile shapes of every level (3x3 dot tiles on 16 registers, 4x4 on 32; 2, 4 or 8
    lanes) at their edges, run through the JIT when this CPU can."""
    if not X86:
        pytest.skip("x86-64 targets")
    target = options(runnable(cpu))
    module = tlc.parse(MATRICES)
    graph = checked_graph(module, name)
    rng = np.random.default_rng(4)
    records = {"lin": {1: {"weight": rng.normal(size=(19, 33)), "bias": rng.normal(size=19)}},
               "mm": {1: {"value": rng.normal(size=9 * 70)}}}  # fmt: skip
    payload = tlc.core.payload.Payload(records[name])
    scalar = np.float64 if dtype == "f64" else np.float32
    x = rng.normal(size=graph.nodes[0].declared_shape).astype(scalar)
    expected = interpret(graph, payload, x, scalar).output
    tol = {"rtol": 1e-11, "atol": 1e-12} if dtype == "f64" else {"rtol": 2e-5, "atol": 2e-5}
    f = tlc.compile(module, payload, dtype, graph=name, **target)
    np.testing.assert_allclose(f(x), expected, **tol)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"target_cpu": "nonsense"}, "'nonsense' is not a recognized processor"),
        ({"target_features": "+bogus"}, "'+bogus' is not a recognized feature"),
        ({"target_features": "avx2"}, "bad target feature 'avx2': write +name"),
        ({"target_triple": "bogus-x"}, "unknown target triple 'bogus-x'"),
    ],
)
def test_bad_targets_are_diagnosed(options: dict[str, str], message: str) -> None:
    with pytest.raises(DiagnosticError, match=re.escape(message)):
        tlc.compile(MLP_PATH.read_text(), **options)


#: Features GCC 12's `__builtin_cpu_supports` checks and that no x86-64 CPU has both of: AMX
#: tiles (Intel's server cores since Sapphire Rapids) and VP2INTERSECT (Tiger Lake, AMD Zen 5).
ABSENT_SOMEWHERE = ("amx-tile", "avx512vp2intersect")


def feature_this_cpu_lacks() -> str:
    """One of `ABSENT_SOMEWHERE` this machine lacks, so the refusal tests run on every CPU."""
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    lacking = [f for f in ABSENT_SOMEWHERE if f not in host]
    if not lacking:
        pytest.skip(f"this CPU has every feature of {ABSENT_SOMEWHERE}")
    return lacking[0]


def test_jit_refuses_a_target_this_cpu_cannot_run() -> None:
    feature = feature_this_cpu_lacks()
    with pytest.raises(DiagnosticError, match=f"this CPU lacks {feature}"):
        tlc.compile(MLP_PATH.read_text(), target_features=f"+{feature}")


def build(tmp_path: Path, *options: str, name: str = "libmlp.so") -> Path:
    out = tmp_path / name
    assert compile_main([str(MLP_PATH), "-o", str(out), *options]) == 0
    return out


def raw_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.tlc_mlp_cpu_variant.restype = ctypes.c_char_p
    return lib


@needs_x86
@needs_cc
def test_default_library_holds_every_level_and_picks_the_best(tmp_path: Path) -> None:
    path = build(tmp_path)
    header = (tmp_path / "libmlp.h").read_text()
    assert "Built for: x86-64-v4, x86-64-v3, x86-64-v2, x86-64." in header
    assert "int tlc_mlp_cpu_check(const char **missing);" in header
    assert "#define TLC_ERR_UNSUPPORTED_CPU 4" in header
    best = next(v for v in library_variants(None) if not host_lacks(v))
    raw = raw_library(path)
    assert raw.tlc_mlp_cpu_variant() == best.cpu.encode()
    assert raw.tlc_mlp_cpu_check(None) == 0
    out = tlc.load(str(path))(np.array([0.3, -0.2, 0.1, 0.4]))
    assert f"{float(out):.6f}" == "0.027713"


@needs_x86
@needs_cc
@pytest.mark.parametrize("cpu", [*X86_LEVELS, X86_BASELINE])
def test_single_target_libraries_agree(tmp_path: Path, cpu: str) -> None:
    """Each level built alone (--target-cpu) computes the same values, where this CPU runs it."""
    runnable(cpu)
    path = build(tmp_path, "--target-cpu", cpu, "--batch", "5", "--dtype", "f32")
    module = tlc.parse(MLP_PATH.read_text())
    graph = checked_graph(module)
    payload = payload_from_module(module, "mlp")
    xs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected = [interpret(graph, payload, x, np.float32).output for x in xs]
    np.testing.assert_allclose(tlc.load(str(path))(xs), expected, rtol=2e-5, atol=1e-6)
    assert raw_library(path).tlc_mlp_cpu_variant() == cpu.encode()


@needs_x86
@needs_cc
def test_library_for_missing_features_refuses_instead_of_crashing(tmp_path: Path) -> None:
    """A library built for a feature this CPU lacks (`feature_this_cpu_lacks`) is refused by
    tlc.load, its check names the feature, and its entry returns TLC_ERR_UNSUPPORTED_CPU
    without executing anything."""
    feature = feature_this_cpu_lacks()
    path = build(tmp_path, "--target-cpu", "x86-64-v4", "--target-features", f"+{feature}")
    assert f"Built for: x86-64-v4 +{feature}." in (tmp_path / "libmlp.h").read_text()
    with pytest.raises(DiagnosticError, match=r"built for CPU features this machine lacks \("):
        tlc.load(str(path))
    raw = raw_library(path)
    missing = ctypes.c_char_p()
    assert raw.tlc_mlp_cpu_check(ctypes.byref(missing)) == 4
    assert missing.value in (feature.encode(), b"x86-64-v4")
    assert raw.tlc_mlp_cpu_variant() is None
    x, y = np.zeros(4), np.zeros(1)
    assert raw.tlc_mlp(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p)) == 4


#: Named CPUs whose libraries check extensions beyond their level, newest Intel and AMD
#: first: on most x86-64 machines one of them needs an extension it lacks (sse4a on an Intel
#: core, avx512fp16 on Zen 4, AVX-512 itself on a client core).
NAMED_CPUS = ("sapphirerapids", "znver5", "znver4", "icelake-server", "cooperlake",
              "alderlake", "znver3", "bdver2")  # fmt: skip


@needs_x86
@needs_cc
def test_a_library_refuses_what_its_compiler_cannot_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The C compiler is asked which feature names its `__builtin_cpu_supports` knows: every
    x86-64 level and the common extensions, never a name no CPUID bit has. A target needing
    one it does not know is refused before anything is built, with the flags that turn the
    implied ones off (a newer GCC knows more: then the library builds and checks it)."""
    cc = library_compiler(Target())
    assert unknown_to_compiler(cc, (*X86_LEVELS, "avx512fp16", "gfni", "sse4a")) == ()
    assert unknown_to_compiler(cc, ("x86-64-v3", "no-such-feature", "avx2")) == ("no-such-feature",)
    target = Target("sierraforest")
    unknown = unknown_to_compiler(cc, required_features(target))
    if not unknown:
        build(tmp_path, "--target-cpu", "sierraforest")
        return
    out = tmp_path / "libsrf.so"
    assert compile_main([str(MLP_PATH), "-o", str(out), "--target-cpu", "sierraforest"]) == 1
    err = capsys.readouterr().err
    assert f"code for sierraforest needs {', '.join(unknown)}, which a library cannot" in err
    assert "--target-features=-avxneconvert" in err
    assert not out.exists()


@needs_x86
@needs_cc
def test_named_cpu_library_refuses_a_cpu_lacking_its_extensions(tmp_path: Path) -> None:
    """A library for a named CPU whose extensions (not just its level) this machine lacks is
    refused by tlc.load, and its check names an extension it lacks."""
    lacking = {cpu: host_lacks(Target(cpu)) for cpu in NAMED_CPUS}
    cpu = next((cpu for cpu, missing in lacking.items()
                if missing and set(missing) <= set(EXTENSIONS)), None)  # fmt: skip
    if cpu is None:
        pytest.skip(f"this CPU has every extension of {', '.join(NAMED_CPUS)} beyond its level")
    assert not unknown_to_compiler(library_compiler(Target(cpu)), required_features(Target(cpu)))
    path = build(tmp_path, "--target-cpu", cpu)
    with pytest.raises(DiagnosticError, match=rf"lacks \({re.escape(lacking[cpu][0])}\)"):
        tlc.load(str(path))
    missing = ctypes.c_char_p()
    assert raw_library(path).tlc_mlp_cpu_check(ctypes.byref(missing)) == 4
    assert (missing.value or b"").decode() in lacking[cpu]


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a console script (tlc-opt, tlc-compile) of this environment."""
    script = str(Path(sys.executable).parent / name)
    return subprocess.run([script, *args], capture_output=True, text=True, check=False)


def aarch64() -> Target:
    try:
        return resolve_target("generic", None, "aarch64-linux-gnu")
    except DiagnosticError as exc:
        pytest.skip(f"llvmlite has no AArch64 target: {exc}")


def test_aarch64_assembly_and_ir() -> None:
    """NEON code through --target-triple: 128-bit vectors (4 floats), 32 registers."""
    target = aarch64()
    assert target_info(target).vector_bytes == 16
    asm = tool("tlc-opt", str(MLP_PATH), "--emit", "asm-f32",
               "--target-triple", "aarch64-linux-gnu", "--target-cpu", "neoverse-n1")  # fmt: skip
    assert asm.returncode == 0, asm.stderr
    assert re.search(r"^tlc_mlp:", asm.stdout, re.M) and "fmla" in asm.stdout
    ir = tool("tlc-opt", str(MLP_PATH), "--emit", "llvm",
              "--target-triple", "aarch64-linux-gnu", "--target-cpu", "generic")  # fmt: skip
    assert ir.returncode == 0, ir.stderr
    assert 'target triple = "aarch64' in ir.stdout


def test_aarch64_library_is_refused_without_a_cross_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = aarch64()
    if not X86:
        pytest.skip("this machine is not x86-64")
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: None if "aarch64" in name else real_which(name)
    )
    graph = checked_graph(tlc.parse(MLP_PATH.read_text()))
    with pytest.raises(DiagnosticError) as raised:
        build_library(
            [(graph, None)], str(tmp_path / "lib.so"), runtime_payload=True, target=target
        )
    assert str(raised.value) == (
        "tlc-compile: cannot link a library for aarch64 on this x86_64 machine: no cross "
        "compiler (aarch64-linux-gnu-gcc) on PATH; tlc-opt --emit asm or --emit llvm emit code "
        "for it"
    )


def test_target_options_need_a_native_emitter() -> None:
    done = tool("tlc-opt", str(MLP_PATH), "--target-cpu", "znver3")
    assert done.returncode == 2
    assert "--target-* options need --emit llvm or --emit asm" in done.stderr


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="needs aarch64-linux-gnu-gcc (Debian's gcc-aarch64-linux-gnu)",
)
def test_a_cross_built_library_links_and_is_refused_here_by_name(tmp_path: Path) -> None:
    """tlc-compile links an AArch64 library with the cross compiler (tests/test_codegen_emulated.py
    runs one); tlc.load on this machine says what it is instead of the dynamic loader's "No
    such file or directory"."""
    aarch64()
    if not X86:
        pytest.skip("this machine is not x86-64")
    path = build(tmp_path, "--target-triple", "aarch64-linux-gnu", "--target-cpu", "generic")
    assert path.read_bytes()[18:20] == (183).to_bytes(2, "little")  # EM_AARCH64
    assert "Built for: generic (aarch64-linux-gnu)." in (tmp_path / "libmlp.h").read_text()
    with pytest.raises(DiagnosticError) as raised:
        tlc.load(str(path))
    assert str(raised.value) == (
        f"cannot load '{path}': it is a library for aarch64, and this machine is x86_64"
    )


def test_a_file_that_is_not_a_library_is_named_in_the_message(tmp_path: Path) -> None:
    """The dynamic loader's complaint names the file the user gave, not tlc.load's private copy."""
    path = tmp_path / "libfake.so"
    path.write_bytes(b"not a library")
    with pytest.raises(DiagnosticError) as raised:
        tlc.load(str(path))
    assert str(raised.value) == f"cannot load '{path}': {path}: file too short"
