"""Single convolution layers (+ relu) timed against ONNX Runtime, one thread, thread CPU time.

    python bench/conv_layers.py [--nets resnet18,squeezenet1_0] [--only 3x3] [--batch 1]
                                [--repeats 5] [--target-cpu host]

Every distinct convolution of resnet18 and squeezenet1_0 at 224 x 224 (their counts in the
networks beside them), or `--only` those whose description contains the text: each layer is a
`torch.nn.Conv2d` + ReLU with random weights, exported to ONNX (dynamo=False), the same file
compiled by tlc (`tlc.from_onnx`, `tlc.compile` f32, one thread) and run by ONNX Runtime
(intra_op_num_threads = 1). The two take turns, `--repeats` rounds of a timed loop each, so
load drifting on a shared machine hits them alike; a row per layer gives the medians as
GFLOP/s, tlc's share of one core's measured FMA peak (bench/run.py's `peak_gflops`, with the
vectors of `--target-cpu`: 256-bit for znver3), ORT/tlc (above 1: tlc is faster) and the
kernel tlc chose (`convolution.kernel_name`). The last line is the layers weighted by their
counts. Outputs are checked against ORT first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import peak_gflops  # noqa: E402

import tlc  # noqa: E402

#: (in, out, kernel, stride, padding, input extent): count, per network.
LAYERS = {
    "resnet18": {
        (3, 64, 7, 2, 3, 224): 1, (64, 64, 3, 1, 1, 56): 4, (64, 128, 3, 2, 1, 56): 1,
        (128, 128, 3, 1, 1, 28): 3, (64, 128, 1, 2, 0, 56): 1, (128, 256, 3, 2, 1, 28): 1,
        (256, 256, 3, 1, 1, 14): 3, (128, 256, 1, 2, 0, 28): 1, (256, 512, 3, 2, 1, 14): 1,
        (512, 512, 3, 1, 1, 7): 3, (256, 512, 1, 2, 0, 14): 1,
    },
    # torchvision mobilenet_v2: its stem and 1x1 layers (the depthwise ones have groups).
    "mobilenet_v2": {
        (3, 32, 3, 2, 1, 224): 1, (32, 16, 1, 1, 0, 112): 1, (16, 96, 1, 1, 0, 112): 1,
        (96, 24, 1, 1, 0, 56): 1, (24, 144, 1, 1, 0, 56): 2, (144, 24, 1, 1, 0, 56): 1,
        (144, 32, 1, 1, 0, 28): 1, (32, 192, 1, 1, 0, 28): 3, (192, 32, 1, 1, 0, 28): 2,
        (192, 64, 1, 1, 0, 14): 1, (64, 384, 1, 1, 0, 14): 4, (384, 64, 1, 1, 0, 14): 3,
        (384, 96, 1, 1, 0, 14): 1, (96, 576, 1, 1, 0, 14): 3, (576, 96, 1, 1, 0, 14): 2,
        (576, 160, 1, 1, 0, 7): 1, (160, 960, 1, 1, 0, 7): 3, (960, 160, 1, 1, 0, 7): 2,
        (960, 320, 1, 1, 0, 7): 1, (320, 1280, 1, 1, 0, 7): 1,
    },
    "squeezenet1_0": {
        (3, 96, 7, 2, 0, 224): 1, (96, 16, 1, 1, 0, 54): 1, (16, 64, 1, 1, 0, 54): 2,
        (16, 64, 3, 1, 1, 54): 2, (128, 16, 1, 1, 0, 54): 1, (128, 32, 1, 1, 0, 54): 1,
        (32, 128, 1, 1, 0, 54): 1, (32, 128, 3, 1, 1, 54): 1, (256, 32, 1, 1, 0, 27): 1,
        (32, 128, 1, 1, 0, 27): 1, (32, 128, 3, 1, 1, 27): 1, (256, 48, 1, 1, 0, 27): 1,
        (48, 192, 1, 1, 0, 27): 2, (48, 192, 3, 1, 1, 27): 2, (384, 48, 1, 1, 0, 27): 1,
        (384, 64, 1, 1, 0, 27): 1, (64, 256, 1, 1, 0, 27): 1, (64, 256, 3, 1, 1, 27): 1,
        (512, 64, 1, 1, 0, 13): 1, (64, 256, 1, 1, 0, 13): 1, (64, 256, 3, 1, 1, 13): 1,
        (512, 1000, 1, 1, 0, 13): 1,
    },
    # bench/run.py's CNN on 3x32x32 images (run it at --batch 64).
    "cnn": {(3, 16, 3, 1, 1, 32): 1, (16, 32, 3, 2, 1, 32): 1},
    # ONNX zoo resnet50 (bench/zoo.py; the stride in the 3x3 layers, as torchvision's).
    "resnet50": {
        (3, 64, 7, 2, 3, 224): 1, (64, 64, 1, 1, 0, 56): 1, (64, 64, 3, 1, 1, 56): 3,
        (64, 256, 1, 1, 0, 56): 4, (256, 64, 1, 1, 0, 56): 2, (256, 128, 1, 1, 0, 56): 1,
        (128, 128, 3, 2, 1, 56): 1, (256, 512, 1, 2, 0, 56): 1, (128, 512, 1, 1, 0, 28): 4,
        (512, 128, 1, 1, 0, 28): 3, (128, 128, 3, 1, 1, 28): 3, (512, 256, 1, 1, 0, 28): 1,
        (256, 256, 3, 2, 1, 28): 1, (512, 1024, 1, 2, 0, 28): 1, (256, 1024, 1, 1, 0, 14): 6,
        (1024, 256, 1, 1, 0, 14): 5, (256, 256, 3, 1, 1, 14): 5, (1024, 512, 1, 1, 0, 14): 1,
        (512, 512, 3, 2, 1, 14): 1, (1024, 2048, 1, 2, 0, 14): 1, (512, 2048, 1, 1, 0, 7): 3,
        (2048, 512, 1, 1, 0, 7): 2, (512, 512, 3, 1, 1, 7): 2,
    },
}  # fmt: skip


def describe(layer: tuple[int, ...]) -> str:
    cin, cout, kernel, stride, pad, size = layer
    return f"{cin} -> {cout} {kernel}x{kernel} s{stride} p{pad} on {size}x{size}"


def timed(fn, n: int) -> float:
    start = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - start) / n


def measure(layer: tuple[int, ...], batch: int, repeats: int, target_cpu: str) -> tuple:
    """(tlc s, ORT s, GFLOP, kernel) per call of one layer."""
    import onnxruntime as ort

    from tlc.codegen.lower.convolution import ConvFrame, kernel_name
    from tlc.codegen.lower.windows import Window
    from tlc.codegen.target import Target, target_info

    cin, cout, kernel, stride, pad, size = layer
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, kernel, stride, pad), torch.nn.ReLU())
    x = torch.randn(batch, cin, size, size)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        path = str(Path(tmp) / "conv.onnx")
        torch.onnx.export(net.eval(), (x,), path, dynamo=False)
        traced = tlc.from_onnx(path)
        model = Path(path).read_bytes()
    compiled = tlc.compile(traced, dtype="f32", threads=1, target_cpu=target_cpu)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    xs = x.numpy()
    feed = {session.get_inputs()[0].name: xs}
    runners = {"tlc": lambda: compiled(xs), "ort": lambda: session.run(None, feed)[0]}
    got, expected = np.asarray(runners["tlc"]()), runners["ort"]()
    assert np.abs(got - expected).max() <= 1e-3 * max(np.abs(expected).max(), 1), layer
    n = max(1, int(0.2 / max(timed(runners["tlc"], 1), 1e-6)))
    samples: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(repeats):
        for label, run in runners.items():
            samples[label].append(timed(run, n))
    out = (size + 2 * pad - kernel) // stride + 1
    gflop = 2 * batch * cout * cin * kernel * kernel * out * out / 1e9
    window = Window((size, size), (out, out), (stride,) * 2, (1, 1), (pad,) * 2, (kernel,) * 2)
    frame = ConvFrame(batch, 1, cin, cout, size * size, out * out, window)
    chosen = kernel_name(target_info(Target(cpu=target_cpu)), 4, frame)
    return (statistics.median(samples["tlc"]), statistics.median(samples["ort"]), gflop,
            chosen)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="resnet18,squeezenet1_0",
                        help=f"of {', '.join(LAYERS)}")  # fmt: skip
    parser.add_argument("--only", default="", help="layers whose description contains this")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target-cpu", default="host")
    args = parser.parse_args()
    from tlc.codegen.target import resolve_target

    peak = peak_gflops(target=resolve_target(args.target_cpu))
    print(f"one core's float32 FMA peak (measured): {peak:.1f} GFLOP/s; batch {args.batch}")
    print("| layer (+ relu) (count) | tlc GFLOP/s | % of peak | ORT GFLOP/s | ORT/tlc | kernel |")
    print("|---|---:|---:|---:|---:|---|")
    total_tlc = total_ort = 0.0
    for net in args.nets.split(","):
        for layer, count in LAYERS[net].items():
            if args.only not in describe(layer):
                continue
            t, o, gflop, chosen = measure(layer, args.batch, args.repeats, args.target_cpu)
            total_tlc, total_ort = total_tlc + count * t, total_ort + count * o
            print(f"| {describe(layer)} ({count}) | {gflop / t:.1f} | {gflop / t / peak:.0%} | "
                  f"{gflop / o:.1f} | {o / t:.2f} | {chosen} |", flush=True)  # fmt: skip
    if total_tlc:
        print(f"weighted by count: tlc {total_tlc * 1e3:.2f} ms, ORT {total_ort * 1e3:.2f} ms, "
              f"ORT/tlc {total_ort / total_tlc:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
