"""`never_tensor(instr)`: the instructions a counted or observed run does not test for a tensor result
are exactly ones that, when they run, bind something that is not a tensor."""

from __future__ import annotations

import operator

import torch

from nnschemaparser import SchemaInterpreter
from nnschemaparser.runtime.instructions import NOT_TENSOR_TYPES, never_tensor, walk_instructions
from nnschemaparser.runtime.listeners import TraceListener
from nnschemaparser.schema.model import OpInstruction, VarRef
from tests.support.debugger_models import llama_case


class _Every(TraceListener):
    every_instruction = True

    def __init__(self):
        self.bound: list = []

    def on_instruction(self, event):
        if event.has_value and event.instruction.out_var:
            self.bound.append((event.instruction, event.value))


def test_instructions_said_never_to_bind_a_tensor_bind_none_in_a_llama_run():
    model, inputs, schema = llama_case(2)
    listener = _Every()
    with torch.no_grad():
        SchemaInterpreter(listeners=[listener]).run(schema, dict(inputs))
    claimed = [(i, v) for i, v in listener.bound if never_tensor(i)]
    assert len(claimed) > 20  # the check below could fail: many instructions are claimed
    assert not [i for i, v in claimed if isinstance(v, torch.Tensor)]
    tensors = [i for i, v in listener.bound if isinstance(v, torch.Tensor)]
    assert tensors and not any(never_tensor(i) for i in tensors)
    total = sum(1 for b in schema.iter_blocks() if b.signature is not None
                for i in walk_instructions(b.signature.body) if never_tensor(i))
    assert total > 0


def test_an_instruction_reading_a_variable_or_a_live_binding_may_bind_a_tensor():
    neg = OpInstruction(out_var="y", target=operator.neg, args=[VarRef("x")])
    assert not never_tensor(neg)  # -x of a tensor is a tensor
    assert never_tensor(OpInstruction(out_var="y", target=operator.neg, args=[1]))
    assert never_tensor(OpInstruction(out_var="y", target=operator.is_not, args=[VarRef("x"), None]))
    assert not never_tensor(OpInstruction(out_var="y", target=operator.getitem, args=[VarRef("x"), 0]))
    assert not never_tensor(OpInstruction(out_var="y", target=VarRef("f"), args=[]))


def test_no_type_said_never_to_be_a_tensor_is_a_tensor_type():
    assert not any(issubclass(kind, torch.Tensor) for kind in NOT_TENSOR_TYPES)
    assert type(torch.zeros(1)) not in NOT_TENSOR_TYPES and torch.nn.Parameter not in NOT_TENSOR_TYPES
