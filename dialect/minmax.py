"""The reference's max, min and sign as explicit selects, so that their bits (the sign of a zero
result, which NaN comes out) are defined by these formulas and not by numpy's loops.

numpy's own `maximum`/`minimum` give these bits on x86 today in every loop this machine runs
(scalar, short, long, strided), but a NaN's bits and ties of -0.0 and +0.0 are not part of
their contract, and `np.max` over an axis takes elements in its own lane order (a 56 x 56 max
pool of zeros got a sign no fold in order gives). The code generator emits the same selects
(`tlc.codegen.lower.elementwise.maximum`); docs/semantics.md, "Signed zeros and NaN".
"""

from __future__ import annotations

import numpy as np


def maximum(a: np.ndarray, b: np.ndarray | np.floating) -> np.ndarray:
    """a where a is NaN or a > b, else b: of equal values (-0.0 and +0.0 too) the second, of
    a NaN the first NaN operand (its sign and payload kept)."""
    return np.where(np.isnan(a) | (a > b), a, b)


def minimum(a: np.ndarray, b: np.ndarray | np.floating) -> np.ndarray:
    """a where a is NaN or a < b, else b (`maximum`'s rule, the other way)."""
    return np.where(np.isnan(a) | (a < b), a, b)


def sign(x: np.ndarray) -> np.ndarray:
    """1 above 0, -1 below, +0.0 at either zero, x itself where x is NaN."""
    one = x.dtype.type(1)
    return np.where(x > 0, one, np.where(x < 0, -one, np.where(x == 0, x.dtype.type(0), x)))
