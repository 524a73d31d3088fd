"""The JIT: compile a graph (or one node) in-process and call it on numpy arrays.

Code goes through the same path as a shared library (`tlc.codegen.objcache`: O3 and object
code, or the same bytes from the user's object cache), for the host CPU by default or for a
`Target` this machine can run (AVX2 kernels on an AVX-512 host, say), and is linked into one
process-wide LLJIT per target; libm symbols (tanh, erf, log1p) resolve from the running
process. The LLJIT links with JITLink, which maps all of an object's sections in one block
and reaches symbols outside it through stubs of its own: RuntimeDyld, llvmlite's default,
maps code and constants separately, and in a process with gigabytes mapped they can land
more than 2 GiB apart, out of reach of the code's 32-bit PC-relative references (LLVM then
aborts the process; tests/test_jit_link.py). Compiled code is cached in-process by the
graph's printed form, the payload's bytes, the dtype, the batch size and the target, so
compiling the same graph twice costs a hash.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache

import llvmlite.binding as llvm
import numpy as np

from tlc.codegen import objcache
from tlc.codegen.builder import Status
from tlc.codegen.loader import EntryPoint, raise_for_status
from tlc.codegen.module import (
    GraphModule,
    ParamSlot,
    bakes_payload,
    bound_params,
    build_graph_module,
    build_node_module,
    kernels_apart,
)
from tlc.codegen.runtime import available_cpus, helper_symbols
from tlc.codegen.target import HOST, Target, host_lacks, target_machine
from tlc.core.arrays import as_float_array
from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload, Record
from tlc.dialect.batch import PROBES, PerBatch, batch_of_value, has_batch, specialise
from tlc.dialect.ops import GraphOp, InputOp, NodeOp
from tlc.dialect.printer import print_mlir_op
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.dialect.verify import graph_shapes
from tlc.semantics.reference import LOG_MESSAGE, eval_error

CompiledGraph = EntryPoint

_names = itertools.count()
#: Compiled graphs and nodes of this process, by what they were built from; consulted only
#: while the object cache is on (`TLC_OBJECT_CACHE=0` rebuilds every call, so a code
#: generator constant changed in a running process takes effect).
_graph_cache: dict[tuple, EntryPoint] = {}
_node_cache: dict[tuple, Callable[[list[np.ndarray]], np.ndarray]] = {}


@cache
def _lljit(target: Target) -> llvm.LLJIT:
    return llvm.create_lljit_compiler(target_machine(target), use_jit_link=True)


def jit_link(ir_text: str, symbols: list[str], target: Target = HOST) -> llvm.ResourceTracker:
    """Optimise `ir_text`, emit object code and link it; the tracker maps symbols to addresses
    and keeps the code alive."""
    _check_runnable(target)
    obj = objcache.object_code(ir_text, target)
    return link_object(obj, symbols, target, runtime=RUNTIME_CALL in ir_text)


def _check_runnable(target: Target) -> None:
    missing = host_lacks(target)
    if missing:
        raise DiagnosticError.simple(
            f"cannot run code for target {target.describe()} here: this CPU lacks "
            f"{', '.join(missing)} (use tlc-compile to build a library for it)"
        )


#: The most modules a graph's kernels are spread over (`build_graph_module(kernel_modules=)`),
#: one per CPU this process may use: LLVM compiles them at the same time, in worker processes.
MAX_KERNEL_MODULES = 4


#: The prefix of the runtime's functions (`tlc_rt_parallel`) in generated IR (a graph whose
#: entry point happens to start so only links the helper without need).
RUNTIME_CALL = "tlc_rt_"


def link_object(
    obj: bytes | Sequence[bytes], symbols: list[str], target: Target = HOST, runtime: bool = True
) -> llvm.ResourceTracker:
    """Link object code (one object, or several that call each other: a graph's modules) into
    the process-wide JIT of `target` (see `jit_link`), with the runtime's functions (thread
    pool, workspace cache) taken from its helper library when the code calls them (`runtime`;
    small graphs do not, and need no helper and no C compiler)."""
    builder = llvm.JITLibraryBuilder()
    for one in [obj] if isinstance(obj, bytes) else obj:
        builder.add_object_img(one)
    builder.add_current_process()
    for name, address in helper_symbols().items() if runtime else ():
        builder.import_symbol(name, address)
    for symbol in symbols:
        builder.export_symbol(symbol)
    return builder.link(_lljit(target), f"tlc{next(_names)}")


def _payload_key(payload: Payload | Record | None) -> str:
    digest = hashlib.sha256()
    for key, value in sorted((payload or {}).items()):
        items = value.items() if isinstance(value, dict) else [("", value)]
        for name, array in sorted(items):
            arr = np.ascontiguousarray(array)
            digest.update(f"{key}.{name}{arr.shape}{arr.dtype}".encode())
            digest.update(arr.tobytes())
    return digest.hexdigest()


def compile_graph(
    graph: GraphOp,
    payload: Payload | None,
    dtype: type = np.float64,
    batch: int | None = None,
    runtime_payload: bool = False,
    target: Target = HOST,
    threads: int | None = None,
) -> CompiledGraph:
    """Compile `graph` with its payload baked in (held by the entry point and passed by pointer
    where it exceeds `BAKE_LIMIT`); the result maps an input array to the output, running its
    parallel regions on `threads` threads (default: every CPU this process may use).

    Raises a located DiagnosticError for a bad graph or payload, an op with no lowering, or a
    `target` this CPU cannot run. A graph with the batch extent `N` and no `batch` gives a
    `CompiledPerBatch`, which compiles the graph for each batch size it is called with.
    """
    if has_batch(graph) and batch is None:
        return CompiledPerBatch(graph, payload, dtype, runtime_payload, target, threads)
    key = (
        print_mlir_op(graph, debuginfo=False),
        _payload_key(payload),
        np.dtype(dtype).str,
        batch,
        runtime_payload,
        target,
    )
    count = available_cpus() if threads is None else threads
    if count < 1:
        raise DiagnosticError.simple(f"threads must be at least 1, got {count}")
    hit = _graph_cache.get(key) if objcache.enabled() else None
    if hit is not None:
        return hit if hit.threads == count else replace(hit, threads=count)
    _check_runnable(target)
    # A payload over the bake limit is passed by pointer: the entry point holds it, each field
    # in the layout its kernel reads when baked (`bound_params`).
    bound = not runtime_payload and not bakes_payload(graph, dtype)
    module, objs, runtime = _built(graph, payload, dtype, batch, runtime_payload, bound, target,
                                  key)  # fmt: skip
    held = None
    if bound:
        held = module.bound
        if held is None:  # the object code came from the cache
            held = bound_params(graph, payload or Payload(), dtype, batch, target)
    tracker = link_object(objs, [module.symbol], target, runtime=runtime)
    entry = EntryPoint(
        module.symbol,
        tracker[module.symbol],
        module.input_shape,
        module.output_shape,
        module.dtype,
        module.params_size if module.params is not None else None,
        owner=tracker,
        explain=_explainer(graph, payload, module, batch),
        bound=held,
        threads=count,
    )
    _graph_cache[key] = entry
    return entry


def _built(
    graph: GraphOp,
    payload: Payload | None,
    dtype: type,
    batch: int | None,
    runtime_payload: bool,
    bound: bool,
    target: Target,
    key: tuple,
) -> tuple[GraphModule, list[bytes], bool]:
    """The graph's module (its interface facts; `ir` empty when it came from the cache), its
    object code (one object per module its kernels are spread over) and whether that calls
    the runtime: from the object cache when this exact graph, payload and build were compiled
    before by the same tlc (`objcache.source_digest`) for the same machine, else built,
    compiled (the modules at the same time) and stored."""
    name = objcache.key([objcache.source_digest(), *map(str, key), str(runtime_payload),
                         str(bound)], target)  # fmt: skip
    hit = objcache.load(name)
    if hit is not None:
        joined, facts = hit
        ends = np.cumsum(facts["objects"]).tolist()
        objs = [joined[start:end] for start, end in zip([0, *ends], ends, strict=False)]
        return _module_of(facts), objs, facts["runtime"]
    spread = min(available_cpus(), MAX_KERNEL_MODULES)
    # Workers for the other modules start now, so their imports overlap the build.
    spare = objcache.spawn_workers(spread - 1, target) if kernels_apart(graph) else []
    try:
        module = build_graph_module(graph, payload, dtype, batch=batch,
                                    runtime_payload=runtime_payload, bound_payload=bound,
                                    target=target, kernel_modules=spread)  # fmt: skip
    except BaseException:
        objcache.stop_workers(spare)
        raise
    texts = [module.ir, *module.parts]
    objs = objcache.object_codes([(text, target) for text in texts], cached=False, spare=spare)
    runtime = any(RUNTIME_CALL in text for text in texts)
    facts = {**_facts_of(module), "runtime": runtime, "objects": [len(obj) for obj in objs]}
    objcache.store(name, b"".join(objs), facts)
    return module, objs, runtime


def _facts_of(module: GraphModule) -> dict:
    """What a cache entry keeps of a graph's module (JSON)."""
    params = module.params
    return {
        "symbol": module.symbol,
        "input_shape": list(module.input_shape),
        "output_shape": list(module.output_shape),
        "dtype": module.dtype.str,
        "params": None
        if params is None
        else [[p.node, p.field, p.offset, list(p.shape), p.default] for p in params],
    }


