"""What the PyTorch and ONNX importers share: a graph builder with several inputs, and the
PyTorch/NumPy conventions tl spells out explicitly (broadcasting, multi-axis reductions,
matmul on vectors and batches).

Both importers build through `tlc.semantics.program.GraphBuilder` (the program interface over a
`GraphEmitter`), so every node they make is checked by its op's own shape rule and every payload
record by the reference denotation's payload check as it is made; an importer never assembles
nodes by hand. tl has no implicit broadcasting: where the source framework broadcasts, an
explicit `broadcast_to` node appears.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from tlc.core.diagnostics import DiagnosticError, Location
from tlc.dialect import ops as tl
from tlc.dialect.program_ops import BindOp, ParamsOp
from tlc.dialect.shapes import Shape, fmt_shape, numel
from tlc.semantics.program import GraphBuilder, Traced


class ImportFailure(DiagnosticError):
    """A model tlc cannot import faithfully (unsupported op, attribute, dtype, ...)."""


def import_error(prefix: str, message: str) -> ImportFailure:
    return ImportFailure(*DiagnosticError.simple(f"{prefix}: {message}").diagnostics)


def new_builder(
    name: str, input_shapes: Sequence[Shape], at: Location
) -> tuple[GraphBuilder, list[SSAValue]]:
    """A builder whose first nodes are one input node per shape (ids 0, 1, ...), none for a
    graph without inputs (a constant)."""
    builder = GraphBuilder(name, input_shapes, at)
    builder.at = at
    return builder, list(builder.inputs)


def finish(builder: GraphBuilder, result: SSAValue) -> Traced:
    from xdsl.dialects.builtin import ModuleOp

    from tlc.dialect.verify import graph_shapes
    from tlc.semantics.payload_check import check_payload

    assert builder.at is not None, "new_builder sets the location"
    graph = builder.finish(result, builder.at)
    check_payload(graph, builder.payload, graph_shapes(graph))
    binding = source_binding(builder)
    return Traced(ModuleOp([graph, *binding]), graph, builder.payload)


def source_binding(builder: GraphBuilder) -> list[ParamsOp]:
    """The `tl.params` binding of the payload fields that are source parameters, by their
    source names (`%fc1.weight`), so `tlc-run --params` takes the source model's own parameter
    file; none where no field is one."""
    declared: dict[str, Shape] = {}
    binds = []
    for node_id, fields in sorted(builder.sources.items()):
        record = builder.payload.records[node_id]
        for field, name in fields.items():
            declared.setdefault(name, record[field].shape)
        binds.append(BindOp(node_id, builder.payload.kinds[node_id], fields))
    return [ParamsOp(builder.name, list(declared.items()), binds)] if binds else []


def generalise_batch(make: Callable[[int], Traced], refuse: Callable[[str], Exception]) -> Traced:
    """The model `make(batch)` imports, with its batch extent `N` (tlc.dialect.batch): imported
    at both `PROBES`, the two graphs must be the same nodes with the same metadata (shape fields
    aside, which are joined like shapes) and payload, every extent equal at both or the batch
    size at both. What the importer folded from the batch size (a constant 2, a slice of 2 rows)
    differs between the two and is refused: `refuse(reason)` is the importer's own exception
    saying why."""
    from tlc.dialect.batch import PROBES, join, join_metadata
    from tlc.dialect.verify import infer_graph_shapes

    first, second = (make(probe) for probe in PROBES)
    p, q = PROBES
    one, two = first.graph.nodes, second.graph.nodes
    if len(one) != len(two):
        raise refuse(f"it imports as {len(one)} nodes at batch size {p} but as {len(two)} at {q}")
    try:
        for a, b in zip(one, two, strict=True):
            if a.TAG != b.TAG or a.parent_ids() != b.parent_ids() or not join_metadata(a, b):
                raise refuse(
                    f"node {a.id} is {a.describe()} at batch size {p} but {b.describe()} at {q}"
                )
            shapes = (a.declared_shape, b.declared_shape)
            assert shapes[0] is not None and shapes[1] is not None, "importers declare shapes"
            a.set_declared_shape(join(a, *shapes))
        for nid, record in first.payload.items():
            other = second.payload.get(nid, {})
            for field, value in record.items():
                if field not in other or not np.array_equal(value, other[field]):
                    raise refuse(
                        f"the payload of node {nid} ({one[nid].TAG}) {field} differs at batch "
                        f"size {p} and at {q}"
                    )
        infer_graph_shapes(first.graph)
    except ImportFailure:
        raise
    except DiagnosticError as exc:
        raise refuse(exc.diagnostics[0].message) from None
    return first


def ints(values: Any) -> list[int]:
    """Python ints (metadata fields reject numpy integers)."""
    return [int(v) for v in values]


def norm_axis(axis: int, rank: int) -> int:
    return int(axis) + rank if int(axis) < 0 else int(axis)


def lift(builder: GraphBuilder, value: Any) -> SSAValue:
    """A graph value: tensors pass through, arrays and numbers become `const` nodes."""
    if isinstance(value, SSAValue):
        return value
    return builder.const(np.asarray(value, dtype=np.float64))


def broadcast_to(builder: GraphBuilder, value: Any, target: Shape) -> SSAValue:
    value = lift(builder, value)
    if builder.shape_of(value) == tuple(target):
        return value
    return builder.broadcast_to(value, to=ints(target))


def broadcast_all(builder: GraphBuilder, values: Sequence[Any]) -> list[SSAValue]:
    """NumPy/PyTorch/ONNX multidirectional broadcasting, as explicit `broadcast_to` nodes."""
    lifted = [lift(builder, v) for v in values]
    shapes = [builder.shape_of(v) for v in lifted]
    try:
        target = np.broadcast_shapes(*shapes)
    except ValueError:
        raise DiagnosticError.simple(
            f"shapes {', '.join(fmt_shape(s) for s in shapes)} do not broadcast together"
        ) from None
    return [broadcast_to(builder, v, target) for v in lifted]


def elementwise(builder: GraphBuilder, op: type[tl.NodeOp], values: Sequence[Any]) -> SSAValue:
    """A binary op folded left over `values` (ONNX Max/Min are variadic), broadcasting first."""
    parts = broadcast_all(builder, values)
    result = parts[0]
    for part in parts[1:]:
        result = builder.apply(op, [result, part])
    return result


def reshape(builder: GraphBuilder, value: SSAValue, target: Sequence[int]) -> SSAValue:
    source = builder.shape_of(value)
    target = tuple(ints(target))
    if source == target:
        return value
    if len(target) == 1 and len(source) != 1:
        return builder.flatten(value)
    return builder.reshape(value, to=list(target))


def pad(
    builder: GraphBuilder,
    value: SSAValue,
    first: int,
    lo: Sequence[int],
    hi: Sequence[int],
    fill: float,
) -> SSAValue:
    """Pad axes first, first+1, ... with `fill`: `const` blocks concatenated on each side."""
    for i, (before, after) in enumerate(zip(lo, hi, strict=True)):
        axis = first + i

        def block(extent: int, axis: int = axis, like: SSAValue = value) -> SSAValue:
            shape = list(builder.shape_of(like))
            shape[axis] = extent
            return builder.const(np.full(shape, fill))

        parts = ([block(before)] if before else []) + [value] + ([block(after)] if after else [])
        if len(parts) > 1:
            value = builder.concat(*parts, axis=axis)
    return value


def pad_or_crop(
    builder: GraphBuilder,
    value: SSAValue,
    before: Sequence[int],
    after: Sequence[int],
    mode: str,
    fill: float,
) -> SSAValue:
    """ONNX's Pad and F.pad, one width per axis on each side. Negative widths crop, first, as
    ONNX Runtime and torch do (the other sides are then padded from the cropped tensor);
    `wrap` repeats each axis circularly (numpy's `pad(mode="wrap")`, torch's "circular"): a
    `gather` of the indices (i - before) mod n; the other modes are the `pad` op kind. Reflect
    with a negative width is refused by the callers: torch pads before cropping there."""
    shape = builder.shape_of(value)
    for axis, (lo, hi) in enumerate(zip(before, after, strict=True)):
        cut_lo, cut_hi = max(-lo, 0), max(-hi, 0)
        if cut_lo or cut_hi:
            n = shape[axis]
            if cut_lo + cut_hi > n:
                raise DiagnosticError.simple(
                    f"pads crop {cut_lo + cut_hi} elements from axis {axis} of extent {n}"
                )
            value = take(builder, value, axis, range(cut_lo, n - cut_hi))
    before, after = [max(w, 0) for w in before], [max(w, 0) for w in after]
    if not any(before) and not any(after):
        return value
    if mode != "wrap":
        fields = {"before": before, "after": after, "mode": mode, "value": fill}
        return builder.apply(tl.PadOp, [value], fields)
    for axis, (lo, hi) in enumerate(zip(before, after, strict=True)):
        n = builder.shape_of(value)[axis]
        if lo or hi:
            if n == 0:
                raise DiagnosticError.simple(f"mode='wrap' pads axis {axis} of extent 0")
            value = take(builder, value, axis, np.arange(-lo, n + hi) % n)
    return value


def channel_norm(
    builder: GraphBuilder,
    value: SSAValue,
    groups: int,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    eps: float,
) -> SSAValue:
    """Group normalisation of [N, C, ...] (instance norm: `groups` = C): each group of C / groups
    channels of one sample is normalised over its channels and spatial extent (biased variance),
    then `scale` and `bias` per channel. Exactly `layernorm` over the last axis of
    [N, groups, C / groups · prod(spatial)], reshaped back, times scale plus bias."""
    shape = builder.shape_of(value)
    n, c = shape[0], shape[1]
    rows = reshape(builder, value, (n, groups, numel(shape[1:]) // groups))
    normed = reshape(builder, builder.layernorm(rows, None, None, eps, axis=2), shape)
    per_channel = (c,) + (1,) * (len(shape) - 2)
    if scale is not None:
        normed = elementwise(builder, tl.MulElemOp, [normed, np.reshape(scale, per_channel)])
    if bias is not None:
        normed = elementwise(builder, tl.AddOp, [normed, np.reshape(bias, per_channel)])
    return normed


def conv_transpose(
    builder: GraphBuilder,
    value: SSAValue,
    weight: np.ndarray,
    bias: np.ndarray | None,
    *,
    stride: Sequence[int],
    lo: Sequence[int],
    hi: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> SSAValue:
    """A transposed convolution of [N, C_in, ...] with `weight` [C_in, C_out / groups, k...]
    (ONNX's and PyTorch's layout); `lo`/`hi` are the output's padding before and after each
    spatial axis (hi already net of the output padding; negative ones extend the output, its
    extra elements the bias alone, as ONNX's output_shape may). The convolution it
    transposes, written as one: s - 1 zeros inserted after every input element along each
    strided axis (a reshape to [..., n, 1, ...], a concat with zeros, a reshape to
    [..., n s, ...]), then a stride-1 convolution dilated as
    the original, padded d (k-1) - lo before and d (k-1) - hi - (s-1) after (the trailing
    zeros of the last element already count; a negative padding, where the output is cropped
    by more than the kernel's span, crops the convolution's input instead, a gather), with each
    group's kernel transposed to [C_out / groups, C_in / groups] and flipped along every
    spatial axis. Exact: every inserted zero adds 0 · w to a sum of the same products the
    transposed convolution adds."""
    shape = builder.shape_of(value)
    rank = len(shape) - 2
    kernel = weight.shape[2:]
    c_in, c_out_g = weight.shape[0], weight.shape[1]
    for i, s in enumerate(stride):
        if s == 1:
            continue
        axis = 2 + i
        cur = list(builder.shape_of(value))
        opened = reshape(builder, value, cur[: axis + 1] + [1] + cur[axis + 1 :])
        zeros = builder.const(np.zeros(cur[: axis + 1] + [s - 1] + cur[axis + 1 :]))
        joined = builder.concat(opened, zeros, axis=axis + 1)
        value = reshape(builder, joined, cur[:axis] + [cur[axis] * s] + cur[axis + 1 :])
    span = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    before = [sp - p for sp, p in zip(span, lo, strict=True)]
    after = [sp - p - (s - 1) for sp, p, s in zip(span, hi, stride, strict=True)]
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if b < 0 or a < 0:
            n = builder.shape_of(value)[2 + i]
            value = take(builder, value, 2 + i, np.arange(max(0, -b), n - max(0, -a)))
    before, after = [max(0, b) for b in before], [max(0, a) for a in after]
    grouped = weight.reshape(groups, c_in // groups, c_out_g, *kernel).swapaxes(1, 2)
    flipped = np.flip(grouped.reshape(groups * c_out_g, c_in // groups, *kernel),
                      axis=tuple(range(2, 2 + rank)))  # fmt: skip
    return builder.conv(
        value, np.ascontiguousarray(flipped), bias, stride=[1] * rank, padding=before,
        padding_after=after, dilation=list(dilation), groups=groups, channel_axis=1,
    )  # fmt: skip


def dilated_max_pool(
    builder: GraphBuilder,
    x: SSAValue,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    lo: Sequence[int],
    hi: Sequence[int],
) -> SSAValue:
    """A max pool of the trailing axes dilated by d, its padding (-inf) first. Where d divides
    the stride s, every window's taps i s + j d are multiples of d, so the pool is a pool
    {kernel = 1, stride = d} (which keeps every d-th element) followed by a pool {kernel = k,
    stride = s / d}. Otherwise each axis alone (a max over a box is the max over each axis in
    turn): the j-th tap of every window, i s + j d, gathered for j < k and combined by
    `max_elem`. Exact: each output is the max of the same elements."""
    rank = len(kernel)
    first = len(builder.shape_of(x)) - rank
    x = pad(builder, x, first, lo, hi, -np.inf)
    if any(s % d for s, d in zip(stride, dilation, strict=True)):
        for axis, k, s, d in zip(range(first, first + rank), kernel, stride, dilation, strict=True):
            out = (builder.shape_of(x)[axis] - (k - 1) * d - 1) // s + 1
            starts = np.arange(out) * s
            taps = [take(builder, x, axis, starts + j * d) for j in range(k)]
            x = functools.reduce(lambda a, b: builder.apply(tl.MaxElemOp, [a, b]), taps)
        return x
    ones, zeros = [1] * rank, [0] * rank
    every = builder.apply(tl.MaxPoolOp, [x], {"kernel": ones, "stride": list(dilation),
                                              "padding": zeros})  # fmt: skip
    steps = [s // d for s, d in zip(stride, dilation, strict=True)]
    return builder.apply(
        tl.MaxPoolOp, [every], {"kernel": list(kernel), "stride": steps, "padding": zeros}
    )


def window_counts(n: int, lo: int, hi: int, k: int, s: int, d: int) -> np.ndarray:
    """How many input elements (not padding) each window along one axis covers."""
    starts = np.arange((n + lo + hi - (k - 1) * d - 1) // s + 1) * s - lo
    taps = starts[:, None] + np.arange(k) * d
    return ((taps >= 0) & (taps < n)).sum(axis=1)


def ceil_mode_extra(n: int, lo: int, hi: int, k: int, s: int) -> int:
    """Padding after an axis that makes tl's rounding down give the extent of ceil_mode in
    PyTorch and ONNX, whose last window must start inside the input or the padding before it."""
    total = n + lo + hi
    out = -(-(total - k) // s) + 1
    if (out - 1) * s >= n + lo:
        out -= 1
    return max(0, (out - 1) * s + k - total)


def reduce(
    builder: GraphBuilder,
    op: type[tl.ReductionOp],
    value: SSAValue,
    axes: Sequence[int] | None,
    keepdims: bool,
) -> SSAValue:
    """Reduce over several axes (all of them for None) by one node per axis, last axis first;
    `keepdims` reshapes the reduced axes back to extent 1. Summing every axis is `sum`."""
    shape = builder.shape_of(value)
    rank = len(shape)
    chosen = sorted({norm_axis(a, rank) for a in (range(rank) if axes is None else axes)})
    kept = [1 if i in chosen else d for i, d in enumerate(shape)]
    if not chosen:
        return value
    if op is tl.ReduceSumOp and len(chosen) == rank and not keepdims:
        return builder.sum(value)
    for axis in reversed(chosen):
        value = builder.apply(op, [value], {"axis": axis})
    return reshape(builder, value, kept) if keepdims else value


def matmul(builder: GraphBuilder, a: Any, b: Any) -> SSAValue:
    """NumPy's matmul: vectors are promoted to matrices and back, batch dims broadcast."""
    a, b = lift(builder, a), lift(builder, b)
    sa, sb = builder.shape_of(a), builder.shape_of(b)
    if len(sa) == 1:
        a = reshape(builder, a, (1, sa[0]))
    if len(sb) == 1:
        b = reshape(builder, b, (sb[0], 1))
    ra, rb = builder.shape_of(a), builder.shape_of(b)
    batch = tuple(np.broadcast_shapes(ra[:-2], rb[:-2]))
    a = broadcast_to(builder, a, batch + ra[-2:])
    b = broadcast_to(builder, b, batch + rb[-2:])
    result = builder.matmul(a, b)
    out = batch + ((ra[-2],) if len(sa) > 1 else ()) + ((rb[-1],) if len(sb) > 1 else ())
    return reshape(builder, result, out)


def take(builder: GraphBuilder, value: SSAValue, axis: int, indices: Any) -> SSAValue:
    """NumPy's `take(value, indices, axis)` for constant integer indices of any shape (negative
    ones count from the end): one `gather` of the flattened indices (none where they select
    the whole axis in order), then a reshape putting the indices' shape in place of the axis."""
    shape = builder.shape_of(value)
    index = np.asarray(indices, dtype=np.int64)
    n = shape[axis]
    bad = index[(index < -n) | (index >= n)]
    if bad.size:
        raise DiagnosticError.simple(
            f"index {int(bad[0])} out of range for axis {axis} of shape {fmt_shape(shape)}"
        )
    flat = ints(np.where(index < 0, index + n, index).reshape(-1))
    if flat != list(range(n)):
        value = builder.gather(value, axis=axis, indices=flat)
    return reshape(builder, value, (*shape[:axis], *index.shape, *shape[axis + 1 :]))


def tile(builder: GraphBuilder, value: SSAValue, repeats: Sequence[int]) -> SSAValue:
    """NumPy's `tile` (ONNX Tile, PyTorch's `repeat` and `tile`; more repeats than axes add
    leading axes, fewer repeat the trailing axes): a reshape to [.., 1, d, ..], a broadcast to
    [.., r, d, ..], a reshape to [.., r d, ..], so the copies follow each other."""
    shape = builder.shape_of(value)
    repeats = (1,) * (len(shape) - len(repeats)) + tuple(repeats)
    shape = (1,) * (len(repeats) - len(shape)) + tuple(shape)
    if all(r == 1 for r in repeats):
        return reshape(builder, value, shape)
    split = [d for pair in ((1, n) for n in shape) for d in pair]
    spread = [d for pair in zip(repeats, shape, strict=True) for d in pair]
    value = broadcast_to(builder, reshape(builder, value, split), spread)
    return reshape(builder, value, [r * n for r, n in zip(repeats, shape, strict=True)])


def along(builder: GraphBuilder, weights: np.ndarray, axis: int, like: SSAValue) -> SSAValue:
    """A constant holding `weights[i]` at every position whose index on `axis` is i."""
    shape = builder.shape_of(like)
    column = np.asarray(weights, dtype=np.float64).reshape((-1,) + (1,) * (len(shape) - axis - 1))
    return broadcast_to(builder, column, shape)


def interpolate(
    builder: GraphBuilder, value: SSAValue, axis: int, position: np.ndarray
) -> SSAValue:
    """Linear interpolation along `axis` at the source coordinates `position` (one per output
    index), edge values beyond the ends: x[i0] (1 - t) + x[i0 + 1] t with i0 = floor(position)
    and t = position - i0, indices clamped into the axis (ONNX's `linear` and PyTorch's
    bilinear, whose out-of-range neighbours are the edge element)."""
    low = np.floor(position)
    t = position - low
    indices = np.stack([low, low + 1], axis=1).astype(np.int64)
    return weighted_taps(builder, value, axis, indices, np.stack([1 - t, t], axis=1))


def cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient `a` (ONNX's cubic_coeff_a; PyTorch's
    bicubic has -0.75, its antialiased bicubic -0.5)."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


@dataclass(frozen=True)
class Resampling:
    """How ONNX Resize's linear and cubic modes weigh the input around each source coordinate
    (PyTorch's bicubic is the cubic mode with a = -0.75 and clamped taps)."""

    mode: str
    antialias: bool
    cubic_a: float
    exclude_outside: bool

    def taps(self, position: np.ndarray, n: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """The input indices [out, K] (unclamped) and weights [out, K] of each output, as
        ONNX's reference implementation takes them: the pixel left of the coordinate (the one
        before where it is an integer) and its neighbours, weighted by the kernel at their
        distance (stretched by 1 / scale when antialiasing a downsample, the weights then
        normalised), the ones outside the axis set to 0 with exclude_outside (the rest
        renormalised)."""
        low = np.floor(position)
        ratio = np.where(position == low, 1.0, position - low)
        left = (position - ratio).astype(np.int64)
        reach = 1 if self.mode == "linear" else 2
        shrink = min(scale, 1.0) if self.antialias else 1.0
        first = int(np.floor(-reach / shrink) + 1)
        offsets = np.arange(first, 2 - first)
        distance = (offsets[None, :] - ratio[:, None]) * shrink
        if self.mode == "linear":
            weights = np.clip(1 - np.abs(distance), 0, 1)
        else:
            weights = cubic_kernel(distance, self.cubic_a)
        if self.antialias:
            weights = weights / weights.sum(axis=1, keepdims=True)
        indices = left[:, None] + offsets[None, :]
        if self.exclude_outside:
            weights = np.where((indices < 0) | (indices >= n), 0.0, weights)
            total = weights.sum(axis=1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        return indices, weights


def weighted_taps(
    builder: GraphBuilder, value: SSAValue, axis: int, indices: np.ndarray, weights: np.ndarray
) -> SSAValue:
    """Output i along `axis` is sum_k weights[i, k] x[indices[i, k]] (indices [out, K], clamped
    into the axis: the edge element stands for those beyond it): a gather per tap k weighted by
    a constant, the taps added in order. A tap whose weights are all 0 is left out; one tap of
    weight 1 is its gather alone. Linear, cubic and antialiased resampling are such sums."""
    n = builder.shape_of(value)[axis]
    clamped = np.clip(indices, 0, n - 1)
    used = [k for k in range(weights.shape[1]) if np.any(weights[:, k])]
    if not used:
        used = [0]
    terms = []
    for k in used:
        tap = take(builder, value, axis, clamped[:, k])
        if len(used) == 1 and np.all(weights[:, k] == 1):
            return tap
        terms.append(builder.mul_elem(tap, along(builder, weights[:, k], axis, tap)))
    return functools.reduce(builder.add, terms)


def einsum_labels(equation: str, ranks: Sequence[int]) -> tuple[list[str], str] | str:
    """NumPy's einsum equation for operands of `ranks`, `...` spelled out: each operand's
    labels and the output's (implicit: the broadcast `...` axes, then the labels that occur
    once, in alphabetical order). The axes `...` stands for are aligned from the right, as
    broadcasting aligns them, and get labels of their own. A string is what is wrong."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    given = inputs.split(",")
    if len(given) != len(ranks):
        return f"{len(given)} operand(s) in the equation, {len(ranks)} given"
    spans = [r - len(a.replace("...", "")) for a, r in zip(given, ranks, strict=True)]
    if any(s < 0 or (s and "..." not in a) for a, s in zip(given, spans, strict=True)):
        return "an operand's labels do not match its rank"
    width = max((s for a, s in zip(given, spans, strict=True) if "..." in a), default=0)
    fresh = [chr(0x3B1 + i) for i in range(width)]  # Greek: never an equation's label
    labels = [
        a.replace("...", "".join(fresh[width - s :])) for a, s in zip(given, spans, strict=True)
    ]
    if not arrow:
        counts = Counter("".join(a.replace("...", "") for a in given))
        output = "".join(fresh) + "".join(sorted(c for c, n in counts.items() if n == 1))
    else:
        output = output.replace("...", "".join(fresh))
    return labels, output


def einsum(
    builder: GraphBuilder,
    equation: str,
    tensors: Sequence[SSAValue],
    refuse: Callable[[str], Exception],
) -> SSAValue:
    """NumPy's / PyTorch's / ONNX's einsum, `...` included (`einsum_labels`; its extent-1 axes
    broadcast); a label repeated within an operand takes its diagonal (`_diagonal`, a
    gather). Operands are contracted left to right, each pair as one batched `matmul`. Labels
    only one operand has and nothing later needs are summed first; then the pair, permuted to
    [batch, kept, contracted] and [batch, contracted, kept] and reshaped to three axes, is one
    `matmul`, reshaped back; the result is permuted to the output's labels."""
    tensors = [lift(builder, t) for t in tensors]
    spelled = einsum_labels(equation, [len(builder.shape_of(t)) for t in tensors])
    if isinstance(spelled, str):
        raise refuse(f"einsum '{equation}': {spelled}")
    labels, output = spelled
    if len(set(output)) != len(output) or not set(output) <= set("".join(labels)):
        raise refuse(f"einsum '{equation}': an output label repeated or not in any operand")
    for i, a in enumerate(labels):
        while len(set(a)) != len(a):
            a, tensors[i] = _diagonal(builder, a, tensors[i], refuse, equation)
        labels[i] = a
    extents: dict[str, int] = {}
    for a, t in zip(labels, tensors, strict=True):
        for c, d in zip(a, builder.shape_of(t), strict=True):
            if extents.get(c, 1) == 1:
                extents[c] = d
            elif d not in (1, extents[c]):
                raise refuse(f"einsum '{equation}': label '{c}' has extents {extents[c]} and {d}")
    parts = []
    for a, t in zip(labels, tensors, strict=True):
        target = [extents[c] for c in a]
        parts.append((a, broadcast_to(builder, t, target)))

    def needed(rest: list[tuple[str, SSAValue]]) -> str:
        return output + "".join(a for a, _ in rest)

    def summed(a: str, t: SSAValue, keep: str) -> tuple[str, SSAValue]:
        kept = "".join(c for c in a if c in keep)
        return kept, reduce(builder, tl.ReduceSumOp, t, [a.index(c) for c in a if c not in kept],
                            False)  # fmt: skip

    a, ta = summed(*parts[0], needed(parts[1:]))
    for i in range(1, len(parts)):
        b, tb = summed(*parts[i], needed(parts[i + 1 :]) + a)
        later = needed(parts[i + 1 :])
        batch = [c for c in a if c in b and c in later]
        inner = [c for c in a if c in b and c not in later]
        left = [c for c in a if c not in b]
        right = [c for c in b if c not in a]
        ta = _arranged(builder, ta, a, batch + left + inner, [batch, left, inner], extents)
        tb = _arranged(builder, tb, b, batch + inner + right, [batch, inner, right], extents)
        order = batch + left + right
        ta = reshape(builder, builder.matmul(ta, tb), [extents[c] for c in order])
        a = "".join(order)
    if a != output:
        ta = builder.permute(ta, perm=[a.index(c) for c in output])
    return ta


def _diagonal(
    builder: GraphBuilder, a: str, value: SSAValue, refuse: Callable[[str], Exception], eq: str
) -> tuple[str, SSAValue]:
    """An operand's diagonal over its first label that occurs twice (at axes p < q, extent n):
    axis q moved next to p, the two flattened into n² and the n elements k (n + 1) gathered,
    in place of axis p."""
    c = next(c for c in a if a.count(c) > 1)
    p, q = a.index(c), a.index(c, a.index(c) + 1)
    shape = builder.shape_of(value)
    n = shape[p]
    if shape[q] != n:
        raise refuse(f"einsum '{eq}': label '{c}' has extents {n} and {shape[q]}")
    order = [*range(p + 1), q, *(i for i in range(p + 1, len(a)) if i != q)]
    if order != list(range(len(a))):
        value = builder.permute(value, perm=order)
    moved = [shape[i] for i in order]
    value = reshape(builder, value, [*moved[:p], n * n, *moved[p + 2 :]])
    value = take(builder, value, p, np.arange(n) * (n + 1))
    return "".join(a[i] for i in order if i != q), value


def _arranged(
    builder: GraphBuilder,
    value: SSAValue,
    have: str,
    order: list[str],
    groups: list[list[str]],
    extents: dict[str, int],
) -> SSAValue:
    """`value` (labelled `have`) permuted to `order` and reshaped to one axis per group."""
    if list(have) != order:
        value = builder.permute(value, perm=[have.index(c) for c in order])
    return reshape(builder, value, [int(np.prod([extents[c] for c in g])) for g in groups])


def window_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Adaptive pooling's windows: output i covers [floor(i n / o), ceil((i + 1) n / o))."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_pool(
    builder: GraphBuilder, op: type[tl.PoolOp], value: SSAValue, sizes: Sequence[int]
) -> SSAValue:
    """PyTorch's adaptive average / max pooling of the trailing axes to `sizes`. Where every
    extent divides evenly it is one plain pool; otherwise the windows differ in length, and
    each axis is pooled alone (both reductions are separable over a rectangle): the window's
    t-th element is gathered for every output (the last one again where a window is shorter)
    and the gathered slices are combined, by max, or by a sum weighted 1/length (0 past a
    window's end)."""
    shape = builder.shape_of(value)
    first = len(shape) - len(sizes)
    spatial = shape[first:]
    if all(o and n % o == 0 for n, o in zip(spatial, sizes, strict=True)):
        kernel = [n // o for n, o in zip(spatial, sizes, strict=True)]
        if kernel == [1] * len(kernel):
            return value
        return builder.apply(op, [value], {"kernel": kernel, "stride": kernel})
    for i, (n, o) in enumerate(zip(spatial, sizes, strict=True)):
        axis = first + i
        if n == o:
            continue
        start, end = window_bounds(n, o)
        length = end - start
        parts = []
        for t in range(int(length.max())):
            part = take(builder, value, axis, np.minimum(start + t, end - 1))
            if op is tl.AvgPoolOp:
                weight = np.where(t < length, 1.0 / length, 0.0)
                part = builder.mul_elem(part, along(builder, weight, axis, part))
            parts.append(part)
        combine = builder.max_elem if op is tl.MaxPoolOp else builder.add
        value = functools.reduce(combine, parts)
    return value


__all__ = [
    "ImportFailure",
    "Traced",
    "adaptive_pool",
    "along",
    "broadcast_all",
    "broadcast_to",
    "channel_norm",
    "conv_transpose",
    "elementwise",
    "finish",
    "import_error",
    "interpolate",
    "ints",
    "lift",
    "matmul",
    "new_builder",
    "norm_axis",
    "reduce",
    "reshape",
    "source_binding",
    "take",
    "tile",
    "window_bounds",
]
