"""Regressions found by differential fuzzing: reading a variable that holds no value.

CPython raises UnboundLocalError for a local and NameError for a free variable of a closure or
comprehension; the schema used to leak the KeyError of its frame dict, which an `except KeyError`
in the model would even catch. Each model is a minimized fuzz program (seed in the docstring).
(Seed numbers name programs of the fuzz generator as it was when each bug was found.)
"""

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike


class ReadAfterUntakenBranch(nn.Module):
    """Seed 7: `h` is bound only in a branch the input does not take."""

    def forward(self, x):
        if x.sum() > 100:
            h = x * 2
        return h + 1


class InPlaceMethodOnUnbound(nn.Module):
    """Seed 1153: a method call on the unbound name (the runtime fuses getattr and call)."""

    def forward(self, x):
        if x.sum() > 100:
            h = x * 2
        h.tanh_()
        return x


class ReadAfterDelete(nn.Module):
    def forward(self, x):
        h = x + 1
        del h
        return h  # noqa: F821 - deleted on purpose


class CaughtAsNameError(nn.Module):
    """The handler that catches it is NameError's, and a KeyError handler must not see it."""

    def forward(self, x):
        try:
            if x.sum() > 100:
                h = x
            y = h * 2
        except KeyError:
            y = x - 1
        except NameError as error:
            y = x + len(str(error))
        return y


class ClosureReadsUnboundFreeVariable(nn.Module):
    def forward(self, x):
        def inner(t):
            return t + later

        y = inner(x) if x.sum() > 100 else x
        out = inner(x)
        later = 1
        return out, y


class ComprehensionReadsUnboundLocal(nn.Module):
    def forward(self, x):
        if x.sum() > 100:
            scale = 2
        return [v * scale for v in x]


class FinallyRebindsAfterUnboundRead(nn.Module):
    """Seed 6097: the read fails in an `else` body, then the outer `finally` binds the name again."""

    def forward(self, x):
        try:
            pass
        except LookupError:
            pass
        else:
            try:
                x = x * 2
            except ZeroDivisionError:
                pass
            else:
                del x
            finally:
                y = x > 0
        finally:
            x = 1
        return y


class DictLookupKeyErrorStaysKeyError(nn.Module):
    """A KeyError of the model's own dict, named like a local, is not mistaken for an unbound read."""

    def forward(self, x):
        h = x
        table = {"a": x}
        if x.sum() > 100:
            g = h  # noqa: F841 - binds `g`, never read
        return table["g"]


class BoundOnlyAfterAReturn(nn.Module):
    """A name bound only in code after a `return` is still a local of the function: reading it
    raises UnboundLocalError, not a NameError for a missing global (the fuzzer's seed 202612337,
    found when plain runs moved to fast locals)."""

    def forward(self, x):
        if x.sum() > 100:
            return x
            late = x * 2  # noqa: F841 - never runs
        return late  # noqa: F821


@pytest.mark.parametrize("model_class", [
    BoundOnlyAfterAReturn, ReadAfterUntakenBranch, InPlaceMethodOnUnbound, ReadAfterDelete, CaughtAsNameError,
    ClosureReadsUnboundFreeVariable, ComprehensionReadsUnboundLocal, FinallyRebindsAfterUnboundRead,
    DictLookupKeyErrorStaysKeyError,
], ids=lambda cls: cls.__name__)
def test_unbound_variable_raises_what_cpython_raises(model_class):
    assert_schema_matches_eager_or_raises_alike(model_class(), {"x": torch.ones(2, 4)})
