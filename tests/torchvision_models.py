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


#: The models the import tests and bench/real_networks.py run.
NETWORKS = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_0", "vgg11",
            "efficientnet_b0", "shufflenet_v2_x1_0", "transformer"]  # fmt: skip


def network(name: str, size: int = 32) -> tuple[Any, Any]:
    """A model of `NETWORKS` in eval mode and its example input: a torchvision model on one
    3 x size x size image, or `transformer`, a 2-layer `nn.TransformerEncoder` (d_model 32,
    4 heads, feed-forward 64) on 2 sequences of 10."""
    import torch
    from torch import nn

    if name != "transformer":
        net = model(name)
        return net, torch.randn(1, 3, size, size)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    net = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    return net, torch.randn(2, 10, 32)
