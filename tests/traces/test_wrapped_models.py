"""A model wrapped by PEFT, accelerate or torch.compile either keeps what `keep=` names (checked against forward
hooks on the wrapped model, torch.equal) or refuses with a message saying how to reach the inner model. GPT-2
built from its config (random weights, offline); real peft, accelerate and torch.compile. nnsight is not
installed here: its wrapper is not mimicked (traces/wrapped.py)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from nnschemaparser import KeepMissedWarning, KeepWrappedError, NNParser, capture_dataset, capture_run
from tests.support.exactness import hooked_outputs
from tests.support.store_models import tiny_gpt2, token_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _kept(schema, scope, keep):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", KeepMissedWarning)  # keeping nothing fails the test
        return [s.value for s in capture_run(schema, dict(scope), keep=keep).trace]


def _lora(model):
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's note on Conv1D's fan_in_fan_out
        torch.manual_seed(1)
        return get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"], init_lora_weights=False))


def test_a_schema_parsed_before_peft_wraps_the_model_keeps_the_lora_layers_outputs():
    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    before = _kept(schema, scope, "call=h.*")
    peft_model = _lora(model)  # swaps LoRA layers (random, not zero) into the model itself
    hooked = hooked_outputs(peft_model.get_base_model().h, lambda: peft_model(**scope))
    kept = _kept(schema, scope, "call=h.*")
    assert len(kept) == 2 and all(torch.equal(a, b) for a, b in zip(kept, hooked))
    assert not torch.equal(kept[0], before[0])  # the LoRA layers ran


def test_a_schema_of_the_peft_model_refuses_a_keep_of_the_inner_paths_and_keeps_the_prefixed_one(tmp_path):
    model, _ = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    peft_model = _lora(model)
    schema = NNParser.parse_model(model=peft_model, inputs_tensors_values=dict(scope))
    with pytest.raises(KeepWrappedError, match=r"PEFT PeftModel.*'base_model\.model'.*Keep 'call=base_model\.model\."
                                               r"h\.\*'.*model\.get_base_model\(\)"):
        capture_run(schema, dict(scope), keep="call=h.*")
    with pytest.raises(KeepWrappedError, match=r"'base_model\.model\.h\.\*\.attn:attn_output'"):
        capture_run(schema, dict(scope), keep="h.*.attn:attn_output")
    with pytest.raises(KeepWrappedError, match="get_base_model"):
        capture_dataset(schema, [scope], tmp_path / "s", keep="call=h.*", progress=False)
    assert not (tmp_path / "s").exists()  # refused before a store was made
    hooked = hooked_outputs(peft_model.get_base_model().h, lambda: peft_model(**scope))
    kept = _kept(schema, scope, "call=base_model.model.h.*")
    assert len(kept) == 2 and all(torch.equal(a, b) for a, b in zip(kept, hooked))
    inner = NNParser.parse_model(model=peft_model.get_base_model(), inputs_tensors_values=dict(scope))
    kept = _kept(inner, scope, "call=h.*")
    assert len(kept) == 2 and all(torch.equal(a, b) for a, b in zip(kept, hooked))


def test_torch_compile_keeps_what_keep_names_parsed_before_or_from_the_compiled_module():
    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    compiled = torch.compile(model)
    hooked = hooked_outputs(model.h, lambda: model(**scope))
    assert all(torch.equal(a, b) for a, b in zip(_kept(schema, scope, "call=h.*"), hooked))
    of_compiled = NNParser.parse_model(model=compiled, inputs_tensors_values=dict(scope))
    assert [b.path for b in of_compiled.iter_blocks() if b.path.startswith("h.")][:1] == ["h.0"]
    kept = _kept(of_compiled, scope, "call=h.*")
    assert len(kept) == 2 and all(torch.equal(a, b) for a, b in zip(kept, hooked))


def test_accelerate_prepare_keeps_what_keep_names_parsed_before_or_after():
    from accelerate import Accelerator

    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    prepared = Accelerator(cpu=True).prepare(model)
    hooked = hooked_outputs(prepared.h, lambda: prepared(**scope))
    assert all(torch.equal(a, b) for a, b in zip(_kept(schema, scope, "call=h.*"), hooked))
    after = NNParser.parse_model(model=prepared, inputs_tensors_values=dict(scope))
    kept = _kept(after, scope, "call=h.*")
    assert len(kept) == 2 and all(torch.equal(a, b) for a, b in zip(kept, hooked))


def test_a_dataparallel_wrapper_refuses_the_inner_paths_naming_model_module():
    model, _ = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    wrapped = torch.nn.DataParallel(model)  # on the CPU: calls the module itself
    schema = NNParser.parse_model(model=wrapped, inputs_tensors_values=dict(scope))
    with pytest.raises(KeepWrappedError, match=r"DataParallel.*'module'.*Keep 'call=module\.h\.1'.*model\.module"):
        capture_run(schema, dict(scope), keep="call=h.1")
    hooked = hooked_outputs([model.h[1]], lambda: model(**scope))
    assert torch.equal(_kept(schema, scope, "call=module.h.1")[0], hooked[0])
