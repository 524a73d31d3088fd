"""What every tlc tool shares: input/output files and the exit-code contract.

Exit codes: 0 success, 1 diagnostics (bad input), 2 usage error (argparse), 70 internal error.
A traceback reaches the user only for an internal error, never for bad input. A reader that
closes stdout early (`tlc-run ... | head`) ends the tool quietly, as CPython recommends: exit 1,
no message.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

from tlc.core.diagnostics import DiagnosticError, SourceManager, did_you_mean
from tlc.core.limits import ENV_MAX_ELEMENTS

EXIT_DIAGNOSTICS = 1
EXIT_INTERNAL = 70
EXIT_BROKEN_PIPE = 1  # what CPython itself exits with when stdout's pipe closes


def tool_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser every tool starts from: its name, the first line of its docstring,
    `--version`, and did-you-mean hints on usage errors."""
    parser = _ToolParser(prog=prog, description=(doc or "").splitlines()[0])
    parser.add_argument("--version", action=_Version, help="print tlc's version and exit")
    return parser


#: argparse's message for a value not among an option's choices (Python 3.11-3.13 wording).
INVALID_CHOICE = re.compile(r"argument \S+: invalid choice: '(.*)' \(choose from (.*)\)")


class _ToolParser(argparse.ArgumentParser):
    """argparse with the hint every "unknown X" diagnostic has: a misspelt choice
    (`--emit lisitng`) or option (`--emitt`) gets `; did you mean 'listing'?`."""

    def error(self, message: str) -> Any:
        if m := re.fullmatch(
            r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)", message
        ):
            message += did_you_mean(m.group(2), re.findall(r"'([^']*)'", m.group(3)))
        elif m := re.fullmatch(r"unrecognized arguments: (.*)", message):
            unknown = [word.split("=")[0] for word in m.group(1).split() if word.startswith("--")]
            if unknown:
                message += did_you_mean(unknown[0], self._option_string_actions)
        return super().error(message)


class _Version(argparse.Action):
    """`--version`: `tlc-opt 0.1.0`. argparse's own version action wants the string when the
    parser is built; this reads the package metadata only when asked (it costs start-up time)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        sys.stdout.write(f"{parser.prog} {version('tlc')}\n")
        parser.exit()


def glue_values(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """`--input -0.3,0.2` as `--input=-0.3,0.2`: argparse takes a value starting with `-` for
    an option unless it is one plain negative number, so a value of one of `flags` that starts
    like a negative number is attached to its flag."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        following = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in flags and NEGATIVE.match(following):
            out.append(f"{argv[i]}={following}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


NEGATIVE = re.compile(r"-[0-9.]")


def read_input(path: str) -> tuple[str, str]:
    """(name used in diagnostics, text); `-` reads stdin. Text that is not UTF-8 is an error
    located at the first bad byte."""
    from tlc.frontends.text import decode_source, read_document

    if path == "-":
        return "<stdin>", decode_source(sys.stdin.buffer.read(), "<stdin>")
    return path, read_document(path)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]; anything else is a usage error (exit 2)
    rather than a ValueError deep inside the tool (`--digits=-1`, `--digits 10**12`)."""

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 30 else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected an integer in [{low}, {high}], got '{text}'"
            )
        return value

    return parse


def write_output(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise DiagnosticError.simple(f"cannot write '{path}': {exc.strerror}") from None


#: Gen-1 collections between full collections during a tool run (CPython's default is 10).
FULL_COLLECTION_EVERY = 10_000


@contextmanager
def tool_collector() -> Iterator[None]:
    """The cyclic garbage collector's policy for a tool run: young garbage is collected as
    usual, the oldest generation is left alone.

    A tool reads one document, works on it and ends. The parser hands the module it built to
    the collector's oldest generation (tlc.dialect.parser), and with CPython's thresholds the
    first passes after it trigger a full collection that rescans the whole module for nothing:
    0.8 s of a 100,000-node graph's 4 s. During a tool run, full collections are made rare
    instead (every `FULL_COLLECTION_EVERY` gen-1 collections); the thresholds are restored
    when the run ends.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run_tool(body: Callable[[], int], prog: str, sources: SourceManager | None = None) -> int:
    """Run a tool's body, mapping diagnostics to exit 1 and anything unexpected to exit 70.
    numpy's RuntimeWarnings are not shown: NaN and infinities are values of tl's denotation
    (`mse_loss` of empty tensors is NaN, the mean of nothing, as in numpy and torch), so "Mean
    of empty slice" on stderr would only interleave numpy's source lines with the output."""
    _freeze_at_exit()
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"numpy(\.|$)")
    with tool_collector():
        return _run_tool(body, prog, sources)


def _run_tool(body: Callable[[], int], prog: str, sources: SourceManager | None) -> int:
    try:
        code = body()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except DiagnosticError as exc:
        manager = sources or SourceManager()
        for diag in exc.diagnostics:
            sys.stderr.write(manager.render(diag) + "\n")
        return EXIT_DIAGNOSTICS
    except MemoryError:
        # Sizes are checked against tlc.core.limits before allocating; this is the machine
        # running out below the budget, which is a property of the input, not a bug.
        sys.stderr.write(
            f"error: out of memory (lower {ENV_MAX_ELEMENTS} to refuse such inputs early)\n"
        )
        return EXIT_DIAGNOSTICS
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except Exception:
        sys.stderr.write(f"{prog}: internal error (please report this):\n")
        traceback.print_exc()
        return EXIT_INTERNAL


@cache
def _freeze_at_exit() -> None:
    """Have the interpreter skip its last garbage collection: at exit every object still alive
    is moved to the collector's permanent generation (`gc.freeze`), so the final collection
    does not scan the tens of thousands of objects xDSL and the op definitions created. That
    scan was a sixth of a small tlc-opt run (60 of 375 ms of CPU); nothing tlc holds needs a
    collection to be released (files are closed, temporary directories removed, by then)."""
    atexit.register(gc.freeze)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail on the closed
    pipe again (the recipe of the `signal` module's documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def is_number(text: str) -> bool:
    """Whether an option's text is one number (as opposed to a comma list or a file name)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def add_target_options(parser: argparse.ArgumentParser, default: str) -> None:
    """--target-cpu, --target-features and --target-triple, shared by tlc-compile and tlc-opt."""
    group = parser.add_argument_group("target")
    group.add_argument(
        "--target-cpu",
        metavar="CPU",
        help=f"LLVM CPU name (znver3, haswell, x86-64-v3, host ...; {default})",
    )
    group.add_argument(
        "--target-features",
        metavar="+F,-G",
        help="LLVM features to add or remove, e.g. +avx2,-avx512f",
    )
    group.add_argument(
        "--target-triple",
        metavar="TRIPLE",
        help="LLVM target triple, e.g. aarch64-linux-gnu (default: this machine)",
    )


def target_options_given(args: argparse.Namespace) -> bool:
    """Whether any --target-* option was given (only then is LLVM loaded to check them)."""
    names = ("target_cpu", "target_features", "target_triple")
    return any(getattr(args, name) is not None for name in names)
