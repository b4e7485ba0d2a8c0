"""Forwards under transformers' `deprecate_kwarg` run interpreted, inside the decorator.

transformers 5.24 decorates its attention, decoder-layer and model forwards with
`@deprecate_kwarg("past_key_values", ..., new_name="cache")`. The decorator closes over the
function it wraps, so the schema runs inside a copy of it: a renamed keyword is renamed and warned
about as in eager. TransformerLens bridges put a bridge module in place of each HF attention and
call it as `self.original_component(*args, **kwargs)`; the HF attention under the bridge is still
interpreted, nothing skipped."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run

transformers = pytest.importorskip("transformers")
from transformers.utils.deprecation import deprecate_kwarg  # noqa: E402


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @deprecate_kwarg("scale", "99.0.0", new_name="factor")
    def forward(self, x, factor=1.0):
        scaled = self.fc(x) * factor
        return scaled


class CallsWithOldAndNewNames(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Scaled()

    def forward(self, x):
        return self.inner(x, scale=2.0) + self.inner(x, factor=3.0)


def test_a_deprecate_kwarg_forward_renames_and_warns_as_eager_and_runs_interpreted():
    torch.manual_seed(0)
    model = CallsWithOldAndNewNames().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {} and schema.coverage().empty
    assert schema.sub_blocks["inner"].wrapper is not None  # the decorator is kept around the schema
    with warnings.catch_warnings(record=True) as eager_warnings:
        warnings.simplefilter("always")
        expected = model(x)
    with warnings.catch_warnings(record=True) as schema_warnings:
        warnings.simplefilter("always")
        record = capture_run(schema, {"x": x}, coverage=True)
    assert [str(w.message) for w in schema_warnings if w.category is FutureWarning] == \
        [str(w.message) for w in eager_warnings if w.category is FutureWarning] != []
    assert torch.equal(record.outputs[0], expected)
    assert record.coverage().empty
    assert sum(step.block_path == "inner" and step.out_var == "scaled" for step in record.trace.steps) == 2


class AttentionBridge(nn.Module):
    """What a TransformerLens bridge does with an HF attention: holds it as `original_component`
    and calls it with whatever the decoder layer passed."""

    def __init__(self, original):
        super().__init__()
        self.original_component = original

    def forward(self, *args, **kwargs):
        output = self.original_component(*args, **kwargs)
        return output


def test_hf_attention_under_deprecate_kwarg_inside_a_bridge_is_interpreted():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    attention = type(model.model.layers[0].self_attn)
    assert getattr(attention.forward, "__wrapped__", None) is not None  # transformers wraps it
    for layer in model.model.layers:
        layer.self_attn = AttentionBridge(layer.self_attn)
    inputs = {"input_ids": torch.randint(0, 64, (1, 7)), "use_cache": False}
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    assert schema.skipped == {}
    assert schema.coverage().empty
    attn = schema.find("model.layers.1.self_attn.original_component")
    assert attn.skip_reason is None and attn.wrapper is not None
    with torch.no_grad():
        expected = model(**inputs).logits
    record = capture_run(schema, dict(inputs), coverage=True)
    assert torch.equal(record.outputs[0].logits, expected)
    assert record.coverage().empty
    assert any(step.block_path == "model.layers.1.self_attn.original_component" and step.out_var == "attn_output"
               for step in record.trace.steps)
    got = SchemaInterpreter().call(schema, **inputs).logits
    assert torch.equal(got, expected)
