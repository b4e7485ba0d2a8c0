"""A `keep=` that keeps nothing over a whole input is a KeepMissedWarning naming the fix (wrapped models
included), in capture_run and capture_dataset, never silence; and a model whose modules accelerate's hooks
wrap after parsing still keeps what `keep=` names. GPT-2 built from its config (random weights, offline)."""

from __future__ import annotations

import os

import pytest
import torch

from nnschemaparser import KeepMissedWarning, capture_dataset, capture_run
from tests.support.store_models import tiny_gpt2, token_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_a_keep_that_keeps_nothing_over_an_input_warns_in_capture_run_and_capture_dataset(tmp_path):
    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    import warnings
    with warnings.catch_warnings():  # a keep that keeps something: no warning
        warnings.simplefilter("error", KeepMissedWarning)
        assert len(capture_run(schema, dict(scope), keep="call=h.*").trace) == 2
    with pytest.warns(KeepMissedWarning, match=r"kept nothing over this whole input.*wrapped after parsing"):
        trace = capture_run(schema, dict(scope), keep="transformer.h.*").trace  # GPT2Model's paths are h.N
    assert len(trace) == 0
    with pytest.warns(KeepMissedWarning, match=r"kept nothing over input 0.*statistics only"):
        store = capture_dataset(schema, token_inputs(2), tmp_path / "s", keep="transformer.h.*", progress=False)
    assert len(store) == 2 and not store.variables


def test_accelerate_hooks_added_after_parsing_keep_what_keep_names():
    from accelerate.hooks import ModelHook, add_hook_to_module

    model, schema = tiny_gpt2(2)
    scope = token_inputs(1)[0]
    with torch.no_grad():
        before = [s.value for s in capture_run(schema, dict(scope), keep="call=h.*").trace]
    add_hook_to_module(model, ModelHook())
    for layer in model.h:
        add_hook_to_module(layer, ModelHook())
    import warnings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", KeepMissedWarning)
        after = [s.value for s in capture_run(schema, dict(scope), keep="call=h.*").trace]
    assert len(before) == len(after) == 2 and all(torch.equal(a, b) for a, b in zip(before, after))
