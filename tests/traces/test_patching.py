"""Exact activation patching (traces/patching.py) on transformers GPT-2 and Llama (random weights):
each row's metric equals patching written by hand with forward hooks on the eager model, bit for bit,
per site, per position and per head; the clean prefix is reused (fewer layer calls run) without
changing a bit; a model that writes state or draws random numbers turns reuse off and says so."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("pandas")

from nnschemaparser import NNParser, activation_patching, attribution_patching  # noqa: E402
from nnschemaparser.traces.interventions import InterventionError  # noqa: E402
from nnschemaparser.traces.patching import PatchingReuseWarning  # noqa: E402
from tests.support.patching_functions import counting  # noqa: E402


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, model.transformer.drop, list(model.transformer.h), "call=transformer.drop, call=transformer.h.*"


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, model.model.embed_tokens, list(model.model.layers), "call=model.embed_tokens, call=model.layers.*"


_BUILT: dict = {}


def _case(name: str):
    """(model, schema, clean, corrupted, embedding module, layers, residual selector), parsed once."""
    if name not in _BUILT:
        model, embed, layers, at = {"gpt2": _gpt2, "llama": _llama}[name]()
        ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        other = ids.clone()
        other[:, 3] = (ids[:, 3] + 17) % 63 + 1  # one token differs
        clean, corrupted = {"input_ids": ids, "use_cache": False}, {"input_ids": other, "use_cache": False}
        schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(clean))
        _BUILT[name] = (model, schema, clean, corrupted, embed, layers, at)
    return _BUILT[name]


def _metric(outputs) -> torch.Tensor:
    logits = outputs.logits if hasattr(outputs, "logits") else outputs["logits"]
    return logits[:, -1, 5].sum() - logits[:, -1, 9].sum()


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _outputs_of(model, modules, inputs) -> list:
    seen: list = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: seen.append(_first(out).clone())) for m in modules]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _hooked_metric(model, module, hook, inputs, pre: bool = False) -> torch.Tensor:
    handle = module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return _metric(model(**inputs))
    finally:
        handle.remove()


def _replace(new, index=None):
    def hook(module, args, out):
        value = _first(out)
        if index is None:
            patched = new
        else:
            patched = value.clone()
            patched[index] = new[index]
        return (patched, *out[1:]) if isinstance(out, tuple) else patched
    return hook


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_residual_site_equals_the_forward_hook_that_patches_it(name):
    model, schema, clean, corrupted, embed, layers, at = _case(name)
    table = activation_patching(schema, clean, corrupted, _metric, at=at)
    modules = [embed, *layers]
    sources = _outputs_of(model, modules, corrupted)
    with torch.no_grad():
        clean_metric = _metric(model(**clean))
    assert list(table["layer"].fillna(-1)) == [-1, 0, 1, 2, 3]
    assert len(table) == len(modules) == len(sources)
    for row, module, source in zip(table.itertuples(), modules, sources):
        theirs = _hooked_metric(model, module, _replace(source), clean)
        assert row.metric == theirs.item()
        assert row.effect == (theirs - clean_metric).item()
    assert table.attrs["clean_metric"] == clean_metric.item()
    assert table.attrs["reuse"] == "on" and table.attrs["reused"] > 0
    assert (table["effect"] != 0).any()


def test_per_position_equals_the_forward_hook_that_patches_that_position():
    model, schema, clean, corrupted, embed, layers, at = _case("gpt2")
    table = activation_patching(schema, clean, corrupted, _metric, at="call=transformer.h.1, call=transformer.h.2",
                                per="position")
    sources = _outputs_of(model, layers[1:3], corrupted)
    assert list(table["position"]) == list(range(8)) * 2
    for row in table.itertuples():
        layer = 1 if row.site == "transformer.h.1:output" else 2
        theirs = _hooked_metric(model, layers[layer], _replace(sources[layer - 1], (slice(None), row.position)), clean)
        assert row.metric == theirs.item()
    assert (table[table.position < 3]["effect"] == 0).all()  # causal: before the changed token nothing moves
    assert (table[table.position == 3]["effect"] != 0).all()
    assert table.attrs["unchanged"] == 2 * 3  # there the patch is the clean value's bits: no run is made
    plain = activation_patching(schema, clean, corrupted, _metric, at="call=transformer.h.1, call=transformer.h.2",
                                per="position", reuse=False)
    assert list(plain["metric"]) == list(table["metric"]) and plain.attrs["unchanged"] == 0


@pytest.mark.parametrize("name, patched", [("gpt2", 0), ("llama", 1)])
def test_the_causal_mask_is_built_in_the_clean_and_corrupted_runs_only(name, patched):
    from transformers import masking_utils

    model, schema, clean, corrupted, embed, layers, at = _case(name)
    with counting(masking_utils.create_causal_mask) as count:
        table = activation_patching(schema, clean, corrupted, _metric, at=at)
    with counting(masking_utils.create_causal_mask) as plain:
        again = activation_patching(schema, clean, corrupted, _metric, at=at, reuse=False)
    assert list(table["metric"]) == list(again["metric"])
    # GPT-2 builds it before its first site (`drop`), so no patched run does; Llama's first site is the
    # embedding, which the mask is built from: that patched run builds it again, no other does
    assert (count[0], plain[0]) == (2 + patched, 2 + len(table))


def test_per_head_patches_the_heads_slice_of_the_attention_output_before_its_projection():
    model, schema, clean, corrupted, embed, layers, at = _case("llama")
    table = activation_patching(schema, clean, corrupted, _metric,
                                at="model.layers.2.self_attn:attn_output occurrence=1", per="head")
    assert list(table["head"]) == [0, 1, 2, 3] and set(table["site"]) == {"model.layers.2.self_attn:attn_output#1"}
    o_proj = layers[2].self_attn.o_proj
    seen: list = []
    handle = o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        model(**corrupted)
    handle.remove()
    for row in table.itertuples():
        part = (Ellipsis, slice(8 * row.head, 8 * row.head + 8))

        def hook(module, args, _part=part):
            value = args[0].clone()
            value[_part] = seen[0][_part]
            return (value, *args[1:])

        assert row.metric == _hooked_metric(model, o_proj, hook, clean, pre=True).item()
    assert table["effect"].nunique() == 4


def test_reuse_skips_the_clean_prefix_and_changes_no_bit():
    model, schema, clean, corrupted, embed, layers, at = _case("gpt2")
    ran: list = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, _i=i: ran.append(_i)) for i, layer in enumerate(layers)]
    try:
        reused = activation_patching(schema, clean, corrupted, _metric, at=at)
        calls_reused = len(ran)
        ran.clear()
        plain = activation_patching(schema, clean, corrupted, _metric, at=at, reuse=False)
        calls_plain = len(ran)
    finally:
        for hook in hooks:
            hook.remove()
    assert list(reused["metric"]) == list(plain["metric"]) and list(reused["effect"]) == list(plain["effect"])
    # 2 full runs (clean, corrupted), then site k (embedding, layers 0..3) runs only the layers after it
    assert calls_plain == 2 * 4 + 5 * 4 and calls_reused == 2 * 4 + (4 + 3 + 2 + 1 + 0)
    assert plain.attrs["reuse"] == "off: reuse=False"


def test_a_patched_run_is_reproduced_by_its_inputs_and_intervention():
    model, schema, clean, corrupted, embed, layers, at = _case("llama")
    table = activation_patching(schema, clean, corrupted, _metric, at="call=model.layers.1", per="position")
    row = table.iloc[5]
    run = row["run"]
    assert run.site == "model.layers.1:output" and run.inputs is clean
    (patch,) = run.interventions
    assert patch.text() == "model:hidden_states index=[:, 5] occurrence=2"
    with torch.no_grad():
        assert _metric(run.outputs()).item() == row["metric"]


class _Counting(torch.nn.Module):
    """A model whose forward writes a buffer (a call counter): a skipped call would not count."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.outer = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        h = self.inner(x)
        return self.outer(h)


