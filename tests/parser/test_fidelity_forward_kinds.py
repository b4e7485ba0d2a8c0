"""Forwards of every kind real code writes parse and run exactly: `__call__` overrides,
`@staticmethod` and `@classmethod` forwards, `*args` / `**kwargs` roots, roots without inputs."""

import copy

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run


def _run(schema, scope):
    return SchemaInterpreter().run(schema, scope)[0]


# -- __call__ overrides ------------------------------------------------------------------------


class Aggregation(nn.Module):
    """The shape of PyTorch Geometric's `Aggregation`: `__call__` fills `dim_size` before forward."""

    def __call__(self, x, index=None, dim_size=None, **kwargs):
        if dim_size is None and index is not None:
            dim_size = int(index.max()) + 1
        return super().__call__(x, index=index, dim_size=dim_size, **kwargs)


class SumAggregation(Aggregation):
    def forward(self, x, index=None, dim_size=None):
        out = torch.zeros(dim_size, x.size(-1), dtype=x.dtype)
        return out.index_add(0, index, x)


class Pooling(nn.Module):
    """A plain Linear next to a child with a `__call__` override."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.aggr = SumAggregation()

    def forward(self, x, index):
        return self.aggr(self.lin(x), index)


class ScalesInCall(nn.Module):
    """An override that changes the result: skipping it would be a silent difference."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return super().__call__(*args, **kwargs) * 2

    def forward(self, x):
        return self.lin(x)


def _graph():
    torch.manual_seed(0)
    return torch.randn(6, 4), torch.tensor([0, 0, 1, 2, 2, 2])


def test_call_override_of_the_root_runs_with_the_schema_as_forward():
    x, index = _graph()
    model = SumAggregation()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "index": index})
    assert schema.skip_reason is None and schema.skipped == {}
    assert torch.equal(_run(schema, {"x": x, "index": index}), model(x, index))
    record = capture_run(schema, {"x": x, "index": index})
    assert torch.equal(record.outputs[0], model(x, index))
    assert any(step.out_var == "out" for step in record.trace)  # the schema ran, observed


def test_call_override_of_a_child_is_honoured_and_its_sibling_is_not_skipped():
    x, index = _graph()
    model = Pooling()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "index": index})
    assert schema.skipped == {}
    assert schema.sub_blocks["lin"].skip_reason is None and schema.sub_blocks["aggr"].skip_reason is None
    assert torch.equal(_run(schema, {"x": x, "index": index}), model(x, index))
    assert torch.equal(SchemaInterpreter().call(schema, x, index), model(x, index))


def test_call_override_that_changes_the_result_is_not_lost():
    torch.manual_seed(0)
    model = ScalesInCall()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None
    eager = copy.deepcopy(model)
    assert torch.equal(_run(schema, {"x": x}), eager(x))
    assert model.calls == eager.calls  # the override ran once, as eager's did
    assert "forward" not in model.__dict__  # the schema's forward was only lent to the call


def test_call_override_sees_hooks_as_eager_does():
    x, index = _graph()
    model = SumAggregation()
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(sorted(kwargs)) or None, with_kwargs=True)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "index": index})
    assert schema.skip_reason is None
    seen.clear()
    model(x, index)
    _run(schema, {"x": x, "index": index})
    assert seen[0] == seen[1] == ["dim_size", "index"]


# -- static and class methods ------------------------------------------------------------------


class StaticForward(nn.Module):
    @staticmethod
    def forward(x, k=2):
        return torch.relu(x) * k


class ClassForward(nn.Module):
    factor = 3.0

    @classmethod
    def forward(cls, x):
        return x * cls.factor


class HoldsStaticAndClassChildren(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.static = StaticForward()
        self.klass = ClassForward()

    def forward(self, x):
        return self.klass(self.static(self.lin(x), 3))


@pytest.mark.parametrize("cls", [StaticForward, ClassForward, HoldsStaticAndClassChildren])
def test_static_and_class_method_forwards_parse_and_run(cls):
    torch.manual_seed(0)
    model = cls()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None and schema.skipped == {}
    assert torch.equal(_run(schema, {"x": x}), model(x))
    assert torch.equal(SchemaInterpreter().call(schema, x), model(x))


def test_class_method_forward_binds_the_class_not_the_instance():
    model = ClassForward()
    model.factor = 10.0  # an instance attribute: a classmethod does not see it
    x = torch.ones(2)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None
    assert torch.equal(_run(schema, {"x": x}), torch.full((2,), 3.0))


def test_saved_schema_of_static_class_and_call_override_forwards_runs_after_load(tmp_path):
    from nnschemaparser import load_schema, save_schema

    torch.manual_seed(0)
    x, index = _graph()
    cases = [(HoldsStaticAndClassChildren(), {"x": torch.randn(2, 3)}), (Pooling(), {"x": x, "index": index})]
    for number, (model, scope) in enumerate(cases):
        schema = NNParser.parse_model(model, inputs_tensors_values=scope)
        path = save_schema(schema, tmp_path / f"schema{number}.json")
        loaded = load_schema(path, model=model)
        assert loaded.skipped == {}
        assert torch.equal(_run(loaded, scope), model(**scope))
