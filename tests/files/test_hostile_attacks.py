"""A schema file loaded with its model runs only what the model's own source runs (issue 13).

Every attack of tests/support/hostile_attacks.py is first run in memory, to prove its payload really fires
(a canary file, a canary attribute, a patched class, a hook, an escaping SystemExit); then the same
instructions saved as a file are refused by `load_schema(path, model=m)` with a typed error naming
the first differing instruction, and no canary fires. Loaded without a model the file is inert.
"""

import copy
import json

import pytest

from nnschemaparser import StaleSchemaError
import torch

from tests.support.hostile_attacks import (
    ATTACKS,
    AttackModel,
    attack_file,
    attacked_schema,
    canaries_fired,
    inputs,
    restore_process_state,
)

from nnschemaparser import NNParser, SchemaInterpreter, dump_schema
from nnschemaparser.files.file_format import ModelMismatchError, UnsafeReferenceError
from nnschemaparser.files.schema_file import load_schema, save_schema
from nnschemaparser.files.verification import SourceMismatchError
from nnschemaparser.schema.errors import SchemaFormatError, SchemaRunError
from nnschemaparser.traces.record import capture_run

IDS = [attack.name for attack in ATTACKS]


@pytest.fixture
def canary(tmp_path):
    return tmp_path / "canary"


@pytest.mark.parametrize("attack", ATTACKS, ids=IDS)
def test_each_attack_really_fires_when_its_instructions_run(attack, canary):
    """Guards the refusals below: without the verification rule these instructions do harm."""
    model = AttackModel().eval()
    schema = attacked_schema(model, attack, canary)
    try:
        if attack.proof == "escape":
            with pytest.raises((SystemExit, KeyboardInterrupt)):
                SchemaInterpreter().call(schema, **inputs())
        else:
            try:
                SchemaInterpreter().call(schema, **inputs())
            except StaleSchemaError:  # the next Linear call sees its class's forward replaced and refuses
                assert attack.name == "replace-nn-linear-forward"
            fired = canaries_fired(model, canary)
            assert fired, f"{attack.name}: the payload did nothing, so its refusal would prove nothing"
    finally:
        restore_process_state(model)
    assert canaries_fired(model, canary.with_name("unused")) == []


@pytest.mark.parametrize("attack", ATTACKS, ids=IDS)
def test_each_attack_file_is_refused_when_loaded_with_the_model(attack, canary, tmp_path):
    path = attack_file(AttackModel(), attack, canary, tmp_path / "attack.json")
    model = AttackModel().eval()
    with pytest.raises(UnsafeReferenceError) as info:
        load_schema(path, model=model)
    message = str(info.value)
    assert isinstance(info.value, SchemaFormatError)
    assert str(path) in message
    assert canaries_fired(model, canary) == []
    try:
        load_schema(path)
    except UnsafeReferenceError:
        return  # the allowlist already refuses it without the model
    # the file is well-formed data: the refusal comes from the verification rule, at the first attack instruction
    assert isinstance(info.value, SourceMismatchError)
    assert "root.signature.body[0]" in message
    assert "is not the model's" in message or "extra instruction" in message


@pytest.mark.parametrize("attack", ATTACKS, ids=IDS)
def test_each_attack_file_loaded_without_a_model_is_inert_data(attack, canary, tmp_path):
    path = attack_file(AttackModel(), attack, canary, tmp_path / "attack.json")
    try:
        schema = load_schema(path)
    except UnsafeReferenceError:
        assert not canary.exists()
        return
    assert "fc1" in dump_schema(schema)
    model = AttackModel().eval()
    with pytest.raises(SchemaRunError, match="model"):
        SchemaInterpreter().call(schema, **inputs())
    with pytest.raises(SchemaRunError, match="model"):
        SchemaInterpreter().run(schema, inputs())
    with pytest.raises(SchemaRunError, match="model"):
        list(SchemaInterpreter().step_run(schema, inputs()))
    with pytest.raises(SchemaRunError, match="model"):
        capture_run(schema, inputs())
    assert canaries_fired(model, canary) == []


def test_the_attack_models_own_file_loads_and_runs_bit_identical_to_eager(tmp_path):
    model = AttackModel().eval()
    path = save_schema(NNParser.parse_model(model, inputs_tensors_values=inputs()), tmp_path / "schema.json")
    loaded = load_schema(path, model=model)
    assert torch.equal(SchemaInterpreter().call(loaded, **inputs()), model(**inputs()))
    assert canaries_fired(model, tmp_path / "canary") == []


def _document(tmp_path):
    model = AttackModel().eval()
    path = save_schema(NNParser.parse_model(model, inputs_tensors_values=inputs()), tmp_path / "schema.json")
    return model, path, json.loads(path.read_text())


