"""Traces built lazily from the recorder's per-tensor records: the same steps, whenever they are read."""

import pickle

import torch

from nnschemaparser import SchemaInterpreter
from nnschemaparser.runtime.listeners import TraceListener
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.recorder import ActivationRecorder
from tests.support.trace_models import InPlace, parse, spec_mlp


def test_steps_are_built_only_when_the_trace_is_read():
    model, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    assert trace._steps == [] and len(trace.pending_records()) == 7, "a capture builds no TraceStep during the run"
    steps = trace.steps
    assert len(steps) == 7 and trace._pending == [] and trace.steps is steps


def test_shape_is_the_one_at_capture_even_if_the_kept_tensor_is_reshaped_in_place_before_the_trace_is_read():
    model, x, schema = spec_mlp()
    with torch.no_grad():  # nothing requires grad, so the kept value is the output object itself
        record = capture_run(schema, {"x": x})
    output = record.outputs[0]
    output.unsqueeze_(0)  # the caller reshapes its output in place, then looks at the trace for the first time
    step = record.trace.by_container("output_0007")
    assert step.tensor.shape == (2, 8) and step.tensor.dtype == "torch.float32"
    assert step.value is output, "the kept value is still an alias, as before lazy records"


class _ReadsTraceMidRun(TraceListener):
    """Reads the recorder's trace at every event, so some steps are built while later ones are still records."""

    every_instruction = False

    def __init__(self, recorder):
        self.recorder = recorder
        self.seen = []

    def on_instruction(self, event):
        self.seen.append(len(self.recorder.trace.steps))


def test_in_place_snapshots_reach_steps_already_built_and_steps_still_pending_alike():
    torch.manual_seed(0)
    model = InPlace().eval()
    x = torch.randn(4, 4)
    schema = parse(model, {"x": x})
    expected = {s.container_id: s.value.clone() for s in capture_run(schema, {"x": x.clone()}).trace}
    recorder = ActivationRecorder()
    reader = _ReadsTraceMidRun(recorder)
    SchemaInterpreter(listeners=[recorder, reader]).run(block=schema, scope={"x": x.clone()})
    assert reader.seen and reader.seen[0] >= 1, "the trace was read (and built) while the run went on"
    got = {s.container_id: s.value for s in recorder.trace}
    assert list(got) == list(expected)
    for cid, value in expected.items():
        assert torch.equal(got[cid], value), cid
    assert recorder.changed_in_place, "the model changes kept values in place"


def test_a_trace_with_pending_records_pickles_with_its_steps():
    model, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    assert trace._pending
    copy = pickle.loads(pickle.dumps(trace))
    assert copy.lines() == trace.lines()
    assert all(torch.equal(a.value, b.value) for a, b in zip(copy, trace))
