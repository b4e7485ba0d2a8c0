"""Condition expressions of if/while re-evaluations are not stepped (spec 000); traces keep them."""

import torch
from torch import nn

from nnschemaparser import ActivationRecorder, NNParser, SchemaInterpreter, capture_run
from nnschemaparser.schema.model import condition_instructions


class Loops(nn.Module):
    def forward(self, x):
        n = 0
        while x.sum() < 10:
            x = x * 2
            n = n + 1
        if x.mean() > 0:
            y = x + 1
        else:
            y = x - 1
        return y, n


def _steps(schema, scope, listeners=()):
    interpreter = SchemaInterpreter(listeners=list(listeners))
    run = interpreter.step_run(schema, scope)
    steps = []
    for step in run:
        steps.append((step.out_var, step.instruction))
    return steps, interpreter.step_outputs


def _parsed():
    x = torch.ones(2)
    return NNParser.parse_model(Loops(), inputs_tensors_values={"x": x}), x


def test_if_test_and_while_reevaluations_are_not_steps():
    schema, x = _parsed()
    (while_, if_) = [i for i in schema.body if getattr(i, "kind", None) in ("while", "if")]
    while_test = {id(i) for i in condition_instructions(while_)}
    if_test = {id(i) for i in condition_instructions(if_)}
    steps, outputs = _steps(schema, {"x": x})
    stepped = [id(instr) for _, instr in steps]
    assert not if_test & set(stepped)
    # the first evaluation of the while test is stepped once; the 3 re-evaluations are not
    assert sum(1 for i in stepped if i in while_test) == len(while_test)
    assert [name for name, _ in steps if name in ("x", "n", "y")] == ["n"] + ["x", "n"] * 3 + ["y"]
    expected = Loops()(x)
    assert torch.equal(outputs[0], expected[0]) and outputs[1] == expected[1]


def test_traces_still_record_every_condition_evaluation():
    schema, x = _parsed()
    (while_, if_) = [i for i in schema.body if getattr(i, "kind", None) in ("while", "if")]
    tensor_tests = [i.out_var for i in condition_instructions(while_) + condition_instructions(if_)
                    if isinstance(i.resolved.shape, tuple) and i.resolved.dtype.startswith("torch.")]
    record = capture_run(schema, {"x": x})
    recorded = [step.out_var for step in record.trace]
    for name in tensor_tests:
        assert name in recorded
    # the while test ran 4 times (3 loops and the failing test): all 4 are in the trace
    assert recorded.count(while_.cond_var) == 4
    # a stepped run with a recorder records the same trace as capture_run
    recorder = ActivationRecorder()
    _steps(schema, {"x": x}, [recorder])
    assert [s.out_var for s in recorder.trace] == recorded


def test_step_index_edits_count_only_stepped_instructions():
    schema, x = _parsed()
    steps, _ = _steps(schema, {"x": x})
    index = next(i for i, (name, _) in enumerate(steps, 1) if name == "y")
    interpreter = SchemaInterpreter()
    for step in interpreter.step_run(schema, {"x": x}, edits={index: [{"values": torch.zeros(2)}]}):
        assert step.step_index <= len(steps)
    assert torch.equal(interpreter.step_outputs[0], torch.zeros(2))
