"""A model using a target the PyTorch importer does not support (F.mish)."""

import torch.nn.functional as F
from torch import nn


class Mish(nn.Module):
    def forward(self, x):
        return F.mish(x) + 1.0


def make() -> nn.Module:
    return Mish()
