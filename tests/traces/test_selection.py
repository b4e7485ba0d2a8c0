"""capture_run(keep=...): the selector's grammar, and a kept capture holding exactly the full capture's steps it names."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser import KeepTerm, capture_run
from nnschemaparser.traces.selection import keep_selector
from tests.support.trace_models import InPlace, ViewMutation, parse


def _full_and_kept(model, inputs, keep, **options):
    schema = parse(model, inputs)
    return capture_run(schema, dict(inputs), **options).trace, capture_run(schema, dict(inputs), keep=keep,
                                                                           **options)


def test_text_terms_read_path_variable_op_and_slot():
    selector = keep_selector("transformer.h.*.attn:attn_output, op=*linear slot=activation, slot=input")
    assert selector.terms == (KeepTerm(block="transformer.h.*.attn", var="attn_output"),
                              KeepTerm(op="*linear", slot="activation"), KeepTerm(slot="input"))
    assert keep_selector(selector.text()) == selector
    assert selector.matches("transformer.h.3.attn", "attn_output", "", "activation")
    assert not selector.matches("transformer.h.3.attn", "query", "", "activation")
    assert selector.matches("transformer.h.3.mlp", "h", "torch._C._nn.linear", "activation")
    assert selector.matches("", "input_ids", "", "input")


def test_a_block_term_covers_the_blocks_inside_it_but_not_its_namesakes():
    selector = keep_selector("model.layers.3")
    assert selector.matches("model.layers.3", "x", "", "activation")
    assert selector.matches("model.layers.3.mlp", "x", "", "activation")
    assert not selector.matches("model.layers.30", "x", "", "activation")


def test_a_call_term_keeps_block_call_results_only_not_ops_bearing_the_name():
    selector = keep_selector("call=model.layers.3, model call=model.layers.1*")
    assert selector.terms == (KeepTerm(call="model.layers.3"), KeepTerm(block="model", call="model.layers.1*"))
    assert selector.calls and keep_selector(selector.text()) == selector
    assert selector.matches("model", "hidden_states", "model.layers.3", "activation", call=True)
    assert not selector.matches("model", "hidden_states", "model.layers.3", "activation", call=False)
    assert selector.matches("model", "h", "model.layers.12", "activation", call=True)
    assert not selector.matches("encoder", "h", "model.layers.12", "activation", call=True)  # not from model
    assert selector.keeps_call_of("model.layers.3") and not selector.keeps_call_of("model.layers.4")
    assert selector.keeps_call_of("model.layers.12", "model") and not selector.keeps_call_of("model.layers.12", "x")
    assert not keep_selector("model.layers.3").calls


@pytest.mark.parametrize("bad, error, match", [
    ("a:", ValueError, "nothing after ':'"),
    ("slot=weights", ValueError, "matches no slot type"),
    ("op=a op=b", ValueError, "gives op twice"),
    ("call=a call=b", ValueError, "gives call twice"),
    (3, TypeError, "keep must be a string"),
    ([1], TypeError, "a keep term is a string"),
    ("", ValueError, "empty keep term"),
])
def test_bad_selectors_are_refused_with_the_fix(bad, error, match):
    with pytest.raises(error, match=match):
        keep_selector(bad)


def test_a_kept_capture_records_only_the_named_steps_with_their_full_capture_numbers_and_values():
    torch.manual_seed(0)
    full, record = _full_and_kept(InPlace(), {"x": torch.randn(4, 4)}, keep=":z, proj")
    kept = record.trace
    expected = [s for s in full if s.out_var == "z" or s.block_path == "proj"]
    assert expected and len(kept) == len(expected) < len(full)
    for a, b in zip(kept, expected):
        assert (a.step, a.container_id, a.description) == (b.step, b.container_id, b.description)
        assert torch.equal(a.value, b.value)  # values at capture time: `z += 1` came after the first z


def test_a_kept_alias_changed_in_place_later_keeps_its_captured_value():
    torch.manual_seed(0)
    full, record = _full_and_kept(ViewMutation(), {"x": torch.randn(3, 2)}, keep="*:y")
    (step,) = [s for s in record.trace if s.out_var == "y"]
    assert torch.equal(step.value, full.by_container(step.container_id).value)
    assert bool((step.value != 0).any())  # flat.mul_(0) zeroed the live tensor after capture
    assert step.step in record.recorder.changed_in_place


def test_gradients_of_a_kept_capture_are_those_of_the_full_capture():
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    model = InPlace()
    schema = parse(model, {"x": x})
    full = capture_run(schema, {"x": x}, capture_grads=True)
    sum(o.sum() for o in full.outputs).backward()
    kept = capture_run(schema, {"x": x}, capture_grads=True, keep="proj")
    sum(o.sum() for o in kept.outputs).backward()
    grads = kept.gradients
    assert len(grads) == len(kept.trace) > 0
    for step in grads:
        assert torch.equal(step.value, full.gradients.by_container(step.container_id).value)
