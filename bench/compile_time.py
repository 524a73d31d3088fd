"""Compile time of real-sized networks, phase by phase, through the JIT's own steps.

    python bench/compile_time.py [--model NAME|all] [--dtype f64|f32] [--run] [--by-pointer]
                                 [--layers] [--no-cache]

Models (random weights, unbatched [C, H, W] input unless imported):
- `resnet_2b`: the size of the VNN-COMP cifar2020 ResNet (3x32x32 input; conv 3->16 stride 2,
  two residual blocks of two 3x3 convs at 16 and 32 channels, linear 2048 -> 100 -> 10);
- `lenet5`: LeNet-5 (1x32x32 input; two 5x5 convs with 2x2 max pools, linear 400 -> 120 ->
  84 -> 10); `conv5`: its second convolution alone, Conv2d(6, 16, 5) on 6x14x14;
- `vgg11`: torchvision's VGG-11 layer shapes (133 M parameters; 3x224x224 input, eight 3x3
  convs, five max pools, linear 25088 -> 4096 -> 4096 -> 1000);
- `resnet18`: torchvision's resnet18 through FX on one 3x224x224 image (needs torchvision);
- `zoo:NAME`: a "light" model of ONNX's zoo inside the onnx wheel (`zoo:densenet121`, ...;
  stored weight shapes filled with random values), through `tlc.from_onnx`.
`all` runs the first five (the zoo's models one at a time).

Times are CPU seconds of this process (LLVM runs on the calling thread; on a shared machine
wall time mostly measures the other processes). Phases: `build` (tlc emits LLVM IR text,
Python; for payloads over the bake limit, with the payload packed into the array passed by
pointer), `parse+opt` (LLVM parses, verifies and optimises at O3), `codegen` (LLVM emits object
code) and `link` (the JIT links the object). Then, unless `--no-cache`, `tlc.compile`'s own
path twice in a fresh private object cache (`tlc.codegen.objcache`): `cold` compiles and stores
the object code, `warm` (a new in-process JIT cache, as in a new process) reads it back; both
in CPU seconds of this process and in wall seconds (a graph over `INLINE_NODES` nodes, or
`APART_PRODUCTS` convolutions and products, has its kernels compiled in modules of their own,
the others' in worker processes at the same time: `build_graph_module(kernel_modules=...)`).
`--run` also runs the compiled model once and checks it against the reference interpreter;
`--by-pointer` passes even a small payload by pointer (the bake limit set to 0), to see what
baking costs; `--layers` compiles every distinct layer alone (its op, attributes and input
shapes; `tlc.codegen.module.build_node_module`) and reports the slowest and the time per op
kind: where a model's compile time goes (compile time should not depend on a layer's kernel
shape).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tlc.api.evaluate import checked_graph
from tlc.codegen import jit
from tlc.codegen import module as codegen_module
from tlc.codegen.jit import link_object
from tlc.codegen.loader import EntryPoint
from tlc.codegen.lower import LOWERINGS
from tlc.codegen.module import bakes_payload, build_graph_module, build_node_module
from tlc.codegen.target import HOST, compile_ir, emit_object, target_machine
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.ops import GraphOp
from tlc.dialect.verify import graph_shapes
from tlc.frontends.text import parse_source


class Net:
    """A .tlir graph and its random payload, built layer by layer."""

    def __init__(self, name: str, shape: tuple[int, ...]):
        self.lines = [f"tl.graph @{name} {{", f"  %0 = input : {list(shape)}"]
        self.fields: dict[str, np.ndarray] = {}
        self.last = 0
        self.rng = np.random.default_rng(0)
        #: Per node: its id, op, parents, attributes and declared shape, to compile it alone.
        self.nodes: list[tuple[int, str, list[int], str, str]] = []

    def add(
        self, op: str, parents: list[int], attrs: str = "", out: str = "", **fields: tuple[int, ...]
    ) -> int:
        """Node `op` of `parents`; `out` declares its shape where the op cannot infer it."""
        self.last += 1
        self.nodes.append((self.last, op, parents, attrs, out))
        args = ", ".join(f"%{p}" for p in parents)
        self.lines.append(f"  %{self.last} = {op}({args})" + (f" {{{attrs}}}" if attrs else "")
                          + (f" : {out}" if out else ""))  # fmt: skip
        for name, shape in fields.items():
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            self.fields[f"{self.last}.{name}"] = self.rng.standard_normal(shape) / np.sqrt(fan_in)
        return self.last

    def conv(
        self, x: int, cin: int, cout: int, stride: int = 1, kernel: int = 3, padding: int = 1
    ) -> int:
        attrs = (f"kernel = [{kernel}, {kernel}], stride = [{stride}, {stride}], "
                 f"padding = [{padding}, {padding}], in_channels = {cin}, "
                 f"out_channels = {cout}")  # fmt: skip
        return self.add("conv", [x], attrs, weight=(cout, cin, kernel, kernel), bias=(cout,))

    def pool(self, x: int, op: str = "max_pool") -> int:
        return self.add(op, [x], "kernel = [2, 2], stride = [2, 2]")

    def linear(self, x: int, n_in: int, n_out: int) -> int:
        return self.add("linear", [x], out=f"[{n_out}]", weight=(n_out, n_in), bias=(n_out,))

    def relu(self, x: int) -> int:
        return self.add("relu", [x])

    def finish(self) -> tuple[str, Payload]:
        return "\n".join([*self.lines, f"  output %{self.last}", "}"]), Payload.from_flat(
            self.fields
        )


def resnet_2b() -> Net:
    net = Net("resnet_2b", (3, 32, 32))
    x = net.relu(net.conv(0, 3, 16, stride=2))
    for cin, cout, stride in ((16, 16, 1), (16, 32, 2)):
        y = net.relu(net.conv(x, cin, cout, stride))
        y = net.conv(y, cout, cout)
        skip = x if stride == 1 else net.conv(x, cin, cout, stride)
        x = net.relu(net.add("add", [y, skip]))
    x = net.add("flatten", [x], "shape = [32, 8, 8]")
    x = net.relu(net.linear(x, 32 * 8 * 8, 100))
    net.linear(x, 100, 10)
    return net


def vgg11() -> Net:
    net = Net("vgg11", (3, 224, 224))
    x, channels = 0, 3
    for width in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if width == "M":
            x = net.add("max_pool", [x], "kernel = [2, 2], stride = [2, 2]")
        else:
            x = net.relu(net.conv(x, channels, int(width)))
            channels = int(width)
    x = net.add("flatten", [x], "shape = [512, 7, 7]")
    x = net.relu(net.linear(x, 512 * 7 * 7, 4096))
    x = net.relu(net.linear(x, 4096, 4096))
    net.linear(x, 4096, 1000)
    return net


def lenet5() -> Net:
    net = Net("lenet5", (1, 32, 32))
    x = net.pool(net.relu(net.conv(0, 1, 6, kernel=5, padding=0)))
    x = net.pool(net.relu(net.conv(x, 6, 16, kernel=5, padding=0)))
    x = net.add("flatten", [x], "shape = [16, 5, 5]")
    x = net.relu(net.linear(x, 16 * 5 * 5, 120))
    x = net.relu(net.linear(x, 120, 84))
    net.linear(x, 84, 10)
    return net


def conv5() -> Net:
    """LeNet-5's second convolution alone: Conv2d(6, 16, 5) on 6x14x14."""
    net = Net("conv5", (6, 14, 14))
    net.conv(0, 6, 16, kernel=5, padding=0)
    return net


