"""tlc: an MLIR-style compiler for neural-network graphs.

Every entry point that takes a document accepts .tlir/.mlir text, the path of such a file (a str
ending in .tlir/.mlir, or an `os.PathLike`), a parsed module, or the `Traced` object that
`tlc.trace`, `tlc.from_torch` and `tlc.from_onnx` return (with its payload). `dtype` is "f64" or
"f32" (or `numpy.float64`/`numpy.float32`) everywhere: the reference (`tlc.run`, `tlc.ibp`)
defaults to "f64", compiled code (`tlc.compile`) to "f32" like PyTorch and ONNX Runtime. Inputs,
to every entry point including compiled and loaded code, may be numbers, nested lists, numpy
arrays of any real dtype or torch tensors, read as float64 and rounded to `dtype`
(`tlc.core.arrays`). A `DiagnosticError` (bad input) prints as the tools print it:
`file:line:col: error: message`, the source line and a caret.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xdsl.dialects.builtin import ModuleOp

    from tlc.api.evaluate import Source
    from tlc.semantics.interpret import ValueTable


def __getattr__(name: str) -> Any:
    """`tlc.__version__`, read from the installed package's metadata only when asked for
    (importlib.metadata costs more start-up time than the rest of `import tlc`), and
    `tlc.DiagnosticError`, the exception every entry point raises for bad input."""
    if name == "__version__":
        from importlib.metadata import version

        return version("tlc")
    if name == "DiagnosticError":
        from tlc.core.diagnostics import DiagnosticError

        return DiagnosticError
    raise AttributeError(f"module 'tlc' has no attribute '{name}'")


def parse(source: str, filename: str = "<string>") -> ModuleOp:
    """Parse .tlir text (or MLIR generic form when `filename` ends in .mlir) into a module."""
    from tlc.frontends.text import parse_source

    return parse_source(source, filename)


def run(
    source_or_module: Source,
    x: Any,
    payload: Any = None,
    dtype: Any = "f64",
    graph: str | None = None,
    *,
    arithmetic: str | None = None,
) -> ValueTable:
    """Evaluate a graph by its reference semantics in f64 (default) or f32; returns the value
    table. `payload`: a `tlc.core.payload.Payload`, an .npz path or `{"1.weight": array}`;
    default the document's inline payload (a `Traced`'s own). `arithmetic=` is the deprecated
    spelling of `dtype=`. See `tlc.api.evaluate.run`.
    """
    from tlc.api.evaluate import dtype_name, scalar_type
    from tlc.api.evaluate import run as run_graph

    name = dtype_name(scalar_type(dtype, arithmetic))
    return run_graph(source_or_module, x, payload, name, graph)


def ibp(
    source_or_module: Source,
    x: Any,
    radius: float,
    payload: Any = None,
    graph: str | None = None,
    dtype: Any = "f64",
    *,
    arithmetic: str | None = None,
) -> list[Any]:
    """Interval bound propagation: a `Box` (lo, hi) per node, or None where no sound rule
    applies, for inputs within `radius` (l-infinity) of `x`. The boxes enclose the real values
    and the `dtype` (f64/f32) reference values. See docs/intervals.md."""
    from tlc.api.bounds import ibp as propagate
    from tlc.api.evaluate import dtype_name, scalar_type

    name = dtype_name(scalar_type(dtype, arithmetic))
    return propagate(source_or_module, x, radius, payload, graph, name)


def bounds(source_or_module: Any, lo: Any = None, hi: Any = None, **options: Any) -> Any:
    """Sound bounds of the output over an input box: `lo`/`hi` or `center=`/`radius=` (a number
    or per coordinate), a batch of boxes with a leading axis; `C=` a specification matrix,
    `method=` "ibp" | "crown" | "crown-ibp", `dtype=` "f64" | "f32". Returns `.lower`, `.upper`,
    `.node(k)`. See docs/verification.md."""
    from tlc.api.bounds import bounds as compute

    return compute(source_or_module, lo, hi, **options)


def check_samples(
    source_or_module: Source,
    x: Any,
    radius: float,
    samples: int = 50,
    payload: Any = None,
    graph: str | None = None,
    dtype: Any = "f64",
    *,
    arithmetic: str | None = None,
) -> Any:
    """Check `samples` deterministic inputs of the ball against every node's box; returns a
    `SampleReport` (`.ok`, `.violation` with node, input, value and box). See docs/intervals.md."""
    from tlc.api.bounds import check_samples as check
    from tlc.api.evaluate import dtype_name, scalar_type

    name = dtype_name(scalar_type(dtype, arithmetic))
    return check(source_or_module, x, radius, samples, payload, graph, name)


def plan(
    source_or_module: Source,
    device: str = "cpu",
    provider: str = "auto",
    allow_trusted_external: bool = False,
) -> ModuleOp:
    """Run select-kernels: attach a kernel plan to every graph and return the module.

    `provider` is `auto` (reference, then llvm, then torch), `prefer:P` or `only:P`; see
    docs/kernels.md. `tlc.api.emit.EMITTERS["plan"](module)` prints the plan in the seed's form.
    """
    from tlc.api.execute import plan_module

    return plan_module(source_or_module, device, provider, allow_trusted_external)


def execute_plan(
    source_or_module: Source,
    x: Any,
    payload: Any = None,
    dtype: Any = "f64",
    graph: str | None = None,
    *,
    arithmetic: str | None = None,
) -> ValueTable:
    """Like `tlc.run`, but every node runs on the kernel capsule its plan selected, bound to
    that capsule's handler (reference, llvm or torch); the graph must have been planned."""
    from tlc.api.evaluate import dtype_name, scalar_type
    from tlc.api.execute import run_plan

    name = dtype_name(scalar_type(dtype, arithmetic))
    return run_plan(source_or_module, x, payload, name, graph)


