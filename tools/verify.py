"""tlc-verify: decide VNN-LIB properties of ONNX or tl networks (VNN-COMP's result contract).

    tlc-verify NET.onnx|NET.tlir PROP.vnnlib [--timeout S] [--arithmetic f64|f32] [-o RESULT]
    tlc-verify --instances FILE.csv [--workers N] [--results OUT.csv]

One instance prints `sat` with the counterexample `((X_0 v) ... (Y_0 v) ...)`, `unsat`,
`unknown` or `timeout` (docs/verification.md). `--instances` reads VNN-COMP's csv (rows
`onnx,vnnlib,timeout`, paths relative to the csv), runs the instances on `--workers` local
processes, shows progress on stderr and writes `onnx,vnnlib,result,seconds` rows to
`--results` (default stdout).
Exit codes: 0 a result (whatever it is), 1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tlc.api.verify import Network, Verdict, check_sizes, verify
from tlc.core.diagnostics import DiagnosticError, SourceManager, error
from tlc.tools.common import read_input, run_tool, write_output

ARITHMETIC = {"f64": "f64", "f32": "f32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tlc-verify", description=__doc__.splitlines()[0])
    p.add_argument("network", nargs="?", help="the network: .onnx, or a .tlir/.mlir document")
    p.add_argument("property", nargs="?", help="the VNN-LIB property")
    p.add_argument(
        "--instances", metavar="FILE.csv", help="VNN-COMP instances: onnx,vnnlib,timeout"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per instance (default 60)")
    p.add_argument("--arithmetic", choices=tuple(ARITHMETIC), default="f64",
                   help="the network's scalar type for bounds and counterexamples")  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="parallel processes for --instances")
    p.add_argument("--results", default="-", help="results csv for --instances (default stdout)")
    p.add_argument("-o", dest="output", default="-", help="result file (default stdout)")
    return p


def load_network(path: str, arithmetic: str, sources: SourceManager) -> Network:
    """Import an ONNX model or read a tl document; prepare bounds, evaluation and payload."""
    from tlc.api.bounds import prepared_bounds
    from tlc.api.evaluate import choose, dtype_of
    from tlc.semantics.interpret import prepare

    if path.endswith(".onnx"):
        from tlc.frontends.import_onnx import from_onnx

        if not os.path.exists(path):
            raise DiagnosticError.simple(f"cannot read '{path}': No such file or directory")
        traced = from_onnx(path)
        graph, payload = traced.graph, traced.payload
    else:
        from tlc.frontends.text import parse_source

        name, text = read_input(path)
        sources.add(name, text)
        graph, payload = choose(parse_source(text, name), None, None)
    bounds = prepared_bounds(graph, payload, dtype=arithmetic)
    return Network(bounds, prepare(graph, payload, dtype_of(arithmetic)), payload)


def run_instance(
    network: str, prop: str, timeout: float, arithmetic: str, sources: SourceManager | None = None
) -> Verdict:
    """Load, check sizes and verify one instance (raises DiagnosticError for bad files; their
    texts go to `sources` for the diagnostics' source lines)."""
    from tlc.frontends.vnnlib import parse_vnnlib

    sources = sources or SourceManager()
    net = load_network(network, arithmetic, sources)
    name, text = read_input(prop)
    sources.add(name, text)
    parsed = parse_vnnlib(text, name)
    check_sizes(net, parsed, network, prop)
    return verify(net, parsed, timeout)


def _instance_row(network: str, prop: str, timeout: float, arithmetic: str) -> tuple[str, float]:
    """(result, seconds) for the csv; a bad file is reported as `error: message`."""
    start = time.monotonic()
    try:
        verdict = run_instance(network, prop, timeout, arithmetic)
    except DiagnosticError as exc:
        return "error: " + "; ".join(d.message for d in exc.diagnostics), 0.0
    return verdict.result, time.monotonic() - start


def read_instances(path: str) -> list[tuple[str, str, float]]:
    """The csv's rows as (onnx path, vnnlib path, timeout), paths relative to the csv."""
    name, text = read_input(path)
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3:
            raise error(f"expected 3 columns (onnx,vnnlib,timeout), got {len(row)}",
                        _at(name, number))  # fmt: skip
        try:
            timeout = float(row[2])
        except ValueError:
            raise error(f"timeout {row[2].strip()!r} is not a number", _at(name, number)) from None
        rows.append(
            (os.path.join(base, row[0].strip()), os.path.join(base, row[1].strip()), timeout)
        )
    return rows


def _at(name: str, line: int):  # noqa: ANN202
    from tlc.core.diagnostics import Location

    return Location(name, line, 1)


def run_instances(args: argparse.Namespace) -> int:
    rows = read_instances(args.instances)
    results: list[tuple[str, float] | None] = [None] * len(rows)
    progress = _progress(len(rows))
    with ProcessPoolExecutor(max_workers=max(args.workers, 1)) as pool:
        futures = {
            pool.submit(_instance_row, onnx, prop, timeout, args.arithmetic): i
            for i, (onnx, prop, timeout) in enumerate(rows)
        }
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            progress(rows[i], results[i])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for (onnx, prop, _), (result, seconds) in zip(rows, results, strict=True):  # type: ignore[misc]
        writer.writerow([os.path.relpath(onnx), os.path.relpath(prop), result, f"{seconds:.3f}"])
    write_output(args.results, out.getvalue())
    return 0


def _progress(total: int):  # noqa: ANN202
    """A tqdm bar on stderr when tqdm is installed, else one line per finished instance."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    count = 0
    bar = tqdm(total=total, file=sys.stderr, unit="instance") if tqdm else None

    def update(row: tuple[str, str, float], result: tuple[str, float]) -> None:
        nonlocal count
        count += 1
        if bar is not None:
            bar.update(1)
            if count == total:
                bar.close()
            return
        name = f"{os.path.basename(row[0])} {os.path.basename(row[1])}"
        sys.stderr.write(f"[{count}/{total}] {name}: {result[0]} ({result[1]:.2f} s)\n")

    return update


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sources = SourceManager()

    def body() -> int:
        if args.timeout <= 0:
            raise DiagnosticError.simple(f"--timeout must be > 0, got {args.timeout}")
        if args.instances:
            if args.network or args.property:
                raise DiagnosticError.simple("--instances takes no NET and PROP arguments")
            return run_instances(args)
        if not (args.network and args.property):
            raise DiagnosticError.simple("give NET and PROP, or --instances FILE.csv")
        verdict = run_instance(args.network, args.property, args.timeout, args.arithmetic, sources)
        write_output(args.output, verdict.text())
        return 0

    return run_tool(body, "tlc-verify", sources)


if __name__ == "__main__":
    sys.exit(main())
