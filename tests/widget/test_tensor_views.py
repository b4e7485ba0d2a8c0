"""The inspector's tensor views (heatmap slices, differences, attention heads, trends, layer charts),
computed in Python and served by message; checked against the tensors of the runs, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from nnschemaparser import NNParser
from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.messages import handle_message
from nnschemaparser.widget.tensor_views import (MAX_SIDE, TensorViewError, attention_heads, heatmap_diff,
                                                heatmap_slice, is_attention, layer_series, tensor_stat)
from tests.support.widget_models import mlp_case


def _reply(state, **message):
    reply = handle_message(state, {"id": 3, **message})
    json.dumps(reply, allow_nan=False)
    return reply


def _cell(view, r, c):
    return view["values"][r * len(view["col_ids"]) + c]


def test_heatmap_slice_defaults_to_the_last_two_dims_and_keeps_every_value_exactly():
    torch.manual_seed(0)
    value = torch.randn(2, 3, 4, 5)
    view = heatmap_slice(value)
    assert view["dims"] == [2, 3] and view["index"] == [0, 0, None, None]
    assert (view["rows"], view["cols"]) == (4, 5) and not view["strided"]
    got = torch.tensor(view["values"], dtype=torch.float64).reshape(4, 5)
    assert torch.equal(got.to(torch.float32), value[0, 0])
    assert view["min"] == float(value[0, 0].min()) and view["max"] == float(value[0, 0].max())


def test_heatmap_slice_follows_the_chosen_dims_and_index_in_the_given_order():
    value = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    view = heatmap_slice(value, dims=[2, 0], index=[None, 1, None])
    got = torch.tensor(view["values"]).reshape(view["rows"], view["cols"])
    assert torch.equal(got.to(torch.float32), value[:, 1, :].T)
    assert view["index"] == [None, 1, None]


def test_a_big_slice_is_strided_to_the_cap_and_each_cell_names_its_original_index():
    value = torch.randn(1000, 300)
    view = heatmap_slice(value)
    assert view["strided"] and len(view["row_ids"]) <= MAX_SIDE and len(view["col_ids"]) <= MAX_SIDE
    assert view["note"] == f"strided to at most {MAX_SIDE} per side: every 8th of 1000 rows, every 3rd of 300 columns"
    assert (view["min"], view["max"]) == (float(value.min()), float(value.max())), "the range is the whole slice's"
    for r, c in [(0, 0), (5, 7), (len(view["row_ids"]) - 1, len(view["col_ids"]) - 1)]:
        original = value[view["row_ids"][r], view["col_ids"][c]]
        assert torch.equal(torch.tensor(_cell(view, r, c), dtype=torch.float32), original)


@pytest.mark.parametrize("dims, index, message", [
    ([0, 0], None, "distinct"), ([5], None, "out of range"), (None, [9, None, None], "out of range for dim 0"),
])
def test_a_bad_slice_request_names_the_problem(dims, index, message):
    with pytest.raises(TensorViewError, match=message):
        heatmap_slice(torch.zeros(2, 3, 4), dims=dims, index=index)


def test_a_scalar_or_a_non_tensor_has_no_heatmap():
    with pytest.raises(TensorViewError, match="0-d"):
        heatmap_slice(torch.tensor(1.0))
    with pytest.raises(TensorViewError, match="not a tensor"):
        heatmap_slice([1, 2])


def test_heatmap_diff_is_b_minus_a_with_a_symmetric_range():
    a = torch.zeros(3, 4)
    b = torch.zeros(3, 4)
    b[1, 2] = 0.5
    b[2, 3] = -2.0
    view = heatmap_diff(a, b)
    assert view["scale"] == "diverging" and (view["min"], view["max"]) == (-2.0, 2.0)
    assert _cell(view, 1, 2) == 0.5 and _cell(view, 2, 3) == -2.0 and _cell(view, 0, 0) == 0.0
    with pytest.raises(TensorViewError, match="different shapes"):
        heatmap_diff(a, torch.zeros(4, 3))


def test_attention_is_recognised_from_a_softmax_producer_or_row_stochastic_values():
    weights = torch.randn(1, 2, 3, 3).softmax(-1)
    assert is_attention(weights, "torch.nn.functional.softmax") == "softmax producer"
    assert is_attention(weights, "_operator.getitem") == "row-stochastic"
    assert is_attention(torch.randn(1, 2, 3, 3), "_operator.getitem") == ""
    assert is_attention(weights[0], "torch.nn.functional.softmax") == ""  # 3-d: not [batch, heads, q, k]
    view = attention_heads(weights, tokens=["a", "b", "c"])
    assert view["attention"] and view["shown_heads"] == [0, 1] and view["tokens"] == ["a", "b", "c"]
    assert torch.equal(torch.tensor(view["patterns"][1]).reshape(3, 3).to(torch.float32), weights[0, 1])


def test_tensor_stats_are_mean_std_norm_and_fraction_of_zeros():
    value = torch.tensor([[0.0, 3.0], [4.0, 0.0]])
    assert tensor_stat(value, "norm") == 5.0 and tensor_stat(value, "frac_zeros") == 0.5
    assert tensor_stat(value, "mean") == 1.75
    with pytest.raises(TensorViewError, match="unknown stat"):
        tensor_stat(value, "median")


def test_the_tensor_message_serves_the_current_step_and_a_fork_difference():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.run_to(3)
    reply = _reply(state, type="tensor")
    assert reply["ok"], reply
    view = reply["data"]
    traced = state.active.trace.steps[view["trace_step"] - 1]
    assert view["var"] == "hidden" and view["shape"] == [2, 256]
    assert view["strided"] and view["col_ids"] == list(range(0, 256, 2))  # 256 columns: every 2nd shown
    shown = torch.tensor(view["values"]).reshape(2, 128).to(torch.float32)
    assert torch.equal(shown, traced.tensor.value[:, view["col_ids"]])
    state.edit("scale", 2.0)
    state.continue_()
    state.ensure_base()
    reply = _reply(state, type="tensor", run="fork 1", trace_step=view["trace_step"], against="base")
    assert reply["ok"], reply
    diff = reply["data"]
    base = state.run("base").trace.steps[view["trace_step"] - 1].tensor.value.double()
    fork = state.run("fork 1").trace.steps[view["trace_step"] - 1].tensor.value.double()
    assert diff["scale"] == "diverging" and diff["against"] == "base"
    assert torch.equal(torch.tensor(diff["values"], dtype=torch.float64).reshape(2, 128), (fork - base)[:, ::2])
    assert ("fork 1", view["trace_step"]) in state.viewed
    bad = _reply(state, type="tensor", run="base", trace_step=view["trace_step"], dims=[7])
    assert not bad["ok"] and "out of range" in bad["error"]


def _llama_state(layers: int = 2):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[3, 14, 15, 9, 2]])
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    state = InspectorState(schema, {"input_ids": ids})
    state.continue_()
    return state


def test_llama_eager_attention_weights_are_drawn_per_head_with_token_labels_and_layers_charted():
    state = _llama_state()
    steps = state.active.trace.steps
    attn = [s for s in steps if s.out_var == "attn_weights"]
    assert len(attn) == 2
    reply = _reply(state, type="attention", trace_step=attn[1].step)
    assert reply["ok"], reply
    view = reply["data"]
    assert view["attention"] and view["heads"] == 4 and (view["q"], view["k"]) == (5, 5)
    assert view["tokens"] == ["3", "14", "15", "9", "2"]
    for head in view["shown_heads"]:
        pattern = torch.tensor(view["patterns"][head], dtype=torch.float64).reshape(5, 5)
        assert torch.equal(pattern.to(torch.float32), attn[1].tensor.value[0, head])
    assert _reply(state, type="tensor", trace_step=attn[0].step)["data"]["attention"] == "row-stochastic"
    layers = _reply(state, type="layers", var="hidden_states", stat="norm")
    assert layers["ok"], layers
    series = layers["data"]["series"][0]
    assert series["prefix"] == "model.layers" and series["layers"] == [0, 1]
    for step_number, value in zip(series["steps"], series["values"]):
        traced = steps[step_number - 1]
        assert traced.block_path in ("model.layers.0", "model.layers.1") and traced.out_var == "hidden_states"
        assert value == float(torch.linalg.vector_norm(traced.tensor.value.double()))
    assert layer_series(steps, "hidden_states")["steps"] == series["steps"]
    trends = _reply(state, type="trends", stat="frac_zeros")["data"]
    assert any(s["var"] == "attn_weights" for s in trends["series"])
    assert not any(s["var"].startswith("$") for s in trends["series"])


def test_layers_of_a_variable_not_in_a_module_list_is_refused_with_the_reason():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    reply = _reply(state, type="layers", var="hidden")
    assert not reply["ok"] and "ModuleList" in reply["error"]


def test_tree_colours_give_each_node_its_last_value_stat_or_its_divergence_from_another_run():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    state.reset()
    state.run_to(3)
    state.edit("scale", 0.0)
    state.continue_()
    fork = state.run("fork 1")
    by_stat = _reply(state, type="tree_colours", run="fork 1", stat="norm")["data"]
    hidden_row = fork.step_row(3)
    assert by_stat["values"][str(hidden_row["node"])] == 0.0  # hidden was zeroed
    first_row = fork.step_row(1)
    expected = float(torch.linalg.vector_norm(fork.trace.steps[first_row["trace_step"] - 1].tensor.value.double()))
    assert by_stat["values"][str(first_row["node"])] == expected
    diverged = _reply(state, type="tree_colours", run="fork 1", against="base")["data"]
    assert diverged["what"] == "max |fork 1 - base|"
    assert diverged["values"][str(first_row["node"])] == 0.0, "before the edit the runs agree"
    base_hidden = state.run("base").trace.steps[hidden_row["trace_step"] - 1].tensor.value
    assert diverged["values"][str(hidden_row["node"])] == float(base_hidden.abs().max())
    assert not _reply(state, type="tree_colours", stat="median")["ok"]


def test_a_statement_row_is_coloured_by_the_last_value_of_its_instructions():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    colours = _reply(state, type="tree_colours", stat="norm")["data"]["values"]
    run = state.active
    statements = {}
    for row in run.steps:  # in step order: the last instruction with a value wins
        holder = state.tree.statement_nodes.get(row["node"])
        if holder is not None and str(row["node"]) in colours:
            statements[holder] = colours[str(row["node"])]
    assert statements, "the MLP has statements lowered to several instructions"
    for holder, value in statements.items():
        assert state.tree.nodes[holder].kind == "s" and colours[str(holder)] == value
