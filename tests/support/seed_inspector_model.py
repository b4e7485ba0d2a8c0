"""The model of the inspector spec's example (seed 001), kept in its own file for its source lines."""

import torch
import torch.nn as nn


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(20, 5)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu(x)
        x = self.linear2(x)
        return x


class DataDependent(nn.Module):
    """Branches on a tensor's value: torch.export cannot trace that without torch.cond."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


class TopK(nn.Module):
    def forward(self, scores):
        values, indices = torch.topk(scores, 2, dim=-1)
        return values * 2, indices + 1


class Mixed(nn.Module):
    """An embedding, a linear and a matmul of two activations: ops with and without weights."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, tokens):
        h = self.embed(tokens)
        q = self.proj(h)
        return torch.matmul(q, h.transpose(-1, -2)).relu()


class ExportDiffers(nn.Module):
    """Computes something else while torch.export traces it: the graph is not the eager forward."""

    def forward(self, x):
        if torch.compiler.is_exporting():
            return x * 2
        return x * 3
