"""The few `tl` ops that gradient graphs need and the forward ops cannot express.

The `grad` pass (tlc.passes.grad) writes a graph's reverse pass in the tl dialect. Most of it is
composed from forward ops (a linear layer's input gradient is a `linear` with the transposed
weight, a reduction's is a `broadcast_to`, a concat's is a 0/1 `linear` selection); what remains
is here, each op with its shape rule like any other node op:

- `sign`: -1, 0 or 1 per element (0 at 0). relu' is relu(sign(x)), abs' is sign(x) and the
  max/min tie split is (1 + sign(a - b)) / 2, so one op gives every piecewise-constant mask.
- `gelu_grad`: the derivative of `gelu`, in either form (the exact form needs erf).
- `max_pool_grad(x, g)`: scatters each window's cotangent to the window's first maximum.
- `avg_pool_grad(g)`: spreads each window's cotangent evenly over the window (zero padding counts).
- `conv_input_grad(g, w)` and `conv_weight_grad(x, g)`: the transposed convolutions; the kernel
  is a parent (a `const` in gradient graphs), so no new op reads the payload.

These ops are forward-only: their own derivatives (second order) are not provided.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition

from tlc.dialect import minmax
from tlc.dialect.families import Monotone, NodeOp, OnnxSpelling, PoolOp, TorchSpelling, UnaryOp
from tlc.dialect.metadata import Field, Kind
from tlc.dialect.ops import ConvOp
from tlc.dialect.shapes import Shape, ShapeError, fmt_shape


@irdl_op_definition
class SignOp(UnaryOp):
    """`%1 = sign(%0)` — -1 where x < 0, 0 where x = 0, 1 where x > 0."""

    name = "tl.sign"
    ONNX = OnnxSpelling("Sign")
    TORCH = TorchSpelling(functions=("torch.sign",), methods=("sign",))
    MONOTONE = Monotone.INCREASING
    numpy = staticmethod(minmax.sign)


@irdl_op_definition
class GeluGradOp(UnaryOp):
    """`%1 = gelu_grad(%0) {approximate = "tanh"}` — d gelu / dx in the same form as `gelu`."""

    name = "tl.gelu_grad"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("approximate", Kind.STR, "none", ("none", "tanh")),
    )


def _expect(tag: str, what: str, got: Shape, expected: Shape) -> None:
    if got != expected:
        raise ShapeError(
            f"{tag}: {what} shape mismatch: expected {fmt_shape(expected)}, got {fmt_shape(got)}"
        )


@irdl_op_definition
class MaxPoolGradOp(PoolOp):
    """`%3 = max_pool_grad(%0, %2) {kernel = [2, 2]}` — x and the pooled cotangent -> dx.

    Each output cotangent goes to the first maximum of its window in row-major window order
    (PyTorch's choice); overlapping windows accumulate.
    """

    name = "tl.max_pool_grad"
    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, parents: list[Shape]) -> Shape:
        x, g = parents
        _expect(self.TAG, "cotangent", g, PoolOp.infer(self, [x]))
        return x


@irdl_op_definition
class AvgPoolGradOp(PoolOp):
    """`%2 = avg_pool_grad(%1) {kernel = [2, 2]} : [1, 4, 4]` — the pooled cotangent -> dx.

    The declared shape is the pooled input's; the cotangent must be its pooled shape.
    """

    name = "tl.avg_pool_grad"

    def infer(self, parents: list[Shape]) -> Shape:
        x = self.require_declared()
        _expect(self.TAG, "cotangent", parents[0], PoolOp.infer(self, [x]))
        return x


class ConvGradOp(NodeOp):
    """Convolution gradients: the conv's configuration fields, two parents."""

    ARITY: ClassVar[tuple[int, int | None]] = (2, 2)
    FIELDS: ClassVar[tuple[Field, ...]] = ConvOp.FIELDS

    kernel_shape = ConvOp.kernel_shape


@irdl_op_definition
class ConvInputGradOp(ConvGradOp):
    """`%4 = conv_input_grad(%3, %2) {kernel = [3], in_channels = 2, out_channels = 4} : [2, 8]`
    — the cotangent of a conv's output and its kernel -> the cotangent of its input, whose
    shape is declared."""

    name = "tl.conv_input_grad"

    def infer(self, parents: list[Shape]) -> Shape:
        g, w = parents
        x = self.require_declared()
        _expect(self.TAG, "cotangent", g, ConvOp.infer(self, [x]))
        _expect(self.TAG, "kernel", w, self.kernel_shape())
        return x


@irdl_op_definition
class ConvWeightGradOp(ConvGradOp):
    """`%4 = conv_weight_grad(%0, %3) {kernel = [3], in_channels = 2, out_channels = 4}` — a
    conv's input and output cotangent -> the cotangent of its kernel [out, in/groups, k...]."""

    name = "tl.conv_weight_grad"

    def infer(self, parents: list[Shape]) -> Shape:
        x, g = parents
        _expect(self.TAG, "cotangent", g, ConvOp.infer(self, [x]))
        return self.kernel_shape()


BACKWARD_OPS: tuple[type[NodeOp], ...] = (
    SignOp,
    GeluGradOp,
    MaxPoolGradOp,
    AvgPoolGradOp,
    ConvInputGradOp,
    ConvWeightGradOp,
)
