"""The `torch` provider's kernels: each op through PyTorch (mostly `torch.nn.functional`).

Trusted-external: tlc does not check ATen's code, it only compares results in tests. `TORCH` maps
an IR op class to `rule(torch, node, args, record) -> Tensor` over tensors of the run's dtype;
`torch` is passed in so this module loads (and the registry is built) without importing torch.

An op whose PyTorch spelling (`NodeOp.TORCH`) names a function gets that function as its rule,
called as `fn(*tensors, field=value...)` for the spelling's `arguments` (`leaky_relu` is
`F.leaky_relu(x, negative_slope=s)`); the name is resolved when the kernel first runs. Rules are
written below where torch's function differs from tl's meaning or needs the payload (softplus,
flatten, reductions, layout, linear, normalisations, pooling, convolution). Ops torch cannot run
as tl defines them are refused with the reason (`TORCH.unsupported`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from functools import cache
from typing import Any

from tlc.core.rule_table import RuleTable
from tlc.dialect import backward_ops, ops
from tlc.dialect.ops import NodeOp
from tlc.dialect.registry import NODE_OPS

TorchRule = Callable[[Any, NodeOp, list[Any], "dict[str, Any] | None"], Any]

TORCH: RuleTable[TorchRule] = RuleTable("torch")

TORCH.refuse(
    "tlc draws from its documented PCG64 stream; torch's generator differs",
    ops.RandUniformOp,
    ops.BernoulliMaskOp,
)
TORCH.refuse(
    "a source: the executor takes its value from the caller or the payload, not from a kernel",
    ops.InputOp,
    ops.ConstOp,
)
TORCH.refuse("the reference fails on inputs <= 0; torch.log returns NaN or -inf instead", ops.LogOp)
TORCH.refuse(
    "fully blocked rows must give 0; torch.softmax gives NaN there", ops.HardMaskedSoftmaxOp
)
TORCH.refuse(
    "a gradient op: torch runs these only inside autograd (torch.nn.grad lacks asymmetric padding)",
    backward_ops.GeluGradOp,
    backward_ops.MaxPoolGradOp,
    backward_ops.AvgPoolGradOp,
    backward_ops.ConvInputGradOp,
    backward_ops.ConvWeightGradOp,
)

register = TORCH.register


@cache
def resolve(dotted: str) -> Callable[..., Any]:
    """The callable a dotted name such as `torch.nn.functional.relu` names (the longest
    importable prefix is the module, the rest attributes)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            found = getattr(found, attr)
        return found
    raise ImportError(f"cannot import {dotted}")


