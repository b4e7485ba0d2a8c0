"""save_schema / load_schema: round trips are exact, unbound schemas are inert, bad models are refused.

A round trip here means: parse a model, save the schema, load it back with the live model, run it,
and compare with the eager model bit for bit (outputs, then parameter gradients), on the ten
fixtures, a model built to reach every kind of file entry, and a few transformers models.
"""

import copy
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.support.exactness import assert_same_structure
from tests.support.fixture_models import DROPOUT_FIXTURES, FIXTURES
from tests.support.schema_file_models import make_featureful

from nnschemaparser import NNParser, SchemaInterpreter, dump_schema
from nnschemaparser.schema.errors import SchemaFormatError, SchemaRunError
from nnschemaparser.files.file_format import FileLimits, ModelMismatchError, UnsafeReferenceError
from nnschemaparser.schema.model import Const, OpInstruction, VarRef
from nnschemaparser.files.schema_file import load_schema, save_schema, schema_to_json
from nnschemaparser.files.value_codec import UnresolvedReference, ValueDecoder, ValueEncoder, Resolver

NAMES = sorted(FIXTURES)


def _clone(inputs):
    return {k: v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
            for k, v in inputs.items()}


def _float_leaves(value):
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.requires_grad else []
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _float_leaves(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _float_leaves(item)]
    return []


def _parse(model, inputs):
    return NNParser.parse_model(model, inputs_tensors_values=_clone(inputs))


def assert_loaded_matches_eager(model, inputs, path, *, train=False, seed=0):
    """Save the schema of `model`, load it bound to the model, compare with eager (outputs and grads)."""
    model.train(train)
    save_schema(_parse(model, inputs), path)
    twin = copy.deepcopy(model)
    loaded = load_schema(path, model=model)
    assert model.training == train
    eager_inputs, schema_inputs = _clone(inputs), _clone(inputs)
    torch.manual_seed(seed)
    expected = twin(**eager_inputs)
    torch.manual_seed(seed)
    got = SchemaInterpreter().call(loaded, **schema_inputs)
    assert_same_structure(expected, got)
    leaves_eager, leaves_schema = _float_leaves(expected), _float_leaves(got)
    if leaves_eager:
        sum(t.double().sum() for t in leaves_eager).backward()
        sum(t.double().sum() for t in leaves_schema).backward()
        for (name, p_eager), (_, p_schema) in zip(twin.named_parameters(), model.named_parameters()):
            assert (p_eager.grad is None) == (p_schema.grad is None), name
            if p_eager.grad is not None:
                assert torch.equal(p_eager.grad, p_schema.grad), f"{name}: gradient differs"
        model.zero_grad(set_to_none=True)
    return loaded


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fixture_round_trip_runs_bit_identical_to_eager_in_eval_mode(name, tmp_path):
    model, inputs = FIXTURES[name]()
    assert_loaded_matches_eager(model, inputs, tmp_path / "schema.json")


@pytest.mark.parametrize("name", DROPOUT_FIXTURES)
def test_fixture_round_trip_runs_bit_identical_to_eager_in_train_mode(name, tmp_path):
    model, inputs = FIXTURES[name]()
    assert_loaded_matches_eager(model, inputs, tmp_path / "schema.json", train=True, seed=1234)


@pytest.mark.parametrize("name", NAMES)
def test_saving_a_loaded_schema_writes_the_same_document(name, tmp_path):
    model, inputs = FIXTURES[name]()
    schema = _parse(model.eval(), inputs)
    path = save_schema(schema, tmp_path / "schema.json")
    original = json.dumps(schema_to_json(schema))
    assert json.dumps(schema_to_json(load_schema(path))) == original
    assert json.dumps(schema_to_json(load_schema(path, model=model))) == original
    assert path.read_bytes() == save_schema(load_schema(path), tmp_path / "again.json").read_bytes()


def test_featureful_model_round_trip_covers_globals_decorators_and_skipped_children(tmp_path):
    model, inputs = make_featureful()
    loaded = assert_loaded_matches_eager(model, inputs, tmp_path / "schema.json")
    assert loaded.find("count").skip_reason is not None  # re-dispatched to its real module
    assert loaded.find("gen").methods["_chunks"].skip_reason is not None  # runs as the real method
    assert loaded.find("gen").methods["_chunks"].function is not None
    assert loaded.find("deco").wrapper is not None  # the decorator was re-bound from the model
    text = (tmp_path / "schema.json").read_text()
    for needle in ('"soft_clip"', '"BIAS_TABLE"', 'RoutingError', '"value":"-inf"', '"wrapped":true'):
        assert needle in text


