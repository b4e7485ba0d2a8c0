"""The two benchmark models shared by every bench script: a dispatch-bound MLP stack and GPT-2 small."""

from __future__ import annotations

import torch
from torch import nn


class LinearStack(nn.Module):
    """64 Linear(64, 64) layers with relu between them: per-op overhead dominates at batch 1."""

    def __init__(self, depth: int = 64, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def linear_stack():
    torch.manual_seed(0)
    return LinearStack().eval(), {"x": torch.randn(1, 64)}


def gpt2_small(tokens: int = 64):
    """A GPT-2-small-sized GPT2Model (12 layers, 768 wide) from its config: random weights, offline."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    config._attn_implementation = "eager"
    model = GPT2Model(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}
