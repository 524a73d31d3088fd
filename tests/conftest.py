"""Test-session settings. Under CI (`CI` set, as `.ci/run`'s runner does) hypothesis draws the
same examples on every run (`derandomize`), so a submission's result does not depend on the
random draw; locally each run explores new examples.

The lit run (tests/lit_runner.py) starts as soon as collection finishes and the lit tests are
moved to the end, so the lit files run beside the other tests instead of after them.

`@pytest.mark.needs(MODULE, WHAT, EXTRA)` marks a test of an optional extra that the `test`
extra does not install (Ray: heavy, and a cluster to start). Without MODULE the test is not run
and not counted as a skip: it is deselected (pytest's closing line counts it), and the summary
says which test needs what, so nothing is left out silently."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

NOT_RUN: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(module, what, extra): runs only where the optional module imports"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        mark = item.get_closest_marker("needs")
        if mark is not None and importlib.util.find_spec(mark.args[0]) is None:
            dropped.append(item)
            NOT_RUN.append(f"{item.nodeid} needs {mark.args[1]} (pip install '{mark.args[2]}')")
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # the lit files last: lit runs from the start (pytest_collection_finish) beside the others
    items[:] = [i for i in kept if not _is_lit(i)] + [i for i in kept if _is_lit(i)]


def _is_lit(item: pytest.Item) -> bool:
    return getattr(item, "originalname", None) == "test_lit"


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    for line in NOT_RUN:
        terminalreporter.write_line(f"not run: {line}")


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        from lit_runner import lit_run_for

        lit_run_for(session)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from lit_runner import LIT_RUN

    run = session.stash.get(LIT_RUN, None)
    if run is not None:
        run.stop()
