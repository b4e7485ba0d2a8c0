"""Behaviour of FLOP and parameter accounting: torch's own counter, charged op by op, tied weights once."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from nnschemaparser.inspection.flops import (
    FlopMeter,
    block_parameter_counts,
    count_forward_flops,
    count_parameters,
    format_count,
)
from nnschemaparser.inspection.inspector import ModelInspector
from tests.support.fixture_models import FIXTURES
from tests.support.inspection_models import WithSkippedChild


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.linear2 = nn.Linear(20, 5)

    def forward(self, x):
        return self.linear2(self.linear1(x).relu())


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.norm(self.embed(tokens)))


def torch_flops(model: nn.Module, inputs: dict) -> int:
    """The reference, counted here with FlopCounterMode directly around the eager forward."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(**{k: v.detach().clone() for k, v in inputs.items()})
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_op_flops_add_up_to_torch_count_of_the_eager_forward(name):
    model, inputs = FIXTURES[name]()
    model.eval()
    inspector = ModelInspector(model, example_kwargs=inputs)
    expected = torch_flops(model, inputs)
    assert expected > 0
    assert inspector.total_flops == expected
    assert sum(op.flops for op in inspector.ops) == expected
    assert inspector.flow.unattributed_flops == 0


def test_linear_ops_carry_their_own_flops():
    inspector = ModelInspector(TwoLinear(), example_inputs=(torch.randn(3, 10),))
    flops = {op.op_name: op.flops for op in inspector.ops}
    assert flops == {"linear1.linear": 2 * 3 * 10 * 20, "relu": 0, "linear2.linear": 2 * 3 * 20 * 5}


def test_flops_of_a_skipped_child_are_charged_to_its_module_op():
    inspector = ModelInspector(WithSkippedChild(), example_inputs=(torch.randn(3, 4),))
    child = inspector.op("block.NoSource")
    assert child.kind == "module"
    assert child.flops == 2 * 3 * 4 * 4
    assert inspector.total_flops == child.flops + inspector.op("head.linear").flops == 2 * 3 * 4 * (4 + 2)


def test_trace_listener_work_is_not_charged_to_ops():
    from nnschemaparser.traces.text_trace import TraceRecorder

    tracer = TraceRecorder()
    plain = ModelInspector(TwoLinear(), example_inputs=(torch.randn(3, 10),))
    traced = ModelInspector(plain.model, example_inputs=(torch.randn(3, 10),), listeners=[tracer])
    assert tracer.lines, "the extra listener saw the run"
    assert [op.op_name for op in traced.ops] == [op.op_name for op in plain.ops]
    assert [op.flops for op in traced.ops] == [op.flops for op in plain.ops]


def test_count_forward_flops_matches_flop_counter_and_leaves_state_alone():
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)).train()
    x = torch.randn(4, 6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops, result = count_forward_flops(model, (x,))
    assert flops == 2 * 4 * 6 * 6
    assert result.shape == (4, 6)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training


def test_flop_meter_reads_a_running_total():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with FlopMeter() as meter:
        assert meter.read() == 0
        a @ b
        first = meter.read()
        a @ b
    assert first == 2 * 4 * 5 * 6
    assert meter.total == 2 * first


def test_tied_weights_count_once_in_model_and_block_totals():
    model = TiedLM()
    embed, norm, head_bias = 10 * 4, 4 + 4, 10
    assert count_parameters(model) == embed + norm + head_bias
    blocks = block_parameter_counts(model)
    assert blocks[""] == embed + norm + head_bias
    assert blocks["embed"] == embed
    assert blocks["head"] == embed + head_bias


def test_trainable_only_leaves_out_frozen_parameters():
    model = TwoLinear()
    model.linear1.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 20 * 5 + 5
    assert count_parameters(model) == 10 * 20 + 20 + 20 * 5 + 5


def test_format_count_uses_metric_suffixes():
    assert format_count(325) == "325"
    assert format_count(13_400) == "13.4K"
    assert format_count(1_011_360) == "1.01M"
    assert format_count(1_800_000_000) == "1.8G"
