"""`interventions={selector: fn}` on transformers GPT-2 and Llama (random weights, built from their
config classes): each intervention equals the same one written by hand with forward hooks on the
eager model (`torch.equal`), and changes the outputs (so a no-op would fail); gradients through an
intervention equal the hook's; a selector that changes nothing is an error naming the closest sites."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nnschemaparser import (Intervention, InterventionError, NNParser, SchemaInterpreter, Site, capture_run)  # noqa: E402
from nnschemaparser.traces.interventions import InterventionRun, parse_index  # noqa: E402


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval(), "transformer.h"


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval(), "model.layers"


_BUILT: dict = {}


def _case(name: str):
    """(model, schema, inputs, layers): the model parsed once per test session."""
    if name not in _BUILT:
        model, layers = {"gpt2": _gpt2, "llama": _llama}[name]()
        ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        inputs = {"input_ids": ids, "use_cache": False}
        schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))
        _BUILT[name] = (model, schema, inputs, layers)
    return _BUILT[name]


def _layer(model, layers: str, index: int):
    module = model
    for part in layers.split("."):
        module = getattr(module, part)
    return module[index]


def _logits(outputs) -> torch.Tensor:
    first = outputs[0]
    return first["logits"] if isinstance(first, dict) else first.logits


def _with_hooks(model, hooks, inputs) -> torch.Tensor:
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        return model(**inputs).logits
    finally:
        for handle in handles:
            handle.remove()


def _replace_first(output, new):
    return (new, *output[1:]) if isinstance(output, tuple) else new


ATTENTION = {"gpt2": ("attn", "transformer.h.1:attn_output"),
             "llama": ("self_attn", "model.layers.1:hidden_states occurrence=1")}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_zero_ablating_layer_1s_attention_output_equals_the_forward_hook_that_does_the_same(name):
    model, schema, inputs, layers = _case(name)
    attn, selector = ATTENTION[name]
    with torch.no_grad():
        plain = _logits(SchemaInterpreter().run(schema, dict(inputs)))
        ours = _logits(SchemaInterpreter().run(schema, dict(inputs),
                                               interventions={selector: lambda value, site: torch.zeros_like(value)}))
        theirs = _with_hooks(model, [(getattr(_layer(model, layers, 1), attn),
                                      lambda m, a, out: _replace_first(out, torch.zeros_like(out[0])))], inputs)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, plain)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_an_intervention_at_a_layers_output_equals_the_forward_hook_that_does_the_same(name):
    """A steering vector added to the residual stream after layer 2 (what layer 2 returns)."""
    model, schema, inputs, layers = _case(name)
    vector = torch.randn(32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = _logits(SchemaInterpreter().run(schema, dict(inputs)))
        ours = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
            f"call={layers}.2": lambda value, site: value + vector}))
        theirs = _with_hooks(model, [(_layer(model, layers, 2),
                                      lambda m, a, out: _replace_first(out, (out[0] if isinstance(out, tuple) else out)
                                                                       + vector))], inputs)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, plain)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_patching_position_3_of_a_layers_output_from_another_run_equals_the_forward_hook(name):
    model, schema, inputs, layers = _case(name)
    other = dict(inputs, input_ids=torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        clean = capture_run(schema, dict(other), keep=f"call={layers}.1").trace
        (step,) = [s for s in clean if s.slot_type == "activation"]
        source = step.value
        ours = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
            f"call={layers}.1 index=[:, 3]": source[:, 3]}))

        def patch(module, args, out):
            value = (out[0] if isinstance(out, tuple) else out).clone()
            value[:, 3] = source[:, 3]
            return _replace_first(out, value)

        theirs = _with_hooks(model, [(_layer(model, layers, 1), patch)], inputs)
        plain = model(**inputs).logits
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, plain)
    assert torch.equal(ours[:, :3], plain[:, :3])  # causal: the positions before 3 are untouched


def test_call_and_capture_run_take_the_same_interventions_and_the_trace_holds_the_new_value():
    model, schema, inputs, layers = _case("gpt2")
    fn = {"transformer.h.1:attn_output": lambda value, site: value * 0.5}
    with torch.no_grad():
        ran = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions=fn))
        called = SchemaInterpreter().call(schema, **inputs, interventions=fn)
        record = capture_run(schema, dict(inputs), interventions=fn)
        kept = capture_run(schema, dict(inputs), keep="transformer.h.1:attn_output", interventions=fn)
        plain = capture_run(schema, dict(inputs), keep="transformer.h.1:attn_output")
    called = called["logits"] if isinstance(called, dict) else called.logits
    assert torch.equal(called, ran) and torch.equal(_logits(record.outputs), ran)
    edited = [s for s in record.trace if s.edited]
    assert [(s.block_path, s.out_var) for s in edited] == [("transformer.h.1", "attn_output")]
    (after,) = [s for s in kept.trace if (s.block_path, s.out_var) == ("transformer.h.1", "attn_output")]
    (before,) = [s for s in plain.trace if (s.block_path, s.out_var) == ("transformer.h.1", "attn_output")]
    assert after.edited and torch.equal(after.value, before.value * 0.5)


def test_a_stepped_run_shows_the_new_value_at_its_step_and_ends_as_run_does():
    model, schema, inputs, layers = _case("llama")
    fn = {"call=model.layers.0": lambda value, site: value + 1.0}
    interpreter = SchemaInterpreter()
    with torch.no_grad():
        steps = [s for s in interpreter.step_run(schema, dict(inputs), interventions=fn)]
        ran = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions=fn))
        plain = capture_run(schema, dict(inputs), keep="call=model.layers.0").trace
    assert torch.equal(_logits(interpreter.step_outputs), ran)
    (original,) = [s.value for s in plain if s.slot_type == "activation"]
    hits = [s for s in steps if s.block_path == "model" and s.out_var == "hidden_states"
            and torch.equal(s.value, original + 1.0)]
    assert len(hits) == 1


def test_site_gives_the_block_the_variable_the_occurrence_the_layer_and_the_run():
    model, schema, inputs, layers = _case("gpt2")
    seen: list[Site] = []

    def look(value, site):
        seen.append(site)
        return value

    with torch.no_grad():
        SchemaInterpreter().run(schema, dict(inputs), interventions={"transformer.h.*:hidden_states": look,
                                                                     "call=transformer.h.3": look})
    own = [(s.path, s.var, s.occurrence, s.layer) for s in seen if s.path == "transformer.h.2"]
    assert own[0] == ("transformer.h.2", "hidden_states", 0, 2) and [o[2] for o in own] == list(range(len(own)))
    (call,) = [s for s in seen if s.path == "transformer"]
    assert (call.path, call.call, call.layer) == ("transformer", "transformer.h.3", 3)
    assert isinstance(call.run, InterventionRun) and call.run.inputs["input_ids"] is inputs["input_ids"]


def test_gradients_through_an_intervention_equal_those_through_the_hook_that_does_the_same():
    model, schema, inputs, layers = _case("llama")
    scale = torch.nn.Parameter(torch.full((32,), 1.5))
    logits = _logits(SchemaInterpreter().run(schema, dict(inputs), interventions={
        "call=model.layers.1": lambda value, site: value * scale}))
    logits.square().sum().backward()
    ours, ours_weight = scale.grad.clone(), model.model.layers[0].mlp.down_proj.weight.grad.clone()
    scale.grad = None
    model.zero_grad()
    theirs = _with_hooks(model, [(model.model.layers[1], lambda m, a, out: _replace_first(out, out * scale))], inputs)
    theirs.square().sum().backward()
    assert ours.abs().sum() > 0
    assert torch.equal(ours, scale.grad)
    assert torch.equal(ours_weight, model.model.layers[0].mlp.down_proj.weight.grad)
    model.zero_grad()


def test_a_selector_that_matches_nothing_is_an_error_naming_the_closest_sites():
    model, schema, inputs, layers = _case("gpt2")
    with torch.no_grad(), pytest.raises(InterventionError, match=r"'transformer.h.1:atn_output' matched no tensor "
                                                                 r"variable that ran; closest sites: transformer.h.1:attn_output"):
        SchemaInterpreter().run(schema, dict(inputs), interventions={"transformer.h.1:atn_output": lambda v, s: v})
    with torch.no_grad(), pytest.raises(InterventionError, match=r"occurrence=9 was never reached"):
        SchemaInterpreter().run(schema, dict(inputs), interventions=[
            Intervention("transformer.h.1:hidden_states", lambda v, s: v, occurrence=9)])
    with torch.no_grad(), pytest.raises(InterventionError, match="closest sites"):
        capture_run(schema, dict(inputs), interventions={"call=transformer.h.7": lambda v, s: v})


def test_a_value_of_another_shape_or_dtype_is_refused_naming_the_site():
    model, schema, inputs, layers = _case("gpt2")
    with torch.no_grad(), pytest.raises(InterventionError, match=r"transformer.h.1:attn_output .*shape \(2, 8, 32\); "
                                                                 r"the intervention gave \(32,\)"):
        SchemaInterpreter().run(schema, dict(inputs), interventions={"transformer.h.1:attn_output": torch.zeros(32)})
    with torch.no_grad(), pytest.raises(InterventionError, match=r"dtype torch.float32; the intervention gave torch.float64"):
        SchemaInterpreter().run(schema, dict(inputs), interventions={
            "transformer.h.1:attn_output index=[:, 2]": torch.zeros(2, 32, dtype=torch.float64)})


def test_the_index_word_reads_ints_slices_none_and_ellipsis_only():
    assert parse_index(":, 2") == (slice(None), 2)
    assert parse_index("..., 1:4:2, -1, None") == (Ellipsis, slice(1, 4, 2), -1, None)
    assert parse_index("3") == 3
    with pytest.raises(InterventionError, match="not an int"):
        parse_index("__import__('os')")
    with pytest.raises(InterventionError, match="only activations"):
        Intervention("slot=input", lambda v, s: v)


def test_without_interventions_the_run_is_plain_and_with_them_only_the_named_blocks_are_observed(monkeypatch):
    model, schema, inputs, layers = _case("gpt2")
    import nnschemaparser.runtime.interpreter as interpreter

    def refuse(*args, **kwargs):
        raise AssertionError("a run without interventions built an intervention listener")

    with monkeypatch.context() as patched:
        patched.setattr(interpreter, "intervention_listener", refuse)
        patched.setattr(interpreter, "_borrow", refuse)  # no observed program either
        with torch.no_grad():
            SchemaInterpreter().run(schema, dict(inputs))
    run = InterventionRun(schema, [Intervention("transformer.h.1:attn_output", lambda v, s: v)])
    observed = {b.path for b in schema.iter_blocks() if id(b) in run.observe}
    assert "transformer.h.1" in observed and "transformer.h.0" not in observed and "transformer.h.2.attn" not in observed
