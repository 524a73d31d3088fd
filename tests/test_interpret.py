"""The reference denotation through its Python API: the seed's value table, payload checks,
the float32 context, random sources, and the failures the seed specifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import as_module, select_graph
from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import Payload
from tlc.dialect.ops import GraphOp
from tlc.dialect.payload_section import payload_from_module
from tlc.dialect.registry import NODE_OPS
from tlc.semantics.interpret import REFERENCE, EvalError, check_payload, interpret

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X0 = [0.3, -0.2, 0.1, 0.4]
SEED_TABLE = [
    "[0.300000, -0.200000, 0.100000, 0.400000]",
    "[0.107000, -0.017000, 0.004000, 0.081000, -0.003000]",
    "[0.107000, 0.000000, 0.004000, 0.081000, 0.000000]",
    "[0.027540, -0.014730, 0.014910]",
    "0.027720",
    "0.027713",
]


def _six(value: np.ndarray) -> str:
    if value.ndim == 0:
        return f"{float(value):.6f}"
    return "[" + ", ".join(f"{v:.6f}" for v in value) + "]"


def _mlp() -> tuple[GraphOp, Payload]:
    module = as_module(MLP, "mlp.tlir")
    return select_graph(module), payload_from_module(module, "mlp")


def _message(exc: pytest.ExceptionInfo[DiagnosticError]) -> str:
    return exc.value.diagnostics[0].message


def test_every_op_has_a_reference_rule() -> None:
    assert set(NODE_OPS) <= set(REFERENCE)


@pytest.mark.parametrize("arithmetic", ["f64", "f32"])
def test_seed_value_table(arithmetic: str) -> None:
    table = tlc.run(MLP, X0, dtype=arithmetic)
    assert [_six(v) for v in table.values] == SEED_TABLE
    assert table.output_id == 5
    dtype = np.float64 if arithmetic == "f64" else np.float32
    assert all(v.dtype == dtype for v in table.values)


def test_f32_rounds_at_every_step() -> None:
    """sum([1e8, 1, -1e8]) is 0 in float32 arithmetic but 1 if computed in f64 and rounded."""
    source = "tl.graph @g {\n  %0 = input : [3]\n  %1 = sum(%0) : []\n  output %1\n}\n"
    assert float(tlc.run(source, [1e8, 1, -1e8], dtype="f32").output) == 0.0
    assert float(tlc.run(source, [1e8, 1, -1e8], dtype="f64").output) == 1.0


def test_swapped_linear_records() -> None:
    graph, payload = _mlp()
    payload.records[1], payload.records[3] = payload.records[3], payload.records[1]
    with pytest.raises(EvalError) as exc:
        check_payload(graph, payload)
    assert _message(exc) == "IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]"
    assert exc.value.diagnostics[0].location is not None
    assert exc.value.diagnostics[0].location.line == 4


def test_missing_record() -> None:
    graph, payload = _mlp()
    del payload.records[1]
    with pytest.raises(EvalError) as exc:
        interpret(graph, payload, np.array(X0))
    assert _message(exc) == "IR eval: missing linear payload for node 1"


def test_weight_in_dim_mismatch() -> None:
    graph, payload = _mlp()
    payload.records[1]["weight"] = np.zeros((5, 3))
    with pytest.raises(EvalError) as exc:
        check_payload(graph, payload)
    assert _message(exc) == (
        "IR eval: linear 1: weight shape [5, 3] does not match input shape [4] (in-dim 3 vs 4)"
    )


def test_npz_payload_round_trip(tmp_path: Path) -> None:
    from tlc.core.payload import save_npz

    _, payload = _mlp()
    path = tmp_path / "p.npz"
    save_npz(payload, str(path))
    table = tlc.run(MLP, X0, payload=str(path))
    assert _six(table.output) == "0.027713"


def test_log_of_non_positive_fails() -> None:
    source = "tl.graph @g {\n  %0 = input : [2]\n  %1 = log(%0) : [2]\n  output %1\n}\n"
    for bad in ([1.0, 0.0], [1.0, float("nan")], [-1.0, 2.0]):
        with pytest.raises(EvalError) as exc:
            tlc.run(source, bad)
        assert _message(exc) == (
            "IR eval: log: input contains values <= 0 (or NaN); "
            "use `safe_log` if you want epsilon protection"
        )
    np.testing.assert_allclose(tlc.run(source, [1.0, np.e]).output, [0.0, 1.0])


RANDOM = """tl.graph @g {
  %0 = rand_uniform {seed = 7} : [1000]
  %1 = input : []
  %2 = bernoulli_mask(%1) {seed = 7} : [1000]
  output %2
}
"""


@pytest.mark.parametrize("arithmetic", ["f64", "f32"])
def test_random_sources_are_deterministic(arithmetic: str) -> None:
    a = tlc.run(RANDOM, 0.25, dtype=arithmetic)
    b = tlc.run(RANDOM, 0.25, dtype=arithmetic)
    uniform, mask = a.values[0], a.values[2]
    np.testing.assert_array_equal(uniform, b.values[0])
    assert ((uniform >= 0) & (uniform < 1)).all()
    expected = np.random.Generator(np.random.PCG64(7)).random(1000)
    np.testing.assert_allclose(uniform, expected, rtol=1e-7)
    np.testing.assert_array_equal(mask, (uniform < 0.25).astype(uniform.dtype))
    assert 0.2 < mask.mean() < 0.3


def test_several_inputs() -> None:
    source = """tl.graph @g {
  %0 = input : [2]
  %1 = input : [2]
  %2 = sub(%0, %1) : [2]
  output %2
}
"""
    module = as_module(source)
    graph = select_graph(module)
    pair = [np.array([1.0, 2.0]), np.array([0.5, 0.5])]
    np.testing.assert_array_equal(interpret(graph, None, pair).output, [0.5, 1.5])
    by_id = {0: [1.0, 2.0], 1: [3.0, 3.0]}
    np.testing.assert_array_equal(tlc.run(module, by_id).output, [-2.0, -1.0])
    with pytest.raises(EvalError) as exc:
        interpret(graph, None, np.array([1.0, 2.0]))
    assert "has 2 input nodes" in _message(exc)


def test_input_shape_is_checked() -> None:
    graph, payload = _mlp()
    with pytest.raises(EvalError) as exc:
        interpret(graph, payload, np.zeros(3))
    assert _message(exc) == "IR eval: input 0: shape mismatch: given [3], declared [4]"


def test_unknown_dtype_is_a_usage_error() -> None:
    with pytest.raises(
        ValueError, match=r"dtype must be 'f64' or 'f32' \(or numpy.float64/float32\), got 'f16'"
    ):
        tlc.run(MLP, X0, dtype="f16")


def test_arithmetic_keyword_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="arithmetic= keyword is deprecated; use dtype="):
        table = tlc.run(MLP, X0, arithmetic="f32")
    assert table.output.dtype == np.float32


def test_omitted_shapes_are_inferred_before_running() -> None:
    source = """tl.graph @g {
  %0 = input : [1, 4, 4]
  %1 = max_pool(%0) {kernel = [2, 2]}
  %2 = avg_pool(%1) {kernel = [2, 2]}
  output %2
}
"""
    x = np.arange(16.0).reshape(1, 4, 4)
    assert tlc.run(source, x).output.tolist() == [[[10.0]]]


def test_produced_shape_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that returned the wrong shape is caught at its node, not passed downstream."""
    from tlc.dialect.ops import ReluOp

    monkeypatch.setitem(REFERENCE._rules, ReluOp, lambda node, args, record, dtype: args[0][:3])
    graph, payload = _mlp()
    with pytest.raises(EvalError) as exc:
        interpret(graph, payload, np.array(X0))
    assert _message(exc) == (
        "IR eval: node 2: produced shape mismatch: produced=[3], declared=[5] "
        "(Node(id=2, kind=relu, parents=#[1], outShape=[5]))"
    )


def test_tool_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tlc.tools.run import main

    path = tmp_path / "mlp.tlir"
    path.write_text(MLP)
    assert main([str(path), "--input", "0.3,-0.2,0.1,0.4"]) == 0
    assert capsys.readouterr().out == "node 5: 0.027713\n"
    assert main([str(path), "--input", "0.3,-0.2,0.1"]) == 1
    assert main([str(path), "--input", "1,2,3,4", "--arithmetic", "f16"]) == 2
    assert "invalid choice: 'f16'" in capsys.readouterr().err


def test_format_value() -> None:
    from tlc.tools.formatting import format_value

    assert format_value(np.array(0.02772)) == "0.027720"
    assert format_value(np.array([[1.0, -2.5]])) == "[[1.000000, -2.500000]]"
    assert format_value(np.array([1e300, np.inf, np.nan])) == "[1.000000e+300, inf, nan]"
    assert format_value(np.array(1 / 3), digits=3) == "0.333"
