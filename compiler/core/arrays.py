"""The one rule by which every Python entry point reads an input value.

Anything `numpy.asarray` takes (numbers, nested lists, numpy arrays of any real dtype) or a torch
tensor (detached, moved to the CPU) is read as float64 and rounded to the entry point's dtype.
An array already of that dtype is used as it is (no copy), so the rule costs nothing on the fast
path of a compiled call; a float32 array given to a float64 entry point is widened exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def as_float_array(x: Any, dtype: Any = np.float64) -> np.ndarray:
    """`x` as a numpy array of `dtype` (np.float64 or np.float32) by the rule above."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch.Tensor, without importing torch
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray) and x.dtype == dtype:
        return x
    return np.asarray(np.asarray(x, dtype=np.float64), dtype=dtype)
