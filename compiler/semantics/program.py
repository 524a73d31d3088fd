"""Programs as operation-polymorphic functions (tagless final), and the instances that run them.

A program is written once against the operations interface `Ops`:

    def mlp(ops, x, params):
        h = ops.relu(ops.linear(x, params["W1"], params["b1"]))
        return ops.tanh(ops.sum(ops.linear(h, params["W2"], params["b2"])))

and means what the instance passed as `ops` makes of it (the seed's `TorchLean.Runtime.Program`):
`Eager` computes numpy values in float64 or float32, `Interval` propagates boxes, and
`GraphBuilder` records one `tl` node per call (through a `GraphEmitter`), which is how `trace`
turns the program into a graph plus a payload (the seed's `lowerForwardToIR`).

Every method of the interface reduces to one primitive, `Ops.apply(op class, values, fields,
parameters)`, which builds the op's node, checks its shape with the op's own rule and its
parameters with the payload checks of the reference denotation, and hands the node to the
instance. So the instances share one meaning of every op: `Eager` evaluates the node with the
reference rule (`tlc.semantics.reference.REFERENCE`) and `Interval` with the interval rule of
`tlc.semantics.ibp`; neither has ops of its own. Method signatures follow one convention, which the
textual program form (`tl.program`) relies on too: the op's value operands first (positional),
then its parameters (arrays: weights, biases, gamma, ...), then its metadata, keyword-only.
A parameter-like argument (a numpy array, a number) where a value is expected becomes a `const`.
"""

from __future__ import annotations

import linecache
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location, error
from tlc.core.payload import Payload, source_name
from tlc.dialect import ops as tl
from tlc.dialect.metadata import MetadataError, check_value
from tlc.dialect.ops import GraphOp, NodeOp, OutputOp, PayloadOp
from tlc.dialect.registry import NODE_OPS
from tlc.dialect.shapes import Shape, ShapeError
from tlc.dialect.types import shape_of_type
from tlc.semantics.emitter import (
    GraphEmitter,
    IntervalEmitter,
    NoBox,
    NumpyEmitter,
    fill_defaults,
    make_node,
)

#: Ops that are not methods of the interface, and why. A plain reason map, not a rule table:
#: the interface is a vocabulary (every op kind's method is generated and reduces to `apply`),
#: not an interpretation with a rule per op; what a call means is the instance's table's.
NOT_IN_INTERFACE: dict[type[NodeOp], str] = {
    tl.InputOp: "a program's input is its argument `x`, not the result of a call",
}

#: Op tag -> op class, for every op a program can call.
INTERFACE: dict[str, type[NodeOp]] = {op.TAG: op for op in NODE_OPS if op not in NOT_IN_INTERFACE}


def value_slots(op: type[NodeOp]) -> int | None:
    """How many leading positional arguments of the op's method are values (None: all); an op
    that reads parameters (it has a payload check) takes them after its values."""
    return op.ARITY[1] if op in _payload_checks() else None


@dataclass(frozen=True)
class Param:
    """A named parameter known only by its shape (lowering a textual program binds it by name)."""

    name: str
    shape: Shape


class ProgramError(DiagnosticError):
    """A program failed; `str()` shows each diagnostic with its file:line:col and source line."""

    def __str__(self) -> str:
        out = []
        for d in self.diagnostics:
            loc = d.location
            if loc is None:
                out.append(f"error: {d.message}")
                continue
            out.append(f"{loc}: error: {d.message}")
            line = linecache.getline(loc.file, loc.line).rstrip("\n")
            if line:
                out.append(f"{line}\n{' ' * (loc.col - 1)}^")
        return "\n".join(out)


