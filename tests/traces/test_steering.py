"""Steering vectors and SAEs at a site (traces/steering.py) on transformers Llama: steering equals the
forward hook that adds the vector; an SAE attached with `keep_error=True` leaves the outputs
`torch.equal` to the model's while its features are kept and get gradients."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.traces.steering import attach, steer  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1)), "use_cache": False}
    return model, NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs)), inputs


def _logits(outputs):
    first = outputs[0]
    return first["logits"] if isinstance(first, dict) else first.logits


class _SAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.enc = torch.nn.Linear(32, 96)
        self.dec = torch.nn.Linear(96, 32)

    def encode(self, x):
        return torch.relu(self.enc(x))

    def decode(self, f):
        return self.dec(f)


def test_steering_chosen_positions_equals_the_forward_hook_that_adds_the_vector_there(llama):
    model, schema, inputs = llama
    vector = torch.randn(32, generator=torch.Generator().manual_seed(2))

    def hook(module, args, out):
        new = out.clone()
        new[:, [2, 5]] = out[:, [2, 5]] + vector * 4.0
        return new

    with torch.no_grad():
        ours = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
            "call=model.layers.1": steer(vector, positions=[2, 5], scale=4.0)}))
        everywhere = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
            "call=model.layers.1": steer(vector)}))
        handle = model.model.layers[1].register_forward_hook(hook)
        theirs = model(**inputs).logits
        handle.remove()
        handle = model.model.layers[1].register_forward_hook(lambda m, a, out: out + vector)
        theirs_everywhere = model(**inputs).logits
        handle.remove()
    assert torch.equal(ours, theirs) and torch.equal(everywhere, theirs_everywhere)
    assert torch.equal(ours[:, :2], model(**inputs).logits[:, :2]) and not torch.equal(ours, everywhere)


def test_an_sae_kept_with_its_error_leaves_the_outputs_equal_and_its_features_get_gradients(llama):
    model, schema, inputs = llama
    sae = _SAE()
    at = attach(sae, keep_error=True)
    with torch.no_grad():
        plain = model(**inputs).logits
    logits = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={"call=model.layers.1": at}))
    assert torch.equal(logits, plain)
    (features,) = at.features["model:hidden_states"]
    assert features.shape == (2, 8, 96) and (features > 0).any()
    logits.sum().backward()
    assert sae.enc.weight.grad is not None and sae.enc.weight.grad.abs().sum() > 0
    model.zero_grad()
    with torch.no_grad():
        replaced = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
            "call=model.layers.1": attach(sae, keep_error=False)}))
    assert not torch.equal(replaced, plain)


def test_an_sae_s_features_are_captured_variables_and_the_outputs_stay_equal(llama, tmp_path):
    from nnschemaparser import capture_dataset, capture_run

    model, schema, inputs = llama
    sae = _SAE()
    at = attach(sae, keep_error=True)
    with torch.no_grad():
        plain = model(**inputs).logits
        record = capture_run(schema, dict(inputs), interventions={"call=model.layers.1": at})
        kept = capture_run(schema, dict(inputs), keep="model:hidden_states.features",
                           interventions={"call=model.layers.1": at})
    assert torch.equal(_logits(record.outputs), plain)
    steps = list(record.trace)
    (feature,) = [i for i, s in enumerate(steps) if s.out_var == "hidden_states.features"]
    site = steps[feature - 1]  # the features come right after the site they were computed at
    assert (site.block_path, site.out_var, site.edited) == ("model", "hidden_states", True)
    assert steps[feature].block_path == "model" and torch.equal(steps[feature].value, at.features["model:hidden_states"][0])
    assert steps[feature].value.shape == (2, 8, 96)
    (only,) = list(kept.trace)
    assert only.container_id == steps[feature].container_id and torch.equal(only.value, steps[feature].value)
    store = capture_dataset(schema, [dict(inputs)], tmp_path / "s", keep="model:hidden_states.features",
                            progress=False, interventions={"call=model.layers.1": at})
    rows = store.steps
    found = list(rows[rows["out_var"] == "hidden_states.features"].itertuples())
    assert [row.sample for row in found] == [0, 1]  # each row of the batch is a sample (store/rows.py)
    for row in found:
        assert row.kept and torch.equal(store.tensor(row.sample, row.container_id),
                                        steps[feature].value[row.sample:row.sample + 1])
