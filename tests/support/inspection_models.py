"""Models for the inspection tests that need a child the schema must run eagerly as one piece.

A class compiled from a string has no source file, so the parser cannot lower its forward and
re-dispatches it to the real module: a skip that does not depend on what the lowering supports.
"""

import torch
from torch import nn

_SOURCELESS = '''
class NoSource(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).tanh()
'''

_namespace: dict = {}
exec(compile(_SOURCELESS, "<generated>", "exec"), {"nn": nn, "torch": torch, "__name__": __name__}, _namespace)
NoSource = _namespace["NoSource"]


class WithSkippedChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = NoSource()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.block(x)
        return self.head(h + x)


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj(scores @ v)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class Encoder(nn.Module):
    """Nested blocks in a ModuleList, residual adds, a pooled head: a small transformer encoder."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.blocks = nn.ModuleList([Block(8) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def make_encoder():
    torch.manual_seed(0)
    return Encoder().eval(), {"tokens": torch.randint(0, 20, (2, 5))}
