"""One LLVM module per graph: the entry point, its shape queries, and single-node kernels.

`build_graph_module` checks the graph (shapes, payload, lowerability) and emits

    i32 @tlc_<graph>(T* in, T* out, i32 threads)            ; or (T* in, T* out, T* params, ..)
    i32 @tlc_<graph>_input_rank() / _output_rank()
    i32 @tlc_<graph>_input_shape(i64* dims) / _output_shape(i64* dims)
    i32 @tlc_<graph>_scalar_size()             ; bytes of a scalar: 4 (float) or 8 (double)
    i64 @tlc_<graph>_params_size()             ; --runtime-payload only

The entry checks its pointers (status 1 on null), then runs every node in the order and the
way the execution plan says (`tlc.codegen.plan`): views alias their source; other nodes call
their kernel once, or as a parallel region of row tasks handed to the runtime's thread pool
(`tlc_rt_parallel`, at most `threads` threads); values live in one workspace at offsets fixed
by the plan (on the stack when small, else a block of the runtime's workspace cache, given back
on every exit). The output node writes straight into `out`. With `batch=N` the kernels run over
the batch (see the plan). Payload fields are private constants by default; with
`runtime_payload` they are slices of the caller's `params` array, laid out by `ParamSlot`s (what
libraries use for payloads over `BAKE_LIMIT`, supplying the array themselves); with
`bound_payload` they are slices of a `params` array laid out as baked fields are, each in its
packed layout for the target (`bound_params`: what the JIT passes for payloads over the limit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from xdsl.dialects.builtin import ModuleOp

from tlc.codegen.builder import I32, I64, Buf, KernelBuilder, Status, scalar_type
from tlc.codegen.gemm import store_lanes
from tlc.codegen.lower import EPILOGUES, LOWERINGS, MAPS, ParamSpec, Step
from tlc.codegen.lower.elementwise import fused_epilogue
from tlc.codegen.lower.rules import Fused
from tlc.codegen.plan import ALIGN, GraphPlan, Kernel, NodePlan, Rows, plan_graph
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

#: Workspaces up to this many bytes (without per-worker scratch) live on the stack; larger ones
#: come from the runtime's workspace cache.
STACK_LIMIT = 128 * 1024
#: Payloads larger than this many bytes (in the compiled dtype) are never baked into the code:
#: x86-64 code reaches its constants through 32-bit PC-relative relocations, which a
#: gigabyte-sized constant section overflows (an LLVM abort when the JIT links it), and the IR
#: text of baked weights costs compile time linear in their size for no speed at run time.
#: Such graphs are built with a runtime payload, and the JIT or the library supplies it.
BAKE_LIMIT = 16 * 1024 * 1024
#: Graphs with more nodes keep every node in its own (not inlined) function: O3 on one huge
#: function is superlinear, and small graphs gain from inlining (constants fold across nodes).
INLINE_NODES = 64
#: Op kinds whose kernels are large code (register tiles and their edge tiles, K blocks,
#: transposed stores): a graph of more than APART_PRODUCTS of them keeps its kernels apart
#: however few its nodes. resnet18 from an ONNX file (50 nodes, 21 convolutions; batch norms
#: folded by the exporter) compiled cold in 7.6 s of wall time inlined on a 2-vCPU Zen 3,
#: 5.4 s spread over two modules, and ran at the same speed (paired, 1.004).
PRODUCT_KINDS = frozenset({"tl.conv", "tl.linear", "tl.matmul"})
APART_PRODUCTS = 8
#: In such graphs, an elementwise map of at least this many elements runs the map kernel of
#: its op kind that takes the length as an argument (`map_function`); shorter maps keep a
#: kernel of their own, which LLVM may unroll whole.
MAP_ELEMENTS = 256


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
    #: How the nodes run and where their values live (`tlc.codegen.plan`).
    plan: GraphPlan | None = None
    #: A `bound_payload` build's params array (`bound_params`), when its payload was given.
    bound: np.ndarray | None = None
    #: IR of the modules holding the kernels `build_graph_module(kernel_modules=...)` moved out
    #: of `ir`, each compiled on its own and linked with it.
    parts: tuple[str, ...] = ()

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
    arg_shapes: Sequence[Shape],
    param_shapes: dict[str, Shape],
    out_shape: Shape,
    scratch: int,
    dtype: type,
    info: TargetInfo,
    *,
    in_place: bool = False,
    packed: bool = False,
    fused: Fused | None = None,
    parts: int = 1,
    maps: tuple[NodeOp, ...] = (),
) -> ir.Function:
    """`i32 name(args..., params..., out[, scratch][, i64 part, i64 end])`: one node as an internal
    function of pointers, so the optimiser works on one node at a time and nodes that differ
    only in their data share code (a graph of 1,000 nodes compiles in seconds). `out` is
    `noalias` unless the plan has the node overwrite an operand (`in_place`); `packed`,
    `fused` and `maps` as in `lower_node`; with `parts` > 1 the function computes parts
    [`part`, `end`) of them: one part in a task, all of them on one thread."""
    T = scalar_type(dtype)
    shapes = [*arg_shapes, *param_shapes.values(), out_shape, *([(scratch,)] if scratch else [])]
    types = [T.as_pointer()] * len(shapes) + ([I64, I64] if parts > 1 else [])
    func = ir.Function(module, ir.FunctionType(I32, types), module.get_unique_name(name))
    func.linkage = "internal"
    k = KernelBuilder(func, dtype, info)
    inner = [Buf(arg, shape) for arg, shape in zip(func.args, shapes, strict=False)]
    n_args, n_params = len(arg_shapes), len(param_shapes)
    dest = inner[n_args + n_params]
    if not in_place:
        func.args[n_args + n_params].add_attribute("noalias")
    value = lower_node(
        k,
        node,
        inner[:n_args],
        dict(zip(param_shapes, inner[n_args : n_args + n_params], strict=True)),
        dest,
        inner[len(shapes) - 1] if scratch else None,
        packed=packed,
        fused=fused,
        part=(func.args[-2], func.args[-1]) if parts > 1 else None,
        parts=parts,
        maps=maps,
    )
    if value.ptr is not dest.ptr:
        k.copy(dest, value)
    k.exit_with(Status.OK)
    k.finish()
    return func


def map_function(
    module: ir.Module, name: str, node: NodeOp, n_args: int, dtype: type, info: TargetInfo,
    *, in_place: bool = False, fused: Fused | None = None,
) -> ir.Function:  # fmt: skip
    """`i32 name(args..., out, i64 n)`: `out[i] = f(args[0][i], ...)` for i < n, the map of an
    `elementwise` op kind (`lower.MAPS`) with its length an argument, so one function serves
    every node of that kind and metadata whatever its size (a graph's relus of 60 sizes are
    one function, not 60 for LLVM to optimise). The loop is the one the node's own kernel
    has, with a trip count LLVM learns at run time: the same vector body, the same values.
    `fused`: the `EPILOGUES` nodes applied to each value before it is stored (their other
    operands the last of the `n_args` arguments)."""
    T = scalar_type(dtype)
    types = [T.as_pointer()] * (n_args + 1) + [I64]
    func = ir.Function(module, ir.FunctionType(I32, types), module.get_unique_name(name))
    func.linkage = "internal"
    if not in_place:
        func.args[n_args].add_attribute("noalias")
    k = KernelBuilder(func, dtype, info)
    fn = MAPS[type(node)]
    args, out = [Buf(a, ()) for a in func.args[:n_args]], Buf(func.args[n_args], ())
    own = n_args - (len(fused.operands) if fused is not None else 0)
    then = fused_epilogue(k, fused, args[own:])
    with k.loop(func.args[-1]) as i:
        store_lanes(k, fn(k, node, *(k.load(a, i) for a in args[:own])), out, [(i, None)], then)
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
    fused: Fused | None = None,
    part: tuple[ir.Value, ir.Value] | None = None,
    parts: int = 1,
    maps: tuple[NodeOp, ...] = (),
) -> Buf:
    """Emit one node; returns where its value lives (`out`, or the buffer a view aliases).
    `packed`: the params are baked in their `ParamSpec.pack` layouts; `fused`: the
    elementwise nodes whose value the node writes (see `fusions`); `part`: the parts
    [first, end) of `parts` a split call computes (`Step.part`); `maps`: the per-channel
    maps applied first (`channel_maps`)."""
    lowering = LOWERINGS[type(node)]
    first, end = part if part is not None else (None, None)
    step = Step(node, args, params, out, scratch, packed, fused, first, parts, end, maps)
    result = lowering.emit(k, step)
    return result if lowering.view else out


def users_of(graph: GraphOp) -> dict[int, list[NodeOp]]:
    """Node id -> the nodes that read its value, once per read, in graph order (the fusion
    and bypass rules below ask who else reads a value)."""
    users: dict[int, list[NodeOp]] = {}
    for node in graph.nodes:
        for parent in node.parent_ids():
            users.setdefault(parent, []).append(node)
    return users


def fusions(graph: GraphOp, out_node: NodeOp) -> dict[int, Fused]:
    """Producer id -> the chain of elementwise nodes fused into its stores (`Fused`): from a
    node whose rule `fuses` and that is not the output, while the value so far is not the
    output and has exactly one user, an `EPILOGUES` op reading it once whose other operands
    (a binary map's) are values of its shape computed before the producer, so that they are
    there when the producer stores (binary ones only after a linear or a convolution: a
    map's chain of maps stays a pass each). A linear, a convolution or an elementwise map
    followed by relu or relu6; a convolution, the residual add of it and the shortcut, and
    the relu after them (resnet18's blocks: out = relu(conv + bias + shortcut) in one store).
    The chain's nodes compute nothing of their own (views of the producer's value)."""
    nodes = graph.nodes
    shapes = graph_shapes(graph)
    parents = {node.id: node.parent_ids() for node in nodes}
    users = users_of(graph)
    fused: dict[int, Fused] = {}
    taken: set[int] = set()  # in a chain already
    for node in nodes:
        if not LOWERINGS[type(node)].fuses or node is out_node or node.id in taken:
            continue
        chain: list[NodeOp] = []
        slots: list[int] = []
        last = node
        while last is not out_node and len(after := users.get(last.id, [])) == 1:
            user, reads = after[0], parents[after[0].id]
            others = [q for q in reads if q != last.id]
            if (
                type(user) not in EPILOGUES
                or len(others) != len(reads) - 1
                or (others and type(node) in MAPS)  # a map's pass: only unary ones join
                or any(q >= node.id or shapes[q] != shapes[user.id] for q in others)
            ):
                break
            chain.append(user)
            slots.append(reads.index(last.id))
            last = user
        if chain:
            fused[node.id] = Fused(tuple(chain), tuple(slots))
            taken.update(user.id for user in chain)
    return fused


#: Elementwise ops a batch norm applies as it stores, by a per-channel constant (`Step.maps`).
CHANNEL_MAPS = (ops.MulElemOp, ops.AddOp, ops.SubOp, ops.DivOp)


def channel_maps(
    graph: GraphOp, shapes: list[Shape], out_node: NodeOp
) -> tuple[dict[int, tuple[NodeOp, ...]], dict[int, Fused]]:
    """Batch norm id -> the maps its kernel applies before it stores (`Step.maps`), and batch
    norm id -> the `EPILOGUES` node after them, which it then writes: a chain of
    `CHANNEL_MAPS` nodes, each the only user of the value before it (the batch norm's, then
    the previous map's) and taking it as its first operand, the second a `broadcast_to` (read
    by nothing else) of a constant with one value per channel of the batch norm, the last map
    read only by the relu or relu6 (none of them the output). Each node computes as its own
    kernel would, so the bits are the unfused graph's; the maps and broadcasts are never
    computed (ONNX zoo's densenet121 runs batch norm, a scale, a shift and a relu before each
    convolution: five passes over memory, two of them writing broadcast constants)."""
    nodes = graph.nodes
    users = users_of(graph)

    def only_user(node: NodeOp) -> NodeOp | None:
        after = users.get(node.id, [])
        return after[0] if len(after) == 1 and node is not out_node else None

    def per_channel(node: NodeOp, norm: NodeOp) -> bool:
        """Whether `node` is a broadcast, read only here, of a constant of one value per
        channel of `norm`."""
        if not isinstance(node, ops.BroadcastToOp) or len(users.get(node.id, [])) != 1:
            return False
        source = nodes[node.parent_ids()[0]]
        out = shapes[norm.id]
        if not isinstance(source, ops.ConstOp) or tuple(node.meta("to")) != tuple(out):
            return False
        axis = norm.meta("channel_axis")
        spread = (1,) * (len(out) - len(node.meta("from"))) + tuple(node.meta("from"))
        return len(spread) == len(out) and all(
            extent == (out[axis] if d == axis else 1) for d, extent in enumerate(spread)
        )

    maps: dict[int, tuple[NodeOp, ...]] = {}
    fused: dict[int, Fused] = {}
    for norm in nodes:
        if not isinstance(norm, ops.BatchNormEvalOp):
            continue
        chain: list[NodeOp] = []
        last, after = norm, only_user(norm)
        while (
            isinstance(after, CHANNEL_MAPS)
            and after.parent_ids()[0] == last.id
            and per_channel(nodes[after.parent_ids()[1]], norm)
        ):
            chain.append(after)
            last, after = after, only_user(after)
        if chain and type(after) in EPILOGUES and after.parent_ids() == [last.id]:
            maps[norm.id], fused[norm.id] = tuple(chain), Fused((after,), (0,))
    return maps, fused


def norm_stores(
    graph: GraphOp,
    shapes: list[Shape],
    out_node: NodeOp,
    maps: dict[int, tuple[NodeOp, ...]],
    fused: dict[int, Fused],
) -> tuple[dict[int, tuple[NodeOp, ...]], dict[int, Fused]]:
    """`maps` and `fused` with each batch norm whose operand is a convolution read by nothing
    else applied in that convolution's stores: the convolution's maps are the batch norm and
    its own maps (`Step.maps`, `reductions.norm_stage`), the batch norm's fused chain (a relu)
    becomes the convolution's, and the batch norm is a view of the convolution's value. Not
    when that chain reads another operand (a residual add's shortcut): the batch norm's pass
    then keeps it, which measured faster than reading the shortcut in a 1x1 convolution's
    stores (zoo resnet50's 64 -> 256 on 56 x 56 + add + relu: 1.63 ms unfused, 1.96 fused;
    128 -> 512 on 28 x 28: 1.23 and 1.43). Depthwise convolutions keep theirs (their kernel
    applies no maps). Each node computes as its own kernel would: the bits are the unfused
    graph's. (ONNX zoo's resnet50 runs a batch norm after each of its 53 convolutions.)

    Only when every convolution of the same attributes and shapes takes the same maps and
    chain: convolutions that differ only in their data share one node function
    (`_NodeEmitter.kernel`), and taking some of them would make two where there was one
    (torchvision's resnet18 through FX, where the second convolution of each block feeds a
    residual add: 17,038 -> 28,121 lines of IR, cold compile 3.1 -> 4.7-5.2 s)."""
    nodes, users = graph.nodes, users_of(graph)
    taken: dict[int, tuple[NodeOp, tuple]] = {}  # conv id -> (its batch norm, its kernel)
    kinds: dict[tuple, set[tuple | None]] = {}  # a kernel -> what each of its convs would take
    for conv in nodes:
        if not isinstance(conv, ops.ConvOp):
            continue
        kernel = (repr(conv.metadata()), tuple(shapes[p] for p in conv.parent_ids()))
        norm, chain = _norm_after(conv, users, out_node, fused)
        code = None  # the maps and the epilogue its function would apply
        if norm is not None:
            code = (tuple(type(m) for m in maps.get(norm.id, ())), chain.key() if chain else ())
            taken[conv.id] = (norm, kernel)
        kinds.setdefault(kernel, set()).add(code)
    maps, fused = dict(maps), dict(fused)
    for conv_id, (norm, kernel) in taken.items():
        if len(kinds[kernel]) != 1:
            continue
        maps[conv_id] = (norm, *maps.pop(norm.id, ()))
        if norm.id in fused:
            fused[conv_id] = fused.pop(norm.id)
    return maps, fused


def _norm_after(
    conv: NodeOp,
    users: dict[int, list[NodeOp]],
    out_node: NodeOp,
    fused: dict[int, Fused],
) -> tuple[NodeOp | None, Fused | None]:
    """The batch norm `norm_stores` may apply in `conv`'s stores, and its fused chain: the
    convolution's only user, over its channel axis, with no operand in its chain; (None,
    None) when there is none or the convolution is depthwise or the graph's output."""
    readers = users.get(conv.id, [])
    if len(readers) != 1 or conv is out_node or conv.id in fused:
        return None, None
    norm = readers[0]
    chain = fused.get(norm.id)
    if (
        not isinstance(norm, ops.BatchNormEvalOp)
        or norm.parent_ids()[0] != conv.id
        or conv.meta("channel_axis") != norm.meta("channel_axis")
        or (conv.meta("groups") > 1 and conv.meta("in_channels") == conv.meta("groups"))
        or (chain is not None and bool(chain.operands))
    ):
        return None, None
    return norm, chain


#: The value padding has in each pooling: it never wins (max) or adds nothing (average).
POOL_PADDING = {ops.MaxPoolOp: -np.inf, ops.AvgPoolOp: 0.0}


def padding_bypass(graph: GraphOp, records: dict, dtype: type, out_node: NodeOp) -> dict[int, int]:
    """Pooling id -> the value it reads instead of its operand, when that operand only pads a
    value at the end of spatial axes with the value padding has in the pooling: a chain of
    concatenations (value, constant all of that value) along its spatial axes, each read by
    nothing else. The pooling's kernel then reads the value itself and treats the windows
    past its end as padding (a window's geometry covers them: `Window.padded`), and the
    concatenations are never computed. (ONNX ceil_mode pooling imports as such
    concatenations: squeezenet copied its pooled tensors twice, 7% of its time at batch
    16.)"""
    nodes = graph.nodes
    users = users_of(graph)
    bypass = {}
    for node in nodes:
        fill = POOL_PADDING.get(type(node))
        if fill is None:
            continue
        spatial = len(node.meta("kernel"))
        q = node.parent_ids()[0]
        while True:
            c = nodes[q]
            if not isinstance(c, ops.ConcatOp) or len(users[q]) != 1 or c is out_node:
                break
            parts = c.parent_ids()
            const = nodes[parts[-1]] if len(parts) == 2 else None
            if not isinstance(const, ops.ConstOp) or len(users[const.id]) != 1:
                break
            value = field_value(const, "value", ParamSpec((numel(const.meta("shape")),)),
                                records.get(const.id), dtype)  # fmt: skip
            spatial_axis = c.meta("axis") >= len(const.meta("shape")) - spatial
            if not (spatial_axis and np.all(value == fill)):
                break
            q = parts[0]
        if q != node.parent_ids()[0]:
            bypass[node.id] = q
    return bypass


def kernels_apart(graph: GraphOp) -> bool:
    """Whether `graph` keeps each kernel in a function of its own (over `INLINE_NODES`
    nodes, or over `APART_PRODUCTS` convolutions and matrix products), so that its kernels
    can be spread over modules (`kernel_modules`)."""
    products = sum(node.name in PRODUCT_KINDS for node in graph.nodes)
    return len(graph.nodes) > INLINE_NODES or products > APART_PRODUCTS


def graph_symbol(graph: GraphOp) -> str:
    return f"tlc_{graph.graph_name}"


def build_graph_module(
    graph: GraphOp,
    payload: Payload | None,
    dtype: type = np.float64,
    *,
    batch: int | None = None,
    runtime_payload: bool = False,
    bound_payload: bool = False,
    target: Target = HOST,
    entry_name: str | None = None,
    queries: bool = True,
    profile: str | None = None,
    kernel_modules: int = 1,
) -> GraphModule:
    """Check `graph` and its payload, and emit its module (see the module docstring) with kernels
    shaped for `target`. `entry_name` renames the entry point and `queries=False` leaves out the
    shape queries: a library calls its variants through a dispatcher that owns the public names,
    the queries among them (`shared_lib.render_queries`: plain C, so they run on any CPU, not
    only on the variant's). A graph with the batch extent `N` is compiled for `batch` rows (its
    `N` specialised, tlc.dialect.batch). `profile` ("cpu" or "wall"): every node's computation
    adds the nanoseconds it took, of the calling thread's CPU time or of wall time, to element
    `node id` of the exported i64 array `<symbol>_profile` (`_Profile`; a measuring build,
    bench/real_networks.py --profile: its row regions are not merged into runs, so each node's
    time is its own). `kernel_modules` > 1: a graph that keeps its kernels apart (over
    `INLINE_NODES` nodes) has them spread over that many modules, `ir` and `parts`, each
    about the same size, to compile at the same time (`tlc.codegen.objcache.object_codes`)
    and link together. `bound_payload`: the fields are read from a params array as for
    `runtime_payload`, but laid out and packed as baked fields are (`bound_params`;
    `GraphModule.bound` is that array), so the kernels take their packed paths: the JIT's build
    for a payload over `BAKE_LIMIT`."""
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
    plan = _graph_plan(graph, shapes, dtype, batch, records, out_node, runs=profile is None)
    bound = _bound_layout(plan, shapes, records, dtype, info) if bound_payload else None
    full_in = (batch, *in_shape) if batch is not None else in_shape
    full_out = (batch, *out_shape) if batch is not None else out_shape

    body_args = [T.as_pointer()] * (3 if runtime_payload or bound_payload else 2) + [I32]
    body = ir.Function(module, ir.FunctionType(I32, body_args), f"{symbol}.body")
    body.linkage = "internal"
    for arg in body.args[:-1]:
        arg.add_attribute("noalias")
    k = KernelBuilder(body, dtype, info)
    x_ptr, out_ptr, threads = body.args[0], body.args[1], body.args[-1]
    arena = _Arena(k, graph, plan, threads)
    separate = kernels_apart(graph)
    homes = [module] + [ir.Module(name=f"{symbol}.{i}")
                        for i in range(1, kernel_modules if separate else 1)]  # fmt: skip
    emitter = _NodeEmitter(module, symbol, k, plan, info, separate=separate, packed=slots is None,
                           homes=homes)  # fmt: skip
    clock = _Profile(module, symbol, len(plan.nodes), profile) if profile is not None else None
    values: list[Buf] = []
    slot_at = {(s.node, s.field): s for s in slots or ()}
    held: dict[int, dict[str, Buf]] = {}
    nodes = graph.nodes

    def fields(p: NodePlan) -> dict[str, Buf]:
        """Node `p`'s payload fields as its kernel reads them (once per node)."""
        node = p.node
        if node.id in held:
            return held[node.id]
        if slots is not None:
            params = {
                name: Buf(k.at(Buf(body.args[2], ()), slot_at[(node.id, name)].offset), spec.shape)
                for name, spec in kernel_specs(p, shapes).items()
            }
        elif bound is not None:
            params = {name: Buf(k.at(Buf(body.args[2], ()), offset), shape)
                      for name, (offset, shape) in bound[0][node.id].items()}  # fmt: skip
        else:
            params = {
                name: Buf(k.global_constant(f"p{node.id}.{name}", value), value.shape)
                for name, value in baked_fields(p, shapes, records, dtype, info).items()
            }
        held[node.id] = params
        return params

    for p in plan.nodes:
        node = p.node
        args = [values[q] for q in p.reads] or (
            [Buf(x_ptr, full_in)] if isinstance(node, ops.InputOp) else []
        )
        if p.dead:  # read by nothing (a pool reads around it): a placeholder
            values.append(Buf(arena.base, p.shape))
            continue
        if p.fused_into is not None:  # computed by its producer, which wrote its value
            values.append(values[p.fused_into])
            continue
        params = fields(p)
        for i, mapped in enumerate(p.maps):  # the values of its broadcast constant
            if isinstance(mapped, ops.BatchNormEvalOp):  # its fields (`norm_stores`)
                norm = fields(plan.nodes[mapped.id])
                params = {**params, **{f"map{i}.{name}": buf for name, buf in norm.items()}}
                continue
            constant = nodes[mapped.parent_ids()[1]].parent_ids()[0]
            params = {**params, f"map{i}": fields(plan.nodes[constant])["value"]}
        dest = _destination(plan, p, out_ptr, arena)
        if p.gathered:  # its producers wrote every part
            values.append(dest)
            continue
        if p.view:
            values.append(lower_node(k, node, args, params, dest))
            continue
        scratch = arena.at(p.scratch_offset, (p.scratch,)) if p.scratch_offset is not None else None
        start = clock.now(k) if clock is not None else None
        status = emitter.run(p, args, params, dest, scratch, arena, threads)
        if clock is not None:
            clock.add(k, node.id, start)
        k.fail_if(k.b.icmp_signed("!=", status, ir.Constant(I32, 0)), status)
        values.append(dest)
    result = values[out_node.id]
    if not plan.nodes[out_node.id].batched and batch is not None:
        # A value that does not depend on the input is the same for every row.
        with k.loop(batch, "row") as row:
            k.copy(Buf(k.at(Buf(out_ptr, ()), k.b.mul(row, k.i64(numel(out_shape)))), out_shape),
                   result)  # fmt: skip
    elif result.ptr is not out_ptr:
        k.copy(Buf(out_ptr, full_out), result)
    k.exit_with(Status.OK)
    arena.finish()

    _entry(module, entry_symbol, body, T)
    if queries:
        _shape_query(module, f"{symbol}_input", full_in)
        _shape_query(module, f"{symbol}_output", full_out)
        scalar = ir.Function(module, ir.FunctionType(I32, []), f"{symbol}_scalar_size")
        ir.IRBuilder(scalar.append_basic_block()).ret(ir.Constant(I32, np.dtype(dtype).itemsize))
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
        plan,
        bound[1] if bound is not None else None,
        tuple(str(home) for home in emitter.homes[1:] if home.functions),
    )


