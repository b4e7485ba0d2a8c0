"""The static page keeps every run: traces, histograms, comparisons, heatmaps of the steps looked at
(and a bounded sample), trends; its size is measured against the budget in static_html's docstring."""

from __future__ import annotations

import json

import torch

from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.static_html import (MAX_SAMPLED_TENSORS, SAMPLED_SIDE, SEP, static_page,
                                               static_payload)
from tests.support.widget_models import mlp_case


def _base_and_fork():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    state.reset()
    state.run_to(3)
    state.edit("scale", 0.0)
    state.continue_()
    return state


def test_the_static_payload_keeps_every_run_and_the_comparison_of_base_and_fork():
    state = _base_and_fork()
    state.tensor_view(run="fork 1", trace_step=3)
    payload = static_payload(state)
    assert [r["name"] for r in payload["traits"]["runs"]] == ["base", "fork 1"]
    assert set(payload["traces"]) == {"base", "fork 1"}
    assert payload["traits"]["compare_pairs"] == [["base", "fork 1"]]
    stored = payload["compares"][f"base{SEP}fork 1"]
    assert stored["first"]["out_var"] == "hidden" and stored["first"]["step_index_b"] == 3
    assert stored["rows"] == [{k: v for k, v in row.items()} for row in json.loads(json.dumps(stored["rows"]))]
    assert set(payload["run_hists"]) == {"base", "fork 1"} and payload["run_hists"]["base"]["3"]["run"] == "base"


def test_the_static_payload_holds_heatmaps_of_steps_looked_at_and_their_difference_with_base():
    state = _base_and_fork()
    state.tensor_view(run="fork 1", trace_step=4)
    payload = static_payload(state)
    assert state.viewed == [("fork 1", 4)], "writing the page does not count as looking"
    seen = payload["tensors"][f"fork 1{SEP}4{SEP}"]
    fork_value = state.run("fork 1").trace.steps[3].tensor.value
    assert torch.equal(torch.tensor(seen["values"]).reshape(2, -1).to(torch.float32), fork_value[:, seen["col_ids"]])
    first = payload["tensors"][f"fork 1{SEP}3{SEP}base"]  # the first divergence, as fork - base
    base_value = state.run("base").trace.steps[2].tensor.value.double()
    assert first["scale"] == "diverging"
    expected = (state.run("fork 1").trace.steps[2].tensor.value.double() - base_value)[:, first["col_ids"]]
    assert torch.equal(torch.tensor(first["values"], dtype=torch.float64).reshape(2, -1), expected)
    sampled = [k for k in payload["tensors"] if k.startswith(f"base{SEP}")]
    assert 0 < len(sampled) <= MAX_SAMPLED_TENSORS
    assert all(len(payload["tensors"][k]["col_ids"]) <= SAMPLED_SIDE for k in sampled)


def test_the_static_page_of_a_base_and_a_fork_stays_within_its_size_budget():
    state = _base_and_fork()
    state.tensor_view(run="fork 1", trace_step=3)
    page = static_page(state)
    payload = static_payload(state)
    data = len(json.dumps(payload, separators=(",", ":")))
    tensor_cells = sum(len(v["values"]) for v in payload["tensors"].values())
    # the budget: the sample adds at most MAX_SAMPLED_TENSORS * SAMPLED_SIDE**2 numbers per run, the
    # steps looked at at most 128**2 each; this page (2 runs of the MLP) must stay under 1.5 MB
    assert tensor_cells <= 2 * MAX_SAMPLED_TENSORS * SAMPLED_SIDE ** 2 + 2 * 128 ** 2
    assert len(page.encode()) < 1_500_000, f"{len(page.encode())} bytes"
    assert data < len(page.encode())
