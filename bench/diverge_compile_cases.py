"""Planted-fault cases for a compiled model (issue 39, the compiler kind of `bench/bench_diverge.py`).

`CASES` is a list of builder functions; each returns `(model_a, model_b, inputs, expected)`:
`model_b` is `torch.compile(model_a, backend=...)`, `expected` the `(file, line)` of the statement
whose op the backend computes differently, or None for a fault-free pair. The faults are user
backends (fx passes over the graph dynamo hands them, `tests/support/compile_faults.py`): gelu as its
tanh approximation, a matmul scaled by 1 + 1e-2 (in GPT-2 and Llama too), softmax without its max subtracted (on logits that
overflow), `(a + b) + c` reassociated where that loses the small term. Fault-free pairs: `aot_eager`,
a pass-through user backend, bfloat16 under `aot_eager`, and inductor on CPU. Seeds vary the
weights and inputs. `bench/bench_diverge_compile.py` runs them.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.compile_faults import (Attention, Cancelling, CountingBackend, GeluMLP, GeluNet,  # noqa: E402
                                          NaiveSoftmax, ReassociatedAdd, ScaledMatmul, TanhGelu, expected_line,
                                          tiny_gpt2, tiny_llama)

__all__ = ["CASES"]


def _gelu_net(seed: int, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    return GeluNet().eval().to(dtype), {"x": (torch.randn(4, 8) * 3).to(dtype)}


def _attention(seed: int, sharpness: float = 1.0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    return Attention(sharpness=sharpness).eval().to(dtype), {"x": torch.randn(2, 5, 8).to(dtype)}


def _cancelling(seed: int):
    torch.manual_seed(seed)
    return Cancelling().eval(), {"x": torch.randn(3, 8)}


def gelu_as_tanh(seed: int):
    model, inputs = _gelu_net(seed)
    return model, torch.compile(model, backend=TanhGelu()), inputs, expected_line(GeluMLP.forward, "a = F.gelu(h)")


def first_linear_scaled(seed: int):
    model, inputs = _gelu_net(seed)
    return (model, torch.compile(model, backend=ScaledMatmul(width=8)), inputs,
            expected_line(nn.Linear.forward, "return F.linear("))


def attention_scores_scaled(seed: int):
    model, inputs = _attention(seed)
    return (model, torch.compile(model, backend=ScaledMatmul(width=5)), inputs,
            expected_line(Attention.forward, "scores = q @ k.transpose(-1, -2)"))


def softmax_without_max(seed: int):
    model, inputs = _attention(seed, sharpness=400.0)
    return (model, torch.compile(model, backend=NaiveSoftmax()), inputs,
            expected_line(Attention.forward, "weights = F.softmax(scores, dim=-1)"))


def add_reassociated(seed: int):
    model, inputs = _cancelling(seed)
    return (model, torch.compile(model, backend=ReassociatedAdd()), inputs,
            expected_line(Cancelling.forward, "total = (big + (-big)) + small"))


def gpt2_gelu_as_tanh(seed: int):
    from transformers.activations import GELUActivation

    model, inputs = tiny_gpt2(layers=1, activation="gelu")
    expected = expected_line(GELUActivation.forward, "return self.act(")
    return model, torch.compile(model, backend=TanhGelu()), inputs, expected


def gpt2_c_attn_scaled(seed: int):
    from transformers.pytorch_utils import Conv1D

    model, inputs = tiny_gpt2(layers=1, defaults=True)
    expected = expected_line(Conv1D.forward, "torch.addmm(")
    return model, torch.compile(model, backend=ScaledMatmul(width=96)), inputs, expected


def gpt2_attn_c_proj_scaled(seed: int):
    from transformers.pytorch_utils import Conv1D

    model, inputs = tiny_gpt2(layers=2)
    expected = expected_line(Conv1D.forward, "torch.addmm(")
    return model, torch.compile(model, backend=ScaledMatmul(width=32)), inputs, expected


def llama_gate_proj_scaled(seed: int):
    model, inputs = tiny_llama(layers=1)
    return (model, torch.compile(model, backend=ScaledMatmul(width=64)), inputs,
            expected_line(nn.Linear.forward, "return F.linear("))


def llama_aot_eager(seed: int):
    model, inputs = tiny_llama(layers=1)
    return model, torch.compile(model, backend="aot_eager"), inputs, None


def net_aot_eager(seed: int):
    model, inputs = _gelu_net(seed)
    return model, torch.compile(model, backend="aot_eager"), inputs, None


def net_pass_through(seed: int):
    model, inputs = _gelu_net(seed)
    return model, torch.compile(model, backend=CountingBackend()), inputs, None


def attention_aot_eager(seed: int):
    model, inputs = _attention(seed)
    return model, torch.compile(model, backend="aot_eager"), inputs, None


def attention_bf16_aot_eager(seed: int):
    model, inputs = _attention(seed, dtype=torch.bfloat16)
    return model, torch.compile(model, backend="aot_eager"), inputs, None


def gpt2_aot_eager(seed: int):
    model, inputs = tiny_gpt2(layers=1)
    return model, torch.compile(model, backend="aot_eager"), inputs, None


def mlp_inductor(seed: int):
    torch.manual_seed(seed)
    model = GeluMLP().eval()
    return model, torch.compile(model), {"x": torch.randn(4, 8)}, None


def _seeded(builder, seed: int):
    case = functools.partial(builder, seed)
    case.__name__ = f"{builder.__name__}[{seed}]"
    return case


SEEDS = (0, 1)
CASES = ([_seeded(b, s) for b in (gelu_as_tanh, first_linear_scaled, attention_scores_scaled, softmax_without_max,
                                  add_reassociated) for s in SEEDS]
         + [_seeded(b, 0) for b in (gpt2_gelu_as_tanh, gpt2_c_attn_scaled, gpt2_attn_c_proj_scaled,
                                    llama_gate_proj_scaled)]
         + [_seeded(b, s) for b in (net_aot_eager, net_pass_through, attention_aot_eager, attention_bf16_aot_eager)
            for s in SEEDS]
         + [_seeded(gpt2_aot_eager, 0), _seeded(llama_aot_eager, 0), _seeded(mlp_inductor, 0)])
