"""VNN-LIB 1.0 properties: the input region and the unsafe output region of a network.

A property declares inputs X_0..X_{n-1} and outputs Y_0..Y_{m-1} (`declare-const ... Real`) and
asserts linear comparisons joined by `and`/`or`. It states the *counterexample*: the property
is `sat` when some input satisfying the assertions gives outputs satisfying them too. tlc reads
the conjunction of all assertions into disjunctive normal form; each disjunct (a `Case`) is a
box over X (every X_i bounded below and above, from comparisons of one input with constants)
and rows `C y + d <= 0` (or `< 0`) over Y. Comparisons mixing X and Y, or several inputs, are
outside what the verifier handles and are reported at their location, like syntax errors and
undeclared or non-contiguous variables (`file:line:col: error: ...`). The grammar is
`vnnlib.lark` beside this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from importlib.resources import files
from itertools import product

import numpy as np

import tlc.dialect.grammar  # noqa: F401  # first: it imports Lark (LARK_OPTIONAL hidden)

# isort: split
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from tlc.core.diagnostics import DiagnosticError, Location, error

#: The largest number of cases a property may expand to (`or` inside `and` multiplies).
MAX_CASES = 10_000
#: Longest variable index read (X_i, Y_i): more variables than a network could have.
MAX_INDEX_DIGITS = 18


@dataclass(frozen=True)
class Case:
    """One disjunct: inputs in [lo, hi], outputs with every row of `C y + d` <= 0 (< 0 where
    `strict`)."""

    lo: np.ndarray
    hi: np.ndarray
    C: np.ndarray
    d: np.ndarray
    strict: np.ndarray

    def holds(self, y: np.ndarray) -> bool:
        """Whether outputs `y` satisfy every row (the counterexample condition)."""
        values = self.C @ np.asarray(y, dtype=np.float64).ravel() + self.d
        return bool(np.all(np.where(self.strict, values < 0, values <= 0)))


@dataclass(frozen=True)
class Property:
    """A parsed property: how many inputs and outputs it declares, and its cases."""

    inputs: int
    outputs: int
    cases: list[Case]


@dataclass(frozen=True)
class _Linear:
    """sum coeffs[name] * name + const."""

    coeffs: dict[str, float]
    const: float

    def scaled(self, k: float) -> _Linear:
        return _Linear({n: k * c for n, c in self.coeffs.items()}, k * self.const)

    def plus(self, other: _Linear) -> _Linear:
        coeffs = dict(self.coeffs)
        for n, c in other.coeffs.items():
            coeffs[n] = coeffs.get(n, 0.0) + c
        return _Linear(coeffs, self.const + other.const)


@dataclass(frozen=True)
class _Atom:
    """expr <= 0 (< 0 when strict), at `where`."""

    expr: _Linear
    strict: bool
    where: Location


def _quotient(a: float, b: float, up: bool) -> float:
    """a / b, moved one step outward (up or down) only when the division is inexact: the box
    holds the property's inputs, and is exactly the stated box in the usual case b = +-1."""
    q = a / b
    if Fraction(q) * Fraction(b) == Fraction(a):
        return q
    return float(np.nextafter(q, np.inf if up else -np.inf))


@cache
def _lark() -> Lark:
    grammar = files("tlc.frontends").joinpath("vnnlib.lark").read_text()
    # No cache=True: Lark would un-pickle its tables from the shared temp directory
    # (docs/security.md); this grammar is small enough to build at each use.
    return Lark(grammar, parser="lalr", propagate_positions=True)


