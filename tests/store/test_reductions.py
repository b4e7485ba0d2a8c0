"""Batched reductions (ReductionState.add_many, what the writer folds) against one-by-one folding and
against torch over the stacked occurrences: the same figures up to float64 rounding, histograms exact."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.store.reductions import Reduction, ReductionState, _channel_figures


def _occurrences(n: int, shape: tuple, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * 3 for _ in range(n)]


def _l2(values):
    return [float(torch.linalg.vector_norm(v.double())) for v in values]


def test_a_batch_gives_the_figures_of_one_by_one_folding_and_of_torch():
    values = _occurrences(10, (5, 7))
    values[3][0, 0], values[4][1, 2] = float("nan"), float("inf")  # NaN and inf binned, as one by one
    values[5][2, 2] = 8.0  # exactly `high`: over
    samples, steps, l2s = list(range(10)), [3] * 10, _l2(values)
    one = ReductionState(16, -8.0, 8.0, 4)
    for value, sample, step, l2 in zip(values, samples, steps, l2s):
        one.add(value, sample, step, l2)
    batch = ReductionState(16, -8.0, 8.0, 4)
    batch.add_many(values[:6], samples[:6], steps[:6], l2s[:6])  # two batches, merged as units are
    batch.add_many(values[6:], samples[6:], steps[6:], l2s[6:])
    a, b = Reduction.of("v", one), Reduction.of("v", batch)
    assert a.count == b.count == 10
    assert torch.equal(a.histogram, b.histogram) and (a.underflow, a.overflow, a.nan) == (b.underflow, b.overflow, b.nan)
    assert b.nan == 1 and b.overflow >= 2
    clean = [v for i, v in enumerate(values) if i not in (3, 4)]
    stacked = torch.stack(clean).double()
    fair = ReductionState(16, -8.0, 8.0, 4)
    fair.add_many(clean[:5], list(range(5)), [1] * 5, _l2(clean[:5]))
    fair.add_many(clean[5:], list(range(5, 8)), [1] * 3, _l2(clean[5:]))
    c = Reduction.of("v", fair)
    assert torch.allclose(c.mean, stacked.mean(0), rtol=1e-12, atol=1e-14)
    assert torch.allclose(c.var, stacked.var(0), rtol=1e-10, atol=1e-14)
    rows = stacked.reshape(-1, 7)
    assert torch.allclose(c.channel_mean, rows.mean(0), rtol=1e-12, atol=1e-14)
    assert torch.allclose(c.channel_var, rows.var(0), rtol=1e-10, atol=1e-14)
    assert repr(a.top) == repr(b.top) and b.top[0][0] == 4  # the inf norm first (NaN compares by text)


def test_a_batch_of_several_shapes_folds_one_by_one_and_names_the_shape_change():
    values = _occurrences(3, (4, 6)) + _occurrences(2, (2, 6), seed=1)
    state = ReductionState(8, -4.0, 4.0, 2)
    state.add_many(values, [0, 1, 2, 3, 4], [1] * 5, _l2(values))
    reduction = Reduction.of("v", state)
    assert reduction.mean is None and "shapes differ" in reduction.note and "at sample 3" in reduction.note
    rows = torch.cat([v.reshape(-1, 6) for v in values]).double()
    assert torch.allclose(reduction.channel_mean, rows.mean(0), rtol=1e-12, atol=1e-14)
    assert torch.allclose(reduction.channel_var, rows.var(0), rtol=1e-10, atol=1e-14)


def test_the_histogram_bins_float32_values_as_numpy_does_and_edges_into_the_bin_they_open():
    """Binned in float32 without a float64 copy (`_binning`), the counts equal numpy's histogram over the
    same edges in float64, and a value on an edge goes to the bin it opens, `high` and above to overflow."""
    import numpy as np

    generator = torch.Generator().manual_seed(11)
    values = [torch.randn(48, 96, generator=generator) * 3 for _ in range(6)]
    edges = torch.linspace(-8.0, 8.0, 65)
    values[0][0, :65] = edges  # every edge, exactly, and `high` itself
    values[1][0, :3] = torch.tensor([-8.0001, float("nan"), 1e30])
    state = ReductionState(64, -8.0, 8.0, 4)
    state.add_many(values, list(range(6)), [1] * 6, [1.0] * 5 + [float("nan")])
    reduction = Reduction.of("v", state)
    flat = torch.cat([v.reshape(-1) for v in values]).double().numpy()
    finite = flat[~np.isnan(flat)]
    counts, _ = np.histogram(finite[(finite >= -8.0) & (finite < 8.0)], bins=edges.double().numpy())
    assert reduction.histogram.tolist() == counts.tolist()
    assert reduction.underflow == int((finite < -8.0).sum()) and reduction.overflow == int((finite >= 8.0).sum())
    assert reduction.nan == 1 and reduction.histogram[0] >= 1 and reduction.histogram[-1] >= 1


def test_variables_folded_together_give_what_each_folded_alone_gives():
    """fold_together stacks the variables of one shape and length ([variables, occurrences, ...]), a few at a
    time; each variable still gets its own figures: one-by-one folding's, up to float64 rounding, its
    histogram and top k exactly; a variable of several shapes is folded one by one beside them."""
    from nnschemaparser.store import reductions
    from nnschemaparser.store.reductions import fold_together

    batches = [(_occurrences(6, (3, 5), seed=s), list(range(6)), [s] * 6, None) for s in range(4)]
    batches += [(_occurrences(6, (2, 4), seed=s), list(range(6)), [s] * 6, None) for s in range(4, 6)]
    batches.append((_occurrences(3, (3, 5), seed=9) + _occurrences(3, (2, 5), seed=10), list(range(6)), [9] * 6, None))
    batches[1][0][2][0, 0] = float("nan")  # one NaN in one variable: binned as NaN there only
    batches = [(v, samples, steps, _l2(v)) for v, samples, steps, _ in batches]
    original = reductions._STACK
    try:
        reductions._STACK = 3 * 6 * 15  # three variables of (3, 5) at a time: stacked in two chunks
        together = [ReductionState(16, -4.0, 4.0, 3) for _ in batches]
        fold_together(together, batches)
    finally:
        reductions._STACK = original
    for state, (values, samples, steps, l2s) in zip(together, batches):
        alone = ReductionState(16, -4.0, 4.0, 3)
        for value, sample, step, l2 in zip(values, samples, steps, l2s):
            alone.add(value, sample, step, l2)
        a, b = Reduction.of("v", alone), Reduction.of("v", state)
        assert a.count == b.count == 6 and a.note == b.note
        assert torch.equal(a.histogram, b.histogram) and (a.underflow, a.overflow, a.nan) == (b.underflow, b.overflow, b.nan)
        assert repr(a.top) == repr(b.top)
        if a.mean is not None:
            assert torch.allclose(a.mean, b.mean, rtol=1e-12, atol=1e-14, equal_nan=True)
            assert torch.allclose(a.var, b.var, rtol=1e-10, atol=1e-14, equal_nan=True)
        assert torch.allclose(a.channel_mean, b.channel_mean, rtol=1e-12, atol=1e-14, equal_nan=True)
    assert Reduction.of("v", together[1]).nan == 1 and Reduction.of("v", together[0]).nan == 0
    assert "shapes differ" in Reduction.of("v", together[-1]).note


def test_a_large_variable_folded_a_few_columns_at_a_time_gives_one_pass_figures_and_exact_counts():
    """A variable whose occurrences do not fit `_STACK` float64 elements at once is folded a few columns
    (elements) at a time, so its float64 copies stay in cache: each element's mean and M2 are its own and
    the histogram counts add up exactly. torch's reduction over the occurrences rounds a few elements'
    sums otherwise when the row is shorter (1 ulp here), so the means and variances are one pass's up to
    float64 rounding; which columns go together depends on the unit only (bit-equal stores whatever the
    number of processes)."""
    from nnschemaparser.store import reductions
    from nnschemaparser.store.reductions import fold_together

    values = _occurrences(7, (3, 11, 13), seed=4)  # 429 elements an occurrence
    values[2][1, 4, 5] = float("nan")
    batches = [(values, list(range(7)), [3] * 7, _l2(values))]
    original = reductions._STACK
    figures = []
    try:
        for stack in (7 * 429 * 4, 7 * 50):  # one pass; 50 columns at a time (the last chunk 29)
            reductions._STACK = stack
            state = ReductionState(16, -4.0, 4.0, 3)
            fold_together([state], batches)
            figures.append(Reduction.of("v", state))
    finally:
        reductions._STACK = original
    whole, chunked = figures
    assert torch.equal(whole.histogram, chunked.histogram)
    for name in ("mean", "var", "channel_mean", "channel_var"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert torch.equal(a.isnan(), b.isnan()), name
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14, equal_nan=True), name
    assert (whole.underflow, whole.overflow, whole.nan) == (chunked.underflow, chunked.overflow, chunked.nan)
    assert whole.nan == 1 and whole.count == chunked.count == 7


@pytest.mark.parametrize("count,positions,channels", [(23, 64, 768), (11, 64, 3072), (7, 768, 64), (3, 1, 5), (40, 4, 8)])
def test_channel_figures_worked_out_a_few_variables_at_a_time_equal_the_whole_stack_s(count, positions, channels):
    """The per-channel figures of a fold, the squared deviations summed a few variables at a time in one buffer,
    are those of torch's reductions over the whole stack, bit for bit (the store's reductions do not change)."""
    g = torch.Generator().manual_seed(count)
    means = torch.randn(count, positions, channels, generator=g, dtype=torch.float64)
    m2 = torch.rand(count, positions, channels, generator=g, dtype=torch.float64)
    whole_mean = means.mean(1)
    whole_m2 = m2.sum(1) + (means - whole_mean.unsqueeze(1)).square_().sum(1) * 8
    mean, got = _channel_figures(means, m2, 8)
    assert torch.equal(mean, whole_mean) and torch.equal(got, whole_m2)
