"""Regressions found by differential fuzzing: zero-argument super() outside the method's own body.

On Python 3.11 a comprehension, lambda or nested def is a function of its own, so `super()` in it
binds that function's first argument and eager raises TypeError; the schema resolved it as the
method's super() and returned a value. Such a forward is now refused and runs as the real module.
A bare `super()` kept in a variable (in the method itself) is lowered to `super(Class, self)`.
"""

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike
from nnschemaparser import NNParser


class Base(nn.Module):
    def scale_by(self, t, k=2):
        return t * k


class SuperInComprehension(Base):
    def forward(self, x):
        return [super().scale_by(u) for u in [x, x]]


class SuperInLambda(Base):
    def forward(self, x):
        scale = lambda t: super().scale_by(t)  # noqa: E731
        return scale(x)


class SuperInNestedDef(Base):
    def forward(self, x):
        def scale(t):
            return super().scale_by(t)

        return scale(x)


class SuperKeptInVariable(Base):
    def scale_by(self, t, k=3):
        return t - k

    def forward(self, x):
        parent = super()
        return parent.scale_by(x), self.scale_by(x)


@pytest.mark.parametrize("model_class", [SuperInComprehension, SuperInLambda, SuperInNestedDef],
                         ids=lambda cls: cls.__name__)
def test_super_in_nested_scope_runs_as_the_real_module(model_class):
    outcome = assert_schema_matches_eager_or_raises_alike(model_class(), {"x": torch.ones(2, 4)})
    assert outcome.eager_error is not None and outcome.eager_error.startswith("TypeError: super(type, obj)")
    assert NNParser.parse_model(model_class(), resolve=False).skip_reason is not None


def test_bare_super_in_method_binds_the_defining_class_and_self():
    assert_schema_matches_eager_or_raises_alike(SuperKeptInVariable(), {"x": torch.ones(2, 4)})
    assert NNParser.parse_model(SuperKeptInVariable(), resolve=False).skip_reason is None
