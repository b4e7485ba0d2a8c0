"""A capture of everything from a logged run (traces/logged.py) equals the observed capture, record for record.

`capture_run` records through the logged program unless something needs a decision per step;
`observe_all=True` runs the same capture observed, as it ran before logged runs. Both are run here
on real transformers models and the zoo's fast cases and compared field by field, values by
`torch.equal`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nnschemaparser import CaptureLimits, NNParser, capture_run
from nnschemaparser.runtime.step_log import loggable
from nnschemaparser.traces.logged import LogSpan
from nnschemaparser.validation import zoo

from tests.support.diverge_models import gpt2, llama


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def assert_same_trace(logged, observed) -> None:
    """Every step of two traces equal: every field, the tensor container's too, values torch.equal."""
    assert any(isinstance(item, LogSpan) for item in logged.trace._pending), "the capture was not logged"
    assert not any(isinstance(item, LogSpan) for item in observed.trace._pending)
    a, b = logged.trace.steps, observed.trace.steps
    assert [s.step for s in a] == [s.step for s in b]
    for x, y in zip(a, b):
        for field in dataclasses.fields(x):
            u, v = getattr(x, field.name), getattr(y, field.name)
            if field.name == "tensor":
                assert (u.shape, u.dtype, u.container_id, u.slot_type) == (v.shape, v.dtype, v.container_id,
                                                                          v.slot_type), x.container_id
                assert _same_value(u.value, v.value), x.container_id
            elif field.name == "sample":
                assert len(u) == len(v) and all(torch.equal(p, q) for p, q in zip(u, v)), x.container_id
            else:
                assert u == v, (x.container_id, field.name, u, v)
    assert logged.trace.root == observed.trace.root
    assert logged.recorder.changed_in_place == observed.recorder.changed_in_place
    assert list(logged.scope) == list(observed.scope)


def _both(schema, inputs, **options):
    logged = capture_run(schema, dict(inputs), **options)
    observed = capture_run(schema, dict(inputs), observe_all=True, **options)
    return logged, observed


def _parse(model, inputs):
    return NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_logged_capture_equals_the_observed_one_on_transformers_models(build):
    model, inputs = build(layers=2)
    schema = _parse(model, inputs)
    with torch.no_grad():
        logged, observed = _both(schema, inputs)
    assert_same_trace(logged, observed)
    assert len(logged.trace) > 100
    for a, b in zip(logged.outputs, observed.outputs):
        assert torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_logged_capture_with_gradients_equals_the_observed_one(build):
    model, inputs = build(layers=1)
    schema = _parse(model, inputs)
    logged, observed = _both(schema, inputs, capture_grads=True)
    assert_same_trace(logged, observed)
    for record in (logged, observed):
        record.outputs[0].logits.square().mean().backward()
    a, b = logged.gradients.steps, observed.gradients.steps
    assert len(a) == len(b) > 20
    for x, y in zip(a, b):
        assert (x.step, x.container_id, x.omitted) == (y.step, y.container_id, y.omitted)
        assert _same_value(x.tensor.value, y.tensor.value), x.container_id
    assert all(not s.tensor.value.requires_grad for s in logged.trace.steps if s.tensor.value is not None)


@pytest.mark.parametrize("case", zoo.fast_subset(), ids=lambda c: c.name)
def test_a_logged_capture_equals_the_observed_one_on_the_fast_zoo(case):
    torch.manual_seed(0)
    model = case.build().eval()

    def fresh_inputs():  # a case's inputs may hold state a run changes (a KV cache): each run gets its own
        torch.manual_seed(1)
        return case.make_inputs(model)

    schema = _parse(model, fresh_inputs())
    with torch.no_grad():
        logged = capture_run(schema, fresh_inputs())
        observed = capture_run(schema, fresh_inputs(), observe_all=True)
    assert_same_trace(logged, observed)


class InPlace(nn.Module):
    """Values changed in place after they were recorded: by a flagged op, and by one the schema
    cannot see as mutating (the in-place flag passed positionally)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        view = h[0]
        h.mul_(2)  # flagged: the values recorded before (h, and its view) are kept as they were
        g = torch.relu(h)
        kept = torch.nn.functional.relu(g, True)  # not flagged: g's recorded value is dropped
        return kept + view


def test_values_changed_in_place_after_they_were_recorded_are_handled_as_in_an_observed_capture():
    model, x = InPlace(), torch.randn(2, 4)
    schema = _parse(model, {"x": x})
    with torch.no_grad():
        logged, observed = _both(schema, {"x": x})
    assert_same_trace(logged, observed)
    steps = {s.out_var: s for s in logged.trace.steps}
    assert steps["h"].step in logged.recorder.changed_in_place
    assert torch.equal(steps["h"].value, model.fc(x))  # as recorded, before mul_
    assert steps["g"].value is None and "changed in place" in steps["g"].omitted


def test_a_closure_and_a_module_held_in_a_variable_are_numbered_and_placed_as_observed():
    class Closures(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(2))

        def forward(self, x):
            def twice(v):
                return torch.tanh(v) * 2

            for layer in self.layers:
                x = twice(layer(x))
            return x.sum(), [torch.sin(t) for t in (x, x + 1)]

    model, x = Closures(), torch.randn(2, 3)
    schema = _parse(model, {"x": x})
    assert loggable(schema) is None
    with torch.no_grad():
        logged, observed = _both(schema, {"x": x})
    assert_same_trace(logged, observed)
    assert {s.frame_depth for s in logged.trace.steps} >= {0, 1}


def test_options_that_decide_per_step_keep_the_observed_path():
    model, inputs = gpt2(layers=1)
    schema = _parse(model, inputs)
    with torch.no_grad():
        for options in ({"keep": "transformer.h.0", "limits": CaptureLimits(max_tensors=10 ** 6)},
                        {"observe_all": True}):
            record = capture_run(schema, dict(inputs), **options)
            assert not any(isinstance(item, LogSpan) for item in record.trace._pending)
        record = capture_run(schema, dict(inputs))
        assert any(isinstance(item, LogSpan) for item in record.trace._pending)


def test_an_output_reshaped_in_place_before_the_trace_is_read_keeps_its_recorded_shape():
    model, inputs = llama(layers=1)
    schema = _parse(model, inputs)
    with torch.no_grad():
        logged, observed = _both(schema, inputs)
    for record in (logged, observed):
        record.outputs[0].logits.unsqueeze_(0)
    assert_same_trace(logged, observed)
    last = [s for s in logged.trace.steps if s.slot_type == "activation"][-1]
    assert last.tensor.shape == tuple(logged.outputs[0].logits.shape[1:])


def test_a_capture_under_inference_mode_or_of_inference_tensors_runs_observed():
    model, x = nn.Sequential(nn.Linear(3, 3), nn.Tanh()), torch.randn(2, 3)
    schema = _parse(model, {"input": x})
    with torch.inference_mode():
        record = capture_run(schema, {"input": torch.randn(2, 3)})
        inference_input = torch.randn(2, 3)
    assert len(record.trace.steps) == 6 and record.trace.steps[-1].value is not None
    with torch.no_grad():
        record = capture_run(schema, {"input": inference_input})
    assert not any(isinstance(item, LogSpan) for item in record.trace._pending)
    assert len(record.trace.steps) == 6
