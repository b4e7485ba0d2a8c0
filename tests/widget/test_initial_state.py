"""The initial widget state (issue 22, point 4): under 100 KB on an 8-layer Llama, the tree sent lazily."""

from __future__ import annotations

import json

import pytest

from nnschemaparser.widget.messages import handle_message
from tests.support.debugger_models import llama_case


def test_the_initial_state_of_an_8_layer_llama_is_under_100_kb_and_the_rest_of_the_tree_comes_on_request():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget import InspectorWidget

    _, inputs, schema = llama_case(8)
    widget = InspectorWidget(schema, inputs, gradients=False)
    state = widget.get_state()  # what the front end receives on open, browser code included
    size = len(json.dumps(state, ensure_ascii=False))
    assert size < 100_000, f"initial widget state is {size} bytes"
    sent = {row[0] for row in state["tree"]["rows"]}
    assert len(sent) < len(widget.state.tree)  # lazily: most rows are not in the first state
    # a step deep inside layer 7: its ancestors' rows come in one children request
    widget.break_at("model.layers.7.self_attn")
    widget.continue_()
    ancestors = widget.step_info["ancestors"]
    missing = [a for a in ancestors if a not in sent]
    assert missing
    reply = handle_message(widget.state, {"type": "children", "id": 1, "nodes": ancestors})
    got = {row[0] for row in reply["data"]["rows"]}
    assert widget.step_info["node"] in got | sent
    widget.close()
