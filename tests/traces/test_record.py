"""capture_run and ExecutionRecord: outputs equal eager, the trace, the root scope, gradients after backward."""

import torch

from tests.support.fixture_models import FIXTURES
from tests.support.exactness import assert_same_structure
from nnschemaparser import CaptureLimits
from nnschemaparser.traces.record import ExecutionRecord, capture_run
from nnschemaparser.traces.trace import ActivationTrace, GradientTrace
from tests.support.trace_models import parse, spec_mlp


def test_capture_run_returns_outputs_trace_and_the_root_scope():
    model, x, schema = spec_mlp()
    record = capture_run(block=schema, scope={"x": x})
    assert isinstance(record, ExecutionRecord) and isinstance(record.trace, ActivationTrace)
    assert torch.equal(record.outputs[0], model(x))
    assert {"x", "hidden", "activated"} <= set(record.scope)
    assert "self" not in record.scope and "$return" not in record.scope
    assert torch.equal(record.scope["activated"], record.trace.by_container("MLP_0004").value)


def test_capture_run_outputs_equal_eager_for_every_fixture():
    for name, factory in sorted(FIXTURES.items()):
        model, inputs = factory()
        model.eval()
        schema = parse(model, inputs)
        with torch.no_grad():
            expected = model(**inputs)
            record = capture_run(schema, dict(inputs))
        outputs = tuple(record.outputs) if isinstance(expected, tuple) else record.outputs[0]
        assert_same_structure(expected, outputs, name)
        assert len(record.trace) > 3 or schema.is_skipped, name


def test_record_gradients_after_the_callers_backward():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x.clone().requires_grad_(True)}, capture_grads=True)
    record.outputs[0].pow(2).sum().backward()
    gradients = record.gradients
    assert isinstance(gradients, GradientTrace) and len(gradients) == 7
    assert torch.equal(gradients.by_container("grad_output_0007").value, 2 * record.outputs[0].detach())


def test_capture_run_passes_limits_to_the_recorder():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x}, limits=CaptureLimits(max_tensors=2))
    assert [s.value is not None for s in record.trace] == [True, True] + [False] * 5


def test_capture_run_pauses_the_cyclic_gc_for_the_run_and_restores_it():
    import gc

    from nnschemaparser.runtime.listeners import TraceListener
    from nnschemaparser.traces import record as record_module

    model, x, schema = spec_mlp()
    seen = []

    class Probe(TraceListener):
        def on_instruction(self, event):
            seen.append(gc.isenabled())

    original = record_module.ActivationRecorder

    class Recorder(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.probe = Probe()

        def on_instruction(self, event):
            self.probe.on_instruction(event)
            super().on_instruction(event)

    assert gc.isenabled()
    record_module.ActivationRecorder = Recorder
    try:
        capture_run(schema, {"x": x})
        assert seen and not any(seen), "no collection may start during the capture"
        assert gc.isenabled(), "the collector is on again after the run"
        gc.disable()
        try:
            capture_run(schema, {"x": x})
            assert not gc.isenabled(), "a collector the caller had turned off stays off"
        finally:
            gc.enable()
        import pytest

        with pytest.raises(Exception):
            capture_run(schema, {"x": "not a tensor"})
        assert gc.isenabled(), "the collector is on again after a run that failed"
    finally:
        record_module.ActivationRecorder = original
