"""The pause before a sub-block call (issue 11, item 2): `step_run(pause_before_calls=True)` yields a
`CallPause` before each call of a child's forward, a method schema or a module value with a block.
A pause is not a step: step indices, edits and traces are the same with and without pauses, and
plain runs and captures never report calls."""

from __future__ import annotations

import linecache

import pytest
import torch
from torch import nn

from tests.support.fidelity_models import HoldsScripted
from nnschemaparser import NNParser, SchemaInterpreter, TraceListener, capture_run
from nnschemaparser.runtime.interpreter import CallPause, StepInfo
from nnschemaparser.runtime.program import Program


class Looped(nn.Module):
    """A ModuleList walked by a loop variable, a method schema, a closure and a call in an `if` test."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.gate = nn.Linear(4, 1)

    def scale(self, h: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        doubled = h * factor
        return doubled.tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)

        def shift(v):
            return v - 1

        y = shift(x) + self.scale(x, factor=3.0)
        if self.gate(y).sum() > -1e9:
            y = y * 2
        return y


def _parsed(model: nn.Module, **inputs):
    return NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))


@pytest.fixture(scope="module")
def looped():
    torch.manual_seed(0)
    model = Looped().eval()
    x = torch.randn(2, 4)
    return model, {"x": x}, _parsed(model, x=x)


def _items(schema, scope, **kwargs):
    interpreter = SchemaInterpreter()
    items = list(interpreter.step_run(schema, dict(scope), **kwargs))
    return items, interpreter.step_outputs


def test_pauses_are_not_steps_the_step_indices_are_the_same_with_or_without(looped):
    model, scope, schema = looped
    plain, out_plain = _items(schema, scope)
    items, out = _items(schema, scope, pause_before_calls=True)
    steps = [i for i in items if isinstance(i, StepInfo)]
    assert [(s.step_index, s.out_var, s.block_path) for s in steps] == \
        [(s.step_index, s.out_var, s.block_path) for s in plain]
    assert not any(isinstance(i, CallPause) for i in plain), "no pauses unless asked for"
    assert torch.equal(out[0], out_plain[0]) and torch.equal(out[0], model(scope["x"]))
    for index, item in enumerate(items):
        if isinstance(item, CallPause):  # the next step is the callee's first or the call's completion
            following = next(i for i in items[index + 1:] if isinstance(i, StepInfo))
            assert following.step_index == item.after_step + 1


def test_a_pause_comes_before_each_call_of_a_child_a_loop_variable_module_and_a_method_schema(looped):
    _, scope, schema = looped
    items, _ = _items(schema, scope, pause_before_calls=True)
    pauses = [i for i in items if isinstance(i, CallPause)]
    assert [p.callee_path for p in pauses] == ["layers.0", "layers.1", "Looped.scale"]
    assert all(p.interpreted and p.frame_depth == 0 and p.block_path == "Looped" for p in pauses)
    # not before the closure `shift(x)`, and not inside the `if` test (`self.gate(y)` is no step)
    assert "gate" not in {p.callee_path for p in pauses}
    index = items.index(pauses[0])
    into = items[index + 1]
    assert isinstance(into, StepInfo) and into.block_path == "layers.0" and into.frame_depth == 1
    assert linecache.getline(pauses[0].location.filename, pauses[0].location.lineno).strip() == "x = layer(x)"
    assert linecache.getline(pauses[2].location.filename, pauses[2].location.lineno).strip() == \
        "y = shift(x) + self.scale(x, factor=3.0)"


def test_a_pause_shows_the_arguments_the_call_is_about_to_pass(looped):
    _, scope, schema = looped
    interpreter = SchemaInterpreter()
    run = interpreter.step_run(schema, dict(scope), pause_before_calls=True)
    seen = {}
    for item in run:
        if isinstance(item, CallPause):
            seen[item.callee_path] = (item.arguments(), dict(item.frame))
    args, frame = seen["Looped.scale"]
    assert [label for label, _ in args] == ["x", "factor"]
    assert args[0][1] is frame["x"] and args[1][1] == 3.0
    first, _ = seen["layers.0"]
    assert first[0][0] == "x" and torch.equal(first[0][1], scope["x"])
    pause = next(i for i in _items(schema, scope, pause_before_calls=True)[0] if isinstance(i, CallPause))
    assert repr(pause).startswith("CallPause(after step 1: about to call layers.0(x) at ")


def test_a_skipped_child_pauses_too_and_the_next_step_is_the_calls_completion():
    torch.manual_seed(0)
    model = HoldsScripted().eval()
    x = torch.randn(2, 4)
    schema = _parsed(model, x=x)
    items, out = _items(schema, {"x": x}, pause_before_calls=True)
    assert torch.equal(out[0], model(x))
    pause = next(i for i in items if isinstance(i, CallPause) and i.callee_path == "scripted")
    assert not pause.interpreted
    after = items[items.index(pause) + 1]
    assert isinstance(after, StepInfo) and after.instruction is pause.instruction  # the call's own step


def test_edits_apply_at_the_same_step_with_pauses_on(looped):
    _, scope, schema = looped
    plain, _ = _items(schema, scope)
    target = next(s for s in plain if s.block_path == "layers.1" and isinstance(s.value, torch.Tensor))
    edits = {target.step_index: [{"values": torch.zeros_like(target.value)}]}
    _, edited_plain = _items(schema, scope, edits=edits)
    _, edited = _items(schema, scope, edits=edits, pause_before_calls=True)
    assert torch.equal(edited[0], edited_plain[0])
    _, unedited = _items(schema, scope)
    assert not torch.equal(edited[0], unedited[0])


class _Calls(TraceListener):
    def __init__(self) -> None:
        self.calls = []

    def on_before_call(self, event) -> None:
        self.calls.append((event.callee_path, event.stepped))


def test_plain_runs_captures_and_steps_without_pauses_never_report_calls(looped):
    _, scope, schema = looped
    listener = _Calls()
    SchemaInterpreter(listeners=[listener]).run(schema, dict(scope))
    list(SchemaInterpreter(listeners=[listener]).step_run(schema, dict(scope)))
    capture_run(schema, dict(scope))
    assert listener.calls == []
    assert not Program(schema).observe_calls
    list(SchemaInterpreter(listeners=[listener]).step_run(schema, dict(scope), pause_before_calls=True))
    # listeners hear the call inside the `if` test too, marked as no step (the pause skips it)
    assert listener.calls == [("layers.0", True), ("layers.1", True), ("Looped.scale", True), ("gate", False)]


def test_closing_a_run_paused_before_a_call_unwinds_it(looped):
    model, scope, schema = looped
    interpreter = SchemaInterpreter()
    run = interpreter.step_run(schema, dict(scope), pause_before_calls=True)
    item = next(run)
    while not isinstance(item, CallPause):
        item = next(run)
    run.close()
    items, out = _items(schema, scope, pause_before_calls=True)  # the next run is whole
    assert torch.equal(out[0], model(scope["x"]))
