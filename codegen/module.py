"""One LLVM module per graph: the entry point, its shape queries, and single-node kernels.

`build_graph_module` checks the graph (shapes, payload, lowerability) and emits

    i32 @tlc_<graph>(T* in, T* out)            ; or (T* in, T* out, T* params)
    i32 @tlc_<graph>_input_rank() / _output_rank()
    i32 @tlc_<graph>_input_shape(i64* dims) / _output_shape(i64* dims)
    i64 @tlc_<graph>_params_size()             ; --runtime-payload only

The entry checks its pointers (status 1 on null), then runs every node in order. Views
(input, const, reshape, flatten, detach, rand_uniform) alias their source; every other node gets
a slice of one workspace, kept on the stack when small and malloc'ed otherwise (freed on every
exit), so the code holds no global mutable state and is re-entrant. The output node writes
straight into `out`. With `batch=N` the single-example body is called for each of N rows.
Payload fields are private constants by default; with `runtime_payload` they are slices of the
caller's `params` array, laid out by `ParamSlot`s (what the JIT and libraries use for payloads
over `BAKE_LIMIT`, supplying the array themselves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from xdsl.dialects.builtin import ModuleOp

from tlc.codegen.builder import I32, I64, Buf, KernelBuilder, Status, scalar_type
from tlc.codegen.lower import EPILOGUES, LOWERINGS, ParamSpec, Step
from tlc.codegen.target import HOST, Target, TargetInfo, target_info
from tlc.core.diagnostics import error
from tlc.core.limits import LimitError, check_bytes
from tlc.core.payload import Payload, Record
from tlc.dialect import ops
from tlc.dialect.batch import has_batch, specialise
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.shapes import Shape, ShapeError, numel
from tlc.dialect.verify import graph_shapes
from tlc.semantics.payload_check import prepare_records

#: Workspaces up to this many bytes live on the stack; larger ones are malloc'ed per call.
STACK_LIMIT = 128 * 1024
#: Workspace slices start on 64-byte boundaries (one AVX-512 vector).
ALIGN = 64
#: Payloads larger than this many bytes (in the compiled dtype) are never baked into the code:
#: x86-64 code reaches its constants through 32-bit PC-relative relocations, which a
#: gigabyte-sized constant section overflows (an LLVM abort when the JIT links it), and the IR
#: text of baked weights costs compile time linear in their size for no speed at run time.
#: Such graphs are built with a runtime payload, and the JIT or the library supplies it.
BAKE_LIMIT = 16 * 1024 * 1024
#: Graphs with more nodes keep every node in its own (not inlined) function: O3 on one huge
#: function is superlinear, and small graphs gain from inlining (constants fold across nodes).
INLINE_NODES = 64


@dataclass(frozen=True)
class ParamSlot:
    """Where one payload field sits in a runtime `params` array (offset in elements)."""

    node: int
    field: str
    offset: int
    shape: Shape
    default: float | None


@dataclass(frozen=True)
class GraphModule:
    """LLVM IR for one graph, with the interface facts callers need."""

    ir: str
    symbol: str
    input_shape: Shape
    output_shape: Shape
    dtype: np.dtype
    params: tuple[ParamSlot, ...] | None

    @property
    def params_size(self) -> int:
        return sum(numel(p.shape) for p in self.params or ())


def check_lowerable(graph: GraphOp) -> None:
    for node in graph.nodes:
        reason = LOWERINGS.unsupported.get(type(node))
        if reason is not None:
            raise error(f"codegen: cannot compile {node.TAG} node {node.id}: {reason}", node)


def param_specs(node: NodeOp, shapes: list[Shape]) -> dict[str, ParamSpec]:
    parents = [shapes[p] for p in node.parent_ids()]
    return LOWERINGS[type(node)].params(node, parents, shapes[node.id])


def field_value(
    node: NodeOp, name: str, spec: ParamSpec, record: Record | None, dtype
) -> np.ndarray:
    """A payload field cast to `dtype` and shaped as the lowering reads it, or its default."""
    if record is not None and name in record:
        return np.asarray(record[name], dtype=dtype).reshape(spec.shape)
    if spec.default is None:
        raise error(f"IR eval: missing {node.TAG} payload for node {node.id}", node)
    return np.full(spec.shape, spec.default, dtype=dtype)


def node_function(
    module: ir.Module,
    name: str,
    node: NodeOp,
    args: list[Buf],
    params: dict[str, Buf],
    out: Buf,
    scratch: Buf | None,
    dtype: type,
    info: TargetInfo,
    *,
    packed: bool = False,
    fused: NodeOp | None = None,
) -> ir.Function:
    """`i32 name(args..., params..., out[, scratch])`: one node as an internal function of
    pointers, so the optimiser works on one node at a time and nodes that differ only in their
    data share code (a graph of 1,000 nodes compiles in seconds). `packed` and `fused` as in
    `lower_node`."""
    T = scalar_type(dtype)
    buffers = [*args, *params.values(), out, *([scratch] if scratch is not None else [])]
    func = ir.Function(module, ir.FunctionType(I32, [T.as_pointer()] * len(buffers)), name)
    func.linkage = "internal"
    k = KernelBuilder(func, dtype, info)
    inner = [Buf(arg, b.shape) for arg, b in zip(func.args, buffers, strict=True)]
    n_args, n_params = len(args), len(params)
    dest = inner[n_args + n_params]
    func.args[n_args + n_params].add_attribute("noalias")
    value = lower_node(
        k,
        node,
        inner[:n_args],
        dict(zip(params, inner[n_args : n_args + n_params], strict=True)),
        dest,
        inner[-1] if scratch is not None else None,
        packed=packed,
        fused=fused,
    )
    if value.ptr is not dest.ptr:
        k.copy(dest, value)
    k.exit_with(Status.OK)
    k.finish()
    return func


def lower_node(
    k: KernelBuilder,
    node: NodeOp,
    args: list[Buf],
    params: dict[str, Buf],
    out: Buf,
    scratch: Buf | None = None,
    *,
    packed: bool = False,
    fused: NodeOp | None = None,
) -> Buf:
    """Emit one node; returns where its value lives (`out`, or the buffer a view aliases).
    `packed`: the params are baked in their `ParamSpec.pack` layouts; `fused`: the
    elementwise node whose value the node writes (see `fusions`)."""
    lowering = LOWERINGS[type(node)]
    result = lowering.emit(k, Step(node, args, params, out, scratch, packed, fused))
    return result if lowering.view else out


def fusions(graph: GraphOp, out_node: NodeOp) -> dict[int, NodeOp]:
    """Producer id -> the elementwise node fused into its stores: a node whose rule `fuses`,
    that is not the output and whose value has exactly one user, an `EPILOGUES` op reading
    nothing else (a linear or convolution followed by relu)."""
    parents = {node.id: node.parent_ids() for node in graph.nodes}
    users: dict[int, list[NodeOp]] = {}
    for node in graph.nodes:
        for parent in parents[node.id]:
            users.setdefault(parent, []).append(node)
    fused = {}
    for node in graph.nodes:
        after = users.get(node.id, [])
        if (
            LOWERINGS[type(node)].fuses
            and node is not out_node
            and len(after) == 1
            and type(after[0]) in EPILOGUES
            and parents[after[0].id] == [node.id]
        ):
            fused[node.id] = after[0]
    return fused


def graph_symbol(graph: GraphOp) -> str:
    return f"tlc_{graph.graph_name}"


def build_graph_module(
    graph: GraphOp,
    payload: Payload | None,
    dtype: type = np.float64,
    *,
    batch: int | None = None,
    runtime_payload: bool = False,
    target: Target = HOST,
    entry_name: str | None = None,
    queries: bool = True,
) -> GraphModule:
    """Check `graph` and its payload, and emit its module (see the module docstring) with
    kernels shaped for `target`. `entry_name` renames the entry point and `queries=False` leaves
    out the shape queries: a library holding one variant per CPU level calls its variants
    through a dispatcher that owns the public names. A graph with the batch extent `N` is
    compiled for `batch` rows (its `N` specialised, tlc.dialect.batch)."""
    if has_batch(graph):
        if batch is None:
            raise error(
                f"codegen: graph @{graph.graph_name} has the batch extent N in its shapes: "
                "compile it for one batch size (tlc-compile --batch N; tlc.compile compiles "
                "per batch size at call time)",
                graph,
            )
        graph, batch = specialise(graph, batch), None
    shapes = graph_shapes(graph)
    check_lowerable(graph)
    _check_addressable(graph, shapes, np.dtype(dtype).itemsize, batch)
    # A runtime-payload build needs no values, but checks any it is given.
    records = (
        {}
        if runtime_payload and not payload
        else prepare_records(graph, payload or Payload(), dtype, shapes)
    )
    inputs = [n for n in graph.nodes if isinstance(n, ops.InputOp)]
    if len(inputs) > 1:
        raise error(
            f"codegen: graph @{graph.graph_name} has {len(inputs)} input nodes; compiled entry "
            "points take exactly one input",
            inputs[1],
        )
    output = graph.output
    assert output is not None, "verify-structure guarantees an output"
    out_node = output.value.owner
    assert isinstance(out_node, NodeOp)
    in_shape = shapes[inputs[0].id] if inputs else ()
    out_shape = shapes[out_node.id]
    symbol = graph_symbol(graph)
    entry_symbol = entry_name or symbol
    info = target_info(target)
    T = scalar_type(dtype)
    module = ir.Module(name=symbol)
    slots = _param_slots(graph, shapes) if runtime_payload else None

    body_args = [T.as_pointer()] * (3 if runtime_payload else 2)
    body = ir.Function(module, ir.FunctionType(I32, body_args), f"{symbol}.body")
    body.linkage = "internal"
    for arg in body.args:
        arg.add_attribute("noalias")
    k = KernelBuilder(body, dtype, info)
    x_ptr, out_ptr = body.args[0], body.args[1]
    workspace = _Workspace(k, graph, shapes, out_node)
    values: list[Buf] = []
    slot_at = {(s.node, s.field): s for s in slots or ()}
    separate = len(graph.nodes) > INLINE_NODES
    functions: dict[tuple, ir.Function] = {}
    fused = fusions(graph, out_node)
    fused_into = {c.id: p for p, c in fused.items()}
    for node in graph.nodes:
        args = [values[p] for p in node.parent_ids()] or (
            [Buf(x_ptr, in_shape)] if isinstance(node, ops.InputOp) else []
        )
        if node.id in fused_into:  # computed by its producer, which wrote its slot
            values.append(values[fused_into[node.id]])
            continue
        specs = param_specs(node, shapes)
        if slots is not None:
            params = {
                name: Buf(k.at(Buf(body.args[2], ()), slot_at[(node.id, name)].offset), spec.shape)
                for name, spec in specs.items()
            }
        else:
            params = {}
            for name, spec in specs.items():
                value = field_value(node, name, spec, records.get(node.id), dtype)
                if spec.pack is not None:
                    value = spec.pack(value, info)
                params[name] = Buf(k.global_constant(f"p{node.id}.{name}", value), value.shape)
        epilogue = fused.get(node.id)
        target = epilogue or node
        dest = Buf(out_ptr, out_shape) if target is out_node else workspace.slot(target)
        if LOWERINGS[type(node)].view:
            values.append(lower_node(k, node, args, params, dest))
        else:
            # Nodes that differ only in their data share code: parameters are arguments.
            key = (type(node), repr(node.metadata()), tuple(b.shape for b in args),
                   tuple((n, b.shape) for n, b in params.items()), dest.shape,
                   type(epilogue))  # fmt: skip
            func = functions.get(key)
            scratch = workspace.scratch(node)
            if func is None:
                func = node_function(module, f"{symbol}.n{node.id}", node, args, params, dest,
                                     scratch, dtype, info, packed=slots is None,
                                     fused=epilogue)  # fmt: skip
                functions[key] = func
                if separate:
                    func.attributes.add("noinline")
            buffers = [*args, *params.values(), dest, *([scratch] if scratch else [])]
            status = k.b.call(func, [b.ptr for b in buffers])
            k.fail_if(k.b.icmp_signed("!=", status, ir.Constant(I32, 0)), status)
            values.append(dest)
    if values[out_node.id].ptr is not out_ptr:
        k.copy(Buf(out_ptr, out_shape), values[out_node.id])
    k.exit_with(Status.OK)
    workspace.finish()

    full_in = (batch, *in_shape) if batch is not None else in_shape
    full_out = (batch, *out_shape) if batch is not None else out_shape
    _entry(module, entry_symbol, body, T, batch, numel(in_shape), numel(out_shape))
    if queries:
        _shape_query(module, f"{symbol}_input", full_in)
        _shape_query(module, f"{symbol}_output", full_out)
    if slots is not None and queries:
        size = ir.Function(module, ir.FunctionType(I64, []), f"{symbol}_params_size")
        ir.IRBuilder(size.append_basic_block()).ret(
            ir.Constant(I64, sum(numel(s.shape) for s in slots))
        )
    return GraphModule(
        str(module),
        symbol,
        full_in,
        full_out,
        np.dtype(dtype),
        tuple(slots) if slots is not None else None,
    )


def bakes_payload(graph: GraphOp, dtype: type = np.float64) -> bool:
    """Whether `graph`'s payload fields fit in `BAKE_LIMIT` bytes of `dtype`, so a build
    bakes them into the code."""
    slots = _param_slots(graph, graph_shapes(graph))
    return sum(numel(s.shape) for s in slots) * np.dtype(dtype).itemsize <= BAKE_LIMIT


def _param_slots(graph: GraphOp, shapes: list[Shape]) -> list[ParamSlot]:
    """Every payload field of every node, in node order then field order, packed densely."""
    slots, offset = [], 0
    for node in graph.nodes:
        for name, spec in param_specs(node, shapes).items():
            slots.append(ParamSlot(node.id, name, offset, spec.shape, spec.default))
            offset += numel(spec.shape)
    return slots


def _check_addressable(
    graph: GraphOp, shapes: list[Shape], itemsize: int, batch: int | None
) -> None:
    """Every buffer the code will compute a size or offset for fits in its signed 64-bit
    arithmetic (`tlc.core.limits.MAX_BYTES`); a [2^61] tensor of doubles would otherwise wrap
    to malloc(0) and the call would write past it. The workspace total is checked by
    `_Workspace`."""
    rows = batch or 1
    for node in graph.nodes:
        try:
            check_bytes(numel(shapes[node.id]) * rows, itemsize, f"codegen: node {node.id}")
        except LimitError as exc:
            raise error(str(exc), node) from None


def _aligned(elements: int, itemsize: int) -> int:
    """`elements` rounded up so the next region starts on an ALIGN boundary."""
    return -(-max(elements, 1) * itemsize // ALIGN) * ALIGN // itemsize


class Allocation:
    """`elements` scalars of scratch for one call: on the stack up to STACK_LIMIT bytes, else
    malloc'ed (status OUT_OF_MEMORY if that fails) and freed by `finish` on every exit."""

    def __init__(self, k: KernelBuilder, elements: int):
        self.k = k
        b = k.b
        self.raw: ir.Value | None = None
        if elements * k.dtype.itemsize > STACK_LIMIT:
            i8p = ir.IntType(8).as_pointer()
            malloc = k.module.globals.get("malloc") or ir.Function(
                k.module, ir.FunctionType(i8p, [I64]), "malloc"
            )
            self.raw = b.call(malloc, [ir.Constant(I64, elements * k.dtype.itemsize)])
            k.fail_if(b.icmp_unsigned("==", self.raw, ir.Constant(i8p, None)), Status.OUT_OF_MEMORY)
            self.base = b.bitcast(self.raw, k.T.as_pointer())
        else:
            with b.goto_block(k.alloca_block):
                array = b.alloca(ir.ArrayType(k.T, max(elements, 1)), name="workspace")
                array.align = ALIGN
                self.base = b.bitcast(array, k.T.as_pointer())

    def at(self, offset: int, shape: Shape) -> Buf:
        return Buf(self.k.at(Buf(self.base, ()), offset), shape)

    def finish(self) -> None:
        """Close the function: allocas fall through to the body, the exit frees and returns."""
        k, raw = self.k, self.raw
        if raw is None:
            k.finish()
            return

        def free() -> None:
            func = k.module.globals.get("free") or ir.Function(
                k.module, ir.FunctionType(ir.VoidType(), [raw.type]), "free"
            )
            k.b.call(func, [raw])

        k.finish(free)


