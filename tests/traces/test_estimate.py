"""estimate_capture: the memory a capture keeps, estimated before it runs, and the refusal built on it.

"Measured" is `kept_bytes(trace)`: the distinct storages a real capture's trace holds (the module
docstring of traces/estimate.py says why). A comparison with a fresh process's RSS was dropped: it read
`ru_maxrss`, the process's lifetime high-water mark, which the parse and the warm run set before the
capture, so it did not measure the capture (302 MB estimated against 907 MB of 'growth' on a fresh CI
machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from nnschemaparser import CaptureLimits, CaptureTooLargeError, SchemaRunError, capture_run, estimate_capture
from nnschemaparser.traces import estimate as estimate_module
from nnschemaparser.traces.estimate import kept_bytes
from tests.support.debugger_models import llama_case, tiny_case
from tests.support.trace_models import ViewMutation, parse, spec_mlp

ROOT = Path(__file__).resolve().parents[2]


def _within(estimate, trace, tolerance=0.15):
    measured = kept_bytes(trace)
    assert measured > 0
    assert abs(estimate.total_bytes - measured) <= tolerance * measured, (estimate.total_bytes, measured)


@pytest.mark.parametrize("keep", [None, "model.layers.1", "model.layers.*.mlp:*, slot=output"])
def test_the_estimate_of_a_llama_capture_is_within_15_percent_of_what_it_keeps(keep):
    _, inputs, schema = llama_case(3)
    estimate = estimate_capture(schema, keep=keep, scope=dict(inputs))
    assert estimate.method == "dry run"
    record = capture_run(schema, dict(inputs), keep=keep)
    _within(estimate, record.trace)
    assert estimate.steps == len(record.trace)


@pytest.mark.parametrize("keep", [None, "transformer.h.0"])
def test_the_estimate_of_a_gpt2_capture_is_within_15_percent(keep):
    _, inputs, schema = tiny_case("gpt2")
    estimate = estimate_capture(schema, keep=keep, scope=dict(inputs))
    _within(estimate, capture_run(schema, dict(inputs), keep=keep).trace)


def test_the_estimate_of_an_mlp_and_of_aliasing_views_counts_each_storage_once():
    _, x, schema = spec_mlp()
    _within(estimate_capture(schema, scope={"x": x}), capture_run(schema, {"x": x}).trace)
    v = torch.randn(3, 2)
    views = parse(ViewMutation(), {"x": v})
    record = capture_run(views, {"x": v.clone()})
    estimate = estimate_capture(views, scope={"x": v.clone()})
    _within(estimate, record.trace)
    assert estimate.total_bytes < sum(s.value.numel() * s.value.element_size() for s in record.trace if s.value is not None)


def test_the_estimate_follows_the_inputs_it_is_given_and_breaks_down_per_block():
    _, inputs, schema = llama_case(2)
    short = estimate_capture(schema, scope=dict(inputs))
    longer = dict(inputs, input_ids=torch.randint(0, 100, (1, 32)))
    long = estimate_capture(schema, scope=longer)
    _within(long, capture_run(schema, longer).trace)
    assert long.total_bytes > 3 * short.total_bytes
    frame = long.frame()
    assert list(frame.columns) == ["block_path", "steps", "bytes", "share"]
    assert frame["bytes"].sum() == long.total_bytes and frame["steps"].sum() == long.steps
    assert "model.layers.1.self_attn" in set(frame["block_path"])


class _ValueBranch(nn.Module):
    """Reads a value (`.item()`): no dry run on fake tensors; the estimate says it fell back."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.sum().item() > 0:
            y = y * 2
        return y


def test_a_forward_reading_values_falls_back_to_the_parse_shapes_and_says_so():
    x = torch.randn(4, 8)
    schema = parse(_ValueBranch(), {"x": x})
    estimate = estimate_capture(schema, scope={"x": x})
    assert estimate.method == "parse shapes" and "dry run could not run" in estimate.note
    assert estimate.total_bytes > 0


