"""Nothing is loaded from a place another user can write: the parser tables, `tlc.load`'s copy;
compiled entry points refuse `out` buffers they cannot safely write (issue 14)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from lark import Lark

import tlc
from tlc.core.diagnostics import DiagnosticError
from tlc.core.payload import save_npz
from tlc.dialect import grammar
from tlc.dialect.payload_section import payload_from_module
from tlc.tools.compile import main as compile_main

ROOT = Path(__file__).parent.parent
MLP_PATH = ROOT / "examples" / "mlp.tlir"
X0 = np.array([0.3, -0.2, 0.1, 0.4])
MLP_AT_X0 = "0.027713"
TLC_OPT = str(Path(sys.executable).parent / "tlc-opt")


class _MakeDirectory:
    """A pickle that, when loaded, creates a directory: the witness that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def test_shipped_parser_tables_are_current() -> None:
    """`tlir_tables.json` must be regenerated after editing tlir.lark
    (`python -m tlc.dialect.grammar`); otherwise every start builds the tables again. The
    shipped parser and one built from the grammar agree on every example."""
    shipped = json.loads((ROOT / "dialect" / grammar.TABLES).read_text(encoding="utf-8"))
    assert shipped["key"] == grammar.tables_key(grammar.grammar_text())
    fresh = Lark(grammar.grammar_text(), **grammar.OPTIONS)
    for example in sorted((ROOT / "examples").glob("*.tlir")):
        text = example.read_text()
        assert grammar.build_parser().parse(text) == fresh.parse(text), example


def test_planted_lark_cache_is_not_unpickled(tmp_path: Path) -> None:
    """The reproducer: Lark(cache=True) un-pickled `$TMPDIR/.lark_cache_<user>_<sha>_*.tmp`.
    Let Lark write its cache file exactly as the old parser did, replace it with a pickle that
    runs code, and run a tool: the pickle must not be loaded."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    tempfile.tempdir = None
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path)
    try:
        Lark(grammar.grammar_text(), **grammar.OPTIONS, cache=True)
    finally:
        os.environ.pop("TMPDIR") if old is None else os.environ.update(TMPDIR=old)
        tempfile.tempdir = None
    (cache,) = tmp_path.glob(".lark_cache_*.tmp")
    witness = tmp_path / "code-ran"
    header = cache.read_bytes().split(b"\n", 1)[0] + b"\n"
    cache.write_bytes(header + pickle.dumps(_MakeDirectory(str(witness))))
    done = subprocess.run(
        [TLC_OPT, str(MLP_PATH), "-p", "verify-structure"],
        env=env, capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tl.graph @mlp" in done.stdout
    assert not witness.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache.name]  # and nothing written


def _compile(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "libmlp.so"
    # f64 unless `args` say otherwise (the last --dtype counts), as these tests' values are
    assert compile_main([str(MLP_PATH), "-o", str(out), "--dtype", "f64", *args]) == 0
    return out


def test_planted_library_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproducer: `tlc.load` copied to `$TMPDIR/tlc-load-<sha16>/<name>` and reused any
    file already there. Plant another library (other weights) at that path: the load must run
    the library it was given, and leave no copy behind."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    build = tmp_path / "build"
    planted = tmp_path / "planted"
    build.mkdir()
    planted.mkdir()
    module = tlc.parse(MLP_PATH.read_text())
    payload = payload_from_module(module, "mlp")
    payload.records[3]["bias"] = payload.records[3]["bias"] + 1.0
    save_npz(payload, str(planted / "p.npz"))
    planted_lib = _compile(planted, "--payload", str(planted / "p.npz"))
    genuine = _compile(build)
    digest = hashlib.sha256(genuine.read_bytes()).hexdigest()[:16]
    trap = shared / f"tlc-load-{digest}"
    trap.mkdir()
    (trap / "libmlp.so").write_bytes(planted_lib.read_bytes())
    assert f"{float(tlc.load(str(genuine))(X0)):.6f}" == MLP_AT_X0
    assert sorted(p.name for p in shared.iterdir()) == [trap.name]


def test_out_buffers_the_code_cannot_write_are_refused(tmp_path: Path) -> None:
    """The reproducer: `out=np.frombuffer(bytes(8))` was written through (immutable bytes),
    a read-only memmap segfaulted."""
    entry = tlc.load(str(_compile(tmp_path)))["mlp"]
    with pytest.raises(ValueError, match="tlc_mlp: out is read-only"):
        entry(X0, out=np.frombuffer(bytes(8)))
    np.save(tmp_path / "out.npy", np.zeros(()))
    with pytest.raises(ValueError, match="tlc_mlp: out is read-only"):
        entry(X0, out=np.load(tmp_path / "out.npy", mmap_mode="r"))
    with pytest.raises(TypeError, match="tlc_mlp: out must be a numpy array, not bytearray"):
        entry(X0, out=bytearray(8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tlc_mlp: out has dtype float32, expected float64"):
        entry(X0, out=np.zeros((), dtype=np.float32))
    with pytest.raises(ValueError, match=r"tlc_mlp: out has shape \[2\], expected \[\]"):
        entry(X0, out=np.zeros(2))
    out = np.zeros(())
    assert entry(X0, out=out) is out and f"{float(out):.6f}" == MLP_AT_X0


def test_output_over_the_element_budget_is_refused_before_allocating(tmp_path: Path) -> None:
    """Found by tlc.tools.fuzz: a `--batch 2^40` build of a graph with an empty input holds an
    8 TiB output; calling it without `out` raised numpy's MemoryError from the allocation."""
    doc = tmp_path / "empty.tlir"
    doc.write_text("tl.graph @g {\n  %0 = input : [2, 0]\n  %1 = sum(%0) : []\n  output %1\n}\n")
    lib = tmp_path / "libg.so"
    args = [str(doc), "-o", str(lib), "--batch", str(2**40), "--target-cpu", "x86-64-v2"]
    assert compile_main(args) == 0
    entry = tlc.load(str(lib))["g"]
    with pytest.raises(DiagnosticError) as info:
        entry(np.zeros((2**40, 2, 0)))
    assert info.value.diagnostics[0].message == (
        "tlc_g: output: tensor of shape [1099511627776] has 1,099,511,627,776 elements, over the "
        "element budget of 268,435,456 (set TLC_MAX_ELEMENTS to change it)"
    )


