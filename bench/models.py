"""The benchmark models shared by the bench scripts.

The core pair (a dispatch-bound MLP stack and GPT-2 small) and the dispatch-bound suite of
`bench_dispatch.py`: small configs with many layers and lots of Python around the ops (a 32-layer
tiny Llama, a 12-layer tiny Mixtral, a tiny ViT, a 24-block ResNet-style CNN at batch 1). Every
`transformers` model is built from its config class: random weights, offline, eager attention.
"""

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


def _eager(config):
    config._attn_implementation = "eager"
    return config


def _ids(vocab: int, tokens: int) -> "torch.Tensor":
    return torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))


def tiny_llama(layers: int = 32, tokens: int = 16):
    """LlamaModel, 32 layers, hidden 64 (4 query / 2 key-value heads), 16 tokens, no cache."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = _eager(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    return LlamaModel(config).eval(), {"input_ids": _ids(256, tokens), "use_cache": False}


def wider_llama(layers: int = 32, tokens: int = 64):
    """The same 32 layers at hidden 256 (8 query / 4 key-value heads, MLP 704), 64 tokens: a model whose
    ops take time (about 50 ms a forward on one thread here), beside the dispatch-bound tiny one."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = _eager(LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=layers,
                                num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2 * tokens))
    return LlamaModel(config).eval(), {"input_ids": _ids(1024, tokens), "use_cache": False}


def tiny_mixtral(layers: int = 12, tokens: int = 16):
    """MixtralModel, 12 layers, hidden 64, 4 experts routed top-2 in Python, 16 tokens, no cache."""
    from transformers import MixtralConfig, MixtralModel

    torch.manual_seed(0)
    config = _eager(MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=layers,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  num_local_experts=4, num_experts_per_tok=2))
    return MixtralModel(config).eval(), {"input_ids": _ids(256, tokens), "use_cache": False}


def tiny_vit(layers: int = 12):
    """ViTModel, 12 layers, hidden 64, 32x32 image in 4x4 patches (65 tokens), batch 1."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = _eager(ViTConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128,
                              image_size=32, patch_size=4, num_channels=3))
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return ViTModel(config).eval(), {"pixel_values": pixels}


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + batch norm, relu, identity or 1x1 projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + identity)


class SmallResNet(nn.Module):
    """A 24-block ResNet-style CNN (3 stages of 8 basic blocks, 16/32/64 channels) for 32x32 images."""

    def __init__(self, blocks_per_stage: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        stages = []
        cin = 16
        for i, cout in enumerate((16, 32, 64)):
            for j in range(blocks_per_stage):
                stages.append(BasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def small_resnet():
    torch.manual_seed(0)
    model = SmallResNet().eval()
    return model, {"x": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
