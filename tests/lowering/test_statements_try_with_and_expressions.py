"""Exception handling, context managers and the expression forms of control flow, each in a tiny module,
run through the schema and compared exactly.

Covers try/except/else/finally, with-blocks (no_grad, autocast), assert, conditional expressions,
and/or short-circuit, chained comparisons, walrus and `self.training`. Split from
test_statements_control_flow.py, which keeps if/elif, for, while, break/continue and for/else.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.lowering.exactly import randn, run, seeded  # noqa: F401 (seeded: the autouse fixture)


def _boom(*args):
    raise AssertionError("this operand must never be evaluated")


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
