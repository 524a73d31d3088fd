"""leaky_relu in its PyTorch forms: a module, and the functional with its slope by keyword."""

import torch.nn.functional as F
from torch import nn


class Leaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        return F.leaky_relu(self.act(x), negative_slope=3.0)


def make() -> nn.Module:
    return Leaky()
