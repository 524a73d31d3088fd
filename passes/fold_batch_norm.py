"""fold-batch-norm: fold inference batch norms into the convolution or linear layer before them.

A `batch_norm_eval` node whose parent is a `conv` (any groups, depthwise included, with or
without bias) or a `linear` (with or without bias), normalising that producer's output channels,
becomes part of the producer: per output channel o, with s = gamma / sqrt(var + eps),

    w'[o, ...] = w[o, ...] * s[o]        b'[o] = (b[o] - mean[o]) * s[o] + beta[o]

(b = 0 where the producer has none), computed in float64 from the float64 payload and stored
there, so compiled float32 code rounds each folded value once. The batch norm node goes; the
nodes after it take the next lower ids (ids stay positions), their payload records move with
them and `output` follows its node. This is what ONNX Runtime does when it loads a model; it
changes the bits of the result (the convolution now sums products with the scaled weights),
which is why the pass is opt-in: compiled code keeps the unfused graph's bits otherwise.

A batch norm is left as it is when its parent's output has another user (or is the output),
when the parent or the batch norm has no payload record (parameters given at run time are not
constants), when it normalises another axis than the producer's channels (a `linear`'s last
axis, a `conv`'s `channel_axis`), when its value goes on alone to a per-channel scale or
shift (a `mul_elem`, `add`, `sub` or `div` by a `broadcast_to`: compiled code applies those in
the convolution's stores together with the batch norm, and folding the batch norm alone would
leave them passes of their own: ONNX zoo inception_v2 took 1.06-1.10x the time), when a
record lacks a field folding reads or holds one of another shape (the payload checks report it
later), or when some var + eps is not positive or a folded value is not finite.

The folded fields are computed from the source parameters, so a `tl.params` binding loses them
(and the batch norm's): the folded graph no longer takes those parameters by name.

Option `producers` (default `conv,linear`): the producer kinds to fold into.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from tlc.core.diagnostics import DiagnosticError, did_you_mean
from tlc.core.payload import Payload, Record
from tlc.dialect.ops import (
    BATCH_NORM_STATS,
    AddOp,
    BatchNormEvalOp,
    BroadcastToOp,
    ConvOp,
    DivOp,
    GraphOp,
    LinearOp,
    MulElemOp,
    NodeOp,
    OutputOp,
    PayloadOp,
    SubOp,
)
from tlc.dialect.payload_section import payload_from_module, payload_op
from tlc.dialect.program_ops import BindOp, ParamsOp
from tlc.dialect.verify import infer_graph_shapes

#: The producers a batch norm folds into, by tag.
PRODUCERS: dict[str, type[NodeOp]] = {"conv": ConvOp, "linear": LinearOp}


def producer_kinds(names: Iterable[str]) -> tuple[type[NodeOp], ...]:
    """The producer classes `names` (tags of `PRODUCERS`) stand for; an unknown name is an
    error naming the known ones."""
    kinds = []
    for name in names:
        if name not in PRODUCERS:
            known = ", ".join(PRODUCERS)
            raise DiagnosticError.simple(
                f"cannot fold into '{name}'{did_you_mean(name, PRODUCERS)} (producers: {known})"
            )
        kinds.append(PRODUCERS[name])
    return tuple(kinds)


def _channel_axis(producer: NodeOp) -> int | None:
    """The axis holding the producer's output channels (None: its rank is not declared)."""
    if isinstance(producer, ConvOp):
        return producer.meta("channel_axis")
    declared = producer.declared_shape
    return None if not declared else len(declared) - 1


def folded_record(producer: Record, norm: Record, eps: float) -> Record | None:
    """The producer's record with the batch norm `norm` folded in (float64), or None where a
    var + eps is not positive or a folded value is not finite."""
    var = norm["var"] + eps
    if not np.all(var > 0):
        return None
    scale = norm["gamma"] / np.sqrt(var)
    weight = producer["weight"]
    bias = producer.get("bias", np.zeros(weight.shape[0]))
    folded = {
        "weight": weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1)),
        "bias": (bias - norm["mean"]) * scale + norm["beta"],
    }
    if not all(np.all(np.isfinite(v)) for v in folded.values()):
        return None
    return folded


def _well_formed(producer: Record, norm: Record, channels: int) -> bool:
    """Whether the records hold the fields folding reads, one value per channel."""
    weight = producer.get("weight")
    vectors = [norm.get(f) for f in BATCH_NORM_STATS]
    if "bias" in producer:
        vectors.append(producer["bias"])
    return (
        weight is not None
        and weight.ndim >= 1
        and weight.shape[0] == channels
        and all(v is not None and v.shape == (channels,) for v in vectors)
        and np.size(norm.get("eps", 0.0)) == 1
    )


def _eps(norm: Record) -> float:
    if "eps" in norm:
        return float(norm["eps"])
    default = next(p.default for p in BatchNormEvalOp.PAYLOAD if p.name == "eps")
    assert default is not None, "batch_norm_eval's eps has a default"
    return default


#: The per-channel maps compiled code applies in a convolution's stores with its batch norm.
CHANNEL_MAPS = (MulElemOp, AddOp, SubOp, DivOp)


def _mapped_after(norm: NodeOp) -> bool:
    """Whether the batch norm's value goes on, alone, to a per-channel scale or shift (a map
    of `CHANNEL_MAPS` by a `broadcast_to`), as in ONNX zoo inception_v2's and densenet121's
    batch norm, scale, shift and relu."""
    (result,) = norm.results
    if not result.has_one_use():
        return False
    user = result.get_user_of_unique_use()
    return (
        isinstance(user, CHANNEL_MAPS)
        and user.operands[0] is result
        and isinstance(user.operands[1].owner, BroadcastToOp)
    )


