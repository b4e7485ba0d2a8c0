"""Crash fuzzing in CI: arbitrary valid Python as a forward body lowers or is refused, never crashes."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnschemaparser.schema.errors import UnsupportedSyntaxError
from nnschemaparser.lowering.statements import lower_source
from nnschemaparser.schema.model import FunctionSchema

from .lowering_crash import forward_source, lower_outcome, python_sources

try:
    import hypothesmith  # noqa: F401
except ImportError:  # the `test` extra is not installed
    hypothesmith = None


@pytest.mark.skipif(hypothesmith is None, reason="crash fuzzing needs hypothesmith (the `test` extra)")
@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(python_sources() if hypothesmith is not None else st.nothing())
def test_arbitrary_python_lowers_or_is_refused(module_source):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = forward_source(module_source)
    if source is None:
        return
    verdict, detail = lower_outcome(source)
    assert verdict != "internal_error", f"{source}\n{detail}"


@pytest.mark.parametrize("body", [
    "yield from x",
    "global G\n    G = 1",
    "from os import *",
    "async def inner():\n        return 1",
    "class Local:\n        pass",
    "match x:\n        case 1:\n            pass",
])
def test_unsupported_constructs_are_refused_with_a_location(body):
    with pytest.raises(UnsupportedSyntaxError, match=r"<fuzz>:\d+: "):
        lower_source(f"def forward(self, x):\n    {body}\n", filename="<fuzz>")


def test_supported_body_lowers_to_a_function_schema():
    schema = lower_source("def forward(self, x):\n    y = [v * 2 for v in x]\n    return y\n")
    assert isinstance(schema, FunctionSchema) and schema.params == ["self", "x"]


def test_forward_source_keeps_an_odd_layout_when_it_compiles():
    source = forward_source("a = (1 +\n  2)\n")
    assert source == "def forward(self, x):\n    a = (1 +\n      2)\n\n    pass\n"


def test_forward_source_gives_up_on_what_cannot_be_a_function_body():
    assert forward_source("from __future__ import annotations\n") is None
