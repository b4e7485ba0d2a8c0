"""A forward replaced on the instance by a function bound to it is lowered as the block's forward
and runs interpreted, the modules it calls too, while the instance holds it.

TransformerLens 4.3's `T5BlockBridge` puts `types.MethodType(patched_forward, block)` on each HF
`T5Block` (a closure over the bridge that calls the block's layers); before, the block ran live
("its forward is replaced on the instance") and so did the `T5Attention` under transformers'
`deprecate_kwarg` it reaches (a "dispatch" row each). The mimic copies the shapes of
transformer_lens/model_bridge/generalized_components/t5_block.py:92-194 (`_patch_t5_block_forward`);
the last test runs the real T5 bridge when `transformer_lens` is installed."""

from __future__ import annotations

import inspect
import os
import types
from typing import Any

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run

transformers = pytest.importorskip("transformers")
from transformers.utils.deprecation import deprecate_kwarg  # noqa: E402


class _Attention(nn.Module):
    """An HF attention: its forward under `deprecate_kwarg`, as every transformers 5.24 attention."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.1)

    @deprecate_kwarg("past_key_value", "99.0.0", new_name="past_key_values")
    def forward(self, hidden_states, attention_mask=None, past_key_values=None):
        scores = self.dropout(self.q(hidden_states))
        if attention_mask is not None:
            scores = scores + attention_mask
        return scores, None


class _Block(nn.Module):
    """An HF T5Block: `layer` holds the attention and the feed-forward."""

    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([_Attention(), nn.Linear(4, 4)])

    def forward(self, hidden_states, attention_mask=None):
        return (self.layer[1](self.layer[0](hidden_states, attention_mask)[0]),)


class _BlockBridge(nn.Module):
    """t5_block.py:92-194: the bridge keeps the bound class forward on itself, then puts a closure
    over itself (`self.hook_in`, `self.hook_resid_mid`, `self.hook_out`) on the block's instance;
    the closure picks keyword arguments from `inspect.signature(layers[0].forward)`."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.hook_in = nn.Identity()
        self.hook_resid_mid = nn.Identity()
        self.hook_out = nn.Identity()
        self.add_module("_original_component", original)
        self._patch_block_forward()

    def _patch_block_forward(self) -> None:
        original_component = self._modules["_original_component"]
        self._original_block_forward = original_component.forward

        def patched_forward(block_self, hidden_states, attention_mask=None, past_key_values=None, **kwargs):
            hidden_states = self.hook_in(hidden_states)
            layers = block_self.layer
            self_attn_params = set(inspect.signature(layers[0].forward).parameters.keys())
            self_attn_kwargs = dict(hidden_states=hidden_states, attention_mask=attention_mask)
            if "past_key_values" in self_attn_params:
                self_attn_kwargs["past_key_values"] = past_key_values
            self_attention_outputs = layers[0](**self_attn_kwargs)
            hidden_states = self.hook_resid_mid(self_attention_outputs[0] * 2)
            hidden_states = layers[1](hidden_states)
            return (self.hook_out(hidden_states),)

        original_component.forward = types.MethodType(patched_forward, original_component)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._modules["_original_component"](*args, **kwargs)


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_BlockBridge(_Block()) for _ in range(2)])

    def forward(self, x, mask):
        for block in self.blocks:
            x = block(x, attention_mask=mask)[0]
        return x


def _model_and_inputs():
    torch.manual_seed(0)
    return _Stack().eval(), {"x": torch.randn(2, 3, 4), "mask": torch.randn(2, 3, 4)}


def test_a_forward_replaced_on_the_instance_runs_interpreted_with_the_decorated_attention_it_calls():
    model, inputs = _model_and_inputs()
    expected = model(**inputs)
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    assert schema.skipped == {} and schema.coverage().empty
    block = schema.find("blocks.1._original_component")
    assert block.skip_reason is None and block.instance_forward is model.blocks[1]._original_component.forward
    record = capture_run(schema, dict(inputs), coverage=True)
    assert torch.equal(record.outputs[0], expected) and record.coverage().empty
    steps = {(step.block_path, step.out_var) for step in record.trace.steps}
    assert ("blocks.1._original_component", "hidden_states") in steps  # the closure's own statements
    assert ("blocks.1._original_component.layer.0", "scores") in steps  # the attention, inside its decorator
    assert torch.equal(SchemaInterpreter().call(schema, **inputs), expected)


def test_a_forward_replaced_again_or_removed_after_parsing_is_what_the_schema_calls():
    model, inputs = _model_and_inputs()
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    inner = model.blocks[0]._original_component
    inner.forward = types.MethodType(lambda block_self, hidden_states, **kwargs: (hidden_states * 5,), inner)
    assert torch.equal(SchemaInterpreter().call(schema, **inputs), model(**inputs))
    del inner.forward  # the class's forward again
    assert torch.equal(SchemaInterpreter().call(schema, **inputs), model(**inputs))


def test_the_real_transformer_lens_t5_bridge_runs_its_blocks_and_attentions_interpreted():
    pytest.importorskip("transformer_lens")
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
                                   num_heads=2, decoder_start_token_id=0)
    torch.manual_seed(0)
    bridge = build_bridge_from_module(transformers.T5ForConditionalGeneration(config).eval(),
                                      "T5ForConditionalGeneration", hf_config=config).eval()
    inputs = {"input": torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0)),
              "decoder_input": torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(1))}
    schema = NNParser.parse_model(bridge, inputs_tensors_values=inputs)
    assert schema.skipped == {} and schema.coverage().empty
    with torch.no_grad():
        expected = bridge(**inputs)
        record = capture_run(schema, dict(inputs), coverage=True)
    assert torch.equal(record.outputs[0], expected) and record.coverage().empty
    paths = {step.block_path for step in record.trace.steps}
    assert "encoder_blocks.0._original_component" in paths
    assert any(path.endswith("SelfAttention._original_component") for path in paths)
