"""Views one action away (issue 42, point 3): "output" runs to the tensor a block returns (the first
tensor of an attention block's tuple), exactly the module's own output; its heads and its statement
in every layer follow from there. On a 4-layer transformers GPT-2 with eager attention."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.block_actions import run_to_output
from nnschemaparser.widget.messages import handle_message
from nnschemaparser.widget.state import InspectorError
from tests.support.store_models import tiny_gpt2


@pytest.fixture(scope="module")
def gpt2():
    model, schema = tiny_gpt2(4)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}, schema


def test_output_of_an_attention_block_is_its_returned_tensor_and_its_heads_follow(gpt2):
    model, inputs, schema = gpt2
    seen = {}

    def keep(module, args, out):  # returns None: the output is left as it is
        seen["out"] = out[0].detach().clone()

    handle = model.h[1].attn.register_forward_hook(keep)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    state = InspectorState(schema, inputs, None)
    node = state.tree.find_block("h.1.attn")
    reply = handle_message(state, {"type": "run_to_output", "id": 1, "node": node, "with_debug": True})
    assert reply["ok"], reply
    out = reply["data"]["output"]
    assert out["var"] == "attn_output" and out["block"] == "h.1.attn" and state.status == "paused"
    value = state.active.trace.steps[out["trace_step"] - 1].tensor.value
    assert torch.equal(value, seen["out"])  # the block's output, not its (output, weights) tuple
    assert state.stop_reason == "returned from h.1.attn"
    assert state.tree.source_words(out["statement"]) == "attn_output = self.resid_dropout(attn_output)"
    heads = state.recomputed_attention_view(out["block"])
    assert heads["block"] == "h.1.attn" and heads["heads"] == model.config.n_head
    layers = state.same_statement(out["statement"], var=out["var"])
    assert [run["cells"][1]["trace_step"] for run in layers["runs"]] == [out["trace_step"]]
    assert state.breakpoints.hits == []  # where the run was sent is no breakpoint hit
    # again from there: nothing runs; from a later step, the run starts over and stops there again
    assert run_to_output(state, node) == out and state.step_index == out["step_index"] + 1
    state.step()
    again = run_to_output(state, node)
    assert again["trace_step"] == out["trace_step"] and state.active.name == "base" and state.active.id == 2
    with pytest.raises(InspectorError, match="'output' needs a block row"):
        run_to_output(state, out["statement"])
    state.close()
