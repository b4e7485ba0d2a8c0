"""Regressions found by differential fuzzing: operands read variables in CPython's order.

The schema read a variable operand when the consuming instruction ran, after the later operands
were computed. So `k + bump()` saw the value `bump()` wrote through `nonlocal`, `h + (h := ...)`
the walrus's value, and `h * x[5]` with `h` unbound reported the IndexError instead of CPython's
UnboundLocalError (seed 150). Now a fragile variable read is copied first; ordinary reads keep the
plain schema.
(Seed numbers name programs of the fuzz generator as it was when each bug was found.)
"""

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike
from nnschemaparser import NNParser, OpInstruction


class ReadsBeforeClosureRebinds(nn.Module):
    def forward(self, x):
        k = 1

        def bump():
            nonlocal k
            k += 10
            return k

        return (x * (k + bump()), [k, bump()], {"a": k, "b": bump()}, f"{k}-{bump()}", k < bump() < k + 100,
                max(k, bump()))


class ReadsBeforeWalrusRebinds(nn.Module):
    def forward(self, x):
        h = x
        return h + (h := h * 2), h


class UnboundBeforeFailingOperand(nn.Module):
    """Seed 150, minimized: which error a forward raises depends on which operand is read first."""

    def forward(self, x, case: int):
        if x.sum() > 100:
            h = x
            f = torch.relu
        if case == 0:
            return h * (x[5] > 0)
        if case == 1:
            h += x[5]
        if case == 2:
            return f(x[5])
        if case == 3:
            return h[x[7]]
        if case == 4:
            return h, x[7]
        if case == 5:
            return [h, x[7]]
        return {"h": h, "x": x[7]}


def test_closure_rebinding_does_not_change_an_operand_already_read():
    assert_schema_matches_eager_or_raises_alike(ReadsBeforeClosureRebinds(), {"x": torch.ones(2)})


def test_walrus_rebinding_does_not_change_an_operand_already_read():
    assert_schema_matches_eager_or_raises_alike(ReadsBeforeWalrusRebinds(), {"x": torch.ones(2)})


@pytest.mark.parametrize("case", range(7))
def test_unbound_operand_fails_before_later_operands_run(case):
    assert_schema_matches_eager_or_raises_alike(UnboundBeforeFailingOperand(), {"x": torch.ones(2, 4),
                                                                                "case": case})


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        residual = x
        hidden = self.lin(x)
        return residual + self.lin(hidden)


def test_ordinary_reads_are_not_copied():
    schema = NNParser.parse_model(Residual(), resolve=False)
    copies = [i for i in schema.body
              if isinstance(i, OpInstruction) and i.style == "value" and i.out_var.startswith("$")]
    assert copies == []
