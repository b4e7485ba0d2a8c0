"""Runs have identities (issue 42, point 2): a run id is never given twice, breakpoint hits, their
counts and `widget.breakpoint_hits` are keyed by it, and the display name may come back. The issue's
sequence on the zoo's transformers GPT-2: finish base, run to a statement of h.1.attn (a new run,
"base 2"), an edit makes it "fork 1", then clear_edits, break_at two blocks, Reset (a new "base 2")
and two Continues: only the new run's two hits show, nowhere the other run's."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.widget.inspector import InspectorWidget
from nnschemaparser.widget.state import InspectorError
from tests.support.store_models import tiny_gpt2


@pytest.fixture(scope="module")
def gpt2():
    """A 4-layer transformers GPT-2 (random weights, eager attention) on 8 tokens: (model, inputs, schema)."""
    model, schema = tiny_gpt2(4)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}, schema


def _statement_in(widget: InspectorWidget, block: str, words: str) -> int:
    """The source-view row of `block` whose statement text holds `words`."""
    rows = widget.state.search(words, lowered=False)
    found = [r["node"] for r in rows if r["block"].endswith(block) and words in r["source"]]
    assert found, f"no statement with {words!r} in {block}"
    return found[0]


def test_the_issues_sequence_shows_no_hit_of_another_run(gpt2):
    pytest.importorskip("anywidget")
    _, inputs, schema = gpt2
    widget = InspectorWidget(schema, inputs, gradients=False)
    state = widget.state
    widget.continue_()
    base = state.active
    assert base.name == "base" and base.finished

    # 2. run to a statement of h.1.attn: from the start, as a new run "base 2"
    target = _statement_in(widget, "h.1.attn", "attention_interface(self")  # `attn_output = $t79[0]` lowered
    widget.run_to_here(target)
    first = state.active
    assert first.name == "base 2" and first.id != base.id and state.status == "paused"
    assert [h["run_id"] for h in widget.breakpoint_hits] == [first.id]
    # 3. an edit makes it a fork: same run, same id, a new name
    while not isinstance(widget.current.value, torch.Tensor):  # the statement's first tensor
        widget.step()
    widget.edit("scale", 0.5)
    assert state.active is first and first.name == "fork 1" and first.id == widget.breakpoint_hits[0]["run_id"]
    assert widget.breakpoint_hits[0]["run"] == "fork 1"  # the hit names the run as it is called now

    # 4. clear_edits, two block breakpoints, Reset: a new run, named "base 2" again, with a new id
    widget.clear_edits()
    widget.break_at("h.1.attn")
    widget.break_at("h.3.attn")
    widget.reset()
    second = state.active
    assert second.name == "base 2" and second.id not in (base.id, first.id)
    assert state.view_breakpoints()["hits"] == [] and widget.breakpoint_hits == []  # the abandoned run took its hit
    assert all(item["hits"] == 0 for item in state.view_breakpoints()["items"])
    widget.continue_()
    widget.continue_()
    view = state.view_breakpoints()
    assert [(h["run_id"], h["run"], h["reason"]) for h in view["hits"]] == [
        (second.id, "base 2", "entered h.1.attn"), (second.id, "base 2", "entered h.3.attn")]
    assert [(h["run_id"], h["reason"]) for h in widget.breakpoint_hits] == [
        (second.id, "entered h.1.attn"), (second.id, "entered h.3.attn")]
    assert [item["hits"] for item in view["items"]] == [1, 1]
    assert [r["id"] for r in widget.runs] == [base.id, second.id]  # the trait names every run's id

    # a third run: the counts listed are its own (0), the totals count every run kept
    widget.reset()
    view = state.view_breakpoints()
    assert [item["hits"] for item in view["items"]] == [0, 0] and [i["total_hits"] for i in view["items"]] == [1, 1]
    assert state.active.id > second.id
    widget.close()


def test_a_run_is_found_by_its_id_and_ids_are_never_reused(gpt2):
    _, inputs, schema = gpt2
    from nnschemaparser.widget import InspectorState

    state = InspectorState(schema, inputs, None)
    seen = [state.active.id]
    for _ in range(3):
        state.step()
        state.reset()  # the paused run is abandoned: its id is not given again
        seen.append(state.active.id)
    assert len(set(seen)) == len(seen) and seen == sorted(seen)
    assert state.run(state.active.id) is state.active
    with pytest.raises(InspectorError, match=rf"no run has id {seen[0]}; the runs kept are #{seen[-1]} 'base'"):
        state.run(seen[0])
    state.close()
