"""The whole `tl` dialect: every node op kind (forward and backward) and the xDSL `Dialect`.

`tlc.dialect.ops` defines the op kinds of the graph IR and `tlc.dialect.backward_ops` the few
that gradient graphs add on top of their families; this module joins them, so every table keyed
by op kind (reference, intervals, derivatives, lowering, capsules) checks its coverage against
one `NODE_OPS`.
"""

from __future__ import annotations

from xdsl.ir import Dialect

from tlc.dialect.backward_ops import BACKWARD_OPS
from tlc.dialect.ops import FORWARD_OPS, GraphOp, NodeOp, OutputOp, PayloadOp, RecordOp
from tlc.dialect.types import TensorType, UnshapedType

NODE_OPS: tuple[type[NodeOp], ...] = FORWARD_OPS + BACKWARD_OPS

OPS_BY_TAG: dict[str, type[NodeOp]] = {op.TAG: op for op in NODE_OPS}

TL = Dialect(
    "tl",
    [*NODE_OPS, OutputOp, GraphOp, RecordOp, PayloadOp],
    [TensorType, UnshapedType],
)
