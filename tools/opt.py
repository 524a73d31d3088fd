"""tlc-opt: parse a .tlir/.mlir document, run a pass pipeline, print the result.

MLIR's conventions: `-p`/`--pass-pipeline`, per-pass flags, `--split-input-file`,
`--verify-diagnostics`, `--print-ir-after-all`, `--timing` (also spelt `--mlir-print-ir-after-all`,
`--mlir-timing`), `--mlir-print-debuginfo`; `--emit llvm|asm` compiles in f32 like all compiled
code (`--dtype f64` for double). Exit codes: 0 success,
1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tlc.api.emit import EMITTERS
from tlc.core.diagnostics import Diagnostic, DiagnosticError, SourceManager
from tlc.frontends.text import context, parse_source
from tlc.passes.registry import PASSES, build_pipeline
from tlc.tools.common import (
    add_target_options,
    read_input,
    run_tool,
    target_options_given,
    tool_parser,
    write_output,
)

if TYPE_CHECKING:  # for annotations only: start-up time (a pass pipeline imports them itself)
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.passes import ModulePass

SPLIT_MARKER = "// -----"


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("tlc-opt", __doc__)
    p.add_argument("input", nargs="?", default="-", help="input file (.tlir or .mlir), - for stdin")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument(
        "-p",
        dest="pipeline",
        help="pass pipeline, e.g. 'verify-structure,infer-shapes{fill=false}'",
    )
    p.add_argument("--pass-pipeline", dest="pass_pipeline", help="builtin.module(a,b{opt=1})")
    for name in PASSES:
        p.add_argument(
            f"--{name}", dest=f"pass:{name}", nargs="?", const="", default=None,
            metavar="OPTIONS", help=f"run the {name} pass (options as 'k=v k2=v2')",
        )  # fmt: skip
    p.add_argument("--emit", choices=sorted({*EMITTERS, *TARGET_EMITS}), default="tlir",
                   help="output format")  # fmt: skip
    p.add_argument("--mlir-input", action="store_true", help="read the input as MLIR generic form")
    p.add_argument("--split-input-file", action="store_true", help="split the input on '// -----'")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics against expected-error annotations")  # fmt: skip
    # mlir-opt spells these with an `--mlir-` prefix; both spellings work.
    p.add_argument("--print-ir-after-all", "--mlir-print-ir-after-all", action="store_true",
                   help="print IR after each pass")  # fmt: skip
    p.add_argument("--timing", "--mlir-timing", action="store_true",
                   help="report wall time per pass")  # fmt: skip
    p.add_argument("--mlir-print-debuginfo", dest="debuginfo", action="store_true",
                   help="with --emit mlir: print each op's loc(\"file\":line:col)")  # fmt: skip
    p.add_argument("--dump-pass-pipeline", action="store_true", help="print the pipeline")
    p.add_argument("--render", metavar="FILE.{svg,png,pdf}",
                   help="also draw the graph with GraphViz's dot into FILE")  # fmt: skip
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="scalar type of --emit llvm and asm (default f32)")  # fmt: skip
    add_target_options(p, "default: host; for --emit llvm and asm")
    return p


#: Emitters that compile to native code for a target: (kind, the scalar type the spelling
#: fixes, None for --dtype's). `llvm-f32` / `asm-f32` are the older spellings of `--dtype f32`.
TARGET_EMITS = {
    "llvm": ("llvm", None),
    "llvm-f32": ("llvm", "f32"),
    "asm": ("asm", None),
    "asm-f32": ("asm", "f32"),
}
DTYPES = {"f32": "float32", "f64": "float64"}


def emitter(args: argparse.Namespace) -> Callable[[ModuleOp], str]:
    """The output format; llvm and asm compile for the --target-* options (default host)."""
    target = None
    if target_options_given(args):  # LLVM loads only when it is needed
        from tlc.codegen.target import target_from_options

        target = target_from_options(args)
    if args.emit not in TARGET_EMITS:
        if target is not None:
            raise UsageError("--target-* options need --emit llvm or --emit asm")
        if args.dtype is not None:
            raise UsageError("--dtype needs --emit llvm or --emit asm")
        return _mlir_with_locations if args.debuginfo else EMITTERS[args.emit]
    kind, fixed = TARGET_EMITS[args.emit]
    if fixed is not None and args.dtype not in (None, fixed):
        raise UsageError(f"--emit {args.emit} is --emit {kind} --dtype {fixed}; for "
                         f"{args.dtype} code use --emit {kind} --dtype {args.dtype}")  # fmt: skip
    dtype = DTYPES[fixed or args.dtype or "f32"]

    def emit(module: ModuleOp) -> str:
        import numpy as np

        from tlc.codegen.module import optimized_ir, target_assembly
        from tlc.codegen.target import Target

        render = optimized_ir if kind == "llvm" else target_assembly
        return render(module, np.dtype(dtype).type, target or Target())

    return emit


def pipeline_text(args: argparse.Namespace, argv_order: list[str]) -> str:
    flags = [(name, getattr(args, f"pass:{name}")) for name in PASSES]
    chosen = [(n, opts) for n, opts in flags if opts is not None]
    given = [x for x in (args.pipeline, args.pass_pipeline) if x is not None]
    if len(given) + (1 if chosen else 0) > 1:
        raise UsageError("-p, --pass-pipeline and per-pass flags cannot be combined")
    if given:
        return given[0]
    # Per-pass flags run in command-line order.
    chosen.sort(key=lambda item: _flag_position(argv_order, item[0]))
    return ",".join(f"{n}{{{opts}}}" if opts else n for n, opts in chosen)


def _flag_position(argv: list[str], name: str) -> int:
    return next(i for i, a in enumerate(argv) if a == f"--{name}" or a.startswith(f"--{name}="))


class UsageError(Exception):
    """Bad command line (exit code 2)."""


@dataclass
class Chunk:
    text: str
    line_offset: int


def split_chunks(text: str, split: bool) -> list[Chunk]:
    if not split:
        return [Chunk(text, 0)]
    chunks, current, start = [], [], 0
    for i, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == SPLIT_MARKER:
            chunks.append(Chunk("".join(current), start))
            current, start = [], i + 1
        else:
            current.append(line)
    chunks.append(Chunk("".join(current), start))
    return chunks


def run_passes(
    module: ModuleOp,
    passes: list[ModulePass],
    print_after: bool,
    timings: list[tuple[str, float]] | None,
) -> None:
    ctx = context()
    for pass_ in passes:
        with _timed(timings, pass_.name):
            pass_.apply(ctx, module)
        if print_after:
            spec, title = pass_.pipeline_pass_spec(), type(pass_).__name__
            sys.stderr.write(f"// -----// IR Dump After {title} ({spec}) //----- //\n")
            sys.stderr.write(EMITTERS["tlir"](module))


def print_timing(timings: list[tuple[str, float]]) -> None:
    """MLIR's `--mlir-timing` report: wall time of parsing, each pass and output, in order."""
    merged: dict[str, float] = {}
    for name, t in timings:
        merged[name] = merged.get(name, 0.0) + t
    total = sum(merged.values()) or 1e-12
    err = sys.stderr.write
    err("===" + "-" * 73 + "===\n")
    err("... Execution time report ...".center(79).rstrip() + "\n")
    err("===" + "-" * 73 + "===\n")
    err(f"  Total Execution Time: {total:.4f} seconds\n\n")
    err("  ----Wall Time----  ----Name----\n")
    for name, t in merged.items():
        err(f"    {t:.4f} ({100 * t / total:5.1f}%)  {name}\n")
    err(f"    {total:.4f} (100.0%)  Total\n")