def _module_of(facts: dict) -> GraphModule:
    params = facts["params"]
    return GraphModule(
        "",
        facts["symbol"],
        tuple(facts["input_shape"]),
        tuple(facts["output_shape"]),
        np.dtype(facts["dtype"]),
        None if params is None else tuple(ParamSlot(n, f, o, tuple(shape), d)
                                          for n, f, o, shape, d in params),
    )  # fmt: skip


class CompiledPerBatch:
    """A graph with the batch extent `N`, compiled on first use for each batch size it is called
    with (a JIT cache keyed by batch size): `f(x, params=None, out=None)` as `EntryPoint`."""

    def __init__(
        self,
        graph: GraphOp,
        payload: Payload | None,
        dtype: type,
        runtime_payload: bool,
        target: Target,
        threads: int | None = None,
    ):
        inputs = [n for n in graph.nodes if isinstance(n, InputOp)]
        self.graph = graph
        self.dtype = np.dtype(dtype)
        self.input_shape: Shape = graph_shapes(graph)[inputs[0].id] if inputs else ()
        self.per_batch = PerBatch(
            graph,
            lambda g: compile_graph(g, payload, dtype, None, runtime_payload, target, threads),
        )
        # A bad graph or payload is refused now, not on the first call: building the IR for
        # one batch size checks both (LLVM, the costly part, runs per batch size on first use).
        build_graph_module(
            specialise(graph, PROBES[0]), payload, dtype, runtime_payload=runtime_payload,
            target=target,
        )  # fmt: skip

    def __repr__(self) -> str:
        out = self.graph.output
        assert out is not None and isinstance(out.value.owner, NodeOp)
        output = graph_shapes(self.graph)[out.value.owner.id]
        return (
            f"<compiled @{self.graph.graph_name}: {fmt_shape(self.input_shape)} -> "
            f"{fmt_shape(output)}, {self.dtype}, per batch size>"
        )

    def __call__(
        self, x: object, params: object = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        x = as_float_array(x, self.dtype)
        batch = batch_of_value(self.input_shape, x.shape)
        if batch is None:
            raise ValueError(
                f"tlc_{self.graph.graph_name}: input has shape {fmt_shape(x.shape)}, expected "
                f"{fmt_shape(self.input_shape)}"
            )
        return self.per_batch.at(batch)(x, params, out)


def _explainer(graph: GraphOp, payload: Payload | None, module: GraphModule, batch: int | None):
    """On a log-domain failure, rerun the reference on the input (each row of a batch) to raise
    its exact, located error (the compiled code only knows that some log failed). A build whose
    parameters come with each call has none to rerun with."""

    def explain(x: np.ndarray) -> None:
        from tlc.semantics.interpret import interpret

        if payload is None and module.params is not None:
            return
        rows = x.reshape(module.input_shape)
        for row in rows if batch is not None else [rows]:
            interpret(graph, payload or Payload(), row, module.dtype.type)

    return explain


def node_kernel(
    node: NodeOp, parent_shapes: list[Shape], record: Record | None, dtype: type = np.float64
) -> Callable[[list[np.ndarray]], np.ndarray]:
    """Compile one node on its own: the callable takes the parents' values and returns the
    node's value (used for nodes a mixed kernel plan assigns to llvm)."""
    key = (
        print_mlir_op(node, debuginfo=False),
        tuple(parent_shapes),
        _payload_key(record),
        np.dtype(dtype).str,
    )
    hit = _node_cache.get(key) if objcache.enabled() else None
    if hit is not None:
        return hit
    ir_text, symbol, out_shape = build_node_module(node, parent_shapes, record, dtype)
    kernel = NodeKernel(
        node,
        [tuple(s) for s in parent_shapes],
        out_shape,
        np.dtype(dtype),
        jit_link(ir_text, [symbol]),
        symbol,
    )
    _node_cache[key] = kernel
    return kernel


class NodeKernel:
    """One compiled node: `kernel([parent values]) -> value`."""

    def __init__(
        self,
        node: NodeOp,
        parent_shapes: list[Shape],
        out_shape: Shape,
        dtype: np.dtype,
        tracker: llvm.ResourceTracker,
        symbol: str,
    ):
        self.node, self.parent_shapes, self.out_shape, self.dtype = (
            node,
            parent_shapes,
            out_shape,
            dtype,
        )
        self.tracker = tracker  # keeps the code alive
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
        self._func = proto(tracker[symbol])

    def __call__(self, args: list[np.ndarray]) -> np.ndarray:
        if len(args) != len(self.parent_shapes):
            raise ValueError(
                f"{self.node.TAG} kernel: {len(args)} arguments, expected {len(self.parent_shapes)}"
            )
        arrays = []
        for value, shape in zip(args, self.parent_shapes, strict=True):
            array = np.asarray(value, dtype=self.dtype, order="C")  # keeps 0-d values 0-d
            if array.shape != shape:
                got, want = fmt_shape(array.shape), fmt_shape(shape)
                raise ValueError(f"{self.node.TAG} kernel: argument shape {got}, expected {want}")
            arrays.append(array)
        pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        out = np.empty(self.out_shape, dtype=self.dtype)
        status = self._func(ctypes.addressof(pointers), out.ctypes.data)
        if status == Status.LOG_DOMAIN:
            raise eval_error(LOG_MESSAGE, self.node)
        raise_for_status(status, f"{self.node.TAG} node {self.node.id}")
        return out
