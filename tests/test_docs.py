"""Every command and snippet the README and docs/ show runs, and prints what they say it prints.

A fenced block is run according to what it holds:

- a shell session (lines `$ command`, continued with a trailing `\\`, each followed by what it
  prints, stdout and stderr as a terminal shows them): each command runs under bash and its
  output must match, with doctest's `...` standing for any text (a timing, a path);
- a Python session (`>>> ` prompts): run by doctest, outputs checked the same way (runs of
  whitespace compare equal: a long repr may be wrapped on the page);
- ```python without prompts: executed; ```sh: run by `bash -e` (output not shown, not checked);
- anything else is text, a grammar, C or IR shown for reading, and must say so with a language
  tag (```text, ```tlir, ```c, ```mlir, ```asm): an untagged block that is not a session fails.

A block preceded by `<!-- norun: REASON -->` is skipped; only the installation commands carry it
(they are what `.ci/run` itself runs before this test, and the test command would recurse), and
long runs whose work a named test already does (the reason names it).

Blocks run in a scratch directory holding links to the repository's `examples/`, `tests/` and
`bench/`, so `examples/mlp.tlir` resolves and files a command writes (`-o libmlp.so`) land in the
scratch directory; the blocks of one file share it and run in order, as a reader would.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import toolserver

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(<!-- norun: [^>]+ -->\n)?```(\w*)\n(.*?)^```$", re.M | re.S)
READ_ONLY = {"text", "tlir", "c", "mlir", "asm", "llvm"}
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    body: str
    norun: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(path, text.count("\n", 0, m.start(2)) + 1, m.group(2), m.group(3), bool(m.group(1)))
        for m in FENCE.finditer(text)
    ]


def scratch(tmp_path: Path) -> Path:
    for name in ("examples", "tests", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def environment() -> dict[str, str]:
    """This interpreter's scripts first on PATH, so the tools are the ones under test; before
    them the tool server's (tests/toolserver.py: each tool command a fork of one process that
    has imported the tools; TLC_FRESH_TOOLS=1 runs each as a new process)."""
    bin_dir = os.path.dirname(sys.executable)
    path = os.pathsep.join([*toolserver.commands(), bin_dir, os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path}


def session(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a `$ ` session."""
    pairs: list[tuple[str, list[str]]] = []
    lines = iter(body.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):  # bash reads the backslash-newline as a continuation
                command += "\n" + next(lines, "")
            pairs.append((command, []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(command, "\n".join(out).rstrip() + "\n") for command, out in pairs]


def run_session(block: Block, cwd: Path) -> None:
    for command, want in session(block.body):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # interleaved, as a terminal shows them
            text=True,
            timeout=600,
        )
        got = "\n".join(line.rstrip() for line in done.stdout.splitlines())
        got = got.rstrip() + "\n"
        assert "Traceback" not in got or "Traceback" in want, f"{block.where}: $ {command}\n{got}"
        if not CHECKER.check_output(want, got, FLAGS):
            pytest.fail(
                f"{block.where}: $ {command}\n--- the doc shows:\n{want}--- it prints:\n{got}",
                pytrace=False,
            )


def run_block(block: Block, cwd: Path, namespace: dict[str, object]) -> None:
    if block.lang in READ_ONLY or block.norun:
        return
    if block.body.startswith("$ "):
        run_session(block, cwd)
    elif ">>> " in block.body:
        test = doctest.DocTestParser().get_doctest(
            block.body, namespace, block.where, str(block.path), block.line
        )
        # Python reprs are wrapped on the page; the shells' carets are not, so only here
        runner = doctest.DocTestRunner(optionflags=FLAGS | doctest.NORMALIZE_WHITESPACE)
        out: list[str] = []
        runner.run(test, out=out.append, clear_globs=False)
        namespace.update(test.globs)  # doctest ran on a copy; the page's next block continues it
        if runner.failures:
            pytest.fail("".join(out), pytrace=False)
    elif block.lang == "python":
        exec(compile(block.body, block.where, "exec"), namespace)  # noqa: S102 (the docs' own code)
    elif block.lang == "sh":
        done = subprocess.run(
            ["bash", "-e", "-c", block.body],
            cwd=cwd,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode == 0, f"{block.where}:\n{done.stdout}{done.stderr}"
    else:
        pytest.fail(
            f"{block.where}: a ```{block.lang} block that is neither a `$ ` session nor a `>>> ` "
            f"one: tag it ({', '.join(sorted(READ_ONLY))}) if it is only to be read",
            pytrace=False,
        )


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = scratch(tmp_path)
    monkeypatch.chdir(cwd)
    namespace: dict[str, object] = {"__name__": "__doc__"}
    for block in blocks(path):
        run_block(block, cwd, namespace)


def test_shipped_onnx_model_is_what_its_script_writes(tmp_path: Path) -> None:
    """examples/mlp.onnx (imported by the README) is reproducible from examples/mlp.tlir."""
    onnx = pytest.importorskip("onnx")
    out = tmp_path / "mlp.onnx"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_mlp_onnx.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    shipped = onnx.load(str(ROOT / "examples" / "mlp.onnx"))
    assert onnx.load(str(out)).SerializeToString() == shipped.SerializeToString()
