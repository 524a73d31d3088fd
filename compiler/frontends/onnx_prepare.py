"""Before the ONNX importer maps nodes: make a model of any opset look like the one it maps.

Real ONNX files are old (opset 7-9 for the public model collections), carry their batch as a
symbol, and compute shapes at run time (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`
chains, weights made by `ConstantOfShape`, `Cast`s of constants). `prepare` turns such a model
into one whose nodes the importer's rule table can map one by one, in this order:

1. `onnx.checker`: a malformed model is a diagnostic naming the file and what is wrong (never a
   traceback from deeper down);
2. `onnx.version_converter` up to the importer's oldest opset where the model is older (the
   message says what was tried when the converter gives up);
3. the graph inputs' shapes are fixed where the caller gives them (`--input-shape`,
   `input_shapes=`), then `onnx.shape_inference` (with data propagation) gives every value
   the static shape it has;
4. constant folding: `Identity` and inference-mode `Dropout` vanish, `Shape` of a value whose
   shape is known becomes a constant, and every node whose inputs are all constants is
   evaluated by ONNX's reference evaluator (`onnx.reference`, the operators' own definition)
   and becomes an initializer. Steps 3-4 repeat while folding reveals more shapes, so shape
   arithmetic never reaches tl.

`unsupported_report` is the other half of the import's entry path: it lists every op type and
attribute of a prepared model that the importer's table lacks, all at once, with counts and
node names, so a user learns a model's whole gap in one run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from math import prod
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tlc.core.diagnostics import Diagnostic
from tlc.dialect.shapes import Shape
from tlc.frontends.import_common import ImportFailure, import_error

PREFIX = "ONNX import"
#: Ops never folded although their inputs may be constant: their value is not a function of
#: their inputs (random), or they hold subgraphs.
NOT_FOLDED = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
     "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}
)  # fmt: skip
#: Initializers larger than this are held aside as arrays while the model is prepared.
HELD_ELEMENTS = 4096
HELD_LOCATION = "tlc-held-aside"
#: The longest message from the checker or the converter a diagnostic quotes.
MESSAGE_CHARS = 300
#: How many node names a line of the unsupported-op report shows.
NAMES_SHOWN = 5


def prepare(
    model: onnx.ModelProto,
    where: str,
    min_opset: int,
    input_shapes: Sequence[Shape] | None = None,
) -> Prepared:
    """`model` checked, converted to at least `min_opset`, with the given input shapes, shapes
    inferred and constant subgraphs folded (see the module docstring). `where` names the model
    in diagnostics; the caller's model is never modified.

    The checker, the converter and shape inference each serialise the whole model, so large
    initializers (weights) are held aside as arrays (`Held`) and stay there: the importer reads
    them as arrays."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    held = Held(copy)
    check(held.skeleton(copy), where)
    model = convert(copy, where, min_opset)
    if input_shapes is not None:
        fix_input_shapes(model, input_shapes)
    # Fold, re-infer shapes, fold again up to the fixed point: a round that changes anything
    # removes a node, so this ends. Each round may reveal only the next block's shapes (swin's
    # per-block padding arithmetic is revealed a block at a time: swin_t needs over 8 rounds).
    model = infer(model)
    while fold(model, held):
        model = infer(model)
    return Prepared(model, held)


@dataclass(frozen=True)
class Prepared:
    """A prepared model whose large initializers are stubs, with their values in `held`."""

    model: onnx.ModelProto
    held: Held

    def initializers(self) -> dict[str, np.ndarray]:
        return {t.name: self.held.value(t) for t in self.model.graph.initializer}


