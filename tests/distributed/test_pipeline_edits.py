"""`SchemaStage` and `PlacedEdit` in one process (no group needed): micro-batches of a whole-batch
edit, the errors for edits that never apply and for bad arguments."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser import NNParser, SchemaInterpreter
from nnschemaparser.distributed import PlacedEdit, SchemaStage
from nnschemaparser.distributed.pipeline import PlaceEditor
from nnschemaparser.schema.errors import EditError, SchemaRunError
from tests.support.pipeline_workers import Part, edit_values, model_and_batch


def test_a_stage_called_per_micro_batch_matches_the_whole_batch_with_the_same_edit():
    model, batch = model_and_batch()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": batch[:2]})
    stage = SchemaStage(model, schema, 0, capture=True, microbatches=2,
                        edits=[PlacedEdit("layers.1", "h", edit_values(), occurrence=2)])
    pieces = [stage(piece) for piece in torch.tensor_split(batch, 2)]
    editor = PlaceEditor([PlacedEdit("layers.1", "h", edit_values(), occurrence=2)])
    whole = SchemaInterpreter(listeners=[editor]).call(schema, batch)
    assert torch.equal(torch.cat(pieces), whole) and not torch.equal(whole, model(batch))
    assert [c.microbatch for c in stage.captures] == [0, 1] and stage.captures[0].name == "stage 0"
    stage.reset()
    assert stage.calls == 0 and stage.captures == []


def test_an_edit_of_a_variable_the_stage_never_binds_says_so():
    model, batch = model_and_batch()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": batch})
    stage = SchemaStage(model, schema, 0, edits=[PlacedEdit("layers.9", "h", edit_values())])
    with pytest.raises(EditError, match=r"never bound layers\.9:h \(binding 1\)"):
        stage(batch)


def test_a_placed_edit_of_the_wrong_shape_is_refused_with_the_shapes():
    model, batch = model_and_batch()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": batch})
    stage = SchemaStage(model, schema, 0, edits=[PlacedEdit("layers.0", "h", torch.zeros(4, 3))])
    with pytest.raises(EditError, match=r"has shape \(4, 8\); the edit gives \(4, 3\)"):
        stage(batch)


def test_bad_stage_and_edit_arguments_are_refused():
    model, batch = model_and_batch()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": batch})
    with pytest.raises(SchemaRunError, match="parsed from another module"):
        SchemaStage(Part(list(model.layers)), schema, 0)
    with pytest.raises(SchemaRunError, match="microbatches must be a positive int"):
        SchemaStage(model, schema, 0, microbatches=0)
    with pytest.raises(EditError, match="values must be a tensor"):
        PlacedEdit("layers.0", "h", [1.0])
    with pytest.raises(EditError, match="occurrence counts bindings from 1"):
        PlacedEdit("layers.0", "h", torch.zeros(1), occurrence=0)
    with pytest.raises(EditError, match="dim=3 is not a dimension"):
        PlacedEdit("layers.0", "h", torch.zeros(2, 2), dim=3)
