"""The dispatch-bound fast paths keep CPython's semantics (issue 17).

Calls with keywords, constants, spreads and `**kwargs` are written into the generated code
(`codegen.CodeGenerator.arguments`); a sub-block call's invoker is put into the generated
function's globals at its first call; the observer builds no event for the instructions a tensor
recorder does not want; the recorder's description tables are kept per schema. Each test checks a behaviour those paths must keep: argument order and values, the
errors of a bad call, unbound reads, which events a listener sees, and descriptions that follow a
callee fetched at run time. The bench models of bench/models.py (shrunk) run exactly too.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.fuzz.oracle import assert_schema_matches_eager_or_raises_alike
from nnschemaparser import NNParser, SchemaInterpreter, TraceListener
from nnschemaparser.traces.record import capture_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def layout(*args, **kwargs):
    """What a call received: its positional values and its keywords, in order."""
    return args, list(kwargs.items())


class Child(nn.Module):
    def forward(self, x, *rest, **options):
        return x * 2, len(rest), list(options)


class KeywordCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Child()

    def forward(self, x, case: int):
        extra = {"z": x + 1, "a": 3}
        pair = [x, x - 1]
        if case == 0:
            return layout(x, 1.5, *pair, k=2, b=x, **extra)
        if case == 1:
            return self.child(x, *pair, q=1, **extra)
        if case == 2:
            return layout(x, z=1, **extra)  # z twice: TypeError, as eager
        if case == 3:
            return self.child(x, a=1, **extra)  # a twice, through a block call
        if case == 4:
            method = getattr(x, "add")
            return method(x, alpha=2)
        if case == 5:
            return torch.clamp(x, min=-0.5, max=0.5).sum(dim=-1, keepdim=True)
        if case == 6:
            if x.sum() > 1e9:
                y = x
            return torch.add(x, y, alpha=2)  # noqa: F821 - y unbound: UnboundLocalError, as eager
        return self.child(*pair, **{"odd-key": 1})


@pytest.mark.parametrize("case", range(8))
def test_generated_calls_match_eager_in_values_order_and_errors(case):
    torch.manual_seed(0)
    assert_schema_matches_eager_or_raises_alike(KeywordCalls(), {"x": torch.randn(2, 3), "case": case})


def test_keyword_order_of_generated_calls_is_the_source_order():
    model = KeywordCalls()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x, "case": 0})
    args, keywords = SchemaInterpreter().call(schema, x=x, case=0)
    assert [k for k, _ in keywords] == ["k", "b", "z", "a"]
    assert torch.equal(args[0], x) and args[1] == 1.5 and torch.equal(args[3], x - 1)
    _, count, names = SchemaInterpreter().call(schema, x=x, case=1)
    assert count == 2 and names == ["q", "z", "a"]


class Collect(TraceListener):
    def __init__(self, every: bool):
        self.every_instruction = every
        self.seen = []

    def on_instruction(self, event):
        self.seen.append((type(event.instruction).__name__, event.instruction.out_var, type(event.value).__name__))


class MixedValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        n = x.shape[0]
        y = self.lin(x).relu()
        return y * n


def test_a_tensor_only_listener_sees_tensor_results_and_returns_while_others_see_everything():
    model = MixedValues()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    every, tensors = Collect(True), Collect(False)
    SchemaInterpreter(listeners=[tensors, every]).run(schema, {"x": x})
    assert [s for s in every.seen if s[2] == "Tensor" or s[0] == "ReturnInstruction"] == tensors.seen
    assert any(s[2] == "int" for s in every.seen) and not any(s[2] == "int" for s in tensors.seen)
    assert any(s[2] == "builtin_function_or_method" for s in every.seen)  # the fetched `relu`
    alone = Collect(False)
    SchemaInterpreter(listeners=[alone]).run(schema, {"x": x})
    assert alone.seen == tensors.seen


class PickedMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.name = "relu"

    def forward(self, x):
        method = getattr(x, self.name)
        return method() + 1


def test_descriptions_follow_a_callee_fetched_at_run_time_across_captures():
    model = PickedMethod()
    x = torch.randn(4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    first = capture_run(schema, {"x": x}).trace.steps
    model.name = "sigmoid"
    second = capture_run(schema, {"x": x}).trace.steps
    called = [s for s in first if s.out_var == "$t2" or s.op_name.endswith(".relu")]
    assert [s.op_name for s in first if s.op_name.startswith("Tensor.")] == ["Tensor.relu"]
    assert [s.op_name for s in second if s.op_name.startswith("Tensor.")] == ["Tensor.sigmoid"]
    assert called and first[1].description != second[1].description
    assert torch.equal(second[-1].tensor.value, torch.sigmoid(x) + 1)


def test_repeated_captures_of_one_schema_give_the_same_trace():
    model = MixedValues()
    x = torch.randn(2, 3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    a, b = capture_run(schema, {"x": x}).trace.steps, capture_run(schema, {"x": x}).trace.steps
    assert [(s.container_id, s.description, s.op_name, s.block_path) for s in a] == \
        [(s.container_id, s.description, s.op_name, s.block_path) for s in b]
    assert all(torch.equal(p.tensor.value, q.tensor.value) for p, q in zip(a, b))


@pytest.mark.parametrize("factory, kwargs", [("tiny_llama", {"layers": 2}), ("tiny_mixtral", {"layers": 2}),
                                             ("tiny_vit", {"layers": 2}), ("small_resnet", {})])
def test_bench_models_run_step_and_capture_exactly(factory, kwargs):
    import models
    from bench_capture import same

    model, inputs = getattr(models, factory)(**kwargs)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    assert not schema.skipped
    with torch.no_grad():
        eager = model(**inputs)
        assert same(eager, SchemaInterpreter().call(schema, **inputs))
        record = capture_run(schema, dict(inputs))
        assert same(eager, record.outputs[0])
        stepper = SchemaInterpreter()
        steps = sum(1 for _ in stepper.step_run(schema, dict(inputs)))
        assert steps > len(record.trace.steps) // 2 and same(eager, stepper.step_outputs[0])


class Base(nn.Module):
    def scale_by(self, x, k=1.0, **options):
        return x * k, list(options)


class SuperCalls(Base):
    def scale_by(self, x, k=1.0, **options):
        return x

    def forward(self, x, twice: bool):
        extra = {"k": 3.0} if twice else {"j": 1}
        return super().scale_by(x, k=2.0, **extra)  # k twice: Base.scale_by's TypeError, as eager


@pytest.mark.parametrize("twice", [False, True])
def test_super_method_calls_with_kwargs_match_eager_in_values_and_errors(twice):
    assert_schema_matches_eager_or_raises_alike(SuperCalls(), {"x": torch.randn(2, 3), "twice": twice})


class KeywordCall(nn.Module):
    def forward(self, a):
        return dict(x=a)


def _keyword_schema(key):
    """KeywordCall's schema with the keyword of its `dict(x=a)` call replaced by `key`."""
    from nnschemaparser.schema.model import OpInstruction

    schema = NNParser.parse_model(model=KeywordCall(), inputs_tensors_values={"a": torch.ones(1)})
    call = next(i for i in schema.body if isinstance(i, OpInstruction) and i.target is dict)
    call.kwargs = {key: call.kwargs["x"]}
    return schema


def test_generated_calls_refuse_keyword_names_that_are_not_plain_strings():
    class Sneaky(str):
        def __repr__(self):
            return "__import__('os').system('exit 3')"

    for key in (Sneaky("x"), 3):
        with pytest.raises(TypeError, match="keywords must be strings"):
            SchemaInterpreter().run(_keyword_schema(key), {"a": torch.ones(1)})
    out = SchemaInterpreter().run(_keyword_schema("not an identifier"), {"a": torch.ones(1)})[0]
    assert list(out) == ["not an identifier"] and torch.equal(out["not an identifier"], torch.ones(1))
