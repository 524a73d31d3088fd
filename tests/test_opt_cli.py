"""tlc-opt's exit-code contract (0 ok, 1 diagnostics, 2 usage, 70 internal error) and the paths
lit cannot reach: a missing `dot`, an internal error on purpose, notes in --verify-diagnostics.

`main(argv)` runs in-process (the console script is the same function).
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.core.diagnostics import Diagnostic, Location
from tlc.passes.infer_shapes import InferShapesPass
from tlc.tools import opt
from tlc.tools.verify_diagnostics import check_expectations

GOOD = "tl.graph @g {\n  %0 = input : [2, 3]\n  %1 = softmax(%0) {axis = 1}\n  output %1\n}\n"
BAD = GOOD.replace("axis = 1", "axis = 2")


@pytest.fixture
def good(tmp_path: Path) -> str:
    path = tmp_path / "good.tlir"
    path.write_text(GOOD)
    return str(path)


@pytest.fixture
def bad(tmp_path: Path) -> str:
    path = tmp_path / "bad.tlir"
    path.write_text(BAD)
    return str(path)


def test_success_is_0(good: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert opt.main([good, "-p", "infer-shapes"]) == 0
    assert "%1 = softmax(%0) {axis = 1} : [2, 3]" in capsys.readouterr().out


def test_diagnostics_are_1(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert opt.main([bad, "-p", "infer-shapes"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:3:3: error: invalid axis 2 for rank 2\n")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "no-such-pass"], "error: 'no-such-pass' does not refer to a registered pass"),
        (["-p", "infer-shapes{x=1}"], "error: pass 'infer-shapes' has no option 'x'"),
        (["--pass-pipeline", "builtin.module(infer-shapes{"], "error: invalid pass pipeline"),
        (["/no/such/file.tlir"], "error: cannot read '/no/such/file.tlir'"),
    ],
)
def test_bad_pipelines_and_files_are_1(
    good: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argv if argv[0].startswith("/") else [good, *argv]
    assert opt.main(args) == 1
    assert capsys.readouterr().err.startswith(message)


@pytest.mark.parametrize(
    "argv",
    [
        ["-p", "verify-structure", "--infer-shapes"],
        ["-p", "verify-structure", "--pass-pipeline", "builtin.module(infer-shapes)"],
        ["--emit", "png"],
        ["--no-such-flag"],
        ["--render", "out.gif"],
        ["--render", "out.svg", "--split-input-file"],
        ["--mlir-print-debuginfo"],
    ],
)
def test_usage_errors_are_2(good: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert opt.main([good, *argv]) == 2
    assert "usage: tlc-opt" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "last_line"),
    [
        (["--emit", "lisitng"], "tlc-opt: error: argument --emit: invalid choice: 'lisitng' "
         "(choose from 'asm', 'asm-f32', 'dot', 'listing', 'llvm', 'llvm-f32', 'mlir', 'plan', "
         "'tlir'); did you mean 'listing'?"),
        (["--emitt", "listing"], "tlc-opt: error: unrecognized arguments: --emitt listing; did "
         "you mean '--emit'?"),
        (["--timming=1"], "tlc-opt: error: unrecognized arguments: --timming=1; did you mean "
         "'--timing'?"),
        (["--zzz"], "tlc-opt: error: unrecognized arguments: --zzz"),
        (["--dtype", "f64"], "tlc-opt: error: --dtype needs --emit llvm or --emit asm"),
        (["--emit", "asm-f32", "--dtype", "f64"], "tlc-opt: error: --emit asm-f32 is --emit "
         "asm --dtype f32; for f64 code use --emit asm --dtype f64"),
    ],
)  # fmt: skip
def test_usage_errors_suggest_the_close_spelling(
    good: str, argv: list[str], last_line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert opt.main([good, *argv]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == last_line


def test_internal_error_is_70(
    good: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: InferShapesPass, ctx: object, module: object) -> None:
        raise RuntimeError("deliberate")

    monkeypatch.setattr(InferShapesPass, "apply", broken)
    assert opt.main([good, "-p", "infer-shapes"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("tlc-opt: internal error (please report this):\n")
    assert "RuntimeError: deliberate" in err


def test_render_without_dot_is_1(
    good: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)  # render_dot imports shutil itself
    out = tmp_path / "g.svg"
    assert opt.main([good, "--render", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"error: cannot render '{out}': GraphViz 'dot' was not found on PATH (install graphviz)\n"
    )
    assert not out.exists()


def test_failed_run_writes_no_output_file(bad: str, tmp_path: Path) -> None:
    out = tmp_path / "out.tlir"
    assert opt.main([bad, "-p", "infer-shapes", "-o", str(out)]) == 1
    assert not out.exists()


def test_verify_diagnostics_matches_notes_and_warnings() -> None:
    text = (
        "line one\n"
        "// expected-error @+1 {{broken}}\n"
        "the op\n"
        "// expected-note @-1 {{defined here}}\n"
        "// expected-warning @above {{slow}}\n"
    )
    loc = Location("f.tlir", 3, 1)
    emitted = [
        Diagnostic("error", "it is broken", loc, [Diagnostic("note", "defined here", loc)]),
        Diagnostic("warning", "slow path", Location("f.tlir", 4, 1)),
    ]
    assert check_expectations(text, 0, "f.tlir", emitted) == []
    # The same note on the wrong line fails twice: unexpected, and expected but not produced.
    moved = [Diagnostic("error", "broken", loc, [Diagnostic("note", "defined here", None)])]
    failures = check_expectations(text.replace("// expected-warning", "//"), 0, "f.tlir", moved)
    assert [f.message for f in failures] == [
        "unexpected note: defined here",
        'expected note "defined here" was not produced',
    ]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=120), st.sampled_from([b"", GOOD.encode()]))
def test_random_bytes_exit_0_or_1_with_located_errors(data: bytes, prefix: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.tlir"
        path.write_bytes(prefix + data)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = opt.main([str(path), "-p", "verify-structure,infer-shapes"])
    assert code in (0, 1), err.getvalue()
    if code == 1:
        first = err.getvalue().splitlines()[0]
        assert re.match(rf"{re.escape(str(path))}:\d+:\d+: error: ", first), first
