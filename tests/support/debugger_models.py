"""Models for the inspector-as-debugger tests (defined in a file: the parser reads source).

Decorated, nested, method and closure code for the source-line tests; an unused `torch.split` piece
(autograd hands its hook `None`); a value built and then changed in place (like an MoE's
`output[tokens] += ...`); and tiny `transformers` GPT-2 and Llama built from their configs.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from nnschemaparser import NNParser


def logged(fn):
    """A `functools.wraps` decorator, as transformers puts on every forward."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    """A decorated forward calling a method and a closure; the method is decorated too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @logged
    def scaled(self, h: torch.Tensor) -> torch.Tensor:
        doubled = h * 2
        return doubled.tanh()

    @logged
    @logged
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A docstring of
        three lines."""
        h = self.fc(x)

        def shift(v):
            moved = v - 1
            return moved

        g = shift(h) + self.scaled(h)
        return g.relu()


class SplitNet(nn.Module):
    """`torch.split` gives two pieces; only the first reaches the output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        first, second = torch.split(h, 2, dim=-1)
        return first * 3


class InPlaceNet(nn.Module):
    """`output` is made all zeros, then partly filled in place, then returned (like TopTwoMoE's
    `output[tokens] += ...`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(x)
        h = self.fc(x)
        output[:, :2] += h[:, :2]
        return output


class Chain(nn.Module):
    """Three linear layers in blocks, for breakpoints and stepping."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = torch.relu(h)
        h = self.b(h)
        h = h * 2
        return self.c(h)


def parsed(model: nn.Module, **inputs):
    schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))
    return schema


def tiny_case(name: str):
    """(model, inputs, schema) of the zoo's transformers case `name` ("gpt2", "llama"), eval mode."""
    from nnschemaparser.validation.zoo import get_case

    case = get_case(name)
    model = case.build().eval()
    inputs = case.make_inputs(model)
    return model, inputs, parsed(model, **inputs)


def llama_case(layers: int):
    """A tiny Llama with `layers` decoder layers (the benchmark's 32-layer model)."""
    import transformers

    from nnschemaparser.validation.zoo_common import LLAMA

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": layers})
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, config.vocab_size, (1, 8)), "use_cache": False}
    return model, inputs, parsed(model, **inputs)