class _Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.outer = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.drop(self.inner(x))
        return self.outer(h)


@pytest.mark.parametrize("model_class, reason", [(_Counting, "calls was written"), (_Noisy, "drew random numbers")])
def test_a_model_that_writes_state_or_draws_random_numbers_turns_reuse_off_and_says_why(model_class, reason):
    torch.manual_seed(0)
    model = model_class()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    if model_class is _Noisy:
        model.train()
    with pytest.warns(PatchingReuseWarning, match=reason):
        table = activation_patching(schema, {"x": x}, {"x": y}, lambda out: out.sum(), at="call=inner")
    assert table.attrs["reuse"].startswith("off: ") and reason in table.attrs["reuse"]
    assert table.attrs["reused"] == 0
    plain = activation_patching(schema, {"x": x}, {"x": y}, lambda out: out.sum(), at="call=inner", reuse=False)
    if model_class is _Noisy:  # every run starts from the same random state: the same masks, the same numbers
        assert list(table["metric"]) == list(plain["metric"])
    model.eval()


def test_bad_arguments_are_refused_naming_the_fix():
    model, schema, clean, corrupted, embed, layers, at = _case("gpt2")
    with pytest.raises(InterventionError, match="per must be None, 'position' or 'head'"):
        activation_patching(schema, clean, corrupted, _metric, at=at, per="layer")
    with pytest.raises(InterventionError, match="per='position' or per='head'"):
        activation_patching(schema, clean, corrupted, _metric, at="call=transformer.h.1 index=[:, 2]")
    with pytest.raises(InterventionError, match="scalar tensor"):
        activation_patching(schema, clean, corrupted, lambda out: out.logits, at=at)
    shorter = {"input_ids": corrupted["input_ids"][:, :6], "use_cache": False}
    with pytest.raises(InterventionError, match="same length"):
        activation_patching(schema, clean, shorter, _metric, at=at)
    with pytest.raises(InterventionError, match="closest sites"):
        activation_patching(schema, clean, corrupted, _metric, at="transformer.h.1:atn_output")


