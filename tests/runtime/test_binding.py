"""Regressions found by differential fuzzing: a call with the wrong arguments fails as in CPython.

The schema binds the arguments of forwards, methods, closures and lambdas itself; its TypeErrors
must read exactly like CPython's (the function's __qualname__, `self` counted for methods, "from 1
to 2 positional arguments", "missing 1 required keyword-only argument", ...; seeds 163, 256, 261,
1635, 1995), and a model catching one must see the same text.
(Seed numbers name programs of the fuzz generator as it was when each bug was found.)
"""

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike


class Child(nn.Module):
    def forward(self, x):
        return x + 1


class WrongCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.child = Child()

    def helper(self, a, *rest, scale=1.0, **opts):
        return a * scale

    def forward(self, x, case: int):
        def f(a, b, c=1, *, k, m=2):
            return a

        def h(a, b, c, d):
            return a

        def kw_only(a, *, k):
            return a

        g = lambda t: t  # noqa: E731
        made = [lambda t, i=i: t * i for i in range(2)]
        calls = [
            lambda: f(x),
            lambda: f(x, x, x, x, k=1),
            lambda: g(),
            lambda: g(x, x),
            lambda: f(x, x),
            lambda: h(),
            lambda: f(x, b=x, a=x, k=1),
            lambda: g(x, zz=1),
            lambda: kw_only(x, x, k=1),
            lambda: kw_only(x, x),
            lambda: h(x, x, x, x, x),
            lambda: g(x, x, zz=2),
            lambda: self.lin(x, x),
            lambda: self.child(x, x),
            lambda: self.child(x=x, y=x),
            lambda: self.helper(),
            lambda: self.helper(x, a=x),
            lambda: made[0](x, x, x),
            lambda: made[1](x, zz=x),
        ]
        return calls[case]()


@pytest.mark.parametrize("case", range(19))
def test_wrong_call_raises_cpython_type_error(case):
    assert_schema_matches_eager_or_raises_alike(WrongCalls(), {"x": torch.ones(2, 4), "case": case})


class CatchesTheMessage(nn.Module):
    def forward(self, x):
        scale = lambda t, k=2: t * k  # noqa: E731
        try:
            return scale(x, 1, 2)
        except TypeError as error:
            return str(error)


def test_caught_binding_error_has_cpython_text():
    assert_schema_matches_eager_or_raises_alike(CatchesTheMessage(), {"x": torch.ones(2)})
