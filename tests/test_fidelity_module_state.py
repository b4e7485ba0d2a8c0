"""Reads of module state follow assignments made during the run, as eager does.

Forward may reassign a buffer or parameter (`self.b = self.b * 2`), register one, or replace a
child, on a branch the example input never takes: the parse-time check cannot see it, so the
engine itself must read `self.<name>` from the live module at each use.
"""

import copy

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run


class ReassignsOnBigInput(nn.Module):
    """Reassigns a buffer and a parameter and registers a new buffer when the input is big."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 1.5))
        self.shift = nn.Parameter(torch.randn(4))

    def forward(self, x):
        if x.sum() > 100:
            self.scale = self.scale * 2
            self.shift = nn.Parameter(self.shift * 3)
            self.register_buffer("extra", self.scale + 1)
        y = x * self.scale + self.shift
        if hasattr(self, "extra"):
            y = y + self.extra
        return y * self.scale


class WhileOnBuffer(nn.Module):
    """A loop whose test reads a buffer the body reassigns."""

    def __init__(self):
        super().__init__()
        self.register_buffer("budget", torch.tensor(3.0))

    def forward(self, x):
        while self.budget > 0 and x.sum() < 1e6:  # bounded even if the test went stale
            x = x * 2
            self.budget = self.budget - 1
        return x + self.budget


class ReplacesChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 100:
            self.proj = nn.Linear(4, 4)
            with torch.no_grad():
                self.proj.weight.fill_(0.5)
                self.proj.bias.fill_(0.25)
        return self.proj(x)


def _parse(model, x):
    return NNParser.parse_model(model, inputs_tensors_values={"x": x})


def _state(model):
    return {k: v.detach().clone() for k, v in list(model.named_parameters()) + list(model.named_buffers())}


def _assert_same_state(a, b):
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("big", [False, True], ids=["branch_not_taken", "branch_taken"])
def test_reassigned_buffer_and_parameter_are_read_live(training, big):
    torch.manual_seed(0)
    model = ReassignsOnBigInput().train(training)
    schema = _parse(model, torch.ones(4))  # the example input never takes the branch
    assert schema.skipped == {} and schema.skip_reason is None
    eager = copy.deepcopy(model)
    x = torch.full((4,), 1000.0 if big else 1.0)
    for _ in range(2):  # the second run sees the state the first one left
        expected = eager(x)
        got = SchemaInterpreter().run(schema, {"x": x})[0]
        assert torch.equal(got, expected)
        _assert_same_state(model, eager)
    assert hasattr(model, "extra") == big


@pytest.mark.parametrize("training", [False, True])
def test_gradients_flow_to_the_reassigned_parameter(training):
    torch.manual_seed(0)
    model = ReassignsOnBigInput().train(training)
    schema = _parse(model, torch.ones(4))
    eager = copy.deepcopy(model)
    x = torch.full((4,), 1000.0, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    SchemaInterpreter().run(schema, {"x": x})[0].sum().backward()
    eager(xe).sum().backward()
    assert torch.equal(x.grad, xe.grad)
    assert model.shift is not schema.module.__dict__.get("shift")  # a new Parameter was registered
    assert torch.equal(model.shift.grad, eager.shift.grad)


def test_observed_runs_and_steps_read_the_live_buffer():
    model = ReassignsOnBigInput()
    schema = _parse(model, torch.ones(4))
    x = torch.full((4,), 1000.0)
    eager = copy.deepcopy(model)
    expected = eager(x)
    record = capture_run(schema, {"x": x})
    assert torch.equal(record.outputs[0], expected)
    expected_second = eager(x)
    steps = SchemaInterpreter().step_run(schema, {"x": x})
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        assert torch.equal(stop.value[0], expected_second)


def test_while_test_reads_the_buffer_the_body_reassigns():
    model = WhileOnBuffer()
    schema = _parse(model, torch.ones(2))
    model.budget = torch.tensor(3.0)  # parse restored it; run from the same state as eager
    eager = copy.deepcopy(model)
    x = torch.ones(2)
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], eager(x))
    assert torch.equal(model.budget, eager.budget)


@pytest.mark.parametrize("big", [False, True], ids=["branch_not_taken", "branch_taken"])
def test_child_replaced_in_forward_is_the_one_called(big):
    torch.manual_seed(0)
    model = ReplacesChild()
    schema = _parse(model, torch.ones(4))
    eager = copy.deepcopy(model)
    x = torch.full((4,), 1000.0 if big else 1.0)
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], eager(x))
    assert (model.proj is not schema.sub_blocks["proj"].module) == big
