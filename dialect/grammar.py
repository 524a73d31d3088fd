"""The .tlir grammar and its LALR tables, shipped inside the package.

Building the LALR tables from `tlir.lark` takes about 50 ms, a tenth of a tool's start-up.
Lark's own `cache=True` saves that by pickling the tables into the shared temp directory and
un-pickling them at every start, so anyone who can write there (a planted
`/tmp/.lark_cache_*.tmp`) runs code as the user. Instead the tables are JSON data in
`tlir_tables.json`, generated from the grammar and committed beside it: nothing is read from
outside the package and nothing is un-pickled. (JSON rather than a Python literal: it loads in
about a millisecond, where a 120 kB literal module costs 30 ms to compile wherever bytecode is
not cached.)

The tables carry a key (a hash of the grammar text and the Lark version). When it does not
match, because the grammar was edited or another Lark version is installed, the parser is
built from the grammar instead, which is slower but always right; a test checks that the
shipped tables are current. Regenerate them with `python -m tlc.dialect.grammar`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

#: Modules Lark imports at start-up when they are installed, none of which a parser built from
#: the shipped tables uses: `regex` (only with `Lark(regex=True)`), `atomicwrites` (only to
#: write `cache=True` files) and `interegular` (which checks terminal collisions on every lexer
#: build, a diagnostic for grammar authors: `python -m tlc.dialect.grammar` runs it). Importing
#: them cost tlc-opt about 40 ms of its 0.4 s start-up.
LARK_OPTIONAL = ("regex", "atomicwrites", "interegular")


@contextmanager
def _absent(names: tuple[str, ...]) -> Iterator[None]:
    """Imports inside the block see the modules `names` as not installed (unless they are
    imported already); afterwards they import normally again."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # Python's "not importable" mark
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


if __name__ == "__main__":
    import lark  # the generator checks the grammar with everything Lark offers
else:
    with _absent(LARK_OPTIONAL):
        import lark
from lark import Lark  # noqa: E402
from lark.grammar import Rule  # noqa: E402
from lark.lexer import TerminalDef  # noqa: E402

#: Keyword arguments of every tlc .tlir parser (part of the tables' key).
OPTIONS = {"parser": "lalr", "propagate_positions": True, "maybe_placeholders": True}
TABLES = "tlir_tables.json"


def grammar_text() -> str:
    return files("tlc.dialect").joinpath("tlir.lark").read_text(encoding="utf-8")


def tables_key(grammar: str) -> str:
    """What the shipped tables were built from: grammar text, Lark version and options."""
    text = f"{grammar}\0{lark.__version__}\0{sorted(OPTIONS.items())}"
    return hashlib.sha256(text.encode()).hexdigest()


def build_parser() -> Lark:
    """The .tlir parser: from the shipped tables when they are current, else from the grammar."""
    grammar = grammar_text()
    tables = json.loads(
        files("tlc.dialect").joinpath(TABLES).read_text(encoding="utf-8"), object_hook=_int_keys
    )
    if tables["key"] == tables_key(grammar):
        return Lark._load_from_dict(tables["data"], tables["memo"])
    return Lark(grammar, **OPTIONS)


def tables_json(grammar: str) -> str:
    """The text of `tlir_tables.json` for this grammar."""
    data, memo = Lark(grammar, **OPTIONS).memo_serialize([TerminalDef, Rule])
    tables = {"key": tables_key(grammar), "data": data, "memo": memo}
    return json.dumps(_tag_int_keys(tables), separators=(",", ":"), sort_keys=True) + "\n"


#: JSON object keys are strings; Lark's tables have int-keyed dicts (states, memo ids), which
#: are written as `{INT_KEYS: [[key, value], ...]}`.
INT_KEYS = "<int-keys>"


def _tag_int_keys(value: Any) -> Any:
    if isinstance(value, dict):
        if any(isinstance(key, int) for key in value):
            return {INT_KEYS: [[key, _tag_int_keys(item)] for key, item in value.items()]}
        return {key: _tag_int_keys(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_tag_int_keys(item) for item in value]
    return value


def _int_keys(obj: dict[str, Any]) -> dict[Any, Any]:
    if len(obj) == 1 and INT_KEYS in obj:
        return {key: item for key, item in obj[INT_KEYS]}
    return obj


def main() -> None:
    """Write `tlir_tables.json` next to this module (run after editing tlir.lark)."""
    target = Path(__file__).with_name(TABLES)
    target.write_text(tables_json(grammar_text()), encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
