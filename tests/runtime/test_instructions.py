"""What the code generator reads off instructions before it writes (runtime/instructions.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.runtime.instructions import literal, quote, uses_frame
from nnschemaparser.schema.model import FunctionSchema, OpInstruction, VarRef


class Sneaky(str):
    def __repr__(self):
        return "__import__('os').system('exit 3')"


def test_quote_writes_plain_strings_only_so_no_file_puts_code_into_generated_text():
    assert quote("hidden_states") == "'hidden_states'"
    assert eval(quote("a'b\n\"c")) == "a'b\n\"c"  # noqa: S307 - the literal it writes
    for hostile in (Sneaky("x"), 3, b"x", None):
        with pytest.raises(TypeError, match="must be strings"):
            quote(hostile)


@pytest.mark.parametrize("value", [0, -1, 2 ** 63, 0.1, -0.0, 1e300, True, None, "text", (), (1, "a"), (2.5,), ...])
def test_a_literal_evaluates_to_an_equal_value_of_the_same_type(value):
    text = literal(value)
    assert text is not None
    back = eval(text)  # noqa: S307 - generated literals are plain Python
    assert type(back) is type(value) and back == value
    if isinstance(value, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2 ** 70, Sneaky("x"), [1], {"a": 1}, torch.float32,
                                   "x" * 300, tuple(range(20))])
def test_values_without_an_exact_literal_are_not_written_as_one(value):
    assert literal(value) is None


class Plain(nn.Module):
    def forward(self, x):
        y = x * 2
        return y + 1


class DefinesAClosure(nn.Module):
    def forward(self, x):
        scale = 2
        return [t * scale for t in x]


def test_a_plain_run_keeps_fast_locals_unless_the_function_needs_its_frame():
    plain = NNParser.parse_model(model=Plain(), inputs_tensors_values={"x": torch.ones(2)})
    closure = NNParser.parse_model(model=DefinesAClosure(), inputs_tensors_values={"x": torch.ones(2)})
    assert uses_frame(plain.signature, ()) is None
    assert uses_frame(closure.signature, ()) == "it defines a closure"
    reads_unbound = FunctionSchema(name="forward", params=["x"], body=[
        OpInstruction(out_var="y", target=abs, args=[VarRef("never_bound")])])
    assert uses_frame(reads_unbound, ()) == "it reads a variable it never binds"
    free = FunctionSchema(name="inner", params=[], free_vars=("outer_name",))
    assert uses_frame(free, ()) == "it has free variables"