def test_unbound_schema_dumps_and_walks_like_the_original(tmp_path):
    model, inputs = make_featureful()
    schema = _parse(model.eval(), inputs)
    loaded = load_schema(save_schema(schema, tmp_path / "schema.json"))
    assert dump_schema(loaded) == dump_schema(schema)
    assert [(b.path, b.method_name, len(b.body)) for b in loaded.iter_blocks()] == \
        [(b.path, b.method_name, len(b.body)) for b in schema.iter_blocks()]
    assert all(b.module is None for b in loaded.iter_blocks())
    assert loaded.weights == {} or all(w.value is None for w in loaded.weights.values())
    assert loaded.find("inp").weights["weight"].shape == (8, 8)


def test_running_an_unbound_schema_says_the_model_is_needed(tmp_path):
    model, inputs = FIXTURES["mlp"]()
    loaded = load_schema(save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json"))
    with pytest.raises(SchemaRunError, match=r"load_schema\(path, model="):
        SchemaInterpreter().call(loaded, **_clone(inputs))


def test_a_placeholder_of_the_models_code_refuses_to_be_called():
    placeholder = UnresolvedReference("pkg.model", "helper", "function", "pkg.model.helper")
    with pytest.raises(SchemaRunError, match="needs the model"):
        placeholder(1)
    assert placeholder.__name__ == "helper"


def test_loading_with_a_model_changes_no_parameter_buffer_or_mode(tmp_path):
    model, inputs = FIXTURES["cnn"]()
    model.train()
    path = save_schema(_parse(model, inputs), tmp_path / "schema.json")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_schema(path, model=model)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bound_weights_are_the_live_parameters(tmp_path):
    model, inputs = FIXTURES["mlp"]()
    loaded = load_schema(save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json"), model=model)
    weight = loaded.find("head").weights["weight"]
    assert weight.value.data_ptr() == model.head.weight.data_ptr()


@pytest.mark.parametrize("case_name", ["gpt2", "bert", "llama-kv-prefill"])
def test_zoo_model_round_trip_runs_bit_identical_to_eager(case_name, tmp_path):
    from nnschemaparser.validation.zoo import get_case, iter_float_tensors

    case = get_case(case_name)
    model = case.build()
    schema = NNParser.parse_model(model, inputs_tensors_values=case.make_inputs(model))
    loaded = load_schema(save_schema(schema, tmp_path / "schema.json"), model=model)
    with torch.no_grad():
        torch.manual_seed(0)
        expected = list(iter_float_tensors(model(**case.make_inputs(model))))
        torch.manual_seed(0)
        got = list(iter_float_tensors(SchemaInterpreter().call(loaded, **case.make_inputs(model))))
    assert len(expected) == len(got) > 0
    for a, b in zip(expected, got):
        assert_same_structure(a, b)


# --- refusing models and schemas ----------------------------------------------------------------


def test_a_model_of_another_class_is_refused_with_the_paths_that_differ(tmp_path):
    model, inputs = FIXTURES["mlp"]()
    path = save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json")
    other, _ = FIXTURES["cnn"]()
    with pytest.raises(ModelMismatchError, match="does not match the schema file") as info:
        load_schema(path, model=other)
    assert "MLP" in str(info.value) and "SmallCNN" in str(info.value)


def test_a_model_with_other_sizes_is_refused_naming_the_weight(tmp_path):
    from tests.support.fixture_models import MLP

    model, inputs = FIXTURES["mlp"]()
    path = save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json")
    with pytest.raises(ModelMismatchError, match=r"head\.weight: shape \(4, 32\) in the file, \(5, 32\)"):
        load_schema(path, model=MLP(out_features=5))


def test_model_must_be_a_module_instance(tmp_path):
    model, inputs = FIXTURES["mlp"]()
    path = save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json")
    with pytest.raises(ModelMismatchError, match="nn.Module instance"):
        load_schema(path, model=type(model))


def test_a_reference_the_models_code_does_not_make_is_refused_with_the_model(tmp_path):
    model, inputs = make_featureful()
    path = save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json")
    text = path.read_text().replace('"name":"soft_clip","type":"function",'
                                    '"qualname":"tests.support.schema_file_models.soft_clip"',
                                    '"name":"doubled_output","type":"function",'
                                    '"qualname":"tests.support.schema_file_models.doubled_output"')
    assert "doubled_output" in text
    path.write_text(text)
    assert load_schema(path) is not None  # without the model it is an inert placeholder
    with pytest.raises(UnsafeReferenceError, match="not referenced by the model's own code"):
        load_schema(path, model=model)


def test_save_refuses_an_object_no_source_name_refers_to(tmp_path):
    model, inputs = FIXTURES["mlp"]()
    schema = _parse(model.eval(), inputs)
    schema.body.insert(0, OpInstruction(out_var="$x", target=torch.add, qualified_name="torch.add",
                                        args=[VarRef("x"), Const(object(), "")]))
    with pytest.raises(SchemaFormatError, match="no source name refers to it"):
        save_schema(schema, tmp_path / "schema.json")


def test_save_needs_a_schema(tmp_path):
    with pytest.raises(SchemaFormatError, match="needs a ModelBlockSchema"):
        save_schema(nn.Linear(2, 2), tmp_path / "schema.json")


def test_a_bound_schema_runs_the_callables_of_the_models_own_lowering(tmp_path):
    """What runs is the fresh lowering of the model: every call target is the very object the
    parser puts there (a computed getattr is the model's own getattr, as in eager), none decoded."""
    from nnschemaparser.files.allowlist import checked_getattr

    model, inputs = make_featureful()
    path = save_schema(_parse(model.eval(), inputs), tmp_path / "schema.json")
    loaded = load_schema(path, model=model)
    fresh = NNParser.parse_model(model, resolve=False)

    def targets(root):
        return [(b.path, b.method_name, i.out_var, i.target) for b in root.iter_blocks() for i in b.body
                if isinstance(i, OpInstruction) and not isinstance(i.target, VarRef)]

    got, want = targets(loaded), targets(fresh)
    assert len(got) == len(want) > 0
    for (path_a, method_a, var_a, a), (path_b, method_b, var_b, b) in zip(got, want):
        assert (path_a, method_a, var_a) == (path_b, method_b, var_b)
        assert a is b or a == b, (path_a, var_a, a, b)
    computed = [i for b in loaded.iter_blocks() for i in b.body
                if isinstance(i, OpInstruction) and i.display_name == "getattr" and not isinstance(i.args[1], str)]
    assert computed and all(i.target is getattr for i in computed)
    with pytest.raises(UnsafeReferenceError, match="dunder"):
        checked_getattr(model, "__dict__")
    with pytest.raises(UnsafeReferenceError, match="reaches files"):
        checked_getattr(model, "load_state_dict")
    assert checked_getattr(model, "kind") == "tanh"


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_depth"):
        FileLimits(max_depth=0)


# --- the value codec, as a property ---------------------------------------------------------------

_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2 ** 70, max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.binary(max_size=8),
    st.complex_numbers(allow_nan=False, max_magnitude=1e6), st.just(Ellipsis),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.strided, torch.channels_last]),
    st.sampled_from([torch.device("cpu"), torch.device("cuda", 1), torch.Size([2, 3]), torch.Size([])]),
    st.sampled_from([torch.add, torch.nn.functional.linear, math.sqrt, len, torch.Tensor.view, ValueError]),
    st.builds(slice, st.integers(-5, 5) | st.none(), st.integers(-5, 5) | st.none()),
)
_hashable = st.one_of(st.integers(), st.text(max_size=5), st.booleans(),
                      st.tuples(st.integers(), st.text(max_size=3)))
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(_hashable, inner, max_size=4), st.frozensets(_hashable, max_size=4),
                            st.sets(_hashable, max_size=4)),
    max_leaves=12,
)


def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a is b or a == b


@settings(max_examples=300, deadline=None)
@given(_values)
def test_every_encodable_value_decodes_to_an_identical_value(value):
    encoded = ValueEncoder(allow_globals=False).value(value, "v")
    text = json.dumps(encoded, allow_nan=False)
    decoded = ValueDecoder(Resolver()).value(json.loads(text), "v")
    assert _same(value, decoded), (value, decoded)