def _caller_location() -> Location:
    """Where the user's code called the interface: the first frame outside this module."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    positions = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    line = positions[0] or frame.f_lineno
    return Location(frame.f_code.co_filename, line, (positions[2] or 0) + 1)


def _checked_fields(
    op: type[NodeOp], given: Mapping[str, Any], declared: Shape | None, where: Location
) -> dict[str, Any]:
    """The op's metadata (defaults filled as every emitter fills them), each field checked by
    kind: a program's arguments are user input, unlike a rule's."""
    known = {f.name for f in op.FIELDS}
    for name in given:
        if name not in known:
            raise error(f"{op.TAG}: unknown metadata field '{name}'", where)
    filled = fill_defaults(op, {k: v for k, v in given.items() if v is not None}, declared)
    fields: dict[str, Any] = {}
    for f in op.FIELDS:
        if f.name not in filled:
            raise error(f"{op.TAG}: missing metadata field '{f.name}'", where)
        value = filled[f.name]
        try:
            fields[f.name] = check_value(f, list(value) if isinstance(value, tuple) else value)
        except MetadataError as exc:
            raise error(f"{op.TAG}: {exc}", where) from None
    return fields


def _shape_arrays(record: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Arrays standing in for parameters in the payload checks (a Param by a zero view)."""
    return {
        k: np.broadcast_to(np.float64(0), p.shape) if isinstance(p, Param) else np.asarray(p)
        for k, p in record.items()
    }


class Ops(ABC):
    """The operations interface: one method per op of the `tl` dialect (but `input`)."""

    def __init__(self) -> None:
        #: Where the next call comes from; None means "the caller's Python line".
        self.at: Location | None = None
        #: The node id the next call gets (0 is the input), as in the graph `trace` builds.
        self.next_id = 1

    # -- what an instance defines ------------------------------------------------------------

    @abstractmethod
    def lift(self, value: Any) -> Any:
        """A value of this instance from a program value or a parameter-like constant."""

    @abstractmethod
    def shape_of(self, value: Any) -> Shape:
        """The shape of a value of this instance."""

    @abstractmethod
    def evaluate(self, node: NodeOp, args: list[Any], record: dict[str, Any]) -> Any:
        """The instance's value for `node` (shape and parameters already checked)."""

    # -- the one primitive -----------------------------------------------------------------

    def apply(
        self,
        op: type[NodeOp],
        args: Sequence[Any] = (),
        fields: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        shape: Shape | None = None,
    ) -> Any:
        """Apply `op` to value `args` with metadata `fields` and parameters `params`.

        `shape` is the declared output shape, for ops whose shape is not a function of their
        inputs (linear's out dim, a random source's shape).
        """
        where = self.at or _caller_location()
        values = [self.lift(a) for a in args]
        low, high = op.ARITY
        if len(values) < low or (high is not None and len(values) > high):
            count = (
                f"{low}" if low == high else f"{low} or more" if high is None else f"{low}..{high}"
            )
            plural = "" if count == "1" else "s"
            raise error(f"{op.TAG}: takes {count} value{plural}, got {len(values)}", where)
        record = {k: p for k, p in (params or {}).items() if p is not None}
        parents = [self.shape_of(v) for v in values]
        fields = _checked_fields(op, fields or {}, shape, where)
        try:
            node = make_node(op, self.next_id, parents, fields, shape)
        except ShapeError as exc:
            raise error(str(exc), where) from None
        node.location = where.to_attr()
        out = node.declared_shape
        assert out is not None, "make_node declares the node's shape"
        check = _payload_checks().get(op)
        if check is not None:
            check(node, parents, out, _shape_arrays(record) or None)
        self.next_id += 1
        return self.evaluate(node, values, record)

    # -- sources -----------------------------------------------------------------------------

    def const(self, value: Any) -> Any:
        """A constant (its values go to the payload when traced)."""
        shape = _shape(value)
        return self.apply(tl.ConstOp, [], {"shape": shape}, {"value": value}, shape)

    # -- ops whose metadata depends on their arguments ----------------------------------------

    def reshape(self, x: Any, *, to: Sequence[int]) -> Any:
        """Same elements in a new shape; `from` is the shape of `x`."""
        x = self.lift(x)
        return self.apply(tl.ReshapeOp, [x], {"from": self.shape_of(x), "to": to})

    def flatten(self, x: Any) -> Any:
        x = self.lift(x)
        return self.apply(tl.FlattenOp, [x], {"shape": self.shape_of(x)})

    def broadcast_to(self, x: Any, *, to: Sequence[int]) -> Any:
        x = self.lift(x)
        return self.apply(tl.BroadcastToOp, [x], {"from": self.shape_of(x), "to": to})

    def hard_masked_softmax(self, x: Any, *, allowed: Sequence[bool]) -> Any:
        """Softmax over the last axis among allowed entries (`allowed` row-major, x's shape)."""
        x = self.lift(x)
        fields = {"mask_shape": self.shape_of(x), "allowed": [bool(a) for a in allowed]}
        return self.apply(tl.HardMaskedSoftmaxOp, [x], fields)

    # -- ops with parameters -----------------------------------------------------------------

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        """W x + b at every leading index of `x`; `weight` is [out, in] (PyTorch's layout)."""
        x = self.lift(x)
        out = self.shape_of(x)[:-1] + _shape(weight)[:1]
        return self.apply(tl.LinearOp, [x], None, {"weight": weight, "bias": bias}, out)

    def conv(
        self,
        x: Any,
        weight: Any,
        bias: Any = None,
        *,
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        padding_after: Sequence[int] | None = None,
        groups: int = 1,
        channel_axis: int = 0,
    ) -> Any:
        """Grouped N-d convolution; `weight` is [out, in/groups, k...], which fixes the kernel
        and channel counts."""
        wshape = _shape(weight)
        fields = {
            "kernel": wshape[2:],
            "stride": stride,
            "padding": padding,
            "dilation": dilation,
            "padding_after": padding_after,
            "groups": groups,
            "channel_axis": channel_axis,
            "in_channels": wshape[1] * groups if len(wshape) > 1 else 0,
            "out_channels": wshape[0] if wshape else 0,
        }
        return self.apply(tl.ConvOp, [x], fields, {"weight": weight, "bias": bias})

    def batch_norm_eval(
        self,
        x: Any,
        gamma: Any,
        beta: Any,
        mean: Any,
        var: Any,
        eps: Any = None,
        *,
        channel_axis: int = 0,
    ) -> Any:
        """(x - mean) / sqrt(var + eps) * gamma + beta per channel (eps defaults to 1e-5)."""
        params = {"gamma": gamma, "beta": beta, "mean": mean, "var": var, "eps": eps}
        (channels,) = _shape(gamma)[:1] or (0,)
        fields = {"channel_axis": channel_axis, "channels": channels}
        return self.apply(tl.BatchNormEvalOp, [x], fields, params)

    def layernorm(
        self, x: Any, gamma: Any = None, beta: Any = None, eps: Any = None, *, axis: int
    ) -> Any:
        """Normalise over x's axes from `axis` on; optional affine `gamma`, `beta` of that
        suffix shape, `eps` default 1e-5."""
        params = {"gamma": gamma, "beta": beta, "eps": eps}
        return self.apply(tl.LayernormOp, [x], {"axis": axis}, params)


