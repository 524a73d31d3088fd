"""Benchmarks: tlc-compiled code against numpy, PyTorch eager, ONNX Runtime and IREE, side by
side.

    python bench/run.py [--quick] [--repeats N] [--target-cpu CPU]

Workloads (float32): the seed MLP at batch 1; an MLP 784-1024-1024-10 at batch 1, 64 and 256;
a CNN (conv 3->16 k3 p1, relu, conv 16->32 k3 s2 p1, relu, flatten, linear -> 10) on 3x32x32
images at batch 1 and 64; and the compile time of a 1,000-node graph. Every runner computes the
same function with the same weights (checked against numpy before timing); ONNX Runtime and
IREE run the same ONNX model (IREE: imported with iree-import-onnx, compiled by iree-compile
for the llvm-cpu backend and this CPU; its columns are skipped, with the reason, when IREE is
not installed). Peers run with 1 and 2 threads (torch.set_num_threads, ORT's
intra_op_num_threads, IREE's local-sync / local-task). Each runner runs in a process of its
own (`bench/isolated.py`: in one process the peers' threads spin on after their calls and took
a two-thread runner's second core), and the runners take turns: `--repeats` rounds of one
timed loop (about 50 ms) each, every loop after a 0.1 s pause. Times are the medians and bests
of those loops; `ORT/runner` is ONNX Runtime's time at the runner's thread count over the
runner's (above 1: faster than ORT), the other ratios tlc / peer (below 1: tlc is faster);
`vCPU GF/s` is the mean speed of the vCPUs measured before the runner's loops
(`isolated.vcpu_speed`: a slow phase of the VM halves it), `L3 GB/s` the rate they read an
L3-sized array at then (a phase in which only the caches are slow).

tlc runners: `tlc ctypes` calls the compiled entry point through ctypes with preallocated
buffers and integer addresses (the cheapest Python call); `tlc.load` is the checked Python
callable of the shared library (shape/dtype checks, output allocation); `tlc jit` the JIT's
callable. `C ctypes` is a hand-written C function for the seed MLP called the same way, the floor
for a Python -> native call. `--target-cpu` (an LLVM CPU name this machine can run, e.g.
znver3 on an AVX-512 host) builds tlc's code for that CPU alone and measures the FMA peak with
its vectors; the peers that can be told to run with the same vectors too (`pin_peers`: PyTorch's
ATen, oneDNN and MKL kernels, IREE's code for the same CPU), ONNX Runtime and numpy's OpenBLAS
on the host's.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from isolated import Isolated
from peers import ort_runner

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import jit
from tlc.codegen.jit import compile_graph
from tlc.codegen.loader import load
from tlc.codegen.module import build_graph_module
from tlc.codegen.shared_lib import build_library
from tlc.codegen.target import (
    HOST,
    Target,
    compile_ir,
    emit_object,
    resolve_target,
    target_info,
)
from tlc.core.payload import Payload
from tlc.dialect.payload_section import payload_from_module

F32 = np.float32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: The clock of the timed loops: wall time, or (--cpu-time) the calling thread's CPU time, which
#: on a shared, loaded machine leaves out the time other processes hold the core (only
#: meaningful for runners on the calling thread: the 2-thread peers and numpy, whose
#: OpenBLAS runs threads of its own, are then left out). `Isolated`'s clock names.
CLOCK = ["wall"]


def calls_per_turn(runner: Isolated, budget: float = 0.05) -> int:
    """How many calls of the runner take about `budget` s on `CLOCK`: a loop calibrated by
    doubling (no settle pause: these loops only count)."""
    clock = CLOCK[0]
    n, t = 1, 0.0
    while True:
        t = runner.loop(n, clock, settle=False)
        if t > budget / 4 or n > 1_000_000:
            break
        n *= 4
    return max(1, int(n * budget / max(t, 1e-9)))


def time_in_turns(runners: dict[str, Isolated], repeats: int) -> dict[str, tuple[float, float]]:
    """(median, best) seconds per call of each runner: `repeats` rounds in which every runner
    times one calibrated loop in turn, so that a phase of the VM (load, a slow vCPU) falls on
    every runner alike instead of on the one timed then."""
    counts = {name: calls_per_turn(runner) for name, runner in runners.items()}
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            samples[name].append(runner.loop(counts[name], CLOCK[0]) / counts[name])
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


# --------------------------------------------------------------------------------------------
# Workloads: a tl graph, its payload, an input, and the same network for every peer
# --------------------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    text: str
    payload: Payload
    x: np.ndarray
    layers: list[tuple]  # ("linear", W, b) | ("relu",) | ("conv", W, b, stride, pad) | ...
    flops: float


def mlp_seed() -> Workload:
    with open(os.path.join(ROOT, "examples", "mlp.tlir"), encoding="utf-8") as f:
        text = f.read()
    payload = payload_from_module(tlc.parse(text), "mlp")
    w1, b1 = payload[1]["weight"], payload[1]["bias"]
    w2, b2 = payload[3]["weight"], payload[3]["bias"]
    layers = [("linear", w1, b1), ("relu",), ("linear", w2, b2), ("sum",), ("tanh",)]
    x = np.array([0.3, -0.2, 0.1, 0.4])
    return Workload("seed MLP, batch 1", text, payload, x, layers, 2 * (4 * 5 + 5 * 3))


def mlp_wide(batch: int, rng: np.random.Generator) -> Workload:
    sizes = [784, 1024, 1024, 10]
    lines = [f"  %0 = input : [{batch}, 784]"]
    payload, layers, nid = Payload(), [], 0
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        w = rng.normal(size=(n_out, n_in)) / np.sqrt(n_in)
        b = rng.normal(size=n_out) * 0.1
        lines.append(f"  %{nid + 1} = linear(%{nid}) : [{batch}, {n_out}]")
        payload.records[nid + 1] = {"weight": w, "bias": b}
        layers.append(("linear", w, b))
        nid += 1
        if i < 2:
            lines.append(f"  %{nid + 1} = relu(%{nid}) : [{batch}, {n_out}]")
            layers.append(("relu",))
            nid += 1
    text = "tl.graph @mlp_wide {\n" + "\n".join(lines) + f"\n  output %{nid}\n}}\n"
    flops = 2 * batch * sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
    return Workload(f"MLP 784-1024-1024-10, batch {batch}", text, payload,
                    rng.normal(size=(batch, 784)), layers, flops)  # fmt: skip


def cnn(batch: int, rng: np.random.Generator) -> Workload:
    w1 = rng.normal(size=(16, 3, 3, 3)) / np.sqrt(27)
    b1 = rng.normal(size=16) * 0.1
    w2 = rng.normal(size=(32, 16, 3, 3)) / np.sqrt(144)
    b2 = rng.normal(size=32) * 0.1
    w3 = rng.normal(size=(10, 32 * 16 * 16)) / np.sqrt(8192)
    b3 = rng.normal(size=10) * 0.1
    n = batch
    text = f"""tl.graph @cnn {{
  %0 = input : [{n}, 3, 32, 32]
  %1 = conv(%0) {{kernel = [3, 3], padding = [1, 1], channel_axis = 1, in_channels = 3, out_channels = 16}} : [{n}, 16, 32, 32]
  %2 = relu(%1) : [{n}, 16, 32, 32]
  %3 = conv(%2) {{kernel = [3, 3], stride = [2, 2], padding = [1, 1], channel_axis = 1, in_channels = 16, out_channels = 32}} : [{n}, 32, 16, 16]
  %4 = relu(%3) : [{n}, 32, 16, 16]
  %5 = reshape(%4) {{from = [{n}, 32, 16, 16], to = [{n}, 8192]}} : [{n}, 8192]
  %6 = linear(%5) : [{n}, 10]
  output %6
}}
"""  # noqa: E501
    payload = Payload({1: {"weight": w1, "bias": b1}, 3: {"weight": w2, "bias": b2},
                       6: {"weight": w3, "bias": b3}})  # fmt: skip
    layers = [("conv", w1, b1, 1, 1), ("relu",), ("conv", w2, b2, 2, 1), ("relu",),
              ("flatten",), ("linear", w3, b3)]  # fmt: skip
    flops = 2 * n * (16 * 32 * 32 * 27 + 32 * 16 * 16 * 144 + 10 * 8192)
    return Workload(f"CNN 3x32x32, batch {batch}", text, payload,
                    rng.normal(size=(n, 3, 32, 32)), layers, flops)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------


def numpy_runner(w: Workload) -> Callable[[], np.ndarray]:
    layers = [tuple(np.asarray(a, F32) if isinstance(a, np.ndarray) else a for a in layer)
              for layer in w.layers]  # fmt: skip
    x = w.x.astype(F32)

    def conv(v, weight, bias, stride, pad):
        from numpy.lib.stride_tricks import sliding_window_view

        v = np.pad(v, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = sliding_window_view(v, weight.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
        return np.einsum("nchwij,ocij->nohw", win, weight, optimize=True) + bias[:, None, None]

    def run() -> np.ndarray:
        v = x
        for layer in layers:
            kind = layer[0]
            if kind == "linear":
                v = v @ layer[1].T + layer[2]
            elif kind == "relu":
                v = np.maximum(v, 0)
            elif kind == "sum":
                v = v.sum()
            elif kind == "tanh":
                v = np.tanh(v)
            elif kind == "conv":
                v = conv(v, *layer[1:])
            elif kind == "flatten":
                v = v.reshape(v.shape[0], -1)
        return v

    return run


def torch_runner(w: Workload, threads: int) -> Callable[[], np.ndarray] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    mods = []
    for layer in w.layers:
        kind = layer[0]
        if kind == "linear":
            m = torch.nn.Linear(layer[1].shape[1], layer[1].shape[0])
            m.weight.data = torch.tensor(layer[1], dtype=torch.float32)
            m.bias.data = torch.tensor(layer[2], dtype=torch.float32)
        elif kind == "conv":
            weight = layer[1]
            m = torch.nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[2],
                                stride=layer[3], padding=layer[4])  # fmt: skip
            m.weight.data = torch.tensor(weight, dtype=torch.float32)
            m.bias.data = torch.tensor(layer[2], dtype=torch.float32)
        else:
            m = {"relu": torch.nn.ReLU(), "tanh": torch.nn.Tanh(),
                 "flatten": torch.nn.Flatten(), "sum": _torch_sum()}[kind]  # fmt: skip
        mods.append(m)
    model = torch.nn.Sequential(*mods).eval()
    x = torch.tensor(w.x, dtype=torch.float32)

    def run() -> np.ndarray:
        with torch.inference_mode():
            return model(x).numpy()

    return run


def _torch_sum():
    """`v.sum()` as a module, for nn.Sequential."""
    import torch

    class Sum(torch.nn.Module):
        def forward(self, v):
            return v.sum()

    return Sum()


def onnx_model(w: Workload, out_shape: tuple[int, ...]) -> bytes | None:
    """The workload as a checked ONNX model (opset 17), or None without onnx."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    nodes, inits, prev = [], [], "x"
    for i, layer in enumerate(w.layers):
        out = f"v{i}"
        kind = layer[0]
        if kind == "linear":
            inits += [numpy_helper.from_array(layer[1].astype(F32), f"W{i}"),
                      numpy_helper.from_array(layer[2].astype(F32), f"B{i}")]  # fmt: skip
            nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [out], transB=1)
                         if w.x.ndim == 2 else
                         helper.make_node("MatMul", [prev, f"WT{i}"], [out + "m"]))  # fmt: skip
            if w.x.ndim != 2:
                inits.append(numpy_helper.from_array(layer[1].T.astype(F32).copy(), f"WT{i}"))
                nodes.append(helper.make_node("Add", [out + "m", f"B{i}"], [out]))
        elif kind == "conv":
            inits += [numpy_helper.from_array(layer[1].astype(F32), f"W{i}"),
                      numpy_helper.from_array(layer[2].astype(F32), f"B{i}")]  # fmt: skip
            s, p = layer[3], layer[4]
            nodes.append(helper.make_node("Conv", [prev, f"W{i}", f"B{i}"], [out],
                                          strides=[s, s], pads=[p, p, p, p]))  # fmt: skip
        elif kind == "flatten":
            nodes.append(helper.make_node("Flatten", [prev], [out], axis=1))
        elif kind == "sum":
            nodes.append(helper.make_node("ReduceSum", [prev], [out], keepdims=0))
        else:
            nodes.append(helper.make_node(kind.capitalize(), [prev], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(w.x.shape))],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, out_shape)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_runner(model: bytes | None, w: Workload, threads: int) -> Callable[[], np.ndarray] | None:
    if model is None or importlib.util.find_spec("onnxruntime") is None:
        return None
    return ort_runner(model, w.x.astype(F32), threads)


