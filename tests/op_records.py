"""One op-record table driving the numeric tests of every op (JAX's lax_reference style).

Each `OpRecord` is one op kind in one configuration: parent shapes, metadata, declared output
shape, payload field shapes, a sampler per parent, a PyTorch reference and the tolerances for
comparing against it in float64 and float32. Reuse it for any backend or derived rule:

    from op_records import RECORDS
    for rec in RECORDS:
        graph = rec.graph()                 # inputs %0..%k-1 (one per parent), the op as %k
        inputs, payload = rec.sample(np.random.default_rng(0))
        expected = interpret(graph, payload, inputs, np.float64).output
        got = my_backend(graph, payload, inputs)
        np.testing.assert_allclose(got, expected, **rec.tol64.kw())

- `rec.graph()` builds the `tl.graph @<rec.name>` programmatically (every field given), and
  `rec.text()` prints it as .tlir (payload section included when `payload` is given).
- `rec.sample(rng)` draws the parents' values (list, in node order) and a `Payload` keyed by
  node id `len(rec.parents)`; samplers keep away from points where an op is undefined (log,
  sqrt, inv) and, for records with `smooth=True`, from kinks (relu/abs at 0, ties of max), so
  finite-difference gradient checks can use the same table.
- `rec.torch(inputs, payload, dtype)` evaluates the PyTorch reference (torch imported lazily).
- Tolerances: `tol64` for float64 (tight: the same formula, at most a few ulp of libm or
  summation-order difference), `tol32` for float32 and for f32-vs-f64 agreement (a few float32
  ulp per step; contractions and normalisations accumulate rounding over their reduction length).

Elementwise ops that state a numpy function and a PyTorch spelling get a derived record
(`derived_record`: default metadata, inputs from the op's DOMAIN, EXACT tolerances); records
are written by hand (`HAND_RECORDS`) only for ops that need special inputs or tolerances.
`NOT_IN_TABLE` lists the op kinds without a record and why; a test checks every op in
`NODE_OPS` is in one or the other.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tlc.core.payload import Payload
from tlc.dialect import backward_ops as bw
from tlc.dialect import ops
from tlc.dialect.backward_ops import BACKWARD_OPS
from tlc.dialect.families import BinaryOp, UnaryOp
from tlc.dialect.ops import FORWARD_OPS, GraphOp, NodeOp, OutputOp
from tlc.dialect.printer import print_tlir
from tlc.dialect.shapes import Shape
from tlc.semantics.emitter import fill_defaults

Sampler = Callable[[np.random.Generator, Shape], np.ndarray]


def normal(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    return rng.standard_normal(shape)


def positive(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    return rng.uniform(0.1, 3.0, shape)


def away_from_zero(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """|x| in [0.2, 2]: away from relu/abs kinks and the pole of inv."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.2, 2.0, shape)


