"""Fuzzing the tools and compiled libraries: however malformed the input, every tool run must
end in exit 0 or 1 without a traceback, and no call into a compiled library may crash.

Cases run in a child process (a worker, `python -m tlc.tools.fuzz --worker`), one at a time, so
that a segfault or an abort in compiled code, in LLVM or in a C extension is seen and counted
instead of ending the campaign: the worker is restarted and the campaign goes on. The formats:

- `tlir`, `mlir`: the MLP example (text and MLIR generic form) with random byte mutations and
  integers replaced by boundary values (0, -1, 2^31, 2^63, 4,500 digits), through tlc-opt,
  tlc-run, tlc-translate and tlc-compile;
- `traced`: the document `Traced.save` writes for the MLP with a `tl.params` binding of dotted
  source names (`%2.0.weight`), mutated, through the same tools (tlc-run with and without
  `--params` by those names);
- `npz`, `npy`, `params`: the MLP's payload, an input array and parameters by name (the MLP
  program's, or the traced MLP's dotted ones), mutated, as `--payload` / `--input` /
  `--params` of tlc-run;
- `onnx`: the MLP exported to ONNX, mutated (bytes, or `mutate_onnx`'s structural edits),
  through `tlc-translate --import-onnx`;
- `vnnlib`: a property of the MLP, mutated, through tlc-verify;
- `box`: tlc-run's box options (`--radius`, `--lo`/`--hi`, `--method`, `--spec`, `--samples`,
  `--digits`) drawn at random, values of any shape, dtype and kind (`option_value`);
- `verify`: tlc-verify's options drawn at random (networks of every format, `--timeout`,
  `--arithmetic`, `-o`, `--instances` lists with mutated rows, `--workers`, `--results`);
- `library`: an MLP library whose `tlc_library` metadata is forged (`forge_edit`), loaded and,
  where it loads, called;
- `graph`: a graph drawn by the hypothesis strategy `graph_cases` (extents include 0, huge
  values and the batch extent `N`), run by tlc-run in f64, f32, intervals (each `--method`),
  with `--grad` or the LLVM JIT;
- `compile`: such a graph through tlc-compile (dtype, `--batch`, `--runtime-payload`,
  `--target-cpu` drawn too); each library built is then called (`call` cases below);
- `call`: calls into compiled libraries through `tlc.load` with fuzzed arguments: inputs of the
  wrong shape, dtype or kind, NaN/inf/huge values, empty arrays, read-only, strided or
  foreign `out` buffers (bytes, read-only memmaps), parameter arrays of the wrong size, and the
  C entry point called with null pointers.

Outcomes: `ok` (exit 0, 1 or 2 without a traceback; a call that returns or raises one of the
documented errors), `traceback` (exit 70, a traceback printed, an undocumented exception from a
call), `crash` (the worker died, e.g. by SIGSEGV, or exited with another code), `hang` (the case
took longer than the time limit; the worker is killed). tests/test_fuzz.py runs a few cases of
every format per test run; `python -m tlc.tools.fuzz --cases N --seed S` runs a campaign and
prints the counts, keeping the inputs of failed cases in `$TLC_FUZZ_KEEP` if set.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp.tlir"
MLP_PROGRAM = ROOT / "examples" / "mlp_program.tlir"
MLP_PARAMS = ROOT / "examples" / "mlp_params.npz"
X0 = "0.3,-0.2,0.1,0.4"
BOUNDARY_INTS = ["0", "-1", "1", "2147483648", "9223372036854775808", "4611686018427387904",
                 "9" * 4500, "-9223372036854775809"]  # fmt: skip
#: Mutation formats (a seed file mutated) and generated ones (option sets, graphs drawn by
#: hypothesis, calls into libraries, libraries with forged metadata).
MUTATED = ("tlir", "mlir", "npz", "npy", "params", "onnx", "vnnlib", "traced")
GENERATED = ("box", "verify", "library")
FORMATS = (*MUTATED, *GENERATED, "graph", "compile", "call")
#: Extents of generated graphs: mostly small, with empty axes and sizes no buffer can hold.
EXTENTS = (0, 1, 2, 3, 5, 0, 1, 2, 3, 2**31, 2**62)
VNNLIB = """(declare-const X_0 Real)
(declare-const X_1 Real)
(declare-const X_2 Real)
(declare-const X_3 Real)
(declare-const Y_0 Real)
(assert (and (>= X_0 0.25) (<= X_0 0.35)))
(assert (and (>= X_1 -0.25) (<= X_1 -0.15)))
(assert (and (>= X_2 0.05) (<= X_2 0.15)))
(assert (and (>= X_3 0.35) (<= X_3 0.45)))
(assert (or (<= Y_0 0.02) (>= Y_0 0.04)))
"""
#: The MLP's parameters under PyTorch-style dotted names (what the importers write into
#: `tl.params`, e.g. `%2.0.weight` for a Linear inside a Sequential), by their names in
#: examples/mlp_params.npz.
DOTTED = {"0.weight": "W1", "0.bias": "b1", "2.0.weight": "W2", "2.0.bias": "b2"}
TRACED_PARAMS = """
tl.params @mlp(%0.weight: [5, 4], %0.bias: [5], %2.0.weight: [3, 5], %2.0.bias: [3]) {
  %1 = linear {weight = %0.weight, bias = %0.bias}
  %3 = linear {weight = %2.0.weight, bias = %2.0.bias}
}
"""
#: The worker's address-space limit: a runaway allocation fails instead of taking the machine.
WORKER_MEMORY = 6 * 2**30
#: Seconds a new worker may take to import tlc and say it is ready.
WORKER_START = 120.0


@dataclass
class Seeds:
    """The valid inputs mutations start from, written once per campaign."""

    tlir: bytes
    mlir: bytes
    npz: bytes
    npy: bytes
    params: bytes
    onnx: bytes | None
    vnnlib: bytes
    #: `Traced.save` of the MLP with a `tl.params` binding of dotted source names (inline
    #: payload), and the parameters by those names (an .npz for `--params`).
    traced: bytes
    dotted_params: bytes


def make_seeds(directory: Path) -> Seeds:
    from tlc.api.emit import EMITTERS
    from tlc.api.evaluate import choose
    from tlc.core.payload import save_npz
    from tlc.dialect.ops import GraphOp
    from tlc.dialect.payload_section import payload_from_module
    from tlc.frontends.text import parse_source
    from tlc.semantics.program import Traced

    text = MLP.read_text()
    mlir = EMITTERS["mlir"](parse_source(text, str(MLP)))
    np.save(directory / "x.npy", np.array([0.3, -0.2, 0.1, 0.4]))
    save_npz(choose(text, None, None)[1], str(directory / "payload.npz"))
    module = parse_source(text + TRACED_PARAMS, str(MLP))
    graph = next(op for op in module.ops if isinstance(op, GraphOp))
    Traced(module, graph, payload_from_module(module, "mlp")).save(directory / "traced.tlir")
    named = np.load(MLP_PARAMS)
    np.savez(directory / "dotted.npz", **{k: named[v] for k, v in DOTTED.items()})
    onnx_bytes = None
    with contextlib.suppress(ImportError):
        from tlc.frontends.export_onnx import to_onnx

        onnx_bytes = to_onnx(*choose(text, None, None)).SerializeToString()
    return Seeds(
        text.encode(),
        mlir.encode(),
        (directory / "payload.npz").read_bytes(),
        (directory / "x.npy").read_bytes(),
        MLP_PARAMS.read_bytes(),
        onnx_bytes,
        VNNLIB.encode(),
        (directory / "traced.tlir").read_bytes(),
        (directory / "dotted.npz").read_bytes(),
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


def mutate_arrays(archive: bytes, rng: random.Random) -> bytes:
    """An .npz archive rewritten with a few of its arrays changed: reshaped, of another dtype
    (integers, booleans, complex, float16, objects), filled with NaN or infinities, emptied, a
    member dropped, renamed or added. Unlike byte edits, these stay valid archives, so they
    reach the payload and parameter checks behind the reader."""
    arrays = dict(np.load(io.BytesIO(archive)))
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(sorted(arrays)) if arrays else "x"
        a = arrays.get(name, np.zeros(3))
        if a.dtype == object:  # an earlier edit made it objects: nothing more to change
            continue
        kind = rng.randrange(8)
        if kind == 0:
            a = a.reshape(-1)[: rng.randint(0, a.size)] if a.size else a.reshape(1, 0)
        elif kind == 1:
            a = a[..., None] if rng.random() < 0.5 else np.tile(a, 2)
        elif kind == 2:
            with np.errstate(invalid="ignore", over="ignore"):
                a = a.astype(rng.choice([np.int64, np.bool_, np.complex128, np.float16]))
        elif kind == 3:
            a = np.full(a.shape, rng.choice([np.nan, np.inf, -np.inf, 1e308]))
        elif kind == 4:
            a = np.array([object()] * max(a.size, 1), dtype=object)
        elif kind == 5:
            arrays.pop(name, None)
            continue
        elif kind == 6:
            arrays.pop(name, None)
            name = rng.choice(["1.weight", "99.bias", "W3", "", "1.", "x.y.z", name + "_"])
        else:
            a = np.zeros((2**16, 0))
        arrays[name] = a
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


#: Op types an ONNX edit puts in a node: ones the importer reads, and one it does not know.
ONNX_OPS = ("Relu", "Add", "MatMul", "Gemm", "Reshape", "Expand", "Concat", "Slice",
            "Gather", "Conv", "MaxPool", "Softmax", "ReduceSum", "Tile", "Pad", "Resize",
            "NoSuchOp")  # fmt: skip


def mutate_onnx(model_bytes: bytes, rng: random.Random) -> bytes:
    """The ONNX model with a few structural edits, which (unlike byte flips of the protobuf)
    keep it a model the importer reads: an initializer's dims, data type or data changed, a
    node's op type, inputs or outputs changed or a node dropped or duplicated, an attribute
    set to a boundary value, the input's shape or element type changed, an output added."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    names = [i.name for i in graph.input] + [t.name for t in graph.initializer]
    names += [o for n in graph.node for o in n.output] + ["", "missing"]
    boundary = [0, -1, 1, 2, 3, 2**31, 2**62, -(2**63)]
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(8)
        if kind == 0 and graph.initializer:
            t = rng.choice(graph.initializer)
            t.dims[:] = rng.choice([[], [0], [4, 5], [5, 4], [20], [2**31, 2], [-1, 5], [3, 0]])
        elif kind == 1 and graph.initializer:
            t = rng.choice(graph.initializer)
            t.data_type = rng.choice([0, 2, 6, 7, 9, 10, 11, 16, 86])
        elif kind == 2 and graph.initializer:
            t = rng.choice(graph.initializer)
            t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data) + 1)] if t.raw_data else b""
        elif kind == 3 and graph.node:
            rng.choice(graph.node).op_type = rng.choice(ONNX_OPS)
        elif kind == 4 and graph.node:
            node = rng.choice(graph.node)
            if node.input and rng.random() < 0.7:
                node.input[rng.randrange(len(node.input))] = rng.choice(names)
            else:
                node.input.append(rng.choice(names))
        elif kind == 5 and graph.node:
            node = rng.choice(graph.node)
            if rng.random() < 0.5:
                graph.node.remove(node)
            else:
                graph.node.append(node)
        elif kind == 6 and graph.node:
            node = rng.choice(graph.node)
            name = rng.choice(["axis", "keepdims", "perm", "shape", "kernel_shape", "pads"])
            value = rng.choice(boundary)
            node.attribute.append(onnx.helper.make_attribute(
                name, value if rng.random() < 0.5 else [value, rng.choice(boundary)]))  # fmt: skip
        else:
            dims = graph.input[0].type.tensor_type.shape.dim
            if dims and rng.random() < 0.7:
                dim = rng.choice(dims)
                dim.dim_value = rng.choice([v for v in boundary if v >= 0] + [4])
                if rng.random() < 0.3:
                    dim.dim_param = rng.choice(["N", "batch", ""])
            else:
                graph.input[0].type.tensor_type.elem_type = rng.choice([1, 7, 10, 11, 99])
    return model.SerializeToString()