def foldable(
    node: NodeOp, payload: Payload, kinds: tuple[type[NodeOp], ...]
) -> tuple[NodeOp, Record] | None:
    """(producer, its folded record) when batch norm `node` folds into its parent."""
    if not isinstance(node, BatchNormEvalOp) or node.id not in payload:
        return None
    (value,) = node.parents
    producer = value.owner
    if not isinstance(producer, kinds) or producer.id not in payload:
        return None
    if not value.has_one_use() or _channel_axis(producer) != node.meta("channel_axis"):
        return None
    if _mapped_after(node):
        return None  # the maps would become passes of their own
    norm, record = payload[node.id], payload[producer.id]
    if not _well_formed(record, norm, node.meta("channels")):
        return None  # left for the payload checks to report
    folded = folded_record(record, norm, _eps(norm))
    return None if folded is None else (producer, folded)


@dataclass
class Folded:
    """A graph with its batch norms folded: the new graph and payload, and the new id of every
    node kept (old id -> new id; a folded batch norm maps to its producer's)."""

    graph: GraphOp
    payload: Payload
    ids: dict[int, int]
    folded: list[int]  # the old ids of the batch norms folded


def fold_graph(
    graph: GraphOp, payload: Payload | None, kinds: tuple[type[NodeOp], ...] = (ConvOp, LinearOp)
) -> Folded | None:
    """`graph` with every batch norm that folds (see the module doc) folded into its producer;
    None when none does (nothing to rewrite)."""
    payload = payload or Payload()
    folds = {}
    for node in graph.nodes:
        found = foldable(node, payload, kinds)
        if found is not None:
            folds[node.id] = found
    if not folds:
        return None
    producers = {producer.id: record for producer, record in folds.values()}
    rewritten = GraphOp(graph.graph_name, [])
    block = rewritten.body.block
    new_payload = Payload()
    ids: dict[int, int] = {}
    mapper: dict[SSAValue, SSAValue] = {}
    new_id = 0
    for node in graph.nodes:
        if node.id in folds:
            producer = folds[node.id][0]
            ids[node.id] = ids[producer.id]
            result = mapper[node.results[0]] = mapper[producer.results[0]]
            if node.declared_shape is not None:  # the producer's may be undeclared
                result.owner.set_declared_shape(node.declared_shape)  # type: ignore[union-attr]
            continue
        copy = node.clone(value_mapper=mapper)
        copy.attributes["id"] = IntegerAttr(new_id, i64)
        block.add_op(copy)
        mapper[node.results[0]] = copy.results[0]
        ids[node.id] = new_id
        if node.id in payload:
            new_payload.records[new_id] = producers.get(node.id, payload[node.id])
            new_payload.kinds[new_id] = payload.kinds.get(node.id, node.TAG)
        new_id += 1
    output = graph.output
    assert output is not None, "a checked graph has an output"
    block.add_op(OutputOp(mapper[output.value]))
    return Folded(rewritten, new_payload, ids, sorted(folds))


def folded_for_compile(graph: GraphOp, payload: Payload) -> tuple[GraphOp, Payload]:
    """`graph` and `payload` with the batch norms folded into every producer kind, the new
    graph verified; unchanged when none folds. `tlc.compile`'s
    `fold_batch_norm=True`."""
    done = fold_graph(graph, payload)
    if done is None:
        return graph, payload
    infer_graph_shapes(done.graph)
    return done.graph, done.payload


def rebind(params: ParamsOp, done: Folded) -> ParamsOp | None:
    """The `tl.params` binding of the folded graph: the binds of kept nodes at their new ids,
    none for folded producers and batch norms, and only the parameters still bound declared
    (None when no bind is left)."""
    changed = {done.ids[b] for b in done.folded}
    binds = [
        BindOp(done.ids.get(b.node_id, b.node_id), b.kind.data, b.field_params())
        for b in params.binds  # a bind of no node stays, for the binding's checks to report
        if b.node_id not in done.folded and done.ids.get(b.node_id) not in changed
    ]
    bound = {name for b in binds for name in b.field_params().values()}
    declared = [(n, s) for n, s in params.declared.items() if n in bound]
    return ParamsOp(params.graph_name, declared, binds) if binds else None


@dataclass(frozen=True)
class FoldBatchNormPass(ModulePass):
    """Fold inference batch norms into the conv or linear layer before them (see the module
    doc); `producers` chooses the kinds folded into."""

    name = "fold-batch-norm"

    producers: tuple[str, ...] = tuple(PRODUCERS)

    def __post_init__(self) -> None:
        producer_kinds(self.producers)  # bad option values fail when the pipeline is built

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kinds = producer_kinds(self.producers)
        block = op.body.block
        for graph in [g for g in op.ops if isinstance(g, GraphOp)]:
            name = graph.graph_name
            done = fold_graph(graph, payload_from_module(op, name), kinds)
            if done is None:
                continue
            block.insert_op_before(done.graph, graph)
            block.erase_op(graph)
            sections = [p for p in op.ops if isinstance(p, PayloadOp) and p.graph_name == name]
            block.insert_op_before(payload_op(name, done.payload), sections[0])
            for section in sections:
                block.erase_op(section)
            for params in [p for p in op.ops if isinstance(p, ParamsOp) and p.graph_name == name]:
                binding = rebind(params, done)
                if binding is not None:
                    block.insert_op_before(binding, params)
                block.erase_op(params)