class _Workspace:
    """Storage for the nodes that compute into memory of their own, and their scratch."""

    def __init__(self, k: KernelBuilder, graph: GraphOp, shapes: list[Shape], out_node: NodeOp):
        self.offsets: dict[int, int] = {}
        self.scratch_offsets: dict[int, tuple[int, int]] = {}
        total = 0
        itemsize = k.dtype.itemsize
        for node in graph.nodes:
            lowering = LOWERINGS[type(node)]
            if lowering.view:
                continue
            if node is not out_node:
                self.offsets[node.id] = total
                total += _aligned(numel(shapes[node.id]), itemsize)
            extra = lowering.scratch(node, [shapes[p] for p in node.parent_ids()], shapes[node.id])
            if extra:
                self.scratch_offsets[node.id] = (total, extra)
                total += _aligned(extra, itemsize)
        try:
            check_bytes(total, itemsize, f"codegen: graph @{graph.graph_name}: workspace")
        except LimitError as exc:
            raise error(str(exc), graph) from None
        self.shapes = shapes
        self.memory = Allocation(k, total)

    def slot(self, node: NodeOp) -> Buf:
        shape = self.shapes[node.id]
        if node.id not in self.offsets:  # a view: the rule returns the aliased buffer
            return Buf(self.memory.base, shape)
        return self.memory.at(self.offsets[node.id], shape)

    def scratch(self, node: NodeOp) -> Buf | None:
        if node.id not in self.scratch_offsets:
            return None
        offset, size = self.scratch_offsets[node.id]
        return self.memory.at(offset, (size,))

    def finish(self) -> None:
        self.memory.finish()


