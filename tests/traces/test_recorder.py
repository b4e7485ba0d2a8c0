"""ActivationRecorder and ActivationTrace: ids, descriptions, values at capture time, limits, save format."""

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.support.fixture_models import FIXTURES
from nnschemaparser import CaptureLimits, SchemaInterpreter, TensorContainer
from nnschemaparser.traces.recorder import ActivationRecorder
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.trace import ActivationTrace
from tests.support.trace_models import InPlace, MutatesInput, PositionalInplace, Structured, ViewMutation, parse, spec_mlp

SPEC_LINES = [
    "step 0001: Initial input tensor | container_id: input_0001 | torch.float32[2, 16] | var: x",
    "step 0002: Linear projection | container_id: fc1_0002 | torch.float32[2, 32] | var: $t1 | block: fc1",
    "step 0003: Call to sub-block fc1 (Linear) | container_id: MLP_0003 | torch.float32[2, 32] | var: hidden | block: MLP",
    "step 0004: ReLU activation | container_id: MLP_0004 | torch.float32[2, 32] | var: activated | block: MLP",
    "step 0005: Linear projection | container_id: fc2_0005 | torch.float32[2, 8] | var: $t1 | block: fc2",
    "step 0006: Call to sub-block fc2 (Linear) | container_id: MLP_0006 | torch.float32[2, 8] | var: $t2 | block: MLP",
    "step 0007: Model output tensor | container_id: output_0007 | torch.float32[2, 8] | var: $t2 | block: MLP",
]


def _record_spec_mlp():
    model, x, schema = spec_mlp()
    recorder = ActivationRecorder()
    outputs = SchemaInterpreter(listeners=[recorder]).run(block=schema, scope={"x": x})
    return model, x, recorder.trace, outputs


def test_quick_start_mlp_trace_reproduces_the_spec_example():
    _, _, trace, _ = _record_spec_mlp()
    assert isinstance(trace, ActivationTrace)
    assert trace.container_ids == ["input_0001", "fc1_0002", "MLP_0003", "MLP_0004", "fc2_0005", "MLP_0006",
                                   "output_0007"]
    assert trace.lines() == SPEC_LINES
    assert [s.slot_type for s in trace] == ["input"] + ["activation"] * 5 + ["output"]
    assert [s.frame_depth for s in trace] == [0, 1, 0, 0, 1, 0, 0]
    assert [s.block_path for s in trace] == ["", "fc1", "MLP", "MLP", "fc2", "MLP", "MLP"]
    assert [s.op_name for s in trace][1:6] == ["torch._C._nn.linear", "fc1", "Tensor.relu", "torch._C._nn.linear",
                                               "fc2"]
    assert [s.step for s in trace] == list(range(1, 8))


def test_every_step_holds_a_tensor_container_with_its_id_role_and_value():
    model, x, trace, outputs = _record_spec_mlp()
    for step in trace:
        assert isinstance(step.tensor, TensorContainer)
        assert step.tensor.container_id == step.container_id
        assert step.tensor.slot_type == step.slot_type
        assert tuple(step.tensor.shape) == tuple(step.value.shape)
        assert step.tensor.dtype == str(step.value.dtype)
        assert not step.value.requires_grad
    with torch.no_grad():
        hidden = model.fc1(x)
        activated = hidden.relu()
    assert torch.equal(trace.by_container("input_0001").value, x)
    assert torch.equal(trace.by_container("fc1_0002").value, hidden)
    assert torch.equal(trace.by_container("MLP_0004").value, activated)
    assert torch.equal(trace.by_container("output_0007").value, outputs[0])


def test_trace_save_writes_one_spec_line_per_step(tmp_path):
    _, _, trace, _ = _record_spec_mlp()
    path = trace.save(tmp_path / "trace.txt")
    assert path.read_text().splitlines() == SPEC_LINES


def test_by_container_unknown_id_names_the_closest_ids():
    _, _, trace, _ = _record_spec_mlp()
    assert trace.by_container("MLP_0004").out_var == "activated"
    with pytest.raises(KeyError, match="MLP_0004"):
        trace.by_container("MLP_004")
    assert "fc2_0005" in trace and "fc2_0009" not in trace


def test_values_are_aliases_not_copies_when_nothing_mutates_them():
    """Capture does not clone everything: without in-place ops a step shares its tensor's storage."""
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x})
    hidden = record.scope["hidden"]
    step = record.trace.by_container("MLP_0003")
    assert step.value.untyped_storage().data_ptr() == hidden.untyped_storage().data_ptr()


