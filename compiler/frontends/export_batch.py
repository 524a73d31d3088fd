"""ONNX export of a graph with the batch extent `N` (tlc.dialect.batch): the model's inputs and
output get the symbolic dimension `N` (`dim_param`), and shapes it computes with are computed
from the input's batch size at run time.

The exporter writes static shapes, so the graph is exported at both `PROBES` (the way the
importers find `N`, tlc.frontends.import_common.generalise_batch). The two models must be the
same nodes with the same attributes and the same initializers, except:

- graph input and output extents that are the batch size at both: `N`;
- integer shape constants (a Reshape's or an Expand's target) whose elements are equal at both
  probes or k times the batch size at both (k N: a flatten folding the batch into one axis):
  each becomes a `Concat` of its static pieces and `Mul(n, k)`, `n` the `Shape` of the input's
  batch axis.

Anything else that depends on the batch size has no ONNX form here and is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tlc.core.diagnostics import DiagnosticError, error
from tlc.dialect.ops import GraphOp


def export_with_batch(export: Callable[[int], onnx.ModelProto], graph: GraphOp) -> onnx.ModelProto:
    """The model `export(batch)` writes for `graph`, with `N` for the batch size (see the
    module doc)."""
    from tlc.dialect.batch import PROBES

    p, q = PROBES
    one, two = export(p), export(q)

    def refuse(reason: str) -> DiagnosticError:
        return error(
            f"ONNX export: graph @{graph.graph_name}: {reason}, which an ONNX shape cannot say; "
            "export it for one batch size (tlc.to_onnx(..., batch=64))",
            graph,
        )

    if list(one.graph.node) != list(two.graph.node):
        raise refuse(f"its ONNX nodes at batch size {p} and at {q} differ")
    batch_input = None
    ends = [(a, b, True) for a, b in zip(one.graph.input, two.graph.input, strict=True)]
    ends += [(a, b, False) for a, b in zip(one.graph.output, two.graph.output, strict=True)]
    for a, b, is_input in ends:
        for axis, (da, db) in enumerate(
            zip(a.type.tensor_type.shape.dim, b.type.tensor_type.shape.dim, strict=True)
        ):
            if da.dim_value == db.dim_value:
                continue
            if (da.dim_value, db.dim_value) != (p, q):
                raise refuse(f"'{a.name}' has extent {da.dim_value} at batch size {p} but "
                             f"{db.dim_value} at {q}")  # fmt: skip
            da.dim_param = "N"
            if batch_input is None and is_input:
                batch_input = (a.name, axis)
    others = {t.name: t for t in two.graph.initializer}
    kept, computed = [], []
    for tensor in one.graph.initializer:
        x, y = numpy_helper.to_array(tensor), numpy_helper.to_array(others[tensor.name])
        if x.shape == y.shape and np.array_equal(x, y):
            kept.append(tensor)
            continue
        if (
            x.dtype != np.int64
            or x.ndim != 1
            or x.shape != y.shape
            or np.any((x != y) & (q * x != p * y))
        ):
            raise refuse(f"the constant '{tensor.name}' depends on the batch size")
        computed.append((tensor.name, x, y))
    if computed and batch_input is None:
        raise refuse("a shape depends on the batch size but no input has it")
    nodes: list[onnx.NodeProto] = []
    if computed:
        assert batch_input is not None
        input_name, axis = batch_input
        nodes.append(helper.make_node("Shape", [input_name], ["batch_size"], name="batch_size",
                                      start=axis, end=axis + 1))  # fmt: skip
    for tensor_name, x, y in computed:
        pieces: list[str] = []
        static: list[int] = []  # the run of static elements before the next k N
        for i, (a, b) in enumerate([*zip(x.tolist(), y.tolist(), strict=True), (None, None)]):
            if a == b and a is not None:
                static.append(a)
                continue
            if static:
                pieces.append(f"{tensor_name}_{i}_static")
                kept.append(numpy_helper.from_array(np.array(static, np.int64), pieces[-1]))
                static = []
            if a is None:
                break
            if a == p:
                pieces.append("batch_size")
                continue
            factor = f"{tensor_name}_{i}_factor"
            kept.append(numpy_helper.from_array(np.array([a // p], np.int64), factor))
            pieces.append(f"{tensor_name}_{i}_n")
            nodes.append(helper.make_node("Mul", ["batch_size", factor], [pieces[-1]],
                                          name=pieces[-1]))  # fmt: skip
        nodes.append(helper.make_node("Concat", pieces, [tensor_name], name=tensor_name, axis=0))
    del one.graph.initializer[:]
    one.graph.initializer.extend(kept)
    body = list(one.graph.node)
    del one.graph.node[:]
    one.graph.node.extend(nodes + body)
    onnx.checker.check_model(one, full_check=True)
    return one
