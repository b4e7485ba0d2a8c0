"""Models of the logical-view tests (issue 25): an attention block and an MLP whose projections are
split by tensor parallelism, written as tensor-parallel code is (head counts from `-1`, the head size
fixed), and their parallel plans."""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int = 32, head_dim: int = 8):
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.o = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        scores = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1)
        mixed = (scores @ v).transpose(1, 2).reshape(batch, seq, -1)
        return self.o(mixed)


class MLP(nn.Module):
    def __init__(self, width: int = 32, hidden: int = 64):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        hidden = torch.relu(self.up(x))
        return self.down(hidden * 2)


class Block(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = Attention(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


def tp_plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}


def block(seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block()
