"""Constructs that made whole forwards run live: call defaults, private (mangled) names, and a
forward drawing from Python's `random` or numpy during parse-time verification."""

from __future__ import annotations

import random

import numpy as np
import torch

from nnschemaparser import NNParser, SchemaInterpreter, capture_run
from tests.support.live_call_models import CallDefaults, DrawsFromPythonRandom, PrivateNames


def _parse(model, x):
    return NNParser.parse_model(model, inputs_tensors_values={"x": x})


def test_defaults_evaluated_with_calls_are_the_functions_own_default_objects():
    torch.manual_seed(0)
    model, x = CallDefaults().eval(), torch.randn(2, 4)
    schema = _parse(model, x)
    assert schema.skipped == {} and schema.skip_reason is None
    assert schema.signature.defaults["embed_ids"] is CallDefaults.forward.__defaults__[0]
    assert schema.signature.defaults["scale"] == 2
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))
    out = SchemaInterpreter().run(block=schema, scope={"x": x, "embed_ids": {"a": 1}, "scale": 3})[0]
    assert torch.equal(out, model(x, {"a": 1}, scale=3))


def test_private_attribute_and_method_names_are_mangled_as_cpython_does():
    torch.manual_seed(0)
    model, x = PrivateNames().eval(), torch.randn(2, 4)
    schema = _parse(model, x)
    assert schema.skipped == {} and schema.skip_reason is None
    assert "_PrivateNames__helper" in schema.methods
    record = capture_run(schema, {"x": x})
    assert torch.equal(record.outputs[0], model(x))
    assert any(step.op_name == "_operator.mul" for step in record.trace.steps)


def test_verification_replays_pythons_and_numpys_random_state():
    torch.manual_seed(0)
    model, x = DrawsFromPythonRandom().eval(), torch.randn(2, 4)
    random.seed(5)
    np.random.seed(5)
    schema = _parse(model, x)
    assert schema.skipped == {} and schema.skip_reason is None
    # parsing leaves both generators as it found them
    assert random.random() == random.Random(5).random()
    assert np.random.rand() == np.random.RandomState(5).rand()
    random.seed(9)
    np.random.seed(9)
    expected = model(x)
    random.seed(9)
    np.random.seed(9)
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], expected)