MODELS = {"resnet_2b": resnet_2b, "vgg11": vgg11, "lenet5": lenet5, "conv5": conv5}


def imported(name: str) -> tuple[GraphOp, Payload]:
    """`resnet18` (torchvision, FX) or `zoo:NAME` (the onnx wheel's light zoo), imported."""
    import tlc

    if name == "resnet18":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from torchvision_models import network

        net, x = network("resnet18", 224)
        traced = tlc.from_torch(net, x)
    else:
        import onnx

        from tlc.tools.onnx_models import fill_weights, model_name, model_paths

        paths = [p for p in model_paths("light") if model_name(p) == name.removeprefix("zoo:")]
        if not paths:
            names = ", ".join(f"zoo:{model_name(p)}" for p in model_paths("light"))
            raise SystemExit(f"no model {name}; the zoo has {names}")
        traced = tlc.from_onnx(fill_weights(onnx.load(paths[0])))
    return traced.graph, traced.payload


def cpu() -> float:
    return time.process_time()


def slowest_layer(graph: GraphOp, payload: Payload, dtype: type) -> None:
    """Compile every distinct layer alone (build, optimise, emit object: one node as
    `build_node_module` builds it) and report the slowest, and the time per op kind."""
    shapes = graph_shapes(graph)
    seen: set[tuple] = set()
    timings, kinds = [], defaultdict(lambda: [0, 0.0])
    for node in graph.nodes:
        if isinstance(node, ops.InputOp) or LOWERINGS[type(node)].view:
            continue
        parents = [shapes[p] for p in node.parent_ids()]
        key = (type(node), repr(node.metadata()), tuple(parents))
        if key in seen:
            continue
        seen.add(key)
        start = cpu()
        ir_text, _, _ = build_node_module(node, parents, payload.get(node.id), dtype)
        emit_object(compile_ir(ir_text, HOST), HOST)
        took = cpu() - start
        attrs = ", ".join(f"{k} = {list(v) if isinstance(v, tuple) else v}"
                          for k, v in node.metadata().items())  # fmt: skip
        timings.append((took, f"%{node.id} {node.TAG} {{{attrs}}} on {parents}"))
        kinds[node.TAG][0] += 1
        kinds[node.TAG][1] += took
    worst, label = max(timings)
    print(
        f"  slowest layer alone: {label}: {worst:.2f} s "
        f"({len(timings)} distinct layers, {sum(t for t, _ in timings):.2f} s in all)"
    )
    print("  by op kind: " + ", ".join(
        f"{tag} {n}x {t:.2f} s" for tag, (n, t) in sorted(kinds.items(), key=lambda kv: -kv[1][1])
    ))  # fmt: skip


