"""What the parser learnt about live code survives save/load: a loaded schema still lends the
forwards and methods live code reaches, and still runs a processor object's `__call__` as schema."""

from __future__ import annotations

import torch

from nnschemaparser import NNParser, capture_run, load_schema, save_schema
from tests.support.live_call_models import HandsWorkAway


def test_a_loaded_schema_interprets_what_live_code_reaches_as_the_parsed_one_does(tmp_path):
    torch.manual_seed(0)
    model, x = HandsWorkAway().eval(), torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    path = tmp_path / "schema.json"
    save_schema(schema, path)
    loaded = load_schema(path, model=model)
    assert {b.path for b in loaded.iter_blocks() if b.reached_live} == \
        {b.path for b in schema.iter_blocks() if b.reached_live}
    assert loaded.methods["processor.call"].self_attr == "processor"
    record = capture_run(loaded, {"x": x}, coverage=True)
    assert torch.equal(record.outputs[0], model(x))
    assert record.coverage().empty
    names = {step.out_var for step in record.trace.steps if step.block_path == "HandsWorkAway"}
    assert {"query", "key", "weights"} <= names
