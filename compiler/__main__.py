"""`python -m tlc`: list the tools, or run one (`python -m tlc opt FILE ...` is `tlc-opt FILE ...`).

Useful where the console scripts are not on PATH (a venv not activated, `python -m` in CI). The
tools are the package's `tlc-*` console scripts, read from its metadata, so a new tool appears
here when pyproject.toml declares it.
"""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.metadata import distribution


def tools() -> dict[str, str]:
    """Tool name (`opt`) -> its entry point (`tlc.tools.opt:main`)."""
    return {
        ep.name.removeprefix("tlc-"): ep.value
        for ep in distribution("tlc").entry_points
        if ep.group == "console_scripts" and ep.name.startswith("tlc-")
    }


def usage(known: dict[str, str]) -> str:
    lines = ["usage: python -m tlc TOOL [ARGS...]   (TOOL ARGS is the same as tlc-TOOL ARGS)", ""]
    lines.append("tools:")
    for name, target in sorted(known.items()):
        doc = (import_module(target.partition(":")[0]).__doc__ or "").splitlines()[0]
        lines.append(f"  {name:<10} {doc.partition(': ')[2] or doc}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tlc.core.diagnostics import did_you_mean

    argv = sys.argv[1:] if argv is None else argv
    known = tools()
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage(known))
        return 0
    if argv[0] == "--version":
        sys.stdout.write(f"tlc {distribution('tlc').version}\n")
        return 0
    name = argv[0].removeprefix("tlc-")
    if name not in known:
        hint = did_you_mean(name, known)
        sys.stderr.write(f"python -m tlc: error: no tool '{argv[0]}'{hint}\n\n{usage(known)}")
        return 2
    module, _, function = known[name].partition(":")
    sys.argv = [f"tlc-{name}", *argv[1:]]  # what the console script would see
    return getattr(import_module(module), function)()


if __name__ == "__main__":
    sys.exit(main())