def test_a_changed_constant_is_refused_naming_block_index_and_file_line(tmp_path):
    model, path, doc = _document(tmp_path)
    branch = next(i for i in doc["root"]["signature"]["body"] if i["type"] == "control")
    index = doc["root"]["signature"]["body"].index(branch)
    compare = branch["condition"]
    assert compare["args"][1] == 4
    compare["args"][1] = 5
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceMismatchError) as info:
        load_schema(path, model=model)
    message = str(info.value)
    assert f"root.signature.body[{index}].condition at " in message
    assert "hidden_attacks.py" not in message and "hostile_attacks.py:" in message
    assert "self.config.hidden_size != 4" in message


def test_reordered_instructions_are_refused(tmp_path):
    model, path, doc = _document(tmp_path)
    body = doc["root"]["signature"]["body"]
    body[0], body[4] = body[4], body[0]
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceMismatchError, match=r"root\.signature\.body\[0\]"):
        load_schema(path, model=model)


def test_a_dropped_instruction_is_refused(tmp_path):
    model, path, doc = _document(tmp_path)
    branch = next(i for i in doc["root"]["signature"]["body"] if i["type"] == "control")
    branch["body"] = []  # drop the raise: the file would never refuse a bad config
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceMismatchError, match=r"lacks the model's"):
        load_schema(path, model=model)


def test_a_changed_sub_block_body_is_refused_with_its_block_path(tmp_path):
    model, path, doc = _document(tmp_path)
    fc1 = doc["root"]["sub_blocks"]["fc1"]
    ops = [i for i in fc1["signature"]["body"] if i["type"] == "op" and i["target"].get("kind") == "callable"]
    ops[-1]["target"] = {"kind": "callable", "name": "torch.nn.functional.bilinear"}
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceMismatchError, match=r"root\.sub_blocks\['fc1'\]\.signature\.body"):
        load_schema(path, model=model)


def test_a_file_may_mark_a_child_as_run_by_its_real_module(tmp_path):
    """Skipping only re-dispatches to the model's own module: taken from the file, and exact."""
    model, path, doc = _document(tmp_path)
    fc2 = doc["root"]["sub_blocks"]["fc2"]
    fc2.update(skip_reason="chosen in the file", signature=None, body=[], methods={})
    path.write_text(json.dumps(doc))
    loaded = load_schema(path, model=model)
    assert loaded.sub_blocks["fc2"].skip_reason == "chosen in the file"
    assert loaded.skipped == {"fc2": "chosen in the file"}
    assert torch.equal(SchemaInterpreter().call(loaded, **inputs()), model(**inputs()))


_namespace: dict = {}
exec("def opaque_forward(self, x):\n    return torch.nn.functional.linear(x, self.weight, self.bias)\n",
     {"torch": torch}, _namespace)


class OpaqueLinear(torch.nn.Linear):
    """Its forward has no source file, so the parser runs it as the real module."""

    forward = _namespace["opaque_forward"]


def test_a_file_cannot_claim_a_lowered_body_where_the_model_runs_its_module(tmp_path):
    model, path, doc = _document(tmp_path)
    lowered = copy.deepcopy(doc["root"]["sub_blocks"]["fc1"])
    model.fc1 = OpaqueLinear(4, 4)
    live = NNParser.parse_model(model, resolve=False)
    assert live.sub_blocks["fc1"].skip_reason is not None
    other = save_schema(live, tmp_path / "other.json")
    doc2 = json.loads(other.read_text())
    lowered["module_type"] = doc2["root"]["sub_blocks"]["fc1"]["module_type"]
    lowered["name"] = doc2["root"]["sub_blocks"]["fc1"]["name"]
    doc2["root"]["sub_blocks"]["fc1"] = lowered
    other.write_text(json.dumps(doc2))
    with pytest.raises(SourceMismatchError, match=r"root\.sub_blocks\['fc1'\].*runs as the real module"):
        load_schema(other, model=model)
    assert isinstance(load_schema(tmp_path / "other.json").sub_blocks["fc1"].signature.body, list)


def test_the_loaded_schema_carries_the_files_resolved_shapes(tmp_path):
    model, path, doc = _document(tmp_path)
    loaded = load_schema(path, model=model)
    resolved = [i.resolved for i in loaded.body if i.resolved is not None]
    assert any(tuple(r.shape) == (2, 4) for r in resolved)
    assert resolved == [i.resolved for i in load_schema(path).body if i.resolved is not None]
    assert tuple(loaded.inputs["x"].shape) == (2, 4)
