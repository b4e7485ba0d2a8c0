"""Go anywhere in one action: search, breakpoints, Continue to a hit, step out, the call stack
(issue 11, item 2), on a transformers GPT-2 built from its config and on small models."""

from __future__ import annotations

import linecache

import pytest
import torch

from nnschemaparser.widget import InspectorError, InspectorState
from nnschemaparser.widget.inspector import InspectorWidget
from nnschemaparser.widget.messages import handle_message
from tests.support.debugger_models import Chain, Decorated, parsed, tiny_case


@pytest.fixture(scope="module")
def gpt2():
    return tiny_case("gpt2")


def _fresh(case) -> InspectorState:
    _, inputs, schema = case
    return InspectorState(schema, inputs)


def test_search_finds_a_block_path_first_also_rows_never_sent_to_the_browser(gpt2):
    state = _fresh(gpt2)
    results = state.search("h.1.attn")
    assert results[0]["path"] == "transformer.h.1.attn" and results[0]["kind"] == "block"
    sent = {row[0] for row in state.tree.initial(max_bytes=2_000)["rows"]}
    assert results[0]["node"] not in sent  # the search reads the whole tree, not what was sent
    assert results[0]["ancestors"][0] == 0
    assert all(a in state.tree.ancestors(results[0]["node"]) for a in results[0]["ancestors"])


def test_search_matches_variables_ops_and_source_text(gpt2):
    state = _fresh(gpt2)
    assert any("key_states" in r["text"] for r in state.search("key_states"))
    assert any("softmax" in r["op"].lower() for r in state.search("softmax"))
    with pytest.raises(InspectorError, match="search needs some text"):
        state.search("   ")


def test_widget_search_returns_a_dataframe(gpt2):
    _, inputs, schema = gpt2
    widget = InspectorWidget(schema, inputs, gradients=False)
    frame = widget.search("h.1.attn")
    assert list(frame.columns)[:3] == ["node", "kind", "text"] and frame.iloc[0]["path"] == "transformer.h.1.attn"
    widget.close()


def test_continue_stops_on_entry_of_a_block_at_its_first_source_line(gpt2):
    state = _fresh(gpt2)
    state.break_at("h.1.attn")
    state.continue_()
    step = state.current
    assert state.status == "paused" and step.block_path == "transformer.h.1.attn"
    assert state.stop_reason == "entered transformer.h.1.attn"
    view = state.view_step()
    source = state.tree.source(view["node"])
    assert source["text"].split("\n")[view["line"] - source["first"]] == \
        linecache.getline(view["file"], view["line"]).rstrip("\n")
    hits = state.view_breakpoints()["hits"]
    assert hits[-1]["step"] == step.step_index and hits[-1]["block"] == "transformer.h.1.attn"
    state.continue_()  # one call of the block per run: the next Continue runs to the end
    assert state.status == "finished"


def test_a_tree_row_breakpoint_stops_at_the_step_that_runs_that_row(gpt2):
    state = _fresh(gpt2)
    state.continue_()
    ran = state.active.executed
    state.reset()
    row = next(r for r in state.search("key_states") if r["block"] == "transformer.h.0.attn"
               and r["text"].startswith("key_states =") and r["node"] in ran)
    state.break_at(row["node"])
    state.continue_()
    assert state.view_step()["node"] == row["node"]


def test_a_line_breakpoint_stops_at_the_first_step_of_that_line_each_time_it_runs():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    state = InspectorState(parsed(Decorated(), x=x), {"x": x})
    line = next(n for n, text in enumerate(open(Decorated.forward.__wrapped__.__wrapped__.__code__.co_filename),
                                           start=1) if "doubled = h * 2" in text)
    state.break_at(line=line)
    state.continue_()
    assert state.current.out_var == "doubled" and state.current.location.lineno == line
    state.continue_()
    assert state.status == "finished"