def _shape(p: Any) -> Shape:
    return p.shape if isinstance(p, Param) else tuple(np.shape(p))


def _generic(op: type[NodeOp]) -> Callable[..., Any]:
    """The method of an op without parameters: `ops.softmax(x, axis=1)`, values positionally,
    metadata fields by keyword, `shape=` for ops whose output shape is declared."""

    def method(self: Ops, *args: Any, shape: Sequence[int] | None = None, **fields: Any) -> Any:
        return self.apply(op, args, fields, None, None if shape is None else tuple(shape))

    method.__name__ = method.__qualname__ = op.TAG
    method.__doc__ = op.__doc__
    return method


for _op in INTERFACE.values():
    if not hasattr(Ops, _op.TAG):
        assert not _op.reads_payload(), f"{_op.TAG} reads parameters: it needs an explicit method"
        setattr(Ops, _op.TAG, _generic(_op))


def _payload_checks() -> Mapping[type[NodeOp], Any]:
    from tlc.semantics.payload_check import PAYLOAD_CHECKS

    return PAYLOAD_CHECKS


# --------------------------------------------------------------------------------------------
# Instances
# --------------------------------------------------------------------------------------------


class Eager(Ops):
    """Numpy values in float64 or float32: the `NumpyEmitter` over the reference rules, fed
    the program's checked nodes."""

    def __init__(self, dtype: type = np.float64) -> None:
        from tlc.semantics.interpret import REFERENCE

        super().__init__()
        self.dtype = dtype
        self.emitter = NumpyEmitter(REFERENCE, dtype)

    def lift(self, value: Any) -> np.ndarray:
        return np.asarray(value, dtype=self.dtype)

    def shape_of(self, value: Any) -> Shape:
        return self.emitter.shape(value)

    def evaluate(self, node: NodeOp, args: list[Any], record: dict[str, Any]) -> np.ndarray:
        return self.emitter.evaluate(node, args, record or None)


