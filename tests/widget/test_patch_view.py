"""The Patch view's state (issue 40, point 5): the heatmap's cells are the patching table's rows with
their effect and attribution, and opening a cell makes its patched run the active run, stepped to
its first divergence from a clean run, reproducing the row's metric."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("anywidget")
pytest.importorskip("transformers")

from nnschemaparser import SchemaInterpreter
from nnschemaparser.widget import InspectorWidget
from nnschemaparser.widget.patch_view import PatchViewError, patch_module, patch_view_state
from tests.support.patch_views import gpt2_patch_case


@pytest.fixture(scope="module")
def case():
    return gpt2_patch_case()


def test_the_cells_are_the_rows_of_the_table_with_effect_and_attribution(case):
    schema, clean, corrupted, table, attribution = case
    view = patch_view_state(table, attribution).view
    assert view["row_axis"] == "layer" and view["col_axis"] == "position"
    assert [r["layer"] for r in view["rows"]] == [0, 1] and view["cols"] == list(range(6))
    assert len(view["cells"]) == len(table) == 12
    for cell in view["cells"]:
        row = table.iloc[cell["index"]]
        assert view["rows"][cell["row"]]["site"] == row["site"]
        assert view["cols"][cell["col"]] == row["position"]
        assert cell["effect"] == row["effect"]
        match = attribution[(attribution.site == row["site"]) & (attribution.position == row["position"])]
        assert cell["attribution"] == match["attribution"].item()
    assert view["scale"]["effect"] == table["effect"].abs().max() > 0
    assert view["clean_metric"] == table.attrs["clean_metric"]
    json.dumps(view)  # all of it travels as JSON


def test_whole_value_sweeps_are_one_column_and_sites_without_a_layer_are_rows_by_site(case):
    schema, clean, corrupted, table, _ = case
    whole = table.groupby("site", as_index=False).first().drop(columns=["position"])
    view = patch_view_state(whole).view
    assert view["col_axis"] == "value" and view["cols"] == [0] and view["attribution"] is False
    no_layer = whole.copy()
    no_layer["layer"] = None
    assert patch_view_state(no_layer).view["row_axis"] == "site"


def test_bad_tables_are_refused_with_the_fix(case):
    schema, clean, corrupted, table, attribution = case
    with pytest.raises(PatchViewError, match="no `run` column"):
        patch_view_state(table.drop(columns=["run"]))
    with pytest.raises(PatchViewError, match="must be the DataFrame"):
        patch_view_state([1, 2])
    with pytest.raises(PatchViewError, match="no row for site 'transformer.h.1:output' position 5"):
        patch_view_state(table, attribution.iloc[:-1])
    with pytest.raises(PatchViewError, match="per='position'"):
        patch_view_state(table, attribution.drop(columns=["position"]))


def test_the_code_comes_on_request_and_opening_a_cell_steps_the_fork_to_its_first_divergence(case):
    schema, clean, corrupted, table, attribution = case
    widget = InspectorWidget(schema, clean)
    state = json.dumps(widget.get_state(), ensure_ascii=False)
    assert "nnsp-pt-cell" not in state and "PatchView" not in state
    assert widget.views == {}
    widget.show_patching(table, attribution)
    assert widget.views == {"Patch": 1}
    code = widget.handle({"type": "module", "name": "Patch", "id": 1})["data"]["code"]
    assert "PatchView" in code and code == patch_module()["code"]
    data = widget.handle({"type": "patch", "id": 2})["data"]
    assert len(data["cells"]) == 12 and data["opened"] is None
    row = int(table["effect"].abs().idxmax())
    reply = widget.handle({"type": "patch_open", "id": 3, "row": row})
    assert reply["ok"], reply
    opened = reply["data"]
    assert opened["clean"] == "clean" and opened["fork"].startswith("patch transformer.h.")
    names = [r["name"] for r in widget.runs]
    assert names == ["clean", opened["fork"]]
    assert widget.step_info["run"] == opened["fork"] and widget.status == "paused"
    first = opened["first"]
    assert first is not None and first["changed"] and widget.step_index == opened["step_index"] == first["step_index_b"]
    # the fork is the row's patched run: the same intervention, the same metric to the bit
    fork = widget.state.active
    while widget.state._advance():
        pass
    logits = fork.outputs[0]["logits"]
    assert (logits[:, -1, 5].sum() - logits[:, -1, 9].sum()).item() == table["metric"].iloc[row]
    expected = table["run"].iloc[row].outputs()
    assert torch.equal(fork.outputs[0]["logits"], expected["logits"])
    # every step before the divergence is the clean run's, bit for bit
    compared = widget.compare("clean", opened["fork"])
    assert compared.attrs["first_index"] is not None
    assert widget.handle({"type": "patch", "id": 4})["data"]["opened"] == row
    back = widget.handle({"type": "patch_close", "id": 5})
    assert back["ok"] and widget.state.interventions is None and widget.state.scope["input_ids"] is clean["input_ids"]
    widget.close()


def test_opening_a_row_that_is_not_there_or_of_another_schema_says_so(case):
    schema, clean, corrupted, table, attribution = case
    widget = InspectorWidget(schema, clean, gradients=False)
    reply = widget.handle({"type": "patch_open", "id": 1, "row": 0})
    assert not reply["ok"] and "widget.show_patching(table)" in reply["error"]
    widget.show_patching(table)
    reply = widget.handle({"type": "patch_open", "id": 2, "row": 99})
    assert not reply["ok"] and "rows 0..11" in reply["error"]
    from nnschemaparser import NNParser

    other = NNParser.parse_model(model=schema.module, inputs_tensors_values=dict(clean))
    foreign = InspectorWidget(other, clean, gradients=False)
    foreign.show_patching(table)
    reply = foreign.handle({"type": "patch_open", "id": 3, "row": 0})
    assert not reply["ok"] and "another schema" in reply["error"]
    widget.close()
    foreign.close()
