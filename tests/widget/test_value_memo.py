"""value_memo: a step's statistics and bins once per value, recomputed when the value changed in place."""

import gc

import torch

from nnschemaparser.traces.histograms import histogram_bins
from nnschemaparser.traces.tables import tensor_statistics
from nnschemaparser.widget import value_memo


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)  # NaN == NaN


def test_statistics_and_bins_are_those_of_the_traces_and_follow_an_in_place_change():
    torch.manual_seed(0)
    value = torch.randn(4, 8)
    assert _same(value_memo.statistics(value), tensor_statistics(value))
    assert value_memo.bins(value, 7) == histogram_bins(value, bins=7).to_dict()
    first = value_memo.statistics(value)
    first["mean"] = 123.0  # a copy: the caller's change does not reach the memo
    assert value_memo.statistics(value)["mean"] == tensor_statistics(value)["mean"]
    value.mul_(3).add_(1)  # in place: the version counter moves, the memo recomputes
    assert _same(value_memo.statistics(value), tensor_statistics(value))
    assert value_memo.bins(value, 7) == histogram_bins(value, bins=7).to_dict()
    view = value[0]
    view.zero_()  # through a view: the base's version moves too
    assert value_memo.statistics(value)["frac_zero"] == tensor_statistics(value)["frac_zero"] == 8 / 32
    assert len(value_memo.bins(value, 5)["counts"]) == 5


def test_a_freed_tensor_never_answers_for_a_new_one_and_inference_tensors_are_computed():
    stats = []
    for scale in (1.0, 2.0, 3.0):
        value = torch.arange(6.0) * scale  # the same id may come back after the last one was freed
        stats.append(value_memo.statistics(value)["max"])
        del value
        gc.collect()
    assert stats == [5.0, 10.0, 15.0]
    with torch.inference_mode():
        frozen = torch.ones(3)
    assert value_memo.statistics(frozen)["mean"] == 1.0
    assert value_memo.bins(frozen, 2)["counts"] == [0, 3]
    assert value_memo.statistics(3.0)["numel"] == 0  # not a tensor: as tensor_statistics says


def test_the_memo_keeps_at_most_its_limit(monkeypatch):
    monkeypatch.setattr(value_memo, "LIMIT", 4)
    values = [torch.full((2,), float(i)) for i in range(10)]
    for value in values:
        value_memo.statistics(value)
    assert len(value_memo._memo) <= 4
    assert value_memo.statistics(values[0])["mean"] == 0.0
