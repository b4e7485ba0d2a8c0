"""Regressions found while crash-fuzzing the lowering: code nested deeper than its recursion.

A 600-term sum is valid Python (CPython compiles it) but its left-deep tree is deeper than the
lowering's recursive descent, which used to escape as RecursionError. Now the lowering refuses it
with UnsupportedSyntaxError, so the parser re-dispatches that forward to the real module.
"""

import importlib.util
import sys

import pytest
import torch

from tests.support.exactness import assert_same_structure
from nnschemaparser import NNParser, SchemaInterpreter, UnsupportedSyntaxError
from nnschemaparser.lowering.statements import lower_source

TERMS = 600


def _deep_sum_source() -> str:
    return "def forward(self, x):\n    return " + " + ".join(["x"] * TERMS) + "\n"


def test_valid_but_too_deep_forward_is_refused_not_crashed():
    source = _deep_sum_source()
    compile(source, "<deep>", "exec")  # valid Python
    with pytest.raises(UnsupportedSyntaxError, match="too deeply"):
        lower_source(source, filename="<deep>")


def test_too_deep_forward_runs_as_the_real_module(tmp_path):
    path = tmp_path / "deep_model.py"
    path.write_text("from torch import nn\n\n\nclass Deep(nn.Module):\n"
                    + "".join("    " + line + "\n" for line in _deep_sum_source().splitlines()))
    spec = importlib.util.spec_from_file_location("deep_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["deep_model"] = module
    try:
        spec.loader.exec_module(module)
        model = module.Deep()
        x = torch.randn(2, 3)
        schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
        assert "too deeply" in schema.skip_reason
        assert_same_structure(model(x), SchemaInterpreter().call(schema, x=x))
    finally:
        sys.modules.pop("deep_model", None)


@pytest.mark.parametrize("source", ["def f(:\n", "x = 1\n", "def f(x):\n    return x\x00\n"])
def test_lower_source_refuses_what_is_not_a_function(source):
    with pytest.raises(UnsupportedSyntaxError):
        lower_source(source)
