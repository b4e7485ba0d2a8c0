"""What ran outside the schema is found from the forwards' code objects, reported by `coverage()`,
and, where live code reached an interpreted module, interpreted through on the next run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, SchemaRunError, capture_run
from tests.support.fidelity_models import HoldsScripted
from tests.support.live_call_models import HandsWorkAway, Parametrized, Unregistered, apply_twice


def _parse(model, x):
    return NNParser.parse_model(model, inputs_tensors_values={"x": x})


def test_modules_reached_by_helpers_processors_and_explicit_forward_calls_are_interpreted():
    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    forward = schema.coverage()[schema.coverage()["phase"] == "forward"]
    assert forward.empty, forward.to_string()
    # checkpoint's recomputation of `b` in backward runs the real module: said, as a backward row
    assert list(schema.coverage()["module"]) == ["b"] and list(schema.coverage()["phase"]) == ["backward"]
    assert list(schema.skipped) == ["b (backward)"]
    record = capture_run(schema, {"x": x}, coverage=True)
    assert torch.equal(record.outputs[0], model(x))
    assert record.coverage().empty
    paths = {step.block_path for step in record.trace.steps}
    # every module ran as its schema, including those only library code or the processor called
    assert {"a", "b", "c", "to_q", "to_k", "to_out", "lins.0", "lins.1"} <= paths
    # the bound method handed to apply_twice ran as its method schema (its own steps)
    assert sum(step.op_name == "Tensor.tanh" for step in record.trace.steps
               if step.block_path == "HandsWorkAway") == 2


def test_helpers_that_called_interpreted_modules_are_listed_on_request():
    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    schema = _parse(model, torch.randn(3, 4))
    helpers = schema.coverage(helpers=True)
    callees = set(helpers["callee"])
    assert any(name.endswith("apply_twice") for name in callees)
    assert not any(name.endswith("Processor.__call__") for name in callees)  # lowered: see below
    assert set(helpers[helpers["phase"] == "forward"]["kind"]) == {"helper"}


def test_a_processor_objects_call_is_lowered_with_its_source_names():
    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    assert "processor.call" in schema.methods
    record = capture_run(schema, {"x": x})
    assert torch.equal(record.outputs[0], model(x))
    names = [step.out_var for step in record.trace.steps if step.block_path == "HandsWorkAway"]
    assert {"query", "key", "weights"} <= set(names)


def test_a_processor_of_another_class_set_after_parsing_runs_as_itself():
    class Doubling:
        def __call__(self, attn, hidden):
            return attn.to_out(hidden) * 2

    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    model.processor = Doubling()
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


def test_gradients_through_interpreted_helper_calls_equal_eager():
    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4, requires_grad=True)
    schema = _parse(model, x.detach())
    xs = x.detach().clone().requires_grad_(True)
    SchemaInterpreter().run(block=schema, scope={"x": xs})[0].sum().backward()
    model(x).sum().backward()
    assert torch.equal(xs.grad, x.grad)


def test_the_lent_forward_is_gone_after_a_run_and_eager_calls_on_other_threads_run_the_module():
    import threading

    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    SchemaInterpreter().run(block=schema, scope={"x": x})
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert "chunk" not in model.__dict__
    seen = {}

    def eager_elsewhere():
        seen["out"] = model(x)

    # a stepped run holds the lent forwards while paused; another thread's eager call is plain eager
    steps = SchemaInterpreter().step_run(block=schema, scope={"x": x})
    next(steps)
    thread = threading.Thread(target=eager_elsewhere)
    thread.start()
    thread.join()
    for _ in steps:
        pass
    assert torch.equal(seen["out"], model(x))


def test_an_eager_call_between_the_steps_of_a_paused_run_is_plain_eager():
    torch.manual_seed(0)
    model = HandsWorkAway().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    expected = model(x)
    steps = SchemaInterpreter().step_run(block=schema, scope={"x": x})
    taken = 0
    for _ in steps:
        taken += 1
        if taken == 3:  # paused inside the run, on this thread: the lent forwards are in place
            assert any("forward" in m.__dict__ for m in model.modules())
            assert torch.equal(model(x), expected)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_parametrized_weight_is_computed_by_its_interpreted_parametrization():
    torch.manual_seed(0)
    model = Parametrized().eval()
    x = torch.randn(3, 4)
    schema = _parse(model, x)
    assert schema.coverage().empty, schema.coverage().to_string()
    record = capture_run(schema, {"x": x})
    assert torch.equal(record.outputs[0], model(x))
    assert any(step.block_path.startswith("fc.parametrizations.weight") for step in record.trace.steps)


def test_a_torchscript_child_is_reported_as_running_live_with_its_reason_and_place():
    torch.manual_seed(0)
    model = HoldsScripted().eval()
    x = torch.randn(2, 4)
    schema = _parse(model, x)
    assert "scripted" in schema.skipped
    for frame in (schema.coverage(), capture_run(schema, {"x": x}, coverage=True).coverage()):
        assert list(frame["module"]) == ["scripted"] and list(frame["calls"]) == [1]
        assert frame.iloc[0]["reason"].startswith("skipped: RecursiveScriptModule is TorchScript")
        assert frame.iloc[0]["location"].endswith(f":{HoldsScripted.forward.__code__.co_firstlineno + 1}")
    assert torch.equal(capture_run(schema, {"x": x}).outputs[0], model(x))


def test_a_module_that_is_no_sub_module_is_reported_as_a_live_call():
    torch.manual_seed(0)
    model = Unregistered().eval()
    x = torch.randn(2, 4)
    schema = _parse(model, x)
    frame = schema.coverage()
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["module"] is None and row["module_type"] == "Linear" and row["kind"] == "module"
    assert "not a sub-module" in row["reason"]
    assert row["block"] == "Unregistered" and row["location"].endswith(f":{Unregistered.forward.__code__.co_firstlineno + 1}")
    assert row["calls"] == 1
    record = capture_run(schema, {"x": x}, coverage=True)
    assert len(record.coverage()) == 1 and record.coverage().iloc[0]["calls"] == 1


class _BranchHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, flag: bool = False):
        if flag:
            return apply_twice(self.fc, x)  # a helper reaching fc, only on this branch
        return x


def test_a_run_reports_live_calls_on_a_branch_the_parse_run_did_not_take():
    torch.manual_seed(0)
    model = _BranchHelper().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.coverage().empty
    record = capture_run(schema, {"x": x, "flag": True}, coverage=True)
    assert torch.equal(record.outputs[0], model(x, True))
    frame = record.coverage()
    assert list(frame["module"]) == ["fc"] and list(frame["calls"]) == [2]
    assert frame.iloc[0]["via"].endswith("apply_twice") and "apply_twice" in frame.iloc[0]["reason"]


def test_coverage_of_a_run_that_did_not_watch_says_how_to_ask_for_it():
    model = _BranchHelper().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    with pytest.raises(SchemaRunError, match=r"capture_run\(\.\.\., coverage=True\)"):
        capture_run(schema, {"x": x}).coverage()


class _WeightNormConv(nn.Module):
    """wav2vec2's positional convolution: `parametrizations.weight_norm` computes the weight when read."""

    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), name="weight", dim=2)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x))


def test_weight_norm_parametrization_is_interpreted_as_wav2vec2_uses_it():
    torch.manual_seed(0)
    model = _WeightNormConv().eval()
    x = torch.randn(1, 4, 8)
    schema = _parse(model, x)
    assert schema.coverage().empty and schema.skipped == {}
    record = capture_run(schema, {"x": x}, coverage=True)
    assert torch.equal(record.outputs[0], model(x))
    assert record.coverage().empty
    assert any(step.block_path.startswith("conv.parametrizations.weight") for step in record.trace.steps)


def test_a_decorator_that_dispatches_elsewhere_is_reported_with_its_place():
    from tests.support.live_call_models import HoldsDispatched

    torch.manual_seed(0)
    model = HoldsDispatched().eval()
    x = torch.randn(2, 4)
    schema = _parse(model, x)
    frame = schema.coverage()
    row = frame[frame["kind"] == "dispatch"].iloc[0]
    assert row["module"] == "inner" and row["module_type"] == "Dispatched" and row["calls"] == 1
    assert "dispatches to another implementation" in row["reason"] and "dispatching" in row["callee"]
    assert row["block"] == "HoldsDispatched"
    assert "inner" in schema.skipped
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))