@dataclass(frozen=True)
class Interval:
    """A value on intervals: its shape, and its box where a sound rule gave one (else None)."""

    shape: Shape
    box: Any  # tlc.semantics.interval_arith.Box | None


class IntervalOps(Ops):
    """Boxes: the `IntervalEmitter` over the interval rules (`tlc.semantics.ibp.INTERVAL`),
    rounded outward for `dtype`. Unlike the emitter, a program goes on where an op has no box
    (its value keeps its shape, box None), so a partial result still reports every later
    diagnostic; a parameter-like argument becomes a point box through a `const`."""

    def __init__(self, dtype: type = np.float64) -> None:
        from tlc.semantics.ibp import INTERVAL
        from tlc.semantics.interval_arith import Outward

        super().__init__()
        self.dtype = dtype
        self.outward = Outward(dtype)
        self.emitter = IntervalEmitter(INTERVAL, self.outward)

    def box(self, lo: Any, hi: Any) -> Interval:
        """The input box [lo, hi], on the `dtype` grid."""
        from tlc.semantics.interval_arith import Box

        box = self.outward.to_grid(Box(np.asarray(lo, np.float64), np.asarray(hi, np.float64)))
        return Interval(box.shape, box)

    def lift(self, value: Any) -> Interval:
        return value if isinstance(value, Interval) else self.const(value)

    def shape_of(self, value: Any) -> Shape:
        return value.shape

    def evaluate(self, node: NodeOp, args: list[Any], record: dict[str, Any]) -> Interval:
        shape = node.declared_shape
        assert shape is not None, "apply declares every node's shape"
        if any(a.box is None for a in args):
            return Interval(shape, None)
        try:
            return Interval(
                shape, self.emitter.evaluate(node, [a.box for a in args], record or None)
            )
        except NoBox:
            return Interval(shape, None)


class GraphBuilder(Ops):
    """Records one node per call: the program's checked node goes to a `GraphEmitter` on the
    graph's block, the one way a node and its payload record join a graph (the grad pass,
    decompositions and codegen use it too). Parameters become payload records, or bindings by
    name (`Param`). The graph's inputs are nodes 0, 1, ... (one per shape in `input_shapes`)."""

    def __init__(self, name: str, input_shapes: Sequence[Shape], at: Location) -> None:
        super().__init__()
        self.name = name
        self.graph = GraphOp(name, [])
        self.payload = Payload()
        self.emitter = GraphEmitter(self.graph.body.block, self.payload)
        #: node id -> (op tag, {payload field: parameter name}) for `Param` arguments.
        self.bound: dict[int, tuple[str, dict[str, str]]] = {}
        #: node id -> {payload field: source name} for values that are a source model's
        #: parameters (`tlc.core.payload.named`), which importers bind by that name.
        self.sources: dict[int, dict[str, str]] = {}
        self.inputs: list[SSAValue] = []
        for shape in input_shapes:
            source = self.emitter.bind(tl.InputOp, [], None, tuple(shape))
            source.location = at.to_attr()
            self.inputs.append(source.result)
        self.next_id = self.emitter.next_id()

    @property
    def input(self) -> SSAValue:
        return self.inputs[0]

    def lift(self, value: Any) -> SSAValue:
        return value if isinstance(value, SSAValue) else self.const(value)

    def shape_of(self, value: Any) -> Shape:
        shape = shape_of_type(value.type)
        assert shape is not None, "every node the builder makes has its shape"
        return shape

    def evaluate(self, node: NodeOp, args: list[Any], record: dict[str, Any]) -> SSAValue:
        assert node.id == self.emitter.next_id(), "apply numbers nodes as the graph does"
        arrays: dict[str, np.ndarray] = {}
        for name, p in record.items():
            if isinstance(p, Param):
                self.bound.setdefault(node.id, (node.TAG, {}))[1][name] = p.name
            else:
                arrays[name] = np.array(p, np.float64)
                if source_name(p) is not None:
                    self.sources.setdefault(node.id, {})[name] = source_name(p)
        parents = [a.owner for a in args]
        return self.emitter.evaluate(node, parents, arrays or None).result

    def finish(self, result: Any, at: Location) -> GraphOp:
        """The graph whose output is `result`, selected `at` the program's return (checked by
        verify-structure and infer-shapes, so its declared shapes are trusted from here on:
        `graph_shapes`)."""
        from tlc.dialect.verify import infer_graph_shapes

        self.at = at
        output = OutputOp(self.lift(result))
        output.location = at.to_attr()
        self.graph.body.block.add_op(output)
        infer_graph_shapes(self.graph)
        return self.graph


