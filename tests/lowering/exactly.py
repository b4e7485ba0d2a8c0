"""What the lowering tests of single constructs share: the RNG seeded before each test, inputs that take
gradients, and the exact comparison of a model's schema run with eager (outputs and gradients).

A test module takes all three with `from tests.lowering.exactly import randn, run, seeded`: importing
the autouse fixture `seeded` is what makes pytest run it before each test of that module.
"""

import pytest
import torch

from tests.support.exactness import assert_schema_matches_eager

__all__ = ["seeded", "randn", "run"]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def randn(*shape, requires_grad=True):
    return torch.randn(*shape).requires_grad_(requires_grad)


def run(model, train=False, **inputs):
    return assert_schema_matches_eager(model, inputs, train=train)
