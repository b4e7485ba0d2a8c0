"""Parsing leaves the Python state a forward writes as it was: module globals it rebinds, containers
globals hold, class attributes, mutable default objects and closure variables (`python_state`).

Before, each of the parse's runs (the resolution run, eager for verification, both again when they
differ) left what it wrote: `cache={}` kept 4 entries, counters counted the parse's runs, and
verification compared eager and the schema from different states, so an exact block was skipped.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter

CALLS: list = []
SEEN = {"runs": 0}
MODE = 1
BOX = types.SimpleNamespace(runs=0)  # an attribute of a global object: deeper than what is put back


def note_call():
    global MODE
    CALLS.append(1)
    SEEN["runs"] += 1
    MODE = MODE + 1
    BOX.runs += 1


class CountsEverywhere(nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, cache={}):
        note_call()
        cache[len(cache)] = x.sum().item()
        CountsEverywhere.calls += 1
        return self.fc(x) * len(cache) + CountsEverywhere.calls


def make_closure_model():
    runs = 0

    def tick():
        nonlocal runs
        runs += 1
        return runs

    class CountsInACell(nn.Module):
        def forward(self, x):
            return x * tick()

    return CountsInACell, lambda: runs


def _parse(model, x):
    return NNParser.parse_model(model=model, inputs_tensors_values={"x": x})


def test_parsing_puts_back_globals_containers_class_attributes_and_mutable_defaults():
    model, x = CountsEverywhere().eval(), torch.randn(2, 4)
    default = CountsEverywhere.forward.__defaults__[0]
    before_box = BOX.runs
    schema = _parse(model, x)
    assert CALLS == [] and SEEN == {"runs": 0} and MODE == 1  # the parse's runs left nothing behind
    assert default == {} and CountsEverywhere.calls == 0
    assert BOX.runs - before_box >= 2  # it did run the forward (twice: resolution, then eager to verify)
    assert schema.skipped == {} and schema.skip_reason is None  # both runs started alike: verified exact
    expected = model(x)  # from the state before the parse
    CALLS.clear()
    SEEN["runs"], CountsEverywhere.calls = 0, 0
    default.clear()
    globals()["MODE"] = 1
    assert torch.equal(SchemaInterpreter().call(schema, x), expected)  # from the same state again


def test_parsing_puts_back_a_closure_variable_the_forward_rebinds():
    cls, runs = make_closure_model()
    schema = _parse(cls(), torch.ones(2))
    assert runs() == 0
    assert schema.skipped == {}


def test_a_global_the_forward_adds_is_removed_after_parsing():
    class AddsAGlobal(nn.Module):
        def forward(self, x):
            define_late()
            return x

    assert "LATE_NAME" not in globals()
    _parse(AddsAGlobal(), torch.ones(2))
    assert "LATE_NAME" not in globals()


def define_late():
    globals()["LATE_NAME"] = 1
