"""Block-path globs of `keep=` (block terms and `call=`): `*` and `?` stay within one path segment, as a shell's
do within a folder, and `**` crosses dots; variable and op globs stay fnmatch's. On transformers Llama and GPT-2
built from their configs (random weights, offline)."""

from __future__ import annotations

import os

import pytest
import torch

from nnschemaparser import NNParser, capture_run
from nnschemaparser.traces.selection import is_block_call, keep_selector
from tests.support.exactness import hooked_outputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _llama(layers: int = 4):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    model = LlamaModel(config).eval()
    scope = {"input_ids": torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))}
    return model, NNParser.parse_model(model=model, inputs_tensors_values=dict(scope)), scope


def _kept_ops(schema, scope, keep):
    with torch.no_grad():
        return [s.op_name for s in capture_run(schema, dict(scope), keep=keep).trace if s.omitted is None]


def test_a_call_star_keeps_each_layers_output_only_and_double_star_crosses_dots():
    model, schema, scope = _llama(4)
    layers = ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert _kept_ops(schema, scope, "call=layers.*") == layers
    assert _kept_ops(schema, scope, "call=layers.?") == layers
    deep = _kept_ops(schema, scope, "call=layers.**")
    assert set(layers) < set(deep) and "layers.2.mlp.down_proj" in deep and "layers.0.mlp" in deep  # (self_attn returns a tuple: no tensor at its call)
    assert _kept_ops(schema, scope, "call=layers.*.mlp") == [f"{p}.mlp" for p in layers]
    # what forward hooks on the four layers see, value for value
    seen = hooked_outputs(model.layers[:4], lambda: model(**dict(scope)))
    with torch.no_grad():
        kept = [s.value for s in capture_run(schema, dict(scope), keep="call=layers.*").trace]
    assert len(kept) == 4 and all(torch.equal(a, b) for a, b in zip(kept, seen))


def test_block_globs_follow_the_same_path_rule_and_still_cover_the_blocks_inside():
    selector = keep_selector("h.*.attn:attn_output")
    assert selector.matches("h.3.attn", "attn_output", "", "activation")
    assert not selector.matches("x.h.3.attn", "attn_output", "", "activation")
    assert keep_selector("h.*").matches("h.3.mlp.c_fc", "x", "", "activation")  # inside h.3
    assert not keep_selector("*attn").matches("h.3.attn", "x", "", "activation")  # one segment: no dot crossed
    assert keep_selector("**attn").matches("h.3.attn", "x", "", "activation")
    assert keep_selector("h.[0-2]").matches("h.2", "x", "", "activation")
    assert not keep_selector("h.[!0-2]").matches("h.2", "x", "", "activation")
    assert keep_selector("op=*linear").matches("h.3.mlp", "x", "torch._C._nn.linear", "activation")  # ops: fnmatch
    assert keep_selector("call=**").matches("GPT2Model", "x", "h.3.mlp", "activation", call=True)
    assert not keep_selector("call=*").matches("GPT2Model", "x", "h.3.mlp", "activation", call=True)
    assert not keep_selector("call=h.*").keeps_call_of("h.3.attn") and keep_selector("call=h.**").keeps_call_of("h.3.attn")


@pytest.mark.parametrize("keep, expected", [("call=h.*", 2), ("call=h.*.mlp", 2), ("call=**", None)])
def test_gpt2_globs_keep_one_value_per_layer_where_a_star_names_one_segment(keep, expected):
    from tests.support.store_models import tiny_gpt2, token_inputs

    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    with torch.no_grad():
        full = capture_run(schema, dict(scope)).trace
        kept = [s for s in capture_run(schema, dict(scope), keep=keep).trace if s.omitted is None]
    if expected is None:  # every block call at any depth, as a full capture holds them
        expected = sum(1 for s in full if s.slot_type == "activation" and is_block_call(s.description))
    assert len(kept) == expected
