"""Shared libraries: tlc-compile, the C header and ABI from a real C program, tlc.load, misuse."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen.module import pack_params
from tlc.codegen.shared_lib import build_library
from tlc.core.payload import Payload, save_npz
from tlc.dialect.payload_section import payload_from_module
from tlc.semantics.interpret import EvalError, interpret
from tlc.tools.compile import main as compile_main

ROOT = Path(__file__).parent.parent
MLP_PATH = ROOT / "examples" / "mlp.tlir"
X0 = [0.3, -0.2, 0.1, 0.4]

C_PROGRAM = r"""
#include <math.h>
#include <stdio.h>
#include "libmlp.h"

int main(void) {
    const double x[TLC_MLP_INPUT_SIZE] = {0.3, -0.2, 0.1, 0.4};
    double y[TLC_MLP_OUTPUT_SIZE];
    int64_t dims[4];
    if (tlc_mlp_input_rank() != 1 || tlc_mlp_input_shape(dims) != TLC_OK || dims[0] != 4) return 10;
    if (tlc_mlp_output_rank() != 0) return 11;
    if (tlc_mlp(NULL, y) != TLC_ERR_NULL_POINTER) return 12;
    if (tlc_mlp(x, NULL) != TLC_ERR_NULL_POINTER) return 13;
    if (tlc_mlp_input_shape(NULL) != TLC_ERR_NULL_POINTER) return 14;
    int status = tlc_mlp(x, y);
    if (status != TLC_OK) return 15;
    if (tlc_set_num_threads(3) != 3 || tlc_get_num_threads() != 3) return 17;
    if (tlc_mlp(x, y) != TLC_OK) return 18;
    if (tlc_set_num_threads(0) < 1) return 19;  /* back to the default: the CPUs available */
    printf("%.6f\n", y[0]);
    return fabs(y[0] - 0.027713) < 5e-7 ? 0 : 16;
}
"""


def compile_lib(tmp_path: Path, *args: str, name: str = "libmlp.so") -> Path:
    out = tmp_path / name
    # f64 unless `args` say otherwise (the last --dtype counts): these tests check float64
    # results and headers; the f32 default is test_tlc_compile_defaults_to_f32
    assert compile_main([str(MLP_PATH), "-o", str(out), "--dtype", "f64", *args]) == 0
    return out


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_c_program_against_the_header(tmp_path: Path) -> None:
    lib = compile_lib(tmp_path)
    header = (tmp_path / "libmlp.h").read_text()
    assert "int tlc_mlp(const double *in, double *out);" in header
    (tmp_path / "main.c").write_text(C_PROGRAM)
    exe = tmp_path / "main"
    subprocess.run(
        ["cc", "-Wall", "-Werror", "-o", str(exe), str(tmp_path / "main.c"), f"-I{tmp_path}",
         f"-L{tmp_path}", "-lmlp", "-lm", f"-Wl,-rpath,{tmp_path}"],
        check=True,
    )  # fmt: skip
    done = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done
    assert done.stdout == "0.027713\n"
    assert lib.exists()


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_load_wraps_the_library(tmp_path: Path, dtype: str) -> None:
    lib = tlc.load(str(compile_lib(tmp_path, "--dtype", dtype)))
    scalar = np.float64 if dtype == "f64" else np.float32
    out = lib(np.array(X0, dtype=scalar))
    assert out.dtype == scalar and f"{float(out):.6f}" == "0.027713"


def test_load_refuses_misuse(tmp_path: Path) -> None:
    lib = tlc.load(str(compile_lib(tmp_path)))
    with pytest.raises(ValueError, match=r"tlc_mlp: input has shape \[2, 2\], expected \[4\]"):
        lib(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="tlc_mlp: out has dtype float32, expected float64"):
        lib(np.zeros(4), out=np.zeros((), dtype=np.float32))
    with pytest.raises(ValueError, match="expected \\[4\\]"):
        lib(np.zeros(3))
    with pytest.raises(KeyError, match=r"libmlp.so has no graph 'nope' \(graphs: mlp\)"):
        lib["nope"]
    with pytest.raises(KeyError, match=r"has no graph 'mpl' \(graphs: mlp\); did you mean 'mlp'\?"):
        lib["mpl"]
    raw = ctypes.CDLL(str(tmp_path / "libmlp.so")).tlc_mlp
    assert raw(None, None) == 1  # null pointers are a status, not a crash


def test_rebuilt_library_is_reloaded(tmp_path: Path) -> None:
    """The loader copies a library to a content-addressed name: a rebuild at the same path is
    not served from the dynamic loader's cache."""
    first = tlc.load(str(compile_lib(tmp_path)))(np.array(X0))
    npz = tmp_path / "p.npz"
    module = tlc.parse(MLP_PATH.read_text())
    payload = payload_from_module(module, "mlp")
    payload.records[3]["bias"] = payload.records[3]["bias"] + 1.0
    save_npz(payload, str(npz))
    second = tlc.load(str(compile_lib(tmp_path, "--payload", str(npz))))(np.array(X0))
    assert float(first) != float(second)