# --------------------------------------------------------------------------------------------
# Generated graphs (a hypothesis strategy)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphCase:
    """A generated graph document, its input's shape, and how a tool runs it."""

    text: str
    input_shape: tuple[int, ...]
    #: Options of the run: `--arithmetic`, `--backend`, `--grad` for tlc-run, the build
    #: options for tlc-compile.
    run_options: tuple[str, ...]
    compile_options: tuple[str, ...]
    #: The seed for the input values and the calls into the library.
    seed: int


UNARY = ("relu", "exp", "tanh", "sigmoid", "log", "sqrt", "softplus", "gelu", "abs", "neg")


class Batch(int):
    """The batch extent `N` of a generated graph: prints as `N` in the document, and is this
    concrete batch size where the case's input array is built. Arithmetic on it gives plain
    integers (a reduced or pooled batch axis is no longer the batch extent)."""

    def __repr__(self) -> str:
        return "N"


def graph_cases() -> Any:
    """A hypothesis strategy of `GraphCase`s: a chain of up to six ops over an input whose
    extents include 0, 2^31 and 2^62 (elementwise, axis, reductions, broadcasts, layout,
    binary ops, linear with an inline payload, pools, mse_loss)."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw: Any) -> GraphCase:
        shape = draw(st.lists(st.sampled_from(EXTENTS), min_size=1, max_size=3))
        if draw(st.integers(0, 3)) == 0:  # a batch extent N (the input array has 1-3 rows)
            shape[0] = Batch(draw(st.integers(1, 3)))
        graph = _GraphText(tuple(shape))
        for _ in range(draw(st.integers(1, 6))):
            graph.add(draw, st)
        arithmetic = draw(st.sampled_from(["f64", "f64", "f32", "interval"]))
        run = ["--arithmetic", arithmetic]
        if arithmetic != "interval":
            run += draw(st.sampled_from([[], [], ["--backend", "llvm"], ["--grad"]]))
        else:
            run += draw(st.sampled_from([[], ["--method", "crown"], ["--method", "crown-ibp"],
                                         ["--radius", "0.1", "--samples", "3"]]))  # fmt: skip
        build = draw(st.sampled_from([[], ["--dtype", "f32"]]))
        build += draw(st.sampled_from([[], [], ["--batch", "3"], ["--batch", str(2**40)]]))
        build += draw(st.sampled_from([[], [], ["--runtime-payload"]]))
        build += draw(st.sampled_from([[], [], ["--target-cpu", "x86-64-v2"]]))
        return GraphCase(
            graph.document(), graph.input_shape, tuple(run), tuple(build),
            draw(st.integers(0, 2**32 - 1)),
        )  # fmt: skip

    return cases()


class _GraphText:
    """A chain under construction: its lines, each node's shape, the inline payload records."""

    def __init__(self, shape: tuple[int, ...]):
        self.input_shape = shape
        self.lines = [f"  %0 = input : {list(shape)}"]
        self.shapes = [shape]
        self.records: list[str] = []

    def add(self, draw: Any, st: Any) -> None:
        i, cur = len(self.shapes), len(self.shapes) - 1
        shape = self.shapes[cur]
        rank = len(shape)
        op = draw(st.sampled_from([*UNARY[:4], "unary", "softmax", "log_softmax", "sum",
                                   "reduce", "broadcast_to", "transpose", "binary", "linear",
                                   "pool", "mse_loss"]))  # fmt: skip
        if op == "unary":
            op = draw(st.sampled_from(UNARY))
        if op in UNARY:
            self._node(f"{op}(%{cur})", shape)
        elif op in ("softmax", "log_softmax") and rank:
            self._node(f"{op}(%{cur}) {{axis = {draw(st.integers(0, rank - 1))}}}", shape)
        elif op == "reduce" and rank:
            axis = draw(st.integers(0, rank - 1))
            kind = draw(st.sampled_from(["reduce_mean", "reduce_sum"]))
            self._node(f"{kind}(%{cur}) {{axis = {axis}}}", shape[:axis] + shape[axis + 1 :])
        elif op == "broadcast_to":
            to = (draw(st.sampled_from(EXTENTS)), *shape)
            self._node(f"broadcast_to(%{cur}) {{from = {list(shape)}, to = {list(to)}}}", to)
        elif op == "transpose" and rank >= 2:
            a, b = draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1))
            out = list(shape)
            out[a], out[b] = out[b], out[a]
            self._node(f"transpose(%{cur}) {{axis1 = {a}, axis2 = {b}}}", tuple(out))
        elif op == "binary":
            kind = draw(st.sampled_from(["add", "sub", "mul_elem", "max_elem"]))
            other = draw(st.sampled_from([j for j, s in enumerate(self.shapes) if s == shape]))
            self._node(f"{kind}(%{cur}, %{other})", shape)
        elif op == "linear" and rank:
            m = draw(st.sampled_from(EXTENTS))
            out = (*shape[:-1], m)
            self._node(f"linear(%{cur})", out, declare=True)
            if m * shape[-1] <= 64 and m <= 64:
                weight = [[round(0.1 * (r - c), 2) for c in range(shape[-1])] for r in range(m)]
                bias = [0.01 * r for r in range(m)]
                self.records.append(f"  %{i} = linear {{weight = {weight}, bias = {bias}}}")
        elif op == "pool" and rank >= 2:
            k = draw(st.integers(1, 3))
            kind = draw(st.sampled_from(["max_pool", "avg_pool"]))
            out = (*shape[:-1], (shape[-1] - k) // k + 1 if shape[-1] >= k else 0)
            self._node(f"{kind}(%{cur}) {{kernel = [{k}]}}", out)
        elif op == "mse_loss":
            self._node(f"mse_loss(%{cur}, %{cur})", (), declare=True)
        else:
            self._node(f"sum(%{cur})", (), declare=True)

    def _node(self, text: str, shape: tuple[int, ...], declare: bool = False) -> None:
        declared = f" : {list(shape)}" if declare else ""
        self.lines.append(f"  %{len(self.shapes)} = {text}{declared}")
        self.shapes.append(shape)

    def document(self) -> str:
        last = len(self.shapes) - 1
        text = "tl.graph @g {\n" + "\n".join(self.lines) + f"\n  output %{last}\n}}\n"
        if self.records:
            text += "tl.payload @g {\n" + "\n".join(self.records) + "\n}\n"
        return text


def input_argument(case: GraphCase, directory: Path) -> str:
    """`--input` for a generated graph: an .npy file of the input's shape where it is small;
    otherwise one value (a huge input cannot be given; the graph is refused before it is read)."""
    shape = case.input_shape
    if max(shape, default=0) > 64 or int(np.prod(shape, dtype=object)) > 64:
        return "0"
    path = directory / "case-input.npy"
    np.save(path, call_values(random.Random(case.seed), shape, np.dtype(np.float64)))
    return str(path)


# --------------------------------------------------------------------------------------------
# Calls into compiled libraries
# --------------------------------------------------------------------------------------------

#: Arguments larger than this are not built (a call with a 1-element array is made instead).
MAX_CALL_ELEMENTS = 2**20
INPUT_KINDS = ("right", "right", "right", "right", "flat", "list", "wrong-size", "other-dtype",
               "int", "empty", "0-d", "strided", "read-only", "string", "none",
               "object")  # fmt: skip
OUT_KINDS = ("none", "none", "none", "right", "right", "read-only", "bytes", "bytes-buffer",
             "wrong-size", "other-dtype", "strided", "list", "memmap-read-only")  # fmt: skip
PARAM_KINDS = ("auto", "auto", "none", "wrong-size", "read-only", "other-dtype", "list")
VALUE_KINDS = ("normal", "normal", "zeros", "nan", "inf", "huge", "tiny", "mixed")


def call_spec(rng: random.Random, library: str) -> dict[str, Any]:
    """One fuzzed call of library `library`'s graph (the worker builds the arguments)."""
    return {
        "call": library,
        "graph": None if rng.random() < 0.95 else "no_such_graph",
        "input": rng.choice(INPUT_KINDS),
        "out": rng.choice(OUT_KINDS),
        "params": rng.choice(PARAM_KINDS),
        "values": rng.choice(VALUE_KINDS),
        "raw": rng.random() < 0.05,
        "seed": rng.randrange(2**32),
    }


def call_values(rng: random.Random, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Values of a fuzzed argument (`rng` also picks the kind)."""
    kind = rng.choice(VALUE_KINDS)
    n = int(np.prod(shape, dtype=object))
    gen = np.random.default_rng(rng.randrange(2**32))
    huge = float(np.finfo(dtype).max) if dtype.kind == "f" else 1e300
    pool = {
        "normal": lambda: gen.normal(0, 2, n),
        "zeros": lambda: np.zeros(n),
        "nan": lambda: np.full(n, np.nan),
        "inf": lambda: gen.choice([np.inf, -np.inf], n),
        "huge": lambda: gen.choice([huge, -huge], n),
        "tiny": lambda: gen.choice([5e-324, -0.0, 1e-310], n),
        "mixed": lambda: gen.choice([0.0, -0.0, np.nan, np.inf, -np.inf, huge, 1.0, -1.0], n),
    }[kind]()
    with np.errstate(over="ignore"):
        return pool.astype(dtype if dtype.kind == "f" else np.float64).reshape(shape)


#: What a call into a library may raise: the wrapper's argument checks and tlc's errors.
def _documented_errors() -> tuple[type[BaseException], ...]:
    from tlc.core.diagnostics import DiagnosticError

    return (TypeError, ValueError, KeyError, DiagnosticError)


class _Caller:
    """The worker's side of `call` cases: libraries stay loaded between calls."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.loaded: dict[str, Any] = {}

    def reply(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The outcome of one call; `code` 0 where the call returned, 1 where it was refused."""
        try:
            self.call(spec)
        except _documented_errors():
            return {"outcome": "ok", "code": 1}
        except Exception as exc:
            return {"outcome": "traceback", "code": 70, "detail": f"{type(exc).__name__}: {exc}"}
        return {"outcome": "ok", "code": 0}

    def call(self, spec: dict[str, Any]) -> None:
        from tlc.codegen.loader import load

        path = spec["call"]
        library = self.loaded[path] if path in self.loaded else load(path)
        if not spec.get("forget"):  # a forged library is loaded once
            self.loaded[path] = library
        names = sorted(library.graphs)
        entry = library[spec["graph"] or names[0]]
        rng = random.Random(spec["seed"])
        if spec["raw"]:  # the C entry point itself must refuse null pointers
            nulls = [None] * (2 if entry.params_size is None else 3)
            proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * len(nulls)))
            proto(entry.address)(*nulls)
            return
        x = self.argument(spec["input"], entry.input_shape, entry.dtype, rng)
        out = self.out(spec["out"], entry.output_shape, entry.dtype)
        params: Any = None
        if entry.params_size is not None or spec["params"] != "auto":
            size = entry.params_size or 1
            kind = "right" if spec["params"] == "auto" else spec["params"]
            params = self.argument(kind, (size,), entry.dtype, rng)
        entry(x, params=params, out=out)

    def argument(self, kind: str, shape: tuple[int, ...], dtype: np.dtype, rng: Any) -> Any:
        if _weight(shape) > MAX_CALL_ELEMENTS:  # e.g. a `--batch 2^40` build
            shape = (1,)
        right = call_values(rng, shape, dtype)
        other = np.float32 if dtype == np.float64 else np.float64
        n = right.size
        return {
            "right": lambda: right,
            "flat": lambda: right.reshape(-1),
            "list": lambda: right.tolist(),
            "wrong-size": lambda: np.zeros(n + rng.choice([-1, 1, 7]) if n else 3, dtype),
            "other-dtype": lambda: right.astype(other),
            "int": lambda: np.zeros(shape, np.int64),
            "empty": lambda: np.zeros(0, dtype),
            "0-d": lambda: np.array(1.5, dtype),
            "strided": lambda: np.repeat(right.reshape(-1), 2)[::2].reshape(shape),
            "read-only": lambda: _read_only(right),
            "string": lambda: "1.0, 2.0",
            "none": lambda: None,
            "object": lambda: np.array([object()] * max(n, 1), dtype=object),
        }[kind]()

    def out(self, kind: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        n = int(np.prod(shape, dtype=object))
        if _weight(shape) > MAX_CALL_ELEMENTS:
            shape, n = (1,), 1
        size = n * dtype.itemsize
        if kind == "memmap-read-only":
            path = self.directory / "out.bin"
            path.write_bytes(bytes(max(size, 1)))
            return np.memmap(path, dtype=dtype, mode="r", shape=shape if n else (1,))
        other = np.float32 if dtype == np.float64 else np.float64
        return {
            "none": lambda: None,
            "right": lambda: np.empty(shape, dtype),
            "read-only": lambda: _read_only(np.empty(shape, dtype)),
            "bytes": lambda: bytes(size),
            "bytes-buffer": lambda: np.frombuffer(bytes(max(size, 8)), dtype=dtype),
            "wrong-size": lambda: np.empty(n + 1, dtype),
            "other-dtype": lambda: np.empty(shape, other),
            "strided": lambda: np.empty(2 * max(n, 1), dtype)[::2],
            "list": lambda: [0.0] * n,
        }[kind]()


#: Values an edit of a library's metadata puts in a field (`forge_edit`).
FORGED_VALUES: dict[str, list[Any]] = {
    "graph": ["mlp", "", "g" * 40, None, 3],
    "symbol": ["tlc_mlp", "tlc_mlp__x86_64_v2", "tlc_mlp_input_rank", "tlc_set_num_threads",
               "_handle", "__init__", "tlc_library", "", "tlc mlp", None],
    "dtype": ["float32", "float64", "float16", "int64", "", None, 8],
    "input_shape": [[], [1], [3], [4], [5], [2, 2], [4, 1], [-1], [2**62], [2**63], [1.5],
                    ["4"], None, {}],
    "output_shape": [[], [1], [2], [0], [-1], [2**62], None],
    "params_size": [None, 0, 1, 42, 43, 44, -1, 2**62, 2**64, True, "43"],
}  # fmt: skip


def forge_edit(metadata: Any, rng: random.Random) -> Any:
    """A forged or inconsistent version of a library's metadata: a field of its graph set to
    another (plausible or absurd) value or left out, another format, a graphs list that is
    empty, doubled or not a list, or the text truncated or mutated (returned as bytes)."""
    kind = rng.randrange(10)
    graphs = metadata.get("graphs") if isinstance(metadata, dict) else None
    entry = dict(graphs[0]) if isinstance(graphs, list) and graphs else {}
    if kind <= 5:
        key = rng.choice(sorted(FORGED_VALUES))
        entry[key] = rng.choice(FORGED_VALUES[key])
        if entry.get("params_size", 0) is None:  # read the same as null: room for the edit
            del entry["params_size"]
        return {**metadata, "graphs": [entry]}
    if kind == 6:
        entry.pop(rng.choice(sorted(FORGED_VALUES)), None)
        return {**metadata, "graphs": [entry]}
    if kind == 7:
        return {**metadata, "format": rng.choice([1, 3, "2", None])}
    if kind == 8:
        return {**metadata, "graphs": rng.choice([[], {}, None, [entry, entry], "mlp"])}
    text = json.dumps(metadata, separators=(",", ":")).encode()
    return text[: rng.randrange(len(text))] if rng.random() < 0.3 else mutate(text, rng)


def option_value(option: str, rng: random.Random, path: Path) -> str:
    """A value for one of tlc-run's box options: mostly a valid one, else a number, a comma
    list or an .npy file (written to `path`) of any shape, dtype and values, a missing file
    or a directory."""
    valid = rng.random() < 0.6
    numbers = ["0", "0.1", "1", "-1", "nan", "inf", "-inf", "1e308", "1e-320", "x", ""]
    if option == "--method":
        return rng.choice(["ibp", "crown", "crown-ibp"] if valid else ["CROWN", "", "x"])
    if option == "--samples":
        return rng.choice(["0", "3", "20"] if valid else ["-1", "x", ""])
    if option == "--digits":
        return rng.choice(["0", "3", "17", "100"] if valid else ["101", "-1", "x"])
    if valid and option != "--spec":
        lo = {"--lo": -0.1, "--hi": 0.1, "--radius": 0.0}[option]
        values = [f"{float(x) + lo:g}" for x in X0.split(",")]
        return ",".join(values) if option != "--radius" else rng.choice(["0.05", "0", ",".join(
            rng.choices(["0", "0.1", "0.01"], k=4))])  # fmt: skip
    kind = rng.randrange(4 if option != "--spec" else 2)
    if kind == 0:
        shape = rng.choice([(4,), (1, 4), (2, 4), (3,), (), (0,), (4, 1), (2, 2), (0, 4),
                            (1, 1), (2, 1), (3, 1)])  # fmt: skip
        dtype = rng.choice([np.float64, np.float64, np.float64, np.float32, np.int64, np.bool_,
                            np.complex128, object])  # fmt: skip
        pool = [0.0, 0.1, -0.5, 1.0] if valid else [0.0, 0.1, -0.5, 1.0, np.nan, np.inf, 1e308]
        array = np.resize(np.array(rng.choices(pool, k=4)), shape)
        with np.errstate(invalid="ignore", over="ignore"):
            array = array.astype(dtype)
        np.save(path, array, allow_pickle=dtype is object)
        return str(path)
    if kind == 1:
        return rng.choice([str(path.with_name("missing.npy")), str(MLP), str(path.parent)])
    if kind == 2:
        return ",".join(rng.choices(numbers, k=rng.choice([1, 3, 4, 4, 5])))
    return rng.choice(numbers)


def forge_metadata(library: bytes, edit: Callable[[Any], Any]) -> bytes | None:
    """`library` (a .so from tlc-compile) with its `tlc_library` JSON text replaced by
    `edit(metadata)` (a JSON value, or a str or bytes written as they are), padded with
    spaces to the original length so the ELF file stays valid; None if the new text is
    longer."""
    start = library.index(b'{"format":')
    end = library.index(b"\0", start)
    edited = edit(json.loads(library[start:end]))
    if isinstance(edited, bytes):
        data = edited.split(b"\0")[0]  # the symbol's text ends at the first NUL
    else:
        text = edited if isinstance(edited, str) else json.dumps(edited, separators=(",", ":"))
        data = text.encode()
    if len(data) > end - start:
        return None
    return library[:start] + data.ljust(end - start) + library[end:]


def _weight(shape: tuple[int, ...]) -> int:
    """What building an argument of `shape` costs: its elements, counting an empty axis as one
    (`tolist()` of a [2^40, 0] array still makes 2^40 lists)."""
    return int(np.prod([max(d, 1) for d in shape], dtype=object))


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# --------------------------------------------------------------------------------------------
# The worker (child process) and its parent-side handle
# --------------------------------------------------------------------------------------------


def tool_outcome(argv: list[str], tool: Callable[[list[str]], int]) -> tuple[str, str, int]:
    """Run one tool in this process: the outcome (see the module docstring), for a failure the
    last line it printed on stderr, and its exit code (70 for an escaping exception)."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = tool(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:
        return "traceback", f"{type(exc).__name__}: {exc}", 70
    last = (err.getvalue().strip().splitlines() or [""])[-1]
    if "Traceback" in err.getvalue() or code == 70:
        return "traceback", last, code
    return ("ok", "", code) if code in (0, 1, 2) else ("crash", last, code)


def _tools() -> dict[str, Callable[[list[str]], int]]:
    from tlc.tools import compile as compile_tool
    from tlc.tools import opt, run, translate, verify

    return {
        "tlc-opt": opt.main,
        "tlc-run": run.main,
        "tlc-translate": translate.main,
        "tlc-compile": compile_tool.main,
        "tlc-verify": verify.main,
    }


def serve(requests: io.TextIOBase, replies: io.TextIOBase, directory: Path) -> None:
    """The worker loop: one JSON request per line (`{"tool": NAME, "argv": [...]}` or a
    `call_spec`), one JSON reply per line (`{"outcome": ..., "code": ...}`)."""
    tools = _tools()
    caller = _Caller(directory)
    replies.write("ready\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        reply: dict[str, Any]
        if "tool" in request:
            with _bake_limit(request.get("bake_limit")):
                outcome, detail, code = tool_outcome(request["argv"], tools[request["tool"]])
            reply = {"outcome": outcome, "code": code}
            if detail:
                reply["detail"] = detail
        else:
            reply = caller.reply(request)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


@contextlib.contextmanager
def _bake_limit(limit: int | None) -> Iterator[None]:
    """Code generation's bake limit set to `limit` bytes (if given) for one request: a small
    graph then builds the embedded-payload library a large one would."""
    if limit is None:
        yield
        return
    from tlc.codegen import module

    saved, module.BAKE_LIMIT = module.BAKE_LIMIT, limit
    try:
        yield
    finally:
        module.BAKE_LIMIT = saved


def worker_main(directory: str) -> int:
    """`python -m tlc.tools.fuzz --worker DIR`: replies go to a private copy of stdout, and
    fds 1 and 2 are pointed at /dev/null so that nothing a tool, LLVM or a C library prints
    can garble them."""
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    serve(sys.stdin, replies, Path(directory))  # type: ignore[arg-type]
    return 0


#: Wall time a case may take, in multiples of its CPU-time limit.
WALL_FACTOR = 10


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far (Linux: /proc/PID/stat); 0 once it
    has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Worker:
    """The parent's handle on a worker: sends a case, waits at most `limit` seconds, and tells
    a crash (the worker died) and a hang (no reply in time; the worker is killed) apart from a
    reply. A dead or killed worker is replaced at the next case."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.proc: subprocess.Popen[str] | None = None
        self.last_signal: int | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tlc.tools.fuzz", "--worker", str(self.directory)]

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        if self._wait(proc, WORKER_START) != "ready\n":
            proc.kill()
            proc.wait()
            raise RuntimeError("the fuzz worker did not start")
        return proc

    @staticmethod
    def _wait(proc: subprocess.Popen[str], limit: float) -> str | None:
        """The next reply line, "" at end of file, None after `limit` seconds."""
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], limit)
        return proc.stdout.readline() if ready else None

    def _reply(self, proc: subprocess.Popen[str], limit: float) -> str | None:
        """The reply line ("" if the worker died), or None once the case has used `limit`
        seconds of the worker's CPU time, or `WALL_FACTOR` times that in wall time (a worker
        blocked without computing). CPU time rather than wall time, so that a campaign niced
        on a busy machine does not count slow cases as hangs."""
        start_cpu, start = _cpu_seconds(proc.pid), time.monotonic()
        while True:
            line = self._wait(proc, min(1.0, limit))
            if line is not None:
                return line
            used = _cpu_seconds(proc.pid) - start_cpu
            if used > limit or time.monotonic() - start > WALL_FACTOR * limit:
                return None

    def run(self, request: dict[str, Any], limit: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._reply(proc, limit)
        if line:
            return json.loads(line)
        if line is None:
            proc.kill()
        code = proc.wait()
        self.proc = None
        if line is None:
            return {"outcome": "hang"}
        self.last_signal = -code if code < 0 else None
        return {"outcome": "crash", "code": code}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


@dataclass
class Fuzzer:
    """A campaign's state: its directory (inputs of the case in flight), the seeds, the worker,
    the libraries built so far, and the outcome counts."""

    directory: Path
    seeds: Seeds
    worker: Worker
    limit: float = 20.0
    counts: Counter[str] = field(default_factory=Counter)
    libraries: list[str] = field(default_factory=list)
    built: int = 0
    failures: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    #: Print the counts to stderr every `progress` cases (0: never).
    progress: int = 0

    def run(
        self, fmt: str, request: dict[str, Any], index: int, limit: float | None = None
    ) -> dict[str, Any]:
        """Run one case in the worker and count its outcome (and, for the report, whether the
        input was accepted). A failed case is kept in `failures` (format, index, request,
        reply) and its input files are copied to `$TLC_FUZZ_KEEP` if set."""
        reply = self.worker.run(request, limit or self.limit)
        outcome = reply["outcome"]
        self.counts[outcome] += 1
        if self.progress and sum(self.counts[k] for k in OUTCOMES) % self.progress == 0:
            print(_summary(self.counts), file=sys.stderr, flush=True)
        self.counts[f"cases:{fmt}"] += 1
        self.counts[f"tool:{request.get('tool', 'tlc.load')}"] += 1
        if reply.get("code") == 0:
            self.counts[f"accepted:{fmt}"] += 1
        if outcome != "ok":
            self.counts[f"{outcome}:{fmt}"] += 1
            self.failures.append((fmt, index, request, reply))
            keep = os.environ.get("TLC_FUZZ_KEEP")
            if keep:
                kept = Path(keep)
                kept.mkdir(parents=True, exist_ok=True)
                for f in self.directory.glob("case*"):
                    if f.is_file():
                        shutil.copyfile(f, kept / f"{index}-{fmt}-{f.name}")
                with open(kept / "failures.jsonl", "a") as log:
                    log.write(json.dumps({"format": fmt, "index": index, "request": request,
                                          "reply": reply}) + "\n")  # fmt: skip
        return reply

    def tool(self, fmt: str, index: int, name: str, argv: list[str]) -> dict[str, Any]:
        return self.run(fmt, {"tool": name, "argv": argv}, index)

    def mutated(self, fmt: str, rng: random.Random, index: int) -> str:
        """One mutated-seed case of format `fmt` through the tool that reads it."""
        d = self.directory
        path = d / f"case.{fmt}"
        seed = getattr(self.seeds, fmt)
        if seed is None:  # onnx is not installed
            return "ok"
        # Half the parameter archives are the traced MLP's, by dotted source names.
        dotted = fmt == "params" and rng.random() < 0.5
        if dotted:
            seed = self.seeds.dotted_params
        if fmt in ("npz", "params") and rng.random() < 0.5:
            path.write_bytes(mutate_arrays(seed, rng))
        elif fmt == "onnx" and rng.random() < 0.7:
            path.write_bytes(mutate_onnx(seed, rng))
        else:
            path.write_bytes(mutate(seed, rng))
        p = str(path)
        if fmt in ("tlir", "mlir", "traced"):
            run = [p, "--input", X0]
            if fmt == "traced" and rng.random() < 0.5:
                run += ["--params", str(d / "dotted.npz")]
            argvs = {
                "tlc-opt": [p],
                "tlc-run": run,
                "tlc-translate": ["--from-mlir", p] if fmt == "mlir" else ["--to-mlir", p],
                "tlc-compile": [p, "-o", str(d / "case-lib.so"), "--target-cpu", "x86-64-v2"],
            }
            tool = rng.choice(["tlc-opt", "tlc-run", "tlc-translate", "tlc-opt", "tlc-run",
                               "tlc-translate", "tlc-compile"])  # fmt: skip
            name, argv = tool, argvs[tool]
        elif fmt == "npz":
            name, argv = "tlc-run", [str(MLP), "--input", X0, "--payload", p]
        elif fmt == "npy":
            name, argv = "tlc-run", [str(MLP), "--input", p]
        elif fmt == "params":
            doc = d / "traced.tlir" if dotted else MLP_PROGRAM
            name, argv = "tlc-run", [str(doc), "--input", X0, "--params", p]
        elif fmt == "onnx":
            name, argv = "tlc-translate", ["--import-onnx", p]
        else:
            name, argv = "tlc-verify", [str(MLP), p, "--timeout", "2"]
        return self.tool(fmt, index, name, argv)["outcome"]

    def box(self, rng: random.Random, index: int) -> str:
        """tlc-run's box options drawn at random on the MLP, the traced MLP or the MLP program
        (which refuses them): the box as --radius or --lo/--hi, with --method, --spec,
        --samples and --digits; each value mostly valid, else a number, a comma list or an
        .npy file of another shape, dtype or values (`option_value`)."""
        d = self.directory
        doc = rng.choice([str(MLP), str(MLP), str(d / "traced.tlir"), str(MLP_PROGRAM)])
        argv = [doc, "--arithmetic", rng.choice(["interval"] * 8 + ["f64", "f32"])]
        if doc == str(MLP_PROGRAM):
            argv += ["--params", str(MLP_PARAMS)]
        box = rng.choice(["--radius", "--radius", "--lo", "none"])
        if box != "--lo" or rng.random() < 0.1:
            argv += ["--input", rng.choice([X0, X0, X0, str(d / "x.npy"), "0.3,-0.2", "nan,0,0,0"])]
        options = [box] if box != "--lo" else ["--lo", "--hi"]
        options += rng.sample(["--method", "--spec", "--samples", "--digits"], rng.randint(0, 2))
        for k, option in enumerate(options):
            if option != "none":
                argv += [option, option_value(option, rng, d / f"case-{k}.npy")]
        return self.tool("box", index, "tlc-run", argv)["outcome"]

    def verify(self, rng: random.Random, index: int) -> str:
        """tlc-verify with its options drawn at random: the network (.tlir, .mlir, the traced
        document, .onnx, a program), the property (the seed or a mutation), --arithmetic,
        --timeout, -o, and --instances lists (mutated CSV rows) with --workers/--results."""
        d = self.directory
        (d / "case.mlir").write_bytes(self.seeds.mlir)
        networks = [str(MLP), str(d / "case.mlir"), str(d / "traced.tlir"), str(MLP_PROGRAM)]
        if self.seeds.onnx is not None:
            (d / "case.onnx").write_bytes(self.seeds.onnx)
            networks.append(str(d / "case.onnx"))
        prop = d / "case.vnnlib"
        prop.write_bytes(
            self.seeds.vnnlib if rng.random() < 0.6 else mutate(self.seeds.vnnlib, rng)
        )
        timeouts = ["2", "2", "2", "0", "-1", "nan", "1e-9", "x", ""]
        argv: list[str] = []
        if rng.random() < 0.3:
            rows = [f"{rng.choice(networks)},{prop},{rng.choice(timeouts)}"
                    for _ in range(rng.randint(0, 3))]  # fmt: skip
            csv = "\n".join(rows).encode()
            (d / "case.csv").write_bytes(mutate(csv, rng) if csv and rng.random() < 0.5 else csv)
            argv += ["--instances", str(d / "case.csv"), "--workers", rng.choice("1110x")]
            if rng.random() < 0.5:
                argv += ["--results", rng.choice([str(d / "case-results.csv"), str(d),
                                                  str(d / "missing" / "r.csv")])]  # fmt: skip
        else:
            argv += [rng.choice(networks), str(prop)]
        argv += ["--timeout", rng.choice(timeouts)]
        if rng.random() < 0.4:
            argv += ["--arithmetic", rng.choice(["f64", "f32"])]
        if rng.random() < 0.3:
            argv += ["-o", rng.choice([str(d / "case-out.txt"), str(d), str(d / "no" / "o.txt")])]
        return self.tool("verify", index, "tlc-verify", argv)["outcome"]

    def library(self, rng: random.Random, index: int) -> str:
        """One of the MLP's libraries with its `tlc_library` metadata forged (`forge_edit`),
        loaded by `tlc.load` and, where it loads, called."""
        data = Path(rng.choice(self.seed_libraries())).read_bytes()
        forged = forge_metadata(data, lambda m: forge_edit(m, rng))
        path = self.directory / f"forged{index}.so"
        path.write_bytes(forged if forged is not None else data)
        try:
            return self.run("library", {**call_spec(rng, str(path)), "forget": True}, index)[
                "outcome"
            ]
        finally:
            path.unlink()

    def graph(self, case: GraphCase, index: int) -> str:
        """A generated graph through tlc-run."""
        path = self.directory / "case.tlir"
        path.write_text(case.text)
        argv = [str(path), "--input", input_argument(case, self.directory), *case.run_options]
        return self.tool("graph", index, "tlc-run", argv)["outcome"]

    def compile(self, case: GraphCase, index: int, calls: int = 3) -> str:
        """A generated graph through tlc-compile; the library built is then called `calls`
        times with fuzzed arguments."""
        path = self.directory / "case.tlir"
        path.write_text(case.text)
        self.built += 1
        library = self.directory / f"lib{self.built}.so"
        argv = [str(path), "-o", str(library), *case.compile_options]
        reply = self.tool("compile", index, "tlc-compile", argv)
        if reply.get("code") == 0 and library.exists():
            rng = random.Random(case.seed)
            for _ in range(calls):
                self.call(call_spec(rng, str(library)), index)
        return reply["outcome"]

    def call(self, spec: dict[str, Any], index: int) -> str:
        return self.run("call", spec, index)["outcome"]

    def seed_libraries(self) -> list[str]:
        """The MLP compiled as f64, f32, batched, runtime-payload and embedded-payload (the
        bake limit lowered so its payload is over it) libraries, built once."""
        if not self.libraries:
            for i, options in enumerate(
                [[], ["--dtype", "f32"], ["--batch", "2"], ["--runtime-payload"], ["embed"]]
            ):
                library = self.directory / f"mlp{i}.so"
                argv = [str(MLP), "-o", str(library), "--target-cpu", "x86-64-v2"]
                request: dict[str, Any] = {"tool": "tlc-compile", "argv": argv + options}
                if options == ["embed"]:
                    request = {"tool": "tlc-compile", "argv": argv, "bake_limit": 64}
                reply = self.worker.run(request, 120.0)
                if reply.get("code") != 0:
                    raise RuntimeError(f"tlc-compile {' '.join(argv)} failed: {reply}")
                self.libraries.append(str(library))
        return self.libraries


@contextlib.contextmanager
def fuzzer(limit: float = 20.0, progress: int = 0) -> Iterator[Fuzzer]:
    """A fuzzer with its own temporary directory and worker, closed on exit."""
    with tempfile.TemporaryDirectory(prefix="tlc-fuzz-") as tmp:
        directory = Path(tmp)
        worker = Worker(directory)
        try:
            yield Fuzzer(directory, make_seeds(directory), worker, limit, progress=progress)
        finally:
            worker.close()


#: Cases of each format per round of a campaign (a compile case adds up to three calls).
ROUND = 10


def campaign(
    cases: int, seed: int, limit: float = 20.0, progress: int = 0
) -> tuple[Counter[str], list[tuple[str, int, dict[str, Any], dict[str, Any]]]]:
    """About `cases` cases, in rounds that each run `ROUND` cases of every format (so a
    campaign stopped early has covered them all): the mutated formats, calls into the MLP's
    libraries, graphs drawn by hypothesis through tlc-run and through tlc-compile (each library
    built is then called); the outcome counts, with per-format cases, and the failures."""
    rng = random.Random(seed)
    with fuzzer(limit, progress) as fz:
        try:
            _rounds(fz, cases, seed, rng)
        except Stopped:
            fz.counts["stopped early"] = 1
    return fz.counts, fz.failures


def _rounds(fz: Fuzzer, cases: int, seed: int, rng: random.Random) -> None:
    """The rounds of `campaign`."""
    libraries = fz.seed_libraries()
    for round_ in range(max(cases // (ROUND * len(FORMATS)), 1)):
        index = round_ * ROUND * len(FORMATS)
        for k in range(ROUND * len(MUTATED)):
            fz.mutated(MUTATED[k % len(MUTATED)], rng, index + k)
        index += ROUND * len(MUTATED)
        for k in range(ROUND):
            fz.box(rng, index + 3 * k)
            fz.verify(rng, index + 3 * k + 1)
            fz.library(rng, index + 3 * k + 2)
        index += ROUND * len(GENERATED)
        for k in range(ROUND):
            fz.call(call_spec(rng, libraries[k % len(libraries)]), index + k)
        index += ROUND
        drawn = rng.randrange(2**32)  # hypothesis's seeds come from the campaign's, like all else
        _drawn(drawn, ROUND, lambda case, k: fz.graph(case, index + k))  # noqa: B023
        index += ROUND
        _drawn(drawn + 1, ROUND // 2, lambda case, k: fz.compile(case, index + k))  # noqa: B023


class Stopped(KeyboardInterrupt):
    """SIGTERM (e.g. from `timeout`) during a campaign: it ends with the counts so far. (An
    interrupt, so that hypothesis, running a graph format, passes it on instead of taking it
    for a failing example.)"""


def _stop(_signum: int, _frame: object) -> None:
    raise Stopped


def _drawn(seed: int, n: int, body: Callable[[GraphCase, int], object]) -> None:
    """Run `body` on `n` graphs drawn from `graph_cases()` (hypothesis, seeded, no database,
    no shrinking: every case is run once and counted)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    drawn = [0]

    @seeded(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(graph_cases())
    def run(case: GraphCase) -> None:
        body(case, drawn[0])
        drawn[0] += 1

    run()


OUTCOMES = ("ok", "traceback", "crash", "hang")


def _summary(counts: Counter[str]) -> str:
    total = sum(counts[k] for k in OUTCOMES)
    return (
        f"cases {total}, tracebacks {counts['traceback']}, crashes {counts['crash']}, "
        f"hangs {counts['hang']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tlc.tools.fuzz", description=__doc__.splitlines()[0]
    )
    p.add_argument("--cases", type=int, default=600, help="number of cases (default 600)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="CPU seconds per case (default 20; wall time 10x)")  # fmt: skip
    p.add_argument("--progress", type=int, default=0, metavar="N",
                   help="print the counts to stderr every N cases")  # fmt: skip
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    signal.signal(signal.SIGTERM, _stop)
    counts, failures = campaign(args.cases, args.seed, args.timeout, args.progress)
    total = sum(counts[k] for k in OUTCOMES)
    print(_summary(counts) + (" (stopped early by SIGTERM)" if counts["stopped early"] else ""))
    for fmt in FORMATS:
        failed = ", ".join(f"{o} {counts[f'{o}:{fmt}']}" for o in ("traceback", "crash", "hang")
                           if counts[f"{o}:{fmt}"])  # fmt: skip
        print(f"  {fmt:8} {counts[f'cases:{fmt}']:6} cases, {counts[f'accepted:{fmt}']:6} "
              f"accepted (exit 0)" + (f"; {failed}" if failed else ""))  # fmt: skip
    tools = sorted(k.removeprefix("tool:") for k in counts if k.startswith("tool:"))
    print("  per tool: " + ", ".join(f"{t} {counts['tool:' + t]}" for t in tools))
    for fmt, index, request, reply in failures[:20]:
        print(f"case {index} ({fmt}): {reply['outcome']}: {json.dumps(request)} -> {reply}")
    return 0 if counts["ok"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
