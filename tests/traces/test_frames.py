"""DataFrames of traces and diffs: columns, one row per step, statistics equal to torch's own."""

import math

import pandas
import pytest
import torch

from nnschemaparser import CaptureLimits
from nnschemaparser.traces.compare import compare_traces
from nnschemaparser.traces.frames import DIFF_COLUMNS, STEP_COLUMNS, diffs_to_dataframe, tensor_statistics
from nnschemaparser.traces.record import capture_run
from tests.support.trace_models import NanInf, parse, spec_mlp

EXPECTED_COLUMNS = ["step", "container_id", "slot_type", "description", "out_var", "op_name", "block_path",
                    "frame_depth", "shape", "dtype", "numel", "mean", "std", "min", "max", "abs_sum", "l2", "n_nan",
                    "n_inf", "frac_zero"]


def _torch_stats(t):
    d = t.detach().double()
    return {"numel": d.numel(), "mean": d.mean().item(), "std": d.std().item(), "min": d.min().item(),
            "max": d.max().item(), "abs_sum": d.abs().sum().item(), "l2": d.pow(2).sum().sqrt().item(),
            "n_nan": int(d.isnan().sum()), "n_inf": int(d.isinf().sum()), "frac_zero": float((d == 0).double().mean())}


def _same(a, b):
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    return a == pytest.approx(b, rel=1e-12, abs=0)


def test_activation_frame_has_one_row_per_step_and_the_spec_columns():
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    frame = trace.to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns)[:len(EXPECTED_COLUMNS)] == EXPECTED_COLUMNS
    assert list(frame.columns) == list(STEP_COLUMNS)
    assert len(frame) == len(trace)
    assert list(frame["container_id"]) == trace.container_ids
    assert list(frame["out_var"]) == [s.out_var for s in trace]
    assert list(frame["shape"]) == [tuple(s.value.shape) for s in trace]
    assert list(frame["frame_depth"]) == [0, 1, 0, 0, 1, 0, 0]


def test_statistics_equal_torch_on_every_step():
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    frame = trace.to_dataframe()
    for row, step in zip(frame.to_dict("records"), trace):
        for name, value in _torch_stats(step.value).items():
            assert _same(row[name], value), (step.container_id, name)
    assert frame.loc[frame.container_id == "MLP_0004", "frac_zero"].item() > 0.2, "relu zeroes part of its input"


def test_nan_and_inf_are_counted_and_propagate_like_torch():
    x = torch.tensor([-1.0, 0.0, 2.0, 3.0])
    trace = capture_run(parse(NanInf(), {"x": x}), {"x": x}).trace
    row = trace.to_dataframe().set_index("container_id").loc["NanInf_0003"]
    value = torch.log(x) / x
    assert row.n_nan == 1 and row.n_inf == 1  # log(-1) / -1 is NaN, log(0) / 0 is -inf
    assert row.n_nan == int(value.isnan().sum()) and row.n_inf == int(value.isinf().sum())
    assert math.isnan(row["mean"]) and math.isnan(row["max"])


def test_gradient_frame_joins_the_activation_frame_on_the_activation_id():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x.clone().requires_grad_(True)}, capture_grads=True)
    record.outputs[0].pow(2).sum().backward()
    activations = record.trace.to_dataframe()
    gradients = record.gradients.to_dataframe()
    assert list(gradients.columns) == list(STEP_COLUMNS)
    assert set(gradients.slot_type) == {"gradient"}
    joined = activations.merge(gradients, left_on="container_id", right_on="source_container_id",
                               suffixes=("", "_grad"))
    assert len(joined) == len(gradients) == 7
    assert list(joined.container_id_grad) == ["grad_" + c for c in joined.container_id]
    for row, step in zip(gradients.to_dict("records"), record.gradients):
        assert _same(row["l2"], step.value.double().norm().item())


def test_omitted_values_keep_numel_and_leave_statistics_empty():
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}, limits=CaptureLimits(max_tensors=1)).trace
    frame = trace.to_dataframe()
    assert list(frame.numel) == [32, 64, 64, 64, 16, 16, 16]
    assert frame["mean"].isna().tolist() == [False] + [True] * 6
    assert frame["omitted"].notna().tolist() == [False] + [True] * 6


def test_tensor_statistics_of_booleans_and_empty_tensors():
    flags = tensor_statistics(torch.tensor([True, False, True, True]))
    assert flags["mean"] == 0.75 and flags["frac_zero"] == 0.25 and flags["abs_sum"] == 3.0
    empty = tensor_statistics(torch.zeros(0, 3))
    assert empty["numel"] == 0 and math.isnan(empty["mean"]) and empty["n_nan"] == 0
    single = tensor_statistics(torch.tensor([2.0]))
    assert math.isnan(single["std"]) and single["l2"] == 2.0


def test_diffs_frame_has_one_row_per_diff():
    _, x, schema = spec_mlp()
    a = capture_run(schema, {"x": x}).trace
    b = capture_run(schema, {"x": x * 2}).trace
    diffs = compare_traces(a, b)
    frame = diffs_to_dataframe(diffs)
    assert list(frame.columns) == list(DIFF_COLUMNS)
    assert len(frame) == 7
    assert list(frame.max_abs_diff) == [d.max_abs_diff for d in diffs]
    assert list(frame.status) == ["ok"] * 7 and frame.changed.all()


def test_parquet_export_round_trips(tmp_path):
    pytest.importorskip("pyarrow")
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    path = trace.to_parquet(tmp_path / "trace.parquet")
    back = pandas.read_parquet(path)
    assert list(back.container_id) == trace.container_ids
    assert list(back["mean"]) == list(trace.to_dataframe()["mean"])
    assert [tuple(s) for s in back["shape"]] == [tuple(s.value.shape) for s in trace]
