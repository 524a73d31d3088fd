"""Runs the lit suite from pytest: one pytest test per lit file, so progress shows file by file,
a failure is named by its file (with lit's output for it), and pytest's closing line counts them.
The lit process (tests/lit_runner.py) starts when collection finishes and runs beside the other
tests; each test here waits for its own file's result. `pytest -k softmax tests/test_lit.py`
runs just that lit file.
"""

from __future__ import annotations

import pytest
from lit_runner import LIT_DIR, LIT_FILES, PASSING, LitRun, lit_run_for


@pytest.fixture(scope="session")
def lit_run(request: pytest.FixtureRequest) -> LitRun:
    run = lit_run_for(request.session)
    assert run is not None, "this test is selected, so its file is"
    return run


@pytest.mark.parametrize("name", LIT_FILES)
def test_lit(name: str, lit_run: LitRun) -> None:
    status, output = lit_run.result(name)
    if status == "UNSUPPORTED":
        requires = [
            line.split("REQUIRES:", 1)[1].strip()
            for line in (LIT_DIR / name).read_text().splitlines()
            if "REQUIRES:" in line
        ]
        pytest.skip(f"lit: {name} requires {', '.join(requires) or 'a missing feature'}")
    if status not in PASSING:
        pytest.fail(f"lit: {status}: {name}\n{output}", pytrace=False)
