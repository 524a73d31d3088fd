"""A model using a target the PyTorch importer does not support (F.elu)."""

import torch.nn.functional as F
from torch import nn


class Elu(nn.Module):
    def forward(self, x):
        return F.elu(x) + 1.0


def make() -> nn.Module:
    return Elu()
