"""Resource limits: the one policy for how large a tensor tlc will build, read or compile.

Model files and payloads are untrusted input (docs/security.md): a 100-byte file can declare a
tensor of 2^62 elements. Every size is therefore computed with Python integers (which do not
wrap) and checked against a limit *before* anything is allocated or read:

- The element budget, `max_elements()`: the most elements one tensor may have when tlc holds it
  in memory (reference interpreter, interval bounds, payload and parameter files, importers).
  The default, 2^28 = 268,435,456 elements, is 2 GiB of float64; set the environment variable
  `TLC_MAX_ELEMENTS` to raise or lower it.
- The address limit, `MAX_BYTES` = 2^62: compiled code computes offsets and sizes in signed
  64-bit integers, so no buffer (nor the sum of a function's buffers) may come near 2^63 bytes.
  This is not a policy but a property of the generated code, so it cannot be overridden.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from math import prod

#: Environment variable overriding the element budget.
ENV_MAX_ELEMENTS = "TLC_MAX_ELEMENTS"
DEFAULT_MAX_ELEMENTS = 2**28
MAX_BYTES = 2**62


class LimitError(ValueError):
    """A size over a limit; callers turn the message into a located diagnostic."""


def max_elements() -> int:
    """The element budget: `TLC_MAX_ELEMENTS` if set (a positive integer), else the default.
    Read at each check so a test or a long-running process can change it."""
    text = os.environ.get(ENV_MAX_ELEMENTS)
    if text is None:
        return DEFAULT_MAX_ELEMENTS
    try:
        value = int(text) if len(text) <= 20 else -1
    except ValueError:
        value = -1
    if value <= 0:
        raise LimitError(f"{ENV_MAX_ELEMENTS}={text!r} is not a positive integer")
    return value


def fmt_count(n: int) -> str:
    return f"{n:,}"


def check_elements(shape: Iterable[int], what: str) -> int:
    """The number of elements of `shape`; `LimitError` if an extent is negative or the count is
    over the element budget. `what` names the tensor in the message ("node 3"), if not empty."""
    dims = tuple(int(d) for d in shape)
    prefix = f"{what}: " if what else ""
    if any(d < 0 for d in dims):
        raise LimitError(f"{prefix}negative extent in shape {_fmt(dims)}")
    # An empty tensor counts its other extents: [2^31, 0] holds nothing, but iterating or
    # printing it still walks 2^31 rows.
    weight = prod(max(d, 1) for d in dims)
    budget = max_elements()
    if weight > budget:
        held = "elements" if 0 not in dims else "rows around its empty axis"
        raise LimitError(
            f"{prefix}tensor of shape {_fmt(dims)} has {fmt_count(weight)} {held}, over the "
            f"element budget of {fmt_count(budget)} (set {ENV_MAX_ELEMENTS} to change it)"
        )
    return prod(dims)


def check_bytes(elements: int, itemsize: int, what: str) -> int:
    """`elements * itemsize` bytes; `LimitError` if compiled code could not address them."""
    size = elements * itemsize
    if size > MAX_BYTES:
        raise LimitError(
            f"{what}: {fmt_count(size)} bytes is more than compiled code can address (2^62 bytes)"
        )
    return size


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