class Held:
    """Initializers of more than `HELD_ELEMENTS` elements, as arrays by name, while their
    TensorProtos in the model are stubs (dims and type, data marked external) that the
    converter and shape inference carry along without copying the data."""

    def __init__(self, model: onnx.ModelProto):
        self.arrays: dict[str, np.ndarray] = {}
        for tensor in model.graph.initializer:
            if prod(tensor.dims) > HELD_ELEMENTS:
                self.arrays[tensor.name] = numpy_helper.to_array(tensor)
                self.stub(tensor)

    @staticmethod
    def stub(tensor: onnx.TensorProto) -> None:
        for data in ("raw_data", "float_data", "double_data", "int32_data", "int64_data"):
            tensor.ClearField(data)
        del tensor.external_data[:]
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", HELD_LOCATION
        tensor.data_location = onnx.TensorProto.EXTERNAL

    def tensor(self, name: str, value: np.ndarray) -> onnx.TensorProto:
        """An initializer for a (folded) value: a stub where the value is large."""
        if value.size <= HELD_ELEMENTS:
            return numpy_helper.from_array(value, name)
        self.arrays[name] = value
        tensor = onnx.TensorProto(
            name=name, dims=value.shape, data_type=helper.np_dtype_to_tensor_dtype(value.dtype)
        )
        self.stub(tensor)
        return tensor

    def value(self, tensor: onnx.TensorProto) -> np.ndarray:
        held = self.arrays.get(tensor.name)
        return numpy_helper.to_array(tensor) if held is None else held

    def skeleton(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """What the checker sees: the model with held initializers as graph inputs."""
        skeleton = onnx.ModelProto()
        skeleton.CopyFrom(model)
        graph = skeleton.graph
        listed = {i.name for i in graph.input}
        stubs = [t for t in graph.initializer if t.name in self.arrays]
        kept = [t for t in graph.initializer if t.name not in self.arrays]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                           for t in stubs if t.name not in listed)  # fmt: skip
        return skeleton


def check(model: onnx.ModelProto, where: str) -> None:
    """Raise the checker's first complaint as a diagnostic (the model is ours to change).
    Graph inputs and outputs without a shape field (unknown rank, which exporters and ONNX
    Runtime accept although the IR spec asks for one) are not complained about: the checker
    sees them with an empty shape."""
    check_strings(model, where)
    for info in [*model.graph.input, *model.graph.output]:
        if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape"):
            info.type.tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        message = f"'{where}' is not a valid ONNX model: {_one_line(exc)}"
        raise import_error(PREFIX, message) from None
    except UnicodeDecodeError as exc:  # protobuf strings (names, attributes) must be UTF-8
        message = f"'{where}' is not a valid ONNX model: a string is not UTF-8 ({exc.reason})"
        raise import_error(PREFIX, message) from None


def check_strings(model: onnx.ModelProto, where: str) -> None:
    """Every string of the model is UTF-8, as protobuf requires (else a diagnostic)."""
    bad = _non_utf8_string(model)
    if bad is not None:
        message = f"'{where}' is not a valid ONNX model: a string is not UTF-8 ({bad.reason})"
        raise import_error(PREFIX, message)


def _non_utf8_string(message: Any) -> UnicodeDecodeError | None:
    """The decoding error of the first string field of `message` (recursively) that is not
    UTF-8. Protobuf hands such a field over as bytes rather than failing, and the checker does
    not look at every string (a graph name of bytes reached `re.sub`, found by tlc.tools.fuzz)."""
    for fd in _text_fields(message.DESCRIPTOR):
        repeated = fd.is_repeated
        if not (repeated or message.HasField(fd.name)):
            continue
        value = getattr(message, fd.name)
        for item in value if repeated else [value]:
            if fd.type == fd.TYPE_MESSAGE:
                found = _non_utf8_string(item)
                if found is not None:
                    return found
            elif isinstance(item, bytes):
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return exc
                return UnicodeDecodeError("utf-8", item, 0, 1, "not decoded by protobuf")
    return None


@cache
def _text_fields(descriptor: Any) -> tuple[Any, ...]:
    """The string and message fields of a message type: what `_non_utf8_string` reads, never
    touching a bytes field such as a tensor's raw_data (reading which copies the weights)."""
    return tuple(fd for fd in descriptor.fields if fd.type in (fd.TYPE_STRING, fd.TYPE_MESSAGE))


