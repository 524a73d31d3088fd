"""An independent CROWN for ReLU (and leaky ReLU) MLPs in plain numpy float64: the oracle of
tests/test_crown.py.

Written separately from tlc.semantics.crown (no shared code): layers are (W, b) pairs with relu
between them; intermediate bounds by CROWN (a backward pass from every pre-activation layer),
each intersected with the interval bounds computed from the tightened previous layer, as tlc
does; CROWN's default adaptive lower slope (1 if u >= -l else 0 for an unstable neuron). No
rounding control: it agrees with tlc to rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np


def _relax(
    lo: np.ndarray, hi: np.ndarray, a: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower slope, upper slope, upper intercept) of leaky relu max(z, a z) (0 <= a <= 1; a = 0
    is relu) on [lo, hi]: the chord above, slope 1 or a below."""
    unstable = (lo < 0) & (hi > 0)
    active = lo >= 0
    stable = np.where(active, 1.0, a)
    with np.errstate(all="ignore"):
        slope = np.where(unstable, (hi - a * lo) / (hi - lo), stable)
    intercept = np.where(unstable, a * lo - slope * lo, 0.0)
    lower = np.where(unstable, np.where(hi >= -lo, 1.0, a), stable)
    return lower, slope, intercept


def crown_mlp(
    layers: list[tuple[np.ndarray, np.ndarray]],
    lo: np.ndarray,
    hi: np.ndarray,
    spec: np.ndarray | None = None,
    negative_slope: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of spec @ f(x) (f's output if spec is None) over [lo, hi], with
    relu (or leaky relu of `negative_slope` in [0, 1]) between the layers."""
    mid, rad = (lo + hi) / 2, (hi - lo) / 2
    pre: list[tuple[np.ndarray, np.ndarray]] = []

    def lower_bound(rows: np.ndarray, last: int) -> np.ndarray:
        """Lower bound of rows @ z_last, z_last the output of layer `last`."""
        const = np.zeros(rows.shape[0])
        lam = rows
        for j in range(last, -1, -1):
            w, b = layers[j]
            const = const + lam @ b
            lam = lam @ w
            if j == 0:
                break
            lower, slope, intercept = _relax(*pre[j - 1], negative_slope)
            negative = np.minimum(lam, 0.0)
            const = const + negative @ intercept
            lam = np.where(lam >= 0, lam * lower, lam * slope)
        return const + lam @ mid - np.abs(lam) @ rad

    def interval(k: int) -> tuple[np.ndarray, np.ndarray]:
        w, b = layers[k]
        if k == 0:
            m, r = mid, rad
        else:
            p_lo, p_hi = pre[k - 1]
            a_lo = np.maximum(p_lo, negative_slope * p_lo)
            a_hi = np.maximum(p_hi, negative_slope * p_hi)
            m, r = (a_lo + a_hi) / 2, (a_hi - a_lo) / 2
        return w @ m + b - np.abs(w) @ r, w @ m + b + np.abs(w) @ r

    for k in range(len(layers) - 1):
        i_lo, i_hi = interval(k)
        eye = np.eye(len(i_lo))
        pre.append((np.maximum(i_lo, lower_bound(eye, k)), np.minimum(i_hi, -lower_bound(-eye, k))))
    last = len(layers) - 1
    i_lo, i_hi = interval(last)
    if spec is None:
        eye = np.eye(len(i_lo))
        return np.maximum(i_lo, lower_bound(eye, last)), np.minimum(i_hi, -lower_bound(-eye, last))
    box_lo = np.minimum(spec * i_lo, spec * i_hi).sum(axis=1)
    box_hi = np.maximum(spec * i_lo, spec * i_hi).sum(axis=1)
    return (
        np.maximum(box_lo, lower_bound(spec, last)),
        np.minimum(box_hi, -lower_bound(-spec, last)),
    )