def test_break_on_nonfinite_stops_at_the_nan_an_edit_injected(gpt2):
    state = _fresh(gpt2)
    while state.step() is not None:
        if state.current.out_var == "key_states" and state.current.block_path.endswith("h.0.attn"):
            break
    state.edit("expression", "value * float('nan')")
    edited_at = state.step_index
    state.break_on_nonfinite()
    state.continue_()
    value = state.current.value
    assert state.status == "paused" and state.step_index > edited_at
    assert isinstance(value, torch.Tensor) and not torch.isfinite(value).all()
    assert "NaN or an Inf" in state.stop_reason


def test_a_predicate_breakpoint_is_evaluated_on_each_step_and_a_raising_one_says_why():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    state = InspectorState(parsed(Chain(), x=x), {"x": x})
    state.break_at(when=lambda step: isinstance(step.value, torch.Tensor) and step.out_var == "h"
                   and bool((step.value >= 0).all()))
    state.continue_()
    assert state.current.out_var == "h" and bool((state.current.value >= 0).all())
    state.clear_breakpoints()
    state.reset()

    def broken(step):
        raise ValueError("no")
    state.break_at(when=broken)
    state.continue_()
    assert state.step_index == 1 and "raised ValueError: no" in state.stop_reason


def test_break_at_refuses_what_is_no_place(gpt2):
    state = _fresh(gpt2)
    with pytest.raises(InspectorError, match="no block at"):
        state.break_at("h.9.attn")
    with pytest.raises(InspectorError, match="names .* blocks"):
        state.break_at("attn")
    with pytest.raises(InspectorError, match="no tree node"):
        state.break_at(10 ** 6)
    with pytest.raises(InspectorError, match="line must be"):
        state.break_at(line=0)
    assert state.view_breakpoints()["items"] == []


def test_step_out_returns_to_the_caller_just_after_the_call(gpt2):
    state = _fresh(gpt2)
    state.break_at("h.1.attn")
    state.continue_()
    depth = state.current.frame_depth
    state.step_out()
    assert state.current.frame_depth == depth - 1 and state.current.block_path == "transformer.h.1"
    assert state.current.kind == "block"  # the call's own step: its result is bound now


def test_call_stack_lists_root_to_current_block_with_visible_variables(gpt2):
    state = _fresh(gpt2)
    state.break_at("h.1.attn")
    state.continue_()
    stack = state.call_stack()
    assert [f["block"] for f in stack] == ["", "transformer", "transformer.h.1", "transformer.h.1.attn"][-len(stack):] \
        or [f["block"] for f in stack][-1] == "transformer.h.1.attn"
    assert stack[-1]["current"] and stack[-1]["node"] == state.tree.find_block("transformer.h.1.attn")
    hidden = next(v for v in stack[-1]["vars"] if v["name"] == "hidden_states")
    assert hidden["shape"] == [2, 8, 32] and set(hidden["stats"]) == {"mean", "std", "min", "max"}


def test_browser_messages_for_search_breakpoints_step_out_and_call_stack(gpt2):
    state = _fresh(gpt2)
    found = handle_message(state, {"id": 1, "type": "search", "query": "h.1.attn"})
    node = found["data"]["results"][0]["node"]
    set_bp = handle_message(state, {"id": 2, "type": "break_at", "block": "transformer.h.1.attn"})
    assert set_bp["ok"] and set_bp["data"]["items"][0]["node"] == node
    handle_message(state, {"id": 3, "type": "continue"})
    assert state.current.block_path == "transformer.h.1.attn"
    stack = handle_message(state, {"id": 4, "type": "call_stack"})["data"]["frames"]
    assert stack[-1]["block"] == "transformer.h.1.attn"
    handle_message(state, {"id": 5, "type": "step_out"})
    assert state.current.block_path == "transformer.h.1"
    cleared = handle_message(state, {"id": 6, "type": "clear_breakpoints"})
    assert cleared["data"]["items"] == []


def test_run_to_here_stops_at_a_row_once_and_leaves_no_breakpoint_behind(gpt2):
    state = _fresh(gpt2)
    node = state.tree.find_block("transformer.h.1.mlp")
    state.run_to_here(node)
    assert state.current.block_path == "transformer.h.1.mlp"
    assert state.view_breakpoints()["items"] == []
    state.continue_()
    assert state.status == "finished"
    state.run_to_here(node)  # a finished run starts again
    assert state.status == "paused" and state.current.block_path == "transformer.h.1.mlp"


