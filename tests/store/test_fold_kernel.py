"""The C code's fold of the reductions (_statistics.c `nsp_fold`, native.Kernel.fold, reductions.fold_together
with a kernel): its per-element mean and M2 are sums in occurrence order, bit for bit; its histogram counts
are torch's `_bin_counts`, exactly; values it cannot read are folded by torch; a store written with it gives
the same reductions whatever the number of processes (tests/store/test_distributed_store.py) and records its
engine."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.store import native
from nnschemaparser.store.reductions import ReductionState, _bin_counts, fold_together

needs_kernel = pytest.mark.skipif(native.kernel() is None,
                                  reason=f"the statistics kernel is not built here: {native.problem()}")


def _sequential(values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and M2 the C code documents, with torch's elementwise float64 ops (each one rounded alone)."""
    own = [v.to(torch.float64).reshape(-1) for v in values]
    total = own[0].clone()
    for v in own[1:]:
        total = total + v
    mean = total / len(own)
    m2 = (own[0] - mean) * (own[0] - mean)
    for v in own[1:]:
        m2 = m2 + (v - mean) * (v - mean)
    return mean, m2


def _values(count: int, k: int, size: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    values = [(torch.randn(size, generator=g, dtype=torch.float64) * 3).to(dtype) for _ in range(count * k)]
    values[0][5] = float("nan")
    values[1][6], values[2][7] = float("inf"), -float("inf")
    values[3][8], values[3][9], values[4][10] = 4.0, -4.0, 3.875  # the range's ends and a bin's opening edge
    return values


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1, 17, 511, 512, 1300])  # under, at and over the C code's blocks of columns
@pytest.mark.parametrize("k", [1, 7, 70])  # the block's width is 8192 values over k, in 16s (at least 16)
def test_the_fold_kernel_sums_in_occurrence_order_and_counts_as_torch_bins(dtype, size, k):
    count = 3 if k > 1 else 5
    values = _values(count, k, max(size, 16), dtype)[:]
    values = [v[:size].clone() for v in values]
    mean, m2, counts = native.kernel().fold(values, count, k, 64, -4.0, 4.0)
    for j in range(count):
        own = values[j * k:(j + 1) * k]
        want_mean, want_m2 = _sequential(own)
        assert torch.equal(mean[j].nan_to_num(), want_mean.nan_to_num())
        assert torch.equal(mean[j].isnan(), want_mean.isnan())
        assert torch.equal(m2[j].nan_to_num(), want_m2.nan_to_num())
        assert torch.equal(counts[j], _bin_counts(torch.stack(own).reshape(1, -1), 64, -4.0, 4.0, True)[0])
    assert int(counts[:, -1].sum()) == (1 if size > 5 else 0)  # the one NaN, in the NaN count


@needs_kernel
def test_the_fold_kernel_leaves_to_torch_what_it_cannot_read():
    kern = native.kernel()
    good = [torch.randn(8) for _ in range(4)]
    assert kern.fold(good, 2, 2, 8, -1.0, 1.0) is not None
    assert kern.fold(good[:3], 2, 2, 8, -1.0, 1.0) is None  # not count * k values
    assert kern.fold([torch.randn(8, 2)[:, 0]] + good[1:], 2, 2, 8, -1.0, 1.0) is None  # a strided view
    assert kern.fold([good[0].half()] + good[1:], 2, 2, 8, -1.0, 1.0) is None  # another dtype
    assert kern.fold([torch.randn(9)] + good[1:], 2, 2, 8, -1.0, 1.0) is None  # another size
    assert kern.fold([torch.zeros(8, dtype=torch.int64)] * 4, 2, 2, 8, -1.0, 1.0) is None
    assert kern.fold(good, 2, 2, 8, 1.0, 1.0) is None  # an empty range
    # fold_together takes torch's path for them, and changes nothing before it does
    views = [torch.randn(6, 2)[:, 0] for _ in range(3)]
    with_kernel, without = ReductionState(8, -1.0, 1.0, 2), ReductionState(8, -1.0, 1.0, 2)
    fold_together([with_kernel], [(views, [0, 1, 2], [1, 1, 1], [None] * 3)], kern)
    fold_together([without], [(views, [0, 1, 2], [1, 1, 1], [None] * 3)], None)
    assert with_kernel.count == without.count == 3
    assert torch.equal(with_kernel.element_mean, without.element_mean)
    assert torch.equal(with_kernel.histogram, without.histogram)


@needs_kernel
def test_states_folded_by_the_kernel_equal_torchs_to_rounding_and_their_counts_exactly():
    count, k = 5, 9
    values = [v.reshape(4, 33) for v in _values(count, k, 132, torch.float32, seed=3)]
    batches = [(values[j * k:(j + 1) * k], list(range(k)), [j] * k, [None] * k) for j in range(count)]
    by_c = [ReductionState(32, -4.0, 4.0, 3) for _ in range(count)]
    by_torch = [ReductionState(32, -4.0, 4.0, 3) for _ in range(count)]
    fold_together(by_c, batches, native.kernel())
    fold_together(by_torch, batches, None)
    for a, b in zip(by_c, by_torch):
        assert a.count == b.count == k and a.element_shape == b.element_shape == (4, 33)
        assert torch.equal(a.histogram, b.histogram)
        assert a.top == b.top
        for field in ("element_mean", "element_m2", "channel_mean", "channel_m2"):
            x, y = getattr(a, field), getattr(b, field)
            finite = x.isfinite() & y.isfinite()
            assert torch.equal(x.isnan(), y.isnan())
            # the same figures, added in another order where torch vectorises its reduction over occurrences
            assert torch.allclose(x[finite], y[finite], rtol=1e-12, atol=1e-12)
