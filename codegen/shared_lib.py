"""Shared libraries: compiled graphs as `libNAME.so` plus a C header `libNAME.h`.

A library is safe on any CPU of its architecture by default: on x86-64 each graph is compiled
once per micro-architecture level (x86-64-v4 = AVX-512, v3 = AVX2, v2 = SSE4.2), each variant
with kernels shaped for its level under a name of its own (`tlc_g__x86_64_v3`), and a small C
dispatcher owns the public entry `tlc_g`: on every call it takes the best variant this CPU
supports (GCC's `__builtin_cpu_supports`, i.e. CPUID, read once by libgcc at load time). With
an explicit target (`--target-cpu`, `--target-features`) there is exactly one variant, and the
dispatcher returns TLC_ERR_UNSUPPORTED_CPU on a CPU lacking its features instead of executing
illegal instructions; `tlc_g_cpu_check` says so up front and names the missing feature.

Elsewhere (an AArch64 library, `--target-triple aarch64-linux-gnu`) there is one variant, for
the `generic` CPU plus the features the kernel's HWCAP bits tell, which the dispatcher checks
(`check_library_target`); such a library is linked by the cross compiler (`library_compiler`).

Objects come from the same code path as the JIT (`tlc.codegen.target`) and are linked with the
dispatcher by `cc -shared ... -lm` (the generated code calls libm's tanh, erf, log1p). The
header declares, per graph, the entry point, its shape queries and CPU check, with the status
codes and the array sizes as macros; docs/c-abi.md is the contract it implements.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from tlc.codegen.builder import Status
from tlc.codegen.isa_extensions import llvm_features
from tlc.codegen.loader import METADATA_FORMAT, METADATA_SYMBOL
from tlc.codegen.module import (
    GraphModule,
    bakes_payload,
    build_graph_module,
    graph_symbol,
)
from tlc.codegen.objcache import object_codes
from tlc.codegen.runtime import CFLAGS as RUNTIME_CFLAGS
from tlc.codegen.runtime import SOURCE as RUNTIME_SOURCE
from tlc.codegen.target import (
    AARCH64_HWCAPS,
    X86_BASELINE,
    X86_LEVELS,
    Target,
    required_features,
)
from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.dialect.shapes import fmt_shape, numel

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Built:
    library: str
    header: str
    modules: tuple[GraphModule, ...]


def build_library(
    graphs: Sequence[tuple[GraphOp, Payload | None]],
    output: str,
    dtype: type = np.float64,
    *,
    batch: int | None = None,
    runtime_payload: bool = False,
    source: str = "<input>",
    target: Target | None = None,
    progress: Callable[[str], None] | None = None,
) -> Built:
    """Compile `graphs` (each with its payload) into `output` (.so) and the header beside it:
    for `target` alone, or (None) for every CPU level of this architecture. `progress(note)` is
    called after each of the `len(graphs) * len(library_variants(target)) + 1` steps: one
    graph's code for one CPU level, then the link."""
    step = progress or (lambda note: None)
    for graph, _ in graphs:
        if not IDENTIFIER.match(graph.graph_name):
            raise error(
                f"codegen: graph name @{graph.graph_name} is not a C identifier, so it cannot "
                "name an entry point",
                graph,
            )
        if graph_symbol(graph) == METADATA_SYMBOL:
            raise error(
                f"codegen: graph name @{graph.graph_name} is reserved: {METADATA_SYMBOL} is the "
                "library's metadata; rename the graph",
                graph,
            )
    variants = library_variants(target)
    check_library_target(variants[0])
    cc = library_compiler(variants[0])
    modules = []
    header = os.path.splitext(output)[0] + ".h"
    with tempfile.TemporaryDirectory(prefix="tlc-") as tmp:
        objects = []
        bound: dict[str, list[str]] = {}
        for g, p in graphs:
            # A payload over the bake limit goes in a data section of its own, passed by pointer.
            embed = not runtime_payload and not bakes_payload(g, dtype)
            built = [
                build_graph_module(
                    g,
                    p,
                    dtype,
                    batch=batch,
                    runtime_payload=runtime_payload,
                    bound_payload=embed,
                    target=variant,
                    entry_name=variant_symbol(graph_symbol(g), variant),
                    queries=False,
                )  # fmt: skip
                for variant in variants
            ]
            # The levels are compiled at once (worker processes: tlc.codegen.objcache).
            jobs = [(m.ir, v) for m, v in zip(built, variants, strict=True)]
            for obj, variant in zip(object_codes(jobs), variants, strict=True):
                # Not named after the graph: a 250-character name overflows NAME_MAX.
                path = os.path.join(tmp, f"graph{len(objects)}.o")
                with open(path, "wb") as f:
                    f.write(obj)
                objects.append(path)
                step(f"@{g.graph_name} for {variant.describe()}")
            if embed:
                symbol = built[0].symbol
                names, copies = _weights_objects(tmp, symbol, built, variants)
                objects += copies
                bound[symbol] = names
            modules.append(replace(built[-1], bound=None))
            del built, jobs
        dispatch = os.path.join(tmp, "dispatch.c")
        with open(dispatch, "w", encoding="utf-8") as f:
            f.write(render_dispatcher(modules, variants, bound))
            f.write(render_queries(modules))
            f.write(render_metadata(modules))
        command = [cc, "-shared", *RUNTIME_CFLAGS, "-o", output, dispatch, RUNTIME_SOURCE, *objects,
                   "-lm"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiagnosticError.simple(
                f"tlc-compile: linking failed ({' '.join(command)}):\n{done.stderr.strip()}"
            )
        step("linked")
    try:
        with open(header, "w", encoding="utf-8") as f:
            f.write(render_header(modules, os.path.basename(output), source, variants))
    except OSError as exc:
        raise DiagnosticError.simple(f"cannot write '{header}': {exc.strerror}") from None
    return Built(output, header, tuple(modules))


def library_compiler(target: Target) -> str:
    """The C compiler that links a library for `target`: this machine's `cc` for its own
    architecture, else a cross compiler named after the target's architecture, as GNU
    toolchains are (`aarch64-linux-gnu-gcc`: Debian's gcc-aarch64-linux-gnu)."""
    if target.arch == Target().arch:
        found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if found is None:
            raise DiagnosticError.simple(
                "tlc-compile: no C compiler (cc) found to link the library"
            )
        return found
    names = [f"{target.triple}-gcc"] if target.triple else []
    names += [f"{target.arch}-linux-gnu-gcc"]
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    raise DiagnosticError.simple(
        f"tlc-compile: cannot link a library for {target.arch} on this {Target().arch} machine: "
        f"no cross compiler ({' or '.join(dict.fromkeys(names))}) on PATH; tlc-opt --emit asm "
        "or --emit llvm emit code for it"
    )


@cache
def unknown_to_compiler(cc: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The feature names of `names` the C compiler `cc`'s `__builtin_cpu_supports` does not
    know, so that a dispatcher cannot check them. The compiler is asked (`-fsyntax-only` on a
    call per name) rather than a list kept: GCC learns names release by release (GCC 12 has
    no avxneconvert, avx10.2 or apxf; GCC 14 has them). One compile when it knows them all."""

    def known(batch: tuple[str, ...]) -> bool:
        calls = "".join(f' + __builtin_cpu_supports("{name}")' for name in batch)
        source = f"int tlc_probe(void) {{ __builtin_cpu_init(); return 0{calls}; }}\n"
        done = subprocess.run([cc, "-x", "c", "-fsyntax-only", "-"], input=source,
                              capture_output=True, text=True, check=False)  # fmt: skip
        return done.returncode == 0

    if known(names):
        return ()
    return tuple(name for name in names if not known((name,)))


def _weights_objects(
    tmp: str, symbol: str, built: Sequence[GraphModule], variants: Sequence[Target]
) -> tuple[list[str], list[str]]:
    """The payload arrays of a graph's `bound_payload` variants (`GraphModule.bound`: each
    field packed in its layout for that CPU level, so the variant runs the baked build's
    kernels) as assembly files, one per distinct array (x86-64-v2 and the baseline share
    one): per variant the symbol holding its array, and the files."""
    names: list[str] = []
    paths: list[str] = []
    seen: dict[bytes, str] = {}
    for module, variant in zip(built, variants, strict=True):
        assert module.bound is not None, "an embedded payload is a bound_payload build's"
        key = hashlib.blake2b(module.bound.data, digest_size=16).digest()
        if key not in seen:
            seen[key] = f"{symbol}__weights__{variant.tag()}"
            paths.append(_weights_object(tmp, seen[key], module.bound, variant.arch))
        names.append(seen[key])
    return names, paths


def _weights_object(tmp: str, name: str, params: np.ndarray, arch: str) -> str:
    """An assembly file holding `params` as the symbol `name`, in a large data section
    (x86-64's `.lrodata`, placed after everything else) that the dispatcher reaches through
    the GOT: no 32-bit offset spans the weights, however large."""
    data = os.path.join(tmp, f"{name}.bin")
    np.ascontiguousarray(params).tofile(data)
    large = ',"al"' if arch == "x86_64" else ',"a"'
    section = ".lrodata" if arch == "x86_64" else ".rodata"
    path = os.path.join(tmp, f"{name}.s")
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f".section {section}.{name}{large},@progbits\n.p2align 6\n"
            f".globl {name}\n.type {name}, @object\n"
            f'{name}:\n.incbin "{data}"\n.size {name}, {params.nbytes}\n'
            '.section .note.GNU-stack,"",@progbits\n'
        )
    return path


def library_variants(target: Target | None) -> list[Target]:
    """The targets a library holds, best first: `target` alone, or every x86-64 level down to
    the baseline, so that any x86-64 CPU runs it (the `generic` CPU elsewhere)."""
    if target is not None:
        return [target]
    if Target().arch == "x86_64":
        return [Target(level) for level in (*X86_LEVELS, X86_BASELINE)]
    return [Target("generic")]


def variant_symbol(symbol: str, variant: Target) -> str:
    return f"{symbol}__{variant.tag()}"


def render_dispatcher(
    modules: Sequence[GraphModule],
    variants: Sequence[Target],
    bound: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """C source of the public entry points: each checks the CPU (CPUID through libgcc's
    `__builtin_cpu_supports`) and calls the best variant it can run. A graph in `bound` takes
    no params: each of its variants gets the library's own copy packed for it (`bound[symbol]`
    names the copy of each variant, `_weights_objects`)."""
    bound = bound or {}
    needs = [required_features(v) for v in variants]
    x86 = variants[0].arch == "x86_64"
    lines = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        *([] if x86 else ["#include <sys/auxv.h>"]),
        "",
        "/* runtime.c: the thread count calls use (tlc_set_num_threads). */",
        '__attribute__((visibility("hidden"))) int32_t tlc_rt_threads(void);',
        "",
    ]
    for m in modules:
        t = C_TYPES[m.dtype]
        s = m.symbol
        params = [f"const {t} *in", f"{t} *out"]
        variant_params = params
        if m.params is not None or s in bound:
            variant_params = [*params, f"const {t} *params"]
            if s not in bound:
                params = variant_params
        names = [", ".join(p.rsplit("*", 1)[1] for p in params)] * len(variants)
        if s in bound:
            lines += [f"extern const {t} {w}[];" for w in dict.fromkeys(bound[s])]
            names = [f"{n}, {w}" for n, w in zip(names, bound[s], strict=True)]
        for v in variants:
            declared = ", ".join([*variant_params, "int32_t threads"])
            lines.append(f"int {variant_symbol(s, v)}({declared});")
        lines += [
            "",
            f"/* The first feature variant `i` of {s} needs that this CPU lacks, or NULL. */",
            f"static const char *{s}__lacks(int i) {{",
        ]
        if any(needs) and x86:
            lines.append("    __builtin_cpu_init();")
        for i, features in enumerate(needs):
            for feature in features:
                lines.append(f'    if (i == {i} && !{_supports(feature, x86)}) return "{feature}";')
        lines += [
            "    return NULL;",
            "}",
            "",
            f"static int {s}__variant(void) {{",
            f"    for (int i = 0; i < {len(variants)}; i++)",
            f"        if ({s}__lacks(i) == NULL) return i;",
            "    return -1;",
            "}",
            "",
            f"int {s}_cpu_check(const char **missing) {{",
            f"    const char *lacks = {s}__lacks({len(variants) - 1});",
            f"    if ({s}__variant() >= 0) return {Status.OK.value};",
            "    if (missing != NULL) *missing = lacks;",
            f"    return {Status.UNSUPPORTED_CPU.value};",
            "}",
            "",
            f"const char *{s}_cpu_variant(void) {{",
            f"    static const char *const names[] = {{{', '.join(_c_string(v.describe()) for v in variants)}}};",  # noqa: E501
            f"    int i = {s}__variant();",
            "    return i < 0 ? NULL : names[i];",
            "}",
            "",
            f"int {s}({', '.join(params)}) {{",
            f"    switch ({s}__variant()) {{",
        ]
        for i, (v, args) in enumerate(zip(variants, names, strict=True)):
            lines.append(f"    case {i}: return {variant_symbol(s, v)}({args}, tlc_rt_threads());")
        lines += [f"    default: return {Status.UNSUPPORTED_CPU.value};", "    }", "}", ""]
    return "\n".join(lines)


def render_queries(modules: Sequence[GraphModule]) -> str:
    """C source of the public shape queries of `modules` (`_input_rank/_shape`,
    `_output_rank/_shape`, `_scalar_size`, and `_params_size` of an entry taking params),
    compiled with the dispatcher for this architecture's baseline. They are not taken from a
    variant's object: that code is for the variant's CPU (a znver4 library's shape store is an
    AVX move), and a caller asks the queries before, or whatever, the CPU check answers."""
    lines = ["", "/* The shape queries: plain C, callable on any CPU of the architecture. */"]
    for m in modules:
        s = m.symbol
        for which, shape in (("input", m.input_shape), ("output", m.output_shape)):
            lines += [
                f"int {s}_{which}_rank(void) {{ return {len(shape)}; }}",
                f"int {s}_{which}_shape(int64_t *dims) {{",
                f"    if (dims == NULL) return {Status.NULL_POINTER.value};",
                *(f"    dims[{axis}] = {extent};" for axis, extent in enumerate(shape)),
                "    return 0;",
                "}",
            ]
        lines.append(f"int {s}_scalar_size(void) {{ return {m.dtype.itemsize}; }}")
        if m.params is not None:
            lines.append(f"int64_t {s}_params_size(void) {{ return {m.params_size}; }}")
    return "\n".join(lines) + "\n"


def _supports(feature: str, x86: bool) -> str:
    """A C expression: this CPU has LLVM feature `feature` (`check_library_target` admits only
    features it can check): CPUID through libgcc on x86-64, the kernel's HWCAP bits on
    AArch64."""
    if x86:
        return f'__builtin_cpu_supports("{feature}")'
    word, bits = AARCH64_HWCAPS[feature]
    return f"((getauxval({word}) & {bits:#x}UL) == {bits:#x}UL)"


def check_library_target(target: Target) -> None:
    """Refuse a library target whose CPU requirements the library could not check when it
    loads. On x86-64 CPUID tells every level and feature the C compiler linking the library
    knows (`unknown_to_compiler`: GCC 12 has no avxneconvert, avx10.2 or apxf,
    which the newest Intel cores' code uses). Elsewhere a named CPU's extensions
    are not known to tlc (LLVM implies them from the name), so a library is built for the
    architecture's `generic` CPU, with the features AArch64's HWCAP bits tell
    (`AARCH64_HWCAPS`)."""
    if target.arch == "x86_64":
        cc = library_compiler(target)
        cannot = unknown_to_compiler(cc, required_features(target))
        if cannot:
            flags = target.features.split(",")
            kept = [f for f in flags if f and f[1:] not in cannot]
            implied = [name for name in cannot if f"+{name}" not in flags]
            off = [f"-{f}" for name in implied for f in llvm_features(name)]
            fix = ",".join([*kept, *off])
            raise DiagnosticError.simple(
                f"tlc-compile: code for {target.describe()} needs {', '.join(cannot)}, which "
                f"a library cannot check when it loads (the C compiler {os.path.basename(cc)}'s "
                f"__builtin_cpu_supports does not know {'it' if len(cannot) == 1 else 'them'}); "
                f"build with {f'--target-features={fix}' if fix else 'no --target-features'}"
            )
        return
    if target.cpu != "generic":
        raise DiagnosticError.simple(
            f"tlc-compile: a library for {target.arch} is built for --target-cpu generic: the "
            f"extensions {target.cpu} implies cannot be checked when the library loads; name "
            "them with --target-features (tlc-opt --emit asm shows code for any CPU)"
        )
    known = AARCH64_HWCAPS if target.arch == "aarch64" else {}
    for flag in filter(None, target.features.split(",")):
        if flag.startswith("+") and flag[1:] not in known:
            listed = ", ".join(f"+{name}" for name in known) or "none"
            raise DiagnosticError.simple(
                f"tlc-compile: a library for {target.arch} cannot check {flag} when it loads "
                f"(it can check: {listed})"
            )


def library_metadata(modules: Sequence[GraphModule]) -> dict:
    """What `METADATA_SYMBOL` holds: per public entry point its graph, dtype, shapes and, for a
    runtime-payload build, the size of its params array."""
    return {
        "format": METADATA_FORMAT,
        "graphs": [
            {
                "graph": m.symbol.removeprefix("tlc_"),
                "symbol": m.symbol,
                "dtype": m.dtype.name,
                "input_shape": list(m.input_shape),
                "output_shape": list(m.output_shape),
                "params_size": m.params_size if m.params is not None else None,
            }
            for m in modules
        ],
    }


def render_metadata(modules: Sequence[GraphModule]) -> str:
    """C source defining `METADATA_SYMBOL` for the public interface of `modules`."""
    text = json.dumps(library_metadata(modules), separators=(",", ":"))
    return (
        "\n/* The library's own description of its entry points (read by tlc.load). */\n"
        f"const char {METADATA_SYMBOL}[] = {_c_string(text)};\n"
    )


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_header(
    modules: Sequence[GraphModule], library: str, source: str, variants: Sequence[Target]
) -> str:
    guard = re.sub(r"\W", "_", os.path.splitext(library)[0]).upper() + "_H"
    codes = "\n".join(f"#define {status_macro(s)} {s.value}" for s in Status)
    lines = [
        f"/* {os.path.splitext(library)[0]}.h: generated by tlc-compile from {source}.",
        " * The C ABI is described in docs/c-abi.md. Every function is thread-safe and",
        " * re-entrant; the library's only mutable state is its thread pool, its thread",
        " * count and its cache of workspaces, each behind a lock. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        "/* Status codes returned by the entry points. */",
        "#ifndef TLC_STATUS_CODES",
        "#define TLC_STATUS_CODES",
        codes,
        "#endif",
        "",
        "/* Threads the entry points of this library use: n >= 1 sets the count, n <= 0",
        " * restores the default (every CPU the process may run on); returns the count in",
        " * force. Results are identical for any count. */",
        "int tlc_set_num_threads(int n);",
        "int tlc_get_num_threads(void);",
    ]
    built_for = ", ".join(v.describe() for v in variants)
    runs = (
        "Every entry point runs the first of these this CPU supports"
        if len(variants) > 1
        else "Every entry point runs it on a CPU that supports it"
    )
    checks = required_features(variants[0]) if len(variants) == 1 else ()
    lines += [
        "",
        f"/* Built for: {built_for}. {runs},",
        " * or returns TLC_ERR_UNSUPPORTED_CPU without executing anything."
        + (" It checks for:" if checks else " */"),
    ]
    if checks:
        # A named CPU's extensions: the name alone does not say what the library checks.
        text = textwrap.wrap(", ".join(checks) + ". */", 86)
        lines += [f" * {line}" for line in text]
    lines += [
        "",
        "/* The library's description of its entry points, NUL-terminated JSON: per graph",
        " * its name, symbol, dtype, input and output shape and runtime-payload size. */",
        f"extern const char {METADATA_SYMBOL}[];",
    ]
    for m in modules:
        lines += ["", *_declarations(m)]
    lines += ["", "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def status_macro(status: Status) -> str:
    return "TLC_OK" if status is Status.OK else f"TLC_ERR_{status.name}"


def _declarations(m: GraphModule) -> list[str]:
    t = C_TYPES[m.dtype]
    name = m.symbol[len("tlc_") :]
    macro = f"TLC_{name.upper()}"
    params = ", const " + t + " *params" if m.params is not None else ""
    doc = [
        f"/* graph @{name}: input {fmt_shape(m.input_shape)} -> output "
        f"{fmt_shape(m.output_shape)}, {t}, row-major.",
        f" * {m.symbol}(in, out{', params' if params else ''}) reads {numel(m.input_shape)} "
        f"values from in and writes {numel(m.output_shape)} to out; returns TLC_OK or an",
        " * error status (null pointer, log of a value <= 0 or NaN, out of memory).",
    ]
    if m.params is not None:
        doc.append(f" * params: {m.params_size} values, the payload fields in this order:")
        doc += [
            f" *   [{s.offset}] node {s.node} {s.field} {fmt_shape(s.shape)}"
            + (f" (default {s.default:g})" if s.default is not None else "")
            for s in m.params
        ]
    doc.append(" */")
    decls = [
        f"#define {macro}_INPUT_SIZE {numel(m.input_shape)}",
        f"#define {macro}_OUTPUT_SIZE {numel(m.output_shape)}",
        f"int {m.symbol}(const {t} *in, {t} *out{params});",
        f"int {m.symbol}_input_rank(void);",
        f"int {m.symbol}_input_shape(int64_t *dims);",
        f"int {m.symbol}_output_rank(void);",
        f"int {m.symbol}_output_shape(int64_t *dims);",
        f"int {m.symbol}_scalar_size(void); /* sizeof({t}) */",
        f"/* TLC_OK if this CPU can run {m.symbol}; else TLC_ERR_UNSUPPORTED_CPU and, if",
        " * missing is not NULL, *missing names a CPU feature it lacks. */",
        f"int {m.symbol}_cpu_check(const char **missing);",
        '/* The target whose code runs on this CPU ("x86-64-v3", ...), or NULL. */',
        f"const char *{m.symbol}_cpu_variant(void);",
    ]
    if m.params is not None:
        decls += [
            f"#define {macro}_PARAMS_SIZE {m.params_size}",
            f"int64_t {m.symbol}_params_size(void);",
        ]
    return doc + decls