def _entry(
    module: ir.Module,
    symbol: str,
    body: ir.Function,
    T: ir.Type,
    batch: int | None,
    in_size: int,
    out_size: int,
) -> None:
    """The exported entry: null checks, then the body once or once per batch row."""
    entry = ir.Function(module, ir.FunctionType(I32, [a.type for a in body.args]), symbol)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    null = ir.Constant(T.as_pointer(), None)
    bad = b.icmp_unsigned("==", entry.args[0], null)
    for arg in entry.args[1:]:
        bad = b.or_(bad, b.icmp_unsigned("==", arg, null))
    with b.if_then(bad, likely=False):
        b.ret(ir.Constant(I32, int(Status.NULL_POINTER)))
    if batch is None:
        b.ret(b.call(body, list(entry.args)))
        return
    head, loop, done = (entry.append_basic_block(n) for n in ("row", "call", "done"))
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    row = b.phi(I64, "row")
    row.add_incoming(ir.Constant(I64, 0), pre)
    b.cbranch(b.icmp_signed("<", row, ir.Constant(I64, batch)), loop, done)
    b.position_at_end(loop)
    x = b.gep(entry.args[0], [b.mul(row, ir.Constant(I64, in_size))], inbounds=True)
    y = b.gep(entry.args[1], [b.mul(row, ir.Constant(I64, out_size))], inbounds=True)
    status = b.call(body, [x, y, *entry.args[2:]])
    row.add_incoming(b.add(row, ir.Constant(I64, 1)), loop)
    failed = b.icmp_signed("!=", status, ir.Constant(I32, 0))
    fail = entry.append_basic_block("fail")
    b.cbranch(failed, fail, head)
    b.position_at_end(fail)
    b.ret(status)
    b.position_at_end(done)
    b.ret(ir.Constant(I32, 0))