def cold_and_warm(graph: GraphOp, payload: Payload, dtype: type) -> None:
    """`tlc.compile`'s path (`jit.compile_graph`) in a fresh private object cache: once cold
    (compiled and stored), once warm (an empty in-process cache, as in a new process)."""
    with tempfile.TemporaryDirectory(prefix="tlc-cache-") as home:
        saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "TLC_OBJECT_CACHE")}
        os.environ["XDG_CACHE_HOME"] = home
        os.environ.pop("TLC_OBJECT_CACHE", None)
        try:
            times, walls = [], []
            for _ in range(2):
                jit._graph_cache.clear()
                start, wall = cpu(), time.perf_counter()
                jit.compile_graph(graph, payload, dtype)
                times.append(cpu() - start)
                walls.append(time.perf_counter() - wall)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    print(f"  tlc.compile: cold {times[0]:.2f} s ({walls[0]:.2f} s wall), warm {times[1]:.2f} s "
          f"({walls[1]:.2f} s wall; object cache)")  # fmt: skip


def measure(
    name: str, dtype: type, run: bool, layers: bool = False, cache: bool = True
) -> dict[str, float]:
    if name in MODELS:
        net = MODELS[name]()
        source, payload = net.finish()
        graph = checked_graph(parse_source(source, f"{name}.tlir"), None)
    else:
        graph, payload = imported(name)
    times: dict[str, float] = {}

    def timed(phase: str, fn, *args, **kwargs):
        start = cpu()
        result = fn(*args, **kwargs)
        times[phase] = cpu() - start
        return result

    target_machine(HOST)  # LLVM's initialisation is not the model's
    bound = not bakes_payload(graph, dtype)
    module = timed("build", build_graph_module, graph, payload, dtype, bound_payload=bound)
    llvm_module = timed("parse+opt", compile_ir, module.ir, HOST)
    obj = timed("codegen", emit_object, llvm_module, HOST)
    del llvm_module
    tracker = timed("link", link_object, obj, [module.symbol])
    times["total"] = sum(times.values())
    parameters = sum(v.size for v in payload.flat().values())
    print(f"{name} ({parameters / 1e6:.2f} M parameters, {np.dtype(dtype).name}, payload "
          f"{'by pointer' if bound else 'baked'}, IR {len(module.ir) / 1e6:.1f} MB, "
          f"{len(graph.nodes)} nodes; CPU s): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()))  # fmt: skip
    if cache:
        cold_and_warm(graph, payload, dtype)
    if layers:
        slowest_layer(graph, payload, dtype)
    if run:
        entry = EntryPoint(module.symbol, tracker[module.symbol], module.input_shape,
                           module.output_shape, module.dtype,
                           None, owner=tracker, bound=module.bound)  # fmt: skip
        from tlc.semantics.interpret import interpret

        x = np.random.default_rng(1).standard_normal(module.input_shape).astype(dtype)
        start = time.perf_counter()
        got = entry(x)
        elapsed = time.perf_counter() - start
        want = np.asarray(interpret(graph, payload, x.astype(np.float64)).output)
        error = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)
        print(f"  run {elapsed:.2f} s, max error relative to max |output|: {error:.1e}")
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ", ".join(MODELS)
    p.add_argument("--model", default="all", help=f"{names}, resnet18, zoo:NAME or all")
    p.add_argument("--dtype", choices=("f64", "f32"), default="f64")
    p.add_argument("--run", action="store_true", help="run once and check against the reference")
    p.add_argument("--by-pointer", action="store_true", help="never bake the payload")
    p.add_argument("--layers", action="store_true", help="also report the slowest layer alone")
    p.add_argument("--no-cache", action="store_true", help="skip the cold/warm tlc.compile")
    args = p.parse_args()
    if args.by_pointer:
        codegen_module.BAKE_LIMIT = 0
    dtype = np.float64 if args.dtype == "f64" else np.float32
    for name in [*MODELS, "resnet18"] if args.model == "all" else [args.model]:
        measure(name, dtype, args.run, args.layers, not args.no_cache)


if __name__ == "__main__":
    main()