def _destination(plan: GraphPlan, p: NodePlan, out_ptr: ir.Value, arena: _Arena) -> Buf:
    """Where node `p`'s value is written: its slab of a concatenation's value (which may be
    a slab of another's), the caller's `out`, its arena region, or (a view) a placeholder the
    rule replaces with the buffer it aliases."""
    if p.into is not None:
        concat, offset = p.into
        whole = _destination(plan, plan.nodes[concat], out_ptr, arena)
        return Buf(arena.k.at(whole, offset), p.shape)
    if p.node.id == plan.writer:
        return Buf(out_ptr, p.shape)
    if p.offset is not None:
        return arena.at(p.offset, p.shape)
    return Buf(arena.base, p.shape)


def _graph_plan(graph: GraphOp, shapes: list[Shape], dtype: type, batch: int | None,
                records: dict, out_node: NodeOp, runs: bool = True) -> GraphPlan:  # fmt: skip
    """The execution plan of a checked, specialised graph (`build_graph_module`)."""
    bypass = padding_bypass(graph, records, dtype, out_node)
    maps, chained = channel_maps(graph, shapes, out_node)
    claimed = {e.id for chain in chained.values() for e in chain.nodes}
    fused = {
        q: chain
        for q, chain in fusions(graph, out_node).items()
        if q not in chained and not any(e.id in claimed for e in chain.nodes)
    }
    maps, fused = norm_stores(graph, shapes, out_node, maps, {**fused, **chained})
    return plan_graph(graph, shapes, np.dtype(dtype).itemsize, batch, fused, runs=runs,
                      bypass=bypass, maps=maps)  # fmt: skip


