"""Control-flow constructs in forward, each in a tiny module, run through the schema and compared exactly.

Covers if/elif/else, for (range, containers, enumerate, zip, reversed, tuple targets), while,
break/continue, for/else and while/else; try, with, assert and the expression forms are in
test_statements_try_with_and_expressions.py.
"""

import pytest
import torch
from torch import nn

from tests.lowering.exactly import randn, run, seeded  # noqa: F401 (seeded: the autouse fixture)


# ---------------------------------------------------------------------------------------- if / elif


class IfElifElseOnTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        m = x.mean()
        if m > 1.0:
            y = self.lin(x) * 2
        elif m > 0.0:
            y = self.lin(x) + 1
        else:
            y = -self.lin(x)
        return y


@pytest.mark.parametrize("offset", [5.0, 0.5, -5.0], ids=["if", "elif", "else"])
def test_if_elif_else_takes_branch_chosen_by_tensor_value(offset):
    x = (torch.full((2, 4), offset) + 0.01 * torch.randn(2, 4)).requires_grad_()
    run(IfElifElseOnTensor(), x=x)


class IfOnPythonCondition(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.dim() == 3:
            x = x.sum(dim=1)
        if self.mode == "double":
            out = self.lin(x) * 2
        elif self.mode == "square":
            out = self.lin(x) ** 2
        else:
            out = self.lin(x)
        return out


@pytest.mark.parametrize("mode", ["double", "square", "plain"])
def test_if_elif_else_on_python_attribute(mode):
    run(IfOnPythonCondition(mode), x=randn(2, 3, 4))


class IfWithoutElseSkipped(nn.Module):
    def forward(self, x):
        y = x * 2
        if (x > 100).any():
            y = y * 0
        if x.shape[0] > 1:
            y = y + 1
        return y


def test_if_without_else_skips_body_when_false():
    run(IfWithoutElseSkipped(), x=randn(3, 2))


class NestedIf(nn.Module):
    def forward(self, x, flag: bool = True):
        if flag:
            if x.sum() > 0:
                return x * 3
            return x - 3
        return x


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_nested_if_with_early_returns(sign):
    x = (torch.rand(2, 3) * sign).requires_grad_()
    run(NestedIf(), x=x, flag=True)


# ---------------------------------------------------------------------------------------- for


class ForOverRange(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        for i in range(3):
            x = x + self.lin(x) * (i + 1)
        for j in range(6, 0, -2):
            x = x / j
        return x


def test_for_over_range_with_start_stop_step():
    run(ForOverRange(), x=randn(2, 3))


class ForOverContainers(nn.Module):
    def forward(self, x):
        acc = torch.zeros_like(x)
        for t in [x, x * 2, x.flip(0)]:
            acc = acc + t
        for t in (x.sin(), x.cos()):
            acc = acc * t
        parts = {"a": x, "b": x + 1}
        for key, value in parts.items():
            acc = acc + value if key == "a" else acc - value
        for key in parts:
            acc = acc + parts[key].mean()
        for value in parts.values():
            acc = acc * 0.5 + value
        return acc


def test_for_over_list_tuple_and_dict_items():
    run(ForOverContainers(), x=randn(3, 2))


class ForOverTensorRows(nn.Module):
    def forward(self, x):
        rows = []
        for row in x:
            rows.append(row * row.sum())
        return torch.stack(rows)


def test_for_over_tensor_iterates_first_dimension():
    run(ForOverTensorRows(), x=randn(4, 3))


class ForEnumerateZipReversed(nn.Module):
    def forward(self, x, y):
        acc = x.new_zeros(x.shape[0])
        for i, col in enumerate(x.unbind(1), start=1):
            acc = acc + col * i
        for a, b in zip(x.unbind(1), y.unbind(1)):
            acc = acc * 0.5 + a * b
        for t in reversed(list(x.unbind(1))):
            acc = acc * 0.9 + t
        return acc


def test_for_enumerate_zip_and_reversed():
    run(ForEnumerateZipReversed(), x=randn(2, 4), y=randn(2, 4))


class ForTupleTargets(nn.Module):
    def forward(self, x):
        pairs = [(x[0], x[1]), (x[2], x[3])]
        out = []
        for i, (a, b) in enumerate(pairs):
            out.append(a * b + i)
        for (a, b), c in zip(pairs, [2.0, 3.0]):
            out.append((a - b) * c)
        return torch.stack(out)


def test_for_nested_tuple_targets_unpack_each_item():
    run(ForTupleTargets(), x=randn(4, 3))


class ForLoopVariableAfterLoop(nn.Module):
    def forward(self, x):
        for i in range(4):
            x = x + 1
        for row in x:
            pass
        return x * i, row


def test_for_loop_variable_keeps_last_value_after_loop():
    run(ForLoopVariableAfterLoop(), x=randn(3, 2))


class NestedFor(nn.Module):
    def forward(self, x):
        out = x
        for i in range(2):
            for j in range(3):
                out = out + x * (i * 3 + j)
        return out


def test_nested_for_loops():
    run(NestedFor(), x=randn(2, 2))


# ---------------------------------------------------------------------------------------- while


class WhileOnTensor(nn.Module):
    def forward(self, x):
        y = x * 10
        steps = 0
        while y.abs().max() > 1:
            y = y / 2
            steps += 1
        return y, steps


def test_while_on_tensor_condition_halves_until_small():
    run(WhileOnTensor(), x=randn(3, 3))


class WhileCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        i = 0
        while i < 3:
            x = torch.tanh(self.lin(x))
            i += 1
        return x


def test_while_with_python_counter():
    run(WhileCounter(), x=randn(4, 2))


# ---------------------------------------------------------------------------------------- break / continue


class ForBreakOnTensor(nn.Module):
    def forward(self, x):
        y = x
        for i in range(10):
            y = y * 2
            if y.abs().max() > 8:
                break
        return y, i


def test_for_break_stops_at_tensor_condition():
    run(ForBreakOnTensor(), x=randn(2, 2))


class ForContinue(nn.Module):
    def forward(self, x):
        y = x
        for i in range(6):
            if i % 2:
                continue
            y = y + i
        acc = torch.zeros_like(x[0])
        for row in x:
            if row.sum() < 0:
                continue
            acc = acc + row
        return y, acc


def test_for_continue_skips_iterations_on_python_and_tensor_conditions():
    x = torch.tensor([[1.0, 2.0], [-3.0, 1.0], [0.5, 0.5], [-1.0, -1.0]], requires_grad=True)
    run(ForContinue(), x=x)


class WhileTrueBreak(nn.Module):
    def forward(self, x):
        n = 0
        while True:
            x = x * 1.5
            n += 1
            if n >= 3:
                break
        return x


def test_while_true_exits_through_break():
    run(WhileTrueBreak(), x=randn(2, 2))


class BreakInnerLoopOnly(nn.Module):
    def forward(self, x):
        out = x
        for i in range(3):
            for j in range(5):
                if j == 2:
                    break
                out = out + i * j + 1
        return out


def test_break_exits_only_inner_loop():
    run(BreakInnerLoopOnly(), x=randn(2, 2))


class WhileContinue(nn.Module):
    def forward(self, x):
        i = 0
        while i < 5:
            i += 1
            if i == 3:
                continue
            x = x * 1.1 + i
        return x


def test_while_continue_skips_rest_of_body():
    run(WhileContinue(), x=randn(2, 2))


# ---------------------------------------------------------------------------------------- for/else, while/else


class ForElse(nn.Module):
    def forward(self, x, limit: float):
        y = x
        for i in range(4):
            if y.sum() > limit:
                y = y * 0.5
                break
            y = y + 1
        else:
            y = y * 100
        return y


def test_for_else_runs_else_when_not_broken():
    run(ForElse(), x=torch.zeros(2, 2, requires_grad=True), limit=1000.0)


def test_for_else_skips_else_when_broken():
    run(ForElse(), x=torch.zeros(2, 2, requires_grad=True), limit=5.0)


class ForElseEmpty(nn.Module):
    def forward(self, x):
        for _ in []:
            x = x * 0
        else:
            x = x + 7
        return x


def test_for_else_on_empty_iterable_runs_else():
    run(ForElseEmpty(), x=randn(2))


class WhileElse(nn.Module):
    def forward(self, x, limit: float):
        y = x
        n = 0
        while n < 4:
            n += 1
            if y.abs().max() > limit:
                break
            y = y * 2
        else:
            y = -y
        return y, n


def test_while_else_runs_else_when_not_broken():
    run(WhileElse(), x=torch.full((2,), 0.5, requires_grad=True), limit=100.0)


def test_while_else_skips_else_when_broken():
    run(WhileElse(), x=torch.full((2,), 0.5, requires_grad=True), limit=1.5)
