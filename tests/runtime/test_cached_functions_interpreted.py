"""Caching decorators a forward calls run their body interpreted on a miss, the real cache deciding.

A `functools.lru_cache` / `functools.cache` method, a cached module global, and a decorator that
holds such a cache of the function it wraps (diffusers' `lru_cache_unless_export`): the schema
calls the user's own cache, so hits, misses and `cache_info()` are eager's, and on a miss the
function's lowered body runs (its variables are in a capture). The function's code is its own again
after every call, also when the body raises. A cached function called in a form the schema does
not interpret (through a local variable) is still reported as a "cached" row."""

from __future__ import annotations

import functools
import os
import sys
import threading

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run


def lru_cache_unless_export(maxsize=128, typed=False):
    """diffusers.utils.torch_utils.lru_cache_unless_export, as written there (torch >= 2.7)."""
    def outer_wrapper(fn):
        cached = functools.lru_cache(maxsize=maxsize, typed=typed)(fn)

        @functools.wraps(fn)
        def inner_wrapper(*args, **kwargs):
            compiler = getattr(torch, "compiler", None)
            is_exporting = bool(compiler and hasattr(compiler, "is_exporting") and compiler.is_exporting())
            is_compiling = bool(compiler and hasattr(compiler, "is_compiling") and compiler.is_compiling())
            if is_exporting or is_compiling:
                return fn(*args, **kwargs)
            return cached(*args, **kwargs)

        return inner_wrapper

    return outer_wrapper


@functools.cache
def _scaled_ones(n):
    base = torch.ones(n)
    return base * 3


@lru_cache_unless_export(maxsize=8)
def _ramp(n, step=0.5):
    ramp = torch.arange(n, dtype=torch.float32) * step
    return ramp + 1


class CachedGlobal(nn.Module):
    def forward(self, x):
        return x * _scaled_ones(x.shape[-1])


class WrappedGlobal(nn.Module):
    def forward(self, x):
        return x + _ramp(x.shape[-1], step=0.25)


class CachedMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @functools.lru_cache(maxsize=2)
    def table(self, n):
        ramp = torch.arange(n, dtype=torch.float32) * 0.5
        return ramp.exp()

    def forward(self, x):
        return self.fc(x) + self.table(x.shape[0])[:, None]


class WrappedMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    @lru_cache_unless_export(maxsize=None)
    def freqs(self, n, offset=0):
        ramp = torch.arange(offset, offset + n, dtype=torch.float32)
        return ramp / self.scale

    def forward(self, x):
        return x * self.freqs(x.shape[-1], offset=1)


def _cache_of(function):
    """The functools cache behind a cached function or a wrapper holding one."""
    if hasattr(function, "cache_info"):
        return function
    return next(c.cell_contents for c in function.__closure__ if hasattr(c.cell_contents, "cache_info"))


CASES = [(CachedGlobal, _scaled_ones, "_scaled_ones", "base"), (WrappedGlobal, _ramp, "_ramp", "ramp"),
         (CachedMethod, CachedMethod.table, "table", "ramp"), (WrappedMethod, WrappedMethod.freqs, "freqs", "ramp")]
INPUTS = [torch.randn(2, 4), torch.randn(3, 4), torch.randn(2, 6), torch.randn(1, 4), torch.randn(2, 2)]


@pytest.mark.parametrize("cls, cached, key, variable", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_cached_function_runs_its_body_interpreted_with_eagers_hits_and_misses(cls, cached, key, variable):
    torch.manual_seed(0)
    model = cls().eval()
    inputs = [torch.randn(b, 4) for b in (2, 3, 2, 1, 2, 3)] if cls is CachedMethod else INPUTS  # evictions too
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": inputs[0]})
    assert schema.skipped == {}
    assert schema.coverage().empty
    assert schema.methods[key].signature is not None  # the body is lowered, a block of the schema
    cache = _cache_of(cached)
    own_code = cache.__wrapped__.__code__

    cache.cache_clear()
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    eager_info = cache.cache_info()
    cache.cache_clear()
    got = [SchemaInterpreter().run(block=schema, scope={"x": x})[0] for x in inputs]
    assert cache.cache_info() == eager_info
    assert eager_info.hits > 0 and eager_info.misses > 0
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert cache.__wrapped__.__code__ is own_code

    # a miss runs the body interpreted: its variables are in the capture; a hit runs nothing
    cache.cache_clear()
    record = capture_run(schema, {"x": inputs[0]}, coverage=True)
    assert record.coverage().empty
    assert any(step.out_var == variable and step.frame_depth == 1 for step in record.trace.steps)
    if schema.methods[key].read_from is not None:  # a global: the trace names it as one
        assert any(step.description == f"Call to cached function {key}" for step in record.trace.steps)
    again = capture_run(schema, {"x": inputs[0]})
    assert not any(step.out_var == variable for step in again.trace.steps)
    assert torch.equal(again.outputs[0], expected[0])
    assert cache.__wrapped__.__code__ is own_code


class Fibonacci(nn.Module):
    """Recursion through the cache: each miss's body calls the cache again."""

    @functools.lru_cache(maxsize=None)
    def fib(self, n):
        if n < 2:
            return torch.tensor(float(n))
        return self.fib(n - 1) + self.fib(n - 2)

    def forward(self, x):
        return x * self.fib(x.shape[-1])


def test_recursion_through_the_cache_is_interpreted_and_counted_as_eager():
    model = Fibonacci()
    x = torch.randn(2, 9)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {} and schema.coverage().empty
    own_code = Fibonacci.fib.__wrapped__.__code__
    Fibonacci.fib.cache_clear()
    expected = model(x)
    eager_info = Fibonacci.fib.cache_info()
    Fibonacci.fib.cache_clear()
    record = capture_run(schema, {"x": x}, coverage=True)
    assert Fibonacci.fib.cache_info() == eager_info
    assert torch.equal(record.outputs[0], expected)
    assert record.coverage().empty
    assert max(step.frame_depth for step in record.trace.steps) > 2  # the recursion ran in the schema
    assert Fibonacci.fib.__wrapped__.__code__ is own_code


class Refuses(nn.Module):
    @functools.lru_cache(maxsize=None)
    def table(self, n):
        if n > 4:
            raise ValueError(f"no table for {n}")
        return torch.ones(n)

    def forward(self, x):
        return x + self.table(x.shape[-1])


def test_the_function_is_restored_when_the_interpreted_body_raises():
    model = Refuses()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": torch.randn(2, 3)})
    function = Refuses.table.__wrapped__
    own_code = function.__code__
    with pytest.raises(ValueError, match="no table for 6"):
        SchemaInterpreter().run(block=schema, scope={"x": torch.randn(2, 6)})
    assert function.__code__ is own_code
    with pytest.raises(ValueError, match="no table for 7"):
        model(torch.randn(2, 7))  # eager runs its own code
    assert Refuses.table.cache_info().misses == 3  # two raising misses and the parse's
    x = torch.randn(2, 4)
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


def test_a_cached_global_rebound_after_parsing_runs_what_the_name_holds_now():
    model = CachedGlobal()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    namespace = CachedGlobal.forward.__globals__
    kept = namespace["_scaled_ones"]
    namespace["_scaled_ones"] = functools.cache(lambda n: torch.full((n,), 7.0))
    try:
        assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], x * 7)
    finally:
        namespace["_scaled_ones"] = kept
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


