"""Lists of decimal numbers read in bulk, rounded exactly as Python's `float()` rounds.

numpy's `fromstring(..., float64)` converts each number with David Gay's correctly rounded
strtod, which for the 17 significant digits that the shortest round-trip form of most doubles
has takes the slow, multi-precision route: about 300 ns a number, three quarters of the time
to read a large inline payload. Its integer parser is ten times faster. So a list such as
`[[-0.0512, 1.5e-05], ...]` is read as integers: with the points deleted and each exponent
marker turned into a separator, numpy reads the significands (`-512`, `15`) and exponents (`-5`)
as int64, and the points', exponents' and separators' positions give each number's decimal
exponent `e` (`-4`, `-6`). Then `m * 10**e` is computed in x87 extended precision (a 64-bit
significand: `m` < 10^18 and `10**|e|` <= 10^27 are exact, the product or quotient rounds once)
and rounded to float64. Two roundings can differ from one only where the first lands exactly on
a float64 halfway point (the low 11 of its 64 bits `10000000000`): those numbers, and those
outside the ranges above (over 18 digits, `|e| > 27`), are converted one by one by `float()`.

The caller has checked the list's structure (brackets and commas of a rectangular list of
`count` items, numbers in their places; see tlc.dialect.parser); `read_decimals` checks each
number's own form against the grammar's `-?(D+(.D*)?|.D+)([eE][+-]?D+)?` and returns None for
anything else (`inf`, `nan`, blanks inside a number, a platform without x87 extended
precision), which the caller then reads its slower way.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

#: x87 extended precision: numpy's longdouble on x86-64 (a 64-bit significand, 63 stored
#: fraction bits); elsewhere (aarch64's binary128, macOS's double) the bulk path is not taken.
_EXTENDED = np.finfo(np.longdouble).nmant == 63 and np.dtype(np.longdouble).itemsize == 16
_MAX_SIGNIFICAND = 10**18
_MAX_EXPONENT = 27
_POWERS = np.ones(_MAX_EXPONENT + 1, np.longdouble)
for _k in range(1, _MAX_EXPONENT + 1):
    _POWERS[_k] = _POWERS[_k - 1] * 10  # exact: 10**27 = 5**27 * 2**27 and 5**27 < 2**64

#: Brackets as blanks, exponent markers as separators, points deleted (with `translate`).
_AS_INTEGERS = bytes.maketrans(b"[]eE", b"  ,,")
_DIGITS = np.zeros(256, bool)
_DIGITS[np.frombuffer(b"0123456789", np.uint8)] = True
_AFTER_MINUS = _DIGITS.copy()
_AFTER_MINUS[ord(".")] = True
_BEFORE_MINUS = np.zeros(256, bool)
_BEFORE_MINUS[np.frombuffer(b" \t\r\n[,eE", np.uint8)] = True
#: 1 for what may stand between a comma and a number, and between a number and a comma.
_BEFORE_NUMBER = np.zeros(256, np.int64)
_BEFORE_NUMBER[np.frombuffer(b" \t\r\n[", np.uint8)] = 1
_AFTER_NUMBER = np.zeros(256, np.int64)
_AFTER_NUMBER[np.frombuffer(b" \t\r\n]", np.uint8)] = 1
_NUMBER_FIRST = _AFTER_MINUS.copy()
_NUMBER_FIRST[ord("-")] = True
_NUMBER_LAST = _AFTER_MINUS


def read_decimals(raw: bytes, count: int) -> np.ndarray | None:
    """The `count` numbers of the ASCII list `raw` as float64, or None (see the module doc)."""
    if not _EXTENDED or count == 0 or any(c in raw for c in (b"i", b"n", b"a")):
        return None
    b = np.frombuffer(raw, np.uint8)
    commas = np.flatnonzero(b == ord(","))
    points = np.flatnonzero(b == ord("."))
    marks = np.flatnonzero(b == ord("e"))
    if b"E" in raw:
        marks = np.union1d(marks, np.flatnonzero(b == ord("E")))
    spans = _number_spans(b, commas) if len(commas) == count - 1 else None
    if spans is None:
        return None
    first, last = spans
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ints = np.fromstring(raw.translate(_AS_INTEGERS, b"."), np.int64, sep=",")
        except (ValueError, DeprecationWarning, OverflowError):
            return None
    if ints.size != count + len(marks):
        return None
    # Which number each point and exponent marker belongs to (numbers lie between commas).
    if len(points) == count and np.all(points[1:] > commas) and np.all(points[:-1] < commas):
        point_of = np.arange(count)  # a point in every number, as in most float lists
    else:
        point_of = np.searchsorted(commas, points)
    mark_of = np.searchsorted(commas, marks)
    if np.any(np.diff(point_of) <= 0) or np.any(np.diff(mark_of) <= 0):
        return None  # two points or two exponents in one number
    if not _marks_well_formed(b, marks) or not _points_well_formed(b, points):
        return None
    if not _signs_well_formed(b, first, marks):
        return None
    # The significands, and each exponent (after its significand, in the integer list).
    exponent_at = mark_of + np.arange(1, len(marks) + 1)
    is_significand = np.ones(ints.size, bool)
    is_significand[exponent_at] = False
    significands = ints[is_significand]
    exponents = np.zeros(count, np.int64)
    exponents[mark_of] = ints[exponent_at]
    # The digits after each point: up to the number's exponent marker, or else its end.
    every = len(points) == count  # `point_of`, strictly increasing, is then `arange(count)`
    ends = last + 1 if every else last[point_of] + 1
    has_mark = np.zeros(count, bool)
    has_mark[mark_of] = True
    marked = has_mark if every else has_mark[point_of]
    mark_index = np.searchsorted(mark_of, point_of[marked])  # the marker of the same number
    if np.any(marks[mark_index] < points[marked]):
        return None  # a point inside an exponent
    ends[marked] = marks[mark_index]
    if every:
        exponents -= ends - points - 1
    else:
        exponents[point_of] -= ends - points - 1
    return _scaled(raw, b, (first, last), significands, exponents, has_mark, point_of)


def _number_spans(b: np.ndarray, commas: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The first and last character of each number, or None unless between each two commas
    (and the list's ends) stands a number with only blanks and `[` before it and blanks and
    `]` after it: not `[1, , 2]`, nor `[[1, ]2, [3, 4]]`."""
    first = _skipped(b, np.concatenate([[0], commas + 1]), _BEFORE_NUMBER)
    last = _skipped(b, np.append(commas, len(b)) - 1, -_AFTER_NUMBER)
    if np.all(_NUMBER_FIRST[b[first]]) and np.all(_NUMBER_LAST[b[last]]):
        return first, last
    return None


