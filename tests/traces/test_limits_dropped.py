"""CaptureLimits never drops silently: trace.dropped names each dropped value, one warning sums them up, and
limit_policy chooses the earliest or the latest values (keep= chooses which ones at all)."""

from __future__ import annotations

import warnings

import pytest
import torch

from nnschemaparser import CaptureLimits, CaptureLimitWarning, capture_run, load_trace, save_trace
from tests.support.debugger_models import llama_case
from tests.support.trace_models import spec_mlp


def _capture(schema, scope, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = capture_run(schema, scope, **options)
    return record, [w for w in caught if issubclass(w.category, CaptureLimitWarning)]


def test_dropped_values_are_named_with_block_variable_and_bytes_and_warned_once():
    _, x, schema = spec_mlp()
    limits = CaptureLimits(max_bytes=2 * 16 * 4 + 2 * 32 * 4 + 100)  # the input and one hidden tensor
    record, warned = _capture(schema, {"x": x}, limits=limits)
    full = capture_run(schema, {"x": x}).trace
    dropped = record.trace.dropped
    assert list(dropped.columns) == ["step", "container_id", "block_path", "out_var", "shape", "dtype", "bytes",
                                     "reason"]
    expected = full.steps[2:]
    assert list(dropped["container_id"]) == [s.container_id for s in expected]
    assert list(dropped["out_var"]) == [s.out_var for s in expected]
    assert list(dropped["block_path"]) == [s.block_path for s in expected]
    assert list(dropped["bytes"]) == [s.value.numel() * 4 for s in expected]
    assert all(r.startswith("max_bytes quota") for r in dropped["reason"])
    assert len(warned) == 1
    message = str(warned[0].message)
    assert f"dropped {len(expected)} of {len(full)} values" in message and "trace.dropped" in message
    assert "limit_policy='latest'" in message and "keep=" in message


def test_nothing_dropped_means_an_empty_table_and_no_warning():
    _, x, schema = spec_mlp()
    record, warned = _capture(schema, {"x": x}, limits=CaptureLimits(max_bytes=1 << 20))
    assert record.trace.dropped.empty and not warned


def test_limit_policy_latest_keeps_the_last_values_that_fit_bit_for_bit():
    _, inputs, schema = llama_case(4)
    full = capture_run(schema, dict(inputs)).trace
    limits = CaptureLimits(max_bytes=40_000, max_tensors=10**6)
    record, warned = _capture(schema, dict(inputs), limits=limits, limit_policy="latest")
    kept = [s for s in record.trace if s.value is not None]
    assert kept and warned and "keeping the latest ones" in str(warned[0].message)
    assert kept[-1].step == full.steps[-1].step  # the model's output is among the kept values
    assert sum(s.value.numel() * s.value.element_size() for s in kept) <= 40_000
    # the kept values are the run's tail: after the first kept one, a value is missing only when it
    # alone is larger than max_bytes
    first = kept[0].step
    assert all(s.value is not None or s.omitted.startswith("max_bytes quota: this tensor alone")
               for s in record.trace if s.step >= first)
    assert any(s.value is None for s in record.trace if s.step < first)
    for step in kept:
        assert torch.equal(step.value, full.by_container(step.container_id).value)
    evicted = record.trace.dropped
    assert len(evicted) == len(full) - len(kept)
    assert all("evicted by later values" in r or r.startswith("max_bytes quota: this tensor alone")
               for r in evicted["reason"])
    one = record.trace.by_container(evicted["container_id"].iloc[0])
    source = full.by_container(one.container_id).value.reshape(-1)
    assert list(one.sample) == source[:len(one.sample)].tolist() and len(one.sample) > 0


def test_earliest_and_latest_keep_opposite_ends_and_keep_narrows_what_counts():
    _, inputs, schema = llama_case(4)
    limits = CaptureLimits(max_bytes=40_000, max_tensors=10**6)
    early, _ = _capture(schema, dict(inputs), limits=limits)
    late, _ = _capture(schema, dict(inputs), limits=limits, limit_policy="latest")
    early_kept = {s.step for s in early.trace if s.value is not None}
    late_kept = {s.step for s in late.trace if s.value is not None}
    assert max(early_kept) < min(late_kept)
    chosen, warned = _capture(schema, dict(inputs), limits=limits, keep="model.layers.3.mlp")
    assert not warned and chosen.trace.dropped.empty and all(s.value is not None for s in chosen.trace)


def test_the_dropped_table_survives_a_saved_trace(tmp_path):
    _, x, schema = spec_mlp()
    record, _ = _capture(schema, {"x": x}, limits=CaptureLimits(max_tensors=3, max_bytes=1 << 20))
    path = save_trace(record.trace, tmp_path / "t.json")
    loaded = load_trace(path)
    assert list(loaded.dropped["container_id"]) == list(record.trace.dropped["container_id"])
    assert len(loaded.dropped) == 4


def test_a_bad_policy_is_refused():
    with pytest.raises(ValueError, match="limit_policy"):
        from nnschemaparser import ActivationRecorder
        ActivationRecorder(limits=CaptureLimits(), limit_policy="middle")
