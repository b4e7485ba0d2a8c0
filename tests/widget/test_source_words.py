"""Source words only (issue 42, points 4 to 6): no `$tN` temporaries, row numbers or intrinsic names
in the text a user reads (stop reasons, breakpoint labels, step cards, the Layers header, search
results of the source view), "not run yet" until a run has finished, and a predicate breakpoint
listed with its own source text. On a 4-layer transformers GPT-2."""

from __future__ import annotations

import re

import pytest
import torch

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.debugger import predicate_text
from nnschemaparser.widget.messages import handle_message
from tests.support.store_models import tiny_gpt2

INTERNAL = re.compile(r"\$t\d+|intrinsics\.|\brow \d+")


@pytest.fixture(scope="module")
def gpt2():
    model, schema = tiny_gpt2(4)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}, schema


def _lowered_unpack(state: InspectorState) -> int:
    """The lowered row `attn_output = $t79[0]` of h.1.attn (the issue's stop reason came from it)."""
    for row in state.search("attn_output", lowered=True):
        if row["block"].endswith("h.1.attn") and re.search(r"attn_output = \$t\d+\[0\]", row["text"]) and \
                "attention_interface(" in state.tree.source_words(row["node"]):
            return row["node"]
    raise AssertionError("no lowered unpack of attn_output in h.1.attn")


def test_stop_reasons_labels_and_step_cards_read_source_words(gpt2):
    _, inputs, schema = gpt2
    state = InspectorState(schema, inputs, None)
    node = _lowered_unpack(state)
    state.break_at(node)
    label = state.view_breakpoints()["items"][0]["label"]
    assert not INTERNAL.search(label) and label.startswith("attn_output, attn_weights = attention_interface(")
    assert label.endswith(f"(line {state.tree.nodes[node].line})")
    for _ in range(40):  # the step card of each step on the way
        state.step()
        card = state.view_step()
        assert not INTERNAL.search(card["text"]), card["text"]
    state.continue_()
    assert state.stop_reason == f"reached {label}"
    card = state.view_step()
    assert not INTERNAL.search(card["text"]) and INTERNAL.search(card["instruction"])  # lowered text kept apart
    layers = state.same_statement(card["node"])
    assert layers["text"] == card["text"] and not INTERNAL.search(layers["text"])
    state.close()


def test_search_of_the_source_view_lists_statements_not_lowered_rows(gpt2):
    _, inputs, schema = gpt2
    state = InspectorState(schema, inputs, None)
    lowered = state.search("attn_output", lowered=True)
    source = state.search("attn_output", lowered=False)
    assert any(INTERNAL.search(r["text"]) for r in lowered)  # the lowered view lists the instructions
    shown = [r["source"] or r["text"] for r in source]
    assert shown and not [t for t in shown if INTERNAL.search(t)]
    assert len({r["node"] for r in source}) == len(source)  # a statement once, however many rows matched


def test_not_run_yet_until_a_run_finished_and_predicates_listed_with_their_text(gpt2):
    _, inputs, schema = gpt2
    state = InspectorState(schema, inputs, None)
    reply = handle_message(state, {"type": "search", "id": 1, "query": "h.3.mlp", "lowered": False})["data"]
    assert reply["finished"] is False and reply["results"][0]["ran"] is False  # not run yet
    state.continue_()
    reply = handle_message(state, {"type": "search", "id": 2, "query": "h.3.mlp", "lowered": False})["data"]
    assert reply["finished"] is True and reply["results"][0]["ran"] is True

    def big(step):
        return isinstance(step.value, torch.Tensor) and step.value.abs().max() > 1e3

    state.break_at(when=lambda step: step.step_index == 7)
    state.break_at(when=big)
    labels = [item["label"] for item in state.view_breakpoints()["items"]]
    assert labels == ["lambda step: step.step_index == 7", "big"]
    assert predicate_text(lambda s, t=1: s) == "lambda s, t=1: s"
    state.close()


def test_trace_and_compare_tables_and_edit_errors_read_source_words(gpt2):
    """The Trace and Compare tables' variable cells show the statement of a temporary, and an edit
    error names the statement, not `'$tN'`."""
    _, inputs, schema = gpt2
    state = InspectorState(schema, inputs, None)
    state.continue_()
    trace = handle_message(state, {"type": "table", "id": 1, "page": 0, "size": 200})["data"]
    at = trace["columns"].index("out_var")
    shown = [row[at] for row in trace["rows"]]
    raw = [row["out_var"] for row in state.active.trace_rows()[:200]]
    assert any(INTERNAL.search(v) for v in raw)  # the traces keep the lowering's names...
    assert not [v for v in shown if INTERNAL.search(v or "")]  # ...the table shows source words
    ops = [row[trace["columns"].index("op_name")] for row in trace["rows"]]
    assert "assign" in ops and not [o for o in ops if INTERNAL.search(o or "")]  # an intrinsic by its own name
    for value, cell in zip(raw, shown):
        if not INTERNAL.search(value):
            assert cell == value  # a real variable keeps its name
    temp = next(i for i, v in enumerate(raw) if INTERNAL.fullmatch(v))
    row = trace["rows"][temp]
    node = state.active.step_row(row[trace["columns"].index("step_index")])["node"]
    assert shown[temp] == state.tree.source_words(node) and shown[temp]
    state.reset()
    state.continue_()
    compare = handle_message(state, {"type": "compare", "id": 2, "size": 200})["data"]
    at = compare["columns"].index("out_var")
    assert compare["rows"] and not [r[at] for r in compare["rows"] if INTERNAL.search(r[at] or "")]
    op = compare["columns"].index("op_name")
    assert not [r[op] for r in compare["rows"] if INTERNAL.search(r[op] or "")]
    # an edit of a temporary that is no tensor: the error names its statement
    state.reset()
    while True:
        state.step()
        step = state.current
        if INTERNAL.fullmatch(step.out_var or "") and not isinstance(step.value, torch.Tensor):
            break
    words = state.tree.source_words(state.tree.node_of_instruction(step.instruction))
    with pytest.raises(Exception) as caught:
        state.edit("zero")
    assert not INTERNAL.search(str(caught.value)) and f"the value of `{words}`" in str(caught.value)
    assert state.error == str(caught.value)
    reply = handle_message(state, {"type": "edit", "id": 3, "action": "scale", "argument": 2})
    assert not reply["ok"] and not INTERNAL.search(reply["error"]) and words in reply["error"]
    state.close()
