"""What running a document needs besides the denotation: choosing the graph, its payload, its input.

Shared by `tlc.run` and the `tlc-run` tool (and by any other scalar context run over a parsed
document, such as interval bound propagation), so both accept the same things and report the
same diagnostics.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from tlc.core.arrays import as_float_array
from tlc.core.diagnostics import DiagnosticError, SourceManager, did_you_mean, error
from tlc.core.npyio import read_npy
from tlc.core.payload import Payload, load_npz
from tlc.dialect.batch import batch_of, batch_of_value, concrete, has_batch, specialise
from tlc.dialect.ops import GraphOp, InputOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.program_ops import ProgramOp
from tlc.dialect.shapes import BATCH, fmt_shape, numel
from tlc.frontends.text import parse_source, read_document

if TYPE_CHECKING:
    from tlc.semantics.interpret import ValueTable
    from tlc.semantics.program import Traced


#: What the Python API accepts as a document: .tlir/.mlir text, the path of such a file (str or
#: os.PathLike), a parsed module, or what `tlc.trace`/`tlc.from_torch`/`tlc.from_onnx` return.
Source: TypeAlias = "str | os.PathLike[str] | ModuleOp | Traced"

DOCUMENT_SUFFIXES = (".tlir", ".mlir")

#: The text each module parsed here came from, so later diagnostics on it can quote it.
_TEXTS: weakref.WeakKeyDictionary[ModuleOp, tuple[str, str]] = weakref.WeakKeyDictionary()


def as_module(source: Source, filename: str = "<string>") -> ModuleOp:
    """A parsed module: `source` is a module already, a `Traced`, a path, or document text.

    A str is a path when it is one line ending in .tlir/.mlir (a document never is); an
    `os.PathLike` always is. Diagnostics quote the text (see `quoting`)."""
    from tlc.semantics.program import Traced

    if isinstance(source, ModuleOp):
        return source
    if isinstance(source, Traced):
        return source.module
    if isinstance(source, os.PathLike) or _is_path(source):
        filename = os.fspath(source)
        text = read_document(filename)
    elif isinstance(source, str):
        text = source
    else:
        raise TypeError(
            "expected .tlir text, a path, a parsed module or a traced graph, "
            f"got {type(source).__name__}"
        )
    with _quoting_text(filename, text):
        module = parse_source(text, filename)
    _TEXTS[module] = (filename, text)
    return module


def _is_path(source: object) -> bool:
    return isinstance(source, str) and "\n" not in source and source.endswith(DOCUMENT_SUFFIXES)


@contextmanager
def quoting(op: Operation) -> Iterator[None]:
    """Diagnostics escaping the block quote the text `op`'s module was parsed from, so
    `str(exc)` shows file:line:col, the source line and a caret as the tools print them."""
    filename, text = _texts_of(op)
    with _quoting_text(filename, text):
        yield


def _texts_of(op: Operation) -> tuple[str, str]:
    """(file name, text) of the document `op`'s module was parsed from, or empty strings."""
    top = op
    while (parent := top.parent_op()) is not None:
        top = parent
    return _TEXTS.get(top, ("", "")) if isinstance(top, ModuleOp) else ("", "")


@contextmanager
def _quoting_text(filename: str, text: str) -> Iterator[None]:
    try:
        yield
    except DiagnosticError as exc:
        if exc.sources is None:
            exc.sources = SourceManager(from_disk=True)
        if filename:
            exc.sources.add(filename, text)
        raise


#: How a tool's user names a graph; the Python API says `graph='name'` instead.
CHOOSE_FLAG = "--graph @name"
CHOOSE_KEYWORD = "graph='name'"


def select_graph(module: ModuleOp, name: str | None = None, how: str = CHOOSE_FLAG) -> GraphOp:
    """The graph `@name` (the leading `@` is optional), or the only graph of the module; `how`
    is how the caller's user chooses one, for the message when the choice is missing."""
    graphs = [op for op in module.walk() if isinstance(op, GraphOp)]
    if not graphs:
        programs = [op for op in module.walk() if isinstance(op, ProgramOp)]
        if programs:
            names = ", ".join(f"@{op.graph_name}" for op in programs)
            raise error(
                f"the document holds no tl.graph, only tl.program {names}: lower it to a graph "
                "first (tlc-opt -p lower-program; docs/programs.md)",
                programs[0],
            )
    if name is None:
        if len(graphs) != 1:
            names = ", ".join(f"@{g.graph_name}" for g in graphs) or "none"
            raise DiagnosticError.simple(
                f"the document has {len(graphs)} graphs ({names}); choose one with {how}"
            )
        return graphs[0]
    wanted = name.removeprefix("@")
    for graph in graphs:
        if graph.graph_name == wanted:
            return graph
    hint = did_you_mean(f"@{wanted}", [f"@{g.graph_name}" for g in graphs])
    raise DiagnosticError.simple(f"no graph named @{wanted} in the document{hint}")


