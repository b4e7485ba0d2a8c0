"""Behaviour of the card: a fixed-width box naming the model, its size, cost, blockers and memory."""

from __future__ import annotations

import torch
from torch import nn

from nnschemaparser.inspection.card import format_bytes, format_card
from nnschemaparser.inspection.inspector import ModelInspector
from tests.support.inspection_models import WithSkippedChild


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.linear2 = nn.Linear(20, 5)

    def forward(self, x):
        return self.linear2(self.linear1(x))


def test_card_names_the_model_its_size_cost_and_input():
    card = format_card(ModelInspector(TwoLinear(), example_inputs=(torch.randn(2, 10),)), source="m.py",
                       matches_eager=True)
    lines = card.splitlines()
    assert lines[0] == "+" + "-" * 66 + "+" and lines[-1] == lines[0]
    assert all(len(line) == 68 for line in lines)
    assert lines[1].startswith("| TwoLinear") and lines[1].endswith("m.py |")
    assert "3 modules, 325 params, 1.2K FLOPs at x: 2x10 float32" in lines[2]
    assert "| Runs         yes, end to end; output equals eager bit for bit" in card
    assert "| Blockers     none" in card


def test_card_lists_skipped_children_as_blockers_without_their_file_prefix():
    card = format_card(ModelInspector(WithSkippedChild(), example_inputs=(torch.randn(3, 4),)))
    lines = card.splitlines()
    start = next(i for i, line in enumerate(lines) if "Blockers" in line)
    blocker = " ".join(line[15:-2].strip() for line in lines[start:start + 3])
    assert blocker.startswith("block: cannot read the source of NoSource.forward")
    assert "<generated>" in blocker and ".py:" not in blocker
    assert all(len(line) == 68 for line in lines)


def test_card_says_when_the_output_differs_from_eager():
    card = format_card(ModelInspector(TwoLinear(), example_inputs=(torch.randn(2, 10),)), matches_eager=False)
    assert "output differs from eager" in card


def test_card_reports_activation_memory_of_op_outputs():
    inspector = ModelInspector(TwoLinear(), example_inputs=(torch.randn(2, 10),))
    expected = (2 * 20 + 2 * 5) * 4
    assert f"Activations  {format_bytes(expected)}" in format_card(inspector)
    assert format_bytes(180) == "180 B" and format_bytes(1536) == "1.5 KB" and format_bytes(3 * 1024 ** 2) == "3.0 MB"
