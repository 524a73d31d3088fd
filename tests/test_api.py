"""The Python API as a user meets it: what a document may be (text, a path, a module, a traced
graph), one `dtype` keyword, one input-casting rule, and errors that read like the tools'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tlc
from tlc.core.diagnostics import DiagnosticError

ROOT = Path(__file__).parent.parent
MLP_PATH = ROOT / "examples" / "mlp.tlir"
X0 = [0.3, -0.2, 0.1, 0.4]
MLP_OUT = 0.027712902180357324
TOOLS = ("tlc-opt", "tlc-run", "tlc-translate", "tlc-compile", "tlc-verify")


@pytest.mark.parametrize("source", [str(MLP_PATH), MLP_PATH, MLP_PATH.read_text()])
def test_a_document_is_text_or_a_path(source: object) -> None:
    assert float(tlc.run(source, X0).output) == pytest.approx(MLP_OUT, abs=1e-15)


def test_a_missing_path_is_a_diagnostic_naming_it() -> None:
    with pytest.raises(
        DiagnosticError, match=r"^cannot read 'nope.tlir': No such file or directory$"
    ):
        tlc.run("nope.tlir", X0)


def test_a_traced_graph_is_accepted_wherever_a_document_is() -> None:
    traced = tlc.trace(lambda ops, x, params: ops.relu(x), [3])
    assert tlc.run(traced, [1.0, -2.0, 3.0]).output.tolist() == [1.0, 0.0, 3.0]
    boxes = tlc.ibp(traced, [1.0, -2.0, 3.0], 0.5)
    assert boxes[-1].hi.tolist() == pytest.approx([1.5, 0.0, 3.5])
    assert tlc.compile(traced)(np.array([1.0, -2.0, 3.0])).tolist() == [1.0, 0.0, 3.0]


def test_from_torch_result_runs_with_its_payload() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.tensor([X0])
    traced = tlc.from_torch(model, x)
    expected = model(x).detach().numpy()
    assert np.allclose(tlc.run(traced, x).output, expected, atol=1e-6)


def test_str_of_a_diagnostic_has_location_line_and_caret() -> None:
    source = "tl.graph @g {\n  %0 = input : [4]\n  %1 = sigmod(%0)\n  output %1\n}\n"
    with pytest.raises(DiagnosticError) as exc:
        tlc.run(source, X0)
    assert str(exc.value) == (
        "<string>:3:8: error: unknown op kind 'sigmod'; did you mean 'sigmoid'?\n"
        "  %1 = sigmod(%0)\n"
        "       ^"
    )


def test_str_of_a_shape_error_in_a_file_quotes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.tlir"
    path.write_text("tl.graph @g {\n  %0 = input : [4]\n  %1 = matmul(%0, %0)\n  output %1\n}\n")
    with pytest.raises(DiagnosticError) as exc:
        tlc.run(path, X0)
    assert str(exc.value) == (
        f"{path}:3:3: error: matmul: expected rank≥2 inputs, got [4] and [4]\n"
        "  %1 = matmul(%0, %0)\n"
        "  ^"
    )


@pytest.mark.parametrize("dtype", ["f32", np.float32, np.dtype("float32")])
def test_one_dtype_keyword_names_f32_three_ways(dtype: object) -> None:
    assert tlc.run(MLP_PATH, X0, dtype=dtype).output.dtype == np.float32
    assert tlc.compile(MLP_PATH, dtype=dtype)(np.array(X0, dtype=np.float32)).dtype == np.float32
    assert tlc.ibp(MLP_PATH, X0, 0.01, dtype=dtype)[-1] is not None


def test_inputs_are_cast_by_one_rule() -> None:
    """Lists, arrays of any real dtype and torch tensors (even ones requiring grad) all run."""
    torch = pytest.importorskip("torch")
    given = [
        X0,
        np.array(X0, dtype=np.float32),
        np.array(X0, dtype=np.float64),
        torch.tensor(X0, requires_grad=True),
    ]
    outputs = [float(tlc.run(MLP_PATH, x, dtype="f32").output) for x in given]
    assert len(set(outputs)) == 1


def test_vjp_without_a_cotangent_needs_a_scalar_output() -> None:
    source = "tl.graph @g {\n  %0 = input : [4]\n  %1 = relu(%0)\n  output %1\n}\n"
    message = (
        r"tlc.vjp: the output \(node 1\) of @g has shape \[4\]; pass a cotangent of that shape "
        r"\(without one, vjp is the gradient of a scalar output\)"
    )
    with pytest.raises(ValueError, match=message):
        tlc.vjp(source, None, X0)
    dx, _ = tlc.vjp(source, None, X0, np.ones(4))
    assert dx.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_choosing_a_graph_from_python_names_the_keyword() -> None:
    source = "tl.graph @a {\n  %0 = input : [1]\n  output %0\n}\n" * 1
    source += "tl.graph @b {\n  %0 = input : [1]\n  output %0\n}\n"
    with pytest.raises(
        DiagnosticError, match=r"2 graphs \(@a, @b\); choose one with graph='name'$"
    ):
        tlc.compile(source)
    with pytest.raises(DiagnosticError, match=r"no graph named @c in the document$"):
        tlc.run(source, [1.0], graph="c")
    assert tlc.run(source, [1.0], graph="b").output.tolist() == [1.0]
    with pytest.raises(DiagnosticError) as info:
        tlc.compile(ROOT / "examples" / "mlp_program.tlir")
    assert str(info.value).splitlines() == [
        f"{ROOT / 'examples' / 'mlp_program.tlir'}:4:1: error: the document holds no tl.graph, "
        "only tl.program @mlp: lower it to a graph first (tlc-opt -p lower-program; "
        "docs/programs.md)",
        "tl.program @mlp(%x: [4]) params(%W1: [5, 4], %b1: [5], %W2: [3, 5], %b2: [3]) {",
        "^",
    ]


def test_diagnostic_error_is_part_of_the_api() -> None:
    assert tlc.DiagnosticError is DiagnosticError


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert tlc.__version__ == version("tlc")


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_prints_its_version(tool: str) -> None:
    done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"{tool} {tlc.__version__}\n")


def test_python_m_tlc_lists_and_runs_the_tools() -> None:
    listing = subprocess.run([sys.executable, "-m", "tlc"], capture_output=True, text=True)
    assert listing.returncode == 0
    assert listing.stdout.startswith("usage: python -m tlc TOOL [ARGS...]")
    for tool in TOOLS:
        assert f"\n  {tool.removeprefix('tlc-'):<10} " in listing.stdout
    run = [sys.executable, "-m", "tlc", "run", str(MLP_PATH), "--input", "0.3,-0.2,0.1,0.4"]
    done = subprocess.run(run, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "node 5: 0.027713\n")
    wrong = subprocess.run([sys.executable, "-m", "tlc", "opr"], capture_output=True, text=True)
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("python -m tlc: error: no tool 'opr'; did you mean 'opt'?\n")


def test_compiled_code_defaults_to_f32_and_the_reference_to_f64() -> None:
    f = tlc.compile(MLP_PATH)
    assert repr(f) == "<compiled @mlp: [4] -> [], float32>"
    assert f(X0).dtype == np.float32
    assert tlc.run(MLP_PATH, X0).output.dtype == np.float64
    out = np.empty((), np.float32)
    assert f(np.array(X0), out=out) is out  # a float64 array into f32 code is cast
    assert tlc.compile(MLP_PATH, dtype="f64")(np.array(X0, np.float32)).dtype == np.float64


@pytest.mark.parametrize("separate", [False, True])
def test_a_saved_traced_model_runs_as_the_traced_one(tmp_path: Path, separate: bool) -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 4))

    def program(ops, x, params):  # noqa: ANN001, ANN202
        return ops.tanh(ops.linear(x, params["w"], params["b"]))

    traced = tlc.trace(program, [4], {"w": weight, "b": rng.normal(size=3)})
    path = tmp_path / "model.tlir"
    npz = tmp_path / "model.npz" if separate else None
    traced.save(path, npz)
    saved = tlc.run(path, X0, npz).output
    assert saved.tolist() == tlc.run(traced, X0).output.tolist()  # bit for bit
    assert ("tl.payload" in path.read_text()) is not separate


def test_saving_to_an_unwritable_path_is_a_diagnostic(tmp_path: Path) -> None:
    traced = tlc.trace(lambda ops, x, params: ops.relu(x), [3])
    target = tmp_path / "missing" / "m.tlir"
    with pytest.raises(
        DiagnosticError, match=f"^cannot write '{target}': No such file or directory$"
    ):
        traced.save(target)
