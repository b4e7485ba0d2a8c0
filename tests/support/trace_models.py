"""Small models for the trace, gradient, stepping and comparison tests, plus their parse helper.

Each model exercises one thing a trace must get right: in-place changes after capture, mutation
through a view, a branch taken in one run only, structured inputs and outputs, NaN and inf values.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.examples.mlp import MLP


def spec_mlp():
    """The spec's quick-start MLP at the sizes of its trace example: x (2, 16) -> 32 -> 8."""
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    x = torch.randn(2, 16)
    return model, x, parse(model, {"x": x})


def parse(model, inputs):
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    return NNParser.parse_model(model=model, inputs_tensors_shapes={k: tuple(v.shape) for k, v in tensors.items()},
                                inputs_tensors_dtypes={k: str(v.dtype) for k, v in tensors.items()},
                                inputs_tensors_values=dict(inputs))


class InPlace(nn.Module):
    """Every kind of in-place change the lowering flags: method_, subscript store, augmented assign, inplace=True."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        y = x * 2
        y.add_(1)
        y[0] = 0.5
        z = y @ y.t()
        z += 1
        h = self.act(self.proj(x))
        return z, h


class ViewMutation(nn.Module):
    def forward(self, x):
        y = x + 1
        flat = y.view(-1)
        flat.mul_(0)
        return y.sum() + flat.sum()


class Gate(nn.Module):
    """A branch taken only when `flag` is set: two runs follow different control paths."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x, flag: bool = False):
        h = self.pre(x)
        if flag:
            h = self.extra(h).relu()
        return self.head(h)


class Structured(nn.Module):
    """A tuple input and a dict output."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, pair, scale: float = 2.0):
        a, b = pair
        s = self.proj(a) + b
        return {"sum": s, "scaled": s * scale}


class NanInf(nn.Module):
    """log of a negative number (NaN) and division by zero (inf) in one step."""

    def forward(self, x):
        y = torch.log(x) / x
        return y * 1.0


class Tanh(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 3.0


class MutatesInput(nn.Module):
    """Changes its own input in place before using it."""

    def forward(self, x):
        x.mul_(2)
        return x + 1


class PositionalInplace(nn.Module):
    """`inplace` passed positionally: an in-place change the lowering may not see coming."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        h = self.proj(x)
        out = F.leaky_relu(h, 0.2, True)
        return out * 2
