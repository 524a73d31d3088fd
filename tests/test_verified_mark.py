"""A verified graph is trusted (tlc.dialect.verify): once checked, its shapes are read from its
mark by every entry point; graphs never verified, rewritten or edited in place are checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

import tlc
from tlc.core.diagnostics import DiagnosticError
from tlc.dialect import verify
from tlc.dialect.ops import GraphOp
from tlc.dialect.payload_section import payload_from_module
from tlc.frontends.text import context, parse_source
from tlc.passes.registry import build_pipeline
from tlc.semantics.autodiff.modes import jvp, vjp
from tlc.semantics.ibp import prepare_ibp
from tlc.semantics.interpret import interpret
from tlc.semantics.payload_check import check_payload

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X = np.array([0.3, -0.2, 0.1, 0.4])


def _parsed(pipeline: str = "") -> tuple[ModuleOp, GraphOp]:
    module = parse_source(MLP, "mlp.tlir")
    for pass_ in build_pipeline(pipeline) if pipeline else []:
        pass_.apply(context(), module)
    return module, next(op for op in module.ops if isinstance(op, GraphOp))


def test_entry_points_read_the_shapes_of_a_verified_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After verify-structure and infer-shapes no entry point infers shapes again."""
    entries = {
        "interpret": lambda m, g, p: interpret(g, p, X),
        "prepare_ibp": lambda m, g, p: prepare_ibp(g, p),
        "jvp": lambda m, g, p: jvp(g, p, X, np.ones(4)),
        "vjp": lambda m, g, p: vjp(g, p, X),
        "check_payload": lambda m, g, p: check_payload(g, p),
        "to_onnx": lambda m, g, p: tlc.to_onnx(m),
        "grad": lambda m, g, p: build_pipeline("grad")[0].apply(context(), m),
        "tlc.run": lambda m, g, p: tlc.run(m, X),
        "tlc.vjp": lambda m, g, p: tlc.vjp(m, None, X),
    }
    modules = {name: _parsed("verify-structure,infer-shapes") for name in entries}

    def inferred(graph: GraphOp) -> list:
        raise AssertionError(f"@{graph.graph_name} was inferred again")

    monkeypatch.setattr(verify, "infer_graph_shapes", inferred)
    for name, entry in entries.items():
        module, graph = modules[name]
        entry(module, graph, payload_from_module(module, graph.graph_name))


def test_a_graph_never_verified_is_checked_once_and_marked() -> None:
    module, graph = _parsed()
    assert verify.verified_shapes(graph) is None
    shapes = verify.graph_shapes(graph)
    assert shapes == [(4,), (5,), (5,), (3,), (), ()]
    assert verify.verified_shapes(graph) == tuple(shapes)
    assert verify.verified_shapes(graph.clone()) is None  # a copy is checked afresh


def test_an_edit_in_place_is_checked_after_forget_verified() -> None:
    """A verified graph edited so that a declared shape is wrong: trusted while marked (the
    editor's duty is `forget_verified`), reported at the node once the mark is dropped."""
    module, graph = _parsed("verify-structure,infer-shapes")
    node = graph.nodes[2]
    node.set_declared_shape((6,))
    assert verify.graph_shapes(graph)[2] == (5,)
    verify.forget_verified(graph)
    with pytest.raises(DiagnosticError) as info:
        interpret(graph, payload_from_module(module, graph.graph_name), X)
    assert str(info.value.diagnostics[0].message) == (
        "IR graph: node 2: outShape mismatch: inferred=[5], declared=[6] "
        "(Node(id=2, kind=relu, parents=#[1], outShape=[6]))"
    )


def test_rewriting_passes_output_graphs_without_the_mark() -> None:
    """decompose and grad build new graph ops: what they output is verified afresh."""
    module, graph = _parsed("verify-structure,infer-shapes")
    build_pipeline("grad")[0].apply(context(), module)
    grad = next(g for g in module.ops if isinstance(g, GraphOp) and g.graph_name == "mlp_grad")
    assert verify.verified_shapes(graph) is not None
    assert verify.verified_shapes(grad) is None
    leaky = parse_source(
        "tl.graph @g {\n  %0 = input : [3]\n  %1 = leaky_relu(%0) : [3]\n  output %1\n}\n", "g"
    )
    for pass_ in build_pipeline("verify-structure,infer-shapes,decompose"):
        pass_.apply(context(), leaky)
    (rewritten,) = [g for g in leaky.ops if isinstance(g, GraphOp)]
    assert [n.TAG for n in rewritten.nodes] == ["input", "const", "mul_elem", "max_elem"]
    assert verify.verified_shapes(rewritten) is None
