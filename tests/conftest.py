"""Fixtures shared by the tests of several stages: the models more than one stage's tests run.

The models and helpers themselves are modules of tests/support/; a test that needs them when its
module is imported (to parametrize over the ten fixture architectures, say) imports them from there,
as the existing tests do: `from tests.support.fixture_models import FIXTURES`. A test that only
needs one inside its body can ask for it by fixture name instead:

- `fixture_architectures`: the ten fixture architectures of tests/support/fixture_models.py, name ->
  factory returning `(model, inputs)` (run by the parser, traces, inspection, files and widget tests);
- `quickstart_mlp`: the quick start's MLP at the sizes of its trace example, `(model, x, schema)`
  (tests/support/trace_models.py's `spec_mlp`; run by the traces and runtime tests).

Stage folders may add their own conftest.py for fixtures of that stage alone.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def fixture_architectures():
    """The ten fixture architectures: name -> a factory returning a fresh `(model, inputs)`."""
    from tests.support.fixture_models import FIXTURES  # imported when asked for, not at collection

    return dict(FIXTURES)


@pytest.fixture
def quickstart_mlp():
    """A fresh quick-start MLP, its input `x` (2, 16) and its parsed schema: `(model, x, schema)`."""
    from tests.support.trace_models import spec_mlp

    return spec_mlp()
