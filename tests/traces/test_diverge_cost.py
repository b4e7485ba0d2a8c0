"""`diverge`'s shortcuts (issue 39, point 5) give the report the full four runs give: the reference
replay left out where it would be a's own run again, and a row's error or cast taken from the row
before it when both are the very same tensors."""

from __future__ import annotations

import copy

import pytest
import torch

import nnschemaparser.traces.diverge as diverge_module
from nnschemaparser import diverge
from nnschemaparser.traces.diverge_runs import Recent
from nnschemaparser.traces.diverge_bounds import local_error, relative_error
from tests.support.diverge_models import gpt2, llama, same_weights, variant_module

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")


def _same_tables(fast, full) -> None:
    assert list(fast.columns) == list(full.columns) and len(fast) == len(full)
    for column in fast.columns:
        for x, y in zip(fast[column], full[column]):
            assert x == y or (x != x and y != y), (column, x, y)


def _with_full_replay(monkeypatch, *args, **kwargs):
    monkeypatch.setattr(diverge_module, "replay_is_keep", lambda *a: False)
    try:
        return diverge(*args, **kwargs)
    finally:
        monkeypatch.undo()


def test_a_version_with_the_same_weights_skips_the_replay_and_reports_what_the_replay_gives(monkeypatch):
    from transformers.models.llama import modeling_llama

    model, inputs = llama()
    old = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    variant, lines = variant_module(modeling_llama, {old: old.replace("self.variance_epsilon)", "self.variance_epsilon * 1e4)")})
    other = same_weights(model, variant, "LlamaForCausalLM")
    fast = diverge(model, other, inputs)
    assert "a_replay" not in fast.timings and "local" in fast.timings  # Q is A: no fourth run
    full = _with_full_replay(monkeypatch, model, other, inputs)
    assert "a_replay" in full.timings
    _same_tables(fast.table, full.table)
    assert fast.first is not None and fast.first.line in lines.values()


def test_settings_on_the_same_model_skip_the_replay_too(monkeypatch):
    model, inputs = gpt2()
    fast = diverge(model, model, inputs, settings_b={"threads": 1})
    assert "a_replay" not in fast.timings
    _same_tables(fast.table, _with_full_replay(monkeypatch, model, model, inputs, settings_b={"threads": 1}).table)


def test_other_weights_another_dtype_or_autocast_keep_the_replay():
    model, inputs = gpt2()
    assert "a_replay" in diverge(model, copy.deepcopy(model).to(torch.bfloat16), inputs).timings
    assert "a_replay" in diverge(model, model, inputs, autocast_b=torch.bfloat16).timings
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.transformer.h[0].mlp.c_fc.weight.mul_(1 + 2 ** -20)  # another weight, same dtype
    assert "a_replay" in diverge(model, other, inputs).timings


def test_a_version_that_downcasts_a_row_a_keeps_in_float32_makes_the_replay(monkeypatch):
    from transformers.models.llama import modeling_llama

    model, inputs = llama()
    line = "variance = hidden_states.pow(2).mean(-1, keepdim=True)"
    variant, _ = variant_module(modeling_llama, {line: line + ".to(torch.bfloat16)"})
    other = same_weights(model, variant, "LlamaForCausalLM")
    report = diverge(model, other, inputs)  # the row is bfloat16 in b: forcing it rounds a's value
    assert "a_replay" in report.timings
    _same_tables(report.table, _with_full_replay(monkeypatch, model, other, inputs).table)


def test_recent_results_are_reused_only_for_the_very_same_unchanged_tensors():
    calls = []

    def counted(x, ref):
        calls.append(1)
        return relative_error(x, ref)

    recent = Recent()
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    first = recent.error(counted, a, b)
    assert recent.error(counted, a.detach(), b.view(4, 5)) == first and len(calls) == 1  # aliases: reused
    assert recent.error(counted, a.t(), b.t()) == first and len(calls) == 1  # the same pairs, transposed
    c = b.t().contiguous().t()  # b's values in another layout: other storage, computed
    assert recent.error(counted, a, c) == first and len(calls) == 2
    assert recent.error(counted, a[:2], b[:2]) == relative_error(a[:2], b[:2]) and len(calls) == 3  # a part: computed
    a.add_(1)  # an in-place write moves the version counter
    assert recent.error(counted, a, b) == relative_error(a, b) and len(calls) == 4
    assert recent.error(counted, b, b) == 0.0 and len(calls) == 4  # a tensor against itself
    cast = recent.cast(a, a.device, torch.bfloat16)
    assert recent.cast(a.detach(), a.device, torch.bfloat16) is cast
    cast.mul_(2)  # the cast was written to since: made again
    again = recent.cast(a, a.device, torch.bfloat16)
    assert again is not cast and torch.equal(again, a.to(torch.bfloat16))
    recent.known(local_error, again, a, 0.5)
    assert recent.error(local_error, again, a) == 0.5


