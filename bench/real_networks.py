"""torchvision models and a transformer encoder stack through tlc's importers, timed.

    python bench/real_networks.py [--models resnet18,...] [--routes fx,onnx,dynamo] [--size 32]
                                  [--no-compile]
    python bench/real_networks.py --speed [--models resnet18,...] [--size 224]
                                  [--batches 1,16] [--threads 1,2] [--target-cpu znver3]
                                  [--cpu-time] [--fold-batch-norm]
    python bench/real_networks.py --profile [--models squeezenet1_0] [--batches 1] [--top 12]
                                  [--threads 1]

`--models` also takes `zoo:NAME` for a light model of ONNX's zoo inside the onnx wheel
(`zoo:resnet50`, `zoo:densenet121`: `bench/zoo.py`'s `zoo_model`, random weights, 224 x 224
whatever `--size`, rewritten for each batch size): tlc and ONNX Runtime run the same model and
tlc is checked against ONNX Runtime's output; the PyTorch column runs the torchvision model
of the same architecture (`ZOO_TORCH`, its own random weights: timed, not compared; `-` where
torchvision has none).

For each model (random weights, batch 1, `--size` x `--size` input; the transformer 2 x 10 x 32)
and route (`fx`: tlc.from_torch on the float64 model; `onnx`: torch.onnx.export(dynamo=False)
then tlc.from_onnx; `dynamo`: the same with dynamo=True), prints one table row: the import time,
the reference denotation's time for one forward, `tlc.compile`'s time (the JIT, float64) and
the largest error relative to the largest output magnitude, of the reference and of the compiled
code, against PyTorch (float64 for fx, float32 for the exports). Needs torchvision (see
tests/torchvision_models.py for why its import needs a shim) and, for `dynamo`, onnxscript.
Figures drift on a loaded machine: compare rows of one run.

`--speed` times instead: each model exported to ONNX (dynamo=False) at each batch size, the
same file run by tlc (`tlc.from_onnx` + `tlc.compile`, float32, optionally for another
`--target-cpu` this machine can run) and ONNX Runtime, and the model by PyTorch eager, at each
thread count (tlc's `threads=`, ORT's intra_op_num_threads, torch.set_num_threads). Each runner
runs in a process of its own (`bench/isolated.py`: in one process ORT's and libgomp's pool
threads spin on after their runs and take the next runner's second core), and the runners take
turns (`--repeats` turns of about 0.3 s of calls each, after a 0.1 s pause), so load drifting
on a shared machine hits them alike. A row per model, batch and thread count gives the median
time per call in ms over every turn's calls, `ORT/tlc` of those medians (above 1: tlc is
faster), the same ratio of the mean times per call (`by means`: a shared VM's stolen bursts
weigh in it), the share of the machine's CPU time the hypervisor stole during tlc's and ORT's
turns (/proc/stat: a cell whose runners were stolen from unequally is not a comparison), the
mean speed of the vCPUs measured before their turns (`isolated.vcpu_speed`, GFLOP/s of a fixed
matrix product loop by its CPU time: a slow phase of the VM halves it, and the steal counter
does not always see one) and the rate they read an L3-sized array at then (GB/s: a phase in
which only the caches are slow), and tlc's import + compile seconds. Outputs are checked against
PyTorch first.

`--profile` says where the time goes: tlc's code built with per-node clocks
(`build_graph_module(profile=...)`: each node's computation, in the whole network's run,
adds the time it took to a counter of its own) next to ONNX Runtime's session profile
(`SessionOptions.enable_profiling`: each node's kernel time), both summed over the same calls
and divided per call. At one thread (`--threads 1`, the default) tlc's clock is the calling
thread's CPU time and ORT's wall times are scaled to add up to its calling thread's CPU time
over the calls; at more (`--threads 2`: tlc's `threads=`, ORT's intra_op_num_threads) both
are wall time, and a third table gives tlc's per-node wall time at that count against one
thread (the same build), with the share of the time in nodes that run on one thread only
(too little work for a parallel region). The two graphs differ (ORT fuses conv + add + relu
and reorders to its blocked layout; tlc fuses relus into convolutions), so nodes are matched
by kind and output shape: a table per kind (conv, pool, concat, add, ...), and the `--top`
(kind, shape) pairs where tlc loses most.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from torchvision_models import NETWORKS, network  # noqa: E402

import tlc  # noqa: E402
from tlc.semantics.interpret import interpret  # noqa: E402
from tlc.semantics.program import Traced  # noqa: E402


def relative(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def row(name: str, route: str, size: int, compile_too: bool) -> str:
    net, x = network(name, size)
    start = time.perf_counter()
    if route == "fx":
        net, x = net.double(), x.double()
        traced = tlc.from_torch(net, x)
    else:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            path = str(Path(tmp) / "m.onnx")
            torch.onnx.export(net, (x,), path, dynamo=route == "dynamo")
            start = time.perf_counter()
            traced = tlc.from_onnx(path)
    imported = time.perf_counter() - start
    with torch.no_grad():
        expected = net(x).numpy()
    xs = x.double().numpy()
    start = time.perf_counter()
    reference = interpret(traced.graph, traced.payload, xs).output
    forward = time.perf_counter() - start
    cells = [name, route, "yes", f"{imported:.2f}", f"{forward:.2f}"]
    error = relative(reference, expected)
    if compile_too:
        start = time.perf_counter()
        compiled = tlc.compile(traced)
        built = time.perf_counter() - start
        cells += [f"{built:.2f}", f"{error:.1e}", f"{relative(compiled(xs), expected):.1e}"]
    else:
        cells += ["-", f"{error:.1e}", "-"]
    return "| " + " | ".join(cells) + " |"


#: The clock of the 1-thread speed rows (`Isolated.time`'s names): "wall", or (--cpu-time)
#: "cpu", the calling thread's CPU time, which leaves out the time other processes hold the
#: core on a loaded machine (every 1-thread runner computes on the calling thread).
CLOCK = ["wall"]
#: Extra keywords of `--speed`'s tlc.compile (`--fold-batch-norm`).
COMPILE_OPTIONS: dict[str, object] = {}


#: The torchvision model of a zoo model's architecture, run by PyTorch beside it (its own
#: random weights: timed, not compared).
ZOO_TORCH = {"resnet50": "resnet50", "densenet121": "densenet121"}


@dataclass
class Workload:
    """What the speed rows and the profile run: the ONNX file tlc and ONNX Runtime both read,
    its input and expected output, and PyTorch's model of it (None: none) with its input."""

    model: bytes
    traced: Traced
    x: np.ndarray
    expected: np.ndarray
    net: torch.nn.Module | None
    torch_x: torch.Tensor
    #: Whether PyTorch computes `expected` (a torchvision model) or only the same layers (a
    #: zoo model, whose outputs come from ONNX Runtime).
    same_weights: bool


