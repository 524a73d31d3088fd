"""ONNX export: a tl graph plus its payload becomes an ONNX model that ONNX Runtime can run.

`to_onnx(graph, payload)` maps every node through `EXPORT`, a `RuleTable` keyed by tl op class.
An op kind with an `ONNX` spelling is exported as that operator, its metadata fields as the mapped
attributes (a field at its default is left out: ONNX's default is the same); an op kind with a
decomposition and no spelling is exported as its decomposition, whose ops are written by the same
table (`OnnxEmitter`). Explicit rules remain where the ONNX form differs from the op: parameters
as initializers (const, linear, conv, batch norm, layer norm), ONNX's [N, C, ...] layout (conv,
pooling, batch norm), shapes and axes as inputs or attributes tl derives (reshape, flatten,
broadcast_to, transpose, permute, reductions, softmax, concat), and the ops ONNX spells as
several nodes (mse_loss, safe_log). An op with no ONNX equivalent is refused with the reason
(`EXPORT.unsupported`), and exporting a graph that uses it is an error naming the node.

Payload fields become initializers named `<id>.<field>`, in the chosen float type (FLOAT by
default, DOUBLE on request); `const` nodes become initializers too. Input nodes become graph
inputs `x` (`x<id>` for several), the output is `y`.

ONNX's layers want the batch and channel axes first ([N, C, spatial...]); tl's conv, pooling and
batch norm allow any leading axes, so the exporter reshapes around them where the layouts differ
(leading axes folded into N, a missing N added), which moves no values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tlc.core.diagnostics import DiagnosticError, error
from tlc.core.payload import Payload, Record
from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops as tl
from tlc.dialect.batch import has_batch, specialise
from tlc.dialect.families import OnnxSpelling
from tlc.dialect.metadata import Kind
from tlc.dialect.ops import GraphOp, NodeOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape
from tlc.dialect.verify import graph_shapes
from tlc.frontends.export_batch import export_with_batch
from tlc.semantics.emitter import Emitter
from tlc.semantics.payload_check import check_payload

#: The opset exported models declare (Gelu needs 20; ReduceMean's axes are an input from 18).
OPSET = 21

ELEMENT_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


@dataclass
class Exporter:
    """The ONNX graph being built: nodes, initializers, and each tl node's value name and shape
    (by node id; the nodes a decomposition makes get ids after the graph's)."""

    graph: GraphOp
    payload: Payload
    dtype: np.dtype
    shapes: dict[int, Shape]
    #: Op kinds exported by their decomposition even where ONNX spells them.
    decompose: Collection[type[NodeOp]] = ()
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    counter: int = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def add(self, op_type: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def constant(self, value: Any, hint: str, dtype: Any = None) -> str:
        name = self.fresh(hint)
        array = np.asarray(value, dtype=dtype or self.dtype)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def initializer(self, node: NodeOp, name: str, value: Any) -> str:
        """`value` as the initializer `<id>.<name>`."""
        key = f"{node.id}.{name}"
        array = np.asarray(value, dtype=self.dtype)
        self.initializers.append(numpy_helper.from_array(array, key))
        return key

    def field(self, node: NodeOp, name: str, default: Any = None) -> str:
        """The payload field `name` of `node` (or `default`) as an initializer."""
        return self.initializer(node, name, self.payload.get(node.id, {}).get(name, default))

    def reshape(self, value: str, shape: Shape) -> str:
        target = self.constant(list(shape), "shape", np.int64)
        return self.add("Reshape", [value, target], "reshape")

    def export(self, node: NodeOp) -> None:
        """Write `node` (its parents written already) and record its value's name."""
        cls = type(node)
        rule = _decomposed if cls in self.decompose else EXPORT.get(cls)
        if rule is None:
            reason = EXPORT.unsupported[cls]
            raise error(f"ONNX export: node {node.id}: {node.TAG} has no ONNX form: {reason}", node)
        self.names[node.id] = rule(self, node, [self.names[p] for p in node.parent_ids()])


Rule = Callable[[Exporter, NodeOp, list[str]], str]

EXPORT: RuleTable[Rule] = RuleTable("ONNX export")

EXPORT.refuse(
    "ONNX's RandomUniform draws an implementation-defined stream, not tl's", tl.RandUniformOp
)
EXPORT.refuse(
    "ONNX's Bernoulli draws an implementation-defined stream, not tl's", tl.BernoulliMaskOp
)
EXPORT.refuse(
    "rows with every entry blocked give 0 in tl and NaN in Softmax", tl.HardMaskedSoftmaxOp
)
EXPORT.refuse("gelu's derivative has no ONNX op", bw.GeluGradOp)
EXPORT.refuse("ONNX has no max-pool gradient op", bw.MaxPoolGradOp)
EXPORT.refuse("ONNX has no average-pool gradient op", bw.AvgPoolGradOp)
EXPORT.refuse(
    "ConvTranspose could express it; the geometry mapping is not written", bw.ConvInputGradOp
)
EXPORT.refuse("ONNX has no convolution weight-gradient op", bw.ConvWeightGradOp)


@EXPORT.register(tl.InputOp)
def _input(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    raise AssertionError("input nodes are graph inputs, named by to_onnx")


@EXPORT.register(tl.ConstOp)
def _const(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    return ex.initializer(node, "value", ex.payload[node.id]["value"].reshape(node.meta("shape")))


@EXPORT.register(tl.SoftmaxOp, tl.LogSoftmaxOp)
def _softmax(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    op_type = "Softmax" if isinstance(node, tl.SoftmaxOp) else "LogSoftmax"
    return ex.add(op_type, inputs, node.TAG, axis=node.meta("axis"))


@EXPORT.register(tl.PermuteOp)
def _permute(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    return ex.add("Transpose", inputs, "permute", perm=list(node.meta("perm")))


@EXPORT.register(tl.TransposeOp)
def _transpose(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    perm = list(range(len(ex.shapes[node.id])))
    a, b = node.meta("axis1"), node.meta("axis2")
    perm[a], perm[b] = perm[b], perm[a]
    return ex.add("Transpose", inputs, "transpose", perm=perm)


@EXPORT.register(tl.ReshapeOp, tl.FlattenOp)
def _reshape(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    return ex.reshape(inputs[0], ex.shapes[node.id])


@EXPORT.register(tl.BroadcastToOp)
def _broadcast(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    target = ex.constant(list(node.meta("to")), "shape", np.int64)
    return ex.add("Expand", [inputs[0], target], "broadcast")


@EXPORT.register(tl.GatherOp)
def _gather(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    indices = ex.constant(list(node.meta("indices")), "indices", np.int64)
    return ex.add("Gather", [inputs[0], indices], "gather", axis=node.meta("axis"))


@EXPORT.register(tl.ConcatOp)
def _concat(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    return ex.add("Concat", inputs, "concat", axis=node.meta("axis"))


@EXPORT.register(tl.ReduceSumOp, tl.ReduceMeanOp)
def _reduce(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    op_type = "ReduceSum" if isinstance(node, tl.ReduceSumOp) else "ReduceMean"
    axes = ex.constant([node.meta("axis")], "axes", np.int64)
    return ex.add(op_type, [inputs[0], axes], node.TAG, keepdims=0)


@EXPORT.register(tl.SumOp)
def _sum(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    return ex.add("ReduceSum", inputs, "sum", keepdims=0)


@EXPORT.register(tl.MseLossOp)
def _mse(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    diff = ex.add("Sub", inputs, "diff")
    square = ex.add("Mul", [diff, diff], "square")
    return ex.add("ReduceMean", [square], "mse", keepdims=0)


@EXPORT.register(tl.SafeLogOp)
def _safe_log(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    soft = ex.add("Softplus", [inputs[0]], "softplus")
    return ex.add("Log", [ex.add("Add", [soft, inputs[1]], "plus_eps")], "safe_log")


@EXPORT.register(tl.LinearOp)
def _linear(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """Gemm (transB = 1 keeps the [out, in] weight as stored) on matrices; MatMul + Add with
    the transposed weight at other ranks."""
    record = ex.payload[node.id]
    weight = record["weight"]
    bias = record.get("bias", np.zeros(weight.shape[0]))
    if len(ex.shapes[node.parent_ids()[0]]) == 2:
        w, b = ex.initializer(node, "weight", weight), ex.initializer(node, "bias", bias)
        return ex.add("Gemm", [inputs[0], w, b], "linear", transB=1)
    w = ex.initializer(node, "weight_t", weight.T)
    product = ex.add("MatMul", [inputs[0], w], "matmul")
    return ex.add("Add", [product, ex.initializer(node, "bias", bias)], "linear")


def _nc_layout(ex: Exporter, node: NodeOp, x: str, channel_axis: int) -> tuple[str, Shape]:
    """`x` reshaped to [N, C, spatial...]: the axes before the channel axis folded into N
    (N = 1 if there are none). Returns the value and the original leading axes."""
    shape = ex.shapes[node.parent_ids()[0]]
    lead = shape[:channel_axis]
    if len(lead) == 1:
        return x, lead
    return ex.reshape(x, (prod(lead),) + shape[channel_axis:]), lead


def _restore(ex: Exporter, node: NodeOp, y: str, lead: Shape) -> str:
    return y if len(lead) == 1 else ex.reshape(y, ex.shapes[node.id])


@EXPORT.register(tl.ConvOp)
def _conv(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    m = node.metadata()
    x, lead = _nc_layout(ex, node, inputs[0], m["channel_axis"])
    operands = [x, ex.field(node, "weight")]
    if "bias" in ex.payload[node.id]:
        operands.append(ex.field(node, "bias"))
    y = ex.add(
        "Conv", operands, "conv", kernel_shape=list(m["kernel"]), strides=list(m["stride"]),
        dilations=list(m["dilation"]), pads=[*m["padding"], *m["padding_after"]],
        group=m["groups"],
    )  # fmt: skip
    return _restore(ex, node, y, lead)


@EXPORT.register(tl.BatchNormEvalOp)
def _batch_norm(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    axis = node.meta("channel_axis")
    shape = ex.shapes[node.id]
    x = inputs[0]
    lead = shape[:axis]
    trail = shape[axis + 1 :]
    # BatchNormalization wants [N, C, ...]: fold the leading axes into N and the trailing ones
    # into one spatial axis.
    view = (prod(lead), shape[axis], prod(trail))
    if shape != view:
        x = ex.reshape(x, view)
    record = ex.payload[node.id]
    eps = float(record.get("eps", 1e-5))
    operands = [x] + [ex.field(node, f) for f in ("gamma", "beta", "mean", "var")]
    y = ex.add("BatchNormalization", operands, "batch_norm", epsilon=eps)
    return y if shape == view else ex.reshape(y, shape)


@EXPORT.register(tl.LayernormOp)
def _layernorm(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    axis = node.meta("axis")
    suffix = ex.shapes[node.id][axis:]
    record = ex.payload.get(node.id, {})
    gamma = ex.field(node, "gamma", np.ones(suffix))
    beta = ex.field(node, "beta", np.zeros(suffix))
    eps = float(record.get("eps", 1e-5))
    return ex.add(
        "LayerNormalization", [inputs[0], gamma, beta], "layernorm", axis=axis, epsilon=eps
    )


@EXPORT.register(tl.MaxPoolOp, tl.AvgPoolOp)
def _pool(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    kernel, padding = list(node.meta("kernel")), list(node.meta("padding"))
    shape = ex.shapes[node.parent_ids()[0]]
    lead = shape[: len(shape) - len(kernel)]
    view = (1, prod(lead), *shape[len(lead) :]) if len(lead) != 2 else shape
    x = inputs[0] if view == shape else ex.reshape(inputs[0], view)
    attrs: dict[str, Any] = {
        "kernel_shape": kernel, "strides": list(node.meta("stride")), "pads": padding * 2,
    }  # fmt: skip
    if isinstance(node, tl.AvgPoolOp):
        attrs["count_include_pad"] = 1
        y = ex.add("AveragePool", [x], "avg_pool", **attrs)
    else:
        y = ex.add("MaxPool", [x], "max_pool", **attrs)
    return y if view == shape else ex.reshape(y, ex.shapes[node.id])


@EXPORT.register(tl.PowOp)
def _pow(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """ONNX's Pow takes the exponent as an input: a scalar initializer."""
    return ex.add("Pow", [inputs[0], ex.constant(node.meta("exponent"), "exponent")], "pow")


@EXPORT.register(tl.LessOp)
def _less(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """ONNX's Less gives booleans; tl's 0 and 1 are them cast to the real type."""
    real = helper.np_dtype_to_tensor_dtype(np.dtype(ex.dtype))
    return ex.add("Cast", [ex.add("Less", inputs, "less")], "less_real", to=real)


@EXPORT.register(tl.TruncOp)
def _trunc(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """ONNX has no Trunc: sign(x) · floor(|x|) (exact; NaN and ±inf stay)."""
    magnitude = ex.add("Floor", [ex.add("Abs", inputs, "abs")], "floor")
    return ex.add("Mul", [ex.add("Sign", inputs, "sign"), magnitude], "trunc")


@EXPORT.register(tl.WhereOp)
def _where(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """The condition cast to BOOL (not 0, NaN included, is true)."""
    condition = ex.add("Cast", [inputs[0]], "condition", to=TensorProto.BOOL)
    return ex.add("Where", [condition, *inputs[1:]], "where")


@EXPORT.register(tl.PadOp)
def _pad(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """Pad-11's form: pads [before..., after...] and the constant value as inputs."""
    pads = ex.constant([*node.meta("before"), *node.meta("after")], "pads", np.int64)
    mode = node.meta("mode")
    if mode != "constant":
        return ex.add("Pad", [inputs[0], pads], "pad", mode=mode)
    value = ex.constant(node.meta("value"), "value")
    return ex.add("Pad", [inputs[0], pads, value], "pad", mode=mode)


# --------------------------------------------------------------------------------------------
# Every other op kind: its ONNX spelling, or its decomposition
# --------------------------------------------------------------------------------------------


def _spelled(spelling: OnnxSpelling) -> Rule:
    """One ONNX node of type `spelling.op_type` on the node's inputs; each metadata field is
    the attribute the spelling maps it to, left out at its default (ONNX's default too).

    ONNX float attributes are float32: in a float64 export a number field that is no float32
    (a slope of 0.2) would change the op, so such a node is written as its decomposition, whose
    constants are float64 initializers, where the op kind has one (float32 exports compute with
    the rounded number, as tl's float32 semantics does)."""
    attribute_of = {name: attribute for attribute, name in spelling.attributes.items()}

    def rule(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
        if ex.dtype != np.float32 and _rounded_by_onnx(node) and node.defines("decompose"):
            return _decomposed(ex, node, inputs)
        attrs = {}
        for f in node.FIELDS:
            value = node.meta(f.name)
            if callable(f.default) or value != f.default:
                attrs[attribute_of[f.name]] = list(value) if isinstance(value, tuple) else value
        return ex.add(spelling.op_type, inputs, node.TAG, **attrs)

    return rule


def _rounded_by_onnx(node: NodeOp) -> bool:
    """Whether a number field of `node` is no float32, which an ONNX attribute would round."""
    return any(
        f.kind is Kind.FLOAT and float(np.float32(node.meta(f.name))) != node.meta(f.name)
        for f in node.FIELDS
    )


class OnnxEmitter(Emitter[NodeOp]):
    """The emitter a decomposition is written for, writing ONNX: each op it binds becomes a
    detached tl node (an id after the graph's, its shape checked by its rule, a constant's
    values in the exporter's payload) that the export table writes at once."""

    def __init__(self, ex: Exporter) -> None:
        self.ex = ex
        self.made: list[NodeOp] = []

    def next_id(self) -> int:
        return max(self.ex.shapes) + 1

    def evaluate(self, node: NodeOp, operands: list[NodeOp], record: Record | None) -> NodeOp:
        node.operands = [p.result for p in operands]
        self.made.append(node)
        self.ex.shapes[node.id] = node.require_declared()
        if record is not None:
            self.ex.payload.records[node.id] = {k: np.asarray(v) for k, v in record.items()}
            self.ex.payload.kinds[node.id] = node.TAG
        self.ex.export(node)
        return node

    def shape(self, value: NodeOp) -> Shape:
        return self.ex.shapes[value.id]

    def discard(self) -> None:
        """Detach the nodes made from the graph's values (they were only carriers)."""
        for node in reversed(self.made):
            node.erase()


def _decomposed(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """The ONNX nodes of `node`'s decomposition (`NodeOp.decompose`), written op by op."""
    em = OnnxEmitter(ex)
    parents = [value.owner for value in node.parents]
    try:
        result = node.decompose(em, *parents)
        return ex.names[result.id]
    finally:
        em.discard()


def _derive(op: type[NodeOp]) -> Rule | None:
    """An op kind's spelling, where it maps every metadata field; else its decomposition."""
    spelling = op.ONNX
    if spelling is not None and {f.name for f in op.FIELDS} <= set(spelling.attributes.values()):
        return _spelled(spelling)
    return _decomposed if op.defines("decompose") else None


@EXPORT.register(tl.LrnOp)
def _lrn(ex: Exporter, node: NodeOp, inputs: list[str]) -> str:
    """ONNX's LRN for an odd size; an even one as the decomposition (ONNX Runtime's LRN
    requires an odd size)."""
    if node.meta("size") % 2 == 0:
        return _decomposed(ex, node, inputs)
    return _spelled(tl.LrnOp.ONNX)(ex, node, inputs)


EXPORT.derive(NODE_OPS, _derive)


def to_onnx(
    graph: GraphOp,
    payload: Payload | None = None,
    dtype: Any = np.float32,
    opset: int = OPSET,
    decompose: Collection[type[NodeOp]] = (),
) -> onnx.ModelProto:
    """The ONNX model computing `graph` with `payload`, in `dtype` (float32 or float64);
    checked by `onnx.checker`. The op kinds in `decompose` are written as their decomposition
    even where ONNX has the operator (for a runtime that lacks it)."""
    payload = payload or Payload()
    if has_batch(graph):  # exported at two batch sizes, the batch extent N found between them
        return export_with_batch(
            lambda n: to_onnx(specialise(graph, n), payload, dtype, opset, decompose), graph
        )
    shapes = graph_shapes(graph)
    check_payload(graph, payload, shapes)
    np_dtype = np.dtype(dtype)
    if np_dtype not in ELEMENT_TYPES:
        raise DiagnosticError.simple(
            f"ONNX export: unsupported dtype {np_dtype} (float32, float64)"
        )
    element = ELEMENT_TYPES[np_dtype]
    # A copy: the nodes a decomposition makes add records (constants) the caller's lacks.
    own = Payload(dict(payload.records), dict(payload.kinds))
    ex = Exporter(graph, own, np_dtype, dict(enumerate(shapes)), frozenset(decompose))
    input_nodes = [n for n in graph.nodes if isinstance(n, tl.InputOp)]
    graph_inputs = []
    for node in graph.nodes:
        if isinstance(node, tl.InputOp):
            name = "x" if len(input_nodes) == 1 else f"x{node.id}"
            graph_inputs.append(helper.make_tensor_value_info(name, element, shapes[node.id]))
            ex.names[node.id] = name
            continue
        ex.export(node)
    output = graph.output
    assert output is not None, "graph_shapes checked the structure"
    out_id = output.value.owner.id  # type: ignore[union-attr]
    ex.nodes.append(helper.make_node("Identity", [ex.names[out_id]], ["y"], name="output"))
    onnx_graph = helper.make_graph(
        ex.nodes,
        graph.graph_name,
        graph_inputs,
        [helper.make_tensor_value_info("y", element, shapes[out_id])],
        ex.initializers,
    )
    model = helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tlc"
    )
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model, full_check=True)
    return model


__all__ = ["EXPORT", "OPSET", "OnnxEmitter", "to_onnx"]
