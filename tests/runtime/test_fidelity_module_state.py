"""Reads of module state follow assignments made during the run, as eager does.

Forward may reassign a buffer or parameter (`self.b = self.b * 2`), register one, or replace a
child, on a branch the example input never takes: the parse-time check cannot see it, so the
runtime itself must read `self.<name>` from the live module at each use.
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


class _LazyHookInstaller(nn.Module):
    """Installs a forward hook on its child at the first call and records that in a private flag,
    as transformers' `capture_outputs` does (`_output_capturing_hooks_installed`)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        if not getattr(self, "_hooks_installed", False):
            self.inner.register_forward_hook(lambda module, args, output: output * 2)
            self._hooks_installed = True
        return self.inner(x) + 1


def test_parse_leaves_a_lazily_installed_hook_and_its_flag_as_it_found_them():
    torch.manual_seed(0)
    model = _LazyHookInstaller()
    x = torch.randn(2, 4)
    twin = copy.deepcopy(model)
    NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    assert not model.inner._forward_hooks
    assert "_hooks_installed" not in model.__dict__
    # The model still works as it did before parsing: its first call installs the hook.
    assert torch.equal(model(x), twin(x))
    assert model.inner._forward_hooks


def test_transformers_capture_outputs_still_records_hidden_states_after_parse():
    transformers = pytest.importorskip("transformers")
    config = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32)
    torch.manual_seed(0)
    model = transformers.SegformerForSemanticSegmentation(config).eval()
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = copy.deepcopy(model)(pixel_values=pixels).logits
        schema = NNParser.parse_model(model=model, inputs_tensors_values={"pixel_values": pixels})
        assert torch.equal(model(pixel_values=pixels).logits, expected)
        assert torch.equal(SchemaInterpreter().call(schema, pixel_values=pixels).logits, expected)
