"""tlc-opt: parse a .tlir/.mlir document, run a pass pipeline, print the result.

MLIR's conventions: `-p`/`--pass-pipeline`, per-pass flags, `--split-input-file`,
`--verify-diagnostics`, `--print-ir-after-all`, `--timing`. Exit codes: 0 success,
1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.diagnostics import Diagnostic, DiagnosticError, SourceManager
from tlc.emit import EMITTERS
from tlc.frontend import context, parse_source
from tlc.pass_registry import PASSES, build_pipeline
from tlc.tools.common import read_input, run_tool, write_output
from tlc.tools.verify_diagnostics import check_expectations

SPLIT_MARKER = "// -----"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tlc-opt", description=__doc__.splitlines()[0])
    p.add_argument("input", nargs="?", default="-", help="input file (.tlir or .mlir), - for stdin")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument("-p", dest="pipeline", help="pass pipeline, e.g. 'verify-structure,infer-shapes'")
    p.add_argument("--pass-pipeline", dest="pass_pipeline", help="builtin.module(a,b{opt=1})")
    for name in PASSES:
        p.add_argument(
            f"--{name}", dest=f"pass:{name}", nargs="?", const="", default=None,
            metavar="OPTIONS", help=f"run the {name} pass (options as 'k=v k2=v2')",
        )  # fmt: skip
    p.add_argument("--emit", choices=sorted(EMITTERS), default="tlir", help="output format")
    p.add_argument("--mlir-input", action="store_true", help="read the input as MLIR generic form")
    p.add_argument("--split-input-file", action="store_true", help="split the input on '// -----'")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics against expected-error annotations")  # fmt: skip
    p.add_argument("--print-ir-after-all", action="store_true", help="print IR after each pass")
    p.add_argument("--timing", action="store_true", help="report wall time per pass")
    p.add_argument("--dump-pass-pipeline", action="store_true", help="print the pipeline")
    return p


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
    emit: str,
) -> None:
    for pass_ in passes:
        start = time.perf_counter()
        pass_.apply(context(), module)
        if timings is not None:
            timings.append((pass_.name, time.perf_counter() - start))
        if print_after:
            spec = str(pass_.pipeline_pass_spec())
            sys.stderr.write(f"// -----// IR Dump After {type(pass_).__name__} ({spec}) //----- //\n")
            sys.stderr.write(EMITTERS["tlir"](module))


def print_timing(timings: list[tuple[str, float]]) -> None:
    total = sum(t for _, t in timings) or 1e-12
    err = sys.stderr.write
    err("===" + "-" * 73 + "===\n")
    err("  ... Execution time report ...".ljust(79) + "\n")
    err("===" + "-" * 73 + "===\n")
    err(f"  Total Execution Time: {total:.4f} seconds\n\n")
    err("  ----Wall Time----  ----Name----\n")
    for name, t in timings:
        err(f"    {t:.4f} ({100 * t / total:5.1f}%)  {name}\n")
    err(f"    {total:.4f} (100.0%)  Total\n")


def main(argv: list[str] | None = None) -> int:
    return run_tool(lambda: _main(argv), "tlc-opt")


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        text_pipeline = pipeline_text(args, argv)
    except UsageError as exc:
        parser.error(str(exc))
    sources = SourceManager()
    name, text = read_input(args.input)
    sources.add(name, text)
    passes = build_pipeline(text_pipeline) if text_pipeline else []
    if args.dump_pass_pipeline:
        specs = ",".join(str(p.pipeline_pass_spec()) for p in passes)
        sys.stderr.write(f"Pass Manager with {len(passes)} passes:\nbuiltin.module({specs})\n")
    mlir = True if args.mlir_input else None
    outputs: list[str] = []
    status = 0
    timings: list[tuple[str, float]] | None = [] if args.timing else None
    for chunk in split_chunks(text, args.split_input_file):
        emitted: list[Diagnostic] = []
        try:
            module = parse_source(chunk.text, name, chunk.line_offset, mlir=mlir)
            run_passes(module, passes, args.print_ir_after_all, timings, args.emit)
            outputs.append(EMITTERS[args.emit](module))
        except DiagnosticError as exc:
            emitted = exc.diagnostics
        if args.verify_diagnostics:
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
    if status == 0 or args.verify_diagnostics:
        write_output(args.output, ("// -----\n").join(outputs))
    return status