def opset_of(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise import_error(PREFIX, "the model imports no ai.onnx opset")
    return versions[0]


def convert(model: onnx.ModelProto, where: str, min_opset: int) -> onnx.ModelProto:
    """The model at opset `min_opset` if it is older (a converted copy), else the model."""
    opset = opset_of(model)
    if opset >= min_opset:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, min_opset)
    except Exception as exc:  # the converter raises RuntimeError, ValueError, IndexError, ...
        raise import_error(
            PREFIX,
            f"'{where}' is opset {opset}; the importer maps opset {min_opset} and later, and "
            f"onnx.version_converter could not convert it to opset {min_opset}: "
            f"{_one_line(exc)}",
        ) from None
    if opset < 11:
        _keep_asymmetric_resize(converted, where)
    return converted


def _keep_asymmetric_resize(model: onnx.ModelProto, where: str) -> None:
    """Upsample (opsets 7-9) and Resize-10 map input coordinates as `x / scale` and round
    nearest neighbours down when upsampling (up when downsampling: ONNX Runtime's "simple"
    rounding); the converter's Resize-11+ nodes leave out coordinate_transformation_mode, whose
    default (half_pixel) computes other values. So every converted Resize gets the old rule
    stated (`asymmetric`, and `floor` or `ceil`)."""
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    for node in model.graph.node:
        if node.op_type != "Resize" or any(
            a.name == "coordinate_transformation_mode" for a in node.attribute
        ):
            continue
        node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "nearest")
        scales = constants.get(node.input[2]) if len(node.input) > 2 else None
        given = np.ones(1) if scales is None else numpy_helper.to_array(scales)
        if mode != "nearest":
            continue
        if np.any(given < 1) and np.any(given > 1):
            raise import_error(
                PREFIX,
                f"'{where}': Resize-10 node '{node.name or node.output[0]}': nearest resizing "
                "that both up- and downsamples (its rounding differs per axis)",
            )
        rounding = "ceil" if np.any(given < 1) else "floor"
        node.attribute.append(helper.make_attribute("nearest_mode", rounding))


def fix_input_shapes(model: onnx.ModelProto, shapes: Sequence[Shape]) -> None:
    """Give the graph inputs (those that are not initializers) the caller's static shapes, so
    shape inference propagates them (a symbolic batch becomes the given extent). A count that
    does not match is left for the importer to report."""
    inputs = graph_inputs(model)
    if len(inputs) != len(shapes):
        return
    for info, shape in zip(inputs, shapes, strict=True):
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            continue
        del tensor.shape.dim[:]
        for extent in shape:
            tensor.shape.dim.add().dim_value = int(extent)


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds (before IR version 4, initializers are listed as inputs too)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with ONNX's inferred shapes recorded; the model itself where inference fails
    (the importer then checks shapes with its own rules)."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference failing on an exotic node must not stop an import
        return model


def fold(model: onnx.ModelProto, held: Held) -> bool:
    """Fold the model's constant subgraphs in place (see the module docstring); whether
    anything changed."""
    graph = model.graph
    constants = {t.name: held.value(t) for t in graph.initializer}
    fed = {i.name for i in graph_inputs(model)}
    shapes = _static_shapes(model)
    outputs = {o.name for o in graph.output}
    opset = opset_of(model)
    read = {name for node in graph.node for name in node.input} | outputs
    alias: dict[str, str] = {}
    kept: list[onnx.NodeProto] = []
    changed = False
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = alias.get(name, name)
        source = _pass_through(node, constants, read)
        if source is not None and node.output[0] not in outputs:
            alias[node.output[0]] = source
            changed = True
            continue
        values = _evaluate(node, constants, shapes, opset)
        if values is None:
            kept.append(node)
            continue
        constants.update(zip(node.output, values, strict=False))
        changed = True
    if not changed:
        return False
    used = {name for node in kept for name in node.input} | outputs
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(
        held.tensor(name, np.asarray(value)) for name, value in constants.items() if name in used
    )
    # Inputs that were initializers (IR < 4) and are no longer read go with them.
    kept_inputs = [i for i in graph.input if i.name in fed or i.name in used]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    del graph.value_info[:]
    return True


