"""Step into / over / out with a pause *before* a sub-block call (issue 11, item 2): Step stops at
the call site ("about to call transformer.h.1.attn(hidden_states, ...)"), and from there Step enters
the callee, Step over lands on the call's own completion step, Step out leaves the caller. On a
transformers GPT-2 built from its config and on a small chain of Linear blocks."""

from __future__ import annotations

import json
import linecache

import pytest
import torch

from nnschemaparser import SchemaInterpreter
from nnschemaparser.runtime.interpreter import CallPause, StepInfo
from nnschemaparser.schema.errors import EditError
from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.inspector import InspectorWidget
from nnschemaparser.widget.messages import handle_message
from tests.support.debugger_models import Chain, parsed, tiny_case

ATTN = "transformer.h.1.attn"


@pytest.fixture(scope="module")
def gpt2():
    model, inputs, schema = tiny_case("gpt2")
    items = list(SchemaInterpreter().step_run(schema, dict(inputs), pause_before_calls=True))
    pause = next(i for i in items if isinstance(i, CallPause) and i.callee_path == ATTN)
    completion = next(i for i in items[items.index(pause) + 1:]
                      if isinstance(i, StepInfo) and i.instruction is pause.instruction)
    return model, inputs, schema, pause.after_step, completion.step_index


def _at_attn_call(gpt2) -> InspectorState:
    _, inputs, schema, before, _ = gpt2
    state = InspectorState(schema, inputs)
    state.run_to(before)
    assert state.step() is state.pause  # the next thing is the call: Step stops before it
    assert state.pause.callee_path == ATTN and state.step_index == before
    return state


def test_step_stops_before_the_call_and_the_view_shows_the_call_site_and_its_arguments(gpt2):
    state = _at_attn_call(gpt2)
    view = state.view_step()
    assert view["pause"] == "call" and view["callee"] == ATTN and view["block"] == "transformer.h.1"
    assert view["index"] == state.step_index and view["next_step"] == state.step_index + 1
    assert "self.attn(" in linecache.getline(view["file"], view["line"])  # the call site is highlighted
    assert view["node"] == state.tree.node_of_instruction(state.pause.instruction) >= 0
    assert view["callee_node"] == state.tree.find_block(ATTN) and view["interpreted"] is True
    assert view["text"].startswith(f"{ATTN}(hidden_states, ")
    hidden = view["args"][0]
    assert hidden["name"] == "hidden_states" and hidden["shape"] == [2, 8, 32] and "mean" in hidden["stats"]
    assert torch.equal(dict(state.pause.arguments())["hidden_states"], state.pause.frame["hidden_states"])
    assert len(json.dumps(view)) < 3000
    # the histograms there are of the first tensor argument, at the step that bound it
    hist = state.histograms()
    assert hist["var"] == "hidden_states" and hist["trace_step"] == hidden["trace_step"] == view["trace_step"]


def test_step_over_from_the_pause_lands_on_the_calls_completion_step(gpt2):
    *_, completion = gpt2
    state = _at_attn_call(gpt2)
    call = state.pause.instruction
    state.step_over()
    assert state.pause is None and state.current.step_index == completion
    assert state.current.instruction is call and state.current.block_path == "transformer.h.1"


def test_step_into_from_the_pause_enters_the_callees_first_instruction(gpt2):
    _, _, _, before, _ = gpt2
    state = _at_attn_call(gpt2)
    depth = state.pause.frame_depth
    position = state.step_into()
    assert isinstance(position, StepInfo) and position is state.current
    assert position.step_index == before + 1 and position.block_path == ATTN and position.frame_depth == depth + 1


def test_step_out_from_inside_the_callee_lands_on_the_calls_completion(gpt2):
    *_, completion = gpt2
    state = _at_attn_call(gpt2)
    call = state.pause.instruction
    state.step_into()
    state.step_out()
    assert state.current.step_index == completion and state.current.instruction is call


def test_step_out_from_the_pause_leaves_the_caller(gpt2):
    state = _at_attn_call(gpt2)
    depth = state.pause.frame_depth
    state.step_out()
    assert state.pause is None and state.current.frame_depth < depth
    assert state.current.block_path == "transformer"


