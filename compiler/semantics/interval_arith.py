"""Outward-rounded interval arithmetic on numpy boxes, the scalar context of `tlc.semantics.ibp`.

A `Box` holds float64 arrays `lo <= hi`. Every operation here returns a box that encloses

* the exact real result of the operation for every point of its argument boxes, and
* the value the reference denotation computes for those points in the run's scalar type `d`
  (float64 or float32), where that denotation rounds at every step.

How (docs/intervals.md has the argument in full):

* Endpoints are computed in float64 with round-to-nearest and then stepped outward by `Outward`:
  one float64 ULP with `np.nextafter` (which covers the one rounding of a correctly rounded
  `+ - * / sqrt`), then, for float32 runs, outward onto the float32 grid. An endpoint on the `d`
  grid that encloses the real result of a correctly rounded `d` operation also encloses its
  rounded `d` result, because rounding is monotone and fixes grid points.
* libm functions (exp, log, tanh, sin, ...) are not correctly rounded; their results are stepped
  outward by `LIBM_ULPS` more ULPs of `d` (glibc and numpy document errors of at most a few ULPs;
  the count covers that error on both the bound and the evaluated value).
* Sums and linear maps use an a-priori error bound instead of stepping after every addition:
  for any summation order, with or without FMA, a dot product of n terms computed in a type with
  unit roundoff u is within gamma_n * sum|terms| (gamma_n = n u / (1 - n u), Higham, Accuracy and
  Stability of Numerical Algorithms, Thm. 3.1) of the exact value. `linear_map` widens by
  `Outward.gamma(n)` * sum|terms| plus n subnormals, which bounds both our own float64
  evaluation of the centre and the `d` evaluation of any point of the box.
* A NaN endpoint (from inf - inf, 0 * inf) becomes the infinite endpoint (`sanitize`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

F64 = np.float64
#: Unit roundoff by scalar type (`Outward.u`, asked for in every rule: finfo is slow).
_UNITS: dict[type, float] = {np.float64: 2.0**-53, np.float32: 2.0**-24}

#: Outward steps (ULPs of the scalar type) for libm functions, which are faithful to a few ULPs
#: but not correctly rounded: covers the library's error on the bound and on the evaluated point.
LIBM_ULPS = 8
#: Outward steps for the reference's small compositions (sigmoid, softplus: an exp, a log1p and
#: one or two correctly rounded operations, each adding at most a few ULPs of relative error).
COMPOSITE_ULPS = 16


@dataclass(frozen=True)
class Box:
    """An axis-aligned box: elementwise `lo <= value <= hi`, float64 arrays of the node's shape."""

    lo: np.ndarray
    hi: np.ndarray

    @staticmethod
    def point(value: np.ndarray) -> Box:
        v = np.asarray(value, dtype=F64)
        return Box(v, v)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lo.shape

    def magnitude(self) -> np.ndarray:
        """max |x| over the box, elementwise."""
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    def contains(self, value: np.ndarray) -> np.ndarray:
        """Elementwise `lo <= value <= hi` (a NaN value is never contained)."""
        v = np.asarray(value, dtype=F64)
        return (self.lo <= v) & (v <= self.hi)

    def map(self, move: Callable[[np.ndarray], np.ndarray]) -> Box:
        """Apply a function that only moves values (reshape, permute, ...) to both ends."""
        return Box(np.asarray(move(self.lo), F64), np.asarray(move(self.hi), F64))


def sanitize(box: Box) -> Box:
    """NaN endpoints (inf - inf, 0 * inf in a bound) become -inf / +inf: sound, never wrong."""
    return Box(
        np.where(np.isnan(box.lo), -np.inf, box.lo), np.where(np.isnan(box.hi), np.inf, box.hi)
    )


