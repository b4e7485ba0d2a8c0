"""The Diverge view's state (issue 39, point 4): report.show() is the inspector of side b with a
Diverge tab; its lines are the report's rows with their errors, bound and status, the planted line
is the first culprit, and stepping to a line runs both sides to the statement that bound it."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("anywidget")
pytest.importorskip("transformers")

from nnschemaparser import diverge
from nnschemaparser.traces.diverge import DivergeReport
from nnschemaparser.widget import InspectorWidget
from nnschemaparser.widget.diverge_view import DivergeViewError, diverge_view_state
from tests.support.diverge_models import gpt2, same_weights, variant_module

NEW = "hidden_states = residual + feed_forward_hidden_states.to(torch.bfloat16).float()"


@pytest.fixture(scope="module")
def planted():
    from transformers.models.gpt2 import modeling_gpt2

    model, inputs = gpt2()
    variant, lines = variant_module(modeling_gpt2, {"hidden_states = residual + feed_forward_hidden_states": NEW})
    report = diverge(model, same_weights(model, variant, "GPT2LMHeadModel"), inputs)
    return report, variant, lines[NEW]


def _rows(view):
    return [row for block in view["blocks"] for row in block["rows"]]


def test_the_lines_are_the_rows_of_the_report_in_run_order_with_the_planted_line_first(planted):
    report, variant, line = planted
    view = diverge_view_state(report)
    rows = _rows(view)
    assert [r["index"] for r in rows] == list(range(len(report.table))) == list(range(view["rows"]))
    for row, (_, want) in zip(rows, report.table.iterrows()):
        assert (row["line"], row["var"], row["status"], row["flagged"]) == (want["line"], want["out_var"], want["status"],
                                                                            want["flagged"])
        assert row["local"] == (None if want["local_error"] != want["local_error"] else want["local_error"])
    assert all(r["source_a"] is None for r in rows if r["status"] != "edited")  # no NaN for "no a statement"
    for block in view["blocks"]:
        assert {report.table.iloc[r["index"]]["block_path"] for r in block["rows"]} == {block["block"]}
    first = rows[view["first"]]
    assert (first["file"], first["line"], first["text"], first["status"]) == (variant.__file__, line, NEW, "edited")
    assert first["source_a"] == "hidden_states = residual + feed_forward_hidden_states"
    low, high = view["log_range"]
    assert low < high and 10.0 ** low <= first["bound"] < first["local"] <= 10.0 ** high
    json.dumps(view)


def test_show_is_the_inspector_of_b_with_the_diverge_tab_and_steps_both_runs_to_a_line(planted):
    report, variant, line = planted
    widget = report.show()
    assert isinstance(widget, InspectorWidget) and widget.views == {"Diverge": 1}
    assert widget.state.schema is report.schema_b
    state = json.dumps(widget.get_state(), ensure_ascii=False)
    assert "nnsp-dv-line" not in state  # the view's code comes on request
    code = widget.handle({"type": "module", "name": "Diverge", "id": 1})["data"]["code"]
    assert "DivergeView" in code and "nnsp-dv-line" in code
    data = widget.handle({"type": "diverge", "id": 2})["data"]
    first = data["first"]
    reply = widget.handle({"type": "diverge_step", "id": 3, "row": first})
    assert reply["ok"], reply
    a, b = reply["data"]["a"], reply["data"]["b"]
    # b is the inspector's own run: paused at the planted line, binding its variable
    assert widget.status == "paused" and widget.step_index == b["step"]
    assert (widget.current.block_path, widget.step_info["line"], widget.current.out_var) == ("transformer.h.0", line,
                                                                                             "hidden_states")
    assert b["line"] == line and a["line"] == report.alignment.b_to_a[("transformer.h.0", variant.__file__, line)][1]
    state_a = widget.state.diverge.state_a
    assert state_a.step_index == a["step"] and state_a.current.out_var == "hidden_states"
    assert state_a.current.block_path == "transformer.h.0"
    # the summaries are those of the two tensors bound there, and they differ as the report says
    va, vb = state_a.current.value.detach(), widget.current.value.detach()
    assert a["stats"]["l2"] == pytest.approx(float(va.double().norm())) and b["stats"]["mean"] == pytest.approx(
        float(vb.double().mean()))
    assert not torch.equal(va, vb)
    assert reply["data"]["row"]["local"] == report.table.iloc[first]["local_error"]
    # a later occurrence of the same statement (layer 1) is its own step
    later = next(r["index"] for r in _rows(data) if r["line"] == line and r["index"] > first
                 and report.table.iloc[r["index"]]["block_path"] == "transformer.h.1")
    second = widget.handle({"type": "diverge_step", "id": 4, "row": later})["data"]
    assert second["b"]["step"] > b["step"] and widget.current.block_path == "transformer.h.1"
    assert widget.handle({"type": "diverge", "id": 5})["data"]["selected"] == later
    bad = widget.handle({"type": "diverge_step", "id": 6, "row": 10_000})
    assert not bad["ok"] and "no row 10000" in bad["error"]
    widget.close()


def test_a_plain_inspector_has_no_diverge_view_and_says_how_to_open_one(planted):
    report, _, _ = planted
    widget = InspectorWidget(report.schema_a, report.side_a["inputs"], gradients=False)
    reply = widget.handle({"type": "diverge", "id": 1})
    assert not reply["ok"] and "report.show()" in reply["error"]
    with pytest.raises(DivergeViewError, match="DivergeReport"):
        diverge_view_state(report.table)
    from nnschemaparser.widget.diverge_widget import diverge_widget

    assert DivergeReport.viewer is diverge_widget  # registered by the widget stage
    widget.close()


def test_show_of_a_compiled_b_steps_a_and_b_own_code_and_gives_the_compiled_region_of_the_line():
    """A torch.compile model b has no values inside its graphs: the view's b run is its own code run
    without the compiler (the same weights as a), and stepping to a line gives both runs' values there
    and, for b, the compiled region and the error compiling it adds (the report's row)."""
    import copy

    from tests.support.compile_faults import GeluMLP, GeluNet, TanhGelu, expected_line

    torch.manual_seed(0)
    model, inputs = GeluNet().eval(), {"x": torch.randn(4, 8) * 3}
    compiled = torch.compile(copy.deepcopy(model), backend=TanhGelu())
    report = diverge(model, compiled, inputs)
    assert report.schema_b is None and report.side_b["compiled"]
    widget = report.show()
    assert widget.state.schema is not report.schema_a  # b's own module (a copy of a), parsed
    state_a = widget.state.diverge.state_a
    assert state_a.schema is report.schema_a
    data = widget.handle({"type": "diverge", "id": 1})["data"]
    assert "torch.compile" in data["sides"]["b"] and "GeluNet" in data["sides"]["b"]
    code = widget.handle({"type": "module", "name": "Diverge", "id": 9})["data"]["code"]
    assert "nnsp-dv-compiled" in code  # the detail shows b's compiled region under the line
    first = data["first"]
    row = report.table.iloc[first]
    assert (row["file"], row["line"]) == expected_line(GeluMLP.forward, "a = F.gelu(h)")
    reply = widget.handle({"type": "diverge_step", "id": 2, "row": first})
    assert reply["ok"], reply
    a, b = reply["data"]["a"], reply["data"]["b"]
    # both runs paused at the gelu line, binding `a`, with the same eager values (b's own code, a's weights)
    assert widget.status == "paused" and widget.step_index == b["step"]
    assert (widget.current.block_path, widget.step_info["line"], widget.current.out_var) == ("mlp", row["line"], "a")
    assert state_a.step_index == a["step"] and state_a.current.out_var == "a" and state_a.current.block_path == "mlp"
    assert torch.equal(state_a.current.value, widget.current.value)
    assert b["compiled"] == {"region": row["region"], "local_error": row["local_error"],
                             "carried_error": row["carried_error"]}
    assert b["compiled"]["local_error"] > row["bound"]
    assert "backend TanhGelu" in b["note"] and "Compiled as this statement alone" in b["note"]
    # each line carries its region (the key the browser marks it by) and the words it shows
    rows = _rows(data)
    assert [r["region"] for r in rows] == list(report.table.region)
    assert rows[first]["region_text"] == "this statement alone" and "backend TanhGelu" in data["sides"]["b"]
    assert all(r["region_text"] == r["region"] for r in rows if r["region"] != "statement")
    later = widget.handle({"type": "diverge_step", "id": 3, "row": len(report.table) - 1})["data"]
    assert later["b"]["step"] > b["step"] and later["a"]["step"] > a["step"]
    widget.close()