# --------------------------------------------------------------------------------------------
# Running Python programs
# --------------------------------------------------------------------------------------------

Program = Callable[[Ops, Any, Any], Any]


@dataclass(frozen=True)
class SourceValue:
    """A node value an importer took from an integer or float16 tensor of the source model."""

    node: int
    #: The source's name of the value, and its numpy element type ("int8", "float16").
    name: str
    kind: str
    #: Where the source allows fewer values than the type holds (Gather's indices): the lowest
    #: and highest, and what they are.
    within: tuple[int, int, str] | None = None


@dataclass
class Traced:
    """What `trace` returns: the module holding the graph, the graph, and its payload.

    `source_types`: the node values an importer took from integer or float16 tensors, in the
    source's order. tl computes them as reals; they are the source's values only while each is
    a number of its type (`check_values`). `per_output`: for a module of one graph per output
    of the source (an ONNX model with several outputs), each output's own `Traced`, in the
    source's order (the first is this one's graph and payload); empty otherwise."""

    module: ModuleOp
    graph: GraphOp
    payload: Payload
    source_types: list[SourceValue] = field(default_factory=list)
    per_output: list[Traced] = field(default_factory=list)

    def check_values(self, values: Sequence[np.ndarray], dtype: type = np.float64) -> None:
        """Check a run's values (`interpret(...).values`, computed in `dtype`) of the nodes of
        `source_types`: each must be a number of its element type, so the source's arithmetic
        (integers that wrap around, float16) computes the same one: an integer within the
        type's range and below 2^53 in magnitude (2^24 in float32), where the float type holds
        every integer and its sums, differences, products and powers are exact; or a float16.
        A `DiagnosticError` names the value."""
        bound = EXACT_INTEGERS if np.dtype(dtype) == np.float64 else 2.0**24
        for s in self.source_types:
            value = np.asarray(values[s.node], np.float64)
            problem = _not_of_type(value, np.dtype(s.kind), bound)
            if problem is not None:
                raise DiagnosticError.simple(
                    f"value '{s.name}' (node {s.node}, {s.kind}) {problem}: tl computes on "
                    f"reals, and this is not what the source's {s.kind} arithmetic gives"
                )
            if s.within is not None:
                low, high, what = s.within
                flat = value.reshape(-1)
                bad = np.flatnonzero((flat < low) | (flat > high))
                if bad.size:
                    at = [int(i) for i in np.unravel_index(bad[0], value.shape)]
                    raise DiagnosticError.simple(
                        f"value '{s.name}' (node {s.node}, {s.kind}) is {flat[bad[0]]:.0f} at "
                        f"{at}, outside [{low}, {high}]: {what}"
                    )

    def document(self) -> ModuleOp:
        """A module holding the graph, its payload as an inline `tl.payload` section and the
        traced module's other sections (an importer's `tl.params` binding of source names): the
        document that `save` writes and that runs as this traced model does."""
        from tlc.dialect.payload_section import payload_op

        others = [
            op.clone()
            for op in self.module.ops
            if op is not self.graph
            and not (isinstance(op, PayloadOp) and op.graph_name == self.graph.graph_name)
        ]
        return ModuleOp(
            [self.graph.clone(), payload_op(self.graph.graph_name, self.payload), *others]
        )

    def save(self, path: Any, payload_path: Any = None) -> None:
        """Write the graph as .tlir to `path` with its payload inline (exact: floats print as
        the shortest text reading back to the same float64), so `tlc.run(path, x)` computes
        what `tlc.run(traced, x)` does; with `payload_path`, the payload goes to that .npz
        instead (`tlc.run(path, x, payload_path)`, `tlc-run --payload`). An unwritable path is
        a `DiagnosticError` naming it."""
        import os

        from tlc.core.payload import save_npz
        from tlc.dialect.printer import print_tlir

        if payload_path is None:
            module = self.document()
        else:
            save_npz(self.payload, os.fspath(payload_path))
            module = ModuleOp([self.graph.clone()])
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(print_tlir(module))
        except OSError as exc:
            raise DiagnosticError.simple(
                f"cannot write '{os.fspath(path)}': {exc.strerror or exc}"
            ) from None