@dataclass(frozen=True)
class Outward:
    """Outward rounding for runs in scalar type `dtype` (np.float64 or np.float32)."""

    dtype: type = np.float64

    @property
    def u(self) -> float:
        """Unit roundoff of the scalar type (2^-53 or 2^-24)."""
        unit = _UNITS.get(self.dtype)
        return float(np.finfo(self.dtype).eps) / 2 if unit is None else unit

    def down(self, x: np.ndarray, ulps: int = 1) -> np.ndarray:
        """A `d`-grid lower bound for a float64 result `x` of one operation: below the exact
        result and below the `d` result when that is within `ulps - 1` ULPs of correct."""
        return self._step(x, -np.inf, ulps)

    def up(self, x: np.ndarray, ulps: int = 1) -> np.ndarray:
        """The upper counterpart of `down`."""
        return self._step(x, np.inf, ulps)

    def _step(self, x: np.ndarray, direction: float, ulps: int) -> np.ndarray:
        with np.errstate(all="ignore"):
            y = self._grid(np.nextafter(np.asarray(x, dtype=F64), direction), direction)
            for _ in range(ulps - 1):
                y = np.nextafter(y, self.dtype(direction))
        return np.asarray(y, dtype=F64)

    def to_grid(self, box: Box) -> Box:
        """The smallest box on the `d` grid holding `box` (what a `d` run sees of its input)."""
        lo, hi = self._grid(box.lo, -np.inf), self._grid(box.hi, np.inf)
        return Box(lo.astype(F64), hi.astype(F64))

    def _grid(self, x: np.ndarray, direction: float) -> np.ndarray:
        """x moved outward onto the `d` grid, as a `d` array."""
        x = np.asarray(x)
        if x.dtype == self.dtype:
            return x  # already on the grid (always so in float64): nothing to round
        with np.errstate(all="ignore"):
            near = x.astype(self.dtype)
            toward = near > x if direction < 0 else near < x
            return np.where(toward, np.nextafter(near, self.dtype(direction)), near)

    def gamma(self, n: int) -> float:
        """Error factor for n-term sums and dot products, covering the `d` evaluation and our
        float64 one; infinite once n u is no longer small (the bound would not hold).

        float64 runs: 3 (n + 2) u, gamma_n for each of the two evaluations with room for the
        second-order terms. Narrower runs: gamma_{n+2}(u_d) for the `d` evaluation (its n
        roundings, and one relative u_d each for the payload and bias rounded to `d`, which
        the real value with the float64 payload must also sit within), plus 3 (n + 2) u_64 for
        ours; the first rounded up by a relative 4 u_64 for its own evaluation. About a third of
        the float64 form's 3 (n + 2) u_d."""
        if (n + 2) * self.u >= 0.01:
            return np.inf
        if self.dtype is F64:
            return 3 * (n + 2) * self.u
        m = (n + 2) * self.u
        return m / (1 - m) * (1 + 4 * _U64) + 3 * (n + 2) * _U64

    def widen(self, box: Box, err: np.ndarray | float) -> Box:
        """Widen by an absolute error bound `err`, rounding outward."""
        return Box(self.down(box.lo - err), self.up(box.hi + err))

    # -- arithmetic ------------------------------------------------------------------------

    def add(self, a: Box, b: Box) -> Box:
        with np.errstate(all="ignore"):
            return Box(self.down(a.lo + b.lo), self.up(a.hi + b.hi))

    def sub(self, a: Box, b: Box) -> Box:
        with np.errstate(all="ignore"):
            return Box(self.down(a.lo - b.hi), self.up(a.hi - b.lo))

    def mul(self, a: Box, b: Box) -> Box:
        """min and max of the four endpoint products, each rounded outward."""
        with np.errstate(all="ignore"):
            products = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            lo = np.minimum.reduce(np.broadcast_arrays(*products))
            hi = np.maximum.reduce(np.broadcast_arrays(*products))
            if np.isnan(lo).any() or np.isnan(hi).any():  # 0 * inf: the product is 0 there
                fixed = [np.where(np.isnan(p), 0.0, p) for p in products]
                lo = np.minimum.reduce(np.broadcast_arrays(*fixed))
                hi = np.maximum.reduce(np.broadcast_arrays(*fixed))
        return Box(self.down(lo), self.up(hi))

    def square(self, a: Box) -> Box:
        """x * x: 0 at the bottom when the box straddles 0 (tighter than `mul(a, a)`)."""
        with np.errstate(all="ignore"):
            lo2, hi2 = a.lo * a.lo, a.hi * a.hi
            straddles = (a.lo <= 0) & (a.hi >= 0)
            lo = np.where(straddles, 0.0, np.minimum(lo2, hi2))
        return Box(self.down(lo), self.up(np.maximum(lo2, hi2)))

    def div(self, a: Box, b: Box) -> Box | None:
        """a / b for a divisor box excluding 0 (None otherwise: 1/x is unbounded there)."""
        if not np.all((b.lo > 0) | (b.hi < 0)):
            return None
        with np.errstate(all="ignore"):
            quotients = [a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]
            lo = np.minimum.reduce(np.broadcast_arrays(*quotients))
            hi = np.maximum.reduce(np.broadcast_arrays(*quotients))
        return Box(self.down(lo), self.up(hi))

    def monotone(
        self, a: Box, f: Callable[[np.ndarray], np.ndarray], ulps: int, increasing: bool = True
    ) -> Box:
        """f of an increasing (or decreasing) function: f at the endpoints, rounded outward."""
        with np.errstate(all="ignore"):
            at_lo, at_hi = np.asarray(f(a.lo), F64), np.asarray(f(a.hi), F64)
        if not increasing:
            at_lo, at_hi = at_hi, at_lo
        return Box(self.down(at_lo, ulps), self.up(at_hi, ulps))

    def linear_map(
        self,
        a: Box,
        apply: Callable[[np.ndarray], np.ndarray],
        apply_abs: Callable[[np.ndarray], np.ndarray],
        terms: int,
        offset: np.ndarray | float = 0.0,
    ) -> Box:
        """The image of `a` under an affine map y = L x + c (midpoint-radius form).

        `apply(v)` computes L v + c in float64, `apply_abs(v)` computes |L| v (no c), and
        `terms` is the number of products and additions behind one output element, `offset`
        bounds |c|. With
        x = m +- r, L x + c lies in L m + c +- |L| r; per coefficient this is exactly the
        min/max split min(w lo, w hi) = w m - |w| r. Both our evaluation of L m + c and the `d`
        evaluation at any point are within gamma (|L| (|m| + r) + |c|) of exact (`gamma`).
        """
        mid, rad = midpoint_radius(a)
        g = self.gamma(terms)
        with np.errstate(all="ignore"):
            centre = np.asarray(apply(mid), F64)
            # r + g (|m| + r), over-estimated by a relative 8 u_f64 for its own two roundings;
            # the |L| product over-estimated by the float64 gamma of its own summation.
            vec = (rad + g * (np.abs(mid) + rad)) * (1 + 8 * _U64)
            spread = np.asarray(apply_abs(vec), F64) * (1 + 3 * (terms + 2) * _U64)
            spread = spread + 2 * g * np.abs(offset) + terms * self.tiny
        return Box(self.down(centre - spread), self.up(centre + spread))

    def bilinear_map(
        self, a: Box, b: Box, apply: Callable[[np.ndarray, np.ndarray], np.ndarray], terms: int
    ) -> Box:
        """The image of two boxes under a map f(x, y) = sum of products x_i y_j (coefficients
        1, like a convolution or its gradients), `terms` products per output element.

        Midpoint-radius (Rump): with x = mx +- rx, y = my +- ry, f(x, y) lies in f(mx, my) +-
        (f(|mx|, ry) + f(rx, |my|) + f(rx, ry)); the evaluation errors are within
        gamma f(|mx| + rx, |my| + ry)."""
        (mx, rx), (my, ry) = midpoint_radius(a), midpoint_radius(b)
        g = self.gamma(terms)
        with np.errstate(all="ignore"):
            centre = np.asarray(apply(mx, my), F64)
            ax, ay = np.abs(mx), np.abs(my)
            spread = apply(ax, ry) + apply(rx, ay) + apply(rx, ry) + g * apply(ax + rx, ay + ry)
            spread = np.asarray(spread, F64) * (1 + 3 * (terms + 8) * _U64) + terms * self.tiny
        return Box(self.down(centre - spread), self.up(centre + spread))

    @property
    def tiny(self) -> float:
        """The smallest subnormal of the scalar type: a bound on one product's underflow."""
        return float(np.finfo(self.dtype).smallest_subnormal)


def midpoint_radius(a: Box) -> tuple[np.ndarray, np.ndarray]:
    """(m, r) with [lo, hi] inside [m - r, m + r]: r is rounded up."""
    with np.errstate(all="ignore"):
        mid = 0.5 * a.lo + 0.5 * a.hi
        return mid, np.nextafter(np.maximum(a.hi - mid, mid - a.lo), np.inf)


_U64 = float(np.finfo(F64).eps) / 2
