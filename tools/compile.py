"""tlc-compile: compile the graphs of a .tlir document into a shared library and a C header.

    tlc-compile FILE [--payload P.npz] [--graph @g] [--dtype f32|f64] [--batch N]
                [--runtime-payload] [--target-cpu CPU] [--target-features +F,-G]
                [--target-triple T] -o libNAME.so

Writes libNAME.so and libNAME.h beside it (the C ABI is docs/c-abi.md): per graph
`int tlc_<graph>(const T *in, T *out)` and its shape queries. Every graph of the document is
compiled unless `--graph` picks one; each uses the document's inline payload unless `--payload`
names an .npz file (then exactly one graph must be chosen). `--batch N` builds an entry that
maps a single-example graph over a leading axis of N; `--runtime-payload` takes the parameters
as a third argument instead of baking them in. By default the library holds code for every
x86-64 level (v2, v3/AVX2, v4/AVX-512) and picks one per CPU at call time; `--target-cpu` and
`--target-features` build for exactly that target (the library then refuses other CPUs with
TLC_ERR_UNSUPPORTED_CPU). The library runs its parallel regions on `tlc_set_num_threads(n)`
threads (default: every CPU the process may run on), with the same results for any count.
Exit codes: 0 success, 1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tlc.api.evaluate import checked_graph, resolve_payload
from tlc.codegen.shared_lib import build_library, library_variants
from tlc.codegen.target import target_from_options
from tlc.core.diagnostics import DiagnosticError, SourceManager
from tlc.core.limits import MAX_BYTES
from tlc.core.progress import Progress
from tlc.dialect.ops import GraphOp
from tlc.frontends.text import parse_source
from tlc.tools.common import add_target_options, read_input, run_tool, tool_parser

DTYPES = {"f32": np.float32, "f64": np.float64}


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"batch size must be positive, got {value}")
    if value > MAX_BYTES:  # the entry's row counter is a signed 64-bit integer
        raise argparse.ArgumentTypeError(f"batch size {value} is too large (at most 2^62)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("tlc-compile", __doc__)
    p.add_argument("input_file", metavar="FILE", help="the .tlir document, - for stdin")
    p.add_argument("-o", dest="output", required=True, metavar="libNAME.so", help="library path")
    p.add_argument("--payload", metavar="P.npz", help="payload file (default: inline tl.payload)")
    p.add_argument("--graph", metavar="@NAME", help="compile only this graph")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                   help="scalar type (default f32, as tlc.compile)")  # fmt: skip
    p.add_argument(
        "--batch",
        type=positive,
        metavar="N",
        help="map a single-example graph over a leading batch axis of N, or fix the batch "
        "extent N of a graph that declares one",
    )
    p.add_argument(
        "--runtime-payload",
        action="store_true",
        help="take the parameters at call time instead of baking them in",
    )
    add_target_options(p, "default: every x86-64 level, chosen at load time")
    return p


def main(argv: list[str] | None = None) -> int:
    sources = SourceManager()
    return run_tool(lambda: _main(argv, sources), "tlc-compile", sources)


def _main(argv: list[str] | None, sources: SourceManager) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not args.output.endswith(".so"):
        raise DiagnosticError.simple(f"tlc-compile: output '{args.output}' must end in .so")
    target = target_from_options(args)
    name, text = read_input(args.input_file)
    sources.add(name, text)
    module = parse_source(text, name)
    names = (
        [args.graph]
        if args.graph is not None
        else [op.graph_name for op in module.walk() if isinstance(op, GraphOp)]
    )
    if not names:
        raise DiagnosticError.simple(
            f"tlc-compile: '{name}' holds no tl.graph to compile"
            " (a tl.program must be lowered first: tlc-opt -p lower-program)"
        )
    graphs = [checked_graph(module, n) for n in names]
    if args.payload is not None and len(graphs) != 1:
        raise DiagnosticError.simple(
            f"--payload gives one graph's parameters, but the document has {len(graphs)} "
            "graphs: choose one with --graph @name"
        )
    jobs = [(g, resolve_payload(module, g, args.payload)) for g in graphs]
    steps = len(jobs) * len(library_variants(target)) + 1
    # a bar on a terminal only: stderr off one holds just the line below
    with Progress(steps, "compiling", summary=False, transient=True) as bar:
        built = build_library(
            jobs,
            args.output,
            DTYPES[args.dtype],
            batch=args.batch,
            runtime_payload=args.runtime_payload,
            source=name,
            target=target,
            progress=bar.advance,
        )
    print(f"wrote {built.library} and {built.header}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
