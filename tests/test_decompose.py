"""The decompose pass (docs/tlc-opt.md): a decomposed graph computes what the op computes.

leaky_relu's decomposition, max_elem(x, s*x) for s <= 1 and min_elem(x, s*x) above, selects
exactly the value the op's numpy fact computes (x, or the rounded product x*s), so the
decomposed graph agrees with the reference bit for bit in f64 and f32: for a positive slope on
every input (signed zeros, infinities, NaN, subnormals); for a slope <= 0 on every input but
+inf (0 * inf is NaN, which max_elem propagates) and +0 (a negative slope makes s * +0 = -0, and
max_elem(+0, -0) is +0 where the op gives -0).
"""

from __future__ import annotations

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import checked_graph
from tlc.dialect import ops
from tlc.dialect.payload_section import payload_from_module
from tlc.passes.decompose import decompose_graph
from tlc.semantics.interpret import interpret

GRAPH = """
tl.graph @g {{
  %0 = input : [{n}]
  %1 = leaky_relu(%0) {{negative_slope = {slope}}}
  %2 = tanh(%1)
  %3 = leaky_relu(%2) {{negative_slope = {slope}}}
  output %3
}}
"""


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, -1e-310, 3e38, -3e38]


def inputs(n: int, dtype: type, special: list[float]) -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([special, rng.normal(scale=3, size=n - len(special))]).astype(dtype)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint64 if x.dtype == np.float64 else np.uint32)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize(
    ("slope", "special"),
    [(s, SPECIAL) for s in (0.2, 1.5, 1.0, 0.01)]
    + [(s, [v for v in SPECIAL if not (v == np.inf or (v == 0 and np.copysign(1, v) > 0))])
       for s in (0.0, -0.5)],
)  # fmt: skip
def test_decomposed_graph_matches_the_reference_bit_for_bit(
    dtype: type, slope: float, special: list[float]
) -> None:
    n = 64
    module = tlc.parse(GRAPH.format(n=n, slope=slope))
    graph = checked_graph(module)
    done = decompose_graph(graph, payload_from_module(module, "g"))
    assert done is not None
    decomposed, payload = done
    assert not any(isinstance(node, ops.LeakyReluOp) for node in decomposed.nodes)
    assert [node.id for node in decomposed.nodes] == list(range(len(decomposed.nodes)))
    x = inputs(n, dtype, special)
    expected = interpret(graph, None, x, dtype).output
    got = interpret(decomposed, payload, x, dtype).output
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(bits(got), bits(expected))


def test_only_chosen_ops_are_decomposed() -> None:
    module = tlc.parse(GRAPH.format(n=4, slope=0.5))
    graph = checked_graph(module)
    assert decompose_graph(graph, None, lambda op_class: op_class is not ops.LeakyReluOp) is None