def main(argv: list[str] | None = None) -> int:
    return run_tool(lambda: _main(argv), "tlc-opt")


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, pipeline_text(args, argv))
    except UsageError as exc:
        parser.error(str(exc))


def _run(args: argparse.Namespace, text_pipeline: str) -> int:
    if args.debuginfo and args.emit != "mlir":
        raise UsageError("--mlir-print-debuginfo applies to --emit mlir")
    if args.render and args.split_input_file:
        raise UsageError("--render cannot be combined with --split-input-file")
    if args.render and Path(args.render).suffix.lstrip(".").lower() not in RENDER_FORMATS:
        raise UsageError(
            f"--render: unsupported format of '{args.render}' (use .svg, .png or .pdf)"
        )
    sources = SourceManager()
    name, text = read_input(args.input)
    sources.add(name, text)
    emit = emitter(args)
    passes = build_pipeline(text_pipeline) if text_pipeline else []
    if args.dump_pass_pipeline:
        specs = ",".join(str(p.pipeline_pass_spec(include_default=True)) for p in passes)
        sys.stderr.write(f"Pass Manager with {len(passes)} passes:\nbuiltin.module({specs})\n")
    mlir = True if args.mlir_input else None
    outputs: list[str] = []
    status = 0
    timings: list[tuple[str, float]] | None = [] if args.timing else None
    for chunk in split_chunks(text, args.split_input_file):
        emitted: list[Diagnostic] = []
        try:
            with _timed(timings, "Parser"):
                module = parse_source(chunk.text, name, chunk.line_offset, mlir=mlir)
            run_passes(module, passes, args.print_ir_after_all, timings)
            with _timed(timings, "Output"):
                outputs.append(emit(module))
            if args.render:
                render_dot(EMITTERS["dot"](module), args.render)
        except DiagnosticError as exc:
            emitted = exc.diagnostics
        if args.verify_diagnostics:
            from tlc.tools.verify_diagnostics import check_expectations

            failures = check_expectations(chunk.text, chunk.line_offset, name, emitted)
            for failure in failures:
                sys.stderr.write(sources.render(failure) + "\n")
            status = max(status, 1 if failures else 0)
        elif emitted:
            for diag in emitted:
                sys.stderr.write(sources.render(diag) + "\n")
            status = 1
    if timings is not None:
        print_timing(timings)
    # Like mlir-opt: with --split-input-file the chunks that succeeded are still printed, but
    # never over the input itself (`-o INPUT` would replace the source by the chunks that
    # passed, losing the failing ones).
    partial = status != 0 and not args.verify_diagnostics
    if partial and _same_file(args.output, args.input):
        sys.stderr.write(
            f"error: not writing the output of the chunks that passed over the input "
            f"'{args.input}'\n"
        )
    elif status == 0 or args.verify_diagnostics or args.split_input_file:
        write_output(args.output, ("// -----\n").join(outputs))
    return status


def _mlir_with_locations(module: ModuleOp) -> str:
    from tlc.dialect.printer import print_mlir_op

    return print_mlir_op(module, debuginfo=True)


def _same_file(a: str, b: str) -> bool:
    try:
        return a != "-" and b != "-" and os.path.samefile(a, b)
    except OSError:
        return False


@contextmanager
def _timed(timings: list[tuple[str, float]] | None, name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    if timings is not None:
        timings.append((name, time.perf_counter() - start))


def render_dot(dot_text: str, path: str) -> None:
    """Draw `dot_text` into `path` with GraphViz, the format taken from the file's suffix."""
    import shutil
    import subprocess  # only here: start-up time

    fmt = Path(path).suffix.lstrip(".").lower()
    dot = shutil.which("dot")
    if dot is None:
        raise DiagnosticError.simple(
            f"cannot render '{path}': GraphViz 'dot' was not found on PATH (install graphviz)"
        )
    proc = subprocess.run(
        [dot, f"-T{fmt}", "-o", path], input=dot_text, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise DiagnosticError.simple(f"cannot render '{path}': dot: {proc.stderr.strip()}")


RENDER_FORMATS = ("svg", "png", "pdf")
