"""interpret: the reference denotation of a graph (TorchLean's `Graph.denoteAll`).

`interpret(graph, payload, x, dtype)` checks the graph (structure and shapes), checks the payload
against it, then folds over the nodes in order, applying each op's rule from `REFERENCE`
(`tlc.semantics.reference`) to its parents' values, and returns the whole value table: every
node's value, like the seed's heterogeneous value table, plus the selected output. The scalar
context is numpy float64 or float32; float32 is computed in float32 at every step.

Failures are `EvalError`s located at the node, with the seed's messages: payload mismatches
(`tlc.semantics.payload_check`), an input of the wrong shape, raw `log` of a non-positive value, and
a rule producing a shape other than the declared one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tlc.core.arrays import as_float_array
from tlc.core.limits import LimitError, check_elements
from tlc.core.payload import Payload
from tlc.dialect import ops
from tlc.dialect.batch import PROBES, PerBatch, has_batch
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.dialect.verify import graph_shapes

# The backward ops' reference rules join `REFERENCE` when their module is imported: imported
# here, so `REFERENCE` as this module exports it is the complete table.
from tlc.semantics import backward_reference  # noqa: F401
from tlc.semantics.payload_check import PAYLOAD_CHECKS, check_payload, prepare_records
from tlc.semantics.reference import REFERENCE, EvalError, Rule, eval_error

__all__ = [
    "DTYPES",
    "PAYLOAD_CHECKS",
    "REFERENCE",
    "EvalError",
    "Rule",
    "ValueTable",
    "bind_inputs",
    "check_payload",
    "check_produced",
    "interpret",
    "prepare_records",
    "prepare",
    "Prepared",
]

#: The scalar contexts this interpreter runs in.
DTYPES = {"f64": np.float64, "f32": np.float32}

#: Graph inputs: a mapping from input node id to value; or a list/tuple of np.ndarrays, one per
#: input node in node order; or, for a graph with one input node, its value (any array-like).
Inputs = Any


@dataclass
class ValueTable:
    """Every node's value by node id, and which one is the graph's output."""

    values: list[np.ndarray]
    output_id: int

    @property
    def output(self) -> np.ndarray:
        return self.values[self.output_id]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, node_id: int) -> np.ndarray:
        return self.values[node_id]


def interpret(
    graph: GraphOp, payload: Payload | None, x: Inputs, dtype: type = np.float64
) -> ValueTable:
    """Evaluate every node of `graph` on input `x` in `dtype` (np.float64 or np.float32)."""
    return prepare(graph, payload, dtype)(x)


@dataclass(frozen=True)
class _Step:
    node: NodeOp
    rule: Rule
    parents: tuple[int, ...]
    record: dict[str, np.ndarray] | None
    shape: Shape


@dataclass(frozen=True)
class Prepared:
    """A checked graph with its payload cast to `dtype`: call it on inputs for a value table.

    Checking the graph and payload and reading the IR happen once in `prepare`; a call does only
    the fold over the nodes, so repeated evaluation (benchmarks, sampled checks) costs little
    more than the numpy work itself.
    """

    graph: GraphOp
    dtype: type
    shapes: list[Shape]
    steps: list[_Step]
    output_id: int

    def __call__(self, x: Inputs) -> ValueTable:
        inputs = bind_inputs(self.graph, self.shapes, x, self.dtype)
        values: list[np.ndarray] = []
        for step in self.steps:
            node = step.node
            if node.id in inputs:
                value = inputs[node.id]
            else:
                args = [values[pid] for pid in step.parents]
                value = np.asarray(step.rule(node, args, step.record, self.dtype))
            check_produced(node, value, step.shape)
            values.append(value)
        return ValueTable(values, self.output_id)


def prepare(
    graph: GraphOp, payload: Payload | None, dtype: type = np.float64
) -> Prepared | PreparedPerBatch:
    """Check `graph` (structure, shapes) and `payload` against it, once, for repeated runs. A
    graph with the batch extent `N` is prepared per batch size its inputs give."""
    if has_batch(graph):
        return PreparedPerBatch(graph, payload, dtype)
    shapes = graph_shapes(graph)
    check_sizes(graph, shapes)
    records = prepare_records(graph, payload or Payload(), dtype, shapes)
    steps = [
        _Step(node, REFERENCE[type(node)], tuple(node.parent_ids()), records.get(node.id),
              shapes[node.id])
        for node in graph.nodes
    ]  # fmt: skip
    output = graph.output
    assert output is not None, "verify-structure guarantees one output"
    owner = output.value.owner
    assert isinstance(owner, NodeOp)
    return Prepared(graph, dtype, shapes, steps, owner.id)


class PreparedPerBatch:
    """A graph with `N`, checked (at `tlc.dialect.batch.PROBES`, with its payload) and called
    like `Prepared`: each call runs the graph specialised to its inputs' batch size (prepared
    once per batch size)."""

    def __init__(self, graph: GraphOp, payload: Payload | None, dtype: type):
        graph_shapes(graph)  # checks an unverified graph at the probe batch sizes
        self.graph = graph
        self.dtype = dtype
        self.per_batch = PerBatch(graph, lambda g: prepare(g, payload, dtype))
        self.per_batch.at(PROBES[0])  # checks the payload now, not on the first call

    def __call__(self, x: Inputs) -> ValueTable:
        given = given_inputs(self.graph, x)
        return self.per_batch.for_inputs(input_shapes(given))(given)


def input_shapes(given: Mapping[int, Any]) -> dict[int, Shape]:
    """The shape of each given input value (node id -> value, as `given_inputs` returns)."""
    return {nid: np.shape(as_float_array(v)) for nid, v in given.items()}


def check_sizes(graph: GraphOp, shapes: list[Shape]) -> None:
    """Refuse, before allocating anything, a graph with a node over the element budget
    (`tlc.core.limits`): a node that broadcasts to [2^62, 4] would otherwise fail deep in numpy
    with a MemoryError or "iterator is too large"."""
    for node in graph.nodes:
        try:
            check_elements(shapes[node.id], f"IR eval: node {node.id}")
        except LimitError as exc:
            raise eval_error(str(exc), node) from None


def check_produced(node: NodeOp, value: np.ndarray, declared: Shape) -> None:
    """Raise the seed's `produced shape mismatch` error unless `value` has the node's inferred
    shape: every executor of a graph (this fold, kernel plans) checks a rule's result the same way,
    so a wrong rule or kernel is reported at its node instead of failing somewhere downstream."""
    if value.shape != declared:
        raise eval_error(
            f"IR eval: node {node.id}: produced shape mismatch: produced="
            f"{fmt_shape(value.shape)}, declared={fmt_shape(declared)} ({node.summary()})",
            node,
        )


def bind_inputs(graph: GraphOp, shapes: list[Shape], x: Inputs, dtype: type) -> dict[int, Any]:
    """Input node id -> its value in `dtype`, checked against the node's shape.

    `x` is one array (a graph with one input node), a list with one array per input node (in
    node order) or `{node id: array}`. Shared by everything that evaluates a graph (reference
    fold, kernel plans, interval bounds, sampled checks), so all accept the same inputs and
    report the same errors."""
    input_nodes = [n for n in graph.nodes if isinstance(n, ops.InputOp)]
    given = given_inputs(graph, x)
    bound: dict[int, Any] = {}
    for node in input_nodes:
        if node.id not in given:
            raise eval_error(f"IR eval: no value given for input node {node.id}", node)
        value = as_float_array(given[node.id], dtype)
        if value.shape != shapes[node.id]:
            raise eval_error(
                f"IR eval: input {node.id}: shape mismatch: given {fmt_shape(value.shape)}, "
                f"declared {fmt_shape(shapes[node.id])}",
                node,
            )
        bound[node.id] = value
    return bound


def given_inputs(graph: GraphOp, x: Inputs) -> dict[int, Any]:
    """`x` (see `bind_inputs`) as input node id -> value, values not yet read."""
    input_nodes = [n for n in graph.nodes if isinstance(n, ops.InputOp)]
    if isinstance(x, Mapping):
        return dict(x)
    if _one_per_input(x, len(input_nodes)):
        return {n.id: value for n, value in zip(input_nodes, x, strict=True)}
    if len(input_nodes) == 1:
        return {input_nodes[0].id: x}
    raise EvalError.simple(
        f"IR eval: graph @{graph.graph_name} has {len(input_nodes)} input nodes: give a "
        "list with one array per input node, or a mapping from input node id to array"
    )


def _one_per_input(x: Inputs, count: int) -> bool:
    return (
        isinstance(x, list | tuple)
        and len(x) == count
        and all(isinstance(v, np.ndarray) for v in x)
    )
