"""Generator functions (a `@contextmanager` method, as PEFT's `_enable_peft_forward_hooks`) are
lowered with `yield` as an instruction: values sent and thrown in, and cleanup on exit, as CPython
runs them, in plain, captured and stepped runs."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run


class WithContext(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.log: list = []

    @contextlib.contextmanager
    def scaled(self, k, fail=False):
        self.log.append("enter")
        weight = self.fc(torch.ones(1, 4)).sum()  # work inside the generator, before its yield
        try:
            yield weight * k
        except ValueError:
            self.log.append("caught")
            raise
        finally:
            self.log.append("exit")

    def forward(self, x, fail: bool = False):
        with self.scaled(3) as s:
            y = self.fc(x) * s
            if fail:
                raise ValueError("inside the with block")
        return y


class Pairs(nn.Module):
    """A plain generator method driven by the forward (send and next)."""

    def pairs(self, x):
        total = x
        while True:
            got = yield total
            if got is None:
                return
            total = total + got

    def forward(self, x):
        gen = self.pairs(x)
        first = next(gen)
        second = gen.send(first * 2)
        third = gen.send(second)
        gen.close()
        return first + second + third


def _parse(model, **inputs):
    return NNParser.parse_model(model, inputs_tensors_values=inputs)


def test_a_contextmanager_method_is_interpreted_with_its_steps_and_cleanup():
    torch.manual_seed(0)
    model, x = WithContext().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    assert schema.skipped == {} and "scaled" in schema.methods
    model.log.clear()
    expected = model(x)
    eager_log = list(model.log)
    model.log.clear()
    record = capture_run(schema, {"x": x})
    assert torch.equal(record.outputs[0], expected)
    assert model.log == eager_log == ["enter", "exit"]
    inside = [s for s in record.trace.steps if s.block_path == "WithContext" and s.out_var in ("weight", "$t5")]
    assert any(s.out_var == "weight" for s in inside)


def test_an_exception_in_the_with_block_is_thrown_into_the_generator_as_in_eager():
    torch.manual_seed(0)
    model, x = WithContext().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    model.log.clear()
    with pytest.raises(ValueError, match="inside the with block"):
        model(x, True)
    eager_log = list(model.log)
    for run in (lambda: SchemaInterpreter().run(block=schema, scope={"x": x, "fail": True}),
                lambda: capture_run(schema, {"x": x, "fail": True})):
        model.log.clear()
        with pytest.raises(ValueError, match="inside the with block"):
            run()
        assert model.log == eager_log == ["enter", "caught", "exit"]


def test_a_stepped_run_steps_inside_the_generator_in_the_order_it_runs():
    torch.manual_seed(0)
    model, x = WithContext().eval(), torch.randn(2, 4)
    schema = _parse(model, x=x)
    out_vars = [step.instruction.out_var for step in SchemaInterpreter().step_run(block=schema, scope={"x": x})
                if hasattr(step, "instruction")]
    assert out_vars.index("weight") < out_vars.index("y")


def test_send_next_and_close_drive_an_interpreted_generator_exactly():
    x = torch.randn(3)
    model = Pairs()
    schema = _parse(model, x=x)
    assert schema.skipped == {} and "pairs" in schema.methods
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))
    assert torch.equal(capture_run(schema, {"x": x}).outputs[0], model(x))