def workload(name: str, size: int, batch: int) -> Workload:
    """A torchvision model of `NETWORKS` exported to ONNX (dynamo=False) at `batch` images of
    `size` x `size`, its output computed by PyTorch; or `zoo:NAME`, a light model of the onnx
    wheel's zoo (`bench/zoo.py`'s `zoo_model`: random weights, 224 x 224 whatever `size`),
    its output computed by ONNX Runtime, beside PyTorch's `ZOO_TORCH` model."""
    if name.startswith("zoo:"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from peers import ort_runner
        from zoo import zoo_model

        proto = zoo_model(name.removeprefix("zoo:"), batch)
        model = proto.SerializeToString()
        initializers = {t.name for t in proto.graph.initializer}
        (data,) = [i for i in proto.graph.input if i.name not in initializers]
        shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
        xs = np.random.default_rng(1).standard_normal(shape, np.float32)
        expected = ort_runner(model, xs, 1)()
        twin = ZOO_TORCH.get(name.removeprefix("zoo:"))
        net = network(twin)[0] if twin else None
        return Workload(model, tlc.from_onnx(proto), xs, expected, net, torch.from_numpy(xs),
                        False)  # fmt: skip
    net, x = network(name, size)
    x = torch.randn(batch, *x.shape[1:])
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        path = Path(tmp) / "m.onnx"
        torch.onnx.export(net, (x,), str(path), dynamo=False)
        model = path.read_bytes()
        traced = tlc.from_onnx(str(path))
    with torch.no_grad():
        expected = net(x).numpy()
    return Workload(model, traced, x.numpy(), expected, net, x, True)


def tlc_runner(model: bytes, xs: np.ndarray, threads: int, target_cpu: str,
               options: dict[str, object]) -> Callable[[], object]:  # fmt: skip
    """tlc on the ONNX file (`Isolated`'s build, in the runner's process), `options` passed
    on to tlc.compile (`COMPILE_OPTIONS`)."""
    import onnx

    compiled = tlc.compile(tlc.from_onnx(onnx.load_from_string(model)), dtype="f32",
                           threads=threads, target_cpu=target_cpu, **options)  # fmt: skip
    return lambda: compiled(xs)


def torch_runner(saved: bytes, xs: np.ndarray, threads: int) -> Callable[[], object]:
    """PyTorch eager on `threads` threads, in inference mode: the model as `torch.save` wrote
    it (a module or tensor sent as itself would go by torch's shared-memory reduction, which
    moves its storage and leaves numpy views of the old one dangling in the parent)."""
    torch.set_num_threads(threads)
    net = torch.load(io.BytesIO(saved), weights_only=False)
    x = torch.from_numpy(xs)

    def eager() -> object:
        with torch.inference_mode():
            return net(x).numpy()

    return eager


def speed_rows(name: str, size: int, batch: int, threads: list[int], target_cpu: str,
               repeats: int) -> list[str]:  # fmt: skip
    """One row per thread count: tlc, ONNX Runtime and PyTorch on model `name` at `batch`,
    each in a process of its own (`Isolated`), taking turns."""
    from isolated import Isolated
    from peers import ort_runner

    work = workload(name, size, batch)
    rows = []
    for t in threads:
        with contextlib.ExitStack() as stack:
            runners = {"tlc": Isolated(tlc_runner, work.model, work.x, t, target_cpu,
                                        COMPILE_OPTIONS)}  # fmt: skip
            built = runners["tlc"].built_s
            runners["ort"] = Isolated(ort_runner, work.model, work.x, t)
            if work.net is not None:
                saved = io.BytesIO()
                torch.save(work.net, saved)
                runners["torch"] = Isolated(torch_runner, saved.getvalue(), work.torch_x.numpy(), t)
            for label, runner in runners.items():
                stack.callback(runner.close)
                got = np.asarray(runner.call())  # also the first, untimed call
                if label != "torch" or work.same_weights:
                    error = relative(got, work.expected)
                    assert error < 1e-3, (name, label, error)
            clock = CLOCK[0] if t == 1 else "wall"
            n = max(1, int(0.3 / max(min(runners["tlc"].time(3, clock)), 1e-6)))
            calls: dict[str, list[float]] = {label: [] for label in runners}
            for _ in range(repeats):
                for label, runner in runners.items():
                    calls[label] += runner.time(n, clock)
            stolen = " / ".join(f"{100 * runners[k].stolen():.0f}" for k in ("tlc", "ort"))
            probes = [runners[k].vcpu() for k in ("tlc", "ort")]
            speeds = " / ".join(f"{p.gflops:.0f}" for p in probes)
            l3 = " / ".join(f"{p.l3_gbs:.0f}" for p in probes)
        ms = {label: statistics.median(v) * 1e3 for label, v in calls.items()}
        means = {label: statistics.fmean(v) for label, v in calls.items()}
        eager_ms = f"{ms['torch']:.2f}" if "torch" in ms else "-"
        rows.append(f"| {name} | {batch} | {t} | {ms['tlc']:.2f} | {ms['ort']:.2f} | "
                    f"{eager_ms} | {ms['ort'] / ms['tlc']:.2f} | "
                    f"{means['ort'] / means['tlc']:.2f} | {stolen} | {speeds} | {l3} | "
                    f"{built:.1f} |")  # fmt: skip
    return rows


#: A node's kind for the profile's tables: tlc op tags and ORT op types of the same work.
KINDS = {"conv": "conv", "Conv": "conv", "FusedConv": "conv", "max_pool": "pool",
         "avg_pool": "pool", "MaxPool": "pool", "AveragePool": "pool",
         "GlobalAveragePool": "pool", "reduce_mean": "pool", "concat": "concat",
         "Concat": "concat", "add": "add", "Add": "add", "Sum": "add", "relu": "relu",
         "Relu": "relu", "clip": "relu", "Clip": "relu", "linear": "linear", "Gemm": "linear",
         "ReorderInput": "reorder", "ReorderOutput": "reorder"}  # fmt: skip


#: (kind, output shape) -> (ms per call, of it in nodes run on the calling thread alone).
NodeTimes = dict[tuple[str, tuple], tuple[float, float]]


def tlc_profile(
    traced: object, x: np.ndarray, calls: int, counts: list[int], target_cpu: str = "host"
) -> dict[int, NodeTimes]:
    """Thread count -> (kind, output shape) -> (tlc's ms per call, of it in nodes that run
    on the calling thread alone), from one profiling build for `target_cpu`: its clock is the
    calling thread's CPU time when every count is 1, else wall time."""
    from tlc.codegen.jit import jit_link
    from tlc.codegen.loader import EntryPoint
    from tlc.codegen.module import bakes_payload, build_graph_module
    from tlc.codegen.target import resolve_target

    graph, payload = traced.graph, traced.payload
    bound = not bakes_payload(graph, np.float32)  # held packed, as the JIT does
    clock = "cpu" if max(counts) == 1 else "wall"
    target = resolve_target(target_cpu)
    module = build_graph_module(graph, payload, np.float32, bound_payload=bound, profile=clock,
                                target=target)  # fmt: skip
    counters = f"{module.symbol}_profile"
    tracker = jit_link(module.ir, [module.symbol, counters], target)
    nanos = np.ctypeslib.as_array((ctypes.c_int64 * len(module.plan.nodes)).from_address(
        tracker[counters]))  # fmt: skip
    by_count = {}
    for threads in counts:
        entry = EntryPoint(module.symbol, tracker[module.symbol], module.input_shape,
                           module.output_shape, module.dtype,
                           None, owner=tracker, bound=module.bound,
                           threads=threads)  # fmt: skip
        entry(x)
        nanos[:] = 0
        for _ in range(calls):
            entry(x)
        times: NodeTimes = {}
        for p in module.plan.nodes:
            if nanos[p.node.id]:
                kind = KINDS.get(p.node.TAG, p.node.TAG)
                if kind == "conv" and p.node.meta("groups") == p.node.meta("in_channels") > 1:
                    kind = "depthwise"
                key = (kind, tuple(p.shape))
                ms = nanos[p.node.id] / 1e6 / calls
                total, serial = times.get(key, (0.0, 0.0))
                times[key] = (total + ms, serial + (ms if p.tasks == 1 else 0.0))
        by_count[threads] = times
    return by_count


def ort_profile(model: bytes, x: np.ndarray, calls: int,
                threads: int) -> dict[tuple[str, tuple], float]:  # fmt: skip
    """(kind, output shape) -> ONNX Runtime's ms per call, from its session profile. The
    profile's durations are wall time, which a loaded machine inflates: at one thread they
    are scaled so that they add up to the calling thread's CPU time over the same calls."""
    import json

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    with tempfile.TemporaryDirectory() as tmp:
        opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / "ort")
        session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        session.run(None, feed)
        start = time.thread_time()
        for _ in range(calls):
            session.run(None, feed)
        cpu = time.thread_time() - start
        with open(session.end_profiling()) as f:
            events = json.load(f)
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    kernels = kernels[len(kernels) // (calls + 1) :]  # every call runs the same nodes: the
    # first (untimed) call's come first
    scale = cpu * 1e6 / max(sum(e["dur"] for e in kernels), 1) if threads == 1 else 1.0
    times: dict[tuple[str, tuple], float] = {}
    for e in kernels:
        op = e["args"]["op_name"]
        shapes = e["args"].get("output_type_shape") or [{}]
        shape = tuple(next(iter(shapes[0].values()), ()))
        kind = KINDS.get(op, op)
        weights = e["args"].get("input_type_shape") or []
        weight = next(iter(weights[1].values()), ()) if len(weights) > 1 else ()
        if kind == "conv" and len(weight) > 1 and weight[1] == 1 and weight[0] > 1:
            kind = "depthwise"
        times[(kind, shape)] = times.get((kind, shape), 0.0) + e["dur"] * scale / 1e3 / calls
    return times


def profile(args: argparse.Namespace) -> None:
    """Per-node time of tlc and ONNX Runtime at `--threads` (one count), by kind and by
    (kind, shape); at more than one thread, also tlc's per-node time against one thread."""
    threads = int(args.threads or "1")
    if threads == 1:
        print(
            "Per node, one thread, ms per call (tlc: thread CPU time of each node's "
            "computation; ORT: its profile's kernel times, scaled to its thread CPU time)"
        )
    else:
        print(f"Per node, {threads} threads, ms per call, wall time (tlc: each node's "
              "computation; ORT: its profile's kernel times)")  # fmt: skip
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            work = workload(name, args.size, batch)
            counts = sorted({1, threads})
            tlc_times = tlc_profile(work.traced, work.x, args.repeats, counts, args.target_cpu)
            ours = {key: ms for key, (ms, _) in tlc_times[threads].items()}
            theirs = ort_profile(work.model, work.x, args.repeats, threads)
            by_kind: dict[str, list[float]] = {}
            for times, side in ((ours, 0), (theirs, 1)):
                for (kind, _), ms in times.items():
                    by_kind.setdefault(kind, [0.0, 0.0])[side] += ms
            print(f"\n{name}, batch {batch}: total tlc {sum(ours.values()):.2f} ms, "
                  f"ORT {sum(theirs.values()):.2f} ms")  # fmt: skip
            print("| kind | tlc ms | ORT ms | tlc - ORT |\n|---|---:|---:|---:|")
            for kind, (a, b) in sorted(by_kind.items(), key=lambda kv: kv[1][1] - kv[1][0]):
                print(f"| {kind} | {a:.3f} | {b:.3f} | {a - b:+.3f} |")
            print("| kind, output shape | tlc ms | ORT ms | tlc - ORT |\n|---|---:|---:|---:|")
            keys = set(ours) | set(theirs)
            gaps = sorted(keys, key=lambda key: theirs.get(key, 0.0) - ours.get(key, 0.0))
            for key in gaps[: args.top]:
                a, b = ours.get(key, 0.0), theirs.get(key, 0.0)
                print(f"| {key[0]} {'x'.join(map(str, key[1]))} | {a:.3f} | {b:.3f} | "
                      f"{a - b:+.3f} |")  # fmt: skip
            if threads > 1:
                thread_table(tlc_times[1], tlc_times[threads], threads, args.top)


def thread_table(one: NodeTimes, many: NodeTimes, threads: int, top: int) -> None:
    """tlc's per-(kind, shape) wall time at one thread and at `threads`, the `top` losing most
    against a perfect split first, and the share of the time in nodes that run on the calling
    thread alone."""
    total_one, total_many = sum(v[0] for v in one.values()), sum(v[0] for v in many.values())
    serial_one, serial_many = sum(v[1] for v in one.values()), sum(v[1] for v in many.values())
    print(f"tlc, 1 -> {threads} threads: {total_one:.2f} -> {total_many:.2f} ms "
          f"({total_one / max(total_many, 1e-9):.2f}x); in nodes on one thread only: "
          f"{serial_one:.2f} -> {serial_many:.2f} ms "
          f"({serial_many / max(total_many, 1e-9):.0%} of the {threads}-thread time)")  # fmt: skip
    print(f"| kind, output shape | 1 thread ms | {threads} threads ms | speed-up | of it on one "
          "thread only |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    # ms lost against a perfect split over the threads, most first
    lost = sorted(many, key=lambda key: one.get(key, (0.0, 0.0))[0] / threads - many[key][0])
    for key in lost[:top]:
        a, (b, serial) = one.get(key, (0.0, 0.0))[0], many[key]
        print(f"| {key[0]} {'x'.join(map(str, key[1]))} | {a:.3f} | {b:.3f} | "
              f"{a / max(b, 1e-9):.2f}x | {serial:.3f} |")  # fmt: skip


def speed(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import cpu_model

    if args.cpu_time:
        CLOCK[0] = "cpu"
    if args.fold_batch_norm:
        COMPILE_OPTIONS["fold_batch_norm"] = True
    clock = "1 thread: thread CPU time, 2+: wall time" if args.cpu_time else "wall time"
    print(
        f"CPU: {cpu_model()}; float32; tlc --target-cpu {args.target_cpu}"
        f"{', batch norms folded' if args.fold_batch_norm else ''}; "
        f"{args.size}x{args.size} images; each runner in a process of its own, {args.repeats} "
        f"turns each; medians per call; {clock}"
    )
    print("| model | batch | threads | tlc ms | ORT ms | PyTorch ms | ORT/tlc | by means | "
          "stolen % tlc / ORT | vCPU GF/s tlc / ORT | L3 GB/s tlc / ORT | compile s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    threads = [int(t) for t in (args.threads or "1,2").split(",")]
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for line in speed_rows(name, args.size, batch, threads, args.target_cpu,
                                   args.repeats):  # fmt: skip
                print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(NETWORKS))
    parser.add_argument("--routes", default="fx,onnx,dynamo")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--speed", action="store_true", help="time tlc, ORT and PyTorch")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument(
        "--threads",
        default=None,
        help="thread counts: --speed's (default 1,2), --profile's (default 1)",
    )
    parser.add_argument("--target-cpu", default="host")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true", help="1-thread rows by CPU time")
    parser.add_argument("--profile", action="store_true", help="per-node time, tlc and ORT")
    parser.add_argument(
        "--fold-batch-norm",
        action="store_true",
        help="--speed: tlc folds batch norms into the weights (tlc.compile(fold_batch_norm=True))",
    )
    parser.add_argument("--top", type=int, default=12, help="--profile: gaps to list")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return
    if args.speed:
        speed(args)
        return
    print("| model | route | import | import s | reference s | tlc.compile s | "
          "rel. error ref | rel. error compiled |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for route in args.routes.split(","):
            try:
                print(row(name, route, args.size, not args.no_compile), flush=True)
            except Exception as exc:  # a refused import is a row, not the end of the table
                print(f"| {name} | {route} | no: {str(exc).splitlines()[0]} | | | | | |")


if __name__ == "__main__":
    main()