def test_runtime_payload(tmp_path: Path) -> None:
    lib = tlc.load(str(compile_lib(tmp_path, "--runtime-payload", "--batch", "3")))
    module = tlc.parse(MLP_PATH.read_text())
    graph = checked_graph(module)
    payload = payload_from_module(module, "mlp")
    xs = np.random.default_rng(0).normal(size=(3, 4))
    params = pack_params(graph, payload)
    assert params.shape == (43,)
    expected = [interpret(graph, payload, x).output for x in xs]
    np.testing.assert_allclose(lib(xs, params), expected, rtol=1e-12)
    doubled = Payload({nid: {k: 2 * v for k, v in rec.items()} for nid, rec in payload.items()})
    expected2 = [interpret(graph, doubled, x).output for x in xs]
    np.testing.assert_allclose(lib(xs, pack_params(graph, doubled)), expected2, rtol=1e-12)
    with pytest.raises(ValueError, match="takes its parameters at call time"):
        lib(xs)
    with pytest.raises(ValueError, match=r"params has shape \[4\], expected \[43\]"):
        lib(xs, np.zeros(4))


LOG_DOC = """
tl.graph @lg {
  %0 = input : [2]
  %1 = log(%0) : [2]
  output %1
}
"""


def test_library_log_domain_status(tmp_path: Path) -> None:
    module = tlc.parse(LOG_DOC)
    graph = checked_graph(module)
    built = build_library([(graph, None)], str(tmp_path / "liblg.so"))
    lib = tlc.load(built.library)
    np.testing.assert_allclose(lib(np.array([1.0, np.e])), [0.0, 1.0])
    with pytest.raises(EvalError, match="IR eval: log: input contains values <= 0"):
        lib(np.array([1.0, -1.0]))
    raw = ctypes.CDLL(built.library).tlc_lg
    x, y = (ctypes.c_double * 2)(1.0, 0.0), (ctypes.c_double * 2)()
    assert raw(x, y) == 2  # TLC_ERR_LOG_DOMAIN


def test_compile_tool_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_main([str(MLP_PATH), "-o", str(tmp_path / "x.dylib")]) == 1
    assert "must end in .so" in capsys.readouterr().err
    assert compile_main([str(MLP_PATH), "-o", str(tmp_path / "l.so"), "--graph", "@zz"]) == 1
    assert "no graph named @zz" in capsys.readouterr().err
    assert compile_main([str(MLP_PATH), "-o", str(tmp_path / "l.so"), "--batch", "0"]) == 2


CONV_DOC = """
tl.graph @c {
  %0 = input : [2, 3, 6, 6]
  %1 = conv(%0) {kernel = [3, 3], padding = [1, 1], channel_axis = 1, in_channels = 3, out_channels = 4} : [2, 4, 6, 6]
  %2 = layernorm(%1) {axis = 2} : [2, 4, 6, 6]
  output %2
}
"""  # noqa: E501


