"""`Program`: the cache of compiled functions of one schema, invokers and dispatch (runtime/program.py)."""

from __future__ import annotations

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter
from nnschemaparser.runtime.program import Program, programs_for
from nnschemaparser.runtime import codegen


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x).relu())


def _parsed():
    model = Stack().eval()
    x = torch.randn(2, 4)
    return model, x, NNParser.parse_model(model=model, inputs_tensors_values={"x": x})


def test_a_schema_has_one_plain_program_whose_compiled_functions_are_reused_run_after_run():
    model, x, schema = _parsed()
    interpreter = SchemaInterpreter()
    assert torch.equal(interpreter.run(schema, {"x": x})[0], model(x))
    program = programs_for(schema)["plain"]
    units = dict(program.units)
    assert torch.equal(interpreter.run(schema, {"x": x})[0], model(x))
    assert programs_for(schema)["plain"] is program and program.units == units


def test_a_child_is_compiled_at_its_first_call_not_before():
    _, x, schema = _parsed()
    program = Program(schema)
    program.unit(schema)  # the root's function, which calls both children
    assert set(program.units) == {id(schema)}
    program.run_root({"x": x})
    assert set(program.units) == {id(schema), id(schema.sub_blocks["first"]), id(schema.sub_blocks["second"])}


def test_identical_children_compile_once_into_code_objects_of_their_own_and_keep_their_own_weights():
    model, x, schema = _parsed()
    program = Program(schema)
    program.run_root({"x": x})
    first = program.unit(schema.sub_blocks["first"])
    second = program.unit(schema.sub_blocks["second"])
    assert first.source == second.source
    assert len([key for key in codegen._CODE_CACHE if key[0] == first.source]) == 1  # compiled once
    # each its own code object (CPython specializes global reads per code object and globals dict)
    assert first.function.__code__ is not second.function.__code__
    assert first.function.__code__.co_code == second.function.__code__.co_code
    assert first.function.__globals__ is not second.function.__globals__


def test_a_child_replaced_after_parsing_runs_as_the_model_holds_it_now():
    model, x, schema = _parsed()
    SchemaInterpreter().run(schema, {"x": x})  # compiled with the old child
    model.second = nn.Linear(4, 4)
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], model(x))


def test_forward_hooks_added_after_compiling_run_around_the_generated_forward():
    model, x, schema = _parsed()
    SchemaInterpreter().run(schema, {"x": x})
    seen = []
    handle = model.first.register_forward_hook(lambda module, args, out: seen.append(out.shape) or out * 0)
    try:
        assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], model(x))
    finally:
        handle.remove()
    assert seen == [torch.Size([2, 4])] * 2  # once through the schema, once through eager
