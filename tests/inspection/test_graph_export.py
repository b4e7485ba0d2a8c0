"""Behaviour of the JSON graph: nodes, edges of real data flow, torch's totals, depth merging."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from nnschemaparser.inspection.graph_export import GRAPH_FORMAT, build_graph, write_graph
from nnschemaparser.inspection.inspector import ModelInspector
from tests.support.fixture_models import FIXTURES
from tests.support.inspection_models import WithSkippedChild, make_encoder


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(20, 5)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu(x)
        x = self.linear2(x)
        return x


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return x + h


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def graph_of(model: nn.Module, *inputs: torch.Tensor, **options) -> dict:
    return build_graph(ModelInspector(model, example_inputs=inputs), **options)


def edge_pairs(graph: dict) -> list[tuple[str, str]]:
    return [(e["source"], e["target"]) for e in graph["edges"]]


def test_graph_of_the_two_linear_model():
    torch.manual_seed(0)
    graph = graph_of(MyModel(), torch.randn(2, 10))
    assert graph["format"] == GRAPH_FORMAT
    assert [(n["id"], n["kind"], n["op"], n["block_path"]) for n in graph["nodes"]] == [
        ("input_0", "input", "input", ""),
        ("linear1.linear", "op", "linear", "linear1"),
        ("relu.relu", "op", "relu", "relu"),
        ("linear2.linear", "op", "linear", "linear2"),
        ("output", "output", "output", ""),
    ]
    assert edge_pairs(graph) == [("input_0", "linear1.linear"), ("linear1.linear", "relu.relu"),
                                 ("relu.relu", "linear2.linear"), ("linear2.linear", "output")]
    linear1 = graph["nodes"][1]
    assert linear1["name"] == "$t1" and linear1["shape"] == [2, 20] and linear1["dtype"] == "torch.float32"
    assert linear1["params"] == 10 * 20 + 20 and linear1["flops"] == 2 * 2 * 10 * 20
    assert graph["nodes"][0]["name"] == "x"
    assert graph["totals"]["params"] == 325 and graph["totals"]["flops"] == 2 * (400 + 200)


def test_residual_add_reads_both_branches():
    graph = graph_of(Residual(), torch.randn(3, 8))
    into_add = [(e["source"], e["input_idx"]) for e in graph["edges"] if e["target"] == "add"]
    assert into_add == [("input_0", 0), ("fc.linear", 1)]


def test_multi_output_edges_carry_the_producer_slot():
    class Split(nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=-1)
            return b - a

    graph = graph_of(Split(), torch.randn(2, 6))
    into_sub = sorted((e["output_idx"], e["input_idx"]) for e in graph["edges"] if e["target"] == "sub")
    assert into_sub == [(0, 1), (1, 0)]


def test_tied_weight_counts_once_among_the_nodes():
    graph = graph_of(TiedLM(), torch.randint(0, 10, (2, 3)))
    params = {n["id"]: n["params"] for n in graph["nodes"]}
    assert params["embed.embedding"] == 40 and params["head.linear"] == 0
    assert graph["totals"]["params"] == graph["totals"]["params_read"] == 40


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_totals_equal_torch_parameter_and_flop_counts(name):
    model, inputs = FIXTURES[name]()
    model.eval()
    graph = build_graph(ModelInspector(model, example_kwargs=inputs))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(**{k: v.clone() for k, v in inputs.items()})
    assert graph["totals"]["params"] == sum(p.numel() for p in model.parameters())
    assert graph["totals"]["flops"] == counter.get_total_flops()
    assert sum(n["flops"] for n in graph["nodes"]) == graph["totals"]["flops"]
    assert sum(n["params"] for n in graph["nodes"]) == graph["totals"]["params_read"] <= graph["totals"]["params"]
    ids = {n["id"] for n in graph["nodes"]}
    assert len(ids) == len(graph["nodes"])
    assert all(e["source"] in ids and e["target"] in ids for e in graph["edges"])
    json.dumps(graph)


def _acyclic(graph: dict) -> bool:
    incoming = {n["id"]: 0 for n in graph["nodes"]}
    for _, target in edge_pairs(graph):
        incoming[target] += 1
    ready = [n for n, k in incoming.items() if k == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for source, target in edge_pairs(graph):
            if source == node:
                incoming[target] -= 1
                if incoming[target] == 0:
                    ready.append(target)
    return seen == len(incoming)


def test_depth_merges_each_module_below_it_into_one_node_per_call():
    model, inputs = make_encoder()
    inspector = ModelInspector(model, example_kwargs=inputs)
    full = build_graph(inspector)
    graph = build_graph(inspector, depth=1)
    modules = {n["id"]: n for n in graph["nodes"] if n["kind"] == "module"}
    assert set(modules) == {"embed", "blocks.0", "blocks.1", "head"}
    assert modules["blocks.0"]["params"] == sum(p.numel() for p in model.blocks[0].parameters())
    assert all(n["block_path"] == "" for n in graph["nodes"] if n["kind"] == "op")
    assert modules["blocks.0"]["flops"] == sum(n["flops"] for n in full["nodes"]
                                               if n["block_path"].startswith("blocks.0"))
    assert sum(n["flops"] for n in graph["nodes"]) == full["totals"]["flops"]
    assert sum(n["params"] for n in graph["nodes"]) == full["totals"]["params_read"]
    assert ("blocks.0", "blocks.1") in edge_pairs(graph)
    assert all(source != target for source, target in edge_pairs(graph))
    assert _acyclic(graph) and _acyclic(full)
    assert len(graph["nodes"]) < len(full["nodes"])


def test_depth_zero_keeps_only_the_root():
    graph = graph_of(MyModel(), torch.randn(1, 10), depth=0)
    assert [n["kind"] for n in graph["nodes"]] == ["input", "module", "output"]
    assert graph["nodes"][1]["flops"] == graph["totals"]["flops"]
    assert edge_pairs(graph) == [("input_0", "<root>"), ("<root>", "output")]


def test_negative_depth_is_refused():
    inspector = ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),))
    with pytest.raises(ValueError, match="depth must be a whole number >= 0"):
        build_graph(inspector, depth=-1)


def test_blocks_report_subtree_parameters_and_flops():
    graph = graph_of(MyModel(), torch.randn(1, 10))
    blocks = {b["path"]: b for b in graph["blocks"]}
    assert blocks[""]["params"] == 325 and blocks[""]["flops"] == graph["totals"]["flops"]
    assert blocks["linear1"] == {"path": "linear1", "type": "torch.nn.modules.linear.Linear", "params": 220,
                                 "direct_params": 220, "buffers": 0, "flops": 400, "calls": 1, "skipped": None}


def test_write_graph_round_trips_through_json(tmp_path):
    graph = graph_of(MyModel(), torch.randn(1, 10), name="two-linear", target="m.py:MyModel")
    path = write_graph(graph, tmp_path / "graph.json")
    assert json.loads(path.read_text()) == graph
    assert graph["name"] == "two-linear" and graph["target"] == "m.py:MyModel"


def test_skipped_child_is_one_module_node_with_its_weights_and_flops():
    graph = graph_of(WithSkippedChild(), torch.randn(3, 4))
    node = next(n for n in graph["nodes"] if n["id"] == "block.NoSource")
    assert node["kind"] == "module" and node["op"] == "NoSource" and node["block_path"] == "block"
    assert node["params"] == 4 * 4 + 4 and node["flops"] == 2 * 3 * 4 * 4
    assert ("block.NoSource", "add") in edge_pairs(graph)
    assert graph["skipped"].keys() == {"block"}