def _shape_query(module: ir.Module, prefix: str, shape: Shape) -> None:
    """`i32 <prefix>_rank()` and `i32 <prefix>_shape(i64* dims)` (status 1 on null)."""
    rank = ir.Function(module, ir.FunctionType(I32, []), f"{prefix}_rank")
    ir.IRBuilder(rank.append_basic_block()).ret(ir.Constant(I32, len(shape)))
    query = ir.Function(module, ir.FunctionType(I32, [I64.as_pointer()]), f"{prefix}_shape")
    b = ir.IRBuilder(query.append_basic_block())
    with b.if_then(b.icmp_unsigned("==", query.args[0], ir.Constant(I64.as_pointer(), None))):
        b.ret(ir.Constant(I32, int(Status.NULL_POINTER)))
    for axis, extent in enumerate(shape):
        b.store(ir.Constant(I64, extent), b.gep(query.args[0], [ir.Constant(I64, axis)]))
    b.ret(ir.Constant(I32, 0))


def build_node_module(
    node: NodeOp, parent_shapes: list[Shape], record: Record | None, dtype: type
) -> tuple[str, str, Shape]:
    """IR for one node as `i32 @tlc_node(T** args, T* out)` (for mixed kernel plans, run by
    the JIT on this host): returns (ir, symbol, output shape). Parameters are baked from
    `record`."""
    reason = LOWERINGS.unsupported.get(type(node))
    if reason is not None:
        raise error(f"codegen: cannot compile {node.TAG} node {node.id}: {reason}", node)
    if isinstance(node, ops.InputOp):
        raise error(f"codegen: input node {node.id} has no kernel: its value is the input", node)
    try:
        out_shape = node.infer(parent_shapes)
    except ShapeError as exc:
        raise error(str(exc), node) from None
    T = scalar_type(dtype)
    module = ir.Module(name="tlc_node")
    func = ir.Function(
        module, ir.FunctionType(I32, [T.as_pointer().as_pointer(), T.as_pointer()]), "tlc_node"
    )
    k = KernelBuilder(func, dtype, target_info(HOST))
    args = [
        Buf(k.b.load(k.b.gep(func.args[0], [k.i64(i)])), shape)
        for i, shape in enumerate(parent_shapes)
    ]
    specs = LOWERINGS[type(node)].params(node, parent_shapes, out_shape)
    params = {}
    for name, spec in specs.items():
        value = field_value(node, name, spec, record, dtype)
        if spec.pack is not None:
            value = spec.pack(value, k.info)
        params[name] = Buf(k.global_constant(name, value), value.shape)
    out = Buf(func.args[1], out_shape)
    size = LOWERINGS[type(node)].scratch(node, parent_shapes, out_shape)
    memory = Allocation(k, size)
    scratch = memory.at(0, (size,)) if size else None
    value = lower_node(k, node, args, params, out, scratch, packed=True)
    if value.ptr is not out.ptr:
        k.copy(out, value)
    k.exit_with(Status.OK)
    memory.finish()
    return str(module), "tlc_node", out_shape


