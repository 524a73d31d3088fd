"""PyTorch models the importer and exporter tests share (also factories for tlc-translate).

Each factory returns a module in eval mode with seeded weights, and batch norm statistics that
are not the identity, so a dropped or misplaced normalisation would show in the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _randomise_batch_norm(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


class SmallCNN(nn.Module):
    """conv -> batch norm -> relu -> max pool -> conv (same padding) -> gelu -> avg pool ->
    flatten -> layer norm -> linear -> softmax, on [N, 3, 8, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 4, 3, padding="same", groups=2)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = F.gelu(self.conv2(x))
        x = F.avg_pool2d(x, 2)
        x = x.view(x.size(0), -1)
        return torch.softmax(self.head(self.norm(x)), dim=-1)


class SmallMLP(nn.Module):
    """linear -> batch norm (1d) -> gelu -> layer norm -> linear -> tanh + residual ->
    log_softmax, on [N, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.bn(self.fc1(x))))
        h = h + torch.tanh(self.fc2(h)) * 0.5
        return F.log_softmax(self.out(h), dim=1)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    model = SmallCNN()
    _randomise_batch_norm(model)
    return model.eval()


def mlp() -> nn.Module:
    torch.manual_seed(1)
    model = SmallMLP()
    _randomise_batch_norm(model)
    return model.eval()