def test_runtime_payload_with_scratch_and_defaults() -> None:
    """A conv (which needs scratch) and a layernorm without a record (defaults packed)."""
    from tlc.codegen.jit import compile_graph

    graph = checked_graph(tlc.parse(CONV_DOC))
    rng = np.random.default_rng(0)
    payload = Payload({1: {"weight": rng.normal(size=(4, 3, 3, 3)), "bias": rng.normal(size=4)}})
    x = rng.normal(size=(2, 3, 6, 6))
    f = compile_graph(graph, None, np.float64, runtime_payload=True)
    assert f.params_size == 4 * 27 + 4 + 2 * 36 + 1
    got = f(x, pack_params(graph, payload))
    np.testing.assert_allclose(got, interpret(graph, payload, x).output, rtol=1e-12, atol=1e-13)


def test_load_reads_the_librarys_own_metadata_without_a_header(tmp_path: Path) -> None:
    lib_path = compile_lib(tmp_path, "--dtype", "f32")
    (tmp_path / "libmlp.h").unlink()
    lib = tlc.load(lib_path)
    assert repr(lib) == f"<tlc.Library {lib_path}:\n  <compiled @mlp: [4] -> [], float32>>"
    raw = ctypes.CDLL(str(lib_path))
    text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(raw, "tlc_library")))
    assert json.loads(text) == {
        "format": 2,
        "graphs": [
            {"graph": "mlp", "symbol": "tlc_mlp", "dtype": "float32", "input_shape": [4],
             "output_shape": [], "params_size": None},
        ],
    }  # fmt: skip
    out = np.empty((), np.float32)
    assert lib(np.array(X0), out=out) is out  # out= on the library itself; f64 input cast
    assert f"{float(out):.6f}" == "0.027713"


def test_inputs_to_a_library_are_cast_by_the_apis_rule(tmp_path: Path) -> None:
    lib = tlc.load(str(compile_lib(tmp_path)))  # f64
    torch = pytest.importorskip("torch")
    given = [
        X0,
        np.array(X0, np.float32),
        torch.tensor(X0, dtype=torch.float64, requires_grad=True),
    ]
    values = [lib(x) for x in given]
    assert all(v.dtype == np.float64 for v in values)
    assert values[1] == lib(np.array(X0, np.float32).astype(np.float64))  # widened exactly
    assert values[0] == values[2]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_library_without_tlc_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other.c").write_text("int f(void) { return 0; }\n")
    other = tmp_path / "libother.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", other, tmp_path / "other.c"], check=True)
    message = (
        f"cannot load '{other}': it holds no tlc metadata of format 2 (the tlc_library symbol); "
        "rebuild it with this tlc's tlc-compile"
    )
    with pytest.raises(tlc.DiagnosticError, match=f"^{re.escape(message)}$"):
        tlc.load(other)


def test_a_graph_named_library_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "lib.tlir"
    source.write_text("tl.graph @library {\n  %0 = input : [1]\n  output %0\n}\n")
    assert compile_main([str(source), "-o", str(tmp_path / "liblib.so")]) == 1
    assert (
        "lib.tlir:1:1: error: codegen: graph name @library is reserved: tlc_library is the "
        "library's metadata; rename the graph"
    ) in capsys.readouterr().err


