"""The `.neurarch.json` file contract of the neurarch-trace seed: file name, shapes, vocabulary, scope, edges."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from nnschemaparser.inspection.cli import main
from nnschemaparser.inspection.inspector import ModelInspector
from nnschemaparser.inspection.neurarch_graph import NEURARCH_FORMAT, build_neurarch_graph
from nnschemaparser.inspection.neurarch_types import neurarch_params, neurarch_type

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.25)
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(x + self.drop(self.fc(x).relu()))


    class MyLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.custom = MyLinear(8, 8)
            self.head = nn.Linear(56, 3)
            self.spare = nn.Linear(2, 2)

        def forward(self, x, y):
            h = torch.flatten(self.conv(x), 2)[:, :, :8]
            for block in self.blocks:
                h = block(h)
            a, _ = self.attn(h, h, h)
            h = torch.cat([self.custom(a), y], dim=1)
            return self.head(h.flatten(1))


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x).relu())
''')


@pytest.fixture()
def models(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "neurarch_models.py"
    path.write_text(MODELS)
    return path


def graph_of(models: Path, name: str, *inputs: torch.Tensor, depth=None) -> dict:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("neurarch_models", models)
    module = importlib.util.module_from_spec(spec)
    sys.modules["neurarch_models"] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = getattr(module, name)().eval()
    return build_neurarch_graph(ModelInspector(model, example_inputs=inputs), name=name, depth=depth)


def net_graph(models: Path, batch: int = 2, depth=None) -> dict:
    torch.manual_seed(1)
    return graph_of(models, "Net", torch.randn(batch, 3, 6, 6), torch.randn(batch, 3, 8), depth=depth)


def by_id(graph: dict) -> dict:
    return {n["id"]: n for n in graph["nodes"]}


def edges(graph: dict) -> set:
    return {(e["source"], e["target"]) for e in graph["edges"]}


def test_without_o_the_graph_is_name_dot_neurarch_json_here_and_stderr_says_so(models, tmp_path, capsys):
    code = main([f"{models}:TwoLayer", "--input", "2,16"])
    captured = capsys.readouterr()
    assert code == 0
    path = tmp_path / "TwoLayer.neurarch.json"
    graph = json.loads(path.read_text())
    assert graph["format"] == NEURARCH_FORMAT and graph["name"] == "TwoLayer"
    assert "wrote TwoLayer.neurarch.json" in captured.err
    assert "neurarch.json" not in captured.out  # stdout keeps only the card


def test_shapes_are_written_without_the_batch_dimension(models):
    small, large = net_graph(models, batch=2), net_graph(models, batch=5)
    shapes = [(n["id"], n["inputShape"], n["outputShape"]) for n in small["nodes"]]
    assert shapes == [(n["id"], n["inputShape"], n["outputShape"]) for n in large["nodes"]]
    nodes = by_id(small)
    assert nodes["x"]["outputShape"] == [3, 6, 6] and nodes["y"]["outputShape"] == [3, 8]
    assert nodes["conv"]["outputShape"] == [4, 4, 4] and nodes["head"]["outputShape"] == [3]
    assert small["batchSize"] == 2 and large["batchSize"] == 5


def test_layers_are_typed_with_the_neurarch_vocabulary_and_their_hyperparameters(models):
    nodes = by_id(net_graph(models))
    assert nodes["conv"]["type"] == "conv2d"
    assert nodes["conv"]["params"] == {"inChannels": 3, "outChannels": 4, "kernelSize": [3, 3], "stride": [1, 1],
                                       "padding": [0, 0], "dilation": [1, 1], "groups": 1, "bias": True,
                                       "paddingMode": "zeros"}
    assert (nodes["blocks.0.fc"]["type"], nodes["blocks.0.fc"]["params"]) == (
        "linear", {"inFeatures": 8, "outFeatures": 8, "bias": True})
    assert (nodes["blocks.0.norm"]["type"], nodes["blocks.0.norm"]["params"]["normalizedShape"]) == ("layerNorm", [8])
    assert (nodes["blocks.1.drop"]["type"], nodes["blocks.1.drop"]["params"]) == ("dropout", {"p": 0.25})
    attn = nodes["attn"]
    assert attn["type"] == "multiHeadAttention" and attn["params"]["numHeads"] == 2
    assert "attn.out_proj" not in nodes  # a mapped layer is one node: its children are not descended


def test_a_module_the_table_does_not_know_is_a_custom_module_with_class_name_and_param_count(models):
    nodes = by_id(net_graph(models))
    # MyLinear derives from nn.Linear but changes forward: it is not guessed to be a linear
    assert nodes["custom"]["type"] == "customModule"
    assert nodes["custom"]["params"] == {"className": "MyLinear", "paramCount": 8 * 8 + 8}
    assert neurarch_type(nn.Bilinear(2, 3, 4)) == "bilinear"
    assert neurarch_params(nn.LSTM(4, 8, bias=False))["bias"] is False


def test_scope_is_the_dotted_path_of_the_parent_module(models):
    nodes = by_id(net_graph(models))
    assert nodes["blocks.0.fc"]["scope"] == "blocks.0" and nodes["blocks.1.norm"]["scope"] == "blocks.1"
    assert nodes["conv"]["scope"] == "" and nodes["blocks.0.add"]["scope"] == "blocks.0"
    assert all("scope" in n for n in nodes.values())


def test_residual_adds_are_add_nodes_and_concatenations_concatenate_nodes(models):
    graph = net_graph(models)
    nodes = by_id(graph)
    add = nodes["blocks.0.add"]
    assert add["type"] == "add" and add["params"]["inputs"] == 2
    assert {s for s, t in edges(graph) if t == "blocks.0.add"} == {"conv", "blocks.0.drop"}
    cat = nodes["cat"]
    assert cat["type"] == "concatenate" and cat["inputShapes"] == [[4, 8], [3, 8]] and cat["outputShape"] == [7, 8]
    assert {s for s, t in edges(graph) if t == "cat"} == {"custom", "y"}


def test_edges_follow_the_data_flow_through_functional_ops_and_dropout_is_spliced_in(models):
    graph = net_graph(models)
    got = edges(graph)
    # flatten/getitem and relu are invisible: conv feeds the first block's linear directly
    assert ("conv", "blocks.0.fc") in got
    # eval-mode dropout runs no op; it sits between the linear (through relu) and the residual add
    assert ("blocks.0.fc", "blocks.0.drop") in got and ("blocks.0.drop", "blocks.0.add") in got
    assert ("blocks.0.fc", "blocks.0.add") not in got
    assert ("blocks.1.norm", "attn") in got and ("head", "output") in got


def test_one_input_node_per_input_and_one_output_node(models):
    graph = net_graph(models)
    kinds = [n["type"] for n in graph["nodes"]]
    assert kinds.count("input") == 2 and kinds.count("output") == 1
    assert [n["id"] for n in graph["nodes"] if n["type"] == "input"] == ["x", "y"]
    assert graph["nodes"][-1]["type"] == "output"


def test_depth_records_the_modules_there_as_single_nodes(models):
    graph = net_graph(models, depth=1)
    nodes = by_id(graph)
    assert nodes["blocks.0"]["type"] == "customModule" and "blocks.0.fc" not in nodes
    assert nodes["blocks.0"]["params"]["paramCount"] == (8 * 8 + 8) + 2 * 8  # fc and norm
    assert ("blocks.0", "blocks.1") in edges(graph)
    whole = by_id(net_graph(models, depth=0))
    assert [n["type"] for n in whole.values()] == ["input", "input", "customModule", "output"]


def test_totals_are_torch_counts_and_unused_parameters_are_named(models):
    graph = net_graph(models)
    import sys

    model = sys.modules["neurarch_models"].Net().eval()
    torch.manual_seed(1)
    x, y = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 8)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x, y)
    assert graph["totals"]["params"] == sum(p.numel() for p in model.parameters())
    assert graph["totals"]["flops"] == counter.get_total_flops() > 0
    assert graph["unusedParams"] == ["spare.weight", "spare.bias"]


def test_activation_bytes_are_the_bytes_of_every_op_output_of_the_run(models):
    graph = graph_of(models, "TwoLayer", torch.randn(2, 16))
    # fc1 (2x32), relu (2x32), fc2 (2x4), float32
    assert graph["totals"]["activationBytes"] == (2 * 32 + 2 * 32 + 2 * 4) * 4
    assert graph["totals"]["largestActivationBytes"] == 2 * 32 * 4


def test_format_nnsp_keeps_the_richer_graph(models, tmp_path, capsys):
    code = main([f"{models}:TwoLayer", "--input", "2,16", "--format", "nnsp"])
    assert code == 0
    graph = json.loads((tmp_path / "TwoLayer.nnsp.json").read_text())
    assert graph["format"] == "nnschemaparser-graph/1"
    assert [n["id"] for n in graph["nodes"]] == ["input_0", "fc1.linear", "relu", "fc2.linear", "output"]
    assert not (tmp_path / "TwoLayer.neurarch.json").exists()


def test_hf_bert_layers_carry_the_scope_the_block_tools_group_by(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    code = main(["hf:bert", "-o", "bert.neurarch.json"])
    assert code == 0
    graph = json.loads((tmp_path / "bert.neurarch.json").read_text())
    nodes = by_id(graph)
    query = nodes["encoder.layer.0.attention.self.query"]
    assert query["type"] == "linear" and query["scope"] == "encoder.layer.0.attention.self"
    assert query["inputShape"] == [16, 32] and query["params"]["inFeatures"] == 32
    assert nodes["embeddings.word_embeddings"]["type"] == "embedding"
    assert [n["type"] for n in graph["nodes"]].count("input") == 1
    assert any(n["type"] == "add" for n in graph["nodes"])  # the residual adds of the encoder layers