def compile(
    source_or_module: Source,
    payload: Any = None,
    dtype: Any = "f32",
    graph: str | None = None,
    batch: int | None = None,
    *,
    target_cpu: str = "host",
    target_features: str = "",
    target_triple: str = "",
    threads: int | None = None,
    fold_batch_norm: bool = False,
) -> Any:
    """JIT-compile a graph to native code: a callable `f(x) -> output` computing in `dtype`
    ("f32", the default as in PyTorch and ONNX Runtime, or "f64"; or a numpy float type). Inputs
    are cast by the module's rule; `f(x, out=y)` fills `y`. `payload` as in `tlc.run`; it is
    baked into the code. `batch=N` maps a single-example graph over a leading axis of N.
    `target_cpu`, `target_features` and `target_triple` choose the code (default: this CPU); a
    target this machine cannot run is refused. `threads` (default: every CPU this process may
    use) runs the parallel regions; results are identical for any count. See docs/threads-memory.md.
    `fold_batch_norm=True` first folds each batch norm after a conv or linear layer into its
    weights (the `fold-batch-norm` pass, docs/tlc-opt.md: faster, other bits).
    """
    from tlc.api.evaluate import choose, quoting, scalar_type
    from tlc.codegen.jit import compile_graph
    from tlc.codegen.target import resolve_target

    scalar = scalar_type(dtype)
    target = resolve_target(target_cpu, target_features, target_triple)
    chosen, records = choose(source_or_module, graph, payload)
    with quoting(chosen):
        if fold_batch_norm:
            from tlc.passes.fold_batch_norm import folded_for_compile

            chosen, records = folded_for_compile(chosen, records)
        return compile_graph(chosen, records, scalar, batch, target=target, threads=threads)


