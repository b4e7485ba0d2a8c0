"""The observer interface the generated code calls, and how events reach listeners (runtime/listeners.py)."""

from __future__ import annotations

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, TraceListener
from nnschemaparser.runtime.listeners import EventObserver


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        y = self.inner(x)
        return y * 2


class Everything(TraceListener):
    def __init__(self):
        self.seen = []

    def on_instruction(self, event):
        self.seen.append((event.path, event.depth, event.instruction.out_var))


class DirectEverything(TraceListener):
    """Takes every instruction through `instruction_hook`, reading what the event would hold from
    the observer's public attributes."""

    def __init__(self):
        self.seen = []

    def on_instruction(self, event):  # pragma: no cover - the hook is used instead
        raise AssertionError("the observer should call the hook, not build an event")

    def instruction_hook(self):
        def hook(instr, frame, observer):
            assert isinstance(observer, EventObserver) and observer.frames_tuple()[-1] is frame
            self.seen.append((observer.path, observer.depth, instr.out_var))
        return hook


def test_an_instruction_hook_sees_what_events_would_hold():
    model = Nested().eval()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    by_event, by_hook = Everything(), DirectEverything()
    SchemaInterpreter(listeners=[by_event]).run(schema, {"x": x})
    SchemaInterpreter(listeners=[by_hook]).run(schema, {"x": x})
    assert by_hook.seen == by_event.seen
    assert ("inner", 1, "$t1") in by_event.seen and any(path == "Nested" and depth == 0 for path, depth, _ in
                                                        by_event.seen)


def test_with_two_listeners_each_gets_events_and_no_hook_is_used():
    model = Nested().eval()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    first, second = Everything(), Everything()
    SchemaInterpreter(listeners=[first, second]).run(schema, {"x": x})
    assert first.seen == second.seen and first.seen