def test_past_the_memory_budget_rows_go_to_disk_and_the_report_is_the_same():
    model, inputs = llama()
    other = copy.deepcopy(model).to(torch.bfloat16)
    held = diverge(model, other, inputs, memory_budget=None)
    spilled = diverge(model, other, inputs, memory_budget=16_384)
    _same_tables(spilled.table, held.table)
    assert held.memory["files"] == 0 and held.memory["peak_held"] > 16_384
    assert spilled.memory["files"] > 0 and spilled.memory["written"] > 0
    assert 0 < spilled.memory["peak_held"] <= 16_384
    assert "went to disk" in spilled.summary()
    assert "past the budget of 16.0 KiB" in spilled.summary() and "0.0 MiB" not in spilled.summary()
    with pytest.raises(ValueError, match="memory_budget"):
        diverge(model, other, inputs, memory_budget=-1)


def test_a_value_on_disk_comes_back_with_its_dtype_shape_and_strides(tmp_path):
    from nnschemaparser.traces.diverge_memory import RowValues, Spill

    spill = Spill(budget=0)
    table = RowValues(spill)
    values = {"t": torch.randn(3, 4).t(), "b": torch.randn(5).to(torch.bfloat16), "m": torch.rand(2, 3) > 0.5,
              "i": torch.arange(6).view(2, 3)}
    for key, value in values.items():
        table[key] = value
    assert not any(table.in_memory(k) for k in values) and len(table) == 4 and spill.files == 4
    for key, value in values.items():
        back = table[key]
        assert torch.equal(back, value) and back.dtype == value.dtype and back.stride() == value.stride()
    assert torch.equal(table.pop("t"), values["t"]) and "t" not in table
    folder = spill._folder
    assert folder is not None and len(list(folder.iterdir())) == 3  # the popped value's file is gone
    spill.close()
    assert not folder.exists()
    roomy = RowValues(Spill(budget=1 << 20))
    x = torch.randn(8)
    roomy["a"], roomy["b"] = x, x.view(2, 4)  # one storage, counted once
    assert roomy.in_memory("a") and roomy.spill.held == x.untyped_storage().nbytes()
    roomy.pop("a"), roomy.pop("b")
    assert roomy.spill.held == 0


# --- the fast path against a straightforward one -------------------------------------------------

def _straightforward_error(x, ref, clamp_to=None, scratch=None):
    """diverge_bounds' formula written out with no shortcut: no work buffers, no fast path."""
    if x.shape != ref.shape:
        return float("inf")
    if x.numel() == 0:
        return 0.0
    if not x.is_floating_point() and not ref.is_floating_point():
        return 1.0 - (x == ref).double().mean().item()
    work = torch.float64 if torch.float64 in (x.dtype, ref.dtype) else torch.float32
    ref, x = ref.to(work), x.to(work)
    top = torch.finfo(clamp_to).max if clamp_to is not None and clamp_to.is_floating_point else float("inf")
    if top != float("inf"):
        ref = ref.clamp(-top, top)
    mag = ref.abs()
    scale = torch.where(mag < min(top, torch.finfo(work).max) / 2, mag, 0.0).max()
    gap = (x - ref).abs() / (mag + scale)
    gap = torch.where(x == ref, 0.0, gap)
    gap = torch.nan_to_num(gap, nan=float("inf"), posinf=float("inf"))
    return torch.where(torch.isnan(ref), 0.0, gap).max().item()


def _straightforward(monkeypatch, *args, **kwargs):
    """`diverge` with every shortcut of the runs taken out: each error computed from scratch by
    `_straightforward_error`, no result or cast reused from the row before, every weight of b cast."""
    import nnschemaparser.traces.diverge_runs as runs

    monkeypatch.setattr(runs, "relative_error", _straightforward_error)
    monkeypatch.setattr(runs, "local_error",
                        lambda l, q, scratch=None: _straightforward_error(l, q, l.dtype if l.is_floating_point() else None))
    monkeypatch.setattr(runs.Recent, "error", lambda self, fn, x, ref: fn(x, ref))
    monkeypatch.setattr(runs.Recent, "cast", lambda self, v, device, dtype: v.to(device=device, dtype=dtype))
    monkeypatch.setattr(runs.Recent, "known", lambda self, *a: None)
    monkeypatch.setattr(runs, "holds_cast", lambda *a: False)
    try:
        return diverge(*args, **kwargs)
    finally:
        monkeypatch.undo()


