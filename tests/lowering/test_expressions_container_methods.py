"""Regressions found by differential fuzzing: methods of module containers inside forward.

`self.blocks.values()` on an nn.ModuleDict was lowered as a call into a sub-block `blocks`, which
does not exist (containers without a forward are flattened into their children); the plain run
fell back to the live method but an observed run with a TraceRecorder failed (seeds 90, 371).
(Seed numbers name programs of the fuzz generator as it was when each bug was found.)
"""

import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike
from nnschemaparser import BlockInstruction, NNParser, SchemaInterpreter, TraceRecorder


class LoopsOverModuleDictValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()})
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])

    def forward(self, x):
        for block in self.blocks.values():
            x = block(x)
        for name, block in self.blocks.items():
            x = block(x) + len(name)
        first = self.layers.__getitem__(0)
        return first(x) * len(self.layers)


def test_container_methods_run_like_eager_in_every_engine_mode():
    assert_schema_matches_eager_or_raises_alike(LoopsOverModuleDictValues(), {"x": torch.randn(2, 4)})


def test_traced_run_through_container_methods_records_the_child_calls():
    model = LoopsOverModuleDictValues().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    tracer = TraceRecorder()
    out = SchemaInterpreter(listeners=[tracer]).call(schema, x=x)
    assert torch.equal(out, model(x))
    assert any("ENTER BLOCK Linear" in line for line in tracer.lines)


def _instructions(body):
    for instr in body:
        yield instr
        if hasattr(instr, "condition"):  # a ControlInstruction's test: `prepare`, then its `condition` op
            yield from _instructions(instr.prepare + [instr.condition])
        for name in ("body", "else_body", "final_body"):
            yield from _instructions(getattr(instr, name, None) or [])
        for handler in getattr(instr, "handler_bodies", None) or []:
            yield from _instructions(handler)


def test_container_method_is_not_lowered_as_a_sub_block_call():
    schema = NNParser.parse_model(LoopsOverModuleDictValues(), resolve=False)
    calls = [i for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
    # no call of the containers themselves (they have no block) nor of a method of theirs
    static = {i.block_ref.path for i in calls if i.callee_var is None or i.block_ref.method is not None}
    assert not static & {"blocks", "layers"}, static
    # the loop variables' calls dispatch on the entry each loop yields, named by its key
    assert [(i.block_ref.path, i.block_ref.index_var, i.callee_var) for i in calls] == [
        ("blocks", "$block_key", "block"), ("blocks", "name", "block")]
