"""compare_traces: alignment by id and by role across control-path changes, statuses, sizes, summary."""

import math

import pytest
import torch

from nnschemaparser.traces.compare import TraceDiff, compare_traces, diff_summary, first_divergence
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.trace import ActivationTrace, TraceStep
from nnschemaparser.schema.model import TensorContainer
from tests.support.trace_models import Gate, parse, spec_mlp


def test_identical_runs_pair_every_step_by_id_and_nothing_changed():
    _, x, schema = spec_mlp()
    a, b = capture_run(schema, {"x": x}).trace, capture_run(schema, {"x": x.clone()}).trace
    diffs = compare_traces(a, b, atol=0.0)
    assert [d.container_id for d in diffs] == a.container_ids
    assert all(d.status == "ok" and d.changed is False and d.max_abs_diff == 0.0 for d in diffs)
    assert first_divergence(diffs) is None
    assert diff_summary(diffs) == {"total": 7, "ok": 7, "shape_changed": 0, "only_in_a": 0, "only_in_b": 0,
                                   "changed": 0, "unchanged": 7}


def test_value_differences_are_measured_in_float64_against_atol():
    _, x, schema = spec_mlp()
    a = capture_run(schema, {"x": x}).trace
    b = capture_run(schema, {"x": x + 1e-3}).trace
    diffs = compare_traces(a, b, atol=1e-6)
    first = diffs[0]
    gap = (a.steps[0].value.double() - b.steps[0].value.double()).abs()
    assert first.max_abs_diff == gap.max().item() and first.mean_abs_diff == gap.mean().item()
    assert all(d.changed for d in diffs)
    assert first_divergence(diffs) is first
    loose = compare_traces(a, b, atol=10.0)
    assert not any(d.changed for d in loose) and diff_summary(loose)["unchanged"] == 7


def test_a_branch_taken_in_one_run_only_is_aligned_by_role():
    torch.manual_seed(0)
    model = Gate().eval()
    x = torch.randn(2, 4)
    schema = parse(model, {"x": x, "flag": True})
    with_branch = capture_run(schema, {"x": x, "flag": True}).trace
    without = capture_run(schema, {"x": x, "flag": False}).trace
    assert len(with_branch) == 9 and len(without) == 6
    diffs = compare_traces(with_branch, without)
    assert [(d.container_id_a, d.container_id_b, d.status) for d in diffs] == [
        ("input_0001", "input_0001", "ok"),
        ("pre_0002", "pre_0002", "ok"),
        ("Gate_0003", "Gate_0003", "ok"),
        ("extra_0004", None, "only_in_a"),
        ("Gate_0005", None, "only_in_a"),
        ("Gate_0006", None, "only_in_a"),
        ("head_0007", "head_0004", "ok"),
        ("Gate_0008", "Gate_0005", "ok"),
        ("output_0009", "output_0006", "ok"),
    ]
    assert [d.changed for d in diffs] == [False, False, False, True, True, True, True, True, True]
    assert first_divergence(diffs).container_id == "extra_0004"
    summary = diff_summary(diffs)
    assert summary["only_in_a"] == 3 and summary["only_in_b"] == 0 and summary["ok"] == 6
    reverse = compare_traces(without, with_branch)
    assert [d.status for d in reverse].count("only_in_b") == 3


def test_different_shapes_are_reported_as_shape_changed():
    _, _, schema = spec_mlp()
    a = capture_run(schema, {"x": torch.randn(2, 16)}).trace
    b = capture_run(schema, {"x": torch.randn(3, 16)}).trace
    diffs = compare_traces(a, b)
    assert [d.status for d in diffs] == ["shape_changed"] * 7
    assert all(d.changed and d.max_abs_diff is None for d in diffs)
    assert "shape (2, 16) -> (3, 16)" in diffs[0].describe()


def _trace(*values):
    trace = ActivationTrace()
    for i, value in enumerate(values, 1):
        cid = f"M_{i:04d}"
        trace.append(TraceStep(i, cid, "Result", "activation", f"v{i}", "op", "M",
                               TensorContainer(tuple(value.shape), str(value.dtype), value, cid, "activation")))
    return trace


def test_nan_against_nan_is_equal_and_nan_against_a_number_is_infinite():
    a = _trace(torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([float("nan")]))
    b = _trace(torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([0.0]))
    same, different = compare_traces(a, b)
    assert same.max_abs_diff == 0.0 and same.changed is False
    assert math.isinf(different.max_abs_diff) and different.changed


def test_a_dtype_change_counts_as_changed_even_with_equal_values():
    a = _trace(torch.tensor([1.0, 2.0]))
    b = _trace(torch.tensor([1.0, 2.0], dtype=torch.float64))
    (diff,) = compare_traces(a, b)
    assert diff.status == "ok" and diff.max_abs_diff == 0.0 and diff.changed


def test_gradient_traces_compare_the_same_way():
    _, x, schema = spec_mlp()
    records = [capture_run(schema, {"x": x.clone().requires_grad_(True)}, capture_grads=True) for _ in range(2)]
    records[0].outputs[0].sum().backward()
    records[1].outputs[0].pow(2).sum().backward()
    diffs = compare_traces(records[0].gradients, records[1].gradients)
    assert [d.container_id for d in diffs][0] == "grad_input_0001"
    assert all(isinstance(d, TraceDiff) and d.changed for d in diffs)


def test_bad_arguments_are_refused_with_the_fix():
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    with pytest.raises(TypeError, match="ActivationTrace"):
        compare_traces(trace.steps, trace)
    with pytest.raises(ValueError, match="atol"):
        compare_traces(trace, trace, atol=-1)


def test_complex_values_are_compared_by_the_magnitude_of_their_difference():
    a = _trace(torch.tensor([1 + 1j, 2j]))
    b = _trace(torch.tensor([1 + 1j, 0j]))
    (diff,) = compare_traces(a, b)
    assert diff.max_abs_diff == 2.0 and diff.mean_abs_diff == 1.0 and diff.changed
