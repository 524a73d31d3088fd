"""Fuzzing the tools: every input, however malformed, must end in exit 0 or 1 without a traceback.

A case is one tool run (in-process, through the tools' `main`) on one generated input:

- `tlir`, `mlir`: the MLP example (text and MLIR generic form) with random byte mutations and
  integers replaced by boundary values (0, -1, 2^31, 2^63, 4,500 digits), through tlc-opt and
  tlc-run;
- `npz`, `npy`: the MLP's payload and an input array, mutated, as `--payload` / `--input`;
- `onnx`: the MLP exported to ONNX, mutated, through `tlc-translate --import-onnx`;
- `graph`: a random graph whose extents include 0 and huge values, run by tlc-run.

Outcomes: `ok` (exit 0 or 1, no traceback), `traceback` (exit 70 or a traceback printed),
`crash` (any other exit), `hang` (over the time limit). tests/test_fuzz.py runs a few cases per
test run; `python -m tlc.tools.fuzz --cases N --seed S` runs a campaign and prints the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import re
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp.tlir"
X0 = "0.3,-0.2,0.1,0.4"
BOUNDARY_INTS = ["0", "-1", "1", "2147483648", "9223372036854775808", "4611686018427387904",
                 "9" * 4500, "-9223372036854775809"]  # fmt: skip
FORMATS = ("tlir", "mlir", "npz", "npy", "onnx", "graph")


class _Timeout(Exception):
    pass


@dataclass
class Seeds:
    """The valid inputs mutations start from, written once per campaign."""

    tlir: bytes
    mlir: bytes
    npz: bytes
    npy: bytes
    onnx: bytes | None


def make_seeds(directory: Path) -> Seeds:
    from tlc.api.emit import EMITTERS
    from tlc.frontends.text import parse_source

    text = MLP.read_text()
    mlir = EMITTERS["mlir"](parse_source(text, str(MLP)))
    np.save(directory / "x.npy", np.array([0.3, -0.2, 0.1, 0.4]))
    onnx_bytes = None
    with contextlib.suppress(ImportError):
        from tlc.api.evaluate import choose
        from tlc.frontends.export_onnx import to_onnx

        graph, payload = choose(text, None, None)
        onnx_bytes = to_onnx(graph, payload).SerializeToString()
    return Seeds(
        text.encode(),
        mlir.encode(),
        (ROOT / "examples" / "mlp_params.npz").read_bytes(),
        (directory / "x.npy").read_bytes(),
        onnx_bytes,
    )


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A few random edits: byte flips, insertions, deletions, duplicated or truncated spans,
    and (in text) integers swapped for boundary values."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif kind == 1:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 2:
            del out[at : at + rng.randint(1, 16)]
        elif kind == 3:
            span = out[at : at + rng.randint(1, 64)]
            out[at:at] = span * rng.randint(1, 4)
        elif kind == 4:
            del out[rng.randrange(len(out) + 1) :]
        else:
            numbers = list(re.finditer(rb"-?[0-9]+", bytes(out)))
            if numbers:
                m = rng.choice(numbers)
                out[m.start() : m.end()] = rng.choice(BOUNDARY_INTS).encode()
    return bytes(out)


def random_graph(rng: random.Random) -> tuple[str, list[int]]:
    """A small chain over an input whose extents include 0 and huge values; its input shape."""
    extents = [0, 1, 2, 3, 2**31, 2**62]
    shape = [rng.choice(extents) for _ in range(rng.randint(1, 2))]
    input_shape = list(shape)
    lines = [f"  %0 = input : {shape}"]
    current = 0
    for i in range(1, rng.randint(2, 5)):
        op = rng.choice(["relu", "exp", "tanh", "sum", "softmax", "log_softmax", "broadcast_to"])
        if op == "softmax" or op == "log_softmax":
            lines.append(
                f"  %{i} = {op}(%{current}) {{axis = {rng.randrange(max(len(shape), 1))}}}"
            )
        elif op == "broadcast_to":
            to = [rng.choice(extents), *shape]
            lines.append(f"  %{i} = broadcast_to(%{current}) {{from = {shape}, to = {to}}}")
            shape = to
        elif op == "sum":
            lines.append(f"  %{i} = sum(%{current}) : []")
            shape = []
        else:
            lines.append(f"  %{i} = {op}(%{current})")
        current = i
    text = "tl.graph @g {\n" + "\n".join(lines) + f"\n  output %{current}\n}}\n"
    return text, input_shape


def run_case(argv: list[str], tool: Callable[[list[str]], int], limit: float) -> str:
    """Run one tool in-process; the outcome (see the module docstring)."""
    err, out = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = tool(argv)
    except _Timeout:
        return "hang"
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if "Traceback" in err.getvalue() or code == 70:
        return "traceback"
    return "ok" if code in (0, 1, 2) else "crash"


def _alarm(_signum: int, _frame: object) -> None:
    raise _Timeout


def one_case(fmt: str, seeds: Seeds, rng: random.Random, directory: Path, limit: float) -> str:
    """Generate one input of format `fmt` and run the tool that reads it."""
    from tlc.tools.opt import main as opt_main
    from tlc.tools.run import main as run_main
    from tlc.tools.translate import main as translate_main

    if fmt in ("tlir", "mlir"):
        path = directory / f"case.{fmt}"
        path.write_bytes(mutate(getattr(seeds, fmt), rng))
        if rng.random() < 0.5:
            return run_case([str(path)], opt_main, limit)
        return run_case([str(path), "--input", X0], run_main, limit)
    if fmt == "npz":
        path = directory / "case.npz"
        path.write_bytes(mutate(seeds.npz, rng))
        return run_case([str(MLP), "--input", X0, "--payload", str(path)], run_main, limit)
    if fmt == "npy":
        path = directory / "case.npy"
        path.write_bytes(mutate(seeds.npy, rng))
        return run_case([str(MLP), "--input", str(path)], run_main, limit)
    if fmt == "onnx":
        if seeds.onnx is None:
            return "ok"
        path = directory / "case.onnx"
        path.write_bytes(mutate(seeds.onnx, rng))
        return run_case(["--import-onnx", str(path)], translate_main, limit)
    text, shape = random_graph(rng)
    path = directory / "case.tlir"
    path.write_text(text)
    values = "0"  # a huge input cannot be given; the graph is refused before it is read
    if max(shape, default=0) <= 64 and int(np.prod(shape, dtype=object)) <= 64:
        values = str(directory / "input.npy")
        np.save(values, np.full(shape, rng.uniform(-2, 2)))
    arithmetic = rng.choice(["f64", "f32", "interval"])
    return run_case([str(path), "--input", values, "--arithmetic", arithmetic], run_main, limit)


def campaign(cases: int, seed: int, limit: float = 20.0) -> Counter[str]:
    """`cases` cases over all formats in turn; the outcome counts (and per-format failures)."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="tlc-fuzz-") as tmp:
        directory = Path(tmp)
        seeds = make_seeds(directory)
        for i in range(cases):
            fmt = FORMATS[i % len(FORMATS)]
            outcome = one_case(fmt, seeds, rng, directory, limit)
            counts[outcome] += 1
            if outcome != "ok":
                counts[f"{outcome}:{fmt}"] += 1
                kept = Path(os.environ.get("TLC_FUZZ_KEEP", tmp))
                if kept != directory:
                    kept.mkdir(parents=True, exist_ok=True)
                    for f in directory.glob("case.*"):
                        (kept / f"{i}-{f.name}").write_bytes(f.read_bytes())
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tlc.tools.fuzz", description=__doc__.splitlines()[0]
    )
    p.add_argument("--cases", type=int, default=600, help="number of cases (default 600)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per case (default 20)")
    args = p.parse_args(argv)
    counts = campaign(args.cases, args.seed, args.timeout)
    print(
        f"cases {args.cases}, tracebacks {counts['traceback']}, crashes {counts['crash']}, "
        f"hangs {counts['hang']}"
    )
    for key in sorted(k for k in counts if ":" in k):
        print(f"  {key}: {counts[key]}")
    return 0 if counts["ok"] == args.cases else 1


if __name__ == "__main__":
    sys.exit(main())
