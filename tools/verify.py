"""tlc-verify: decide VNN-LIB properties of ONNX or tl networks (VNN-COMP's result contract).

    tlc-verify NET.onnx|NET.tlir PROP.vnnlib [--timeout S] [--arithmetic f64|f32] [-o RESULT]
    tlc-verify --instances FILE.csv [--workers N | --ray ADDRESS] [--results OUT.csv]

One instance prints `sat` with the counterexample `((X_0 v) ... (Y_0 v) ...)`, `unsat`,
`unknown` or `timeout` (docs/verification.md). `--instances` reads VNN-COMP's csv (rows
`onnx,vnnlib,timeout`, paths relative to the csv), runs the instances on `--workers` local
processes or as tasks of the Ray cluster at `--ray ADDRESS` (the optional extra `tlc[ray]`),
shows a progress bar on stderr when it is a terminal and writes `onnx,vnnlib,result,seconds`
rows to `--results` (default stdout).
Exit codes: 0 a result (whatever it is), 1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed

from tlc.api.verify import Network, Verdict, check_sizes, verify
from tlc.core.diagnostics import DiagnosticError, SourceManager, error
from tlc.core.progress import Progress
from tlc.tools.common import read_input, run_tool, tool_parser, write_output

ARITHMETIC = {"f64": "f64", "f32": "f32"}


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("tlc-verify", __doc__)
    p.add_argument("network", nargs="?", help="the network: .onnx, or a .tlir/.mlir document")
    p.add_argument("property", nargs="?", help="the VNN-LIB property")
    p.add_argument(
        "--instances", metavar="FILE.csv", help="VNN-COMP instances: onnx,vnnlib,timeout"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per instance (default 60)")
    p.add_argument("--arithmetic", choices=tuple(ARITHMETIC), default="f64",
                   help="the network's scalar type for bounds and counterexamples")  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="parallel processes for --instances")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run --instances on the Ray cluster at ADDRESS (host:port, or auto)",
    )
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


Job = tuple[str, str, float, str]


def run_instances(args: argparse.Namespace) -> int:
    rows = read_instances(args.instances)
    jobs = [(onnx, prop, timeout, args.arithmetic) for onnx, prop, timeout in rows]
    results: list[tuple[str, float] | None] = [None] * len(rows)
    finished = _on_ray(args.ray, jobs) if args.ray else _on_processes(args.workers, jobs)
    with Progress(len(rows), "instances") as bar:
        for i, result in finished:
            results[i] = result
            bar.advance(f"{os.path.basename(rows[i][1])}: {result[0]}")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for (onnx, prop, _), (result, seconds) in zip(rows, results, strict=True):  # type: ignore[misc]
        writer.writerow([os.path.relpath(onnx), os.path.relpath(prop), result, f"{seconds:.3f}"])
    write_output(args.results, out.getvalue())
    return 0


def _on_processes(workers: int, jobs: list[Job]) -> Iterator[tuple[int, tuple[str, float]]]:
    """(index, result) of each job as it finishes, on `workers` local processes."""
    with ProcessPoolExecutor(max_workers=max(workers, 1)) as pool:
        futures = {pool.submit(_instance_row, *job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _on_ray(address: str, jobs: list[Job]) -> Iterator[tuple[int, tuple[str, float]]]:
    """(index, result) of each job as it finishes, each job a task of the Ray cluster at
    `address` (its workers import tlc: the cluster runs this environment)."""
    try:
        import ray
    except ImportError:
        raise DiagnosticError.simple(
            "--ray needs Ray, which is not installed (pip install 'tlc[ray]')"
        ) from None
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise DiagnosticError.simple(f"--ray {address}: cannot connect: {exc}") from None
    try:
        task = ray.remote(_instance_row)
        pending = {task.remote(*job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sources = SourceManager()

    def body() -> int:
        if args.timeout <= 0:
            raise DiagnosticError.simple(f"--timeout must be > 0, got {args.timeout}")
        if args.instances:
            if args.network or args.property:
                raise DiagnosticError.simple("--instances takes no NET and PROP arguments")
            if args.ray and args.workers != 1:
                raise DiagnosticError.simple("--ray runs on the cluster's workers: no --workers")
            return run_instances(args)
        if args.ray:
            raise DiagnosticError.simple("--ray runs --instances FILE.csv")
        if not (args.network and args.property):
            raise DiagnosticError.simple("give NET and PROP, or --instances FILE.csv")
        verdict = run_instance(args.network, args.property, args.timeout, args.arithmetic, sources)
        write_output(args.output, verdict.text())
        return 0

    return run_tool(body, "tlc-verify", sources)


if __name__ == "__main__":
    sys.exit(main())
