"""SchemaInterpreter.step_run: the StepInfo stream, edits, forks at a step index, abandoned runs."""

import gc

import pytest
import torch

from nnschemaparser import EditError, SchemaInterpreter, SchemaRunError, StepInfo
from nnschemaparser.traces.compare import compare_traces, first_divergence
from nnschemaparser.runtime.listeners import EventObserver
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.recorder import ActivationRecorder
from tests.support.trace_models import spec_mlp

# (kind, out_var, frame_depth, block_path) of every instruction the spec MLP executes, in order.
MLP_STREAM = [
    ("op", "$t1", 1, "fc1"), ("return", "", 1, "fc1"), ("block", "hidden", 0, "MLP"), ("op", "$t1", 0, "MLP"),
    ("op", "activated", 0, "MLP"), ("op", "$t1", 1, "fc2"), ("return", "", 1, "fc2"), ("block", "$t2", 0, "MLP"),
    ("return", "", 0, "MLP"),
]


def _drain(generator):
    steps = []
    while True:
        try:
            steps.append(next(generator))
        except StopIteration as stop:
            return steps, stop.value


def test_step_run_yields_every_instruction_in_program_order():
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    steps, outputs = _drain(interpreter.step_run(schema, {"x": x}))
    assert all(isinstance(s, StepInfo) for s in steps)
    assert [(s.kind, s.out_var, s.frame_depth, s.block_path) for s in steps] == MLP_STREAM
    assert [s.step_index for s in steps] == list(range(1, 10))
    assert steps[4].source.endswith("examples/mlp.py:15") and steps[4].location.lineno == 15
    assert steps[4].instruction is schema.body[2]
    assert torch.equal(steps[4].value, model.fc1(x).relu())
    assert callable(steps[3].value), "the bound method fetched by getattr is a step, with its value"
    assert len(steps[0].scope_frames) == 2 and steps[0].scope_frames[0] is steps[2].scope_frames[0]


def test_step_run_returns_the_outputs_and_keeps_them_in_step_outputs():
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    _, outputs = _drain(interpreter.step_run(schema, {"x": x}))
    assert outputs is interpreter.step_outputs
    assert torch.equal(outputs[0], model(x))


def test_edit_replaces_the_step_value_before_the_next_instruction():
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    for step in interpreter.step_run(schema, {"x": x}):
        if step.out_var == "activated":
            step.edit(values=torch.zeros_like(step.value))
            assert torch.equal(step.value, torch.zeros(2, 32))
    with torch.no_grad():
        assert torch.equal(interpreter.step_outputs[0], model.fc2(torch.zeros(2, 32)))


def test_edit_can_target_another_visible_variable_by_depth_and_name():
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    for step in interpreter.step_run(schema, {"x": x}):
        if step.step_index == 6:  # inside fc2: frame 1 is fc2's, frame 0 the root's
            assert step.frame_depth == 1
            step.edit(values=torch.ones(2, 8), frame_depth=1, out_var="$t1")
            step.edit(values=x * 0, frame_depth=0, out_var="x")
            assert torch.equal(step.scope_frames[0]["x"], torch.zeros(2, 16))
    assert torch.equal(interpreter.step_outputs[0], torch.ones(2, 8))


def test_edit_with_declared_shape_and_dtype_changes_them_on_purpose():
    _, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    generator = interpreter.step_run(schema, {"x": x})
    step = next(generator)
    step.edit(values=torch.zeros(2, 32, dtype=torch.float64), dtype=torch.float64)
    assert step.scope_frames[1]["$t1"].dtype == torch.float64
    generator.close()


@pytest.mark.parametrize("edit, message", [
    (dict(values=torch.zeros(3, 32)), "shape"),
    (dict(values=torch.zeros(2, 32, dtype=torch.float64)), "dtype"),
    (dict(values=torch.zeros(2, 32), out_var="nope"), "no variable 'nope'"),
    (dict(values=torch.zeros(2, 32), frame_depth=5), "frame_depth 5"),
    (dict(values=3.0), "must give a tensor"),
    (dict(), "values="),
    (dict(values=torch.zeros(2, 33), shape=(2, 32)), "declares shape"),
    (dict(values=torch.zeros(2, 32), dtype="torch.nosuch"), "not a torch dtype"),
])
def test_bad_edits_raise_a_clear_error_and_change_nothing(edit, message):
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    generator = interpreter.step_run(schema, {"x": x})
    step = next(generator)
    before = {k: v for k, v in step.scope_frames[1].items()}
    with pytest.raises(EditError, match=message):
        step.edit(**edit)
    assert step.scope_frames[1].keys() == before.keys()
    assert all(step.scope_frames[1][k] is before[k] for k in before)
    _, outputs = _drain(generator)
    assert torch.equal(outputs[0], model(x))