def _exactly_equal_tables(fast, slow) -> None:
    assert list(fast["status"]) == list(slow["status"]) and list(fast["flagged"]) == list(slow["flagged"])
    assert list(fast["out_var"]) == list(slow["out_var"]) and list(fast["line"]) == list(slow["line"])
    for column in ("local_error", "carried_error", "bound"):
        x = torch.tensor(fast[column].to_numpy(dtype=float), dtype=torch.float64)
        y = torch.tensor(slow[column].to_numpy(dtype=float), dtype=torch.float64)
        assert torch.equal(x.isnan(), y.isnan()), column
        assert torch.equal(x[~x.isnan()], y[~y.isnan()]), column
    assert fast["local_error"].notna().sum() > 10  # errors were measured, not all left out


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_bfloat16_copy_gives_the_table_the_straightforward_path_gives(monkeypatch, build):
    model, inputs = build(seq=16)
    other = copy.deepcopy(model).to(torch.bfloat16)
    fast = diverge(model, other, inputs)
    slow = _straightforward(monkeypatch, model, other, inputs)
    _exactly_equal_tables(fast.table, slow.table)
    assert fast.first is None and slow.first is None


def test_a_planted_overflow_gives_the_table_the_straightforward_path_gives(monkeypatch):
    from transformers.models.llama import modeling_llama

    model, inputs = llama(seq=16)
    old = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    variant, lines = variant_module(modeling_llama, {old: old.replace("self.variance_epsilon)", "self.variance_epsilon * 1e4)")})
    other = same_weights(model, variant, "LlamaForCausalLM").to(torch.bfloat16)
    fast = diverge(model, other, inputs)
    _exactly_equal_tables(fast.table, _straightforward(monkeypatch, model, other, inputs).table)
    assert fast.first is not None and fast.first.line in lines.values()


def test_float32_weights_that_are_bfloat16_values_are_read_in_place_by_the_replay(monkeypatch):
    from nnschemaparser.traces.diverge_runs import holds_cast, replay_weights

    model, inputs = llama(seq=16)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())  # a float32 model loaded from a bfloat16 checkpoint
    other = copy.deepcopy(model).to(torch.bfloat16)
    data = {name: p.data_ptr() for name, p in model.named_parameters()}
    with replay_weights(model, other, torch.float32):
        assert all(p.data_ptr() == data[name] for name, p in model.named_parameters())  # no copy made
    assert all(holds_cast(p, q, torch.float32) for p, q in zip(model.parameters(), other.parameters()))
    changed = copy.deepcopy(other)
    with torch.no_grad():
        changed.model.layers[0].mlp.up_proj.weight.view(-1)[-1] += 1  # the last element differs: a copy
    assert not holds_cast(model.model.layers[0].mlp.up_proj.weight, changed.model.layers[0].mlp.up_proj.weight,
                          torch.float32)
    zeros = torch.zeros(8)
    assert not holds_cast(zeros, (-zeros).to(torch.bfloat16), torch.float32)  # -0.0 is not 0.0
    _exactly_equal_tables(diverge(model, other, inputs).table, _straightforward(monkeypatch, model, other, inputs).table)


def test_an_error_in_work_buffers_is_the_error_without_them():
    from nnschemaparser.traces.diverge_bounds import Scratch

    scratch = Scratch()
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(6, 40, generator=gen) * 3
    cases = [(ref.to(torch.bfloat16), ref), (ref + 1e-3 * torch.randn(6, 40, generator=gen), ref),
             (ref.t().to(torch.float16), ref.t()), (ref[:2].to(torch.bfloat16), ref[:2]),
             (torch.randn(7, generator=gen).double(), torch.randn(7, generator=gen))]
    for x, r in cases:
        for clamp in (None, torch.bfloat16):
            assert relative_error(x, r, clamp, scratch=scratch) == relative_error(x, r, clamp)
    held = scratch._buffers[(torch.float32, ref.device)][0]
    assert held.numel() == 240  # the largest row seen, not one buffer per row
    big = torch.randn(Scratch.LIMIT + 1)  # past the limit: new tensors, nothing more held
    assert relative_error(big.to(torch.bfloat16), big, scratch=scratch) == relative_error(big.to(torch.bfloat16), big)
    assert scratch._buffers[(torch.float32, ref.device)][0] is held