def test_the_call_stack_at_the_pause_ends_with_the_callee_and_its_arguments(gpt2):
    state = _at_attn_call(gpt2)
    frames = state.call_stack()
    assert [f["block"] for f in frames][-2:] == ["transformer.h.1", ATTN]
    assert frames[-1]["pending"] and not frames[-1]["current"] and frames[-2]["current"]
    assert frames[-1]["node"] == state.tree.find_block(ATTN)
    assert [v["name"] for v in frames[-1]["vars"]][:2] == ["hidden_states", "cache"]


def test_an_edit_at_the_pause_is_refused_and_says_what_to_do(gpt2):
    state = _at_attn_call(gpt2)
    before = state.step_index
    with pytest.raises(EditError, match="paused before the call of transformer.h.1.attn.*Step into"):
        state.edit("zero")
    assert state.edits == [] and state.pause is not None and state.step_index == before


def test_stepping_from_a_step_whose_next_instruction_is_no_call_is_as_before():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    schema = parsed(Chain(), x=x)
    plain = list(SchemaInterpreter().step_run(schema, {"x": x}))
    state = InspectorState(schema, {"x": x})
    # steps whose next instruction is no call: Step goes to the next step, with no pause between
    for index in range(1, len(plain)):
        if plain[index].block_path == plain[index - 1].block_path == "Chain" and \
                plain[index].frame_depth == 0 and plain[index].kind == "op":
            state.run_to(index)
            state.step()
            assert state.pause is None and state.step_index == index + 1
            break
    else:
        raise AssertionError("Chain has two root ops in a row")
    # run_to and continue pass the pauses: the step numbers are those of step_run
    state.reset()
    state.run_to(len(plain))
    assert state.pause is None and state.step_index == len(plain)
    state.reset()
    state.continue_()
    assert state.status == "finished" and len(state.active.steps) == len(plain)


def test_widget_step_into_over_and_out_and_their_messages():
    pytest.importorskip("anywidget")
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    schema = parsed(Chain(), x=x)
    widget = InspectorWidget(schema, {"x": x}, gradients=False)
    pause = widget.step_into()  # `h = self.a(x)` is the first instruction: before its call
    assert isinstance(pause, CallPause) and widget.pause is pause and pause.callee_path == "a"
    assert widget.step_info["pause"] == "call" and widget.step_info["callee"] == "a" and widget.step_index == 0
    assert widget.step_info["args"][0]["name"] == "x" and widget.status == "paused"
    completion = widget.step_over()  # the call's completion step: `h = CALL a(x)`
    assert widget.pause is None and completion.instruction is pause.instruction and completion.frame_depth == 0
    assert widget.step_info.get("pause") is None and widget.step_info["var"] == "h"
    widget.step_into()  # h = relu(h): no call next, one step
    assert widget.pause is None and widget.step_info["var"] == "h"
    widget.step_into()  # before the call of b
    assert widget.pause.callee_path == "b"
    inside = widget.step_into()
    assert inside.block_path == "b" and inside.frame_depth == 1
    out = widget.step_out()
    assert out.block_path == "Chain" and out.instruction.out_var == "h" and widget.pause is None
    # the same through the browser's messages
    widget.reset()
    reply = handle_message(widget.state, {"type": "step_into", "id": 1, "with_hist": True})
    assert reply["ok"] and widget.state.pause is not None and reply["data"]["hist"]["var"] == "x"
    reply = handle_message(widget.state, {"type": "step_over", "id": 2})
    assert reply["ok"] and widget.state.pause is None and widget.state.current.instruction is pause.instruction
    handle_message(widget.state, {"type": "step", "id": 3})
    handle_message(widget.state, {"type": "step", "id": 4})
    assert widget.state.pause.callee_path == "b"
    handle_message(widget.state, {"type": "step", "id": 5})
    reply = handle_message(widget.state, {"type": "step_out", "id": 6})
    assert reply["ok"] and widget.state.current.block_path == "Chain"
    widget.close()
