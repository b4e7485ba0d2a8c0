"""The observer's direct path for a tensor-results recorder: the same trace as through InstructionEvents."""

import torch

from tests.support.fixture_models import FIXTURES
from nnschemaparser import SchemaInterpreter
from nnschemaparser.runtime.listeners import EventObserver, TraceListener
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.recorder import ActivationRecorder
from tests.support.trace_models import InPlace, parse, spec_mlp


class _ThroughEvents(ActivationRecorder):
    def tensor_result_hook(self):
        return None


def _same_trace(a, b, name):
    assert a.lines() == b.lines(), name
    for x, y in zip(a, b):
        assert (x.value is None) == (y.value is None) and x.omitted == y.omitted, (name, x.container_id)
        if x.value is not None:
            assert torch.equal(x.value, y.value), (name, x.container_id)


def test_direct_path_and_events_give_the_same_trace_for_every_fixture_and_in_place_ops():
    torch.manual_seed(0)
    cases = [(name, *factory()) for name, factory in sorted(FIXTURES.items())]
    cases.append(("InPlace", InPlace().eval(), {"x": torch.randn(4, 4)}))
    for name, model, inputs in cases:
        model.eval()
        schema = parse(model, inputs)
        with torch.no_grad():
            direct = capture_run(schema, {k: v.clone() if isinstance(v, torch.Tensor) else v
                                          for k, v in inputs.items()})
            recorder = _ThroughEvents()
            SchemaInterpreter(listeners=[recorder]).run(block=schema, scope={
                k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        _same_trace(direct.trace, recorder.trace, name)
        assert direct.recorder.root_frame is not None and recorder.root_frame is not None, name
        assert set(direct.scope) == {k for k in recorder.root_frame if k in direct.scope}, name


def test_the_direct_path_is_used_only_for_one_tensor_results_listener_without_value_capture():
    recorder = ActivationRecorder()
    assert EventObserver([recorder])._direct is not None
    assert EventObserver([recorder], capture_values=True)._direct is None
    assert EventObserver([recorder, ActivationRecorder()])._direct is None

    class EveryInstruction(TraceListener):
        def on_instruction(self, event):
            pass

    assert EventObserver([recorder, EveryInstruction()])._direct is None
    assert EventObserver([_ThroughEvents()])._direct is None


def test_a_recorder_subclass_overriding_on_instruction_still_gets_its_events():
    model, x, schema = spec_mlp()
    seen = []

    class Counting(ActivationRecorder):
        def on_instruction(self, event):
            seen.append(event.instruction)
            super().on_instruction(event)

    assert EventObserver([Counting()])._direct is None
    recorder = Counting()
    SchemaInterpreter(listeners=[recorder]).run(block=schema, scope={"x": x})
    assert seen and len(recorder.trace) == 7