def _pass_through(
    node: onnx.NodeProto, constants: Mapping[str, np.ndarray], read: set[str]
) -> str | None:
    """The input an Identity or inference-mode Dropout (whose mask nothing reads) passes on
    unchanged, if the node is one."""
    if node.domain not in ("", "ai.onnx") or not node.input or not node.input[0]:
        return None
    if node.op_type == "Identity":
        return node.input[0]
    if node.op_type != "Dropout" or any(o in read for o in node.output[1:]):
        return None
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if training is not None and (training not in constants or bool(constants[training])):
        return None
    return node.input[0]


def _evaluate(
    node: onnx.NodeProto,
    constants: Mapping[str, np.ndarray],
    shapes: Mapping[str, Shape],
    opset: int,
) -> list[np.ndarray] | None:
    """The node's output values if they are constants, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in NOT_FOLDED:
        return None
    if node.op_type == "Shape":
        shape = _shape_of(node.input[0], constants, shapes)
        if shape is None:
            return None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return [np.asarray(shape[start:end], dtype=np.int64)]
    if node.op_type == "Size":
        shape = _shape_of(node.input[0], constants, shapes)
        return None if shape is None else [np.asarray(int(np.prod(shape)), dtype=np.int64)]
    if not all(name in constants for name in node.input if name):
        return None
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    feeds = {name: constants[name] for name in node.input if name}
    try:
        values = evaluator.run(None, feeds)
    except Exception:  # an op the reference lacks or rejects: leave it for the importer
        return None
    return [np.asarray(v) for v in values]


def _shape_of(
    name: str, constants: Mapping[str, np.ndarray], shapes: Mapping[str, Shape]
) -> Shape | None:
    if name in constants:
        return tuple(constants[name].shape)
    return shapes.get(name)


def _static_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    """Every value whose shape is fully static, by name (inputs, inferred values, outputs)."""
    shapes = {}
    graph = model.graph
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        if all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


class UnsupportedNodes(ImportFailure):
    """Every op type and attribute of a model the importer has no rule for, at once: `gaps`
    maps what is missing (`"LRN"`, `"MaxPool attribute 'foo'"`) to the nodes that use it."""

    def __init__(self, where: str, gaps: Mapping[str, list[str]]):
        ops = sum(" attribute '" not in gap for gap in gaps)
        what = [f"{n} unsupported {kind}{'s' if n > 1 else ''}"
                for n, kind in ((ops, "op type"), (len(gaps) - ops, "attribute")) if n]  # fmt: skip
        lines = [f"{PREFIX}: '{where}' uses {' and '.join(what)}:"]
        lines += [f"  {gap}: {_nodes(names)}" for gap, names in gaps.items()]
        super().__init__(Diagnostic("error", "\n".join(lines)))
        self.gaps = dict(gaps)


def unsupported_report(
    model: onnx.ModelProto, accepted: Mapping[str, frozenset[str]], where: str
) -> UnsupportedNodes | None:
    """The diagnostic listing every op type (with its domain where not ONNX's) and attribute
    of the model that `accepted` (op type -> the attributes its rule understands) lacks, op
    types first; None when every node has a rule."""
    ops: dict[str, list[str]] = defaultdict(list)
    attributes: dict[str, list[str]] = defaultdict(list)
    for index, node in enumerate(model.graph.node):
        name = node.name or f"#{index}"
        if node.domain not in ("", "ai.onnx"):
            ops[f"{node.domain}.{node.op_type}"].append(name)
        elif node.op_type not in accepted:
            ops[node.op_type].append(name)
        else:
            for attribute in node.attribute:
                if attribute.name not in accepted[node.op_type]:
                    attributes[f"{node.op_type} attribute '{attribute.name}'"].append(name)
    if not ops and not attributes:
        return None
    return UnsupportedNodes(where, dict(sorted(ops.items())) | dict(sorted(attributes.items())))


def _nodes(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" if not n.startswith("#") else n for n in names[:NAMES_SHOWN])
    more = f", ... ({len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
    return f"{len(names)} node{'s' if len(names) > 1 else ''} ({shown}{more})"


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (the checker's span several), at most `MESSAGE_CHARS`."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


__all__ = ["Prepared", "UnsupportedNodes", "opset_of", "prepare", "unsupported_report"]