#: Why the IREE columns are missing, once (None: they are there).
IREE_SKIPPED: list[str] = []
#: The CPU IREE compiles for (`pin_peers`).
IREE_CPU = ["host"]

#: What PyTorch reads when it loads, by vector width (bytes) of the target: ATen's kernels,
#: oneDNN's (convolutions, linear) and MKL's (matrix products) highest instruction set.
TORCH_ISA = {
    32: {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
         "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    16: {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
         "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}  # fmt: skip


def pin_peers(target: Target) -> str:
    """Have the peers that allow it run with `target`'s vectors, so that `--target-cpu znver3`
    on an AVX-512 host sets AVX2 against AVX2 where it can: PyTorch through the environment
    it reads when it loads (so before its first import), IREE by compiling for the same CPU.
    ONNX Runtime picks its kernels by CPUID with no switch, and numpy's OpenBLAS by its own
    dispatch: they stay on the host's. Returns the report's line."""
    if target.is_host:
        return "peers: the host's kernels"
    assert "torch" not in sys.modules, "PyTorch must load after pin_peers"
    os.environ.update(TORCH_ISA.get(target_info(target).vector_bytes, {}))
    IREE_CPU[0] = target.cpu
    aten, onednn = (
        os.environ.get(k, "host") for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    )
    return (
        f"peers: PyTorch {aten} kernels (oneDNN {onednn}), IREE for {target.cpu}; "
        "ONNX Runtime and numpy on the host's (no switch)"
    )


def iree_module(model: bytes | None, tmp: str, name: str) -> bytes | None:
    """The ONNX model compiled by IREE for this CPU (llvm-cpu backend, `--iree-llvmcpu-target-
    cpu=host`, or the target's: `pin_peers`) as a .vmfb, imported from the same ONNX file;
    None (and the reason noted in IREE_SKIPPED) when IREE is not installed or fails."""
    compile_tool, import_tool = shutil.which("iree-compile"), shutil.which("iree-import-onnx")
    if model is None or compile_tool is None or import_tool is None:
        IREE_SKIPPED[:] = ["IREE: not installed (pip install iree-base-compiler "
                           "iree-base-runtime, or the `bench` extra)"]  # fmt: skip
        return None
    src, mlir, vmfb = (os.path.join(tmp, f"{name}.{ext}") for ext in ("onnx", "mlir", "vmfb"))
    with open(src, "wb") as f:
        f.write(model)
    steps = [[import_tool, src, "-o", mlir],
             [compile_tool, mlir, "--iree-hal-target-device=local",
              "--iree-hal-local-target-device-backends=llvm-cpu",
              f"--iree-llvmcpu-target-cpu={IREE_CPU[0]}", "-o", vmfb]]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            IREE_SKIPPED[:] = [f"IREE: {os.path.basename(step[0])} failed: {last}"]
            return None
    with open(vmfb, "rb") as f:
        return f.read()


def iree_runner(vmfb: bytes | None, w: Workload, threads: int) -> Callable[[], np.ndarray] | None:
    """The compiled module through IREE's runtime: `local-sync` (the calling thread) for one
    thread, `local-task` limited to `threads` workers otherwise."""
    if vmfb is None:
        return None
    import iree.runtime as rt

    if threads > 1:
        rt.flags.parse_flags(f"--task_topology_max_group_count={threads}")
    config = rt.Config("local-sync" if threads == 1 else "local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    entry = ctx.modules.module["bench"]
    x = w.x.astype(F32)

    def run() -> np.ndarray:
        return np.asarray(entry(x))

    return run


def tlc_ctypes_runner(library: str, name: str, x: np.ndarray) -> Callable[[], np.ndarray]:
    """The library's entry point through raw ctypes (one thread), preallocated buffers."""
    lib = ctypes.CDLL(library)
    lib.tlc_set_num_threads(1)
    raw = lib[f"tlc_{name}"]
    raw.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    out = np.empty(load(library)[name].output_shape, F32)
    xa, oa = x.ctypes.data, out.ctypes.data

    def raw_call() -> np.ndarray:
        raw(xa, oa)
        return out

    return raw_call


def tlc_load_runner(library: str, threads: int, x: np.ndarray) -> Callable[[], np.ndarray]:
    lib = load(library, threads=threads)
    return lambda: lib(x)


def tlc_jit_runner(text: str, payload: Payload, threads: int, target: Target,
                   x: np.ndarray) -> Callable[[], np.ndarray]:  # fmt: skip
    jit = compile_graph(checked_graph(tlc.parse(text)), payload, F32, threads=threads,
                        target=target)  # fmt: skip
    return lambda: jit(x)


def tlc_runners(w: Workload, tmp: str, target: Target) -> dict[str, tuple]:
    """The library through raw ctypes (one thread), `tlc.load` and the JIT at 1 and 2 threads,
    all for `target` (the library: every CPU level for the host), as (build, *args) for
    `Isolated`: the library is built here, once."""
    graph = checked_graph(tlc.parse(w.text))
    name = graph.graph_name
    path = os.path.join(tmp, f"lib{name}{w.x.size}.so")
    chosen = None if target.is_host else target
    library = build_library([(graph, w.payload)], path, F32, target=chosen).library
    x = w.x.astype(F32)
    runners: dict[str, tuple] = {"tlc ctypes": (tlc_ctypes_runner, library, name, x)}
    for threads in (1,) if CLOCK[0] == "cpu" else (1, 2):
        runners[f"tlc.load {threads}t"] = (tlc_load_runner, library, threads, x)
        runners[f"tlc jit {threads}t"] = (tlc_jit_runner, w.text, w.payload, threads, target, x)
    return runners


HAND_C = r"""
#include <math.h>
static const float W1[5][4] = {{0.15f,-0.12f,0.08f,0.05f},{0.02f,0.11f,-0.09f,0.07f},
  {-0.04f,0.06f,0.1f,-0.03f},{0.09f,0.01f,0.04f,0.13f},{-0.07f,0.03f,0.12f,-0.02f}};
static const float B1[5] = {0.01f,-0.02f,0.03f,0.0f,0.02f};
static const float W2[3][5] = {{0.05f,0.08f,-0.06f,0.03f,0.07f},{-0.04f,0.02f,0.09f,-0.01f,0.06f},
  {0.1f,-0.03f,0.04f,0.05f,-0.08f}};
static const float B2[3] = {0.02f,-0.01f,0.0f};
int mlp(const float *x, float *y) {
  float h[5], s = 0;
  for (int o = 0; o < 5; o++) { float a = B1[o]; for (int i = 0; i < 4; i++) a += W1[o][i]*x[i];
    h[o] = a > 0 ? a : 0; }
  for (int o = 0; o < 3; o++) { float a = B2[o]; for (int i = 0; i < 5; i++) a += W2[o][i]*h[i];
    s += a; }
  y[0] = tanhf(s);
  return 0;
}
"""


def hand_c_runner(tmp: str) -> Callable[[], np.ndarray]:
    src, lib = os.path.join(tmp, "hand.c"), os.path.join(tmp, "libhand.so")
    with open(src, "w") as f:
        f.write(HAND_C)
    subprocess.run(["cc", "-O3", "-march=native", "-shared", "-fPIC", "-o", lib, src, "-lm"],
                   check=True)  # fmt: skip
    func = ctypes.CDLL(lib).mlp
    func.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    x = np.array([0.3, -0.2, 0.1, 0.4], F32)
    y = np.empty((), F32)
    xa, ya = x.ctypes.data, y.ctypes.data

    def run() -> np.ndarray:
        func(xa, ya)
        return y

    return run


# --------------------------------------------------------------------------------------------


def bench_workload(w: Workload, repeats: int, tmp: str, hand_c: bool, target: Target) -> None:
    """Every runner on `w`, each in a process of its own (`Isolated`; in one process the peers'
    threads spin on after their calls, numpy's OpenBLAS for 100 ms and ORT's pool for 40-50
    ms, and took a two-thread runner's second core), timed in turns (`time_in_turns`)."""
    builds: dict[str, tuple] = dict(tlc_runners(w, tmp, target))
    if hand_c:
        builds["C ctypes"] = (hand_c_runner, tmp)
    builds["numpy"] = (numpy_runner, w)
    expected = numpy_runner(w)()
    model = onnx_model(w, np.shape(expected))
    vmfb = iree_module(model, tmp, f"w{len(os.listdir(tmp))}")
    for threads in (1,) if CLOCK[0] == "cpu" else (1, 2):
        builds[f"torch {threads}t"] = (torch_runner, w, threads)
        builds[f"onnxruntime {threads}t"] = (onnx_runner, model, w, threads)
        builds[f"iree {threads}t"] = (iree_runner, vmfb, w, threads)
    if CLOCK[0] == "cpu":  # OpenBLAS's threads are not on this thread's clock
        del builds["numpy"]
    with contextlib.ExitStack() as stack:
        runners = {}
        for name, (build, *args) in builds.items():
            runner = stack.enter_context(Isolated(build, *args))
            if not runner.available:
                continue
            got = np.asarray(runner.call(), dtype=np.float64).reshape(np.shape(expected))
            np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3, err_msg=name)
            runners[name] = runner
        times = time_in_turns(runners, repeats)
        speeds = {name: runner.vcpu() for name, runner in runners.items()}
    ours, load_t = times["tlc ctypes"][0], times["tlc.load 1t"][0]
    print(f"\n## {w.name}  ({w.flops / 1e6:.3f} MFLOP)")
    print(f"{'runner':<16} {'median':>11} {'best':>11} {'GFLOP/s':>8} {'ORT/runner':>10} "
          f"{'tlc ctypes/peer':>16} {'tlc.load/peer':>14} {'vCPU GF/s':>9} "
          f"{'L3 GB/s':>7}")  # fmt: skip
    for name, (t, best) in times.items():
        # The ratio to ONNX Runtime at the runner's thread count (`tlc ctypes`: one thread).
        match = re.search(r" (\d+)t$", name)
        ort = times.get(f"onnxruntime {match.group(1) if match else 1}t")
        ratio = f"{ort[0] / t:10.2f}" if ort else f"{'':>10}"
        print(f"{name:<16} {fmt_time(t):>11} {fmt_time(best):>11} {w.flops / t / 1e9:8.2f} "
              f"{ratio} {ours / t:16.2f} {load_t / t:14.2f} {speeds[name].gflops:9.0f} "
              f"{speeds[name].l3_gbs:7.0f}")  # fmt: skip


def cpu_model() -> str:
    """This machine's CPU as the bench reports it: the model name, LLVM's name for it, its
    widest vectors and its cores."""
    import llvmlite.binding as llvm

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), name)  # fmt: skip
    except OSError:
        pass
    info = target_info()
    vectors = {64: "AVX-512", 32: "AVX2", 16: "SSE/NEON"}.get(info.vector_bytes, "")
    return f"{name} ({llvm.get_host_cpu_name()}, {vectors}, {os.cpu_count()} cores)"


