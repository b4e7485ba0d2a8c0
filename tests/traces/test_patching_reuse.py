"""What a patched run reuses besides block calls (runtime/reuse.py): calls of Python functions made
by the blocks holding the sites (a mask built by a module-level function, transformers'
`create_causal_mask`), and whole runs whose patch leaves the clean value as it was. Every table
equals `reuse=False` (and forward-hook patching) bit for bit; a function that writes Python state or
changes its argument in place is not reused, and the warning says which and why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("pandas")

from nnschemaparser import NNParser, activation_patching  # noqa: E402
from nnschemaparser.traces.patching import PatchingReuseWarning  # noqa: E402
from tests.support import patching_functions as fns  # noqa: E402
from tests.support.patching_functions import (bumped_bias, causal_bias, counting as _counting, logged_bias,  # noqa: E402
                                              noisy_bias)


class _Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, h, bias):
        scores = h @ h.transpose(-1, -2) / h.shape[-1] + bias
        return h + torch.softmax(scores, -1) @ self.proj(h)


class _Stack(nn.Module):
    def __init__(self, width: int = 8, layers: int = 3):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layers = nn.ModuleList(_Layer(width) for _ in range(layers))


class _Pure(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = causal_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Logged(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = logged_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Noisy(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = noisy_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


class _Bumped(_Stack):
    def forward(self, x):
        h = self.embed(x)
        bias = bumped_bias(h, 1e4)
        for layer in self.layers:
            h = layer(h, bias)
        return h


_AT = "call=embed, call=layers.*"


def _metric(out) -> torch.Tensor:
    return out[:, -1, 0].sum() - out[:, -1, 1].sum()


def _build(model_class):
    torch.manual_seed(0)
    model = model_class().eval()
    x = torch.randn(2, 5, 8)
    y = x.clone()
    y[:, 2] = torch.randn(2, 8)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x.clone()})
    return model, schema, {"x": x}, {"x": y}


def _hooked(model, clean, corrupted) -> list:
    """The sweep by hand: each site's output replaced by the corrupted run's with a forward hook."""
    modules = [model.embed, *model.layers]
    kept: list = []
    handles = [m.register_forward_hook(lambda _m, _a, out: kept.append(out.clone())) for m in modules]
    with torch.no_grad():
        model(**{k: v.clone() for k, v in corrupted.items()})
        for handle in handles:
            handle.remove()
        out = []
        for module, value in zip(modules, kept):
            handle = module.register_forward_hook(lambda _m, _a, _o, _v=value: _v)
            out.append(_metric(model(**{k: v.clone() for k, v in clean.items()})).item())
            handle.remove()
    return out


def test_a_pure_function_call_before_the_site_is_reused_and_changes_no_bit():
    model, schema, clean, corrupted = _build(_Pure)
    with _counting(causal_bias) as reusing:
        table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
    with _counting(causal_bias) as plain:
        again = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    assert list(table["metric"]) == list(again["metric"]) == _hooked(model, clean, corrupted)
    # clean and corrupted runs, then only the embedding's patched run (the mask reads the patched h)
    assert (reusing[0], plain[0]) == (3, 6)
    assert table.attrs["reuse"] == "on" and (table["effect"] != 0).all()


def test_a_function_that_writes_python_state_is_never_reused_and_turns_reuse_off():
    model, schema, clean, corrupted = _build(_Logged)
    fns.LOG.clear()
    with pytest.warns(PatchingReuseWarning, match=r"logged_bias wrote state \(tests\.support\.patching_functions\."
                                                  r"LOG\[\.\.\.\]\)"):
        with _counting(causal_bias) as count:
            table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
    assert count[0] == 6 and len(fns.LOG) == 6  # every run made the call: its write is made each time
    assert table.attrs["reuse"].startswith("off: ") and "logged_bias" in table.attrs["reuse"]
    assert table.attrs["reused"] == 0
    plain = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    assert list(table["metric"]) == list(plain["metric"]) == _hooked(model, clean, corrupted)
    fns.LOG.clear()


def test_a_function_that_draws_random_numbers_is_named_and_turns_reuse_off():
    model, schema, clean, corrupted = _build(_Noisy)
    with pytest.warns(PatchingReuseWarning, match=r"the run drew random numbers.*noisy_bias drew random numbers"):
        with _counting(noisy_bias) as count:
            table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
    assert count[0] == 6 and table.attrs["reused"] == 0
    plain = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    assert list(table["metric"]) == list(plain["metric"])  # each run starts from the same random state


def test_a_function_that_changes_its_argument_in_place_runs_in_every_patched_run():
    model, schema, clean, corrupted = _build(_Bumped)
    with pytest.warns(PatchingReuseWarning, match="changed an argument in place: "
                                                  "tests.support.patching_functions.bumped_bias"):
        with _counting(bumped_bias) as count:
            table = activation_patching(schema, clean, corrupted, _metric, at=_AT)
    assert count[0] == 6  # never answered from the recording
    assert table.attrs["reuse"] == "on" and table.attrs["reused"] > 0  # the layers after it still are
    plain = activation_patching(schema, clean, corrupted, _metric, at=_AT, reuse=False)
    assert list(table["metric"]) == list(plain["metric"]) == _hooked(model, clean, corrupted)


def test_a_patch_equal_to_the_clean_value_makes_no_run_and_gives_the_clean_metric():
    model, schema, clean, corrupted = _build(_Pure)
    with _counting(causal_bias) as count:
        table = activation_patching(schema, clean, corrupted, _metric, at="call=layers.1", per="position")
    plain = activation_patching(schema, clean, corrupted, _metric, at="call=layers.1", per="position", reuse=False)
    assert list(table["metric"]) == list(plain["metric"])
    # causal: positions 0 and 1 of the corrupted run are the clean run's bits, so those rows made no run
    assert table.attrs["unchanged"] == 2 and plain.attrs["unchanged"] == 0
    assert list(table["effect"][:2]) == [0.0, 0.0] and (table["effect"][2:] != 0).all()
    assert count[0] == 2  # the clean and corrupted runs; the patched runs reused the mask


def test_a_call_site_is_patched_where_the_call_returns_in_a_run_with_no_observer(monkeypatch):
    import nnschemaparser.traces.patching as patching

    model, schema, clean, corrupted = _build(_Pure)
    plain_runs: list = []
    original = patching.run_plain
    monkeypatch.setattr(patching, "run_plain", lambda pair, scope: plain_runs.append(1) or original(pair, scope))
    table = activation_patching(schema, clean, corrupted, _metric, at=_AT, per="position")
    assert len(plain_runs) == len(table) - table.attrs["unchanged"] and table.attrs["unchanged"] > 0
    again = activation_patching(schema, clean, corrupted, _metric, at=_AT, per="position", reuse=False)
    assert list(table["metric"]) == list(again["metric"])
    # a site that is no call's result (a variable of the layer) is patched by the observed run
    plain_runs.clear()
    table = activation_patching(schema, clean, corrupted, _metric, at="layers.1:scores")
    assert plain_runs == [] and table.attrs["reuse"] == "on"
    assert list(table["metric"]) == list(activation_patching(schema, clean, corrupted, _metric, at="layers.1:scores",
                                                             reuse=False)["metric"])