#: Float64 holds every integer of magnitude below this exactly.
EXACT_INTEGERS = 2.0**53


def _not_of_type(value: np.ndarray, kind: np.dtype, bound: float) -> str | None:
    """Why `value` is not a number of element type `kind` (integer or float16; an integer
    below `bound` in magnitude), or None."""
    flat = value.reshape(-1)
    if kind.kind in "iu":
        info = np.iinfo(kind)
        low, high = max(float(info.min), 1 - bound), min(float(info.max), bound - 1)
        checks = (
            (~np.isfinite(flat), "not finite"),
            (np.isfinite(flat) & (flat != np.trunc(flat)), "not an integer"),
            ((flat < low) | (flat > high), f"outside [{low:.0f}, {high:.0f}]"),
        )
    else:
        with np.errstate(over="ignore"):
            rounded = flat.astype(kind).astype(np.float64)
        checks = (((rounded != flat) & ~np.isnan(flat), f"not a {kind}"),)
    for bad, why in checks:
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            where = [int(i) for i in np.unravel_index(at, value.shape)] if value.ndim else []
            return f"is {float(flat[at])!r} at {where}, {why}"
    return None


def trace(
    program: Program, input_shape: Sequence[int], params: Any = None, name: str | None = None
) -> Traced:
    """Run `program(ops, x, params)` with the IR-building instance: a checked graph + payload.

    Parameter arrays become payload records keyed by node id, never graph data. A failure is a
    `ProgramError` located at the program line that made the bad node.
    """
    from tlc.dialect.verify import graph_shapes
    from tlc.semantics.payload_check import check_payload

    code = program.__code__
    at = Location(code.co_filename, code.co_firstlineno, 1)
    try:
        builder = GraphBuilder(name or program.__name__, [tuple(input_shape)], at)
        graph = builder.finish(program(builder, builder.input, params), at)
        check_payload(graph, builder.payload, graph_shapes(graph))
    except DiagnosticError as exc:
        raise ProgramError(*exc.diagnostics) from None
    return Traced(ModuleOp([graph]), graph, builder.payload)


def evaluate(program: Program, x: Any, params: Any = None, dtype: type = np.float64) -> Any:
    """Run `program` eagerly in `dtype` (np.float64 or np.float32); returns its result."""
    ops = Eager(dtype)
    try:
        return program(ops, ops.lift(x), params)
    except DiagnosticError as exc:
        raise ProgramError(*exc.diagnostics) from None


def bounds(
    program: Program, lo: Any, hi: Any, params: Any = None, dtype: type = np.float64
) -> Interval:
    """Run `program` on the input box [lo, hi] with interval rules; the result's box (or None
    where no sound rule applied) encloses its value for every input in the box."""
    ops = IntervalOps(dtype)
    try:
        return program(ops, ops.box(lo, hi), params)
    except DiagnosticError as exc:
        raise ProgramError(*exc.diagnostics) from None
