"""What a dtype explains: the errors and the bound `diverge` reports for one statement.

Both errors are *relative to the value's scale*, so that one bound fits every statement:

    error(x, ref) = max_i |x_i - ref_i| / (|ref_i| + s),   s = max |ref_j| over the finite ref_j
                                                            below half the dtype's largest value

`s` (the tensor's scale) keeps an element near zero from looking large (rounding is relative to the
values the statement combines, which are of the tensor's size), and leaving saturated values out of
it (an attention mask's `finfo.min`) keeps them from hiding every other element; a saturated element
is still measured against its own magnitude. Computed in float32 (float64 when either side is
float64: the error is read to a few digits, never summed) on the reference's device.

- **carried error**: b's free-running value against a's (`error(b, a)`).
- **local error**: b's statement computed in b's dtype on a's values cast to b's dtype (`l`),
  against a's statement replayed (float32, or float64 for a float64 b: traces/diverge_runs.py,
  `replay_dtype`) on the *same* cast values and with b's weights (`q`):
  `error(l, clamp(q))`. The cast of the inputs and of the weights is identical on both sides, so it
  is never blamed; what is left is what the statement itself does in b (its rounding, an overflow,
  other code). `q` is clamped to the finite range of `l`'s dtype first: a value a's code makes from the
  dtype (`finfo(dtype).min` for a mask) saturates in both, and is no error. `l` infinite or NaN
  where `clamp(q)` is finite is an infinite error (an fp16 overflow), and a NaN in `q` (a's own
  statement undefined there) is left out.
- **bound** = `factor * eps(precision)`, `precision` b's configured precision: the less precise of
  b's model dtype and b's autocast dtype. One rounding to it is at most `eps / 2` relative; a
  statement of a few ops rounds a few times and feeds roundings through its later ops, scaled at
  most by the tensor's scale. The default factor 8 covers a statement of up to ~8 such roundings
  with no false flag over the benchmark's fault-free pairs (bench/bench_diverge.py), and is far
  below what a real fault gives (an overflow: infinite; a changed `eps` or a cancelling reduction
  in float32: 1e-3 and up against 1e-6). A cast to a lower precision that a's code makes too is in
  the replay as well, so it costs nothing; one that only b's code makes (a removed upcast, an added
  downcast) is measured against b's configured precision, so it is blamed.
  A row is *flagged* when its local error is above its bound.

Integer and bool rows are compared for equality only (error = the fraction of elements that differ,
bound None, never flagged): a rounding upstream may move an index legitimately.

Depends on torch and diverge_native (the common case's C kernel) only; never on views.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import diverge_native

__all__ = ["DEFAULT_FACTOR", "Scratch", "relative_error", "local_error", "least_precise", "bound_of"]

DEFAULT_FACTOR = 8.0


def _precision(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def least_precise(current: Optional[torch.dtype], dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """The less precise of two floating dtypes (either None: the other); non-floating dtypes never count."""
    if dtype is None:
        return current
    if not dtype.is_floating_point:
        return current
    if current is None or _precision(dtype) > _precision(current):
        return dtype
    return current


def bound_of(dtype: Optional[torch.dtype], factor: float) -> Optional[float]:
    """`factor * eps(dtype)`, None for a statement that made no floating tensor."""
    if dtype is None:
        return None
    return factor * torch.finfo(dtype).eps


class Scratch:
    """Two work buffers per dtype and device, reused by every `relative_error` of one comparison.

    The common path writes `x - ref` and `|ref| + s` into them instead of two new tensors per row:
    a new tensor of a row's size is fresh memory the kernel must fault in and zero (a few thousand
    page faults per comparison), and the buffers are the size of the largest row, faulted in once.
    A row of more than `LIMIT` elements gets new tensors, as without buffers, so that what is held
    for the whole comparison stays bounded."""

    LIMIT = 1 << 20  # elements: 4 MiB a float32 buffer, 8 MiB both

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def pair(self, numel: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Two flat tensors of `numel` elements (contents undefined), views of the held buffers."""
        held = self._buffers.get((dtype, device))
        if held is None or held[0].numel() < numel:
            held = self._buffers[(dtype, device)] = (torch.empty(numel, dtype=dtype, device=device),
                                                      torch.empty(numel, dtype=dtype, device=device))
        return held[0][:numel], held[1][:numel]