def checked_graph(module: ModuleOp, name: str | None = None, how: str = CHOOSE_FLAG) -> GraphOp:
    """The graph to run (see `select_graph`), checked as verify-structure and infer-shapes
    would (once: a verified graph is trusted), with omitted shapes filled in. Other graphs of
    the document are left alone, so one broken graph does not stop its neighbours from
    running."""
    from tlc.dialect.verify import graph_shapes

    graph = select_graph(module, name, how)
    for node, shape in zip(graph.nodes, graph_shapes(graph), strict=True):
        if node.declared_shape is None:
            node.set_declared_shape(shape)
    return graph


def resolve_payload(
    module: ModuleOp, graph: GraphOp, payload: Payload | Mapping[str, Any] | str | None
) -> Payload:
    """The payload to run with: the given one (a Payload, an .npz path or `{"1.weight": ...}`),
    else the document's inline `tl.payload` section for the graph."""
    if payload is None:
        return payload_from_module(module, graph.graph_name)
    if isinstance(payload, Payload):
        return payload
    if isinstance(payload, str | os.PathLike):
        return load_npz(os.fspath(payload))
    return Payload.from_flat(payload)


def choose(
    source: Source, graph: str | None, payload: Payload | Mapping[str, Any] | str | None
) -> tuple[GraphOp, Payload]:
    """Parse `source` if it is text or a path (see `as_module`), then the checked graph `graph`
    (see `checked_graph`) and the payload to run it with (see `resolve_payload`; a `Traced`
    brings its own): what every Python entry point starts with."""
    from tlc.semantics.program import Traced

    module = as_module(source)
    with quoting(module):
        chosen = checked_graph(module, graph, CHOOSE_KEYWORD)
        if isinstance(source, Traced) and payload is None and chosen is source.graph:
            payload = source.payload  # another graph of its module has its inline payload
        return chosen, resolve_payload(module, chosen, payload)


#: The scalar types of the reference semantics and of compiled code, by their short names.
DTYPE_NAMES: dict[str, type] = {"f64": np.float64, "f32": np.float32}


def scalar_type(dtype: Any = "f64", arithmetic: str | None = None) -> type:
    """The numpy float type the Python API's `dtype` names: "f64"/"f32", `np.float64`/
    `np.float32` or their `np.dtype`. `arithmetic` is the keyword `tlc.run` and `tlc.ibp` used
    to take; it still works, with a DeprecationWarning. A bad value is a ValueError listing the
    choices (an argument error, not a diagnostic about the document)."""
    if arithmetic is not None:
        warnings.warn(
            "the arithmetic= keyword is deprecated; use dtype= (same values)",
            DeprecationWarning,
            stacklevel=3,
        )
        dtype = arithmetic
    try:
        scalar = np.dtype(DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype).type
    except TypeError:
        scalar = None
    if scalar not in DTYPE_NAMES.values():
        raise ValueError(f"dtype must be 'f64' or 'f32' (or numpy.float64/float32), got {dtype!r}")
    return scalar


def dtype_name(scalar: type) -> str:
    """ "f64" or "f32": the name of a type `scalar_type` returned."""
    return next(name for name, t in DTYPE_NAMES.items() if t is scalar)


def dtype_of(arithmetic: str) -> type:
    """The numpy scalar type of `arithmetic` (f64, f32). A Python API argument, so a bad name is
    a ValueError listing the choices, not a diagnostic about the document."""
    from tlc.semantics.interpret import DTYPES

    if arithmetic not in DTYPES:
        raise ValueError(f"arithmetic must be one of {', '.join(DTYPES)}, got {arithmetic!r}")
    return DTYPES[arithmetic]


