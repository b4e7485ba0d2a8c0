"""Models and `torch.compile` backends with planted faults, for `compiled_local_errors`.

The backends are what a user might write: a callable `backend(gm, example_inputs)` that rewrites the
FX graph dynamo hands it (an fx pass) and returns `gm.forward`. Each counts its calls (`calls`), so a
test can tell the object it gave is the one called. A pass rewrites every graph it is handed (a
region compiled alone gets the same rewrite as the whole model), and `expected_line` says where the
op it changes is written. `tests/traces/test_diverge_compile.py` and `bench/diverge_compile_cases.py`
use them.
"""

from __future__ import annotations

import inspect
import math
import operator
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

MATMULS = (torch.matmul, operator.matmul, torch.addmm, torch.bmm, torch.baddbmm, torch._C._nn.linear, torch.mm)


class CountingBackend:
    """A user backend: `rewrite(gm)` (a graph pass; none: the graph as it is), then `gm.forward`."""

    def __init__(self, name: str = "pass-through"):
        self.name = name
        self.calls = 0

    def rewrite(self, gm: torch.fx.GraphModule) -> None:
        pass

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.calls += 1
        self.rewrite(gm)
        gm.graph.lint()
        gm.recompile()
        return gm.forward


class TanhGelu(CountingBackend):
    """gelu computed with its tanh approximation (`approximate='tanh'`)."""

    def __init__(self):
        super().__init__("gelu as tanh")

    def rewrite(self, gm):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is F.gelu:
                node.kwargs = {**node.kwargs, "approximate": "tanh"}


class ScaledMatmul(CountingBackend):
    """The first matmul of each graph (`matmul`, `@`, `linear`, `addmm`, `bmm`) whose output's last
    dimension is `width` (any, when None) multiplied by `1 + factor`."""

    def __init__(self, factor: float = 1e-2, width: Optional[int] = None):
        super().__init__(f"matmul x (1 + {factor})")
        self.factor, self.width = factor, width

    def rewrite(self, gm):
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in MATMULS:
                continue
            value = node.meta.get("example_value")
            if self.width is not None and (value is None or value.shape[-1] != self.width):
                continue
            with gm.graph.inserting_after(node):
                scaled = gm.graph.call_function(operator.mul, (node, 1.0 + self.factor))
            node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
            return


class NaiveSoftmax(CountingBackend):
    """softmax as `exp(x) / exp(x).sum(dim)`: no max subtracted, so large logits overflow."""

    def __init__(self):
        super().__init__("softmax without max subtraction")

    def rewrite(self, gm):
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in (F.softmax, torch.softmax):
                dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else -1)
                with gm.graph.inserting_before(node):
                    exp = gm.graph.call_function(torch.exp, (node.args[0],))
                    total = gm.graph.call_function(torch.sum, (exp,), {"dim": dim, "keepdim": True})
                    ratio = gm.graph.call_function(operator.truediv, (exp, total))
                node.replace_all_uses_with(ratio)
                gm.graph.erase_node(node)


class ReassociatedAdd(CountingBackend):
    """`(a + b) + c` computed as `a + (b + c)`: the first add whose first operand is an add."""

    def __init__(self):
        super().__init__("(a + b) + c as a + (b + c)")

    def rewrite(self, gm):
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not operator.add:
                continue
            inner = node.args[0]
            if not (isinstance(inner, torch.fx.Node) and inner.target is operator.add and len(inner.users) == 1):
                continue
            a, b = inner.args
            c = node.args[1]
            with gm.graph.inserting_before(node):
                right = gm.graph.call_function(operator.add, (b, c))
                total = gm.graph.call_function(operator.add, (a, right))
            node.replace_all_uses_with(total)
            gm.graph.erase_node(node)
            gm.graph.erase_node(inner)
            return


# -- models ------------------------------------------------------------------------------------


class GeluMLP(nn.Module):
    def __init__(self, width: int = 8, hidden: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        h = self.fc1(x)
        a = F.gelu(h)
        y = self.fc2(a)
        return y + x


class GeluNet(nn.Module):
    """A linear, a GeluMLP, a LayerNorm."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.mlp = GeluMLP(width, 2 * width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        h = self.inp(x)
        h = h * 2.0
        h = self.mlp(h)
        h = self.norm(h)
        return h.tanh()


class Attention(nn.Module):
    """One head of self-attention with a residual; `sharpness` scales the logits."""

    def __init__(self, width: int = 8, sharpness: float = 1.0):
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.sharpness = sharpness

    def forward(self, x):
        q = self.q(x)
        k = self.k(x)
        v = self.v(x)
        scores = q @ k.transpose(-1, -2)
        scores = scores * (self.sharpness / math.sqrt(q.shape[-1]))
        weights = F.softmax(scores, dim=-1)
        mixed = weights @ v
        return x + self.out(mixed)


class Cancelling(nn.Module):
    """`(big + -big) + small`: exact in this order, not in another."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        small = self.fc(x)
        big = x * 1e6
        total = (big + (-big)) + small
        return total.tanh()


class Dropping(nn.Module):
    """A linear then dropout: in training mode, two runs differ."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


def expected_line(obj, text: str) -> tuple[str, int]:
    """(file, line) of the first line of `obj`'s source holding `text`."""
    lines, first = inspect.getsourcelines(obj)
    for k, line in enumerate(lines):
        if text in line:
            return inspect.getsourcefile(obj), first + k
    raise ValueError(f"{text!r} is not in the source of {obj!r}")


def tiny_gpt2(layers: int = 1, activation: str = "gelu", dtype: torch.dtype = torch.float32, defaults: bool = False):
    """A GPT2Model from its config (random weights; eager attention and no cache, or with `defaults`
    the config's own: sdpa and a DynamicCache the layers append to) and its input ids."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=2, n_positions=64, vocab_size=128,
                        activation_function=activation, **({} if defaults else {"use_cache": False}))
    if not defaults:
        config._attn_implementation = "eager"
    model = GPT2Model(config).eval().to(dtype)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}


def tiny_llama(layers: int = 1):
    """A LlamaModel from the zoo's tiny config (random weights, its default attention) and input ids."""
    import transformers

    from nnschemaparser.validation.zoo_common import LLAMA

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": layers})
    model = transformers.LlamaModel(config).eval()
    return model, {"input_ids": torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))}
