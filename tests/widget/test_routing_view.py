"""The widget's MoE routing view: the `routing` reply's matrices are the router's top-k exactly."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.widget import InspectorWidget  # noqa: E402
from nnschemaparser.widget.routing_view import token_route  # noqa: E402


def _mixtral():
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config).eval()


def _router_top_k(model, ids):
    chosen = {}

    def keep(index):
        def hook(module, args, out):
            chosen.setdefault(index, (out[2].clone(), out[1].clone()))  # (top-k experts, their weights)
        return hook

    hooks = [layer.mlp.gate.register_forward_hook(keep(i)) for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return chosen


@pytest.fixture(scope="module")
def mixtral_widget():
    torch.manual_seed(0)
    model = _mixtral()
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    widget = InspectorWidget(schema, {"input_ids": ids}, gradients=False)
    yield model, ids, widget
    widget.close()


def test_routing_reply_matrices_equal_the_routers_top_k(mixtral_widget):
    model, ids, widget = mixtral_widget
    assert widget.moe is True
    reply = widget.handle({"type": "routing", "id": 1})
    assert reply["ok"], reply
    data = reply["data"]
    expected = _router_top_k(model, ids)
    assert [layer["layer"] for layer in data["layers"]] == [0, 1]
    for layer in data["layers"]:
        index, weights = expected[layer["layer"]]
        assert layer["experts"] == [0, 1, 2, 3]
        assert layer["tokens"] == [f"{i}:{int(t)}" for i, t in enumerate(ids[0])]
        assert layer["routes"][0].startswith("token 0:")
        matrix = torch.tensor(layer["weights"], dtype=weights.dtype)
        want = torch.zeros(index.shape[0], 4, dtype=weights.dtype).scatter(1, index, weights)
        assert torch.equal(matrix, want)
        assert int((matrix != 0).sum()) == index.numel()  # exactly top_k experts per token
        # tokens per expert (issue 42): how many tokens the router sent to each expert in this layer
        assert layer["counts"] == torch.bincount(index.flatten(), minlength=4).tolist()


def test_moe_routing_frame_equals_the_routers_top_k(mixtral_widget):
    model, ids, widget = mixtral_widget
    frame = widget.moe_routing()
    expected = _router_top_k(model, ids)
    assert list(frame.columns) == ["block", "layer", "call", "token", "rank", "expert", "weight"]
    for layer, (index, weights) in expected.items():
        rows = frame[frame.layer == layer].sort_values(["token", "rank"])
        assert torch.equal(torch.tensor(rows.expert.to_list()).reshape(index.shape), index)
        assert torch.equal(torch.tensor(rows.weight.to_list(), dtype=weights.dtype).reshape(weights.shape), weights)


def test_routing_of_an_unknown_run_is_a_clear_error(mixtral_widget):
    _, _, widget = mixtral_widget
    reply = widget.handle({"type": "routing", "id": 2, "run": "nope"})
    assert not reply["ok"] and "no run named 'nope'" in reply["error"]


def test_routing_on_a_schema_without_experts_is_a_clear_error():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    x = torch.randn(2, 3)
    widget = InspectorWidget(NNParser.parse_model(model, inputs_tensors_values={"input": x}), {"input": x},
                             gradients=False)
    try:
        assert widget.moe is False
        reply = widget.handle({"type": "routing", "id": 3})
        assert not reply["ok"] and "no experts block" in reply["error"]
    finally:
        widget.close()


def test_routing_mid_run_leaves_the_paused_run_to_finish_as_eager(mixtral_widget):
    model, ids, widget = mixtral_widget
    widget.reset()
    for _ in range(40):
        widget.step()
    assert not widget.state.active.finished
    assert widget.handle({"type": "routing", "id": 4})["ok"]
    widget.continue_()
    record = widget.state.active
    assert record.finished and not record.error
    with torch.no_grad():
        assert torch.equal(record.outputs[0].logits, model(ids).logits)


def test_routing_of_a_run_with_edits_says_its_edits_are_not_replayed(mixtral_widget):
    _, _, widget = mixtral_widget
    widget.reset()
    widget.step()
    while widget.current is None or widget.current.value is None or not hasattr(widget.current.value, "shape"):
        widget.step()
    widget.edit("scale", 2.0)
    widget.reset()
    try:
        assert widget.state.active.edits
        reply = widget.handle({"type": "routing", "id": 5})
        assert reply["ok"] and "without edits" in reply["data"]["note"]
        assert "without edits" in widget.moe_routing().attrs["note"]
    finally:
        widget.clear_edits()
        widget.reset()


def test_token_route_lists_the_chosen_experts_highest_weight_first():
    assert token_route([0.0, 0.25, 0.75, 0.0]) == "expert 2 (0.75), expert 1 (0.25)"
    assert token_route([0.0, 0.0]) == ""