def kernel_specs(p: NodePlan, shapes: list[Shape]) -> dict[str, ParamSpec]:
    """Node `p`'s payload fields as its kernel reads them: laid out for the shapes one call
    sees."""
    kernel = p.kernel or (p.rows.full if p.rows else None)
    if kernel is None:
        return param_specs(p.node, shapes)
    return LOWERINGS[type(p.node)].params(kernel.node, list(kernel.arg_shapes), kernel.out_shape)


def baked_fields(p: NodePlan, shapes: list[Shape], records: dict, dtype: type,
                 info: TargetInfo) -> dict[str, np.ndarray]:  # fmt: skip
    """Node `p`'s payload fields as baked: its values, each in its `ParamSpec.pack` layout for
    `info` where it has one."""
    fields = {}
    for name, spec in kernel_specs(p, shapes).items():
        value = field_value(p.node, name, spec, records.get(p.node.id), dtype)
        fields[name] = spec.pack(value, info) if spec.pack is not None else value
    return fields


#: Where a `bound_payload` build reads each node's fields: {node id: {field: (element offset,
#: shape)}}.
BoundLayout = dict[int, dict[str, tuple[int, Shape]]]


def _bound_layout(plan: GraphPlan, shapes: list[Shape], records: dict, dtype: type,
                  info: TargetInfo) -> tuple[BoundLayout, np.ndarray]:  # fmt: skip
    """Where each node's fields lie in a `bound_payload` params array, and the array: every
    computed node's `baked_fields` in node order, each starting on an `ALIGN` boundary of the
    array (itself so aligned)."""
    itemsize = np.dtype(dtype).itemsize
    step = ALIGN // itemsize
    at: BoundLayout = {}
    parts, offset = [], 0
    applied = {m.id for p in plan.nodes for m in p.maps}  # batch norms read by their producer
    for p in plan.nodes:
        if p.dead or (p.fused_into is not None and p.node.id not in applied):  # reads none
            continue
        fields = at.setdefault(p.node.id, {})
        for name, value in baked_fields(p, shapes, records, dtype, info).items():
            fields[name] = (offset, value.shape)
            parts.append((offset, value.reshape(-1)))
            offset += -(-value.size // step) * step
    raw = np.zeros(offset + step, dtype)
    first = (-raw.ctypes.data % ALIGN) // itemsize
    array = raw[first : first + offset]
    for start, value in parts:
        array[start : start + value.size] = value
    return at, array


def bound_params(graph: GraphOp, payload: Payload, dtype: type = np.float64,
                 batch: int | None = None, target: Target = HOST) -> np.ndarray:  # fmt: skip
    """The params array a `bound_payload` build of `graph` for `batch` and `target` takes,
    from `payload` (`GraphModule.bound` of that build, without building it: for object code
    read from the cache)."""
    if has_batch(graph):
        graph, batch = specialise(graph, batch), None
    shapes = graph_shapes(graph)
    records = prepare_records(graph, payload, dtype, shapes)
    output = graph.output
    assert output is not None and isinstance(output.value.owner, NodeOp)
    plan = _graph_plan(graph, shapes, dtype, batch, records, output.value.owner)
    return _bound_layout(plan, shapes, records, dtype, target_info(target))[1]


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


class _Arena:
    """The workspace of one call, laid out by the plan: the shared arena (`plan.arena`
    elements) then one scratch region per worker. A small, fixed-size one lives on the stack;
    otherwise the block comes from the runtime's cache (`tlc_rt_acquire`, status OUT_OF_MEMORY
    if that fails) and goes back to it on every exit, so calls after the first reuse memory
    already allocated and faulted in."""

    def __init__(self, k: KernelBuilder, graph: GraphOp, plan: GraphPlan, threads: ir.Value):
        self.k, self.plan = k, plan
        itemsize = k.dtype.itemsize
        workers = plan.max_workers if plan.worker_scratch else 0
        try:
            check_bytes(plan.arena + workers * plan.worker_scratch, itemsize,
                        f"codegen: graph @{graph.graph_name}: workspace")  # fmt: skip
        except LimitError as exc:
            raise error(str(exc), graph) from None
        b = k.b
        self.raw: ir.Value | None = None
        if not plan.worker_scratch and plan.arena_bytes <= STACK_LIMIT:
            with b.goto_block(k.alloca_block):
                array = b.alloca(ir.ArrayType(k.T, max(plan.arena, 1)), name="workspace")
                array.align = ALIGN
                self.base = b.bitcast(array, k.T.as_pointer())
            self.workers = None
            return
        # Workers that can run at once: at least one, at most the tasks of the widest region.
        wanted = b.sext(threads, I64)
        one = k.i64(1)
        wanted = b.select(b.icmp_signed("<", wanted, one), one, wanted)
        most = k.i64(max(plan.max_workers, 1))
        self.workers = b.select(b.icmp_signed(">", wanted, most), most, wanted)
        size = b.add(k.i64(plan.arena * itemsize),
                     b.mul(self.workers, k.i64(plan.worker_scratch * itemsize)))  # fmt: skip
        self.raw = b.call(_runtime(k.module, "tlc_rt_acquire"), [size])
        k.fail_if(b.icmp_unsigned("==", self.raw, ir.Constant(I8P, None)), Status.OUT_OF_MEMORY)
        self.base = b.bitcast(self.raw, k.T.as_pointer())

    def at(self, offset: int, shape: Shape) -> Buf:
        return Buf(self.k.at(Buf(self.base, ()), offset), shape)

    def worker_base(self) -> ir.Value:
        """Where worker 0's scratch starts (worker w's is `w * plan.worker_scratch` after)."""
        return self.k.at(Buf(self.base, ()), self.plan.arena)

    def finish(self) -> None:
        """Close the body: the exit gives a cached block back (if it was acquired at all)."""
        k, raw = self.k, self.raw
        if raw is None:
            k.finish()
            return

        def release() -> None:
            got = k.b.icmp_unsigned("!=", raw, ir.Constant(I8P, None))
            with k.b.if_then(got):
                k.b.call(_runtime(k.module, "tlc_rt_release"), [raw])

        k.finish(release)


#: `i8*`, the runtime's untyped pointers.
I8P = ir.IntType(8).as_pointer()
_RUNTIME_TYPES = {
    "tlc_rt_acquire": ir.FunctionType(I8P, [I64]),
    "tlc_rt_release": ir.FunctionType(ir.VoidType(), [I8P]),
    "tlc_rt_parallel": ir.FunctionType(I32, [I8P, I8P, I64, I32]),
    "tlc_rt_parallel_parts": ir.FunctionType(I32, [I8P, I8P, I64, I32]),
}


class _Profile:
    """The per-node clock of a profiling build: `<symbol>_profile`, one i64 per node (zero
    at load), to which each node's computation adds its nanoseconds (clock_gettime, from
    libc) of the calling thread's CPU time ("cpu": CLOCK_THREAD_CPUTIME_ID, which leaves out
    the time other processes hold the core, and the work a parallel region's other workers
    do: for one thread) or of wall time ("wall": CLOCK_MONOTONIC, for several threads)."""

    #: Linux's clock ids.
    CLOCKS = {"cpu": 3, "wall": 1}

    def __init__(self, module: ir.Module, symbol: str, nodes: int, clock: str):
        self.clock_id = self.CLOCKS[clock]
        self.array = ir.GlobalVariable(module, ir.ArrayType(I64, nodes), f"{symbol}_profile")
        self.array.initializer = ir.Constant(self.array.type.pointee, None)
        self.timespec = ir.LiteralStructType([I64, I64])
        self.clock = ir.Function(module, ir.FunctionType(I32, [I32, self.timespec.as_pointer()]),
                                 "clock_gettime")  # fmt: skip

    def now(self, k: KernelBuilder) -> ir.Value:
        """The clock's time in nanoseconds."""
        with k.b.goto_block(k.alloca_block):
            spec = k.b.alloca(self.timespec, name="ts")
        k.b.call(self.clock, [ir.Constant(I32, self.clock_id), spec])
        at = [ir.Constant(I32, 0), ir.Constant(I32, 0)]
        seconds = k.b.load(k.b.gep(spec, at))
        nanos = k.b.load(k.b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        return k.b.add(k.b.mul(seconds, k.i64(10**9)), nanos)

    def add(self, k: KernelBuilder, node: int, start: ir.Value) -> None:
        slot = k.b.gep(self.array, [ir.Constant(I32, 0), ir.Constant(I32, node)])
        k.b.store(k.b.add(k.b.load(slot), k.b.sub(self.now(k), start)), slot)


def _status_of_either(
    b: ir.IRBuilder, cond: ir.Value, then: Callable[[], ir.Value], otherwise: Callable[[], ir.Value]
) -> ir.Value:
    """The i32 status of `then()` where `cond` holds, else of `otherwise()`: each call emitted
    in its own branch, their results joined by a phi."""
    with b.if_else(cond) as (yes, no):
        with yes:
            first, first_block = then(), b.block
        with no:
            second, second_block = otherwise(), b.block
    status = b.phi(I32)
    status.add_incoming(first, first_block)
    status.add_incoming(second, second_block)
    return status


def _runtime(module: ir.Module, name: str) -> ir.Function:
    """A function of the C runtime (tlc.codegen.runtime), declared once per module."""
    return module.globals.get(name) or ir.Function(module, _RUNTIME_TYPES[name], name)


#: A row task: `i32 task(i8* ctx, i64 index, i64 worker)`.
TASK_TYPE = ir.FunctionType(I32, [I8P, I64, I64])
#: `i32 parts_task(ctx, first, end, worker)`: a split node's parts [first, end).
PARTS_TASK_TYPE = ir.FunctionType(I32, [I8P, I64, I64, I64])


class _NodeEmitter:
    """Calls of node kernels from the body: one call, or a parallel region of row tasks.

    Each distinct kernel is one function of pointers (`node_function`: internal, or hidden in
    another of `homes`, the modules compiled at the same time), shared by the
    nodes that differ only in their data (in a graph of over `INLINE_NODES` nodes, an
    elementwise map of `MAP_ELEMENTS` or more calls its op kind's `map_function` with its
    length); a row region also gets a task function that offsets the pointers to its rows and
    picks the worker's scratch, and the body passes the region to
    `tlc_rt_parallel` with the pointers in a context array."""

    def __init__(self, module: ir.Module, symbol: str, k: KernelBuilder, plan: GraphPlan,
                 info: TargetInfo, separate: bool, packed: bool,
                 homes: list[ir.Module]):  # fmt: skip
        self.module, self.symbol, self.k, self.plan, self.info = module, symbol, k, plan, info
        #: Kernels no larger graph inlines; baked params in their packed layouts.
        self.separate, self.packed = separate, packed
        #: The modules node functions go in (`module` first), and their instructions so far.
        self.homes, self.sizes = homes, [0] * len(homes)
        self.functions: dict[tuple, ir.Function] = {}
        #: The (task, ctx) of each node of the row run being emitted (`NodePlan.run`).
        self.pending: list[tuple[ir.Function, ir.Value]] = []

    def map_length(self, p: NodePlan, kernel: Kernel, params: dict[str, Buf], scratch: int
                   ) -> int | None:  # fmt: skip
        """The length to call `kernel` with when it runs its op kind's size-generic map kernel
        (`map_function`: graphs that keep kernels apart, maps of `MAP_ELEMENTS` or more over
        operands of the output's size, nothing fused); else None."""
        n = numel(kernel.out_shape)
        if (
            not self.separate
            or type(kernel.node) not in MAPS
            or params
            or scratch
            or n < MAP_ELEMENTS
            or any(numel(shape) != n for shape in kernel.arg_shapes)
        ):
            return None
        return n

    def callee(self, p: NodePlan, kernel: Kernel, params: dict[str, Buf], scratch: int
               ) -> tuple[ir.Function, list[ir.Constant]]:  # fmt: skip
        """The function that runs `kernel` and the arguments it takes after the buffers: the
        node's own kernel, or the size-generic map (and its length)."""
        n = self.map_length(p, kernel, params, scratch)
        if n is None:
            return self.kernel(p, kernel, params, scratch), []
        then = p.epilogue
        key = ("map", type(kernel.node), repr(kernel.node.metadata()), len(kernel.arg_shapes),
               p.in_place, then.key() if then else ())  # fmt: skip
        func = self.functions.get(key)
        if func is None:
            func = map_function(self.module, f"{self.symbol}.map.{kernel.node.TAG}",
                                kernel.node, len(kernel.arg_shapes), self.k.dtype.type,
                                self.info, in_place=p.in_place, fused=then)  # fmt: skip
            func.attributes.add("noinline")
            self.functions[key] = func
        return func, [ir.Constant(I64, n)]

    def kernel(self, p: NodePlan, kernel: Kernel, params: dict[str, Buf], scratch: int
               ) -> ir.Function:  # fmt: skip
        """The node function of `kernel`: split into the plan's parts."""
        param_shapes = {name: b.shape for name, b in params.items()}
        parts = 1 if p.rows is not None else p.parts
        key = (type(kernel.node), repr(kernel.node.metadata()), kernel.arg_shapes,
               tuple(param_shapes.items()), kernel.out_shape, scratch, p.in_place,
               p.epilogue.key() if p.epilogue else (), parts,
               tuple(type(m) for m in p.maps))  # fmt: skip
        func = self.functions.get(key)
        if func is None:
            home = self.sizes.index(min(self.sizes))
            func = node_function(
                self.homes[home], f"{self.symbol}.n{p.node.id}", kernel.node, kernel.arg_shapes,
                param_shapes, kernel.out_shape, scratch, self.k.dtype.type, self.info,
                in_place=p.in_place, packed=self.packed, fused=p.epilogue, parts=parts,
                maps=p.maps,
            )  # fmt: skip
            self.sizes[home] += sum(len(block.instructions) for block in func.blocks)
            if self.separate:
                func.attributes.add("noinline")
            if home:  # linked from another module: hidden, and declared here
                func.linkage = "hidden"
                func = ir.Function(self.module, func.ftype, func.name)
                func.linkage = "hidden"
            self.functions[key] = func
        return func

    def run(self, p: NodePlan, args: list[Buf], params: dict[str, Buf], dest: Buf,
            scratch: Buf | None, arena: _Arena, threads: ir.Value) -> ir.Value:  # fmt: skip
        """Emit node `p`'s computation; returns its i32 status."""
        k = self.k
        if p.rows is None and p.parts == 1:
            assert p.kernel is not None
            buffers = [*args, *params.values(), dest, *([scratch] if scratch is not None else [])]
            func, extra = self.callee(p, p.kernel, params, p.scratch if scratch is not None else 0)
            return k.b.call(func, [*(b.ptr for b in buffers), *extra])
        rows = p.rows
        task = self.task(p, rows, params) if rows is not None else self.part_task(p, params)
        pointers = [b.ptr for b in (*args, *params.values(), dest)]
        pointers.append(arena.worker_base() if p.scratch else ir.Constant(k.T.as_pointer(), None))
        with k.b.goto_block(k.alloca_block):
            ctx = k.b.alloca(ir.ArrayType(k.T.as_pointer(), len(pointers)), name=f"ctx{p.node.id}")
        for i, ptr in enumerate(pointers):
            k.b.store(ptr, k.b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        if rows is None:
            return self.split_call(p, task, ctx, pointers, params, threads)
        if not rows.parallel:  # not worth threads: the tasks in order, on this thread
            with k.loop(rows.tasks, "task") as index:
                status = k.b.call(task, [k.b.bitcast(ctx, I8P), index, k.i64(0)])
                k.fail_if(k.b.icmp_signed("!=", status, ir.Constant(I32, 0)), status)
            return ir.Constant(I32, 0)
        if p.run is not None:
            self.pending.append((task, k.b.bitcast(ctx, I8P)))
            if not p.run_end:  # computed by the run's region, at its last node
                return ir.Constant(I32, 0)
            task, ctx = self.run_task(p.run)
        return k.b.call(
            _runtime(self.module, "tlc_rt_parallel"),
            [k.b.bitcast(task, I8P), k.b.bitcast(ctx, I8P), k.i64(rows.tasks), threads],
        )

    def split_call(self, p: NodePlan, task: ir.Function, ctx: ir.Value, pointers: list[ir.Value],
                   params: dict[str, Buf], threads: ir.Value) -> ir.Value:  # fmt: skip
        """A split node's call: its parts as a parallel region, or on one thread the part
        kernel called once over all its parts, which repeats none of the parts' copies (staged
        rows, re-packed blocks) and computes the same bytes (each output element's sums are
        the same products in the same order, whatever the part that computes it). One
        function serves both: a whole-kernel variant of its own doubled the LLVM work of
        every split node (see docs/performance.md, "Compile time")."""
        assert p.kernel is not None
        b = self.k.b
        kernel = self.kernel(p, p.kernel, params, p.scratch)
        every = [self.k.i64(0), self.k.i64(p.parts)]
        buffers = pointers if p.scratch else pointers[:-1]
        return _status_of_either(
            b,
            b.icmp_signed("<=", threads, ir.Constant(I32, 1)),
            lambda: b.call(kernel, [*buffers, *every]),
            lambda: b.call(
                _runtime(self.module, "tlc_rt_parallel_parts"),
                [b.bitcast(task, I8P), b.bitcast(ctx, I8P), self.k.i64(p.parts), threads],
            ),
        )

    def run_task(self, run: int) -> tuple[ir.Function, ir.Value]:
        """The task of a row run (`plan.row_runs`) and its context: task t calls every node's
        row task t in order, on the same worker, and stops at the first failure; the context
        holds the nodes' contexts."""
        k, pending = self.k, self.pending
        with k.b.goto_block(k.alloca_block):
            ctx = k.b.alloca(ir.ArrayType(I8P, len(pending)), name=f"run{run}")
        for i, (_, node_ctx) in enumerate(pending):
            k.b.store(node_ctx, k.b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        func = ir.Function(self.module, TASK_TYPE, f"{self.symbol}.r{run}")
        func.linkage = "internal"
        contexts, index, worker = func.args
        b = ir.IRBuilder(func.append_basic_block("entry"))
        slots = b.bitcast(contexts, I8P.as_pointer())
        for i, (task, _) in enumerate(pending):
            status = b.call(task, [b.load(b.gep(slots, [ir.Constant(I64, i)])), index, worker])
            with b.if_then(b.icmp_signed("!=", status, ir.Constant(I32, 0)), likely=False):
                b.ret(status)
        b.ret(ir.Constant(I32, 0))
        self.pending = []
        return func, ctx

    def part_task(self, p: NodePlan, params: dict[str, Buf]) -> ir.Function:
        """`i32 parts_task(ctx, first, end, worker)`: the node's split kernel call over its
        parts [first, end), on the worker's scratch (`tlc_rt_parallel_parts` chooses the
        ranges)."""
        assert p.kernel is not None
        kernel = self.kernel(p, p.kernel, params, p.scratch)
        func = ir.Function(self.module, PARTS_TASK_TYPE, f"{self.symbol}.p{p.node.id}")
        func.linkage = "internal"
        ctx, first, end, worker = func.args
        b = ir.IRBuilder(func.append_basic_block("entry"))
        slots = b.bitcast(ctx, self.k.T.as_pointer().as_pointer())
        count = len(p.kernel.arg_shapes) + len(params) + 1
        pointers = [b.load(b.gep(slots, [ir.Constant(I64, i)])) for i in range(count)]
        if p.scratch:
            base = b.load(b.gep(slots, [ir.Constant(I64, count)]))
            mine = b.mul(worker, ir.Constant(I64, self.plan.worker_scratch))
            pointers.append(b.gep(base, [mine], inbounds=True))
        b.ret(b.call(kernel, [*pointers, first, end]))
        return func

    def task(self, p: NodePlan, rows: Rows, params: dict[str, Buf]) -> ir.Function:
        """`i32 task(ctx, index, worker)`: kernel call on rows [index * chunk, ...)."""
        full = self.callee(p, rows.full, params, p.scratch)
        last = self.callee(p, rows.last, params, p.scratch) if rows.last else None

        def named(callee: tuple[ir.Function, list[ir.Constant]] | None) -> tuple | None:
            return None if callee is None else (callee[0].name, *(c.constant for c in callee[1]))

        key = ("task", named(full), named(last), rows.chunk, rows.tasks, rows.arg_rows,
               rows.out_row, p.out_stride, self.plan.worker_scratch)  # fmt: skip
        func = self.functions.get(key)
        if func is not None:
            return func
        T = self.k.T.as_pointer()
        func = ir.Function(self.module, TASK_TYPE, f"{self.symbol}.t{p.node.id}")
        func.linkage = "internal"
        ctx, index, worker = func.args
        b = ir.IRBuilder(func.append_basic_block("entry"))
        slots = b.bitcast(ctx, T.as_pointer())
        n_args, n_params = len(rows.arg_rows), len(params)
        loaded = [b.load(b.gep(slots, [ir.Constant(I64, i)])) for i in range(n_args + n_params + 2)]
        first = b.mul(index, ir.Constant(I64, rows.chunk))

        def offset(ptr: ir.Value, per_row: int) -> ir.Value:
            if per_row == 0:
                return ptr
            return b.gep(ptr, [b.mul(first, ir.Constant(I64, per_row))], inbounds=True)

        pointers = [offset(ptr, n) for ptr, n in zip(loaded, rows.arg_rows, strict=False)]
        pointers += loaded[n_args : n_args + n_params]
        pointers.append(offset(loaded[n_args + n_params], p.out_stride or rows.out_row))
        if p.scratch:
            mine = b.mul(worker, ir.Constant(I64, self.plan.worker_scratch))
            pointers.append(b.gep(loaded[-1], [mine], inbounds=True))
        if last is None:
            b.ret(b.call(full[0], [*pointers, *full[1]]))
        else:
            is_last = b.icmp_signed("==", index, ir.Constant(I64, rows.tasks - 1))
            b.ret(
                _status_of_either(
                    b,
                    is_last,
                    lambda: b.call(last[0], [*pointers, *last[1]]),
                    lambda: b.call(full[0], [*pointers, *full[1]]),
                )
            )
        self.functions[key] = func
        return func


def _entry(module: ir.Module, symbol: str, body: ir.Function, T: ir.Type) -> None:
    """The exported entry `i32 symbol(in, out[, params], i32 threads)`: null checks, then the
    body. (Libraries wrap it in the C dispatcher, which passes the library's thread count.)"""
    entry = ir.Function(module, ir.FunctionType(I32, [a.type for a in body.args]), symbol)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    null = ir.Constant(T.as_pointer(), None)
    pointers = entry.args[:-1]
    bad = b.icmp_unsigned("==", pointers[0], null)
    for arg in pointers[1:]:
        bad = b.or_(bad, b.icmp_unsigned("==", arg, null))
    with b.if_then(bad, likely=False):
        b.ret(ir.Constant(I32, int(Status.NULL_POINTER)))
    b.ret(b.call(body, list(entry.args)))


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
    lowering = LOWERINGS[type(node)]
    size = lowering.scratch(node, parent_shapes, out_shape)
    memory = Allocation(k, size)
    scratch = memory.at(0, (size,)) if lowering.uses_scratch else None
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
    nodes = graph.nodes  # a list built on each access: once, not once per field
    parts = [
        field_value(
            nodes[s.node], s.field, ParamSpec(s.shape, s.default), records.get(s.node), dtype
        ).reshape(-1)
        for s in _param_slots(graph, shapes)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