def probability(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    return rng.uniform(0.0, 1.0, shape)


@dataclass(frozen=True)
class Tol:
    rtol: float
    atol: float

    def kw(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol}


#: Same formula as torch; libm may differ by an ulp or two.
EXACT64, EXACT32 = Tol(1e-12, 1e-14), Tol(2e-6, 1e-7)
#: Composites of transcendental functions (gelu, safe_log): float32 cancellation in 1 + erf(x)
#: and 1 + tanh(u) for negative x costs up to |x|/2 ulp(1) ~ 3e-7 absolute near |x| = 4.
COMPOSITE32 = Tol(1e-5, 1e-6)
#: Sums, contractions, normalisations: summation order differs from torch's kernels.
SUMS64, SUMS32 = Tol(1e-11, 1e-12), Tol(2e-5, 2e-6)

TorchFn = Callable[[Any, list[Any], dict[str, Any], Mapping[str, Any]], Any]


@dataclass(frozen=True)
class OpRecord:
    name: str
    op: type[NodeOp]
    parents: tuple[Shape, ...]
    out: Shape
    reference: TorchFn
    fields: Mapping[str, Any] = field(default_factory=dict)
    payload: Mapping[str, Shape] = field(default_factory=dict)
    samplers: tuple[Sampler, ...] | None = None
    tol64: Tol = EXACT64
    tol32: Tol = EXACT32
    smooth: bool = True

    @property
    def node_id(self) -> int:
        return len(self.parents)

    def graph(self) -> GraphOp:
        inputs = [ops.InputOp(i, [], shape) for i, shape in enumerate(self.parents)]
        node = self.op(self.node_id, [i.result for i in inputs], self.out, dict(self.fields))
        return GraphOp(self.name, [*inputs, node, OutputOp(node.result)])

    def module(self) -> ModuleOp:
        return ModuleOp([self.graph()])

    def text(self) -> str:
        return print_tlir(self.module())

    def sample(self, rng: np.random.Generator) -> tuple[list[np.ndarray], Payload]:
        samplers = self.samplers or (normal,) * len(self.parents)
        inputs = [s(rng, shape) for s, shape in zip(samplers, self.parents, strict=True)]
        payload = Payload()
        if self.payload:
            payload.records[self.node_id] = {
                name: _PAYLOAD_SAMPLERS.get(name, normal)(rng, shape)
                for name, shape in self.payload.items()
            }
            payload.kinds[self.node_id] = self.op.TAG
        return inputs, payload

    def torch(self, inputs: list[np.ndarray], payload: Payload, dtype: Any) -> np.ndarray:
        """The PyTorch reference on the same values, computed in `dtype` (float32 or 64)."""
        import torch

        tdtype = torch.float64 if dtype == np.float64 else torch.float32
        xs = [torch.tensor(np.asarray(x, dtype=dtype), dtype=tdtype) for x in inputs]
        record = payload.get(self.node_id, {})
        rs = {k: torch.tensor(np.asarray(v, dtype=dtype), dtype=tdtype) for k, v in record.items()}
        with torch.no_grad():
            return self.reference(torch, xs, rs, self.fields).numpy()


_PAYLOAD_SAMPLERS: dict[str, Sampler] = {
    "var": lambda rng, shape: rng.uniform(0.5, 2.0, shape),
    "eps": lambda rng, shape: rng.uniform(1e-3, 1e-1, shape),
}


# --------------------------------------------------------------------------------------------
# PyTorch references that need more than one call
# --------------------------------------------------------------------------------------------


def _conv(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    x, axis, rank = xs[0], m["channel_axis"], len(m["kernel"])
    lead = tuple(x.shape[:axis])
    x = x.reshape((-1, *x.shape[axis:]))
    pads: list[int] = []
    for lo, hi in reversed(list(zip(m["padding"], m["padding_after"], strict=True))):
        pads += [lo, hi]
    x = t.nn.functional.pad(x, pads)
    conv = getattr(t.nn.functional, f"conv{rank}d")
    y = conv(x, r["weight"], r.get("bias"), stride=m["stride"], dilation=m["dilation"],
             groups=m["groups"])  # fmt: skip
    return y.reshape(lead + tuple(y.shape[1:]))


def _pool(kind: str) -> TorchFn:
    def reference(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
        x, rank = xs[0], len(m["kernel"])
        lead = tuple(x.shape[:-rank])
        x = x.reshape((-1, 1, *x.shape[-rank:]))
        pool = getattr(t.nn.functional, f"{kind}_pool{rank}d")
        extra = {"count_include_pad": True} if kind == "avg" else {}
        y = pool(x, m["kernel"], m["stride"], m["padding"], **extra)
        return y.reshape(lead + tuple(y.shape[2:]))

    return reference


def _batch_norm(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    axis = m["channel_axis"]
    x = xs[0].movedim(axis, 0).unsqueeze(0)
    y = t.nn.functional.batch_norm(x, r["mean"], r["var"], r["gamma"], r["beta"],
                                   training=False, eps=float(r["eps"]))  # fmt: skip
    return y.squeeze(0).movedim(0, axis)


def _layernorm(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    x = xs[0]
    eps = float(r["eps"]) if "eps" in r else 1e-5
    return t.nn.functional.layer_norm(
        x, tuple(x.shape[m["axis"] :]), r.get("gamma"), r.get("beta"), eps
    )


def _hard_masked(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    x = xs[0]
    allowed = t.tensor(m["allowed"]).reshape(x.shape)
    y = t.softmax(x.masked_fill(~allowed, -math.inf), dim=-1)
    return t.nan_to_num(y, nan=0.0)  # torch gives NaN on a fully blocked row; the IR gives 0


def _lrn_onnx_window(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    """LRN with ONNX's window, channels c - floor((size-1)/2) .. c + ceil((size-1)/2), which
    F.local_response_norm has for odd sizes only: the sum written out channel by channel."""
    x, size = xs[0], m["size"]
    channels = x.shape[1]
    sums = []
    for c in range(channels):
        low, high = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
        sums.append((x[:, low : high + 1] ** 2).sum(dim=1))
    return x / (m["k"] + m["alpha"] / size * t.stack(sums, dim=1)) ** m["beta"]


def _unary(name: str) -> TorchFn:
    return lambda t, xs, r, m: getattr(t, name)(xs[0])


def _binary(name: str) -> TorchFn:
    return lambda t, xs, r, m: getattr(t, name)(xs[0], xs[1])


def _unary_record(
    op: type[NodeOp], name: str, sampler: Sampler = normal, smooth: bool = True
) -> OpRecord:
    return OpRecord(op.TAG, op, ((2, 3),), (2, 3), _unary(name), samplers=(sampler,),
                    smooth=smooth)  # fmt: skip


_MASK = (True, False, True, True, False, False, False, True, True, True, True, False)

#: The records written by hand: ops that need special inputs (a domain, kinks, a payload,
#: metadata, a looser tolerance). `RECORDS` adds the derived ones.
HAND_RECORDS: tuple[OpRecord, ...] = (
    # sources and layout
    OpRecord("const", ops.ConstOp, (), (2, 3), lambda t, xs, r, m: r["value"].reshape(2, 3),
             fields={"shape": (2, 3)}, payload={"value": (6,)}),
    OpRecord("permute", ops.PermuteOp, ((2, 3, 4),), (4, 2, 3),
             lambda t, xs, r, m: xs[0].permute(2, 0, 1), fields={"perm": (2, 0, 1)}),
    OpRecord("transpose", ops.TransposeOp, ((2, 3, 4),), (4, 3, 2),
             lambda t, xs, r, m: xs[0].transpose(0, 2), fields={"axis1": 0, "axis2": 2}),
    OpRecord("reshape", ops.ReshapeOp, ((2, 3, 4),), (4, 6),
             lambda t, xs, r, m: xs[0].reshape(4, 6), fields={"from": (2, 3, 4), "to": (4, 6)}),
    OpRecord("flatten", ops.FlattenOp, ((2, 3, 4),), (24,),
             lambda t, xs, r, m: xs[0].flatten(), fields={"shape": (2, 3, 4)}),
    OpRecord("broadcast_to", ops.BroadcastToOp, ((2, 1, 4),), (3, 2, 5, 4),
             lambda t, xs, r, m: t.broadcast_to(xs[0], (3, 2, 5, 4)),
             fields={"from": (2, 1, 4), "to": (3, 2, 5, 4)}),
    OpRecord("gather_interior", ops.GatherOp, ((2, 4, 3),), (2, 5, 3),
             lambda t, xs, r, m: xs[0][:, [3, 0, 0, 2, 1]],
             fields={"axis": 1, "indices": (3, 0, 0, 2, 1)}),
    OpRecord("gather_last", ops.GatherOp, ((3, 4),), (3, 2),
             lambda t, xs, r, m: xs[0][:, 1:4:2], fields={"axis": 1, "indices": (1, 3)}),
    OpRecord("concat_interior", ops.ConcatOp, ((2, 1, 3), (2, 2, 3), (2, 3, 3)), (2, 6, 3),
             lambda t, xs, r, m: t.cat(xs, dim=1), fields={"axis": 1}),
    OpRecord("concat_last", ops.ConcatOp, ((2, 3), (2, 1)), (2, 4),
             lambda t, xs, r, m: t.cat(xs, dim=1), fields={"axis": 1}),
    # elementwise unary ops that need their own inputs (kinks, poles, metadata, a looser
    # float32 tolerance); every other elementwise op's record is derived (`derived_record`)
    _unary_record(ops.AbsOp, "abs", away_from_zero),
    _unary_record(ops.ReluOp, "relu", away_from_zero),
    OpRecord("softplus", ops.SoftplusOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.softplus(xs[0])),
    OpRecord("softplus_wide", ops.SoftplusOp, ((20,),), (20,),
             lambda t, xs, r, m: t.nn.functional.softplus(xs[0]),
             samplers=(lambda rng, s: rng.uniform(-18, 18, s),)),
    OpRecord("inv", ops.InvOp, ((2, 3),), (2, 3), lambda t, xs, r, m: 1 / xs[0],
             samplers=(away_from_zero,)),
    OpRecord("gelu", ops.GeluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.gelu(xs[0]), fields={"approximate": "none"},
             tol32=COMPOSITE32),
    OpRecord("gelu_tanh", ops.GeluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.gelu(xs[0], approximate="tanh"),
             fields={"approximate": "tanh"}, tol32=COMPOSITE32),
    # leaky_relu: defined only by its facts (numpy, derivative, monotone for slope >= 0,
    # decomposition), so these records check every derived rule against torch
    OpRecord("leaky_relu", ops.LeakyReluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.leaky_relu(xs[0], m["negative_slope"]),
             fields={"negative_slope": 0.01}, samplers=(away_from_zero,)),
    OpRecord("leaky_relu_negative", ops.LeakyReluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.leaky_relu(xs[0], m["negative_slope"]),
             fields={"negative_slope": -0.5}, samplers=(away_from_zero,)),
    OpRecord("leaky_relu_steep", ops.LeakyReluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.leaky_relu(xs[0], m["negative_slope"]),
             fields={"negative_slope": 2.5}, samplers=(away_from_zero,)),
    # defined by their facts (plus a hardsigmoid torch kernel)
    OpRecord("elu", ops.EluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.elu(xs[0], m["alpha"]),
             fields={"alpha": 1.0}, samplers=(away_from_zero,)),
    OpRecord("elu_alpha", ops.EluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.elu(xs[0], m["alpha"]),
             fields={"alpha": 0.3}, samplers=(away_from_zero,)),
    OpRecord("selu", ops.SeluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.selu(xs[0]), samplers=(away_from_zero,)),
    OpRecord("hardsigmoid", ops.HardSigmoidOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.clamp(xs[0] * m["alpha"] + m["beta"], 0, 1),
             fields={"alpha": 0.2, "beta": 0.5}, samplers=(lambda rng, s: rng.uniform(-4, 4, s),)),
    OpRecord("hardsigmoid_torch", ops.HardSigmoidOp, ((2, 3),), (2, 3),
             # F.hardsigmoid's value, written out: its float64 backward uses float32(1/6)
             lambda t, xs, r, m: t.clamp(xs[0] / 6 + 0.5, 0, 1),
             fields={"alpha": 1 / 6, "beta": 0.5},
             samplers=(lambda rng, s: rng.uniform(-4, 4, s),)),
    OpRecord("hardswish", ops.HardSwishOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.hardswish(xs[0]),
             samplers=(lambda rng, s: rng.uniform(-4, 4, s),)),
    OpRecord("silu", ops.SiluOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.nn.functional.silu(xs[0]), tol32=COMPOSITE32),
    OpRecord("clip", ops.ClipOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.clamp(xs[0], m["min"], m["max"]),
             fields={"min": -0.5, "max": 1.0}, samplers=(lambda rng, s: rng.uniform(-2, 2, s),)),
    OpRecord("clip_below", ops.ClipOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: t.clamp(xs[0], min=m["min"]),
             fields={"min": 0.25, "max": math.inf}),
    # div, prelu, pow, lrn: by their facts (div's interval, pow's interval and lowering
    # explicit, prelu's lowering explicit (its select's signed zeros); prelu's intervals and
    # lrn through their decompositions)
    OpRecord("div", ops.DivOp, ((2, 3), (2, 3)), (2, 3), _binary("div"),
             samplers=(normal, away_from_zero)),
    OpRecord("prelu", ops.PreluOp, ((2, 3), (2, 3)), (2, 3),
             lambda t, xs, r, m: t.where(xs[0] > 0, xs[0], xs[0] * xs[1]),
             samplers=(away_from_zero, normal)),
    OpRecord("pow_cube", ops.PowOp, ((2, 3),), (2, 3), lambda t, xs, r, m: xs[0] ** 3,
             fields={"exponent": 3.0}),
    OpRecord("pow_fraction", ops.PowOp, ((2, 3),), (2, 3), lambda t, xs, r, m: xs[0] ** 0.75,
             fields={"exponent": 0.75}, samplers=(positive,)),
    OpRecord("pow_inverse_square", ops.PowOp, ((2, 3),), (2, 3),
             lambda t, xs, r, m: xs[0] ** -2.0, fields={"exponent": -2.0},
             samplers=(away_from_zero,)),
    OpRecord("pow_elem", ops.PowElemOp, ((2, 3), (2, 3)), (2, 3),
             lambda t, xs, r, m: t.pow(xs[0], xs[1]), samplers=(positive, normal)),
    OpRecord("lrn", ops.LrnOp, ((2, 5, 3, 2),), (2, 5, 3, 2),
             lambda t, xs, r, m: t.nn.functional.local_response_norm(
                 xs[0], m["size"], m["alpha"], m["beta"], m["k"]),
             fields={"size": 3, "alpha": 0.5, "beta": 0.75, "k": 2.0},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("lrn_even", ops.LrnOp, ((2, 5, 4),), (2, 5, 4), _lrn_onnx_window,
             fields={"size": 4, "alpha": 0.5, "beta": 0.6, "k": 1.0},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("pad_constant", ops.PadOp, ((2, 3, 4),), (3, 3, 7),
             lambda t, xs, r, m: t.nn.functional.pad(xs[0], (2, 1, 0, 0, 1, 0), value=1.5),
             fields={"before": (1, 0, 2), "after": (0, 0, 1), "mode": "constant", "value": 1.5}),
    OpRecord("pad_reflect", ops.PadOp, ((2, 3, 4),), (2, 6, 7),
             lambda t, xs, r, m: t.nn.functional.pad(xs[0], (1, 2, 2, 1), mode="reflect"),
             fields={"before": (0, 2, 1), "after": (0, 1, 2), "mode": "reflect", "value": 0.0}),
    OpRecord("pad_edge", ops.PadOp, ((2, 3, 4),), (2, 5, 4),
             lambda t, xs, r, m: t.nn.functional.pad(xs[0], (0, 0, 0, 2), mode="replicate"),
             fields={"before": (0, 0, 0), "after": (0, 2, 0), "mode": "edge", "value": 0.0}),
    OpRecord("less", ops.LessOp, ((2, 3), (2, 3)), (2, 3),
             lambda t, xs, r, m: (xs[0] < xs[1]).to(xs[0].dtype), smooth=False),
    OpRecord("where", ops.WhereOp, ((2, 3), (2, 3), (2, 3)), (2, 3),
             lambda t, xs, r, m: t.where(xs[0] != 0, xs[1], xs[2]),
             samplers=(lambda rng, s: rng.choice([0.0, 1.0, -2.0], s), normal, normal),
             smooth=False),
    OpRecord("safe_log", ops.SafeLogOp, ((2, 3), ()), (2, 3),
             lambda t, xs, r, m: t.log(t.nn.functional.softplus(xs[0]) + xs[1]),
             samplers=(normal, positive), tol32=COMPOSITE32),
    # reductions
    OpRecord("reduce_sum", ops.ReduceSumOp, ((2, 3, 4),), (2, 4),
             lambda t, xs, r, m: xs[0].sum(dim=1), fields={"axis": 1}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("reduce_mean", ops.ReduceMeanOp, ((2, 3, 4),), (3, 4),
             lambda t, xs, r, m: xs[0].mean(dim=0), fields={"axis": 0}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("sum", ops.SumOp, ((2, 3, 4),), (), lambda t, xs, r, m: xs[0].sum(),
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("mse_loss", ops.MseLossOp, ((2, 3), (2, 3)), (),
             lambda t, xs, r, m: t.nn.functional.mse_loss(xs[0], xs[1]),
             tol64=SUMS64, tol32=SUMS32),
    # along an axis
    OpRecord("softmax_interior", ops.SoftmaxOp, ((2, 3, 4),), (2, 3, 4),
             lambda t, xs, r, m: t.softmax(xs[0], dim=1), fields={"axis": 1},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("softmax_first", ops.SoftmaxOp, ((3, 4),), (3, 4),
             lambda t, xs, r, m: t.softmax(xs[0], dim=0), fields={"axis": 0},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("softmax_large", ops.SoftmaxOp, ((2, 5),), (2, 5),
             lambda t, xs, r, m: t.softmax(xs[0], dim=1), fields={"axis": 1},
             samplers=(lambda rng, s: 800 * rng.standard_normal(s),), tol64=SUMS64, tol32=SUMS32),
    OpRecord("log_softmax_interior", ops.LogSoftmaxOp, ((2, 3, 4),), (2, 3, 4),
             lambda t, xs, r, m: t.log_softmax(xs[0], dim=1), fields={"axis": 1},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("log_softmax_large", ops.LogSoftmaxOp, ((2, 5),), (2, 5),
             lambda t, xs, r, m: t.log_softmax(xs[0], dim=1), fields={"axis": 1},
             samplers=(lambda rng, s: 800 * rng.standard_normal(s),), tol64=SUMS64, tol32=SUMS32),
    OpRecord("hard_masked_softmax", ops.HardMaskedSoftmaxOp, ((3, 4),), (3, 4), _hard_masked,
             fields={"mask_shape": (3, 4), "allowed": _MASK}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("layernorm_interior", ops.LayernormOp, ((2, 3, 4),), (2, 3, 4), _layernorm,
             fields={"axis": 1}, payload={"gamma": (3, 4), "beta": (3, 4), "eps": ()},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("layernorm_default", ops.LayernormOp, ((2, 5),), (2, 5), _layernorm,
             fields={"axis": 1}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("layernorm_whole", ops.LayernormOp, ((2, 3),), (2, 3), _layernorm,
             fields={"axis": 0}, payload={"gamma": (2, 3), "beta": (2, 3)},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("batch_norm_eval", ops.BatchNormEvalOp, ((2, 3, 4),), (2, 3, 4), _batch_norm,
             fields={"channel_axis": 1, "channels": 3},
             payload={"gamma": (3,), "beta": (3,), "mean": (3,), "var": (3,), "eps": ()},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("batch_norm_eval_first", ops.BatchNormEvalOp, ((3, 5),), (3, 5), _batch_norm,
             fields={"channel_axis": 0, "channels": 3},
             payload={"gamma": (3,), "beta": (3,), "mean": (3,), "var": (3,), "eps": ()},
             tol64=SUMS64, tol32=SUMS32),
    # contractions
    OpRecord("linear", ops.LinearOp, ((4,),), (5,),
             lambda t, xs, r, m: t.nn.functional.linear(xs[0], r["weight"], r["bias"]),
             payload={"weight": (5, 4), "bias": (5,)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("linear_leading", ops.LinearOp, ((2, 3, 4),), (2, 3, 5),
             lambda t, xs, r, m: t.nn.functional.linear(xs[0], r["weight"], r["bias"]),
             payload={"weight": (5, 4), "bias": (5,)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("linear_no_bias", ops.LinearOp, ((3, 4),), (3, 2),
             lambda t, xs, r, m: t.nn.functional.linear(xs[0], r["weight"]),
             payload={"weight": (2, 4)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("matmul", ops.MatmulOp, ((3, 4), (4, 5)), (3, 5), _binary("matmul"),
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("matmul_batched", ops.MatmulOp, ((2, 3, 4), (2, 4, 5)), (2, 3, 5), _binary("matmul"),
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv1d", ops.ConvOp, ((2, 7),), (3, 7), _conv,
             fields={"kernel": (3,), "stride": (1,), "padding": (1,), "dilation": (1,),
                     "padding_after": (1,), "groups": 1, "channel_axis": 0,
                     "in_channels": 2, "out_channels": 3},
             payload={"weight": (3, 2, 3), "bias": (3,)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv2d_grouped", ops.ConvOp, ((2, 4, 7, 6),), (2, 6, 3, 2), _conv,
             fields={"kernel": (3, 2), "stride": (2, 3), "padding": (1, 0), "dilation": (1, 2),
                     "padding_after": (0, 1), "groups": 2, "channel_axis": 1,
                     "in_channels": 4, "out_channels": 6},
             payload={"weight": (6, 2, 3, 2), "bias": (6,)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv2d_no_bias", ops.ConvOp, ((3, 5, 5),), (2, 3, 3), _conv,
             fields={"kernel": (3, 3), "stride": (1, 1), "padding": (0, 0), "dilation": (1, 1),
                     "padding_after": (0, 0), "groups": 1, "channel_axis": 0,
                     "in_channels": 3, "out_channels": 2},
             payload={"weight": (2, 3, 3, 3)}, tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv3d", ops.ConvOp, ((2, 4, 4, 4),), (2, 2, 2, 2), _conv,
             fields={"kernel": (2, 2, 2), "stride": (2, 2, 2), "padding": (0, 0, 0),
                     "dilation": (1, 1, 1), "padding_after": (0, 0, 0), "groups": 1,
                     "channel_axis": 0, "in_channels": 2, "out_channels": 2},
             payload={"weight": (2, 2, 2, 2, 2), "bias": (2,)}, tol64=SUMS64, tol32=SUMS32),
    # pooling over the spatial suffix
    OpRecord("max_pool2d", ops.MaxPoolOp, ((2, 3, 5, 6),), (2, 3, 3, 3), _pool("max"),
             fields={"kernel": (2, 2), "stride": (2, 2), "padding": (1, 0)}),
    OpRecord("max_pool1d_overlap", ops.MaxPoolOp, ((3, 7),), (3, 3), _pool("max"),
             fields={"kernel": (3,), "stride": (2,), "padding": (0,)}),
    OpRecord("avg_pool2d_padded", ops.AvgPoolOp, ((2, 5, 5),), (2, 3, 3), _pool("avg"),
             fields={"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("avg_pool1d", ops.AvgPoolOp, ((4, 6),), (4, 3), _pool("avg"),
             fields={"kernel": (2,), "stride": (2,), "padding": (0,)},
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("avg_pool3d", ops.AvgPoolOp, ((4, 4, 4),), (2, 2, 2), _pool("avg"),
             fields={"kernel": (2, 2, 2), "stride": (2, 2, 2), "padding": (0, 0, 0)},
             tol64=SUMS64, tol32=SUMS32),
)  # fmt: skip

# --------------------------------------------------------------------------------------------
# Derived records: an elementwise op stating its numpy function and its PyTorch spelling needs
# no hand-written record. Its record is the op at its default metadata on [2, 3] operands,
# drawn from the op's DOMAIN (else standard normal), compared with its spelling's first
# function (or module) at EXACT64 / EXACT32: the same formula as torch, up to a few ulp of
# libm (an op that needs more, or other inputs, gets a hand record).
# --------------------------------------------------------------------------------------------


def _dotted(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def spelled_reference(op: type[NodeOp]) -> TorchFn:
    """The op's PyTorch spelling as its reference: the first function called with the tensors
    and the spelling's `arguments` (metadata fields, by keyword), else the first module built
    from them."""
    spelling = op.TORCH
    assert spelling is not None and (spelling.functions or spelling.modules), op.TAG

    def reference(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
        args = {a: m[a] for a in spelling.arguments}
        if spelling.functions:
            return _dotted(spelling.functions[0])(*xs, **args)
        return _dotted(spelling.modules[0])(**args)(*xs)

    return reference


def derivable(op: type[NodeOp]) -> bool:
    """An elementwise op whose record follows from its facts: a numpy function, a PyTorch
    function or module, no payload, a default for every metadata field."""
    spelling = op.TORCH
    return (
        issubclass(op, (UnaryOp, BinaryOp))
        and op.defines("numpy")
        and spelling is not None
        and bool(spelling.functions or spelling.modules)
        and not op.PAYLOAD
        and all(f.default is not None for f in op.FIELDS)
    )


def _above(low: float) -> Sampler:
    """Inside a DOMAIN bounded below by `low`: low + [0.1, 3)."""
    if low == 0.0:
        return positive
    return lambda rng, shape: low + positive(rng, shape)


def derived_record(op: type[NodeOp]) -> OpRecord:
    shape = (2, 3)
    arity = op.ARITY[0]
    domain = getattr(op, "DOMAIN", None)
    sampler = normal if domain is None else _above(domain[0])
    return OpRecord(op.TAG, op, (shape,) * arity, shape, spelled_reference(op),
                    fields=fill_defaults(op, {}, shape), samplers=(sampler,) * arity)  # fmt: skip


#: Every forward op's records: the hand-written ones, then one derived record for each
#: derivable op kind without a hand record.
RECORDS: tuple[OpRecord, ...] = HAND_RECORDS + tuple(
    derived_record(op)
    for op in FORWARD_OPS
    if derivable(op) and op not in {r.op for r in HAND_RECORDS}
)


# --------------------------------------------------------------------------------------------
# The windowed backward ops (tlc.dialect.backward_ops): kept out of RECORDS (they are not
# differentiable, and the forward-op tests iterate RECORDS); each reference is torch.autograd's
# VJP of the forward op, so the same records check the numpy rules and any backend against it.
# --------------------------------------------------------------------------------------------


def _vjp(t: Any, forward: Callable[[Any], Any], leaf: Any, cotangent: Any) -> Any:
    with t.enable_grad():
        leaf = leaf.detach().clone().requires_grad_()
        return t.autograd.grad(forward(leaf), leaf, cotangent)[0]


def _max_pool_grad(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    x, g = xs
    return _vjp(t, lambda leaf: _pool("max")(t, [leaf], r, m), x, g)


def _avg_pool_grad(x_shape: Shape) -> TorchFn:
    def reference(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
        x = t.zeros(x_shape, dtype=xs[0].dtype)
        return _vjp(t, lambda leaf: _pool("avg")(t, [leaf], r, m), x, xs[0])

    return reference


def _conv_input_grad(x_shape: Shape) -> TorchFn:
    def reference(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
        g, w = xs
        x = t.zeros(x_shape, dtype=g.dtype)
        return _vjp(t, lambda leaf: _conv(t, [leaf], {"weight": w}, m), x, g)

    return reference


def _conv_weight_grad(t: Any, xs: list[Any], r: dict[str, Any], m: Mapping[str, Any]) -> Any:
    x, g = xs
    w = t.zeros((m["out_channels"], m["in_channels"] // m["groups"], *m["kernel"]), dtype=x.dtype)
    return _vjp(t, lambda leaf: _conv(t, [x], {"weight": leaf}, m), w, g)


def _ties(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """Values in {-1, 0, 1}: most windows hold several maxima (the first one must win)."""
    return rng.integers(-1, 2, shape).astype(np.float64)


def _conv_fields(**fields: Any) -> dict[str, Any]:
    rank = len(fields["kernel"])
    defaults = {"stride": (1,) * rank, "padding": (0,) * rank, "dilation": (1,) * rank,
                "groups": 1, "channel_axis": 0}  # fmt: skip
    merged = {**defaults, **fields}
    return {**merged, "padding_after": fields.get("padding_after", merged["padding"])}


_CONV1D = _conv_fields(kernel=(3,), padding=(1,), in_channels=2, out_channels=3)
_CONV2D_GROUPED = _conv_fields(kernel=(3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2),
                               padding_after=(0, 1), groups=2, channel_axis=1, in_channels=4,
                               out_channels=6)  # fmt: skip
#: 100 output positions and 27 patch rows: the vector paths of the matrix kernels.
_CONV2D_WIDE = _conv_fields(kernel=(3, 3), padding=(1, 1), in_channels=3, out_channels=5)

#: The kernel cotangent of _CONV2D_WIDE sums 100 products of standard normals (sum of |terms|
#: about 64): float32 accumulation in numpy's order is off by up to ~6e-6 from the exact sum
#: (measured), the reassociated vector sum by ~2e-6, so they may differ by 1e-5 absolute.
LONG_SUMS32 = Tol(2e-5, 1e-5)

#: Pooling gradients are sums of a few copies of g (or g / prod(kernel)) per input position:
#: torch adds them in another order, so EXACT (an ulp or two); convolution gradients are
#: contractions over channels and positions (SUMS, summation order).
BACKWARD_RECORDS: tuple[OpRecord, ...] = (
    OpRecord("max_pool_grad2d_padded", bw.MaxPoolGradOp, ((2, 3, 5, 6), (2, 3, 3, 3)),
             (2, 3, 5, 6), _max_pool_grad,
             fields={"kernel": (2, 2), "stride": (2, 2), "padding": (1, 0)}),
    OpRecord("max_pool_grad1d_overlap_ties", bw.MaxPoolGradOp, ((3, 7), (3, 3)), (3, 7),
             _max_pool_grad, fields={"kernel": (3,), "stride": (2,), "padding": (0,)},
             samplers=(_ties, normal)),
    OpRecord("max_pool_grad2d_ties_padded", bw.MaxPoolGradOp, ((2, 4, 4), (2, 3, 3)),
             (2, 4, 4), _max_pool_grad,
             fields={"kernel": (2, 2), "stride": (2, 2), "padding": (1, 1)},
             samplers=(_ties, normal)),
    OpRecord("avg_pool_grad2d_padded", bw.AvgPoolGradOp, ((2, 3, 3),), (2, 5, 5),
             _avg_pool_grad((2, 5, 5)),
             fields={"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
    OpRecord("avg_pool_grad3d", bw.AvgPoolGradOp, ((2, 2, 2),), (4, 4, 4),
             _avg_pool_grad((4, 4, 4)),
             fields={"kernel": (2, 2, 2), "stride": (2, 2, 2), "padding": (0, 0, 0)}),
    OpRecord("conv_input_grad1d", bw.ConvInputGradOp, ((3, 7), (3, 2, 3)), (2, 7),
             _conv_input_grad((2, 7)), fields=_CONV1D, tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv_input_grad2d_grouped", bw.ConvInputGradOp, ((2, 6, 3, 2), (6, 2, 3, 2)),
             (2, 4, 7, 6), _conv_input_grad((2, 4, 7, 6)), fields=_CONV2D_GROUPED,
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv_input_grad2d_wide", bw.ConvInputGradOp, ((5, 10, 10), (5, 3, 3, 3)),
             (3, 10, 10), _conv_input_grad((3, 10, 10)), fields=_CONV2D_WIDE,
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv_weight_grad1d", bw.ConvWeightGradOp, ((2, 7), (3, 7)), (3, 2, 3),
             _conv_weight_grad, fields=_CONV1D, tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv_weight_grad2d_grouped", bw.ConvWeightGradOp, ((2, 4, 7, 6), (2, 6, 3, 2)),
             (6, 2, 3, 2), _conv_weight_grad, fields=_CONV2D_GROUPED,
             tol64=SUMS64, tol32=SUMS32),
    OpRecord("conv_weight_grad2d_wide", bw.ConvWeightGradOp, ((3, 10, 10), (5, 10, 10)),
             (5, 3, 3, 3), _conv_weight_grad, fields=_CONV2D_WIDE, tol64=SUMS64,
             tol32=LONG_SUMS32),
)  # fmt: skip


#: Op kinds with no record here, and why (checked exhaustive against NODE_OPS by a test).
NOT_IN_TABLE: dict[type[NodeOp], str] = {
    ops.InputOp: "the graph's input: every record feeds its parents through input nodes",
    ops.RandUniformOp: "tlc's own PCG64 stream, no PyTorch equivalent; tested for determinism",
    ops.BernoulliMaskOp: "tlc's own PCG64 stream, no PyTorch equivalent; tested for determinism",
    **dict.fromkeys(
        BACKWARD_OPS,
        "gradient-graph op, not differentiable: the windowed ones have BACKWARD_RECORDS; "
        "sign and gelu_grad run in the gradient graphs of tests/test_autodiff_ops.py",
    ),
}
