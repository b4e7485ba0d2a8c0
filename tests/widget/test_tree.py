"""The widget's block tree encoding, its budget, the static page and the built browser bundle."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.fixture_models import make_moe
from nnschemaparser import NNParser
from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.tree import BlockTree
from tests.support.widget_models import Branchy, WithSkippedChild, mlp_case, stack_case

INSTRUCTION_KINDS = "ocifwtWdrkx"


def _rows_by_text(rows):
    return {row[3]: row for row in rows}


def test_rows_carry_source_names_op_names_and_resolved_shapes():
    _, _, schema = mlp_case()
    tree = BlockTree(schema)
    rows = _rows_by_text(tree.rows(range(len(tree))))
    call = rows["hidden = CALL fc1(x)"]
    assert call[2] == "c" and call[4] == "float32[2, 256]" and call[7] == "fc1"
    assert rows["activated = hidden.relu()"][4] == "float32[2, 256]"
    linear = next(r for r in rows.values() if r[3].startswith("$t1 = F.linear"))
    assert "linear" in linear[7]
    fc1 = rows["fc1 · Linear"]
    assert fc1[2] == "B" and fc1[8]["path"] == "fc1"
    assert call[8]["to"] == fc1[0], "a call row points at the block it calls"


def test_if_for_and_try_are_compound_nodes_with_their_branches():
    torch.manual_seed(0)
    schema = NNParser.parse_model(Branchy(), inputs_tensors_values={"x": torch.randn(2, 4)})
    tree = BlockTree(schema)
    kinds = {row[2] for row in tree.rows(range(len(tree)))}
    assert {"i", "t", "b"} <= kinds
    if_node = next(i for i, n in enumerate(tree.nodes) if n.kind == "i")
    branches = [row[3] for row in tree.children_rows(if_node)]
    assert branches == ["condition", "then", "else"]
    try_node = next(i for i, n in enumerate(tree.nodes) if n.kind == "t")
    assert [row[3] for row in tree.children_rows(try_node)] == ["try", "except RuntimeError"]

    model, inputs = make_moe()
    tree = BlockTree(NNParser.parse_model(model, inputs_tensors_values=inputs))
    for_node = next(i for i, n in enumerate(tree.nodes) if n.kind == "f")
    assert [row[3] for row in tree.children_rows(for_node)] == ["iterable", "body"]


def test_skipped_children_are_marked_with_their_reason():
    torch.manual_seed(0)
    schema = NNParser.parse_model(WithSkippedChild(), inputs_tensors_values={"x": torch.randn(2, 4)})
    tree = BlockTree(schema)
    inner = next(row for row in tree.rows(range(len(tree))) if row[3].startswith("inner"))
    assert "cannot read the source" in inner[8]["skip"]


def test_never_routed_experts_are_reported_and_called_blocks_are_not():
    model, inputs = make_moe()  # the router never picks experts 5, 6, 7
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    state = InspectorState(schema, inputs)
    assert state.view_blocks() == {"known": False, "never": [], "live": [], "untaken": []}
    state.continue_()
    assert state.never_run_paths() == ["experts.5", "experts.6", "experts.7"]
    never = state.view_blocks()["never"]
    assert all(state.tree.nodes[n].kind == "B" for n in never)
    marked = {state.tree.block_path(n) for n in never}
    assert {"experts.5.fc1", "experts.7.fc2"} <= marked, "the sub-blocks of a never-run expert never ran either"
    assert not any(path.startswith(("experts.0", "router")) for path in marked)


def test_initial_tree_fits_its_byte_budget_and_the_rest_is_fetched_by_node():
    _, _, schema = stack_case(depth=60)
    tree = BlockTree(schema)
    initial = tree.initial(max_bytes=6_000)
    assert len(json.dumps(initial)) <= 6_000
    sent = {row[0] for row in initial["rows"]}
    assert initial["total"] == len(tree) > len(sent)
    unsent_parent = next(row for row in initial["rows"] if row[6] and not any(r[1] == row[0] for r in initial["rows"]))
    children = tree.children_rows(unsent_parent[0])
    assert len(children) == unsent_parent[6] and all(r[1] == unsent_parent[0] for r in children)
    with pytest.raises(KeyError, match="no tree node"):
        tree.children_rows(len(tree) + 5)


def test_initial_widget_state_of_a_5000_instruction_schema_is_under_200_kb():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget import InspectorWidget

    _, x, schema = stack_case(depth=640)
    tree = BlockTree(schema)
    assert tree.count(INSTRUCTION_KINDS) >= 5000
    widget = InspectorWidget(schema, scope={"x": x})
    state = widget.get_state()  # everything the front end receives on open, the browser code included
    size = len(json.dumps(state, ensure_ascii=False))
    assert size <= 200_000, f"initial widget state is {size} bytes"
    assert len(state["tree"]["rows"]) < len(tree)


def test_static_page_holds_the_tree_the_sources_and_the_last_trace(tmp_path):
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    from nnschemaparser.widget.static_html import static_payload, write_static_html

    payload = static_payload(state)
    texts = [row[3] for row in payload["traits"]["tree"]["rows"]]
    assert "hidden = CALL fc1(x)" in texts and len(texts) == len(state.tree)
    assert [row["out_var"] for row in payload["trace"]["rows"]] == ["x", "$t1", "hidden", "activated", "$t1", "$t2",
                                                                   "$t2"]
    assert payload["hists"]["3"]["activation"]["counts"]
    assert "self.fc1(x)" in payload["sources"]["0"]["text"]
    page = write_static_html(state, tmp_path / "mlp.html").read_text()
    assert page.count("<script") == 2 and "createStaticModel" in page and "nnsp-data" in page


def test_a_block_called_but_run_as_its_real_module_is_not_reported_as_never_run():
    from tests.support.live_call_models import HoldsDispatched

    # a decorator this package does not know dispatches the forward to another implementation: the
    # call runs, the block's schema body does not (Mixtral's experts did this before their
    # implementation was lowered)
    torch.manual_seed(0)
    model = HoldsDispatched().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    state = InspectorState(schema, {"x": x})
    state.continue_()
    assert state.status == "finished"
    blocks = state.view_blocks()
    assert [state.tree.block_path(n) for n in blocks["live"]] == ["inner"]
    assert blocks["never"] == [] and state.never_run_paths() == []
    node = state.tree.path_nodes["inner"]
    assert "dispatches to another implementation" in state.tree.nodes[node].extra["skip"]


class _LoopViews(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers[1:]):
            x = layer(x) + i
        return x


def test_a_loop_over_a_container_view_shows_its_calls_as_call_rows_and_its_entries_as_blocks():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(_LoopViews(), inputs_tensors_values={"x": x})
    state = InspectorState(schema, {"x": x})
    rows = _rows_by_text(state.tree.rows(range(len(state.tree))))
    call = next(r for t, r in rows.items() if t.endswith("= CALL layer(x)"))
    assert call[2] == "c" and call[7] == "layer" and call[4] == "float32[2, 4]"
    loop = next(r for t, r in rows.items() if t.startswith("FOR ") and t.endswith("OVER self.layers:"))
    body = next(r for r in state.tree.children_rows(loop[0]) if r[3] == "body")
    assert body[0] in state.tree.ancestors(call[0]), "the call sits in the loop's body"
    assert {"layers.0 · Linear", "layers.1 · Linear", "layers.2 · Linear"} <= set(rows)
    state.continue_()
    # the loop's calls entered layers.1 and layers.2; the slice never reaches layers.0
    assert [state.tree.block_path(n) for n in state.view_blocks()["never"]] == ["layers.0"]