def test_in_place_ops_after_capture_do_not_change_recorded_values():
    torch.manual_seed(0)
    model = InPlace().eval()
    x = torch.randn(4, 4)
    schema = parse(model, {"x": x})
    record = capture_run(schema, {"x": x.clone()})
    with torch.no_grad():  # eager, keeping a copy of every value at the moment it was produced
        y = x * 2
        y_first = y.clone()
        y.add_(1)
        y_added = y.clone()
        y[0] = 0.5
        z = y @ y.t()
        z_first = z.clone()
        z += 1
        proj = model.proj(x)
        proj_first = proj.clone()
        h = F.relu(proj, inplace=True)
    values = {s.container_id: s.value for s in record.trace}
    assert torch.equal(values["InPlace_0002"], y_first)
    assert torch.equal(values["InPlace_0003"], y_added)
    assert torch.equal(values["InPlace_0005"], z_first)
    assert torch.equal(values["InPlace_0006"], z)
    assert torch.equal(values["proj_0007"], proj_first)
    assert torch.equal(values["InPlace_0008"], proj_first)
    assert torch.equal(values["act_0009"], h)
    assert torch.equal(values["output_0011"], z) and torch.equal(values["output_0012"], h)
    assert not torch.equal(proj_first, h), "the relu must really have changed something in place"


def test_mutation_through_a_view_does_not_change_the_recorded_base():
    x = torch.randn(2, 3)
    schema = parse(ViewMutation(), {"x": x})
    trace = capture_run(schema, {"x": x}).trace
    assert torch.equal(trace.by_container("ViewMutation_0002").value, x + 1)
    assert torch.equal(trace.by_container("ViewMutation_0003").value, (x + 1).view(-1))
    assert torch.equal(trace.by_container("ViewMutation_0004").value, torch.zeros(6))


def test_root_input_changed_in_place_by_the_forward_keeps_its_value_at_capture_time():
    x = torch.randn(3, 2)
    schema = parse(MutatesInput(), {"x": x.clone()})
    scope = {"x": x.clone()}
    trace = capture_run(schema, scope).trace
    assert torch.equal(scope["x"], x * 2), "the forward really changed its input"
    assert torch.equal(trace.by_container("input_0001").value, x)
    assert torch.equal(trace.by_container("output_0004").value, x * 2 + 1)


def test_structured_inputs_and_outputs_give_one_step_per_tensor():
    torch.manual_seed(0)
    pair = (torch.randn(2, 3), torch.randn(2, 3))
    schema = parse(Structured(), {"pair": pair})
    trace = capture_run(schema, {"pair": pair}).trace
    inputs = [s for s in trace if s.slot_type == "input"]
    outputs = [s for s in trace if s.slot_type == "output"]
    assert [s.out_var for s in inputs] == ["pair[0]", "pair[1]"]
    assert [s.container_id for s in inputs] == ["input_0001", "input_0002"]
    assert [s.out_var.split("[", 1)[1] for s in outputs] == ["'sum']", "'scaled']"]
    assert torch.equal(outputs[1].value, outputs[0].value * 2.0)


def test_recorder_reuse_starts_a_fresh_trace_and_keeps_the_old_one():
    _, x, schema = spec_mlp()
    recorder = ActivationRecorder()
    interpreter = SchemaInterpreter(listeners=[recorder])
    interpreter.run(schema, {"x": x})
    first = recorder.trace
    interpreter.run(schema, {"x": x * 2})
    assert recorder.trace is not first
    assert len(first) == len(recorder.trace) == 7
    assert torch.equal(first.by_container("input_0001").value, x)
    assert torch.equal(recorder.trace.by_container("input_0001").value, x * 2)


def test_limits_past_max_tensors_keep_metadata_sample_and_reason():
    _, x, schema = spec_mlp()
    limits = CaptureLimits(max_tensors=3, max_samples_per_tensor=5, max_bytes=1 << 20)
    trace = capture_run(schema, {"x": x}, limits=limits).trace
    assert len(trace) == 7
    kept, dropped = trace.steps[:3], trace.steps[3:]
    assert all(s.value is not None and s.omitted is None for s in kept)
    for step in dropped:
        assert step.value is None
        assert "max_tensors" in step.omitted
        assert len(step.sample) == 5
        assert step.tensor.shape and step.tensor.dtype == "torch.float32"
    expected = torch.relu(schema.module.fc1(x)).detach().reshape(-1)[:5].tolist()
    assert list(trace.by_container("MLP_0004").sample) == pytest.approx(expected, abs=0)
    assert "value omitted: max_tensors" in trace.by_container("MLP_0004").line()


