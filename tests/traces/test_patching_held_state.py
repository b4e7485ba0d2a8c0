"""Activation patching's reuse and writes into objects that globals, closure cells and defaults hold
(parser/python_state.py): a counter attribute of a global object, a deque, a defaultdict, a list in a
global dict, a cache dict on a global object, a tensor changed in place, a set. A reused (skipped)
call would leave such state other than the real runs leave it; the check sees the write, turns
reuse off with a `PatchingReuseWarning` naming it, and the state and the table equal `reuse=False`'s."""

from __future__ import annotations

import gc
import re
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("pandas")

from nnschemaparser import NNParser, activation_patching  # noqa: E402
from nnschemaparser.traces.patching import PatchingReuseWarning  # noqa: E402
from tests.support import gc_timer  # noqa: E402
from tests.support import held_state_functions as hs  # noqa: E402
from tests.support.held_state_functions import (closed_bias, counted_bias, defaulted_bias, filed_bias,  # noqa: E402
                                                remembered_bias, seen_bias, stored_bias, summed_bias, tallied_bias,
                                                taken_count)


class _Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, h, bias):
        scores = h @ h.transpose(-1, -2) / h.shape[-1] + bias
        return h + torch.softmax(scores, -1) @ self.proj(h)


class _Stack(nn.Module):
    def __init__(self, width: int = 8, layers: int = 2):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layers = nn.ModuleList(_Layer(width) for _ in range(layers))


class _Counted(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = counted_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Remembered(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = remembered_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Tallied(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = tallied_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Filed(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = filed_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Stored(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = stored_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Summed(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = summed_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Seen(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = seen_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Closed(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = closed_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Defaulted(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = defaulted_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _ReadsCount(_Stack):
    """Counts on a global object before the sites, and takes the count after them (each whole run
    leaves the counter at 0, so the parse's runs agree)."""

    def forward(self, x):
        h = self.embed(x)
        bias = counted_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h * taken_count()


_AT = "call=embed, call=layers.*"
_MODULE = r"tests\.support\.held_state_functions"


def _metric(out) -> torch.Tensor:
    return out[:, -1, 0].sum() - out[:, -1, 1].sum()


def _build(model_class):
    torch.manual_seed(0)
    model = model_class().eval()
    x = torch.randn(2, 5, 8)
    y = x.clone()
    y[:, 2] = torch.randn(2, 8)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x.clone()})
    return schema, {"x": x}, {"x": y}


def _patch_twice(model_class, at: str = _AT):
    """The sweep with reuse and with `reuse=False`, each from the reset state: (its table, the state
    it left, the reuse warnings' messages) for each."""
    schema, clean, corrupted = _build(model_class)
    out = []
    for reuse in (True, False):
        hs.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = activation_patching(schema, clean, corrupted, _metric, at=at, reuse=reuse)
        out.append((table, hs.held_state(), [str(w.message) for w in caught
                                             if issubclass(w.category, PatchingReuseWarning)]))
    hs.reset()
    return out


@pytest.mark.parametrize("model_class, function, written", [
    (_Counted, "counted_bias", rf"{_MODULE}\.STATS\.calls"),
    (_Remembered, "remembered_bias", rf"{_MODULE}\.RECENT\[\.\.\.\]"),
    (_Tallied, "tallied_bias", rf"{_MODULE}\.COUNTS\[5\]"),
    (_Filed, "filed_bias", rf"{_MODULE}\.TABLES\['lengths'\]\[\.\.\.\]"),
    (_Stored, "stored_bias", rf"{_MODULE}\.STATS\.cache\[5\]"),
    (_Summed, "summed_bias", rf"{_MODULE}\.TOTAL \(a tensor changed in place\)"),
    (_Seen, "seen_bias", rf"{_MODULE}\.SEEN\[\.\.\.\]"),
    (_Closed, "closed_bias", r"closed_bias's closure variable stats\.calls"),
    (_Defaulted, "defaulted_bias", r"defaulted_bias's default seen\[\.\.\.\]"),
], ids=["object-attribute", "deque", "defaultdict", "list-in-dict", "cache-on-object", "tensor-in-place", "set",
        "cell-object", "default-deque"])
def test_a_write_into_an_object_a_global_holds_turns_reuse_off_and_leaves_the_state_plain_runs_leave(
        model_class, function, written):
    (table, state, warned), (plain, plain_state, _) = _patch_twice(model_class)
    assert state == plain_state  # every run made the call: its write is made each time
    assert list(table["metric"]) == list(plain["metric"])
    assert table.attrs["reused"] == 0 and table.attrs["reuse"].startswith("off: ")
    assert any(re.search(rf"{function} wrote state \(.*{written}", message) for message in warned), warned


def test_a_counter_written_before_the_sites_and_read_after_them_gives_the_metrics_of_plain_runs():
    (table, state, warned), (plain, plain_state, _) = _patch_twice(_ReadsCount)
    assert list(table["metric"]) == list(plain["metric"])  # each patched run reads the count the real run has
    assert state == plain_state and (table["effect"] != 0).all()
    assert any(re.search(rf"counted_bias wrote state \(.*{_MODULE}\.STATS\.calls", m) for m in warned), warned


def test_state_read_but_not_written_keeps_reuse_on():
    hs.reset()
    hs.STATS.calls = 3  # read by the forward, written by no call
    try:
        schema, clean, corrupted = _build(_ReadsAfterOnly)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PatchingReuseWarning)
            table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
        plain = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    finally:
        hs.reset()
    assert table.attrs["reuse"] == "on" and table.attrs["reused"] > 0
    assert list(table["metric"]) == list(plain["metric"])


def test_a_garbage_collector_callback_that_rebinds_its_globals_during_the_clean_run_keeps_reuse_on():
    # a callback in gc.callbacks runs inside the clean run at every collection (here, with a threshold
    # of 1, many): what it writes is no state of the model's, and must not turn reuse off
    schema, clean, corrupted = _build(_ReadsAfterOnly)
    thresholds = gc.get_threshold()
    gc.callbacks.append(gc_timer.on_collection)
    seen = gc_timer.SEEN
    gc.set_threshold(1, 1, 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PatchingReuseWarning)
            table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(gc_timer.on_collection)
    assert gc_timer.SEEN > seen  # it ran, during the sweep
    assert table.attrs["reuse"] == "on" and table.attrs["reused"] > 0
    plain = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    assert list(table["metric"]) == list(plain["metric"])


class _ReadsAfterOnly(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = hs.scaled_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h



def test_a_transformers_mask_function_counting_on_a_global_object_turns_reuse_off(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2 import modeling_gpt2

    monkeypatch.setattr(modeling_gpt2, "create_causal_mask", hs.counted_causal_mask)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, use_cache=False)
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, 3] = (other[0, 3] + 1) % 64
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"input_ids": ids.clone()})
    at = "call=transformer.drop, call=transformer.h.*"

    def metric(out) -> torch.Tensor:
        return out.logits[0, -1, 0] - out.logits[0, -1, 1]

    results = []
    for reuse in (True, False):
        hs.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = activation_patching(schema, {"input_ids": ids}, {"input_ids": other}, metric, at=at, reuse=reuse)
        results.append((table, hs.STATS.calls, [str(w.message) for w in caught]))
    hs.reset()
    (table, calls, warned), (plain, plain_calls, _) = results
    assert calls == plain_calls == 2 + len(table)  # the mask is built in every run
    assert list(table["metric"]) == list(plain["metric"])
    assert any(re.search(rf"counted_causal_mask wrote state \(.*{_MODULE}\.STATS\.calls", m) for m in warned), warned
