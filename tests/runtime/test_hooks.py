"""Module forward hooks around an interpreted forward, as `Module._call_impl` runs them (runtime/hooks.py).

Each case parses a model, registers hooks on it, runs it eagerly and through the schema, and checks
that the outputs and what the hooks saw are the same both ways.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x, scale=1.0):
        return self.inner(x) * scale


def _run_both(model, schema, x, **kwargs):
    with torch.no_grad():
        eager = model(x, **kwargs)
        interpreted = SchemaInterpreter().call(schema, x, **kwargs)
    return eager, interpreted


def test_pre_hooks_with_kwargs_and_forward_hooks_with_kwargs_change_inputs_and_output_alike():
    model = Scaled().eval()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})  # hooks added after parsing
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: (args, {**kwargs, "scale": 3.0}), with_kwargs=True)
    model.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs["scale"]) or out + 1,
                                with_kwargs=True)
    model.inner.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    eager, interpreted = _run_both(model, schema, x, scale=0.5)
    assert torch.equal(eager, interpreted) and seen == [3.0, 3.0]


def test_an_always_called_hook_runs_when_the_forward_fails_and_the_error_is_the_models():
    model = Scaled().eval()
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(2, 3)})
    calls = []
    model.inner.register_forward_hook(lambda m, args, out: calls.append(out), always_call=True)
    bad = torch.randn(2, 5)
    with pytest.raises(RuntimeError) as eager_error:
        model(bad)
    with pytest.raises(RuntimeError) as schema_error:
        SchemaInterpreter().call(schema, bad)
    assert str(schema_error.value) == str(eager_error.value)
    assert calls == [None, None]  # called with no output, once each way


def test_a_global_forward_hook_sees_every_interpreted_module_as_eager_does():
    model = Scaled().eval()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
    try:
        with torch.no_grad():
            eager = model(x)
            interpreted = SchemaInterpreter().call(schema, x)
    finally:
        handle.remove()
    assert torch.equal(eager, interpreted)
    assert seen == ["Linear", "Scaled", "Linear", "Scaled"]
