"""A schema with a generator method (YieldInstruction) saves, loads against its model and runs."""

from __future__ import annotations

import torch

from nnschemaparser import NNParser, SchemaInterpreter, YieldInstruction, load_schema, save_schema
from nnschemaparser.runtime.instructions import walk_instructions
from tests.lowering.test_statements_generators import WithContext


def test_a_yield_instruction_round_trips_and_the_loaded_schema_runs_exactly(tmp_path):
    torch.manual_seed(0)
    model, x = WithContext().eval(), torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    path = tmp_path / "schema.json"
    save_schema(schema, path)
    loaded = load_schema(path, model=model)
    yields = [i for i in walk_instructions(loaded.methods["scaled"].body) if isinstance(i, YieldInstruction)]
    assert len(yields) == 1 and yields[0].value is not None
    assert torch.equal(SchemaInterpreter().run(block=loaded, scope={"x": x})[0], model(x))