def test_tlc_compile_defaults_to_f32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Compiled code computes in float32 unless asked (tlc-compile, tlc-run --backend llvm,
    tlc.compile alike); the reference and --grad stay float64."""
    from tlc.tools.run import main as run_main

    out = tmp_path / "libmlp.so"
    assert compile_main([str(MLP_PATH), "-o", str(out)]) == 0
    assert "int tlc_mlp(const float *in, float *out);" in out.with_suffix(".h").read_text()
    assert repr(tlc.load(out)).endswith("<compiled @mlp: [4] -> [], float32>>")
    assert tlc.compile(MLP_PATH).dtype == np.float32
    printed = {}
    for name, flags in {
        "llvm": ["--backend", "llvm"],
        "llvm f32": ["--backend", "llvm", "--arithmetic", "f32"],
        "reference": [],
        "reference f32": ["--arithmetic", "f32"],
    }.items():
        capsys.readouterr()
        assert (
            run_main([str(MLP_PATH), "--input", "0.3,-0.2,0.1,0.4", "--digits", "12", *flags]) == 0
        )
        printed[name] = capsys.readouterr().out
    assert printed["llvm"] == printed["llvm f32"] == printed["reference f32"]
    assert printed["reference"] != printed["reference f32"]  # f64 by default: 12 digits tell


def _retyped(metadata: dict, **fields: object) -> dict:
    """`metadata` with its graph's `fields` changed (and a null params_size left out, which
    reads the same, to leave room for the edit in the library's text)."""
    (entry,) = metadata["graphs"]
    entry = {**entry, **fields}
    if entry["params_size"] is None:
        del entry["params_size"]
    return {**metadata, "graphs": [entry]}


#: Metadata edited after the build (issue 14: a forged or inconsistent `tlc_library`) and what
#: `tlc.load` says: the wrapper sizes its checks by the metadata, so a description that is not
#: the code's would let a call read or write past the buffers.
FORGED = [
    (lambda m: _retyped(m, input_shape=[1]),
     "does not describe its code (tlc_mlp: input shape [1] in the metadata, [4] in the code)"),
    (lambda m: _retyped(m, output_shape=[9]),
     "does not describe its code (tlc_mlp: output shape [9] in the metadata, rank 0 in the "
     "code)"),
    (lambda m: _retyped(m, dtype="float32"),
     "does not describe its code (tlc_mlp: dtype float32 in the metadata, 8-byte scalars in the "
     "code)"),
    (lambda m: _retyped(m, params_size=43),
     "does not describe its code (tlc_mlp: params size 43 in the metadata, None in the code)"),
    (lambda m: _retyped(m, symbol="tlc_gone"),
     "does not describe its code (it has no function tlc_gone_cpu_check)"),
    (lambda m: _retyped(m, symbol="_handle"),
     "does not describe its code (it has no function _handle_cpu_check)"),
    (lambda m: _retyped(m, input_shape=[-4]), "is malformed (input_shape is not a list of "
     "extents)"),
    (lambda m: _retyped(m, dtype="float128"), "is malformed (tlc_mlp: dtype 'float128' is not "
     "float32 or float64)"),
    (lambda m: _retyped(m, params_size=True), "is malformed (tlc_mlp: params_size True is not a "
     "size)"),
    (lambda m: {**m, "graphs": [7]}, "is malformed (a graph is not described by an object)"),
    (lambda m: {**m, "graphs": {}}, None),
    (lambda m: {**m, "graphs": []}, "is malformed (it describes no graph)"),
    (lambda m: '{"format": 2', None),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "detail"), FORGED)
def test_load_refuses_metadata_that_does_not_describe_the_code(
    tmp_path: Path, edit: object, detail: str | None
) -> None:
    from tlc.tools.fuzz import forge_metadata

    built = compile_lib(tmp_path)
    forged = forge_metadata(built.read_bytes(), edit)  # type: ignore[arg-type]
    assert forged is not None
    path = tmp_path / "libforged.so"
    path.write_bytes(forged)
    if detail is None:
        message = (
            f"cannot load '{path}': it holds no tlc metadata of format 2 (the tlc_library "
            "symbol); rebuild it with this tlc's tlc-compile"
        )
    else:
        message = (
            f"cannot load '{path}': its tlc_library metadata {detail}; rebuild it with this "
            "tlc's tlc-compile"
        )
    with pytest.raises(tlc.DiagnosticError, match=f"^{re.escape(message)}$"):
        tlc.load(path)
    assert tlc.load(built)(X0) == tlc.load(built)(X0)  # the unedited library still loads
