"""Control-flow constructs in forward, each in a tiny module, run through the schema and compared exactly.

Covers if/elif/else, for (range, containers, enumerate, zip, reversed, tuple targets), while,
break/continue, for/else and while/else, try/except/else/finally, with-blocks (no_grad, autocast),
assert, conditional expressions, and/or short-circuit, chained comparisons, walrus, `self.training`.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.exactness import assert_schema_matches_eager


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(*shape, requires_grad=True):
    return torch.randn(*shape).requires_grad_(requires_grad)


def run(model, train=False, **inputs):
    return assert_schema_matches_eager(model, inputs, train=train)


def _boom(*args):
    raise AssertionError("this operand must never be evaluated")


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


# ---------------------------------------------------------------------------------------- try


class TryExceptMatmul(nn.Module):
    def forward(self, x):
        try:
            y = torch.matmul(x, x)  # (2, 3) @ (2, 3): shape mismatch
        except RuntimeError:
            y = x @ x.t()
        return y


def test_try_except_catches_matmul_shape_mismatch():
    run(TryExceptMatmul(), x=randn(2, 3))


class TryExceptAs(nn.Module):
    def forward(self, x):
        try:
            y = torch.matmul(x, x)
        except (ValueError, RuntimeError) as err:
            failed = isinstance(err, RuntimeError)
            y = x * 2 if failed else x
        return y


def test_try_except_as_binds_the_exception():
    run(TryExceptAs(), x=randn(2, 3))


class TryElseFinally(nn.Module):
    def forward(self, x):
        log = []
        try:
            y = torch.matmul(x, x.t())
        except RuntimeError:
            y = x
            log.append("except")
        else:
            y = y + 1
            log.append("else")
        finally:
            log.append("finally")
        return y * len(log), log


def test_try_else_runs_when_no_exception():
    run(TryElseFinally(), x=randn(2, 3))


class TryElseSkipped(nn.Module):
    def forward(self, x):
        log = []
        try:
            y = torch.matmul(x, x)
        except RuntimeError:
            y = x.sum(0)
            log.append("except")
        else:
            y = y * 100
            log.append("else")
        finally:
            y = y + 1
            log.append("finally")
        return y, log


def test_try_else_skipped_and_finally_runs_when_exception_caught():
    run(TryElseSkipped(), x=randn(2, 3))


class FinallyOnReturn(nn.Module):
    def _scaled(self, x, log):
        try:
            return x * 2
        finally:
            log.append("cleanup")

    def forward(self, x):
        log = []
        y = self._scaled(x, log)
        return y + len(log)


def test_finally_runs_on_return():
    run(FinallyOnReturn(), x=randn(3))


class FinallyOnBreak(nn.Module):
    def forward(self, x):
        cleanups = 0
        for i in range(5):
            try:
                x = x + 1
                if i == 2:
                    break
            finally:
                cleanups += 1
        return x * cleanups


def test_finally_runs_on_break():
    run(FinallyOnBreak(), x=randn(3))


class FinallyOnContinue(nn.Module):
    def forward(self, x):
        cleanups = 0
        for i in range(4):
            try:
                if i % 2 == 0:
                    continue
                x = x * 2
            finally:
                cleanups += 1
        return x + cleanups


def test_finally_runs_on_continue():
    run(FinallyOnContinue(), x=randn(3))


class RaiseCaught(nn.Module):
    def forward(self, x):
        try:
            if x.shape[-1] != 4:
                raise ValueError(f"expected 4 features, got {x.shape[-1]}")
            y = x
        except ValueError as err:
            y = F.pad(x, (0, 4 - x.shape[-1])) if "expected" in str(err) else x
        return y


def test_explicit_raise_in_try_is_caught():
    run(RaiseCaught(), x=randn(2, 3))


class NestedTryReraise(nn.Module):
    def forward(self, x):
        path = []
        try:
            try:
                y = x[10]
            except IndexError:
                path.append("inner")
                raise
        except IndexError:
            path.append("outer")
            y = x[-1]
        return y * len(path)


def test_reraise_in_inner_except_is_caught_by_outer():
    run(NestedTryReraise(), x=randn(3, 2))


class TryInLoop(nn.Module):
    def forward(self, x):
        results = []
        failures = 0
        for other in (x, x.t(), x[:, :2]):
            try:
                results.append(torch.matmul(x, other))
            except RuntimeError:
                failures += 1
        return results, failures


def test_try_except_inside_loop_collects_successes():
    run(TryInLoop(), x=randn(3, 2))


# ---------------------------------------------------------------------------------------- with


class NoGradBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            stats = self.lin(x).mean(dim=0, keepdim=True)
            frozen = x * 2
        y = self.lin(x) - stats
        return y, frozen, stats.requires_grad


def test_no_grad_block_cuts_the_gradient_path():
    run(NoGradBlock(), x=randn(3, 4))


class AutocastBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.lin(x)
            h = F.relu(h)
            low = h.dtype
        y = self.out(h.float())
        return h, y, str(low)


def test_autocast_bfloat16_block_then_float32_after():
    run(AutocastBlock(), x=randn(3, 4))


class NestedWith(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            base = x.sum()
            with torch.enable_grad():
                y = self.lin(x) * 2
        return y + base


def test_enable_grad_nested_in_no_grad():
    run(NestedWith(), x=randn(2, 4))


# ---------------------------------------------------------------------------------------- assert


class AssertPasses(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        assert x.dim() == 2, f"expected a 2-D input, got {x.dim()}-D"
        assert x.shape[-1] == self.lin.in_features
        assert (x.abs() >= 0).all(), "tensor-valued assert"
        return self.lin(x)


def test_assert_that_passes_does_not_change_result():
    run(AssertPasses(), x=randn(3, 4))


# ---------------------------------------------------------------------------------------- conditional expressions


class ConditionalExpression(nn.Module):
    def __init__(self, mode="a"):
        super().__init__()
        self.mode = mode
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x) * 2 if x.sum() > 0 else self.lin(x) - 1
        z = y.exp() if self.mode == "a" else y.sin() if self.mode == "b" else y.cos()
        w = x if x.dim() == 2 else _boom(x)
        return y, z, w


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_conditional_expression_on_tensor_value(sign):
    run(ConditionalExpression(), x=(torch.rand(2, 3) * sign).requires_grad_())


@pytest.mark.parametrize("mode", ["a", "b", "c"])
def test_nested_conditional_expression_on_python_value(mode):
    run(ConditionalExpression(mode), x=randn(2, 3))


# ---------------------------------------------------------------------------------------- and / or


class AndShortCircuit(nn.Module):
    def _record(self, calls):
        calls.append(1)
        return True

    def forward(self, x):
        calls = []
        wide = x.shape[0] > 100 and self._record(calls)
        if x.shape[0] > 100 and _boom(x):
            x = x * 0
        return x * (1 + len(calls)), wide


def test_and_short_circuit_skips_right_operand():
    run(AndShortCircuit(), x=randn(2, 2))


class OrShortCircuit(nn.Module):
    def forward(self, x):
        calls = []
        ok = x.shape[0] > 0 or calls.append("evaluated")
        y = x if x.dim() == 2 or _boom(x) else x * 0
        return y * (1 + len(calls)), ok


def test_or_short_circuit_skips_right_operand():
    run(OrShortCircuit(), x=randn(2, 2))


class AndOrValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = None
        self.names = []

    def forward(self, x):
        scale = self.scale or 3.0
        prefix = self.names and self.names[0]
        width = x.shape[0] and x.shape[1]
        extra = None
        t = extra or x
        return t * scale * width, prefix


def test_and_or_return_operand_values_not_bools():
    run(AndOrValues(), x=randn(2, 3))


class AndOrOnTensors(nn.Module):
    def forward(self, x):
        if x.sum() > 0 and x.max() < 10:
            y = x * 2
        else:
            y = x
        if x.min() > 5 or x.mean() < 0:
            y = y + 1
        if not (x < -100).any():
            y = y * 3
        return y


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_and_or_not_on_tensor_conditions(sign):
    run(AndOrOnTensors(), x=(torch.rand(2, 3) * sign).requires_grad_())


# ---------------------------------------------------------------------------------------- chained comparisons


class ChainedComparisons(nn.Module):
    def _count(self, calls, value):
        calls.append(value)
        return value

    def forward(self, x):
        calls = []
        y = x
        if 0 < x.shape[0] <= 4 < x.shape[1]:
            y = y * 2
        if -1 < x.mean() < 1:
            y = y + 1
        if 0 < self._count(calls, x.shape[0]) < 10:
            y = y * 3
        if 0 > 1 < _boom():
            y = y * 0
        return y * len(calls)


def test_chained_comparison_evaluates_middle_once_and_short_circuits():
    run(ChainedComparisons(), x=torch.rand(3, 5, requires_grad=True))


# ---------------------------------------------------------------------------------------- walrus


class WalrusInIf(nn.Module):
    def forward(self, x):
        if (m := x.abs().max()) > 0.5:
            y = x / m
        else:
            y = x
        n = 4
        while (n := n - 1) > 0:
            y = y * 1.5
        return y, m, n


def test_walrus_in_if_and_while_conditions():
    run(WalrusInIf(), x=randn(3, 3))


class WalrusInComprehension(nn.Module):
    def forward(self, x):
        doubled = [last := row * 2 for row in x]
        kept = [s for row in x if (s := row.sum()) > 0]
        return torch.stack(doubled), last, kept


def test_walrus_in_comprehension_binds_enclosing_scope():
    x = torch.tensor([[1.0, 2.0], [-3.0, 1.0], [0.5, 0.5]], requires_grad=True)
    run(WalrusInComprehension(), x=x)


# ---------------------------------------------------------------------------------------- self.training


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.noise = 0.1

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            y = y + torch.randn_like(y) * self.noise
            y = F.dropout(y, p=0.5, training=self.training)
        else:
            y = y * 0.5
        if self.training and self.noise > 0:
            y = y + 1
        return y


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_self_training_branch_follows_mode(train):
    run(TrainingBranch(), train=train, x=randn(3, 4))