def load(path: str | os.PathLike[str], threads: int | None = None) -> Any:
    """Open a shared library written by tlc-compile as a callable on numpy arrays (one entry
    point per graph: `lib(x)` for a single graph, `lib["name"](x)` otherwise), its entry points
    running on `threads` threads (default: every CPU this process may use). See docs/c-abi.md.
    """
    from tlc.codegen.loader import load as load_library

    return load_library(os.fspath(path), threads)


def trace(program: Any, input_shape: Any, params: Any = None, name: str | None = None) -> Any:
    """Trace `program(ops, x, params)`, written against the operations interface, into a checked
    graph plus its payload keyed by node id (`tlc.semantics.program.Traced`).
    See docs/programs.md."""
    from tlc.semantics.program import trace as trace_program

    return trace_program(program, input_shape, params, name)


def jvp(graph: Any, payload: Any, x: Any, tangent: Any, param_tangents: Any = None) -> Any:
    """Forward mode: `(output, tangent of the output)` at `x` along `tangent` (and
    `param_tangents`, node id -> field -> array). `graph` is a tl.graph op or a document.
    See docs/autodiff.md."""
    from tlc.api.autodiff import jvp as forward

    return forward(graph, payload, x, tangent, param_tangents)


def vjp(graph: Any, payload: Any, x: Any, cotangent: Any = None) -> Any:
    """Reverse mode: `(input cotangent, parameter cotangents keyed like the payload)` for
    `cotangent` at the output (default ones: the gradient of a scalar output)."""
    from tlc.api.autodiff import vjp as reverse

    return reverse(graph, payload, x, cotangent)


def grad(graph: Any, payload: Any = None, params: bool = True) -> Any:
    """The gradient graph `@name_grad`: `(graph op, payload, layout)`; its output is the flat
    vector [output, d input, d params...] that `layout.unpack` cuts apart."""
    from tlc.api.autodiff import grad as gradient_graph

    return gradient_graph(graph, payload, params)


def from_torch(
    module: Any, example_input: Any, name: str | None = None, dynamic_batch: bool = False
) -> Any:
    """Trace a PyTorch module with torch.fx on `example_input` (a tensor, or a tuple for several
    inputs): a `tlc.semantics.program.Traced` (module, graph, payload keyed by node id). With
    `dynamic_batch=True` the inputs' leading dimension is the batch extent `N`, so the graph
    runs at any batch size. See docs/importing.md."""
    from tlc.frontends.import_torch import from_torch as import_module

    return import_module(module, example_input, name, dynamic_batch)


def from_onnx(model: Any, input_shapes: Any = None, name: str | None = None) -> Any:
    """Import an ONNX model (a path or an `onnx.ModelProto`): a `tlc.semantics.program.Traced`.
    A symbolic leading (batch) dimension becomes the batch extent `N`; `input_shapes` fixes
    symbolic input dimensions instead. A model with several outputs is one graph per output
    (`graph="name"` chooses one; `.per_output`); integer tensors are held as reals, checked by
    `tlc.run`. See docs/importing.md."""
    from tlc.frontends.import_onnx import from_onnx as import_model

    return import_model(model, input_shapes, name)


def to_onnx(graph: Any, payload: Any = None, dtype: Any = "f32", batch: int | None = None) -> Any:
    """An `onnx.ModelProto` computing `graph` (a tl.graph op or a document) with `payload`
    (default: the document's inline payload), in float32 ("f32") or float64 ("f64"); a graph
    with the batch extent `N` is exported with the symbolic dimension `N` (any batch size), or
    for `batch` rows."""
    from tlc.api.evaluate import choose, scalar_type
    from tlc.dialect.batch import has_batch, specialise
    from tlc.dialect.ops import GraphOp
    from tlc.frontends.export_onnx import to_onnx as export

    scalar = scalar_type(dtype)
    chosen = graph
    if not isinstance(graph, GraphOp):
        chosen, payload = choose(graph, None, payload)
    if batch is not None and has_batch(chosen):
        chosen = specialise(chosen, batch)
    return export(chosen, payload, scalar)