def as_array(x: Any) -> np.ndarray:
    """An input value read by the API's one rule (`tlc.core.arrays.as_float_array`), as
    float64; the entry point then rounds it to its own `dtype`."""
    return as_float_array(x)


def parse_input_text(text: str) -> np.ndarray:
    """`--input` values: a comma-separated list of numbers, or the path of a `.npy` file."""
    if text.endswith(".npy"):
        return read_npy(text, "input").astype(np.float64)
    items = [item.strip() for item in text.split(",")]
    values = []
    for i, item in enumerate(items):
        try:
            values.append(float(item))
        except ValueError:
            raise DiagnosticError.simple(f"--input: item {i} ('{item}') is not a number") from None
    return np.array(values, dtype=np.float64)


def shape_input(value: np.ndarray, shape: tuple[int, ...], what: str = "--input") -> np.ndarray:
    """A flat list of numbers reshaped to the input node's shape (row-major), if the count fits.
    With the batch extent `N` in `shape`, any batch size fits: an array of that rank whose
    other extents match, or a flat list of a multiple of the other extents' product."""
    if BATCH in shape:
        batch = batch_of_value(shape, value.shape)
        if batch is not None:
            return value.reshape(concrete(shape, batch))
        expected = f"a multiple of {numel(concrete(shape, 1))}"
    elif value.shape == shape or (value.ndim == 1 and value.size == numel(shape)):
        return value.reshape(shape)
    else:
        expected = f"{numel(shape)}"
    got = f"{value.size}" if value.ndim == 1 else f"an array of shape {fmt_shape(value.shape)}"
    raise DiagnosticError.simple(
        f"{what}: expected {expected} values for input shape {fmt_shape(shape)}, got {got}"
    )


def for_batch(graph: GraphOp, x: Any) -> GraphOp:
    """`graph` with the batch extent `N` specialised to the batch size of its inputs `x` (as
    `tlc.semantics.interpret.bind_inputs` takes them), keeping the source text for messages."""
    from tlc.semantics.interpret import given_inputs

    shapes = {nid: np.shape(as_array(v)) for nid, v in given_inputs(graph, x).items()}
    specialised = specialise(graph, batch_of(graph, shapes))
    _TEXTS[ModuleOp([specialised])] = _texts_of(graph)
    return specialised


def shape_single_input(graph: GraphOp, x: Any, what: str = "input") -> Any:
    """`x` for a graph with one input node, a flat list reshaped to that node's shape (see
    `shape_input`); the other forms (a list per input, `{node id: value}`) pass unchanged."""
    inputs = [n for n in graph.nodes if isinstance(n, InputOp)]
    if len(inputs) != 1 or isinstance(x, Mapping):
        return x
    declared = inputs[0].declared_shape
    assert declared is not None, "infer-shapes fills in every shape"
    return shape_input(as_array(x), declared, what)


def prepare(
    source: Source,
    x: Any,
    payload: Payload | Mapping[str, Any] | str | None,
    graph: str | None,
) -> tuple[GraphOp, Payload, Any]:
    """Check the document, choose the graph and its payload, and shape a flat single input: the
    common start of `tlc.run`, `tlc.ibp` and `tlc.check_samples`."""
    chosen, records = choose(source, graph, payload)
    x = shape_single_input(chosen, x)
    if has_batch(chosen):
        chosen = for_batch(chosen, x)
    return chosen, records, x


def run(
    source: Source,
    x: Any,
    payload: Payload | Mapping[str, Any] | str | None = None,
    arithmetic: str = "f64",
    graph: str | None = None,
) -> ValueTable:
    """`tlc.run`: check the document, then evaluate graph `graph` on `x` in `arithmetic`.

    `x` is the input value (a flat list is reshaped to the input node's shape), or for a graph
    with several input nodes a list (in node order) or `{node id: value}`. A `Traced` import's
    integer and float16 values are checked to be numbers of their types (`Traced.check_values`).
    """
    from tlc.semantics.interpret import interpret
    from tlc.semantics.program import Traced

    dtype = dtype_of(arithmetic)
    chosen, records, x = prepare(source, x, payload, graph)
    with quoting(chosen):
        table = interpret(chosen, records, x, dtype)
    if isinstance(source, Traced):  # an import's integer and float16 values are of their types
        for part in source.per_output or [source]:
            if part.graph.graph_name == chosen.graph_name:
                part.check_values(table.values, dtype)
    return table
