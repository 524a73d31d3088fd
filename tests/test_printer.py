"""Printers: .tlir print -> parse -> print is the identity on random well-formed graphs (with and
without declared shapes, with payloads), the MLIR generic form reads back to the same module,
and the listing and dot printers keep the seed's formats.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.dialect.ops import GraphOp
from tlc.dialect.printer import print_dot, print_listing, print_mlir_op, print_tlir
from tlc.dialect.shapes import Shape, fmt_shape
from tlc.dialect.verify import infer_graph_shapes
from tlc.frontends.text import context, parse_source
from tlc.passes.infer_shapes import InferShapesPass

ROOT = Path(__file__).parent.parent

dims = st.integers(min_value=1, max_value=4)
shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)
UNARY = ["relu", "tanh", "exp", "abs", "sigmoid", "detach", "sin", "softplus", "gelu"]
BINARY = ["add", "sub", "mul_elem", "max_elem", "min_elem"]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[str, list[Shape]]:
    """A well-formed graph as .tlir text, and the shape of every node.

    Each node is drawn from a family whose shape rule the generator satisfies by construction;
    each declared shape is printed or left out at random.
    """
    name = draw(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True))
    lines: list[str] = []
    node_shapes: list[Shape] = []

    def add(text: str, shape: Shape, must_declare: bool = False) -> None:
        declare = must_declare or draw(st.booleans())
        node = f"%{len(node_shapes)} = {text}" + (f" : {fmt_shape(shape)}" if declare else "")
        lines.append(node)
        node_shapes.append(shape)

    add("input", draw(shapes), must_declare=True)
    for _ in range(draw(st.integers(0, 8))):
        i = draw(st.integers(0, len(node_shapes) - 1))
        s = node_shapes[i]
        kind = draw(st.sampled_from(["unary", "binary", "axis", "reduce", "sum", "permute",
                                     "concat", "reshape", "linear", "const", "input"]))  # fmt: skip
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            extra = ' {approximate = "tanh"}' if op == "gelu" and draw(st.booleans()) else ""
            add(f"{op}(%{i}){extra}", s)
        elif kind == "binary":
            same = [j for j, t in enumerate(node_shapes) if t == s]
            add(f"{draw(st.sampled_from(BINARY))}(%{i}, %{draw(st.sampled_from(same))})", s)
        elif kind == "axis" and s:
            op = draw(st.sampled_from(["softmax", "log_softmax", "layernorm"]))
            add(f"{op}(%{i}) {{axis = {draw(st.integers(0, len(s) - 1))}}}", s)
        elif kind == "reduce" and s:
            axis = draw(st.integers(0, len(s) - 1))
            op = draw(st.sampled_from(["reduce_sum", "reduce_mean"]))
            add(f"{op}(%{i}) {{axis = {axis}}}", s[:axis] + s[axis + 1 :])
        elif kind == "permute":
            perm = draw(st.permutations(range(len(s))))
            add(f"permute(%{i}) {{perm = {list(perm)}}}", tuple(s[p] for p in perm))
        elif kind == "concat" and s:
            axis = draw(st.integers(0, len(s) - 1))
            out = s[:axis] + (2 * s[axis],) + s[axis + 1 :]
            add(f"concat(%{i}, %{i}) {{axis = {axis}}}", out)
        elif kind == "reshape":
            n = 1
            for d in s:
                n *= d
            add(f"reshape(%{i}) {{from = {list(s)}, to = [{n}]}}", (n,))
        elif kind == "linear" and s:
            add(f"linear(%{i})", s[:-1] + (draw(dims),), must_declare=True)
        elif kind == "const":
            value_shape = draw(shapes)
            add(f"const {{shape = {list(value_shape)}}}", value_shape)
        elif kind == "input":
            add("input", draw(shapes), must_declare=True)
        else:
            add(f"sum(%{i})", ())
    output = draw(st.integers(0, len(node_shapes) - 1))
    body = "".join(f"  {line}\n" for line in lines)
    text = f"tl.graph @{name} {{\n{body}  output %{output}\n}}\n"
    return text, node_shapes


floats = st.floats(allow_nan=False, width=64)


@st.composite
def payloads(draw: st.DrawFn, name: str) -> str:
    records = []
    for node in sorted(draw(st.sets(st.integers(0, 9), max_size=3))):
        rows, cols = draw(dims), draw(dims)
        weight = [[draw(floats) for _ in range(cols)] for _ in range(rows)]
        bias = [draw(floats) for _ in range(rows)]
        records.append(f"  %{node} = linear {{weight = {weight}, bias = {bias}}}\n")
    return f"tl.payload @{name} {{\n{''.join(records)}}}\n"


def _the_graph(module: object) -> GraphOp:
    return next(op for op in module.ops if isinstance(op, GraphOp))  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(graphs(), st.data())
def test_print_parse_print_is_identity(graph: tuple[str, list[Shape]], data: st.DataObject) -> None:
    text, node_shapes = graph
    name = text.split("@", 1)[1].split(" ", 1)[0]
    text += data.draw(payloads(name))
    module = parse_source(text, "g.tlir")
    printed = print_tlir(module)
    again = parse_source(printed, "printed.tlir")
    assert print_tlir(again) == printed
    # The MLIR generic form reads back to the same module too.
    mlir = print_mlir_op(module)
    assert print_mlir_op(parse_source(mlir, "g.mlir")) == mlir
    # The generator's shapes are the shape rules' (so the graphs really are well-formed).
    assert infer_graph_shapes(_the_graph(again)) == node_shapes


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_inferred_module_prints_every_shape(graph: tuple[str, list[Shape]]) -> None:
    text, node_shapes = graph
    module = parse_source(text, "g.tlir")
    InferShapesPass().apply(context(), module)
    printed = print_tlir(module)
    for i, shape in enumerate(node_shapes):
        assert any(
            line.strip().startswith(f"%{i} = ") and line.endswith(f" : {fmt_shape(shape)}")
            for line in printed.splitlines()
        ), (i, printed)
    assert print_tlir(parse_source(printed, "p.tlir")) == printed


def test_float_payload_values_print_exactly() -> None:
    """Shortest round-tripping decimals in .tlir; exact in the MLIR form too (see the printer)."""
    values = [0.1, -2.5e-300, 1e308, float("inf"), float("-inf"), 1 / 3, 0.0]
    text = f"tl.payload @g {{\n  %0 = const {{value = {values}}}\n}}\n"
    printed = print_tlir(parse_source(text, "p.tlir"))
    assert printed == "tl.payload @g {\n  %0 = const {value = " + (
        "[0.1, -2.5e-300, 1e+308, inf, -inf, 0.3333333333333333, 0.0]}\n}\n"
    )
    module = parse_source(printed, "p.tlir")
    mlir = print_mlir_op(module)
    assert print_tlir(parse_source(mlir, "p.mlir")) == printed


def test_listing_and_dot_of_the_seed_mlp() -> None:
    module = parse_source((ROOT / "examples" / "mlp.tlir").read_text(), "mlp.tlir")
    graph = _the_graph(module)
    assert print_listing(graph).splitlines()[1] == "1: linear(payload=node_id) parents=[0] out=[5]"
    assert print_listing(graph).splitlines()[2] == "2: relu parents=[1] out=[5]"
    dot = print_dot(graph)
    assert dot.startswith("digraph IR {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n")
    assert '  n4 [label="4: sum\\nout=[]"];\n' in dot and "  n4 -> n5;\n" in dot
