"""Views of issue 22, point 3: a zero-centred scale for signed values, by-layer series of a paused run."""

from __future__ import annotations

import torch

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.tensor_views import heatmap_slice
from tests.support.debugger_models import llama_case


def test_a_signed_slice_gets_a_diverging_scale_centred_on_zero():
    value = torch.tensor([[-1.0, 0.5], [3.0, 0.0]])
    view = heatmap_slice(value)
    assert view["scale"] == "diverging" and view["range"] == [-3.0, 3.0]
    assert (view["min"], view["max"]) == (-1.0, 3.0)  # the slice's own ends are still told
    positive = heatmap_slice(value.abs())
    assert positive["scale"] == "sequential" and positive["range"] == [0.0, 3.0]


def test_by_layer_series_of_a_paused_run_leaves_out_the_layer_still_running_and_gives_the_axis():
    _, inputs, schema = llama_case(4)
    state = InspectorState(schema, inputs)
    state.continue_()
    state.break_at("model.layers.2.mlp")
    state.reset()
    state.continue_()  # paused inside layer 2: layers 0 and 1 have returned, layer 2 has not
    data = state.layers("hidden_states")
    base, paused = data["series"]
    assert base["layers"] == [0, 1, 2, 3] and paused["layers"] == [0, 1] and paused["finished"] is False
    assert data["axis"] == [0, 1, 2, 3]
    assert paused["values"] == base["values"][:2]  # the same input: the same values at the same layers