def _skipped(b: np.ndarray, at: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Each position in `at` moved by `step[byte]` until it is 0 there: all of them while over
    an eighth move (a blank after every comma), then only those still moving. Each step over
    all moves over an eighth of the positions, so there are at most `8 * len(b) / len(at)`."""
    at = at.copy()
    moves = step[b[at]]
    while np.count_nonzero(moves) * 8 > len(at):
        at += moves
        moves = step[b[at]]
    moving = np.flatnonzero(moves)
    moves = moves[moving]
    while len(moving):
        at[moving] += moves
        moves = step[b[at[moving]]]
        still = moves != 0
        moving, moves = moving[still], moves[still]
    return at


def _marks_well_formed(b: np.ndarray, marks: np.ndarray) -> bool:
    """Each exponent marker follows a digit or point and is followed by digits, signed or not."""
    if len(marks) == 0:
        return True
    if marks[0] == 0 or marks[-1] + 1 >= len(b):
        return False
    before, after = b[marks - 1], b[marks + 1]
    signed = (after == ord("-")) | (after == ord("+"))
    digit_at = np.minimum(marks + 1 + signed, len(b) - 1)
    return bool(np.all((_DIGITS[before] | (before == ord("."))) & _DIGITS[b[digit_at]]))


def _signs_well_formed(b: np.ndarray, first: np.ndarray, marks: np.ndarray) -> bool:
    """Each `-` starts a number (right before a digit or point) or signs its exponent, each `+`
    signs an exponent (`_marks_well_formed` has checked the digit after an exponent's sign);
    numpy's integer parser would allow a blank after a sign."""
    negative = b[first] == ord("-")
    if not np.all(_AFTER_MINUS[b[first[negative] + 1]]):
        return False
    signs = b[marks + 1]
    minus = np.count_nonzero(negative) + np.count_nonzero(signs == ord("-"))
    # numpy counts a byte some 8x faster than `bytes.count`
    plus = np.count_nonzero(signs == ord("+"))
    return np.count_nonzero(b == ord("-")) == minus and np.count_nonzero(b == ord("+")) == plus


def _points_well_formed(b: np.ndarray, points: np.ndarray) -> bool:
    """Each point has a digit after it, or a digit before it and a marker or separator after."""
    if len(points) == 0:
        return True
    if points[-1] + 1 >= len(b):
        return False
    after = b[points + 1]
    digit_after = _DIGITS[after]
    if np.all(digit_after):
        return True
    points, after = points[~digit_after], after[~digit_after]  # `5.`, `5.e3` or malformed
    before = b[np.maximum(points - 1, 0)]
    ends = (after == ord(",")) | (after == ord("]")) | ((after | 0x20) == ord("e"))
    return bool(np.all(_DIGITS[before] & (points > 0) & ends))


def _scaled(
    raw: bytes,
    b: np.ndarray,
    spans: tuple[np.ndarray, np.ndarray],
    significands: np.ndarray,
    exponents: np.ndarray,
    has_mark: np.ndarray,
    point_of: np.ndarray,
) -> np.ndarray | None:
    """`significands * 10**exponents`, rounded once to float64 (see the module doc); None for
    an integer beyond float64's range (which the caller's reader reports), or where many
    numbers are outside the ranges read in bulk (numpy's parser is then faster)."""
    first, last = spans
    magnitudes = np.abs(significands)  # int64's minimum cannot come out of 18 digits
    bulk = (magnitudes < _MAX_SIGNIFICAND) & (np.abs(exponents) <= _MAX_EXPONENT)
    one_by_one = ~bulk
    if np.count_nonzero(one_by_one) > len(significands) // 16:
        return None  # mostly numbers `float()` would read one by one: numpy's parser is faster
    x = magnitudes.astype(np.longdouble)
    scale = _POWERS[np.minimum(np.abs(exponents), _MAX_EXPONENT)]
    up = exponents >= 0
    np.multiply(x, scale, out=x, where=up)
    np.divide(x, scale, out=x, where=~up)
    halfway = (x.view(np.uint64)[0::2] & 0x7FF) == 0x400
    values = x.astype(np.float64)
    np.copysign(values, significands, out=values)  # 8x faster than negative(where=...)
    # A zero keeps the sign of its text where it is written as a float (`-0.0`); an integer
    # `-0` is the integer 0, as the token reader has it.
    floats = has_mark.copy()
    floats[point_of] = True
    zeros = np.flatnonzero((significands == 0) & floats)
    values[zeros[b[first[zeros]] == ord("-")]] = -0.0
    one_by_one |= halfway
    if np.any(one_by_one):
        for k in np.flatnonzero(one_by_one):
            token = raw[first[k] : last[k] + 1]
            value = float(token)
            if math.isinf(value) and not floats[k]:
                return None
            values[k] = value
    return values
