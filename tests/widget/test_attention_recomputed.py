"""Attention per head for fused attention calls (issue 22, point 3): the weights recomputed from an
sdpa call's own query, key, mask and scale, checked against the eager model's `attn_weights`."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.widget.inspector import InspectorWidget
from nnschemaparser.widget.messages import handle_message
from tests.support.debugger_models import parsed


def _llama(impl: str):
    import transformers

    from nnschemaparser.validation.zoo_common import LLAMA

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 2})
    config._attn_implementation = impl
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def inputs():
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "use_cache": False}


@pytest.fixture(scope="module")
def eager_weights(inputs):
    with torch.no_grad():
        return _llama("eager")(**inputs, output_attentions=True).attentions


def _finished(impl: str, inputs) -> InspectorWidget:
    widget = InspectorWidget(parsed(_llama(impl), **inputs), inputs, gradients=False)
    widget.continue_()
    return widget


def test_sdpa_heads_recomputed_from_the_calls_inputs_equal_eager_attn_weights(inputs, eager_weights):
    widget = _finished("sdpa", inputs)
    for layer in (0, 1):
        heads = widget.attention_heads(f"layers.{layer}.self_attn")
        assert heads["recomputed"] and heads["function"] == "sdpa_attention_forward"
        assert heads["block"] == f"model.layers.{layer}.self_attn"
        assert "causal mask" in heads["note"]  # sdpa got no mask: causal, as the kernel was told
        reference = eager_weights[layer]
        assert heads["weights"].shape == reference.shape == (1, 4, 8, 8)  # 4 query heads over 2 key heads
        # float32 tolerance: eager adds a finite min-value mask where this fills -inf (measured max |diff| 1.5e-8)
        torch.testing.assert_close(heads["weights"], reference, rtol=0, atol=1e-6)
        assert bool((heads["weights"].triu(diagonal=1) == 0).all())  # nothing attends to a later token
    assert heads["tokens"] == [str(int(t)) for t in inputs["input_ids"][0]]
    widget.close()


def test_eager_heads_recomputed_are_the_eager_weights_bit_for_bit(inputs, eager_weights):
    widget = _finished("eager", inputs)
    heads = widget.attention_heads("model.layers.1.self_attn")
    assert heads["function"] == "eager_attention_forward"
    assert torch.equal(heads["weights"], eager_weights[1])  # the same operations in the same order
    widget.close()


def test_the_browser_gets_the_recomputed_heads_labelled_with_tokens(inputs):
    widget = _finished("sdpa", inputs)
    reply = handle_message(widget.state, {"type": "attention", "id": 1, "block": "model.layers.0.self_attn"})
    assert reply["ok"], reply
    data = reply["data"]
    assert data["attention"] and data["recomputed"] and data["reason"].startswith("recomputed from the sdpa")
    assert data["heads"] == 4 and len(data["patterns"]) == 4 and data["tokens"][0] == str(int(inputs["input_ids"][0, 0]))
    # the tensor view of a step in that block offers the heads
    row = next(r for r in widget.state.active.steps if r["block"] == "model.layers.0.self_attn" and r["trace_step"])
    view = handle_message(widget.state, {"type": "tensor", "id": 2, "trace_step": row["trace_step"]})["data"]
    assert view["attention_block"] == "model.layers.0.self_attn"
    widget.close()


def test_asking_before_the_call_ran_says_what_to_do(inputs):
    widget = InspectorWidget(parsed(_llama("sdpa"), **inputs), inputs, gradients=False)
    widget.step()
    reply = handle_message(widget.state, {"type": "attention", "id": 1, "block": "model.layers.0.self_attn"})
    assert not reply["ok"] and "made no attention call" in reply["error"] and "step or continue past" in reply["error"]
    widget.close()