class _Bump(torch.nn.Module):
    def forward(self, t):
        t.add_(1.0)  # changes its argument in place: running it again would do that again
        return t * 3.0


class _InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = _Bump()
        self.c = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        h.mul_(2.0)  # a's result is changed after the call: never handed out again
        g = self.b(h)
        return self.c(g)


def test_calls_that_change_their_arguments_or_whose_results_change_later_always_run():
    torch.manual_seed(0)
    model = _InPlace().eval()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    ran = {"a": 0, "b": 0, "c": 0}
    hooks = [getattr(model, n).register_forward_pre_hook(lambda m, a, _n=n: ran.__setitem__(_n, ran[_n] + 1))
             for n in ran]
    try:
        table = activation_patching(schema, {"x": x}, {"x": y}, lambda out: out.sum(), at="call=a, call=b, call=c")
    finally:
        for hook in hooks:
            hook.remove()
    plain = activation_patching(schema, {"x": x}, {"x": y}, lambda out: out.sum(), at="call=a, call=b, call=c",
                                reuse=False)
    assert list(table["metric"]) == list(plain["metric"])
    assert ran == {"a": 5, "b": 5, "c": 4}  # clean, corrupted and 3 patched runs; only c's call is reused
    with torch.no_grad():  # the corrupted value patched in is a's output as bound, before the mul_
        source = model.a(y)
        handle = model.a.register_forward_hook(lambda m, a, out: source.clone())
        assert table["metric"][0] == model(x).sum().item()
        handle.remove()


def test_a_schema_patched_once_is_freed_with_its_programs():
    import gc
    import weakref

    model, embed, layers, at = _gpt2()  # its layers are called through a loop variable (blocks found by module)
    ids = torch.randint(1, 64, (1, 4), generator=torch.Generator().manual_seed(1))
    clean, corrupted = {"input_ids": ids, "use_cache": False}, {"input_ids": ids.flip(1), "use_cache": False}
    schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(clean))
    activation_patching(schema, clean, corrupted, _metric, at=at)
    attribution_patching(schema, clean, corrupted, _metric, at=at)
    gone = weakref.ref(schema)
    del schema
    gc.collect()
    assert gone() is None