def test_run_to_here_on_a_source_line_stops_there_and_a_breakpoint_on_the_way_first():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    state = InspectorState(parsed(Chain(), x=x), {"x": x})
    lines = {i.out_var: i.location.lineno for i in state.schema.signature.body if i.location}
    state.break_at(when=lambda step: step.location is not None and "relu" in step.location.code)
    state.run_to_here(line=max(lines.values()))
    assert "relu" in state.current.location.code  # the breakpoint on the way stopped first
    state.clear_breakpoints()
    state.run_to_here(line=max(lines.values()))
    assert state.current.location.lineno == max(lines.values())


def test_inline_values_give_each_line_that_ran_its_variable_shape_and_mean():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = Chain()
    state = InspectorState(parsed(model, x=x), {"x": x})
    state.continue_()
    values = state.inline_values(0)["lines"]
    body = {i.location.lineno: i for i in state.schema.signature.body if i.location}
    first = min(body)
    expected_mean = float(model.a(x).mean())
    assert values[str(first)] == f"h float32[3, 4] μ {expected_mean:.4g}"
    assert len(values) == len(body)
    reply = handle_message(state, {"id": 1, "type": "inline", "block": 0})
    assert reply["ok"] and reply["data"]["lines"] == values


def test_remove_breakpoint_drops_one_and_refuses_an_unknown_index(gpt2):
    state = _fresh(gpt2)
    state.break_at("h.0.attn")
    state.break_on_nonfinite()
    state.remove_breakpoint(0)
    assert [b["kind"] for b in state.view_breakpoints()["items"]] == ["nonfinite"]
    with pytest.raises(InspectorError, match="no breakpoint 5"):
        state.remove_breakpoint(5)


def test_inline_value_of_a_subscript_assignment_line_is_the_stored_tensor_not_none():
    from tests.support.debugger_models import InPlaceNet

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    state = InspectorState(parsed(InPlaceNet(), x=x), {"x": x})
    state.continue_()
    line = next(i.location.lineno for i in state.schema.signature.body if "+=" in (i.location.code if i.location else ""))
    assert state.inline_values(0)["lines"][str(line)].startswith("float32[2, 2]")


def test_a_block_path_search_lists_blocks_not_every_row_inside_them(gpt2):
    state = _fresh(gpt2)
    results = state.search("h.1.attn")
    assert results and all(r["kind"] == "block" for r in results)
    assert {r["path"] for r in results} >= {"transformer.h.1.attn", "transformer.h.1.attn.c_attn"}


def test_the_untaken_branch_of_an_if_is_listed_after_a_run_the_taken_one_not():
    from tests.support.widget_models import Branchy

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    model = Branchy()
    state = InspectorState(parsed(model, x=x), {"x": x})
    assert state.view_blocks()["untaken"] == []
    state.continue_()
    untaken = {state.tree.nodes[n].text for n in state.view_blocks()["untaken"]}
    took_then = bool(model.fc(x).sum() > 0)
    assert ("else" if took_then else "then") in untaken and ("then" if took_then else "else") not in untaken
    assert any(text.startswith("except") for text in untaken)  # the handler never ran


def test_a_trace_row_of_another_run_runs_the_active_one_to_the_matching_step():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    state = InspectorState(parsed(Chain(), x=x), {"x": x})
    state.continue_()
    base = state.active
    relu = next(step for step in base.trace.steps if "relu" in step.op_name)
    state.run_to(base.trace_index[base.trace.steps[1].step])  # the first layer's output
    state.edit("scale", 2.0)  # the active run is a fork now
    state.reset()
    state.run_to_trace_step(base.name, relu.step)
    assert state.active.is_fork and state.step_index == base.trace_index[relu.step]
    assert state.current.out_var == relu.out_var and "relu" in state.current.location.code
    with pytest.raises(InspectorError, match="no trace step 999"):
        state.run_to_trace_step(base.name, 999)
