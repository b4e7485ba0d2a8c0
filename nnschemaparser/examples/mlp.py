"""The quick start's two-layer MLP."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, in_features: int = 784, hidden: int = 256, out_features: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        activated = hidden.relu()
        return self.fc2(activated)
