"""Random networks for the bound tests and tools: ReLU MLPs as (W, b) layers and as traced
tlc graphs, written once for tests/test_crown.py and tests/test_verify.py."""

from __future__ import annotations

from typing import Any

import numpy as np

import tlc


def random_layers(sizes: list[int], seed: int, scale: float = 1.0) -> list[tuple[Any, Any]]:
    """He-scaled random (W, b) for widths `sizes` (input first)."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0, scale * np.sqrt(2 / n), (m, n)), rng.normal(0, 0.1, m))
        for n, m in zip(sizes, sizes[1:], strict=False)
    ]


def mlp(layers: list[tuple[Any, Any]], activation: str = "relu", **metadata: Any) -> Any:
    """The traced graph of x -> W_k act(... act(W_1 x + b_1) ...) + b_k (`metadata` the
    activation's, e.g. negative_slope=0.1)."""

    def program(ops: Any, x: Any, params: Any) -> Any:
        for i, (w, b) in enumerate(params):
            x = ops.linear(x, w, b)
            if i + 1 < len(params):
                x = getattr(ops, activation)(x, **metadata)
        return x

    return tlc.trace(program, (layers[0][0].shape[1],), layers, name="net")


def onnx_mlp(layers: list[tuple[Any, Any]], path: str) -> None:
    """Write the ReLU MLP as an ONNX model built with onnx.helper (MatMul, Add, Relu on a
    [1, n] float32 input), the layout of VNN-COMP's ACAS Xu networks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, weights, current = [], [], "x"
    for i, (w, b) in enumerate(layers):
        weights.append(numpy_helper.from_array(np.asarray(w.T, np.float32), f"W{i}"))
        weights.append(numpy_helper.from_array(np.asarray(b, np.float32), f"b{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"W{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
        current = f"a{i}"
        if i + 1 < len(layers):
            nodes.append(helper.make_node("Relu", [current], [f"r{i}"]))
            current = f"r{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, layers[0][0].shape[1]])]
    outputs = [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, len(layers[-1][1])])]
    graph = helper.make_graph(nodes, "net", inputs, outputs, weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def robustness_property(lo: Any, hi: Any, label: int, outputs: int) -> str:
    """VNN-LIB text: inputs in [lo, hi] and some output Y_j (j != label) >= Y_label (the
    counterexample to `label` staying the largest output)."""
    lines = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(outputs)]
    for i, (a, b) in enumerate(zip(lo, hi, strict=True)):
        lines.append(f"(assert (<= X_{i} {float(b)!r}))")
        lines.append(f"(assert (>= X_{i} {float(a)!r}))")
    others = " ".join(f"(and (>= Y_{j} Y_{label}))" for j in range(outputs) if j != label)
    lines.append(f"(assert (or {others}))")
    return "\n".join(lines) + "\n"
