"""Models and inputs of the store tests (tests/store/), the resumption script and the store benchmark.

`Blocks` is a two-block network with named variables, a NaN-making branch (an input whose first
value is exactly 7 gives a NaN in `head`), and an optional death: when the environment names a
flag file that exists, the input whose first value is exactly -9 ends its process (`os._exit`),
as a rank killed mid-run would; with `STOP_FLAG` the input whose first value is exactly -7 stops it
(SIGSTOP), as a rank stopped in a debugger or by job control would. `tiny_gpt2()` is a 2-layer GPT-2 built from its config (random
weights, offline). `inputs(n)` are n scopes of the Blocks network, the same for every call.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from nnschemaparser import NNParser

DEATH_FLAG = "NNSP_STORE_TEST_DEATH_FLAG"
STOP_FLAG = "NNSP_STORE_TEST_STOP_FLAG"


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        hidden = self.fc(x)
        gate = torch.sigmoid(hidden)
        out = x + hidden * gate
        return out


class Head(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 3)

    def forward(self, x, raw):
        logits = self.proj(x)
        if bool(raw[0, 0] == 7):
            logits = logits * float("nan")
        return logits


def maybe_die(x: torch.Tensor) -> None:
    """End the process on the marked input while the flag file exists (a call the schema runs as one op,
    so the check adds no step whether the flag is there or not)."""
    flag = os.environ.get(DEATH_FLAG)
    if flag and Path(flag).exists() and bool(x[0, 0] == -9):
        sys.stdout.flush()
        os._exit(3)
    stop = os.environ.get(STOP_FLAG)
    if stop and Path(stop).exists() and bool(x[0, 0] == -7):
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped, not killed: it holds its place in the group


class Blocks(nn.Module):
    def __init__(self, width: int = 8, depth: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(Layer(width) for _ in range(depth))
        self.head = Head(width)

    def forward(self, x):
        maybe_die(x)
        h = x
        for layer in self.layers:
            h = layer(h)
        logits = self.head(h, x)
        return logits


def blocks(depth: int = 2):
    """A Blocks network (seeded), its schema."""
    torch.manual_seed(0)
    model = Blocks(depth=depth).eval()
    example = {"x": torch.randn(2, 8)}
    return model, NNParser.parse_model(model=model, inputs_tensors_values=example)


def inputs(n: int, nan_at: tuple = (), die_at: tuple = (), stop_at: tuple = ()) -> list[dict]:
    """n scopes {x: (1, 8)}, one row each; sample i in `nan_at` makes a NaN in head, in `die_at` kills its process, in
    `stop_at` stops it with SIGSTOP (each while its flag file exists)."""
    generator = torch.Generator().manual_seed(123)
    scopes = []
    for i in range(n):
        x = torch.randn(1, 8, generator=generator)
        if i in nan_at:
            x[0, 0] = 7.0
        if i in die_at:
            x[0, 0] = -9.0
        if i in stop_at:
            x[0, 0] = -7.0
        scopes.append({"x": x})
    return scopes


def tiny_gpt2(layers: int = 2):
    """A GPT2Model from its config: 2 layers, 32 wide, eager attention; its schema on 8 tokens."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=2, n_positions=64, vocab_size=128)
    config._attn_implementation = "eager"
    model = GPT2Model(config).eval()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, NNParser.parse_model(model=model, inputs_tensors_values={"input_ids": ids})


def token_inputs(n: int, tokens: int = 8, vocab: int = 128) -> list[dict]:
    generator = torch.Generator().manual_seed(7)
    return [{"input_ids": torch.randint(0, vocab, (1, tokens), generator=generator)} for _ in range(n)]


EXACT_STATISTICS = ("numel", "min", "max", "n_nan", "n_inf", "frac_zero")
# accumulated in the tensor's dtype (float32 here), not in float64 as tensor_statistics: bounds relative to
# the figure's own size, for mean and std to the tensor's mean magnitude and root mean square (a mean near
# zero, as a LayerNorm's, cancels: only its absolute error is small)
ACCUMULATED_STATISTICS = {"mean": 1e-5, "abs_sum": 1e-5, "l2": 1e-5, "std": 1e-4}


def _scale(name: str, value: float, expected: dict) -> float:
    import math

    numel = max(int(expected["numel"]), 1)
    if name == "mean":
        return max(float(expected["abs_sum"]) / numel, 1e-30)
    if name == "std":
        return max(float(expected["l2"]) / math.sqrt(numel), 1e-30)
    return max(abs(value), 1e-30)


def statistics_mismatches(row, expected: dict) -> list[str]:
    """The statistics of a store row that differ from `tensor_statistics`'s figures beyond their documented bounds."""
    import math

    wrong = []
    for name in EXACT_STATISTICS:
        a, b = row[name], expected[name]
        if not ((a != a and b != b) or a == b):
            wrong.append(f"{name}: {a!r} != {b!r}")
    for name, bound in ACCUMULATED_STATISTICS.items():
        a, b = float(row[name]), float(expected[name])
        if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
            if not (a == b or (a != a and b != b)):
                wrong.append(f"{name}: {a!r} != {b!r}")
        elif abs(a - b) > bound * _scale(name, b, expected):
            wrong.append(f"{name}: {a!r} vs {b!r} (relative {abs(a - b) / max(abs(b), 1e-30):.2e} > {bound})")
    return wrong
