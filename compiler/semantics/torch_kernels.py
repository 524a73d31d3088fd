"""The `torch` provider's kernels: each op through PyTorch (mostly `torch.nn.functional`).

Trusted-external: tlc does not check ATen's code, it only compares results in tests. `TORCH` maps
an IR op class to `rule(torch, node, args, record) -> Tensor` over tensors of the run's dtype;
`torch` is passed in so this module loads (and the registry is built) without importing torch.
Ops without a rule are in `TORCH_UNSUPPORTED` with the reason; a test checks the two tables
cover every op that has a backend op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tlc.core.rule_table import registrar
from tlc.dialect import backward_ops, ops
from tlc.dialect.ops import NodeOp

TorchRule = Callable[[Any, NodeOp, list[Any], "dict[str, Any] | None"], Any]

TORCH: dict[type[NodeOp], TorchRule] = {}

TORCH_UNSUPPORTED: dict[type[NodeOp], str] = {
    ops.RandUniformOp: "tlc draws from its documented PCG64 stream; torch's generator differs",
    ops.BernoulliMaskOp: "tlc draws from its documented PCG64 stream; torch's generator differs",
    ops.LogOp: "the reference fails on inputs <= 0; torch.log returns NaN or -inf instead",
    ops.HardMaskedSoftmaxOp: "fully blocked rows must give 0; torch.softmax gives NaN there",
    **dict.fromkeys(
        (
            backward_ops.GeluGradOp,
            backward_ops.MaxPoolGradOp,
            backward_ops.AvgPoolGradOp,
            backward_ops.ConvInputGradOp,
            backward_ops.ConvWeightGradOp,
        ),
        "a gradient op: torch runs these only inside autograd (torch.nn.grad lacks asymmetric "
        "padding)",
    ),  # fmt: skip
}


register = registrar(TORCH, "torch")


def _function(op_class: type[NodeOp], fn: Callable[..., Any]) -> None:
    """An op that is `fn(torch, *args)`."""
    register(op_class)(lambda t, node, args, record: fn(t, *args))


for _op, _fn in (
    (ops.AddOp, lambda t, a, b: t.add(a, b)),
    (ops.SubOp, lambda t, a, b: t.sub(a, b)),
    (ops.MulElemOp, lambda t, a, b: t.mul(a, b)),
    (ops.MaxElemOp, lambda t, a, b: t.maximum(a, b)),
    (ops.MinElemOp, lambda t, a, b: t.minimum(a, b)),
    (ops.AbsOp, lambda t, x: t.abs(x)),
    (ops.SqrtOp, lambda t, x: t.sqrt(x)),
    (ops.ReluOp, lambda t, x: t.nn.functional.relu(x)),
    (ops.TanhOp, lambda t, x: t.tanh(x)),
    (ops.SigmoidOp, lambda t, x: t.sigmoid(x)),
    # F.softplus switches to the identity above a threshold; logaddexp is the exact stable form.
    (ops.SoftplusOp, lambda t, x: t.logaddexp(x, t.zeros_like(x))),
    (ops.ExpOp, lambda t, x: t.exp(x)),
    (ops.InvOp, lambda t, x: t.reciprocal(x)),
    (ops.SinOp, lambda t, x: t.sin(x)),
    (ops.CosOp, lambda t, x: t.cos(x)),
    (backward_ops.SignOp, lambda t, x: t.sign(x)),
    (ops.SafeLogOp, lambda t, x, eps: t.log(t.logaddexp(x, t.zeros_like(x)) + eps)),
    (ops.SumOp, lambda t, x: t.sum(x)),
    (ops.MatmulOp, lambda t, a, b: t.matmul(a, b)),
    (ops.FlattenOp, lambda t, x: x.reshape(-1)),
    (ops.MseLossOp, lambda t, a, b: t.nn.functional.mse_loss(a, b)),
):
    _function(_op, _fn)


@register(ops.GeluOp)
def _gelu(t: Any, node: NodeOp, args: list[Any], record: Any) -> Any:
    return t.nn.functional.gelu(args[0], approximate=node.meta("approximate"))


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
