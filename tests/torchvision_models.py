"""torchvision's model definitions for the import tests, with random weights.

PyPI's torchvision 0.28.0 (the release matching torch 2.13.0) ships a C extension built for
CUDA, which fails to load on a CPU-only torch. Its model definitions are pure Python and do not
need it; only `torchvision._meta_registrations`, which registers meta kernels for the C ops
that did not load, fails at import. So this module puts an empty module in its place before
importing torchvision. Every test that needs torchvision imports it from here, and nowhere else
is the shim needed.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

sys.modules.setdefault(
    "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
)
torchvision = pytest.importorskip("torchvision")


def model(name: str, seed: int = 0) -> Any:
    """`torchvision.models.<name>()` with random weights (no download), in eval mode."""
    import torch

    torch.manual_seed(seed)
    return getattr(torchvision.models, name)().eval()