class CachedThroughLocal(nn.Module):
    def forward(self, x):
        table = _scaled_ones
        return x * table(x.shape[-1])


def test_a_cached_function_called_through_a_local_is_still_reported_as_cached():
    _scaled_ones.cache_clear()
    model = CachedThroughLocal()
    x = torch.randn(2, 5)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    frame = schema.coverage()
    rows = frame[frame["kind"] == "cached"]
    assert len(rows) == 1, frame
    assert rows.iloc[0]["callee"].endswith("_scaled_ones") and "ran live" in rows.iloc[0]["reason"]
    assert "<root>" in schema.skipped
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


def test_qwenimage_transformer_pos_embed_is_interpreted_with_nothing_skipped():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=8, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4)).eval()
    inputs = {"hidden_states": torch.randn(1, 16, 8), "encoder_hidden_states": torch.randn(1, 5, 16),
              "encoder_hidden_states_mask": torch.ones(1, 5), "timestep": torch.tensor([0.5]),
              "img_shapes": [(1, 4, 4)], "return_dict": False}
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    assert schema.skipped == {}
    assert schema.coverage().empty
    pos_embed = schema.find("pos_embed")
    assert {"_compute_video_freqs", "_get_device_freqs"} <= set(pos_embed.methods)
    rope = type(model.pos_embed)
    caches = [_cache_of(rope._compute_video_freqs), _cache_of(rope._get_device_freqs)]
    for cache in caches:
        cache.cache_clear()
    with torch.no_grad():
        expected = [model(**inputs)[0], model(**inputs)[0]]
    eager_info = [cache.cache_info() for cache in caches]
    for cache in caches:
        cache.cache_clear()
    record = capture_run(schema, dict(inputs), coverage=True)
    got = [record.outputs[0], SchemaInterpreter().run(block=schema, scope=dict(inputs))[0]]
    assert [cache.cache_info() for cache in caches] == eager_info
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert record.coverage().empty
    assert any(step.block_path == "pos_embed" and step.out_var == "freqs_height" for step in record.trace.steps)


_IN_BODY = threading.Event()
_RELEASE = threading.Event()
_SEEN_CODES = []


def _wait_for_the_other_thread():
    _IN_BODY.set()
    assert _RELEASE.wait(10)


class WaitsInItsBody(nn.Module):
    @functools.lru_cache(maxsize=None)
    def table(self, n, wait=True):
        _SEEN_CODES.append(sys._getframe().f_code)
        if wait:
            _wait_for_the_other_thread()
        return torch.ones(n)

    def forward(self, x):
        return x + self.table(x.shape[-1])


def test_another_thread_calling_the_function_during_a_schema_miss_runs_its_own_code():
    model = WaitsInItsBody()
    x = torch.randn(2, 3)
    _RELEASE.set()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    function = WaitsInItsBody.table.__wrapped__
    own_code = function.__code__
    WaitsInItsBody.table.cache_clear()
    _IN_BODY.clear(), _RELEASE.clear()
    _SEEN_CODES.clear()
    results = {}
    runner = threading.Thread(target=lambda: results.setdefault(
        "schema", SchemaInterpreter().run(block=schema, scope={"x": x})[0]))
    runner.start()
    assert _IN_BODY.wait(10)  # the schema's miss is inside the interpreted body, trampoline in place
    assert function.__code__ is not own_code
    results["other"] = function(model, 5, wait=False)  # another caller: the function's own code
    _RELEASE.set()
    runner.join(10)
    # the schema's miss ran generated code (no frame of the original), the other caller its own code
    assert len(_SEEN_CODES) == 2 and _SEEN_CODES[0] is not own_code and _SEEN_CODES[1] is own_code
    assert torch.equal(results["other"], torch.ones(5))
    assert torch.equal(results["schema"], model(x))
    assert function.__code__ is own_code