def optimized_ir(module: ModuleOp, dtype: type = np.float64, target: Target = HOST) -> str:
    """Every graph of `module` compiled with its inline payload for `target`, as optimised
    LLVM IR text (what `tlc-opt --emit llvm` prints)."""
    return "\n".join(str(m) for m in _compiled_graphs(module, dtype, target))


def target_assembly(module: ModuleOp, dtype: type = np.float64, target: Target = HOST) -> str:
    """Every graph of `module` as `target`'s assembly (what `tlc-opt --emit asm` prints)."""
    from tlc.codegen.target import emit_assembly

    return "\n".join(emit_assembly(m, target) for m in _compiled_graphs(module, dtype, target))


def _compiled_graphs(module: ModuleOp, dtype: type, target: Target) -> list:
    from tlc.codegen.target import compile_ir

    return [
        compile_ir(
            build_graph_module(
                graph, payload_from_module(module, graph.graph_name), dtype, target=target
            ).ir,
            target,
        )
        for graph in module.ops
        if isinstance(graph, GraphOp)
    ]


def pack_params(graph: GraphOp, payload: Payload, dtype: type = np.float64) -> np.ndarray:
    """The flat `params` array a --runtime-payload build of `graph` takes, from `payload`
    (checked against the graph; absent optional fields get their defaults)."""
    shapes = graph_shapes(graph)
    records = prepare_records(graph, payload, dtype, shapes)
    parts = [
        field_value(
            graph.nodes[s.node], s.field, ParamSpec(s.shape, s.default), records.get(s.node), dtype
        ).reshape(-1)
        for s in _param_slots(graph, shapes)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
