"""capture_run and ExecutionRecord: outputs equal eager, the trace, the root scope, gradients after backward."""

import torch

from fixture_models import FIXTURES
from exactness import assert_same_structure
from nnschemaparser import CaptureLimits
from nnschemaparser.traces.record import ExecutionRecord, capture_run
from nnschemaparser.traces.trace import ActivationTrace, GradientTrace
from trace_models import parse, spec_mlp


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
