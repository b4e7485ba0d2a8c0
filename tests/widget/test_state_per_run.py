"""State that belongs to a run (issue 22, point 1): stop reasons and breakpoint hits are cleared by
Reset and the next command, each hit names its run, and a run-to whose target never comes says so
and leaves the run where it was; search results say whether the row ever ran (point 2)."""

from __future__ import annotations

import pytest

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.inspector import InspectorWidget
from tests.support.debugger_models import tiny_case


@pytest.fixture(scope="module")
def gpt2():
    return tiny_case("gpt2")


def _fresh(case) -> InspectorState:
    _, inputs, schema = case
    return InspectorState(schema, inputs)


def test_reset_and_the_next_step_clear_the_stop_reason_of_a_breakpoint(gpt2):
    state = _fresh(gpt2)
    state.break_at("h.1.attn")
    state.continue_()
    assert state.stop_reason == "entered transformer.h.1.attn"
    state.reset()
    assert state.stop_reason == "" and state.view_breakpoints()["reason"] == ""
    state.continue_()
    assert state.stop_reason == "entered transformer.h.1.attn"
    state.step()  # a step stops because it is one step: no breakpoint reason is left over
    assert state.stop_reason == "" and state.status == "paused"


def test_a_cleared_predicate_leaves_no_reason_after_reset_and_a_finished_run(gpt2):
    state = _fresh(gpt2)
    state.break_at(when=lambda step: step.step_index == 5)
    state.continue_()
    assert state.step_index == 5 and state.stop_reason == "lambda step: step.step_index == 5 is true"
    state.clear_breakpoints()
    state.reset()
    state.continue_()
    assert state.status == "finished" and state.stop_reason == ""


def test_each_hit_names_its_run_and_the_view_lists_the_active_runs_hits_only(gpt2):
    _, inputs, schema = gpt2
    widget = InspectorWidget(schema, inputs, gradients=False)
    widget.break_at("h.1.attn")
    widget.continue_()
    widget.continue_()  # to the end: the run "base" is kept, with its one hit
    assert [(h["run"], h["reason"]) for h in widget.breakpoint_hits] == [("base", "entered transformer.h.1.attn")]
    widget.reset()
    assert widget.state.view_breakpoints()["hits"] == []  # a new run starts with no hits of its own
    widget.continue_()
    assert [h["run"] for h in widget.breakpoint_hits] == ["base", "base 2"]
    assert [h["run"] for h in widget.state.view_breakpoints()["hits"]] == ["base 2"]
    widget.reset()  # "base 2" was paused, so it is abandoned, and its hit goes with it
    assert [h["run"] for h in widget.breakpoint_hits] == ["base"]
    assert widget.stop_reason == ""
    widget.close()


def test_run_to_a_step_past_the_end_says_so_and_stays_paused_where_it_was(gpt2):
    state = _fresh(gpt2)
    state.run_to(120)
    before = state.current
    value = before.value.clone() if hasattr(before.value, "clone") else before.value
    state.run_to(100_000)
    assert state.status == "paused" and state.step_index == 120 and state.active.name == "base"
    assert state.stop_reason.startswith("target not reached: step 100000; the run finished at step ")
    assert state.current.out_var == before.out_var and (
        state.current.value.equal(value) if hasattr(value, "equal") else state.current.value == value)  # replayed
    assert [r.name for r in state.runs] == ["base"]  # the run that went past is not kept
    state.step()
    assert state.stop_reason == "" and state.step_index == 121


def test_run_to_here_on_an_untaken_branch_says_why_it_was_not_reached(gpt2):
    state = _fresh(gpt2)
    state.continue_()  # one finished run: rows of untaken branches are known
    never = [r for r in state.search("cross_attn_output") if not r["ran"]]
    assert never, "GPT-2 without cross-attention never runs its cross_attn_output rows"
    state.reset()
    state.run_to(120)
    state.run_to_here(never[0]["node"])
    assert state.status == "paused" and state.step_index == 120
    assert state.stop_reason.startswith("target not reached: `cross_attn_output")
    assert "in an untaken branch; the run finished at step" in state.stop_reason


def test_search_results_say_whether_the_row_ever_ran_and_give_every_row_its_path(gpt2):
    _, inputs, schema = gpt2
    widget = InspectorWidget(schema, inputs, gradients=False)
    frame = widget.search("ln_1")
    assert "ran" in frame.columns and not frame["ran"].any()  # nothing ran yet
    widget.continue_()
    frame = widget.search("ln_1")
    blocks = frame[frame["kind"] == "block"]
    assert list(blocks["path"]) == ["transformer.h.0.ln_1", "transformer.h.1.ln_1"]  # one per layer, told apart
    assert frame["ran"].all()
    assert (frame["path"] != "").all()
    cross = widget.search("cross_attn_output")
    assert not cross["ran"].any() and cross["path"].str.startswith("transformer.h.").all()
    widget.close()


def test_a_stepping_reply_with_debug_brings_the_breakpoint_view_the_call_stack_and_inline_values(gpt2):
    from nnschemaparser.widget.messages import handle_message

    state = _fresh(gpt2)
    state.break_at("h.1.attn")
    reply = handle_message(state, {"type": "continue", "id": 1, "with_hist": True, "with_debug": True})
    assert reply["ok"], reply
    data = reply["data"]
    assert data["breakpoints"]["reason"] == "entered transformer.h.1.attn"  # one round trip: no stale line
    assert data["breakpoints"]["hits"][-1]["run"] == "base"
    assert [f["block"] for f in data["call_stack"]][-1] == "transformer.h.1.attn"
    node = state.tree.node_of_instruction(state.current.instruction)
    assert data["inline"] == state.inline_values(state.tree.block_of(node))
    assert "activation" in data["hist"]
    reply = handle_message(state, {"type": "reset", "id": 2, "with_hist": True, "with_debug": True})
    assert reply["data"]["breakpoints"]["reason"] == "" and reply["data"]["call_stack"] == []
