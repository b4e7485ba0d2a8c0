"""Attribution patching (traces/attribution.py) on transformers GPT-2 (random weights): grad x (corrupted -
clean) equals the same product computed by hand with forward hooks and tensor hooks on the eager
model, bit for bit, per position and per head; every floating-point site gets a gradient, frozen
weights or not; its signs agree with exact activation patching on the sites that matter most."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("pandas")

from nnschemaparser import NNParser, activation_patching, attribution_patching  # noqa: E402


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, 3] = 7  # one token differs
    clean, corrupted = {"input_ids": ids, "use_cache": False}, {"input_ids": other, "use_cache": False}
    return model, NNParser.parse_model(model=model, inputs_tensors_values=dict(clean)), clean, corrupted


def _metric(outputs) -> torch.Tensor:
    logits = outputs.logits
    return logits[0, -1, 5] - logits[0, -1, 9]


def _by_hand(model, modules, clean, corrupted, pre: bool = False) -> list:
    """grad x (corrupted - clean) at each module's output (`pre`: its first input), by hooks."""
    def take(store, grads):
        def keep(value):
            store.append(value.detach().clone())
            if grads is not None:
                value.register_hook(lambda g: grads.append(g))
        return keep

    def hooks(store, grads):
        keep = take(store, grads)
        if pre:
            return [m.register_forward_pre_hook(lambda _m, args: keep(args[0])) for m in modules]
        return [m.register_forward_hook(lambda _m, _a, out: keep(out[0] if isinstance(out, tuple) else out))
                for m in modules]

    sources: list = []
    handles = hooks(sources, None)
    with torch.no_grad():
        model(**corrupted)
    for handle in handles:
        handle.remove()
    values: list = []
    grads: list = []
    handles = hooks(values, grads)
    _metric(model(**clean)).backward()
    for handle in handles:
        handle.remove()
    model.zero_grad(set_to_none=True)
    grads.reverse()  # backward reaches the last module first
    return [g * (s - v) for g, s, v in zip(grads, sources, values)]


def test_per_position_equals_grad_times_delta_from_tensor_hooks(gpt2):
    model, schema, clean, corrupted = gpt2
    table = attribution_patching(schema, clean, corrupted, _metric, at="call=transformer.drop, call=transformer.h.*",
                                 per="position")
    products = _by_hand(model, [model.transformer.drop, *model.transformer.h], clean, corrupted)
    assert len(table) == 5 * 8 and list(table["position"]) == list(range(8)) * 5
    for row in table.itertuples():
        n = 0 if row.site == "transformer.drop:output" else 1 + int(row.layer)
        assert row.attribution == products[n][:, row.position].sum().item()
    assert (table["attribution"] != 0).sum() > 10
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated into the weights


def test_per_head_equals_the_hooked_products_slice_of_the_attention_output(gpt2):
    model, schema, clean, corrupted = gpt2
    table = attribution_patching(schema, clean, corrupted, _metric,
                                 at="transformer.h.*.attn:attn_output occurrence=1", per="head")
    products = _by_hand(model, [layer.attn.c_proj for layer in model.transformer.h], clean, corrupted, pre=True)
    assert list(table["head"]) == [0, 1, 2, 3] * 4
    for row in table.itertuples():
        assert row.attribution == products[int(row.layer)][..., 8 * row.head:8 * row.head + 8].sum().item()


def test_every_floating_point_variable_gets_a_gradient_even_with_frozen_weights(gpt2):
    model, schema, clean, corrupted = gpt2
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        with pytest.warns(UserWarning, match="no floating-point value"):
            table = attribution_patching(schema, clean, corrupted, _metric, at="transformer:*")
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    floating = table[table["attribution"].notna()]
    assert set(table[table["attribution"].isna()].site) == {"transformer:input_ids", "transformer:position_ids",
                                                            "transformer:position_ids#1", "transformer:$t37"}
    assert {"transformer.wte:output", "transformer.wpe:output", "transformer:hidden_states", "transformer.h.3:output",
            "transformer:hidden_states#7"} <= set(floating.site)
    # the embedding, the layers' outputs and the final norm all carry the changed token's effect
    carried = floating[floating.site.str.match(r"transformer(\.wte|\.h\.\d|\.ln_f):output")]
    assert len(carried) == 6 and (carried["attribution"] != 0).all()


def test_signs_agree_with_exact_patching_on_the_top_20_sites(gpt2):
    model, schema, clean, corrupted = gpt2
    at = "call=transformer.drop, call=transformer.h.*, call=transformer.h.*.mlp"
    exact = activation_patching(schema, clean, corrupted, _metric, at=at, per="position")
    estimate = attribution_patching(schema, clean, corrupted, _metric, at=at, per="position")
    assert list(exact["site"]) == list(estimate["site"]) and list(exact["position"]) == list(estimate["position"])
    moved = exact[exact["effect"] != 0]
    top = moved["effect"].abs().sort_values(ascending=False).index[:20]
    assert len(top) == 20
    agree = ((exact.loc[top, "effect"] > 0) == (estimate.loc[top, "attribution"] > 0)).mean()
    assert agree >= 0.9, f"sign agreement {agree:.2f} on the top 20"
