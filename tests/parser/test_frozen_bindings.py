"""What the lowering resolved at parse time is read again at run time: globals, closure cells and
chains rooted at one at each read (rebound names are followed, a deleted one is eager's NameError);
the forward itself and a decorator's choice at each call (refused with a StaleSchemaError naming it
and the fix when the schema cannot follow). Rebinding *during* a forward: tests/runtime/test_names_read_live.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nnschemaparser import NNParser, SchemaInterpreter, StaleSchemaError, capture_run
from tests.support import live_call_models as models


def _parse(model, **inputs):
    return NNParser.parse_model(model, inputs_tensors_values=inputs)


def _run(schema, **inputs):
    return SchemaInterpreter().run(block=schema, scope=inputs)[0]


def test_a_rebound_module_global_constant_is_followed(monkeypatch):
    torch.manual_seed(0)
    model, x = models.ReadsGlobals().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    monkeypatch.setattr(models, "SCALE", 0.25)
    assert torch.equal(_run(schema, x=x), model(x))
    assert torch.equal(capture_run(schema, {"x": x}).outputs[0], model(x))


def test_a_rebound_global_function_is_followed(monkeypatch):
    torch.manual_seed(0)
    model, x = models.ReadsGlobals().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    monkeypatch.setattr(models, "scale_helper", lambda v: v * 5)
    assert torch.equal(_run(schema, x=x), model(x))


def test_a_rebound_root_of_a_dotted_chain_is_followed(monkeypatch):
    torch.manual_seed(0)
    model, x = models.ReadsGlobals().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    monkeypatch.setattr(models, "F", type("PatchedF", (), {"gelu": staticmethod(torch.tanh)}))
    assert torch.equal(_run(schema, x=x), model(x))
    monkeypatch.setattr(F, "gelu", torch.sigmoid)  # the attribute itself, as kernel patches do
    monkeypatch.setattr(models, "F", F)
    assert torch.equal(_run(schema, x=x), model(x))


def test_a_rebound_closure_cell_is_followed():
    torch.manual_seed(0)
    cls = models.make_closure_model()
    model, x = cls().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    cells = dict(zip(cls.forward.__code__.co_freevars, cls.forward.__closure__))
    cells["act"].cell_contents = torch.tanh
    cells["factor"].cell_contents = [3.0]
    assert torch.equal(_run(schema, x=x), model(x))


def test_a_deleted_global_is_the_name_error_eager_raises_with_the_line_that_read_it(monkeypatch):
    torch.manual_seed(0)
    model, x = models.ReadsGlobals().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    monkeypatch.delattr(models, "scale_helper")
    with pytest.raises(NameError) as eager:
        model(x)
    with pytest.raises(NameError) as info:
        _run(schema, x=x)
    assert str(info.value) == str(eager.value) == "name 'scale_helper' is not defined"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "scale_helper(" in notes and "ReadsGlobals.forward" in notes and "live_call_models.py" in notes


def test_a_forward_replaced_on_its_class_after_parsing_is_refused(monkeypatch):
    torch.manual_seed(0)
    model, x = models.ReadsGlobals().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    monkeypatch.setattr(models.ReadsGlobals, "forward", lambda self, v: v * 7)
    with pytest.raises(StaleSchemaError, match=r"ReadsGlobals\.forward was replaced after the model was parsed"):
        _run(schema, x=x)
    monkeypatch.undo()
    assert torch.equal(_run(schema, x=x), model(x))


def test_a_kernel_library_patch_of_a_transformers_function_is_followed_bit_exactly(monkeypatch):
    """liger-kernel replaces `modeling_llama.apply_rotary_pos_emb` after import; a schema parsed
    before the patch runs what eager runs after it."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 7))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    original = modeling_llama.apply_rotary_pos_emb

    def patched_rotary(q, k, cos, sin, *args, **kwargs):
        q_embed, k_embed = original(q, k, cos, sin, *args, **kwargs)
        return q_embed * 1.0001, k_embed  # a different kernel: different bits

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", patched_rotary)
    with torch.no_grad():
        expected = model(ids).logits
        before = None
        monkeypatch.undo()
        before = model(ids).logits
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", patched_rotary)
        got = SchemaInterpreter().run(block=schema, scope={"input_ids": ids})[0].logits
    assert not torch.equal(expected, before)  # the patch changes eager's result
    assert torch.equal(got, expected)


def test_an_experts_implementation_changed_after_parsing_is_refused_with_the_setting():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    model = MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 5))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    model.config._experts_implementation = "eager"
    with pytest.raises(StaleSchemaError, match=r"config\._experts_implementation is now 'eager'"):
        SchemaInterpreter().run(block=schema, scope={"input_ids": ids})


def test_a_rebound_global_read_inside_a_deeply_nested_part_is_followed(monkeypatch):
    """Past Python's nesting limits a statement is compiled as a part of its own: it checks its
    bindings too."""
    # the same shape as a real module, in the support module so its source is readable
    torch.manual_seed(0)
    model, x = models.DeeplyNested().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    assert schema.skipped == {}
    monkeypatch.setattr(models, "SCALE", 0.125)
    assert torch.equal(_run(schema, x=x), model(x))