def test_output_budget_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry point computes its output's weight once, but reads the budget on every call
    (limits.max_elements): lowering it later refuses the next call, raising it lets it run."""
    entry = tlc.compile(tlc.parse(
        "tl.graph @g {\n  %0 = input : [2, 3]\n  %1 = relu(%0) : [2, 3]\n  output %1\n}\n"
    ))  # fmt: skip
    x = np.ones((2, 3))
    assert entry(x).shape == (2, 3)
    monkeypatch.setenv("TLC_MAX_ELEMENTS", "5")
    with pytest.raises(DiagnosticError, match=r"tlc_g: output: tensor of shape \[2, 3\] has 6 "):
        entry(x)
    out = np.empty((2, 3), np.float32)
    assert entry(x, out=out) is out  # a given `out` allocates nothing, so no budget applies
    monkeypatch.setenv("TLC_MAX_ELEMENTS", "6")
    assert (entry(x) == 1.0).all()


def test_llvm_backend_output_over_the_budget_is_a_diagnostic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same check under `tlc-run --backend llvm` is a diagnostic, exit 1 (found by
    tlc.tools.fuzz when the check first raised a bare LimitError)."""
    from tlc.tools.run import main as run_main

    doc = tmp_path / "bc.tlir"
    doc.write_text(
        "tl.graph @g {\n  %0 = input : [1]\n"
        "  %1 = broadcast_to(%0) {from = [1], to = [2147483648]}\n  output %1\n}\n"
    )
    assert run_main([str(doc), "--input", "0.5", "--backend", "llvm"]) == 1
    assert capsys.readouterr().err == (
        "error: tlc_g: output: tensor of shape [2147483648] has 2,147,483,648 elements, over "
        "the element budget of 268,435,456 (set TLC_MAX_ELEMENTS to change it)\n"
    )


def test_batch_beyond_64_bits_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reproducer: `--batch 100000000000000000000` wrapped at 2^64 silently. Too large for
    the row counter is a usage error (exit 2); a batch whose buffers compiled code cannot
    address is a diagnostic at the node (exit 1)."""
    out = str(tmp_path / "lib.so")
    assert compile_main([str(MLP_PATH), "-o", out, "--batch", "100000000000000000000"]) == 2
    assert "batch size 100000000000000000000 is too large (at most 2^62)" in capsys.readouterr().err
    assert compile_main([str(MLP_PATH), "-o", out, "--batch", str(2**61), "--dtype", "f64"]) == 1
    assert (
        "mlp.tlir:3:3: error: codegen: node 0: 73,786,976,294,838,206,464 bytes is more than "
        "compiled code can address" in capsys.readouterr().err
    )


def test_no_parser_uses_lark_temp_cache() -> None:
    """Every Lark parser in the package (the .tlir tables above, VNN-LIB's) is built without
    `cache=True`, which un-pickles from the shared temp directory."""
    for package in ("compiler", "dialect", "passes", "codegen", "tools"):
        for source in (ROOT / package).rglob("*.py"):
            code = source.read_text(encoding="utf-8")
            assert not re.search(r"Lark\([^)]*cache\s*=\s*True", code, re.S), source
