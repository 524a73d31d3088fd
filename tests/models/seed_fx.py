"""The seed's FX example (its class G, from TorchLean's import documentation), plus a factory."""

import torch
import torch.nn as nn

W1 = torch.tensor(
    [
        [0.15, -0.12, 0.08, 0.05],
        [0.02, 0.11, -0.09, 0.07],
        [-0.04, 0.06, 0.10, -0.03],
        [0.09, 0.01, 0.04, 0.13],
        [-0.07, 0.03, 0.12, -0.02],
    ]
)
b1 = torch.tensor([0.01, -0.02, 0.03, 0.0, 0.02])
W2 = torch.tensor(
    [
        [0.05, 0.08, -0.06, 0.03, 0.07],
        [-0.04, 0.02, 0.09, -0.01, 0.06],
        [0.10, -0.03, 0.04, 0.05, -0.08],
    ]
)
b2 = torch.tensor([0.02, -0.01, 0.0])


class G(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 3)
        with torch.no_grad():
            self.l1.weight.copy_(W1)
            self.l1.bias.copy_(b1)
            self.l2.weight.copy_(W2)
            self.l2.bias.copy_(b2)

    def forward(self, x):
        return torch.tanh(self.l2(torch.relu(self.l1(x))).sum())


def make() -> nn.Module:
    return G().eval()
