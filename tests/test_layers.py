"""The layering contracts of pyproject.toml's [tool.importlinter], checked with import-linter.

tlc's subpackages live in several top-level folders joined by setuptools' `package-dir`, which
import-linter's module discovery (one folder per package) cannot follow; the test copies the
sources into the package layout `tlc/...` in a temporary folder and lints that copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _package_layout(target: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in config["package-dir"].items():
        dest = target.joinpath(*package.split("."))
        shutil.copytree(ROOT / folder, dest, dirs_exist_ok=True, ignore=_not_python)


def _not_python(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not (n.endswith(".py") or os.path.isdir(os.path.join(folder, n)))]


def test_layers_and_no_cycles(tmp_path: Path) -> None:
    _package_layout(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout
