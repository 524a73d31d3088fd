"""How the tools print values and boxes (`tlc-run`, programs): fixed digits, like the seed's
tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tlc.semantics.interval_arith import Box

#: Magnitudes from here on print in exponent form (`1.000000e+300`), not as 300 digits.
EXPONENT_FROM = 1e15


def format_value(value: np.ndarray, digits: int = 6) -> str:
    """`0.027720`, `[0.107000, -0.017000]`, nested brackets for rank >= 2 (row-major)."""
    if value.ndim == 0:
        x = float(value)
        style = "e" if abs(x) >= EXPONENT_FROM and np.isfinite(x) else "f"
        return f"{x:.{digits}{style}}"
    return "[" + ", ".join(format_value(row, digits) for row in value) + "]"


def format_box(box: Box | None, digits: int = 6) -> str:
    """`[lo...] .. [hi...]` (scalars bracketed, like the seed's IBP table); `none` if no box."""
    if box is None:
        return "none"
    lo, hi = (format_value(np.atleast_1d(end), digits) for end in (box.lo, box.hi))
    return f"{lo} .. {hi}"
