"""How the tools print values and boxes (`tlc-run`, programs): fixed digits, like the seed's
tables; sound boxes print with their ends rounded outward (`format_box(..., outward=True)`)."""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tlc.semantics.interval_arith import Box

#: Magnitudes from here on print in exponent form (`1.000000e+300`), not as 300 digits.
EXPONENT_FROM = 1e15


def format_value(value: np.ndarray, digits: int = 6, rounding: str | None = None) -> str:
    """`0.027720`, `[0.107000, -0.017000]`, nested brackets for rank >= 2 (row-major).
    `rounding` None rounds to nearest; `ROUND_FLOOR` / `ROUND_CEILING` (decimal's names) print
    the largest decimal below / smallest above the exact double."""
    if value.ndim == 0:
        x = float(value)
        style = "e" if abs(x) >= EXPONENT_FROM and np.isfinite(x) else "f"
        if rounding is None or not np.isfinite(x):
            return f"{x:.{digits}{style}}"
        exact = Decimal(x)  # the double's exact value
        exponent = exact.adjusted() - digits if style == "e" else -digits
        # Enough precision for every digit printed (decimal's default 28 refuses --digits 100).
        context = Context(prec=digits + abs(exact.adjusted()) + 2)
        rounded = exact.quantize(Decimal(1).scaleb(exponent), rounding=rounding, context=context)
        return f"{rounded:.{digits}{style}}"
    return "[" + ", ".join(format_value(row, digits, rounding) for row in value) + "]"


def format_box(box: Box | None, digits: int = 6, outward: bool = False) -> str:
    """`[lo...] .. [hi...]` (scalars bracketed, like the seed's IBP table); `none` if no box.
    `outward`: lo printed rounded down and hi up, so the printed box contains the box."""
    if box is None:
        return "none"
    lo = format_value(np.atleast_1d(box.lo), digits, ROUND_FLOOR if outward else None)
    hi = format_value(np.atleast_1d(box.hi), digits, ROUND_CEILING if outward else None)
    return f"{lo} .. {hi}"