def fmt_time(t: float) -> str:
    return f"{t * 1e6:.2f} us" if t < 1e-3 else f"{t * 1e3:.3f} ms"


def thousand_node_graph(rng: np.random.Generator) -> tuple[str, Payload]:
    """A chain of 1,000 nodes on [32]: linear layers, activations and residual adds."""
    lines, payload = ["  %0 = input : [32]"], Payload()
    cycle = ["linear", "relu", "tanh", "add", "sigmoid"]
    for i in range(1, 1000):
        kind = cycle[i % len(cycle)]
        if kind == "linear":
            lines.append(f"  %{i} = linear(%{i - 1}) : [32]")
            payload.records[i] = {
                "weight": rng.normal(size=(32, 32)) / 6,
                "bias": rng.normal(size=32),
            }
        elif kind == "add":
            lines.append(f"  %{i} = add(%{i - 1}, %{i - 3}) : [32]")
        else:
            lines.append(f"  %{i} = {kind}(%{i - 1}) : [32]")
    return "tl.graph @big {\n" + "\n".join(lines) + "\n  output %999\n}\n", payload


def peak_gflops(seconds: float = 0.2, target: Target = HOST) -> float:
    """One core's float32 FMA peak, measured: a JIT-compiled loop of independent vector FMAs
    of `target`'s widest vectors, timed by the thread's CPU clock. The GEMM figures are read
    against it. There are 24 chains on AVX-512 and 12 with 16 vector registers (enough to
    cover the FMA latency on any x86-64 core; 24 ymm accumulators spilled and measured AVX2 at
    61% of its peak)."""
    from tlc.codegen.jit import jit_link

    info = target_info(target)
    lanes, chains = info.vector_bytes // 4, min(24, info.vector_registers - 4)
    vec = f"<{lanes} x float>"
    body = [f"  %a{c} = phi {vec} [ %x, %entry ], [ %b{c}, %loop ]" for c in range(chains)]
    body += [f"  %b{c} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{c}, {vec} %x, {vec} %y)"
             for c in range(chains)]  # fmt: skip
    total = "%b0"
    for c in range(1, chains):
        body.append(f"  %s{c} = fadd {vec} {total}, %b{c}")
        total = f"%s{c}"
    ir_text = f"""
declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})
define float @peak(i64 %n, float %seed) {{
entry:
  %one = insertelement {vec} poison, float %seed, i64 0
  %x = shufflevector {vec} %one, {vec} poison, <{lanes} x i32> zeroinitializer
  %y = fmul {vec} %x, %x
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
{chr(10).join(body[:chains])}
{chr(10).join(body[chains : 2 * chains])}
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %n
  br i1 %more, label %loop, label %done
done:
{chr(10).join(body[2 * chains :])}
  %r = extractelement {vec} {total}, i64 0
  ret float %r
}}
"""
    tracker = jit_link(ir_text, ["peak"], target)
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)(tracker["peak"])
    n = 1_000_000
    start = time.thread_time()
    peak(n, 1.0)
    spent = max(time.thread_time() - start, 1e-9)
    n = max(int(n * seconds / spent), 1)
    best = min(_timed(peak, n) for _ in range(3))
    return 2 * chains * lanes * n / best / 1e9