def test_refusal_against_limits_names_the_estimate_the_limit_and_the_fixes():
    _, inputs, schema = llama_case(2)
    with pytest.raises(CaptureTooLargeError) as caught:
        capture_run(schema, dict(inputs), limits=CaptureLimits(max_bytes=50_000, max_tensors=10**6),
                    limit_policy="refuse")
    message = str(caught.value)
    assert "would keep about" in message and "CaptureLimits(max_bytes=50000)" in message
    assert "keep=" in message and "shorter inputs" in message and "limit_policy" in message
    assert isinstance(caught.value, SchemaRunError) and caught.value.estimate.total_bytes > 50_000
    fits = estimate_capture(schema, keep="model.layers.0.mlp", scope=dict(inputs)).value_bytes  # as max_bytes counts
    record = capture_run(schema, dict(inputs), keep="model.layers.0.mlp", limit_policy="refuse",
                         limits=CaptureLimits(max_bytes=fits, max_tensors=10**6))
    assert all(s.value is not None for s in record.trace)


def test_a_capture_larger_than_the_available_memory_is_refused_before_it_runs():
    available = estimate_module.available_memory()
    assert available is not None and available > 0
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    schema = parse(model, {"input": torch.randn(4, 1024)})
    rows = available // (1024 * 4) + 1  # one activation alone is larger than what is available
    huge = torch.zeros(1, 1024).expand(rows, 1024)  # a view: no memory of its own
    with pytest.raises(CaptureTooLargeError, match="of the available memory") as caught:
        capture_run(schema, {"input": huge})
    assert "memory_check=False" in str(caught.value) and caught.value.estimate.method == "dry run"


def test_bad_arguments_are_refused():
    _, x, schema = spec_mlp()
    with pytest.raises(SchemaRunError, match="ModelBlockSchema"):
        estimate_capture("not a schema")
    with pytest.raises(SchemaRunError, match="scope must be a dict"):
        estimate_capture(schema, scope=[x])
    with pytest.raises(ValueError, match="limit_policy"):
        capture_run(schema, {"x": x}, limits=CaptureLimits(), limit_policy="newest")


class _Squashed(nn.Module):
    """A 1 MiB value made and replaced three times: without autograd two are alive at a time; with
    it every sigmoid's result is saved for backward, so three are."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 4096)  # 128 KiB of weights: there before the run, never counted

    def forward(self, x):
        h = self.inner(x)
        h = torch.sigmoid(h)
        h = torch.sigmoid(h)
        h = torch.sigmoid(h)
        return h.sum(dim=-1)


@pytest.mark.parametrize("grad, alive", [(False, 2), (True, 3)])
def test_the_peak_counts_the_working_memory_alive_at_once_and_what_autograd_saves_but_not_the_weights(grad, alive):
    x = torch.randn(64, 8)  # each 64 x 4096 float32 value: 1 MiB
    schema = parse(_Squashed(), {"x": x})
    with torch.set_grad_enabled(grad):
        estimate = estimate_capture(schema, keep="slot=output", scope={"x": x})
    assert estimate.method == "dry run" and estimate.total_bytes == 64 * 4  # only the output is kept
    assert alive * 2 ** 20 <= estimate.peak_bytes <= alive * 2 ** 20 + 4096, estimate.peak_bytes
    assert "peak" in str(estimate)


def test_a_capture_whose_peak_does_not_fit_the_memory_is_refused_naming_the_peak(monkeypatch):
    x = torch.randn(64, 8)
    schema = parse(_Squashed(), {"x": x})
    monkeypatch.setattr(estimate_module, "available_memory", lambda: 2 * 2 ** 20)  # 70%: 1.4 MiB
    with pytest.raises(CaptureTooLargeError) as caught:
        with torch.no_grad():
            capture_run(schema, {"x": x}, keep="slot=output")  # keeps 256 bytes, needs 2 MiB on its way
    assert "at its peak (keeping 256 bytes)" in str(caught.value)
