"""The execution plan of a compiled graph: how each node runs and where its value lives.

Decided at compile time from the shapes alone, before any IR is emitted:

- **How a node runs.** A view (input, const, reshape, ...) computes nothing. Any other node is
  either one call of its kernel (`Kernel`: the node and the shapes one call sees) or a region
  of tasks over leading rows (`Rows`): task t computes rows [t*chunk, (t+1)*chunk) of the value
  from the same rows of the parents that have them (`arg_rows`) and the whole of those that do
  not (shared operands, scalars). A node is split into rows when its leading axis is
  independent (`leading_rows`) and it has enough work to be worth threads (`PARALLEL_WORK`).
  The tasks are fixed here, never by the thread count at run time, so results are identical
  for any number of threads: a worker only chooses which task it runs.
- **Batch as a loop dimension** (`batch=N`). Every value that depends on the input gains a
  leading axis of N. A node whose kernel computes each leading row on its own given that axis
  (`batched_node`: elementwise maps, linear, convolution, pooling, batch norm, softmax, layer
  norm, matmul; for some with its axis metadata shifted by one) is one kernel over the batch,
  so a linear over N rows is one matrix product with M = N, split into row chunks only for
  threads; any other node runs its single-example kernel once per row, as tasks. Values that do
  not depend on the input (constants) are computed once, without the axis.
- **Memory.** The output node writes the caller's `out`. Every other computed value, and the
  scratch of every node that runs as one call, gets a region of one arena, assigned by liveness:
  a value lives from its node to the last node that reads it (through views of it, which alias
  it), and regions whose lifetimes do not overlap share memory (placed greedily by size, largest
  first, at the lowest offset free during the whole lifetime). An elementwise map
  (`lower.IN_PLACE`) overwrites its input when the input dies at the node and has the same size.
  Scratch of row regions is per worker (`worker_scratch` elements each, after the arena), since
  tasks run at once. A channel concatenation whose parts are read by nothing else (of one
  image: by anything, and concatenations of that kind among them) is a region its producers
  write their slabs of (`_concat_slabs`): it copies nothing.
- **Runs.** Consecutive row regions over the same tasks form one region whose task runs each
  node on its rows in turn (`row_runs`: depth first, a chunk of images through a chain of
  layers while it is in cache; through the concatenations its nodes write, re-planned at
  one image per task where their producers are); what a run computes or reads stays alive
  to its end, but for the values only the run's own nodes read by rows (concatenations
  included): those lie task by task, each task's block holding its rows of them, reused by
  liveness within the task (`_task_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tlc.codegen.lower import IN_PLACE, LOWERINGS
from tlc.codegen.lower.rules import Fused, balanced_parts
from tlc.dialect import ops
from tlc.dialect.families import AxisOp, BinaryOp, PoolOp, UnaryOp
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.shapes import Shape, numel

#: Arena regions start on 64-byte boundaries (one AVX-512 vector).
ALIGN = 64
#: Estimated work (about one unit per flop or element moved) below which a node stays one
#: call: waking the pool costs microseconds, more than such a node takes on one core.
PARALLEL_WORK = 1 << 20
#: The same for a single call split into parts (batch 1): its region is a range of parts per
#: thread (`tlc_rt_parallel_parts`), about a microsecond with the workers awake between the
#: regions of a call, so smaller nodes pay:
#: mobilenet_v2's depthwise 960-channel 3x3 on 7 x 7 (0.85 Mflop, 45 us on one thread) and
#: resnet18's classifier (1 Mflop, but 2 MB of weights read: 93 us) were left on one thread.
PART_WORK = 1 << 19
#: Tasks a node with enough work is split into (independent of the thread count, so results
#: do not depend on it; enough to balance 2-4 threads).
TASKS = 8
#: A row run (`row_runs`) of at least LONG_RUN nodes over at most ROW_TASKS rows runs one
#: row per task (`one_row_runs`): each image of a batch of up to 16 goes alone through the
#: run's chain of layers, so its values stay in cache (mobilenet_v2 at batch 16, one run of
#: 52 nodes, one thread: two images per task took 9% longer). Shorter runs keep their
#: chunks: squeezenet1_0's runs of 2-3 nodes between its concatenations gain nothing from
#: it, and its convolutions on 13 x 13 and 27 x 27 planes group two images per panel.
ROW_TASKS, LONG_RUN = 16, 8
#: Payload elements above which a node stays out of row runs (`row_runs`, `_heavy`): image by
#: image, such a layer reads its weights from memory once per image (resnet18's 512 -> 512
#: on 7 x 7: 2.4 M, 9.4 MB of float32, 16 times a call at batch 16); in a region of its own,
#: once per task's chunk of images.
RUN_PARAMS = 1 << 20
#: Fewest rows of a linear's matrix product per task: fewer would leave the register tiles of
#: the matrix kernels mostly empty.
MATRIX_ROWS = 16


@dataclass(frozen=True)
class Kernel:
    """One call of a node's kernel: the node (its axis metadata shifted where a batch axis was
    added) and the shapes of its operands and result in that call."""

    node: NodeOp
    arg_shapes: tuple[Shape, ...]
    out_shape: Shape


@dataclass(frozen=True)
class Rows:
    """A node run as tasks over `rows` leading rows, `chunk` per task (the last may have
    fewer, computed by `last`)."""

    rows: int
    chunk: int
    #: Elements per row of each operand; 0 for an operand every task reads whole.
    arg_rows: tuple[int, ...]
    out_row: int
    full: Kernel
    last: Kernel | None
    #: Whether the tasks are worth threads (else they run on the calling thread).
    parallel: bool

    @property
    def tasks(self) -> int:
        return -(-self.rows // self.chunk)


@dataclass
class NodePlan:
    node: NodeOp
    #: The value's shape in this build (with the batch axis when `batched`).
    shape: Shape
    batched: bool
    view: bool
    kernel: Kernel | None = None
    rows: Rows | None = None
    #: Arena offset (elements) of the value; None for views and the output node.
    offset: int | None = None
    #: The value overwrites its input's region (kernel compiled without `noalias` on out).
    in_place: bool = False
    #: Scratch elements one kernel call needs, and where (arena offset; row regions use the
    #: per-worker scratch instead).
    scratch: int = 0
    scratch_offset: int | None = None
    #: The elementwise nodes this node's kernel applies as it stores (`module.fusions`), whose
    #: last value it writes (it reads their other operands too); on those nodes, the
    #: producer (each is then a view of its value).
    epilogue: Fused | None = None
    fused_into: int | None = None
    #: A single call split into this many parts (`Lowering.parts`), run as a parallel region
    #: with per-worker scratch: how a node with one leading row (batch 1) uses threads.
    parts: int = 1
    #: The node writes its value straight into its slab of a concatenation: (the concat's
    #: id, element offset in its value); `offset` is then None. On that concat, `gathered`:
    #: its producers wrote every part, so it computes nothing.
    into: tuple[int, int] | None = None
    gathered: bool = False
    #: Row regions of consecutive nodes with the same tasks run as one region (`row_runs`):
    #: the id of the run's first node, on every node of it, and on its last, `run_end`.
    run: int | None = None
    run_end: bool = False
    #: The values the node's kernel reads: its parents, but for a pool that reads around
    #: the padding concatenations before it (`plan_graph`'s `bypass`), which are `dead`:
    #: read by nothing, computed never.
    reads: tuple[int, ...] = ()
    dead: bool = False
    #: The per-channel maps the node's kernel applies before its epilogue (`Step.maps`,
    #: `module.channel_maps`); the maps and their broadcast operands are then `dead`.
    maps: tuple[NodeOp, ...] = ()
    #: Elements between the output rows of consecutive tasks when the node writes its slab
    #: of a batched concatenation (`into`, tasks of one row each); 0: the rows' own size.
    out_stride: int = 0
    #: The node's kernel for a given number of leading rows (row regions; `_concat_slabs`
    #: re-plans a producer as tasks of one row).
    kernel_of: Callable[[int], Kernel] | None = field(default=None, repr=False)

    @property
    def tasks(self) -> int:
        """Tasks of the node's parallel region (1: one call on the calling thread)."""
        if self.rows is not None:
            return self.rows.tasks if self.rows.parallel else 1
        return self.parts