def parse_vnnlib(text: str, filename: str = "<string>") -> Property:
    """Parse VNN-LIB text into a `Property`; located diagnostics for anything it cannot read."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, filename) from None
    return _Reader(filename).read(tree)


def _syntax_error(exc: UnexpectedInput, text: str, filename: str) -> DiagnosticError:
    if isinstance(exc, UnexpectedEOF):
        lines = text.splitlines() or [""]
        return error("unexpected end of file: an unclosed '('",
                     Location(filename, len(lines), len(lines[-1]) + 1))  # fmt: skip
    where = Location(filename, exc.line, exc.column)
    if isinstance(exc, UnexpectedCharacters):
        return error(f"unexpected character {text[exc.pos_in_stream]!r}", where)
    token = getattr(exc, "token", None)
    if token is None or token.type == "$END":
        return error("unexpected end of file: an unclosed '('", where)
    return error(f"unexpected {str(token)!r}", where)


class _Reader:
    def __init__(self, filename: str):
        self.filename = filename
        self.declared: dict[str, Location] = {}

    def at(self, item: Tree | Token) -> Location:
        if isinstance(item, Token):
            return Location(self.filename, item.line or 1, item.column or 1)
        return Location(self.filename, item.meta.line, item.meta.column)

    def read(self, tree: Tree) -> Property:
        formulas: list[Tree] = []
        for command in tree.children:
            if command.data == "declare":
                name = command.children[0]
                if name in self.declared:
                    raise error(f"'{name}' is declared twice", self.at(name))
                if len(name) - 2 > MAX_INDEX_DIGITS:  # int() refuses over 4,300 digits
                    raise error(f"variable index of {len(name) - 2} digits is too long "
                                f"(at most {MAX_INDEX_DIGITS})", self.at(name))  # fmt: skip
                self.declared[str(name)] = self.at(name)
            else:
                formulas.append(command.children[0])
        inputs, outputs = self._count("X"), self._count("Y")
        cases: list[list[_Atom]] = [[]]
        for formula in formulas:
            alternatives = self.dnf(formula)
            if len(cases) * len(alternatives) > MAX_CASES:
                raise error(f"the property expands to more than {MAX_CASES} cases",
                            self.at(formula))  # fmt: skip
            cases = [a + b for a, b in product(cases, alternatives)]
        where = self.at(formulas[0]) if formulas else Location(self.filename, 1, 1)
        return Property(inputs, outputs, [self._case(c, inputs, outputs, where) for c in cases])

    def _count(self, prefix: str) -> int:
        indices = sorted(int(n[2:]) for n in self.declared if n.startswith(prefix))
        for expected, got in enumerate(indices):
            if got != expected:
                name = f"{prefix}_{got}"
                raise error(f"'{name}' is declared but '{prefix}_{expected}' is not: variables "
                            "are numbered from 0 without gaps", self.declared[name])  # fmt: skip
        return len(indices)

    def dnf(self, formula: Tree) -> list[list[_Atom]]:
        """The formula as a list of conjunctions of atoms."""
        if formula.data == "compare":
            return [self.atoms(formula)]
        parts = [self.dnf(child) for child in formula.children]
        if formula.data == "disj":
            return [conj for part in parts for conj in part]
        out: list[list[_Atom]] = [[]]
        for part in parts:
            if len(out) * len(part) > MAX_CASES:
                raise error(f"the property expands to more than {MAX_CASES} cases",
                            self.at(formula))  # fmt: skip
            out = [a + b for a, b in product(out, part)]
        return out

    def atoms(self, compare: Tree) -> list[_Atom]:
        op, left, right = compare.children
        a, b = self.term(left), self.term(right)
        where = self.at(compare)
        if op in ("<=", "<"):
            return [_Atom(a.plus(b.scaled(-1)), op == "<", where)]
        if op in (">=", ">"):
            return [_Atom(b.plus(a.scaled(-1)), op == ">", where)]
        return [
            _Atom(a.plus(b.scaled(-1)), False, where),
            _Atom(b.plus(a.scaled(-1)), False, where),
        ]

    def term(self, term: Tree) -> _Linear:
        kind, children = term.data, term.children
        if kind == "num":
            value = float(children[0])
            if not math.isfinite(value):  # e.g. 10^400: bounds are float64 numbers
                shown = str(children[0]) if len(children[0]) <= 40 else f"{children[0][:20]}..."
                raise error(f"number {shown} is out of float64 range", self.at(children[0]))
            return _Linear({}, value)
        if kind == "var":
            name = str(children[0])
            if name not in self.declared:
                raise error(f"'{name}' is not declared (declare-const {name} Real)",
                            self.at(children[0]))  # fmt: skip
            return _Linear({name: 1.0}, 0.0)
        parts = [self.term(c) for c in children]
        if kind == "plus":
            total = parts[0]
            for p in parts[1:]:
                total = total.plus(p)
            return total
        if kind == "minus":
            if len(parts) == 1:
                return parts[0].scaled(-1)
            total = parts[0]
            for p in parts[1:]:
                total = total.plus(p.scaled(-1))
            return total
        result = parts[0]
        for p in parts[1:]:
            if result.coeffs and p.coeffs:
                raise error("a product of two variables is not linear", self.at(term))
            result = p.scaled(result.const) if not result.coeffs else result.scaled(p.const)
        return result

    def _case(self, atoms: list[_Atom], inputs: int, outputs: int, where: Location) -> Case:
        lo, hi = np.full(inputs, -np.inf), np.full(inputs, np.inf)
        rows, consts, strict = [], [], []
        for atom in atoms:
            names = [n for n, c in atom.expr.coeffs.items() if c != 0]
            xs = [n for n in names if n.startswith("X")]
            if xs and len(names) > 1:
                raise error("only bounds of one input by constants are supported (this "
                            "comparison relates several variables)", atom.where)  # fmt: skip
            if xs:
                i, c = int(xs[0][2:]), atom.expr.coeffs[xs[0]]
                bound = _quotient(-atom.expr.const, c, up=c > 0)
                if c > 0:
                    hi[i] = min(hi[i], bound)
                else:
                    lo[i] = max(lo[i], bound)
                continue
            if not names:
                if (atom.expr.const < 0) or (atom.expr.const == 0 and not atom.strict):
                    continue  # always true
                rows.append(np.zeros(outputs))  # always false: 0 <= const fails
                consts.append(atom.expr.const)
                strict.append(atom.strict)
                continue
            row = np.zeros(outputs)
            for n in names:
                row[int(n[2:])] = atom.expr.coeffs[n]
            rows.append(row)
            consts.append(atom.expr.const)
            strict.append(atom.strict)
        for i in range(inputs):
            if not (np.isfinite(lo[i]) and np.isfinite(hi[i])):
                side = "lower" if not np.isfinite(lo[i]) else "upper"
                raise error(f"X_{i} has no {side} bound: every input needs a bound on both "
                            "sides", where)  # fmt: skip
        return Case(
            lo,
            hi,
            np.array(rows).reshape(len(rows), outputs),
            np.array(consts, dtype=np.float64),
            np.array(strict, dtype=bool),
        )
