"""The statistics kernel reads a tensor in pieces (a view or a float16/bfloat16 tensor BUF elements at a time, a
contiguous one where it lies) and counts NaN and infinities only where the magnitude sum is not finite: its
figures are still those of the documented lane order over the tensor's contiguous float32 (or float64) copy,
bit for bit, for random rows holding NaN, infinities, subnormals and zeros of both signs, of every float dtype,
contiguous or not; and the fold kernel's figures are the straightforward sums and torch's bins over such rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nnschemaparser.store import native
from nnschemaparser.store.reductions import _bin_counts
from nnschemaparser.store.statistics import Summariser

needs_kernel = pytest.mark.skipif(native.kernel() is None,
                                  reason=f"the statistics kernel is not built here: {native.problem()}")
LANES = 32
BUF = 4096  # _statistics.c: the elements of a view read at a time


def _lane_order(tensor: torch.Tensor) -> list[float]:
    """The nine raw figures the C source documents, straightforwardly: the contiguous copy widened to float64,
    element i added to lane i % 32 in element order (one float64 add each, numpy's elementwise add), the lanes
    then added in lane order; min, max and least magnitude over the non-NaN elements; the three counts."""
    wide = tensor.detach().contiguous().reshape(-1)
    if wide.dtype in (torch.float16, torch.bfloat16):
        wide = wide.float()
    narrow = wide.numpy()
    x = narrow.astype(np.float64)
    lanes = np.zeros((3, LANES))
    with np.errstate(invalid="ignore", over="ignore"):
        for at in range(0, len(x), LANES):
            row = x[at:at + LANES]
            lanes[0, :len(row)] = lanes[0, :len(row)] + row
            lanes[1, :len(row)] = lanes[1, :len(row)] + np.abs(row)
            lanes[2, :len(row)] = lanes[2, :len(row)] + row * row
    total = magnitude = squares = 0.0
    for j in range(LANES):
        total += float(lanes[0, j])
        magnitude += float(lanes[1, j])
        squares += float(lanes[2, j])
    real = narrow[~np.isnan(narrow)]
    low = float(real.min()) if len(real) else math.inf
    high = float(real.max()) if len(real) else -math.inf
    least = float(np.abs(real).min()) if len(real) else math.inf
    if len(real):  # the sign of a zero min or max is the first one met in its lane, as the C code keeps it
        low, high = _first_signed(narrow, low), _first_signed(narrow, high)
    return [total, low, high, magnitude, least, squares, float(np.isnan(narrow).sum()),
            float(np.isinf(narrow).sum()), float((narrow == 0).sum())]


def _first_signed(values: np.ndarray, extreme: float) -> float:
    """A zero extreme as the C code keeps it: each lane keeps its first zero, the lanes are taken in order."""
    if extreme != 0:
        return extreme
    for j in range(LANES):
        zeros = values[j::LANES][values[j::LANES] == 0]
        if len(zeros):
            return float(zeros[0])
    return extreme


def _same(a, b) -> bool:
    """Equal bit for bit, a NaN equal to any NaN (its payload is the compiler's choice of operand order)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64)))


def _rows(generator: torch.Generator, n: int, dtype: torch.dtype, special: bool = True) -> torch.Tensor:
    """n values of magnitudes 1e-6 to 1e6 (1e-4 to 1e4 in float16; float64 sums of these round, so another order
    gives other figures), with (`special`) NaN, infinities, subnormals and zeros of both signs sprinkled in."""
    widest = 4 if dtype == torch.float16 else 6
    x = torch.randn(n, generator=generator, dtype=torch.float64) * 10.0 ** torch.randint(
        -widest, widest + 1, (n,), generator=generator)
    if special:
        tiny = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133, torch.float32: 2.0 ** -149,
                torch.float64: 2.0 ** -1074}[dtype]
        values = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, tiny, -tiny, 3 * tiny, 0.0, -0.0],
                              dtype=torch.float64)
        places = torch.randint(0, n, (max(1, n // 200),), generator=generator)
        x[places] = values[torch.randint(0, len(values), (len(places),), generator=generator)]
    return x.to(dtype)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_rows_of_every_float_dtype_give_the_lane_order_figures_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(11)
    group = torch.float64 if dtype == torch.float64 else torch.float32
    tensors = [_rows(g, n, dtype, special) for n in (1, 7, 31, 32, 33, 100, BUF - 1, BUF, BUF + 33, 3 * BUF + 5)
               for special in (False, True)]
    tensors += [torch.zeros(50, dtype=dtype), -torch.zeros(50, dtype=dtype), torch.full((40,), math.nan, dtype=dtype)]
    for special in (False, True):
        base = _rows(g, 3 * 70 * 130, dtype, special).view(3, 70, 130)
        # views: transposed, gaps, a repeated (stride 0) dimension, an inner size that does not divide the
        # buffer, and the heads of a fused projection (several buffers' worth)
        tensors += [base.transpose(0, 2), base[:, ::3, 5:], base[:, :1].expand(3, 90, 130), base.permute(1, 2, 0),
                    _rows(g, 64 * 2304 * 2, dtype, special).view(2, 64, 2304)[:, :, 768:1536].view(2, 64, 12, 64)
                    .transpose(1, 2)]
    assert sum(bool(t.isfinite().all()) for t in tensors) > 10
    got = native.kernel().figures(tensors, group)
    for tensor, row in zip(tensors, got):
        assert _same(row, _lane_order(tensor)), (tuple(tensor.shape), row.tolist(), _lane_order(tensor))
    # the narrow dtypes read where they lie: the figures of their float32 copies
    if dtype in (torch.float16, torch.bfloat16):
        assert _same(got, native.kernel().figures([t.float() for t in tensors], torch.float32))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_summaries_of_views_and_narrow_dtypes_equal_those_of_their_float_copies(dtype):
    """What a store writes for a step (a Summariser's rows, its plan made and then reused) is the same whether a
    value is a view, a float16 or bfloat16 tensor read as it lies, or its contiguous float32/float64 copy."""
    g = torch.Generator().manual_seed(12)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    for _ in range(2):
        base = _rows(g, 6 * 40 * 96, dtype).view(6, 40, 96)
        values = [base, base.transpose(1, 2), base[:, ::2], _rows(g, 20000, dtype), base[0, 0, 0], None,
                  _rows(g, 300, dtype).view(3, 100).t(), base.unsqueeze(0).expand(2, 6, 40, 96)]
        copies = [v.to(wide).contiguous() if isinstance(v, torch.Tensor) else v for v in values]
        summariser = Summariser(native.ENGINE)
        for _ in range(2):  # a fresh plan, then the plan reused
            assert _same(_numbers(summariser(values).rows()), _numbers(Summariser(native.ENGINE)(copies).rows()))


def _numbers(rows: list[list]) -> list[float]:
    return [math.nan if x is None else float(x) for row in rows for x in row]


@needs_kernel
def test_a_negated_view_is_summarised_by_its_values_not_its_memory():
    """The imaginary part of a conjugate is a float32 view with the negative bit set: its memory holds the
    values' negations, so the kernel is given its resolved copy."""
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64).conj()
    assert z.imag.is_neg()
    for engine in (native.ENGINE, "torch"):
        got = Summariser(engine)([z.imag, z.imag.clone()]).rows()
        assert got[0] == got[1] and got[0][2] == -2.0 and got[0][3] == 4.0, (engine, got)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fold_kernel_over_random_rows_gives_the_straightforward_sums_and_torchs_bins(dtype):
    g = torch.Generator().manual_seed(13)
    for count, k, size in ((1, 1, 1), (2, 3, 5), (3, 8, 513), (2, 5, 1027)):
        values = [_rows(g, size, dtype) * 1e-28 for _ in range(count * k)]  # most within the bins' range
        mean, m2, counts = native.kernel().fold(values, count, k, 64, -8.0, 8.0)
        for j in range(count):
            own = [v.to(torch.float64) for v in values[j * k:(j + 1) * k]]
            total = torch.zeros_like(own[0])  # the C code's sums start at +0.0 (so a lone -0.0 gives +0.0)
            for v in own:
                total = total + v
            want_mean = total / k
            want_m2 = (own[0] - want_mean) * (own[0] - want_mean)
            for v in own[1:]:
                want_m2 = want_m2 + (v - want_mean) * (v - want_mean)
            assert _same(mean[j], want_mean) and _same(m2[j], want_m2)
            bins = _bin_counts(torch.stack(values[j * k:(j + 1) * k]).reshape(1, -1), 64, -8.0, 8.0, True)[0]
            assert torch.equal(counts[j], bins)


@needs_kernel
def test_the_merge_kernel_gives_torchs_chan_merge_bit_for_bit_in_place():
    from nnschemaparser.store.reductions import _merge

    g = torch.Generator().manual_seed(14)
    for n_a, n_b, size in ((1, 1, 1), (3, 8, 777), (64, 7, 4096), (10 ** 6, 3, 50)):
        mean_a, m2_a = _rows(g, size, torch.float64), _rows(g, size, torch.float64).abs()
        mean_b, m2_b = _rows(g, size, torch.float64), _rows(g, size, torch.float64).abs()
        _, want_mean, want_m2 = _merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b)
        own_mean, own_m2 = mean_a.clone(), m2_a.clone()
        assert native.kernel().merge(n_a, own_mean, own_m2, n_b, mean_b, m2_b)
        assert _same(own_mean, want_mean) and _same(own_m2, want_m2)


@needs_kernel
def test_the_merge_kernel_leaves_to_torch_what_it_cannot_merge_in_place():
    kernel = native.kernel()
    rows = torch.randn(4, 16, dtype=torch.float64)
    one = torch.randn(16, dtype=torch.float64)
    before = rows.clone()
    assert not kernel.merge(2, rows[0], rows[0], 3, one, one)  # the mean and M2 are one array
    assert not kernel.merge(2, rows[0], rows[1], 3, rows[0], one)  # what is written is also read
    assert not kernel.merge(2, rows[:, 0], rows[1], 3, one[:4], one[:4])  # a strided view
    assert not kernel.merge(2, rows[0].float(), rows[1].float(), 3, one.float(), one.float())  # not float64
    assert not kernel.merge(2, rows[0], rows[1], 3, one[:8], one[:8])  # another size
    assert torch.equal(rows, before)
    assert kernel.merge(2, rows[0], rows[1], 3, rows[2], rows[3])  # rows of one tensor, apart: fine
