"""The inspector's state machine and its message handlers, without a browser or a kernel."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from nnschemaparser import SchemaInterpreter
from nnschemaparser.runtime.interpreter import CallPause
from nnschemaparser.schema.errors import EditError
from nnschemaparser.widget import InspectorError, InspectorOptions, InspectorState
from nnschemaparser.widget.messages import handle_message
from tests.support.widget_models import DropoutNet, NormNet, mlp_case


@pytest.fixture
def mlp():
    model, x, schema = mlp_case()
    return model, x, schema, InspectorState(schema, {"x": x})


def _reply(state, **message):
    reply = handle_message(state, {"id": 7, **message})
    json.dumps(reply, allow_nan=False)  # what travels must be strict JSON
    assert reply["id"] == 7 and reply["type"] == "reply"
    return reply


# -- stepping ------------------------------------------------------------------------------------


def _where(item) -> tuple:
    if isinstance(item, CallPause):
        return ("before call", item.after_step, item.callee_path)
    return (item.step_index, item.out_var, item.block_path)


def test_steps_follow_step_run_one_instruction_at_a_time(mlp):
    # Step stops at each StepInfo and at each pause before a sub-block call, as step_run yields them
    _, x, schema, state = mlp
    expected = [_where(s) for s in SchemaInterpreter().step_run(schema, {"x": x}, pause_before_calls=True)]
    seen = []
    while state.step() is not None and state.status == "paused":
        seen.append(_where(state.position))
    assert seen == expected and state.status == "finished"
    assert seen[0] == ("before call", 0, "fc1") and seen[1] == (1, "$t1", "fc1")


def test_step_over_runs_a_sub_block_call_whole(mlp):
    *_, state = mlp
    state.run_to(5)  # activated = hidden.relu(), in the root frame
    assert state.current.out_var == "activated"
    state.step_over()  # fc2's own two steps run without stopping
    assert (state.step_index, state.current.out_var, state.current.frame_depth) == (8, "$t2", 0)


def test_continue_runs_to_the_end_and_the_outputs_equal_eager(mlp):
    model, x, _, state = mlp
    state.continue_()
    assert state.status == "finished"
    assert torch.equal(state.active.outputs[0], model(x))


def test_run_to_an_earlier_step_replays_the_run_from_the_start(mlp):
    *_, state = mlp
    state.run_to(6)
    first = state.current.value.clone()
    state.run_to(3)
    assert state.step_index == 3 and state.current.out_var == "hidden"
    state.run_to(6)
    assert torch.equal(state.current.value, first)
    assert [run.name for run in state.runs] == ["base"], "an abandoned run is not kept"


def test_a_run_can_be_stepped_from_different_threads(mlp):
    # a kernel may deliver widget messages on several threads; the paused greenlet must not care
    import threading

    *_, state = mlp
    state.step()  # before the call of fc1
    worker = threading.Thread(target=state.step)
    worker.start()
    worker.join()
    state.step()
    state.step()
    assert state.step_index == 3 and state.status == "paused" and state.error == ""
    state.close()
    assert state.status == "ready" and [run.name for run in state.runs] == ["base"]
    state.continue_()
    assert state.status == "finished"


def test_run_to_refuses_step_numbers_that_are_not_steps(mlp):
    *_, state = mlp
    with pytest.raises(InspectorError, match="numbered from 1"):
        state.run_to(0)
    with pytest.raises(InspectorError, match="needs a step number"):
        state.run_to("soon")


def test_runs_replay_dropout_masks_and_leave_the_notebook_generator_alone():
    torch.manual_seed(0)
    model = DropoutNet().train()
    x = torch.randn(4, 8)
    from nnschemaparser import NNParser

    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    state = InspectorState(schema, {"x": x})
    state.continue_()
    first = state.active.outputs[0].detach().clone()
    before = torch.get_rng_state()
    state.reset()
    state.continue_()
    assert torch.equal(state.active.outputs[0], first), "each run starts from the same generator state"
    assert torch.equal(torch.get_rng_state(), before), "the notebook's own generator did not move"
    assert model.training


def test_runs_start_from_and_leave_the_models_buffers_as_they_were():
    from nnschemaparser import NNParser

    torch.manual_seed(0)
    model = NormNet().train()
    x = torch.randn(4, 8)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    before = {name: b.clone() for name, b in model.named_buffers()}
    state = InspectorState(schema, {"x": x})
    state.run_to(2)
    state.reset()  # an abandoned run
    state.continue_()
    first = state.active.outputs[0].detach().clone()
    state.reset()
    state.continue_()
    assert torch.equal(state.active.outputs[0], first), "each run sees the same running statistics"
    assert all(torch.equal(before[name], b) for name, b in model.named_buffers())
    assert model.training


# -- edits ---------------------------------------------------------------------------------------


def test_zero_edit_makes_a_fork_whose_outputs_equal_eager_with_the_same_change(mlp):
    model, x, _, state = mlp
    state.run_to(3)  # hidden = CALL fc1(x)
    spec = state.edit("zero")
    assert spec.step_index == 3 and spec.out_var == "hidden"
    assert torch.equal(state.current.value, torch.zeros(2, 256))
    assert state.active.name == "fork 1" and state.active.is_fork
    state.continue_()
    expected = model.fc2(torch.zeros(2, 256).relu())
    assert torch.equal(state.active.outputs[0], expected)


def test_scale_noise_and_expression_edits_compute_the_value_they_name(mlp):
    *_, state = mlp
    state.run_to(3)
    hidden = state.current.value.detach().clone()
    state.edit("scale", "0.5")
    assert torch.equal(state.current.value, hidden * 0.5)
    state.edit("expression", "value.clamp(min=0) + torch.ones_like(value)")
    assert torch.equal(state.current.value, (hidden * 0.5).clamp(min=0) + 1)
    before = state.current.value.clone()
    spec = state.edit("noise", 0.1)
    generator = torch.Generator().manual_seed(spec.seed)
    assert torch.equal(state.current.value, before + torch.randn(before.shape, generator=generator) * 0.1)
    assert [e.action for e in state.edits] == ["scale", "expression", "noise"]


def test_expression_edits_see_the_frame_and_the_given_namespace():
    model, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x}, InspectorOptions(namespace={"offset": 3.0}))
    state.run_to(5)  # activated; `hidden` is in the same frame
    state.edit("expression", "hidden * 0 + offset")
    assert torch.equal(state.current.value, torch.full((2, 256), 3.0))


@pytest.mark.parametrize("action, argument, message", [
    ("expression", "value[:1]", "shape"),
    ("expression", "value +", "does not parse"),
    ("expression", "1 / 0", "ZeroDivisionError"),
    ("expression", "value.double()", "dtype"),
    ("scale", "twice", "needs a number"),
    ("noise", -1, ">= 0"),
    ("explode", None, "unknown edit action"),
])
def test_bad_edits_say_what_is_wrong_and_change_nothing(mlp, action, argument, message):
    *_, state = mlp
    state.run_to(3)
    before = state.current.value.clone()
    reply = _reply(state, type="edit", action=action, argument=argument)
    assert not reply["ok"] and message in reply["error"]
    assert state.error == reply["error"]
    assert torch.equal(state.current.value, before)
    assert torch.equal(state.current.scope_frames[0]["hidden"], before)
    assert state.edits == [] and state.active.name == "base"


def test_scale_refuses_integer_tensors_and_points_to_expressions():
    model, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.run_to(1)
    step = state.current
    step.scope_frames[step.frame_depth]["n"] = torch.arange(3)
    from nnschemaparser.widget.edits import EditSpec, apply_edit_spec

    with pytest.raises(EditError, match="floating-point.*expression"):
        apply_edit_spec(step, EditSpec(step.step_index, "scale", "n", step.frame_depth, 2.0))


def test_edits_need_a_paused_step(mlp):
    *_, state = mlp
    with pytest.raises(EditError, match="press Step first"):
        state.edit("zero")
    state.continue_()
    with pytest.raises(EditError, match="press Reset"):
        state.edit("zero")


def test_reset_replays_queued_edits_and_removing_one_restores_the_base(mlp):
    model, x, _, state = mlp
    state.run_to(3)
    state.edit("noise", 0.2)
    state.continue_()
    forked = state.active.outputs[0].clone()
    state.reset()
    assert state.active.name == "fork 2" and len(state.active.edits) == 1
    state.continue_()
    assert torch.equal(state.active.outputs[0], forked), "the queued noise replays exactly"
    state.remove_edit(0)
    state.reset()
    state.continue_()
    assert state.active.name == "base" and torch.equal(state.active.outputs[0], model(x))
    with pytest.raises(InspectorError, match="no queued edit"):
        state.remove_edit(0)


# -- comparison, traces and histograms -----------------------------------------------------------


def test_compare_base_and_fork_finds_the_edited_step_first(mlp):
    *_, state = mlp
    state.run_to(5)  # activated
    state.edit("scale", 2.0)
    state.continue_()
    result = state.compare()  # the base run is made on demand
    assert (result["a"], result["b"]) == ("base", "fork 1")
    first = result["first"]
    assert first["out_var"] == "activated" and first["step_index_b"] == 5
    assert result["summary"]["only_in_a"] == result["summary"]["only_in_b"] == 0
    before = [row for row in result["rows"] if row["step_index_b"] is not None and row["step_index_b"] < 5]
    assert before and all(row["changed"] is False for row in before)
    assert state.last_compare["first_index"] == result["first_index"]


def test_compare_names_unknown_runs(mlp):
    *_, state = mlp
    reply = _reply(state, type="compare", a="nope")
    assert not reply["ok"] and "no run named 'nope'" in reply["error"] and "'base'" in reply["error"]


def test_traces_map_each_tensor_step_to_its_step_index(mlp):
    *_, state = mlp
    state.continue_()
    frame = state.active.to_dataframe()
    assert list(frame["out_var"]) == ["x", "$t1", "hidden", "activated", "$t1", "$t2", "$t2"]
    assert list(frame["step_index"]) == [0, 1, 3, 5, 6, 8, 9]
    rows = state.active.steps
    assert all(rows[i - 1]["trace_step"] is not None for i in (1, 3, 5, 6, 8))
    assert rows[3]["trace_step"] is None, "a bound method is not a tensor step"
    assert rows[1]["text"] == "RETURN $t1" and rows[1]["trace_step"] == 2, "a return shows what it returns"


def test_histograms_bin_activation_and_gradient_of_a_step(mlp):
    *_, state = mlp
    state.run_to(5)
    pending = state.histograms()
    assert sum(pending["activation"]["counts"]) == 512
    assert "finished" in pending["gradient"]["note"]
    state.continue_()
    hist = state.histograms(5)
    assert hist["var"] == "activated" and sum(hist["gradient"]["counts"]) == 512
    assert len(hist["activation"]["edges"]) == len(hist["activation"]["counts"]) + 1
    note = state.histograms(4)
    assert "binds no tensor" in note["activation"]["note"]


def test_gradients_leave_parameter_grads_untouched(mlp):
    model, *_, state = mlp
    state.continue_()
    assert state.active.gradients is not None and len(state.active.gradients.steps) > 0
    assert all(p.grad is None for p in model.parameters())


# -- messages ------------------------------------------------------------------------------------


def test_table_messages_page_filter_and_sort_the_trace(mlp):
    *_, state = mlp
    state.continue_()
    page = _reply(state, type="table", page=0, size=3)["data"]
    assert (page["total"], page["pages"], len(page["rows"])) == (7, 3, 3)
    column = page["columns"].index("out_var")
    only = _reply(state, type="table", filters={"out_var": "HIDDEN"})["data"]
    assert [row[column] for row in only["rows"]] == ["hidden"]
    ordered = _reply(state, type="table", sort="mean", desc=True)["data"]
    means = [row[ordered["columns"].index("mean")] for row in ordered["rows"]]
    assert means == sorted(means, reverse=True)
    bad = _reply(state, type="table", sort="colour")
    assert not bad["ok"] and "cannot sort by 'colour'" in bad["error"]


def test_compare_message_jumps_to_the_page_of_the_first_divergence(mlp):
    *_, state = mlp
    state.run_to(8)
    state.edit("zero")
    state.continue_()
    data = _reply(state, type="compare", size=2, jump=True)["data"]
    assert data["page"] == data["first_index"] // 2
    column = data["columns"].index("out_var")
    # the first divergence is the temporary $t2: shown as the statement that computes it (source words)
    node = state.run(data["a"]).step_row(data["first"]["step_index_a"])["node"]
    words = state.tree.source_words(node)
    assert "$t" not in words and data["first"]["out_var"] == words and words in [row[column] for row in data["rows"]]
    assert state.last_compare["first"]["out_var"] == "$t2"  # the comparison's own data keeps the trace's name
    only = _reply(state, type="compare", only_changed=True)["data"]
    assert only["first_index"] == 0 and all(row[only["columns"].index("changed")] for row in only["rows"])


def test_children_and_source_messages_answer_from_the_tree(mlp):
    *_, state = mlp
    data = _reply(state, type="children", nodes=[0])["data"]
    assert [row[3] for row in data["rows"]][:2] == ["hidden = CALL fc1(x)", "activated = hidden.relu()"]
    statement = data["rows"][1]
    assert statement[2] == "s", "a statement lowered to several instructions is a statement row"
    inside = _reply(state, type="children", nodes=[statement[0]])["data"]
    assert [row[3] for row in inside["rows"]][:1] == ["$t1 = getattr(hidden, 'relu')"]
    source = _reply(state, type="source", block=0)["data"]
    assert "def forward" in source["text"] and source["first"] > 0
    assert not _reply(state, type="children", nodes=[10_000])["ok"]
    assert not _reply(state, type="children")["ok"]


def test_stepping_commands_can_bring_the_new_steps_histograms(mlp):
    *_, state = mlp
    plain = _reply(state, type="step")  # stops before the call of fc1
    assert plain["ok"] and plain["data"] is None
    _reply(state, type="step")  # step 1: $t1 = linear(...) in fc1
    data = _reply(state, type="step", with_hist=True)["data"]
    assert data["hist"]["trace_step"] == 2 and data["hist"]["var"] == "$t1"  # step 2: RETURN $t1
    assert sum(data["hist"]["activation"]["counts"]) == 512, "the return shows the tensor it returns"


def test_unknown_or_malformed_messages_get_an_error_reply(mlp):
    *_, state = mlp
    reply = _reply(state, type="launch")
    assert not reply["ok"] and "unknown message type 'launch'" in reply["error"] and "step" in reply["error"]
    assert not _reply(state, type="run_to", step="x")["ok"]
    assert handle_message(state, ["not", "a", "dict"])["ok"] is False


def test_non_finite_values_travel_as_strings(mlp):
    *_, state = mlp
    state.run_to(3)
    state.edit("expression", "value * float('nan')")
    data = _reply(state, type="table", filters={"out_var": "hidden"})["data"]
    assert data["rows"][0][data["columns"].index("mean")] == "nan"


def test_views_are_small_and_json_ready(mlp):
    *_, state = mlp
    state.run_to(3)
    view = state.view_step()
    assert view["index"] == 3 and view["var"] == "hidden" and view["shape"] == [2, 256]
    assert view["node"] >= 0 and view["ancestors"] == [0] and view["line"] == 14
    assert len(json.dumps(view)) < 1000
    assert state.view_runs() == [{"id": 1, "name": "base", "steps": 3, "trace_steps": 3, "edits": 0, "finished": False,
                                  "error": "", "fork": False}]


def test_a_failing_model_run_is_reported_as_an_error_state():
    model, x, schema = mlp_case()
    state = InspectorState(schema, {"x": torch.randn(2, 5)})  # wrong width: F.linear raises
    state.continue_()
    assert state.status == "error" and "RuntimeError" in state.error and "step 1" in state.error
    state.step()  # nothing more happens
    assert state.status == "error"


def test_the_inspector_refuses_what_is_not_a_schema():
    with pytest.raises(InspectorError, match="parse the model first"):
        InspectorState(object(), {})
    _, x, schema = mlp_case()
    with pytest.raises(InspectorError, match="scope must be a dict"):
        InspectorState(schema, [x])


# -- the widget ----------------------------------------------------------------------------------


def test_widget_methods_mirror_the_buttons_and_traits_follow_the_state():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget import inspect_model_widget

    model, x, _ = mlp_case()
    params = copy.deepcopy(model.state_dict())
    widget = inspect_model_widget(model, {"x": x})
    assert not model.training and all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    assert widget.step() is widget.pause and widget.pause.callee_path == "fc1"  # before the call of fc1
    for _ in range(3):
        widget.step()
    assert widget.step_index == 3 and widget.step_info["var"] == "hidden" and widget.current.out_var == "hidden"
    widget.edit("zero")
    assert [e["text"] for e in widget.edit_list] == ["step 3: hidden ← zero"]
    with pytest.raises(EditError):
        widget.edit("expression", "value[0]")
    assert "shape" in widget.error
    widget.continue_()
    assert widget.status == "finished" and widget.runs[-1]["name"] == "fork 1"
    frame = widget.compare()
    assert frame.attrs["a"] == "base" and frame.attrs["summary"]["changed"] > 0
    assert set(widget.traces) == {"base", "fork 1"}
    widget.reset()
    widget.run_to(3)
    assert widget.step_index == 3 and widget.step_info["edited"]
    reply = widget.handle({"type": "step", "id": 1})
    assert reply["ok"] and widget.step_index == 4


def test_inspect_model_widget_needs_example_inputs():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget import inspect_model_widget

    model, _, _ = mlp_case()
    with pytest.raises(TypeError, match="inputs="):
        inspect_model_widget(model, {})


def test_a_paused_run_collected_by_the_garbage_collector_never_blocks_the_collecting_thread():
    # The collector may run a finalizer anywhere, even while the run thread is busy: the finalizer
    # posts the close to the run thread and returns at once (waiting for it once deadlocked a suite).
    import gc
    import threading as _threading

    from nnschemaparser.widget.run_driver import _RunThread

    worker = _RunThread()
    release = _threading.Event()
    worker.call(lambda: None)  # start the run thread
    busy = _threading.Thread(target=lambda: worker.call(release.wait))
    busy.start()
    done = []
    worker.post(lambda: done.append(True))  # the run thread is busy: this must not wait
    assert not done
    release.set()
    busy.join(10)
    worker.call(lambda: None)  # after the busy job, the posted one has run (one worker, in order)
    assert done == [True]
    gc.collect()
    worker.shutdown()
