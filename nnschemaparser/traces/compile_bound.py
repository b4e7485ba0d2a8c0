"""How far a compiled region may differ from eager before it is blamed: the rounding bound.

A backend that fuses, reorders a reduction or keeps a value in registers rounds differently from
eager, so for the same dtype a compiled value is not bit-equal to eager's. What it may not do is
differ by more than rounding explains. The yardstick is a float64 replay of the same region on the
same (eager) inputs, cast up: it tells how much eager's own result rounds away from the exact one.

For each tensor a region outputs, with `e` the eager value, `c` the compiled value and `t` the
float64 replay, all in float64:

    error = max |c - e|
    own   = max |e - t|                    (eager's own rounding error in this region)
    scale = max |t|
    bound = OWN_FACTOR * own + ULP_FACTOR * eps(dtype) * scale

and the value is *flagged* when `error > bound`. A reassociated sum or a fused kernel rounds about
as much as eager does (`error` is at most about twice `own`), and an op whose result is exact in
eager but one ulp off when fused is covered by the `eps` term; an op computed differently (gelu's
tanh approximation, a scaled matmul) is many times both. Positions where eager is not finite must
hold the same value compiled (the same infinity, a NaN), and a finite eager value must stay finite:
an overflow or a NaN only one side has is flagged with an infinite error. Integer and bool tensors
must be equal. Where no float64 replay could run, `own` is 0 and `scale` is eager's.

Depends on nothing of the package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils import _pytree as pytree

__all__ = ["Measure", "measure", "OWN_FACTOR", "ULP_FACTOR"]

OWN_FACTOR = 4.0
ULP_FACTOR = 8.0


@dataclass
class Measure:
    """One value's error against eager, its bound, and whether it is out of bounds."""

    error: float
    bound: float
    flagged: bool
    own: float = 0.0

    @property
    def ratio(self) -> float:
        if self.error == 0:
            return 0.0
        return math.inf if self.bound == 0 else self.error / self.bound


def measure(compiled: Any, eager: Any, exact: Optional[Any]) -> Optional[Measure]:
    """The worst tensor of `compiled` against `eager` (their tensors in pytree order), bounded with the
    float64 replay `exact` (or None). None when neither holds a tensor; other values are not compared."""
    leaves_e = [v for v in pytree.tree_leaves(eager) if isinstance(v, torch.Tensor)]
    leaves_c = [v for v in pytree.tree_leaves(compiled) if isinstance(v, torch.Tensor)]
    if not leaves_e and not leaves_c:
        return None
    if len(leaves_c) != len(leaves_e):
        return Measure(math.inf, 0.0, True)
    leaves_t = None
    if exact is not None:
        leaves_t = [v for v in pytree.tree_leaves(exact) if isinstance(v, torch.Tensor)]
        if len(leaves_t) != len(leaves_e):
            leaves_t = None
    worst: Optional[Measure] = None
    for k, (c, e) in enumerate(zip(leaves_c, leaves_e)):
        one = _leaf(c, e, leaves_t[k] if leaves_t is not None else None)
        if worst is None or (one.flagged, one.ratio, one.error) > (worst.flagged, worst.ratio, worst.error):
            worst = one
    return worst


def _leaf(c: Any, e: torch.Tensor, t: Optional[torch.Tensor]) -> Measure:
    if not isinstance(c, torch.Tensor) or c.shape != e.shape:
        return Measure(math.inf, 0.0, True)
    if e.numel() == 0:
        return Measure(0.0, 0.0, False)
    if not (e.is_floating_point() or e.is_complex()):
        if torch.equal(c, e):
            return Measure(0.0, 0.0, False)
        return Measure(float((c.double() - e.double()).abs().max()), 0.0, True)
    c64, e64 = c.detach().to(torch.float64), e.detach().to(torch.float64)
    finite_e, finite_c = torch.isfinite(e64), torch.isfinite(c64)
    same_special = (c64 == e64) | (torch.isnan(c64) & torch.isnan(e64))
    if bool((finite_e != finite_c).any()) or bool((~finite_e & ~same_special).any()):
        return Measure(math.inf, 0.0, True)
    both = finite_e & finite_c
    error = float((c64 - e64)[both].abs().max()) if bool(both.any()) else 0.0
    own, scale = 0.0, float(e64[both].abs().max()) if bool(both.any()) else 0.0
    if t is not None and t.shape == e.shape:
        t64 = t.detach().to(torch.float64)
        mask = both & torch.isfinite(t64)
        if bool(mask.any()):
            own = float((e64 - t64)[mask].abs().max())
            scale = float(t64[mask].abs().max())
    eps = torch.finfo(e.dtype).eps
    bound = OWN_FACTOR * own + ULP_FACTOR * eps * scale
    return Measure(error, bound, error > bound, own)
