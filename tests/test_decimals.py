"""Decimal number lists read in bulk (tlc.core.decimals): every number rounds exactly as
Python's float() rounds it (int() first for integers, as the .tlir token reader does), and a
number not of the .tlir grammar's form makes the bulk reader decline the list."""

from __future__ import annotations

import numpy as np
import pytest

from tlc.core.decimals import _EXTENDED, read_decimals

pytestmark = pytest.mark.skipif(not _EXTENDED, reason="bulk path needs x87 extended precision")

#: Enough ordinary numbers around the forms under test that the reader keeps to its bulk path.
FILLER = ["0.5"] * 300


def _expected(token: str) -> float:
    return float(int(token)) if not any(c in token for c in ".eE") else float(token)


def _read(tokens: list[str], layout: str = "[{}]") -> np.ndarray | None:
    return read_decimals(layout.format(", ".join(tokens)).encode(), len(tokens))


def test_shortest_forms_of_doubles_round_trip_bit_for_bit() -> None:
    """repr() of doubles of every magnitude read in bulk (and those past its ranges, or on a
    halfway point after the first rounding, one by one) give the same bits."""
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.normal(0, 0.05, 20000),
            rng.normal(0, 1e4, 5000),
            np.exp(rng.uniform(-60, 60, 1000)) * rng.choice([-1, 1], 1000),
            rng.integers(-(2**53), 2**53, 1000).astype(np.float64),
            np.array([0.1, 0.2, 0.30000000000000004, 5e-324, 1e-320, 1.7976931348623157e308]),
        ]
    )
    got = _read([repr(float(v)) for v in values])
    assert got is not None
    assert np.array_equal(got.view(np.uint64), values.view(np.uint64))


@pytest.mark.parametrize(
    "token",
    ["0", "-0", "007", "-0.0", "0.0", "-0e5", "0.000", "1.", ".5", "-.5", "1.e3", "2E+2",
     "2e+02", "1e-27", "1e27", "1e28", "1e-28", "123456789012345678", "1234567890123456789",
     "9007199254740993", "-9007199254740993", "0.00012345678901234567", "4.9e-324",
     "2.4703282292062328e-324", "1e400", "-1e400", "1e-400", "179769313486231580793728971"
     "405303415079934132710037826936173778980444968292764750946649017977587207096330286416"
     "692887910946555547851940402630657488671505820681908902000708383676273854845817711531"
     "764475730270069855571366959622842914819860834936475292719074168444365510704342711559"
     "699508093042880177904174497791"],
)  # fmt: skip
def test_every_form_of_the_grammar_reads_as_the_token_reader_reads_it(token: str) -> None:
    got = _read([*FILLER, token, *FILLER])
    assert got is not None
    expected = _expected(token)
    assert got[len(FILLER)] == expected or (np.isnan(expected) and np.isnan(got[len(FILLER)]))
    assert np.signbit(got[len(FILLER)]) == np.signbit(expected)
    assert np.all(got[: len(FILLER)] == 0.5) and np.all(got[len(FILLER) + 1 :] == 0.5)


@pytest.mark.parametrize(
    "token",
    ["1.2.3", "1e5.0", "1e5e5", "1e", "e5", "5.e", "1e+", ". 5", "1 .5", "1 e5", "1e 5", "--1",
     "1-2", "- 1", "+1", "1+", "1e+-5", "inf", "-inf", "nan", "1 2", "", ".", "-", "]2", "2["],
)  # fmt: skip
def test_numbers_outside_the_grammar_make_it_decline(token: str) -> None:
    """Every such list is left to the caller's reader, which reports the number (or the
    place without one, or the number out of its place)."""
    assert _read([*FILLER, token, *FILLER]) is None


def test_an_integer_beyond_float64_makes_it_decline() -> None:
    """int() of it would overflow float64: the token reader reports it as an error."""
    assert _read([*FILLER, "1" + "0" * 400, *FILLER]) is None
    assert _read([*FILLER, "1" + "0" * 400 + ".0", *FILLER]) is not None  # a float: inf


@pytest.mark.parametrize("layout", ["[[{}]]", "[ {} ]", "[\n  {}\n]"])
def test_blanks_and_brackets_around_numbers(layout: str) -> None:
    got = _read(["-0.0", "1.5", "-2"], layout)
    assert got is not None and got.tolist() == [-0.0, 1.5, -2.0]
    assert np.signbit(got[0])


def test_lists_mostly_outside_its_ranges_are_declined() -> None:
    """Numbers float() would read one by one (here 30 digits each) are faster in numpy's own
    parser, which the caller then uses."""
    assert _read(["1" * 30] * 100) is None


def test_blanks_between_numbers_and_commas() -> None:
    got = read_decimals(b"[1.5 , -2.25e1\t,3 ,\n-0.]", 4)
    assert got is not None and got.tolist() == [1.5, -22.5, 3.0, -0.0]
    assert np.signbit(got[3])
