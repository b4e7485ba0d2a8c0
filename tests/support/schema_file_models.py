"""Models written to exercise every kind of entry a schema file holds, for the save/load tests.

`Featureful` reaches module-level helpers, constants (a tensor, a tuple, a non-finite float), a custom
exception class, a decorated forward, a computed `getattr`, closures, comprehensions, dict displays,
f-strings, `with torch.no_grad()`, a method block, a ModuleDict and a skipped child. `make_featureful`
returns `(model, inputs)` with fixed seeds.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

SCALE = 0.5
OFFSETS = (1, 2, 3)
NEG_INF = float("-inf")
BIAS_TABLE = torch.linspace(-1.0, 1.0, 8)


class RoutingError(Exception):
    """A model-defined exception class, caught in forward."""


def soft_clip(x, limit=3.0):
    return limit * torch.tanh(x / limit)


def doubled_output(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs) * 2

    return wrapper


CALLS = 0


class Counting(nn.Module):
    """Its forward has a `global` statement: the lowering refuses it, so the block is skipped."""

    def forward(self, x):
        global CALLS
        CALLS += 1
        return x * 2


class Generator(nn.Module):
    """It calls a delegating generator method (`yield from`): the method block is skipped and runs as
    the real method (a plain generator method is lowered, see tests/files/test_schema_file_generators.py)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        parts = list(self._chunks(x))
        return torch.cat(parts, dim=-1)

    def _chunks(self, x):
        yield from self.proj(x).chunk(2, dim=-1)


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @doubled_output
    def forward(self, x):
        return self.lin(x)


class Featureful(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8)})
        self.gen = Generator()
        self.count = Counting()
        self.deco = Decorated()
        self.register_buffer("mask", torch.tensor([True, False] * 4))
        self.gate_tanh = nn.Tanh()
        self.kind = "tanh"

    def pick(self, x, name):
        return self.heads[name](x)

    def forward(self, x, act=F.gelu, scale=SCALE):
        h = act(self.inp(x)) + BIAS_TABLE
        gate = getattr(self, f"gate_{self.kind}")
        h = gate(h)
        outs = {name: self.pick(h, name) for name in ("a", "b")}
        total = sum(outs.values()) * scale
        total = total.masked_fill(self.mask, NEG_INF).softmax(dim=-1)
        shifted = [total.roll(k, dims=-1) for k in OFFSETS]
        merged = torch.stack(shifted, dim=0).mean(dim=0)
        try:
            if merged.sum() > 1e9:
                raise RoutingError(f"too large: {merged.sum().item():.3f}")
            merged = soft_clip(merged)
        except RoutingError:
            merged = torch.zeros_like(merged)
        with torch.no_grad():
            stat = merged.detach().abs().amax()
        finfo = torch.finfo(merged.dtype)
        merged = merged.clamp(min=finfo.min) + self.gen(h) * 0.1 + self.deco(self.count(h))
        scaled = (lambda t: t * 2)(merged)
        return scaled.to(torch.float64), stat


def make_featureful():
    torch.manual_seed(0)
    model = Featureful()
    x = torch.randn(4, 8, requires_grad=True)
    return model, {"x": x}
