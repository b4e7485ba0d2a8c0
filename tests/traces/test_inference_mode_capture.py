"""A capture under `torch.inference_mode()`: its tensors have no version counter, so the recorder
cannot tell a later in-place change from their counter. It used to fail at the first op flagged as
mutating (`nn.ReLU` calls `F.relu(input, inplace=...)`); each such value is now kept as a copy of its
own when recorded, so what a step holds is its value at that step, whatever changes it later."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from nnschemaparser import NNParser, capture_run


class ChangedLater(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc(x)
        kept = h * 2
        F.relu(kept, True)  # in place, with `inplace` passed positionally
        y = self.act(h)  # in place, flagged
        return self.out(y) + kept.sum(-1, keepdim=True)


def _values(trace):
    return [(s.block_path, s.out_var, s.tensor.value) for s in trace.steps]


def test_a_capture_under_inference_mode_holds_each_value_as_it_was_at_its_step():
    torch.manual_seed(0)
    model = ChangedLater().eval()
    x = torch.randn(4, 6)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    with torch.inference_mode():
        trace = capture_run(schema, {"x": x}).trace
        out = model(x.clone())
    with torch.no_grad():
        h = model.fc(x)
        kept = h * 2
    found = {var: value for _, var, value in _values(trace) if value is not None}
    assert torch.equal(found["h"], h)  # before the flagged in-place ReLU
    assert torch.equal(found["kept"], kept)  # before the positional in-place relu, which has no flag
    assert (kept < 0).any()  # so the in-place change was real
    assert torch.equal(trace.steps[-1].tensor.value, out)


def test_inference_mode_and_no_grad_captures_agree_step_for_step():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(3, 5)
    schema = NNParser.parse_model(model, inputs_tensors_values={"input": x})
    with torch.no_grad():
        plain = _values(capture_run(schema, {"input": x}, observe_all=True).trace)
    for options in ({}, {"observe_all": True}, {"keep": "*:*"}):
        with torch.inference_mode():
            inferred = _values(capture_run(schema, {"input": x}, **options).trace)
        assert [(p, v) for p, v, _ in inferred] == [(p, v) for p, v, _ in plain], options
        for (_, var, a), (_, _, b) in zip(inferred, plain):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (options, var)