def _timed(fn: Callable[[int, float], float], n: int) -> float:
    start = time.thread_time()
    fn(n, 0.5)
    return max(time.thread_time() - start, 1e-9)


def bench_compile(rng: np.random.Generator) -> None:
    text, payload = thousand_node_graph(rng)
    start = time.perf_counter()
    graph = checked_graph(tlc.parse(text))
    parsed = time.perf_counter()
    module = build_graph_module(graph, payload, F32)
    lowered = time.perf_counter()
    optimised = compile_ir(module.ir)
    opt_done = time.perf_counter()
    emit_object(optimised)
    done = time.perf_counter()
    # tlc.compile's own path, cold: its kernels in modules compiled at the same time.
    with tempfile.TemporaryDirectory(prefix="tlc-cache-") as home:
        saved = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = home
        try:
            jit._graph_cache.clear()
            cold = time.perf_counter()
            compile_graph(graph, payload, F32)
            cold = time.perf_counter() - cold
        finally:
            if saved is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = saved
    print("\n## compile time, 1,000-node graph (f32)")
    print(f"parse+check {parsed - start:.2f} s, lower to LLVM IR {lowered - parsed:.2f} s, "
          f"O3 {opt_done - lowered:.2f} s, codegen {done - opt_done:.2f} s, "
          f"total {done - start:.2f} s; tlc.compile cold (the graph checked) "
          f"{cold:.2f} s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="fewer workloads (smoke test)")
    parser.add_argument("--only", metavar="TEXT", default="",
                        help="only workloads whose name contains TEXT ('batch 256')")  # fmt: skip
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the calling thread's CPU time (1-thread runners only)",
    )
    parser.add_argument("--target-cpu", default="host",
                        help="build tlc's code for this CPU only (e.g. znver3: AVX2)")  # fmt: skip
    args = parser.parse_args()
    target = resolve_target(args.target_cpu)
    if args.cpu_time:
        CLOCK[0] = "cpu"
    rng = np.random.default_rng(0)
    workloads = [mlp_seed()]
    if not args.quick:
        workloads += [mlp_wide(1, rng), mlp_wide(64, rng), mlp_wide(256, rng), cnn(1, rng),
                      cnn(64, rng)]  # fmt: skip
    workloads = [w for w in workloads if args.only in w.name]
    clock = "thread CPU time" if args.cpu_time else "wall time"
    print(f"CPU: {cpu_model()}; float32; tlc: 1 and 2 threads (1 with --cpu-time); {clock}")
    if not target.is_host:
        vectors = target_info(target).vector_bytes * 8
        print(f"tlc built for --target-cpu {target.cpu} ({vectors}-bit vectors)")
    print(pin_peers(target))
    print(f"one core's float32 FMA peak (measured): {peak_gflops(target=target):.1f} GFLOP/s")
    with tempfile.TemporaryDirectory(prefix="tlc-bench-") as tmp:
        for w in workloads:
            bench_workload(w, args.repeats, tmp, hand_c=w.name.startswith("seed"), target=target)
            sys.stdout.flush()
    iree = f"IREE: iree-base-compiler/-runtime, llvm-cpu, --iree-llvmcpu-target-cpu={IREE_CPU[0]}"
    print("\n" + "\n".join(IREE_SKIPPED or [iree]))
    if not args.quick and not args.only:
        bench_compile(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
