"""Small models for the widget tests and the widget benchmark (defined in a file: the parser reads source)."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.examples.mlp import MLP


class Cell(nn.Module):
    """Eight instructions per call: enough cells make a schema of any size."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.lin(x)
        gated = hidden.sigmoid() * hidden
        return x + gated


class CellStack(nn.Module):
    """`depth` cells in a ModuleList, called in a for loop."""

    def __init__(self, depth: int = 4, width: int = 8) -> None:
        super().__init__()
        self.cells = nn.ModuleList(Cell(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for cell in self.cells:
            x = cell(x)
        return x


class DropoutNet(nn.Module):
    """Dropout in train mode: runs must replay the same mask."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


class NormNet(nn.Module):
    """BatchNorm in train mode: every forward updates its running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x))


class Branchy(nn.Module):
    """An if/else whose branch depends on the sign of the input sum, and a try/except."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.sum() > 0:
            out = h * 2
        else:
            out = h - 1
        try:
            out = out + 1
        except RuntimeError:
            out = out * 0
        return out


_NAMESPACE: dict = {"nn": nn, "torch": torch}
exec(textwrap.dedent("""
class NoSource(nn.Module):
    def forward(self, x):
        return x * 2
"""), _NAMESPACE)


class WithSkippedChild(nn.Module):
    """`inner` is defined by exec: its source cannot be read, so the parser skips it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = _NAMESPACE["NoSource"]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.fc(x))


def mlp_case(seed: int = 0):
    """The quick start's MLP (784 -> 256 -> 10), eval mode, a batch of 2, and its schema."""
    torch.manual_seed(seed)
    model = MLP().eval()
    x = torch.randn(2, 784)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    return model, x, schema


def stack_case(depth: int, width: int = 8):
    torch.manual_seed(0)
    model = CellStack(depth, width).eval()
    x = torch.randn(1, width)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    return model, x, schema
