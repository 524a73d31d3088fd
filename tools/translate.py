"""tlc-translate: move graphs between tlc and other tools (PyTorch, ONNX, MLIR generic form).

    tlc-translate --import-torch model.py:factory --input-shape 1,3,8,8 [-o out.tlir]
    tlc-translate --import-onnx model.onnx [--input-shape 1,3,8,8] [-o out.tlir]
    tlc-translate --export-onnx graph.tlir [--payload p.npz] [--dtype f32|f64] -o model.onnx
    tlc-translate --to-mlir graph.tlir          (MLIR generic form, readable by xDSL and MLIR)
    tlc-translate --from-mlir graph.mlir        (back to .tlir)

Imports print the graph with its payload inline (`tl.payload`), or write the payload to
`--payload-out p.npz`; `--emit` picks the text form (tlir, mlir, listing, dot). `--input-shape`
takes comma-separated extents (`4`, `2,3`); repeat it for a model with several inputs.
Exit codes: 0 success, 1 diagnostics, 2 usage error, 70 internal error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from tlc.api.emit import EMITTERS
from tlc.core.diagnostics import DiagnosticError, SourceManager
from tlc.frontends.text import parse_source
from tlc.semantics.program import Traced
from tlc.tools.common import read_input, run_tool, tool_parser, write_output

TEXT_FORMATS = ("tlir", "mlir", "listing", "dot")


def build_parser() -> argparse.ArgumentParser:
    p = tool_parser("tlc-translate", __doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--import-torch", metavar="FILE.py:FACTORY",
                      help="trace the module FACTORY() returns with torch.fx")  # fmt: skip
    mode.add_argument("--import-onnx", metavar="MODEL.onnx", help="import an ONNX model")
    mode.add_argument("--export-onnx", metavar="GRAPH", help="write a .tlir/.mlir graph as ONNX")
    mode.add_argument("--to-mlir", metavar="GRAPH", help="print a .tlir document in MLIR form")
    mode.add_argument("--from-mlir", metavar="GRAPH", help="read MLIR generic form")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument("--input-shape", action="append", default=None, metavar="D1,D2,...",
                   help="an input's shape (once per input)")  # fmt: skip
    p.add_argument("--name", help="name of the imported graph")
    p.add_argument("--graph", help="the graph to export (@name), if the document has several")
    p.add_argument("--payload", help="payload .npz for --export-onnx (default: inline)")
    p.add_argument("--payload-out", help="write an import's payload here instead of inline")
    p.add_argument("--emit", choices=TEXT_FORMATS, default="tlir", help="output text form")
    p.add_argument("--dtype", choices=("f32", "f64"), default="f32", help="ONNX float type")
    return p


def parse_shape(text: str) -> tuple[int, ...]:
    items = [t for t in text.replace("x", ",").split(",") if t.strip()]
    try:
        shape = tuple(int(t) for t in items)
    except ValueError:
        raise DiagnosticError.simple(f"--input-shape: '{text}' is not a list of extents") from None
    if any(d < 0 for d in shape):
        raise DiagnosticError.simple(f"--input-shape: '{text}' has a negative extent")
    return shape


def load_factory(spec: str) -> Callable[[], Any]:
    path, colon, name = spec.rpartition(":")
    if not colon or not path or not name:
        raise DiagnosticError.simple(f"--import-torch: expected FILE.py:FACTORY, got '{spec}'")
    if not os.path.exists(path):
        raise DiagnosticError.simple(f"cannot read '{path}': No such file or directory")
    module_spec = importlib.util.spec_from_file_location("tlc_torch_model", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise DiagnosticError.simple(f"--import-torch: '{path}' defines no callable '{name}'")
    return factory


def import_torch(args: argparse.Namespace) -> Traced:
    if not args.input_shape:
        raise DiagnosticError.simple("--import-torch needs --input-shape")
    import torch

    from tlc.frontends.import_torch import from_torch

    model = load_factory(args.import_torch)()
    torch.manual_seed(0)
    examples = tuple(torch.randn(*parse_shape(s)) for s in args.input_shape)
    return from_torch(model, examples if len(examples) > 1 else examples[0], args.name)


def import_onnx(args: argparse.Namespace) -> Traced:
    from tlc.frontends.import_onnx import from_onnx

    shapes = None if not args.input_shape else [parse_shape(s) for s in args.input_shape]
    return from_onnx(args.import_onnx, shapes, args.name)


def emit_imported(args: argparse.Namespace, traced: Traced) -> int:
    from tlc.core.payload import save_npz

    module = traced.module
    if args.payload_out and traced.per_output:
        graphs = ", ".join(f"@{t.graph.graph_name}" for t in traced.per_output)
        raise DiagnosticError.simple(
            f"--payload-out writes one graph's payload, but the model imports as "
            f"{len(traced.per_output)} graphs, one per output ({graphs}); leave the payloads "
            "inline"
        )
    if args.payload_out:
        save_npz(traced.payload, args.payload_out)
    else:
        module = traced.document()
    write_output(args.output, EMITTERS[args.emit](module))
    return 0


def export_onnx(args: argparse.Namespace, sources: SourceManager) -> int:
    import numpy as np

    from tlc.api.evaluate import checked_graph, resolve_payload
    from tlc.frontends.export_onnx import to_onnx

    module = read_document(args.export_onnx, sources, None)
    graph = checked_graph(module, args.graph)
    payload = resolve_payload(module, graph, args.payload)
    model = to_onnx(graph, payload, np.float32 if args.dtype == "f32" else np.float64)
    data = model.SerializeToString()
    if args.output == "-":
        sys.stdout.buffer.write(data)
        return 0
    try:
        with open(args.output, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise DiagnosticError.simple(f"cannot write '{args.output}': {exc.strerror}") from None
    return 0


def read_document(path: str, sources: SourceManager, mlir: bool | None) -> ModuleOp:
    name, text = read_input(path)
    sources.add(name, text)
    return parse_source(text, name, mlir=mlir)


def main(argv: list[str] | None = None) -> int:
    sources = SourceManager()
    return run_tool(lambda: _main(argv, sources), "tlc-translate", sources)


def _main(argv: list[str] | None, sources: SourceManager) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.import_torch:
        return emit_imported(args, import_torch(args))
    if args.import_onnx:
        return emit_imported(args, import_onnx(args))
    if args.export_onnx:
        return export_onnx(args, sources)
    if args.to_mlir:
        module = read_document(args.to_mlir, sources, False)
        write_output(args.output, EMITTERS["mlir"](module))
        return 0
    module = read_document(args.from_mlir, sources, True)
    write_output(args.output, EMITTERS[args.emit](module))
    return 0


if __name__ == "__main__":
    sys.exit(main())
