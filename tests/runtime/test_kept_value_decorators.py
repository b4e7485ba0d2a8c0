"""A decorator that keeps a method's result and returns it on later calls runs nothing live.

vit-pytorch's `Dino` builds its projector and its teacher encoder once, under
`@singleton('projector')` / `@singleton('teacher_encoder')` on methods, and returns the module kept
on the instance afterwards. When the decorator calls the method, the schema runs (the method block,
interpreted); when it returns the kept value it runs no code of the method, exactly as in eager, so
nothing is reported. A decorator that calls another implementation is still a "dispatch" row (see
test_live_in_the_dark.py)."""

from __future__ import annotations

import copy
from functools import wraps

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run


def singleton(cache_key):
    """vit-pytorch's `singleton`, as written there."""
    def inner_fn(fn):
        @wraps(fn)
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None:
                return instance

            instance = fn(self, *args, **kwargs)
            setattr(self, cache_key, instance)
            return instance
        return wrapper
    return inner_fn


class Projector(nn.Module):
    def __init__(self, dim, out):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 8), nn.GELU(), nn.Linear(8, out))

    def forward(self, x):
        return self.net(x)


class NetWrapper(nn.Module):
    def __init__(self, net, output_dim):
        super().__init__()
        self.net = net
        self.output_dim = output_dim
        self.projector = None

    @singleton('projector')
    def _get_projector(self, hidden):
        _, dim = hidden.shape
        projector = Projector(dim, self.output_dim)
        return projector.to(hidden)

    def forward(self, x, return_projection=True):
        embed = self.net(x)
        if not return_projection:
            return embed
        projector = self._get_projector(embed)
        return projector(embed), embed


class SmallDino(nn.Module):
    """vit-pytorch's Dino in short: a student, and a teacher copied from it on first use."""

    def __init__(self):
        super().__init__()
        self.student_encoder = NetWrapper(nn.Linear(6, 5), 3)
        self.teacher_encoder = None

    @singleton('teacher_encoder')
    def _get_teacher_encoder(self):
        teacher_encoder = copy.deepcopy(self.student_encoder)
        for parameter in teacher_encoder.parameters():
            parameter.requires_grad_(False)
        return teacher_encoder

    def forward(self, x):
        student_one, _ = self.student_encoder(x)
        student_two, _ = self.student_encoder(x * 2)
        with torch.no_grad():
            teacher_encoder = self._get_teacher_encoder()
            teacher_one, _ = teacher_encoder(x)
            teacher_two, _ = teacher_encoder(x * 2)
        return (student_one - teacher_one).pow(2).mean() + (student_two - teacher_two).pow(2).mean()


def test_dino_singleton_methods_returning_kept_modules_are_not_reported():
    torch.manual_seed(0)
    model = SmallDino()
    x = torch.randn(4, 6)
    model(x)  # a trained Dino has built its projector and teacher
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {}
    assert schema.coverage().empty
    record = capture_run(schema, {"x": x}, coverage=True)
    assert record.coverage().empty
    assert torch.equal(record.outputs[0], model(x))


class KeepsScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = None

    @singleton('scale')
    def get_scale(self, x):
        scale = x.abs().mean()
        return scale

    def forward(self, x):
        return self.fc(x) * self.get_scale(x)


def test_a_kept_value_decorator_runs_the_method_interpreted_once_then_returns_what_it_kept():
    torch.manual_seed(0)
    eager, parsed = KeepsScale(), KeepsScale()
    parsed.load_state_dict(eager.state_dict())
    first, second = torch.randn(2, 4), torch.randn(2, 4)
    schema = NNParser.parse_model(parsed, inputs_tensors_values={"x": first})
    assert schema.skipped == {} and schema.coverage().empty
    assert parsed.scale is None  # the parse put back what its runs kept
    record = capture_run(schema, {"x": first}, coverage=True)  # the method runs, interpreted
    assert any(step.out_var == "scale" and step.frame_depth == 1 for step in record.trace.steps)
    again = capture_run(schema, {"x": second}, coverage=True)  # the kept value: nothing of the method runs
    assert not any(step.out_var == "scale" for step in again.trace.steps)
    assert record.coverage().empty and again.coverage().empty
    assert torch.equal(record.outputs[0], eager(first)) and torch.equal(again.outputs[0], eager(second))
    assert torch.equal(parsed.scale, eager.scale)
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": second})[0], eager(second))