def spelled_rule(op_class: type[NodeOp]) -> TorchRule | None:
    """The rule of an op whose PyTorch spelling names a function: the first one, called with
    the tensors and the spelling's arguments as keywords."""
    spelling = op_class.TORCH
    if spelling is None or not spelling.functions:
        return None
    name, fields = spelling.functions[0], spelling.arguments

    def rule(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
        return resolve(name)(*args, **{f: node.meta(f) for f in fields})

    return rule


# F.softplus switches to the identity above a threshold; logaddexp is the exact stable form.
register(ops.SoftplusOp)(lambda t, node, args, record: t.logaddexp(args[0], t.zeros_like(args[0])))
register(ops.SafeLogOp)(
    lambda t, node, args, record: t.log(t.logaddexp(args[0], t.zeros_like(args[0])) + args[1])
)


@register(ops.HardSigmoidOp)
def _hardsigmoid(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    """F.hardsigmoid has PyTorch's fixed alpha = 1/6; tl's alpha and beta are ONNX's fields."""
    return t.clamp(args[0] * node.meta("alpha") + node.meta("beta"), 0, 1)


register(ops.PreluOp)(
    lambda t, node, args, record: t.where(args[0] > 0, args[0], args[0] * args[1])
)


register(ops.PowElemOp)(lambda t, node, args, record: t.pow(args[0], args[1]))
register(ops.LessOp)(lambda t, node, args, record: (args[0] < args[1]).to(args[0].dtype))
register(ops.WhereOp)(lambda t, node, args, record: t.where(args[0] != 0, args[1], args[2]))


@register(ops.LrnOp)
def _lrn(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    """ONNX's channel window (F.local_response_norm pads size // 2 channels first, which is
    ONNX's window for odd sizes only): the windowed mean of x² by avg_pool2d."""
    (x,) = args
    size, alpha, beta, k = (node.meta(f) for f in ("size", "alpha", "beta", "k"))
    square = (x * x).reshape(x.shape[0], 1, x.shape[1], -1)
    padded = t.nn.functional.pad(square, (0, 0, (size - 1) // 2, size // 2))
    mean = t.nn.functional.avg_pool2d(padded, (size, 1), stride=1).reshape(x.shape)
    return x / (k + alpha * mean) ** beta


@register(ops.PadOp)
def _pad(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    """index_select of each axis's sources (F.pad's reflect/replicate take only the last
    1-3 axes of batched inputs); a constant pad's positions then hold the value."""
    y = args[0]
    for axis in range(y.dim()):
        sources = t.as_tensor(node.sources(axis, y.shape[axis]))
        if len(sources) == y.shape[axis] and bool((sources == t.arange(len(sources))).all()):
            continue
        taken = y.index_select(axis, sources.clamp(min=0))
        if node.meta("mode") == "constant":
            view = [1] * y.dim()
            view[axis] = len(sources)
            fill = t.full((), node.meta("value"), dtype=y.dtype)
            taken = t.where((sources >= 0).reshape(view), taken, fill)
        y = taken
    return y


register(ops.SumOp)(lambda t, node, args, record: t.sum(args[0]))
register(ops.MatmulOp)(lambda t, node, args, record: t.matmul(*args))
register(ops.FlattenOp)(lambda t, node, args, record: args[0].reshape(-1))
register(ops.MseLossOp)(lambda t, node, args, record: t.nn.functional.mse_loss(*args))


@register(ops.ReduceSumOp)
def _reduce_sum(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.sum(args[0], dim=node.meta("axis"))


@register(ops.ReduceMeanOp)
def _reduce_mean(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.mean(args[0], dim=node.meta("axis"))


@register(ops.SoftmaxOp)
def _softmax(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.nn.functional.softmax(args[0], dim=node.meta("axis"))


@register(ops.LogSoftmaxOp)
def _log_softmax(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.nn.functional.log_softmax(args[0], dim=node.meta("axis"))


@register(ops.PermuteOp)
def _permute(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return args[0].permute(*node.meta("perm"))


@register(ops.TransposeOp)
def _transpose(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return args[0].transpose(node.meta("axis1"), node.meta("axis2"))


@register(ops.ReshapeOp)
def _reshape(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return args[0].reshape(node.meta("to"))


@register(ops.BroadcastToOp)
def _broadcast(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.broadcast_to(args[0], node.meta("to"))


@register(ops.GatherOp)
def _gather(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    indices = t.tensor(node.meta("indices"), dtype=t.int64, device=args[0].device)
    return t.index_select(args[0], node.meta("axis"), indices)


@register(ops.ConcatOp)
def _concat(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.cat(args, dim=node.meta("axis"))


@register(ops.LinearOp)
def _linear(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.nn.functional.linear(args[0], record["weight"], record.get("bias"))


@register(ops.LayernormOp)
def _layernorm(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    (x,) = args
    record = record or {}
    eps = float(record["eps"]) if "eps" in record else 1e-5
    return t.nn.functional.layer_norm(
        x, x.shape[node.meta("axis") :], record.get("gamma"), record.get("beta"), eps
    )


@register(ops.BatchNormEvalOp)
def _batch_norm(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    """F.batch_norm wants channels at dim 1: view x as (rest, C) and move them back."""
    (x,) = args
    axis = node.meta("channel_axis")
    moved = x.movedim(axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    eps = float(record["eps"]) if "eps" in record else 1e-5
    y = t.nn.functional.batch_norm(
        rows, record["mean"], record["var"], record["gamma"], record["beta"], False, 0.0, eps
    )
    return y.reshape(moved.shape).movedim(-1, axis)


def _spatial(t: Any, x: Any, rank: int, keep: int, run: Callable[[Any], Any]) -> Any:
    """Apply a torch N-d op wanting (N, C?, spatial...) to `x` whose last `rank` axes are
    spatial and whose `keep` axes before them are kept as channels: the leading axes before
    those are folded into one batch axis and restored afterwards."""
    lead = x.shape[: x.dim() - rank - keep]
    batch = x.reshape((math.prod(lead),) + tuple(x.shape[len(lead) :]))
    y = run(batch)
    return y.reshape(tuple(lead) + tuple(y.shape[1:]))


@register(ops.MaxPoolOp, ops.AvgPoolOp)
def _pool(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    """Pools every leading axis alike: torch's (N, C, spatial) with a channel axis of 1."""
    kernel, stride, padding = node.meta("kernel"), node.meta("stride"), node.meta("padding")
    rank = len(kernel)
    kind = "max" if isinstance(node, ops.MaxPoolOp) else "avg"
    fn = getattr(t.nn.functional, f"{kind}_pool{rank}d")

    def run(batch: Any) -> Any:
        return fn(batch.unsqueeze(1), kernel, stride, padding).squeeze(1)

    return _spatial(t, args[0], rank, 0, run)


@register(ops.ConvOp)
def _conv(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    m = node.metadata()
    rank = len(m["kernel"])
    fn = getattr(t.nn.functional, f"conv{rank}d")
    pads = [p for lo, hi in zip(m["padding"], m["padding_after"], strict=True) for p in (lo, hi)]
    # F.pad lists the last axis first.
    order = [pads[i] for axis in reversed(range(rank)) for i in (2 * axis, 2 * axis + 1)]

    def run(batch: Any) -> Any:
        padded = t.nn.functional.pad(batch, order)
        return fn(
            padded, record["weight"], record.get("bias"), m["stride"], 0, m["dilation"],
            m["groups"],
        )  # fmt: skip

    return _spatial(t, args[0], rank, 1, run)


TORCH.derive(NODE_OPS, spelled_rule)