def test_limits_past_max_bytes_drop_the_tensor_that_does_not_fit():
    _, x, schema = spec_mlp()
    limits = CaptureLimits(max_bytes=2 * 16 * 4 + 2 * 32 * 4 + 100)  # the input and one hidden tensor
    trace = capture_run(schema, {"x": x}, limits=limits).trace
    # Once the quota has run out, later (smaller) tensors are not kept either.
    assert [s.value is not None for s in trace] == [True, True, False, False, False, False, False]
    assert all("max_bytes" in s.omitted for s in trace.steps[2:])


def test_recorder_refuses_limits_of_the_wrong_type():
    with pytest.raises(TypeError, match="CaptureLimits"):
        ActivationRecorder(limits={"max_tensors": 3})


def test_capture_leaves_parameters_buffers_and_training_mode_alone():
    model, inputs = FIXTURES["cnn"]()
    model.train()
    schema = parse(model, inputs)
    before = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        capture_run(schema, dict(inputs))
    assert model.training
    model.eval()
    schema_eval = parse(model, inputs)
    capture_run(schema_eval, dict(inputs))
    assert not model.training
    after = model.state_dict()
    for name, value in before.items():
        if "running" in name or "num_batches" in name:
            continue  # train-mode BatchNorm moves its statistics, as the eager forward does
        assert torch.equal(value, after[name]), name


# A forward hook turns off the fused fast path of these modules, which changes their last bits.
_HOOK_SENSITIVE = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer, torch.nn.MultiheadAttention)


def _module_outputs_in_call_order(model, inputs):
    """Eager forward with hooks: (module path, cloned output) for every tensor-returning call."""
    names = {id(m): n for n, m in model.named_modules()}
    seen = []
    sensitive = {id(sub) for m in model.modules() if isinstance(m, _HOOK_SENSITIVE) for sub in m.modules()}
    hooked = [m for m in model.modules() if id(m) not in sensitive]
    handles = [m.register_forward_hook(lambda mod, a, out: seen.append((names[id(mod)], out.detach().clone()))
                                       if isinstance(out, torch.Tensor) else None) for m in hooked]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _ancestors(model, path):
    parts = path.split(".")
    return [model.get_submodule(".".join(parts[:i])) for i in range(1, len(parts) + 1)]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_sub_block_call_steps_equal_eager_module_outputs(name):
    model, inputs = FIXTURES[name]()
    model.eval()
    schema = parse(model, inputs)
    if schema.is_skipped:
        pytest.skip(f"the parser runs this root as its real module: {schema.skip_reason}")
    expected = _module_outputs_in_call_order(model, inputs)
    with torch.no_grad():
        trace = capture_run(schema, dict(inputs)).trace
    calls = [s for s in trace if s.description.startswith("Call to sub-block")]
    assert calls, "every fixture calls sub-blocks"
    by_path: dict[str, list] = {}
    for path, value in expected:
        by_path.setdefault(path, []).append(value)
    used: dict[str, int] = {}
    for step in calls:
        if step.op_name not in by_path and any(isinstance(m, _HOOK_SENSITIVE) for m in
                                               _ancestors(model, step.op_name)):
            continue
        index = used.get(step.op_name, 0)
        used[step.op_name] = index + 1
        if step.value is None:  # changed in place by an op the lowering did not flag: dropped, not wrong
            assert "changed in place after capture" in step.omitted
            continue
        assert torch.equal(step.value, by_path[step.op_name][index]), f"{step.container_id} ({step.op_name})"
    assert all(used[p] == len(by_path[p]) for p in used)


def test_value_changed_by_an_unflagged_in_place_op_is_never_reported_wrong():
    torch.manual_seed(0)
    model = PositionalInplace().eval()
    x = -torch.rand(2, 3) - 10  # every projection is negative, so leaky_relu changes all of it
    schema = parse(model, {"x": x})
    with torch.no_grad():
        trace = capture_run(schema, {"x": x}).trace
        before = model.proj(x)
    step = next(s for s in trace if s.out_var == "h")
    if step.value is None:
        assert "changed in place after capture" in step.omitted
    else:
        assert torch.equal(step.value, before)
    assert torch.equal(trace.by_container(trace.container_ids[-1]).value, F.leaky_relu(before, 0.2) * 2)