@dataclass
class GraphPlan:
    nodes: list[NodePlan]
    #: Elements of the shared arena (values and one-call scratch, reused by liveness).
    arena: int
    #: Elements of scratch per worker, and the most workers a region can use.
    worker_scratch: int
    max_workers: int
    #: Elements the same values and scratch would take without reuse (one region each).
    unshared: int
    #: The node that writes the caller's `out`: the output node, or the producer it is fused
    #: into.
    writer: int
    itemsize: int = field(default=8)

    @property
    def arena_bytes(self) -> int:
        return self.arena * self.itemsize

    @property
    def unshared_bytes(self) -> int:
        return self.unshared * self.itemsize


def aligned(elements: int, itemsize: int) -> int:
    """`elements` rounded up so the next region starts on an ALIGN boundary."""
    return -(-max(elements, 1) * itemsize // ALIGN) * ALIGN // itemsize


def work(node: NodeOp, args: list[Shape], out: Shape) -> int:
    """About how many flops (or elements moved) one kernel call does."""
    if isinstance(node, ops.LinearOp):
        return 2 * numel(out) * args[0][-1]
    if isinstance(node, ops.MatmulOp):
        return 2 * numel(out) * args[0][-1]
    if isinstance(node, ops.ConvOp):
        m = node.metadata()
        return 2 * numel(out) * m["in_channels"] // m["groups"] * math.prod(m["kernel"])
    if isinstance(node, PoolOp):
        return numel(out) * math.prod(node.meta("kernel"))
    return numel(out) + sum(numel(a) for a in args)


def leading_rows(node: NodeOp, args: list[Shape], out: Shape) -> bool:
    """Whether row r of the node's value (along axis 0) depends only on row r of its operands
    of the same leading extent (and on whole operands of size 1), so it can be computed in
    slices of rows by the same kernel."""
    if not out or any(not (_sliced(a, out) or numel(a) == 1) for a in args):
        return False
    if isinstance(node, UnaryOp | BinaryOp | ops.SafeLogOp) or type(node) in IN_PLACE:
        return True
    if isinstance(node, ops.LinearOp | ops.MatmulOp):
        return len(out) >= (2 if isinstance(node, ops.LinearOp) else 3)
    if isinstance(node, ops.ConvOp | ops.BatchNormEvalOp):
        return node.meta("channel_axis") >= 1
    if isinstance(node, PoolOp):
        return len(out) > len(node.meta("kernel"))
    if isinstance(node, AxisOp | ops.LayernormOp):
        return node.meta("axis") >= 1
    return False


def _sliced(arg: Shape, out: Shape) -> bool:
    return len(arg) == len(out) and arg[:1] == out[:1]


def batched_node(node: NodeOp, batched: list[bool], args: list[Shape]) -> NodeOp | None:
    """The node whose kernel, given the operands marked `batched` with a new leading axis,
    computes the single-example node for every row of it (None: run it once per row)."""
    if not any(batched):
        return None
    if isinstance(node, UnaryOp | BinaryOp | ops.SafeLogOp) or type(node) in IN_PLACE:
        ok = all(b or numel(a) == 1 for a, b in zip(args, batched, strict=True))
        return node if ok else None
    if not all(batched):
        return None
    if isinstance(node, ops.LinearOp | PoolOp | ops.MatmulOp):
        return node
    if isinstance(node, ops.ConvOp | ops.BatchNormEvalOp):
        return _shifted(node, "channel_axis")
    if isinstance(node, AxisOp | ops.LayernormOp):
        return _shifted(node, "axis")
    return None


def _shifted(node: NodeOp, name: str) -> NodeOp:
    fields = node.metadata()
    fields[name] += 1
    return type(node)(node.id, [], None, fields)


def _with_rows(shape: Shape, rows: int) -> Shape:
    return (rows, *shape[1:])


def plan_graph(
    graph: GraphOp,
    shapes: list[Shape],
    itemsize: int,
    batch: int | None = None,
    fused: dict[int, Fused] | None = None,
    runs: bool = True,
    bypass: dict[int, int] | None = None,
    maps: dict[int, tuple[NodeOp, ...]] | None = None,
) -> GraphPlan:
    """The plan of `graph` (see the module docstring); `shapes` are the single-example shapes,
    `fused` maps a producer's id to the elementwise nodes fused into its kernel's stores
    (their other operands are read by the producer: its last operands);
    `runs=False` keeps every row region apart (`row_runs`); `bypass` maps a pooling's id to
    the value it reads instead of its operand, a chain of concatenations that only pad it
    (then dead, `module.padding_bypass`); `maps` a node's id to the per-channel maps its
    kernel applies before its epilogue (then dead with their second operands,
    `module.channel_maps`; a batch norm among them is a view of the node's value,
    `module.norm_stores`)."""
    output = graph.output
    assert output is not None
    out_id = output.value.owner.id  # type: ignore[union-attr]
    fused = fused or {}
    fused_into = {e.id: producer for producer, chain in fused.items() for e in chain.nodes}
    bypass = bypass or {}
    nodes = graph.nodes  # a list built on each access: once
    dead = set()
    for pool, source in bypass.items():
        q = nodes[pool].parent_ids()[0]
        while q != source:
            dead.add(q)
            q = nodes[q].parent_ids()[0]
    maps = maps or {}
    for producer, chain in maps.items():
        for node in chain:
            if isinstance(node, ops.BatchNormEvalOp):  # `module.norm_stores`: a view
                fused_into[node.id] = producer
            else:
                dead.update((node.id, node.parent_ids()[1]))
    writer = fused_into.get(out_id, out_id)
    plans: list[NodePlan] = []
    for node in nodes:
        parents = [bypass[node.id]] if node.id in bypass else node.parent_ids()
        if node.id in fused:
            parents = [*parents, *fused[node.id].operands]
        lowering = LOWERINGS[type(node)]
        is_batched = batch is not None and (
            isinstance(node, ops.InputOp) or any(plans[p].batched for p in parents)
        )
        shape = (batch, *shapes[node.id]) if is_batched else shapes[node.id]
        folded = fused_into.get(node.id)
        skipped = folded is not None or node.id in dead
        p = NodePlan(node, shape, is_batched, lowering.view or skipped,
                     epilogue=fused.get(node.id), fused_into=folded, reads=tuple(parents),
                     dead=node.id in dead, maps=maps.get(node.id, ()))  # fmt: skip
        if not p.view:
            _choose_kernel(p, [plans[q] for q in parents], shapes, batch)
        plans.append(p)
    slabs = _concat_slabs(plans, _roots(plans, writer))
    if runs:
        row_runs(plans)
        one_row_runs(plans)
    arena, unshared = _assign_memory(plans, writer, itemsize, slabs)
    worker = max((p.scratch for p in plans if p.rows is not None or p.parts > 1), default=0)
    workers = max((p.tasks for p in plans), default=1)
    return GraphPlan(plans, arena, aligned(worker, itemsize) if worker else 0, workers, unshared,
                     writer, itemsize)  # fmt: skip


def _choose_kernel(p: NodePlan, parents: list[NodePlan], shapes: list[Shape], batch: int | None):
    node = p.node
    single = [shapes[q.node.id] for q in parents]
    args = [q.shape for q in parents]
    if p.batched:
        assert batch is not None
        flags = [q.batched for q in parents]
        fused = batched_node(node, flags, single)
        row_sizes = tuple(numel(s) if b else 0 for s, b in zip(single, flags, strict=True))
        if fused is not None:

            def kernel(c: int) -> Kernel:
                return Kernel(fused, tuple((c, *s) if b else s for s, b in zip(single, flags,
                              strict=True)), (c, *shapes[node.id]))  # fmt: skip

            total = work(fused, list(kernel(batch).arg_shapes), p.shape)
            _set_rows(p, batch, row_sizes, numel(shapes[node.id]), kernel, total)
        else:
            one = Kernel(node, tuple(single), shapes[node.id])
            total = batch * work(node, single, shapes[node.id])
            if batch == 1:
                p.kernel = one
            else:
                p.rows = Rows(batch, 1, row_sizes, numel(shapes[node.id]), one, None,
                              total >= PARALLEL_WORK)  # fmt: skip
    elif leading_rows(node, args, p.shape) and p.shape[0] > 1:
        rows = p.shape[0]
        sliced = [_sliced(a, p.shape) for a in args]

        def kernel(c: int) -> Kernel:
            shaped = tuple(_with_rows(a, c) if s else a for a, s in zip(args, sliced, strict=True))
            return Kernel(node, shaped, _with_rows(p.shape, c))

        row_sizes = tuple(numel(a) // rows if s else 0 for a, s in zip(args, sliced, strict=True))
        _set_rows(p, rows, row_sizes, numel(p.shape) // rows, kernel, work(node, args, p.shape))
    else:
        p.kernel = Kernel(node, tuple(args), p.shape)
    kernels = [p.kernel] if p.kernel else [k for k in (p.rows.full, p.rows.last) if k]
    lowering = LOWERINGS[type(node)]
    if p.kernel is not None:
        one = p.kernel
        shapes_in = list(one.arg_shapes)
        units = lowering.parts(one.node, shapes_in, one.out_shape)
        if units > 1 and work(one.node, shapes_in, one.out_shape) >= PART_WORK:
            p.parts = balanced_parts(units, TASKS)
    if lowering.uses_scratch:  # at least one element: an empty one is still a buffer
        p.scratch = max(
            max(lowering.scratch(k.node, list(k.arg_shapes), k.out_shape) for k in kernels), 1
        )


def _set_rows(p: NodePlan, rows: int, arg_rows: tuple[int, ...], out_row: int, kernel, total: int):
    """One call when the work is small, else about TASKS chunks of rows (of a linear, at least
    MATRIX_ROWS each; of a node with payload fields, all of equal size)."""
    p.kernel_of = kernel
    if total < PARALLEL_WORK or rows < 2:
        p.kernel = kernel(rows)
        return
    chunk = -(-rows // TASKS)
    if isinstance(p.node, ops.LinearOp):  # its rows are the M rows of one matrix product
        chunk = max(chunk, MATRIX_ROWS)
    if LOWERINGS[type(p.node)].params(p.node, list(kernel(rows).arg_shapes), p.shape):
        # Payload fields are laid out once for the kernel's shapes (packed panels may depend
        # on the rows), so every task must have the same rows: a chunk dividing them.
        while chunk < rows and rows % chunk:
            chunk += 1
    if chunk >= rows:
        p.kernel = kernel(rows)
        return
    tail = rows % chunk
    p.rows = Rows(rows, chunk, arg_rows, out_row, kernel(chunk), kernel(tail) if tail else None,
                  True)  # fmt: skip


def row_runs(plans: list[NodePlan]) -> None:
    """Mark runs of consecutive computed nodes (views between them do not count) that are
    parallel row regions over the same tasks, each reading the values computed inside the
    run by rows (task t's rows only): the run is one region whose task t runs every node of
    the run on its rows in turn (depth first), so a chunk of images flows through a chain of
    layers while it is in cache, instead of each layer passing over the whole batch
    (mobilenet_v2 at batch 16: 4% faster). Each node's kernel, rows and values are
    unchanged: the same bits.

    A gathered concatenation (`_concat_slabs`) computes nothing: it counts as a view, inside
    the run when its parts are. Its producers run one row per task, so a run meeting them
    with other chunks (squeezenet's squeezes and pools, in chunks of 2 rows) is re-planned
    as tasks of one row when every node of it can be (`_one_row_tasks`): squeezenet1_0 at
    batch 16 is then one run from the stem to the classifier instead of 18 runs of 1-3
    nodes broken at each fire module (see docs/threads-memory.md)."""
    current: list[NodePlan] = []

    def close() -> None:
        if len(current) > 1:
            rows = current[0].rows
            assert rows is not None
            if len({q.rows.chunk for q in current if q.rows is not None}) > 1:
                for q in current:
                    _one_row_tasks(q, rows.rows)
            for q in current:
                q.run = current[0].node.id
            current[-1].run_end = True
        current.clear()

    inside: set[int] = set()  # computed in the current run, or views of such values
    for p in plans:
        if p.view or p.gathered:
            if any(q in inside for q in p.reads):
                inside.add(p.node.id)
            continue
        rows = p.rows
        heavy = _heavy(p)
        fits = (
            rows is not None
            and rows.parallel
            and not heavy
            and bool(current)
            and _same_tasks(current, p)
            and all(
                n > 0 for q, n in zip(p.reads, rows.arg_rows, strict=True)
                if q in inside
            )
        )  # fmt: skip
        if not fits:
            close()
            inside = set()
        if rows is not None and rows.parallel and not heavy:
            current.append(p)
            inside.add(p.node.id)
    close()


def _heavy(p: NodePlan) -> bool:
    """Whether row region `p`'s payload fields hold more than RUN_PARAMS elements."""
    if p.rows is None:
        return False
    one = p.rows.full
    specs = LOWERINGS[type(p.node)].params(one.node, list(one.arg_shapes), one.out_shape)
    return sum(numel(spec.shape) for spec in specs.values()) > RUN_PARAMS


def _same_tasks(run: list[NodePlan], p: NodePlan) -> bool:
    """Whether row region `p` can join `run`: the same rows in the same chunks, or in other
    chunks when every node of both can take tasks of one row and none is a matrix product
    (whose rows are its M rows: MATRIX_ROWS)."""
    first, rows = run[0].rows, p.rows
    assert first is not None and rows is not None
    if rows.rows != first.rows:
        return False
    if all(q.rows is not None and q.rows.chunk == rows.chunk for q in run):
        return True
    return all(
        _one_row_tasks(q, rows.rows, check=True)
        and not isinstance(q.node, ops.LinearOp | ops.MatmulOp)
        for q in [*run, p]
    )


def one_row_runs(plans: list[NodePlan]) -> None:
    """Re-plan every row run of at least LONG_RUN nodes over at most ROW_TASKS rows as tasks
    of one row each (when each of its nodes can be), each node's kernel at one row (its
    outputs the same bits as in chunks on mobilenet_v2, resnet18 and zoo resnet50 at batch 16:
    a column's sums do not depend on the columns beside it)."""
    runs: dict[int, list[NodePlan]] = {}
    for p in plans:
        if p.run is not None:
            runs.setdefault(p.run, []).append(p)
    for run in runs.values():
        rows = run[0].rows
        assert rows is not None
        if len(run) < LONG_RUN or rows.rows > ROW_TASKS:
            continue
        if all(_one_row_tasks(p, rows.rows, check=True) for p in run):
            for p in run:
                _one_row_tasks(p, rows.rows)


@dataclass
class _Region:
    start: int
    end: int
    size: int
    offset: int = 0


def _roots(plans: list[NodePlan], out_id: int) -> list[int | None]:
    """Per node, the computed node whose region holds its value (views alias their first
    operand's, fused nodes their producer's); None for the caller's `out` (`out_id` writes
    it) and the input."""
    root: list[int | None] = []
    for p in plans:
        if p.fused_into is not None:  # its producer's value
            root.append(root[p.fused_into])
        elif p.view:
            parents = p.reads
            root.append(root[parents[0]] if parents else None)
        else:
            root.append(p.node.id if p.node.id != out_id else None)
    return root


def _assign_memory(
    plans: list[NodePlan], out_id: int, itemsize: int, slabs: dict[int, tuple[int, int]]
) -> tuple[int, int]:
    """Arena offsets by liveness (see the module docstring); returns (arena, unshared) sizes.
    `out_id` is the node writing `out` (a fused epilogue is a view of its producer); `slabs`
    the producers that write into a concatenation (`_concat_slabs`)."""
    n = len(plans)
    root = _roots(plans, out_id)
    last = list(range(n))
    for p in plans:
        for q in p.reads:
            r = root[q]
            if r is not None:
                last[r] = max(last[r], p.node.id)
    if root[out_id] is not None:  # the output is a view of a computed value: copied at the end
        last[root[out_id]] = n  # type: ignore[index]
    # A run's tasks run its nodes at once on different rows: every value computed or read in
    # it stays alive (its region unshared) until the run's end.
    for q in slabs:  # a part read after its concatenation holds that region longer
        top = _outermost(q, slabs)
        last[top] = max(last[top], last[q])
    ends = list(last)
    run_end = {p.run: p.node.id for p in plans if p.run_end}
    for p in plans:
        if p.run is not None:
            for r in [root[q] for q in p.reads] + [root[p.node.id]]:
                if r is not None:
                    ends[r] = max(ends[r], run_end[p.run])
    blocks, inner = _task_blocks(plans, root, last, slabs, itemsize)
    regions: dict[int, _Region] = {}
    scratch: list[tuple[NodePlan, _Region]] = []
    unshared = 0
    for p in plans:
        i = p.node.id
        if i in slabs:  # lives in its concatenation's region
            pass
        elif i in inner:  # in its run's task blocks
            unshared += aligned(numel(p.shape), itemsize)
        elif root[i] == i:
            size = aligned(numel(p.shape), itemsize)
            unshared += size
            shared = _in_place_source(p, plans, root, last)
            if shared in inner or shared in slabs:
                shared = None
            if p.gathered:  # alive from its first part's node on, to its parts' last reader
                first = min(q for q in slabs if _outermost(q, slabs) == i)
                regions[i] = _Region(first, ends[i], size)
            elif shared is not None:
                region = regions[shared]
                region.end = max(region.end, ends[i])
                regions[i] = region
                p.in_place = True
            else:
                regions[i] = _Region(i, ends[i], size)
        if p.scratch and p.rows is None and p.parts == 1:
            region = _Region(i, i, aligned(p.scratch, itemsize))
            unshared += region.size
            scratch.append((p, region))
    distinct = list({id(r): r for r in regions.values()}.values()) + [r for _, r in scratch]
    arena = _place(distinct + [region for region, _ in blocks.values()])
    for i, region in regions.items():
        plans[i].offset = region.offset
    for p, region in scratch:
        p.scratch_offset = region.offset
    for i, (run, offset) in inner.items():
        region, stride = blocks[run]
        plans[i].offset = region.offset + offset
        plans[i].out_stride = stride
    for q in slabs:  # the producers of a concatenation in task blocks write theirs
        top = _outermost(q, slabs)
        if top in inner:
            plans[q].out_stride = blocks[inner[top][0]][1]
    for p in plans:  # the run's nodes read those values task by task too
        if p.rows is not None and any(root[q] in inner for q in p.reads):
            arg_rows = tuple(blocks[inner[root[q]][0]][1] if root[q] in inner else n  # type: ignore[index]
                             for q, n in zip(p.reads, p.rows.arg_rows, strict=True))  # fmt: skip
            p.rows = replace(p.rows, arg_rows=arg_rows)
    return arena, unshared


def _task_blocks(
    plans: list[NodePlan], root: list[int | None], last: list[int],
    slabs: dict[int, tuple[int, int]], itemsize: int,
) -> tuple[dict[int, tuple[_Region, int]], dict[int, tuple[int, int]]]:  # fmt: skip
    """The values a run (`row_runs`) computes that only its own nodes read, each by rows, and
    where they lie: run id -> (its region, the elements between consecutive rows' blocks:
    task t's block starts t * chunk rows of it in), and value id -> (run id, offset in a
    task's block). A run's tasks run its nodes at once on different rows, so a value whose
    rows lie in one region would stay alive to the run's end (resnet50's run of 103 nodes at
    batch 16: a 1.3 GB arena); laid out task by task, each task's block holds its own rows of
    them, and two that one task never needs at once share memory (the same placement by
    liveness, in the run's node order, which is each task's order). A gathered concatenation
    whose producers are all in the run is such a value too, alive from its first producer
    on, which then writes its slab a block apart (`_assign_memory`). Each node's kernel and
    rows are unchanged, only where the rows lie: the same bits."""
    readers: dict[int, list[NodePlan]] = {}
    for p in plans:
        for q in p.reads:
            r = root[q]
            if r is not None:
                readers.setdefault(r, []).append(p)
    first = {p.run: p.node.id for p in reversed(plans) if p.run is not None}
    end = {p.run: p.node.id for p in plans if p.run_end}
    step = ALIGN // itemsize
    inner: dict[int, tuple[int, int]] = {}
    blocks: dict[int, tuple[_Region, int]] = {}
    for run, start in first.items():
        rows = plans[start].rows
        assert rows is not None
        values: list[tuple[int, _Region]] = []
        span = (start, end[run])
        for p in plans[start : end[run] + 1]:
            i = p.node.id
            if root[i] != i or i in slabs or p.into is not None or p.out_stride:
                continue
            if p.gathered:  # in the run when its producers are, alive from the first of them
                parts = [q for q in slabs if _outermost(q, slabs) == i]
                if not all(plans[q].run == run for q in parts):
                    continue
                begin, row = min(parts), numel(p.shape[1:])
            elif p.run == run:
                assert p.rows is not None
                begin, row = i, p.rows.out_row
            else:
                continue
            if last[i] > end[run] or not all(
                _reads_rows(q, i, row, run, span, root) for q in readers.get(i, [])
            ):
                continue
            values.append((i, _Region(begin, last[i], aligned(rows.chunk * row, itemsize))))
        if not values:
            continue
        block = _place([region for _, region in values])
        stride = -(-block // (rows.chunk * step)) * step  # elements per row of a block
        blocks[run] = (_Region(start, end[run], stride * rows.rows), stride)
        inner.update((i, (run, region.offset)) for i, region in values)
    return blocks, inner


def _outermost(q: int, slabs: dict[int, tuple[int, int]]) -> int:
    """The concatenation whose region holds slab `q` (through concatenations that are slabs
    of others)."""
    while q in slabs:
        q = slabs[q][0]
    return q


def _concat_slabs(plans: list[NodePlan], root: list[int | None]) -> dict[int, tuple[int, int]]:
    """Producer id -> (concat id, element offset in a row of it): the producers that write
    their value straight into a concatenation's region, which then copies nothing
    (`NodePlan.gathered`, `NodePlan.into`). A concatenation qualifies when nothing comes
    before its axis but the leading rows (extents of 1 otherwise: a channel concatenation)
    and every part is a computed value (or a relu fused into one) read by nothing else, none
    twice. With one row each part is one contiguous slab, which other nodes may read too, and
    a part may be a concatenation of that kind itself, its region then the slab (densenet's
    growing concatenations: each dense layer's convolution writes its channels into its
    block's last concatenation, and every concatenation before it is a prefix of it, read
    by its batch norm, copying nothing); with several rows (a batch), each part's
    producer must be a row region, re-planned as tasks of one row whose output rows land a
    concatenation row apart (`out_stride`). The producers then run with their slab as
    destination (its region is alive from the first of them on, so nothing they read
    overlaps it). (squeezenet's fire modules: the 1x1 and 3x3 expansions write the two
    halves of their concatenation.)"""
    users: dict[int, list[int]] = {}
    for p in plans:
        for q in p.reads:
            users.setdefault(q, []).append(p.node.id)
    slabs: dict[int, tuple[int, int]] = {}
    for p in plans:
        c = p.node.id
        if not isinstance(p.node, ops.ConcatOp) or p.view or root[c] not in (c, None):
            continue
        axis = p.node.meta("axis") + len(p.shape) - len(p.kernel.out_shape if p.kernel else ())
        parts = p.reads
        rows = numel(p.shape[:axis])
        if (
            p.kernel is None
            or rows == 0
            or len(set(parts)) != len(parts)
            or (rows > 1 and numel(p.shape[1:axis]) != 1)
        ):
            continue
        found, offset = {}, 0
        for q in parts:
            r = root[q]
            chain = [r, q] if q != r else [r]
            if (
                r is None
                or r in slabs
                or plans[r].view
                or (plans[r].gathered and rows > 1)
                or (q != r and plans[q].fused_into != r)
                or any(users.get(a) != [b] for a, b in zip(chain, chain[1:], strict=False))
                or (rows > 1 and users.get(chain[-1]) != [c])
                or (rows > 1 and not _one_row_tasks(plans[r], rows, check=True))
            ):
                break
            found[r] = (c, offset)
            offset += numel(plans[q].shape) // rows
        else:
            slabs.update(found)
            p.gathered = True
            for r, into in found.items():
                plans[r].into = into
                if rows > 1:
                    _one_row_tasks(plans[r], rows)
                    plans[r].out_stride = numel(p.shape[1:])
    return slabs


def _reads_rows(q: NodePlan, value: int, row: int, run: int, span: tuple[int, int],
                root: list[int | None]) -> bool:  # fmt: skip
    """Whether `q` reads `value` (of `row` elements per row, computed in run `run` over
    `span`) only inside the run and by rows: a view in the run (whose readers count as the
    value's), or a node of the run reading each row where it is written."""
    if q.view:
        return span[0] <= q.node.id <= span[1]
    if q.rows is None or q.run != run:
        return False
    reads = [n for a, n in zip(q.reads, q.rows.arg_rows, strict=True) if root[a] == value]
    return bool(reads) and all(n == row for n in reads)


def _one_row_tasks(p: NodePlan, rows: int, check: bool = False) -> bool:
    """Re-plan row region `p` (of `rows` rows) as tasks of one row each; `check`: only say
    whether it can be."""
    r = p.rows
    if r is None or r.rows != rows or not r.parallel or (r.chunk != 1 and p.kernel_of is None):
        return False
    if check or r.chunk == 1:
        return True
    one = p.kernel_of(1)
    p.rows = Rows(rows, 1, r.arg_rows, r.out_row, one, None, True)
    lowering = LOWERINGS[type(p.node)]
    if lowering.uses_scratch:
        p.scratch = max(lowering.scratch(one.node, list(one.arg_shapes), one.out_shape), 1)
    return True


def _in_place_source(
    p: NodePlan, plans: list[NodePlan], root: list[int | None], last: list[int]
) -> int | None:
    """The region an elementwise node may overwrite: an operand's, dying here, of equal size
    (and, for row tasks, sliced the same way)."""
    if type(p.node) not in IN_PLACE:
        return None
    for j, q in enumerate(p.reads):
        r = root[q]
        if r is None or last[r] != p.node.id or numel(plans[q].shape) != numel(p.shape):
            continue
        if p.rows is not None and p.rows.arg_rows[j] != p.rows.out_row:
            continue
        return r
    return None


def _place(regions: list[_Region]) -> int:
    """Offsets for `regions` such that regions alive at the same time never overlap: largest
    first, each at the lowest offset free over its lifetime. Returns the arena size."""
    placed: list[_Region] = []
    top = 0
    for region in sorted(regions, key=lambda r: (-r.size, r.start)):
        busy = sorted(
            (o.offset, o.offset + o.size)
            for o in placed
            if o.start <= region.end and region.start <= o.end
        )
        offset = 0
        for lo, hi in busy:
            if offset + region.size <= lo:
                break
            offset = max(offset, hi)
        region.offset = offset
        top = max(top, offset + region.size)
        placed.append(region)
    return top
