"""tlc.core.progress: a rich bar on a terminal, one summary line (or nothing) otherwise; and the
long jobs that show it (tlc-compile, the ONNX conformance and model-set runners) stay silent on
stderr off a terminal, as in lit and pytest."""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tlc.core.progress import Progress

ROOT = Path(__file__).parent.parent


def on_a_terminal(work: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> str:
    """What `work` writes to stderr when stderr is a terminal (a pseudo-terminal, drained by a
    thread so a long bar never fills it)."""
    leader, follower = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with open(follower, "w", closefd=True) as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        work()
        tty.flush()
        monkeypatch.undo()
    reader.join(timeout=30)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_no_terminal_gives_one_summary_line() -> None:
    stream = io.StringIO()
    with Progress(3, "instances", stream) as bar:
        for note in ("a: unsat", "b: sat", "c: unknown"):
            bar.advance(note)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("instances: 3/3 in ")
    stream = io.StringIO()
    with Progress(3, "compiling", stream, summary=False) as bar:
        bar.advance("a")
    assert stream.getvalue() == ""


def test_terminal_gets_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    def work() -> None:
        with Progress(2, "instances") as bar:
            bar.advance("p0.vnnlib: unsat")
            bar.advance("p1.vnnlib: sat")

    drawn = on_a_terminal(work, monkeypatch)
    assert "2/2" in drawn and "p1.vnnlib: sat" in drawn
    assert "instances: 2/2 in" not in drawn  # the summary line is for logs only


def test_tlc_compile_shows_each_step_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tlc.tools.compile import main

    out = tmp_path / "libmlp.so"
    args = [str(ROOT / "examples" / "mlp.tlir"), "-o", str(out), "--target-cpu", "x86-64-v2"]
    assert main(args) == 0
    assert capsys.readouterr().err == f"wrote {out} and {out.with_suffix('.h')}\n"
    drawn = on_a_terminal(lambda: main(args), monkeypatch)
    assert "compiling" in drawn and "2/2" in drawn  # one graph on one target, then the link
    assert "@mlp for x86-64-v2" in drawn and "linked" in drawn
    assert drawn.rstrip().endswith(f"wrote {out} and {out.with_suffix('.h')}")


def test_conformance_runner_shows_each_case_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper

    from tlc.frontends import onnx_backend

    def case(op: str) -> SimpleNamespace:  # a node test as onnx.backend.test writes one
        node = helper.make_node(op, ["x"], ["y"])
        value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "xy"]
        model = helper.make_model(helper.make_graph([node], op, value[:1], value[1:]))
        x = np.array([-1.0, 0.0, 2.0], np.float32)
        return SimpleNamespace(model=model, data_sets=[([x], [np.abs(x)])], rtol=1e-3, atol=1e-7)

    # (the real cases take seconds to generate; tests/test_onnx_conformance.py runs them)
    cases = {"test_abs": ("Abs", case("Abs")), "test_relu": ("Relu", case("Relu"))}
    monkeypatch.setattr(onnx_backend, "node_cases", lambda: cases)
    assert [o.status for o in onnx_backend.run_all()] == ["pass", "fail"]  # relu(-1) != 1
    assert capsys.readouterr().err == ""
    drawn = on_a_terminal(onnx_backend.run_all, monkeypatch)
    assert "conformance" in drawn and "2/2" in drawn and "test_relu: fail" in drawn


def test_model_set_runner_shows_each_model_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    from tlc.tools import onnx_models

    paths = onnx_models.model_paths("pytorch-operator")[:2]
    monkeypatch.setattr(onnx_models, "model_paths", lambda collection: paths)
    names = [r.name for r in onnx_models.run_all(("pytorch-operator",))]
    assert names == [onnx_models.model_name(p) for p in paths]
    assert capsys.readouterr().err == ""
    drawn = on_a_terminal(lambda: onnx_models.run_all(("pytorch-operator",)), monkeypatch)
    assert "models" in drawn and "2/2" in drawn and f"pytorch-operator/{names[1]}" in drawn
