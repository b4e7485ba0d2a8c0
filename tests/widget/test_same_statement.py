"""The same statement in every layer of a repeated block (issue 22, point 2)."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.tensor_views import TensorViewError
from tests.support.debugger_models import llama_case


@pytest.fixture(scope="module")
def llama4():
    return llama_case(4)


def test_one_statement_is_shown_per_layer_and_per_run_with_its_own_values(llama4):
    _, inputs, schema = llama4
    state = InspectorState(schema, inputs)
    state.continue_()
    row = next(r for r in state.search("attn_output") if r["kind"] == "statement" and r["ran"])
    view = state.same_statement(row["node"])
    assert view["prefix"] == "model.layers" and view["layers"] == [0, 1, 2, 3]
    assert all(n >= 0 for n in view["nodes"]) and len(set(view["nodes"])) == 4
    (base,) = view["runs"]
    for layer, cell in zip(view["layers"], base["cells"]):
        assert cell["var"] == "attn_output" and cell["block"] == f"model.layers.{layer}.self_attn"
        value = state.active.trace.steps[cell["trace_step"] - 1].tensor.value
        assert cell["stats"]["norm"] == float(torch.linalg.vector_norm(value.double()))
    assert len({c["stats"]["norm"] for c in base["cells"]}) == 4  # each layer's own value
    # a second run paused in layer 1: layers it has not reached have no value yet
    first = state.active
    state.reset()
    state.run_to(first.trace_index[base["cells"][1]["trace_step"]] + 5)
    view = state.same_statement(view["nodes"][2])  # picked in another layer: the same row everywhere
    assert [c is not None for c in view["runs"][1]["cells"]] == [True, True, False, False]
    assert view["runs"][1]["cells"][0]["stats"] == base["cells"][0]["stats"]  # same input, same value


def test_a_row_outside_any_layer_is_refused_with_what_to_pick(llama4):
    _, inputs, schema = llama4
    state = InspectorState(schema, inputs)
    with pytest.raises(TensorViewError, match="not inside a layer of a ModuleList"):
        state.same_statement(0)
