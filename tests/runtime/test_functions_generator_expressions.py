"""Regressions found by differential fuzzing: generator expressions are lazy, as in CPython.

The schema used to build a generator expression's whole list first, so an element after the one
that decides `any`/`all`/`next`/`zip` was computed anyway, and its error escaped (seeds 147, 162,
227, 754). Each model is a minimized fuzz program or the construct it exercised.
(Seed numbers name programs of the fuzz generator as it was when each bug was found.)
"""

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike


class AnyStopsAtFirstTrue(nn.Module):
    """Seed 147: the third element indexes past the end; `any` never asks for it."""

    def forward(self, x):
        return any(x[j].sum() > -100 for j in range(3))


class AllStopsAtFirstFalse(nn.Module):
    """Seed 162: the second element divides by zero."""

    def forward(self, x):
        return all(x.sum() < -100 and 10 // (1 - j) > 3 for j in range(3))


class NextTakesOneElement(nn.Module):
    def forward(self, x):
        rows = (x[j] * 2 for j in range(5))
        return next(rows), next(rows)


class ZipStopsAtShortestInput(nn.Module):
    def forward(self, x):
        return sum(a.sum() for a, _ in zip([x], (x[j] for j in range(4))))


class CaughtErrorFromLaterElement(nn.Module):
    """Seed 754: an error the eager forward never raises must not reach an `except LookupError`."""

    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        try:
            if all(x.mean() > -100 and x[j].sum() > -100 for j in range(2)):
                self.steps += 1
        except LookupError:
            x = x * 0
        return x


class FreeVariableReadWhenConsumed(nn.Module):
    """Late binding: the generator reads `scale` when an element is computed, not when it is made."""

    def forward(self, x):
        scale = 2
        values = (scale * row for row in x)
        scale = 3
        return list(values)


class WalrusInsideGeneratorBindsOutside(nn.Module):
    def forward(self, x):
        found = any((last := row).sum() > 100 for row in x)
        return found, last


class FirstIterableIsCheckedAtOnce(nn.Module):
    """CPython calls iter() on the first iterable when the generator is made."""

    def forward(self, x):
        try:
            values = (v for v in 5)  # noqa: F841 - iter(5) raises first
            made = True
        except TypeError:
            made = False
        return made, x


class StopIterationInsideBecomesRuntimeError(nn.Module):
    def forward(self, x):
        empty = iter([])
        return list(next(empty) for _ in range(2))


@pytest.mark.parametrize("model_class", [
    AnyStopsAtFirstTrue, AllStopsAtFirstFalse, NextTakesOneElement, ZipStopsAtShortestInput,
    CaughtErrorFromLaterElement, FreeVariableReadWhenConsumed, WalrusInsideGeneratorBindsOutside,
    FirstIterableIsCheckedAtOnce, StopIterationInsideBecomesRuntimeError,
], ids=lambda cls: cls.__name__)
def test_generator_expression_computes_elements_on_demand(model_class):
    assert_schema_matches_eager_or_raises_alike(model_class(), {"x": torch.arange(8.0).view(2, 4)})