def relative_error(x: torch.Tensor, ref: torch.Tensor, clamp_to: Optional[torch.dtype] = None,
                   scratch: Optional[Scratch] = None) -> float:
    """`max |x - ref| / (|ref| + s)` (see the module docstring); inf where `x` is
    infinite or NaN and `ref` is not; positions where `ref` is NaN are left out. With `clamp_to`,
    `ref` is first clamped to that dtype's finite range. Shapes must agree (broadcasting is refused).
    `scratch`: work buffers to compute in (the same result, element for element, without new tensors)."""
    if x.shape != ref.shape:
        return math.inf
    if x.numel() == 0:
        return 0.0
    if not (x.is_floating_point() or x.is_complex()) and not (ref.is_floating_point() or ref.is_complex()):
        equal = x.to(ref.device) == ref
        return 1.0 - equal.double().mean().item()
    work = torch.float64 if torch.float64 in (x.dtype, ref.dtype) or x.is_complex() or ref.is_complex() \
        else torch.float32
    ref = ref.detach()
    ref = ref.abs().to(work) if ref.is_complex() else ref.to(work)
    x = x.detach().to(ref.device)
    if x.is_complex() or not x.is_floating_point():
        x = x.abs().to(work) if x.is_complex() else x.to(work)
    # a floating `x` of lower precision is promoted to `work` inside each op: no copy of its own
    top = torch.finfo(clamp_to).max if clamp_to is not None and clamp_to.is_floating_point else math.inf
    if work is torch.float32 and not x.is_complex():  # the common case in C, the same float (diverge_native.py)
        fast = diverge_native.error(x, ref, min(top, torch.finfo(work).max) / 2)
        if fast is not None:
            return fast
    biggest = _largest_magnitude(ref)
    if biggest < min(top, torch.finfo(work).max) / 2:  # the common case: nothing saturated, no NaN
        # x cast first (one pass, exact): a mixed-dtype subtraction is slower than the cast and the sub;
        # max |d / m| is max |d| / m, m > 0, read off the smallest and the largest in one pass
        diff, mag = _work_pair(scratch, x.numel(), work, ref.device)
        diff, mag = diff.view(x.shape), mag.view(ref.shape)
        if x.dtype != work:
            diff.copy_(x).sub_(ref)
        else:
            torch.sub(x, ref, out=diff)
        torch.abs(ref, out=mag)
        gap = _largest_magnitude(diff.div_(mag.add_(biggest)))
        if gap == gap and gap != math.inf:
            return gap
    mag = ref.abs()
    if top != math.inf:
        ref = ref.clamp(-top, top)
        mag = ref.abs()
    limit = min(top, torch.finfo(work).max) / 2
    scale = torch.where(mag < limit, mag, 0.0).max()  # NaN and saturated values are no scale
    gap = (x - ref).abs().div_(mag.add_(scale))
    gap = torch.where(x == ref, 0.0, gap)  # equal infinities; 0/0 where both are zero with a zero scale
    gap = torch.nan_to_num_(gap, nan=math.inf, posinf=math.inf)  # x NaN, inf - inf of opposite signs
    gap = torch.where(torch.isnan(ref), 0.0, gap)
    return gap.max().item()


def _work_pair(scratch: Optional[Scratch], numel: int, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two flat work tensors: views of `scratch`'s buffers, or new ones for a row past its `LIMIT`
    (or with no scratch), so both cases run the same operations."""
    if scratch is None or numel > scratch.LIMIT:
        return torch.empty(numel, dtype=dtype, device=device), torch.empty(numel, dtype=dtype, device=device)
    return scratch.pair(numel, dtype, device)


def _largest_magnitude(value: torch.Tensor) -> float:
    """`value.abs().max()` without the copy (NaN if any element is NaN)."""
    low, high = torch.aminmax(value)
    low, high = low.item(), high.item()
    if low != low or high != high:
        return math.nan
    return max(-low, high)


def local_error(l: torch.Tensor, q: torch.Tensor, scratch: Optional[Scratch] = None) -> float:
    """The local error of a statement: its value in b (`l`) against a's replay (`q`), clamped
    to the range of `l`'s dtype."""
    return relative_error(l, q, clamp_to=l.dtype if l.is_floating_point() else None, scratch=scratch)
