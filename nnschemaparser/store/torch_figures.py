"""The "torch" engine of the store's statistics (statistics.py): torch's reductions of the stacked groups and large
tensors of an input, and the exact counts of the rows that need them. The figures each column holds are described in
statistics.py's docstring.

Depends on torch and numpy only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["reduce_rows", "reduce_one", "finish"]

_NAN = float("nan")
_F64 = torch.float64


def reduce_rows(matrix: torch.Tensor, scratch: Any = None) -> torch.Tensor:
    """[6, rows] float64 of a [rows, n] matrix: sum, min, max, magnitude sum, least magnitude, 2-norm."""
    if scratch is not None:
        magnitude = torch.abs(matrix, out=scratch[:matrix.numel()].view(matrix.shape))
    else:
        magnitude = matrix.abs()
    return torch.stack([matrix.sum(1), matrix.amin(1), matrix.amax(1), magnitude.sum(1), magnitude.amin(1),
                        torch.linalg.vector_norm(matrix, dim=1)]).to(_F64)


def reduce_one(tensor: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`reduce_rows` of one large tensor as one row: the same figures, its min and max from one `torch.aminmax`
    pass (on CPU, aminmax over a whole tensor reads it once; along a dimension it is several times slower
    than amin and amax, so the stacked groups keep those)."""
    flat = tensor.reshape(-1)  # a view when it is flat already
    magnitude = torch.abs(flat, out=scratch[:flat.numel()])
    low, high = torch.aminmax(flat)
    return torch.stack([flat.sum(), low, high, magnitude.sum(), magnitude.amin(),
                        torch.linalg.vector_norm(flat)]).to(_F64).unsqueeze(1)


def finish(parts: list[torch.Tensor], matrices: list[torch.Tensor], numel: torch.Tensor) -> np.ndarray:
    """[rows, 9] float64 (mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero) of the reduced rows.

    A row holds no NaN or inf when its sums are finite, and no zero when its least magnitude is not 0:
    only the other rows are counted (`_count_zeros`, `_unfinished_rows`)."""
    f = torch.cat(parts, 1)  # [6, rows]: sum, min, max, magnitude sum, least magnitude, 2-norm
    total, low, high, abs_sum, least, l2 = f
    var = (l2 * l2 - total * total / numel) / (numel - 1)
    std = torch.where(var > 0, var.clamp(min=0).sqrt(), torch.where(var == var, 0.0, _NAN))
    std = torch.where(numel > 1, std, _NAN)
    none = torch.zeros_like(total)
    table = torch.stack([total / numel, std, low, high, abs_sum, l2, none, none, none], 1).numpy()
    finite = total.isfinite() & abs_sum.isfinite() & l2.isfinite()
    zeros = (finite & (least == 0)).nonzero().flatten()
    if zeros.numel():
        _count_zeros(table, zeros.tolist(), matrices)
    unfinished = (~finite).nonzero().flatten()
    if unfinished.numel():
        _unfinished_rows(table, unfinished.tolist(), f.index_select(1, unfinished).t().tolist(), matrices)
    return table


def _locate(rows: list[int], matrices: list[torch.Tensor]) -> dict[int, list[tuple[int, int]]]:
    """{matrix index: [(row, its row in that matrix)]} of sorted reduced rows (a matrix: a stacked group, or a
    large tensor with a leading dimension of 1)."""
    bounds = np.cumsum([m.shape[0] for m in matrices]).tolist()
    found: dict[int, list[tuple[int, int]]] = {}
    which = 0
    for row in rows:
        while row >= bounds[which]:
            which += 1
        found.setdefault(which, []).append((row, row - (bounds[which - 1] if which else 0)))
    return found


def _count_zeros(table: np.ndarray, rows: list[int], matrices: list[torch.Tensor]) -> None:
    """frac_zero of rows with finite sums whose least magnitude is 0, counted exactly (per matrix, one pass
    over those rows)."""
    for which, places in _locate(rows, matrices).items():
        matrix = matrices[which]
        local = torch.tensor([r for _, r in places])
        counts = (matrix.index_select(0, local) == 0).reshape(len(places), -1).sum(1).numpy()
        table[[row for row, _ in places], 8] = counts / matrix[0].numel()


def _unfinished_rows(table: np.ndarray, rows: list[int], figures: list[list], matrices: list[torch.Tensor]) -> None:
    """Rows whose sums are not finite: they hold NaN or inf (counted exactly, and zeros with them), or their
    sums overflow the dtype (an attention mask of float32 minima) and are redone in float64."""
    located = {row: (which, r) for which, places in _locate(rows, matrices).items() for row, r in places}
    for row, (total, low, high, abs_sum, _, l2) in zip(rows, figures):
        which, r = located[row]
        data = matrices[which][r]
        numel = data.numel()
        nans, infs, zeros = int(torch.isnan(data).sum()), int(torch.isinf(data).sum()), int((data == 0).sum())
        if not nans and not infs:  # nothing but the overflow made the sums infinite
            wide = data.to(_F64)
            total, abs_sum, l2 = wide.sum().item(), wide.abs().sum().item(), torch.linalg.vector_norm(wide).item()
        if nans:  # torch's min, max and mean propagate NaN
            low = high = _NAN
        if numel > 1:
            var = (l2 * l2 - total * total / numel) / (numel - 1)
            std = math.sqrt(var) if var > 0 else (0.0 if var == var else _NAN)
        else:
            std = _NAN
        table[row] = (total / numel, std, low, high, abs_sum, l2, nans, infs, zeros / numel)