def test_fork_at_a_step_index_replays_the_prefix_and_diverges_after_it():
    _, x, schema = spec_mlp()
    base, _ = _drain(SchemaInterpreter().step_run(schema, {"x": x}))
    fork, _ = _drain(SchemaInterpreter().step_run(schema, {"x": x},
                                                  edits={5: [dict(values=torch.full((2, 32), 0.5))]}))
    assert [(s.kind, s.out_var, s.frame_depth) for s in fork] == [(s.kind, s.out_var, s.frame_depth) for s in base]
    tensors = [i for i, s in enumerate(base) if isinstance(s.value, torch.Tensor)]
    for i in tensors:
        if i < 4:
            assert torch.equal(base[i].value, fork[i].value), f"step {i + 1} must replay identically"
        else:
            assert not torch.equal(base[i].value, fork[i].value), f"step {i + 1} must diverge"


def test_forked_trace_diverges_at_the_edited_step():
    _, x, schema = spec_mlp()
    base = capture_run(schema, {"x": x})
    recorder = ActivationRecorder()
    _drain(SchemaInterpreter(listeners=[recorder]).step_run(schema, {"x": x},
                                                           edits={5: {"values": torch.zeros(2, 32)}}))
    edited = recorder.trace.by_container("MLP_0004")
    assert edited.edited and torch.equal(edited.value, torch.zeros(2, 32))
    assert edited.line().endswith("| edited")
    diverged = first_divergence(compare_traces(base.trace, recorder.trace))
    assert diverged.container_id == "MLP_0004"


def test_abandoning_the_generator_unwinds_the_run_and_leaves_nothing_behind():
    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    generator = interpreter.step_run(schema, {"x": x})
    for step in generator:
        if step.step_index == 6:  # paused inside fc2
            break
    generator.close()
    assert interpreter.step_outputs is None
    assert torch.equal(interpreter.run(schema, {"x": x})[0], model(x))
    _, outputs = _drain(interpreter.step_run(schema, {"x": x}))
    assert torch.equal(outputs[0], model(x))


def test_a_dropped_generator_is_unwound_by_garbage_collection():
    model, x, schema = spec_mlp()
    recorder = ActivationRecorder()
    interpreter = SchemaInterpreter(listeners=[recorder])
    generator = interpreter.step_run(schema, {"x": x})
    next(generator), next(generator), next(generator)
    del generator
    gc.collect()
    outputs = interpreter.run(schema, {"x": x})
    assert torch.equal(outputs[0], model(x))
    assert len(recorder.trace) == 7


def test_step_run_rejects_bad_arguments_before_the_first_step():
    _, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    with pytest.raises(SchemaRunError, match="scope must be a dict"):
        interpreter.step_run(schema, [x])
    with pytest.raises(SchemaRunError, match="ModelBlockSchema"):
        interpreter.step_run("schema", {"x": x})
    with pytest.raises(SchemaRunError, match="edits must map"):
        interpreter.step_run(schema, {"x": x}, edits={"5": []})


def test_plain_runs_never_touch_an_observer(monkeypatch):
    model, x, schema = spec_mlp()

    def refuse(*args, **kwargs):
        raise AssertionError("a plain run called an observer")

    for hook in ("after", "before", "enter_block", "exit_block"):
        monkeypatch.setattr(EventObserver, hook, refuse)
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], model(x))
    with pytest.raises(AssertionError, match="observer"):
        SchemaInterpreter(listeners=[ActivationRecorder()]).run(schema, {"x": x})


def test_a_stepped_run_resumed_from_another_greenlet_ends_in_that_greenlet():
    import greenlet

    model, x, schema = spec_mlp()
    interpreter = SchemaInterpreter()
    steps = interpreter.step_run(schema, {"x": x})
    assert next(steps).step_index == 1
    other = greenlet.greenlet(lambda: [step.step_index for step in steps])
    assert other.switch() == list(range(2, 10)), "the rest of the steps, and the end, come to the greenlet that asked"
    assert other.dead and torch.equal(interpreter.step_outputs[0], model(x))


def test_a_stepped_run_closed_from_another_greenlet_unwinds():
    import greenlet

    model, x, schema = spec_mlp()
    steps = SchemaInterpreter().step_run(schema, {"x": x})
    next(steps)
    next(steps)
    closer = greenlet.greenlet(steps.close)
    closer.switch()
    assert closer.dead
    with pytest.raises(StopIteration):
        next(steps)
