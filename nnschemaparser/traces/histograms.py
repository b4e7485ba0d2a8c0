"""Value histograms of trace steps: `histogram_bins` (the numbers) and `plot_histograms` (a figure).

`histogram_bins` is the one binning rule, shared with the widget: finite values only, computed by
torch in float64, equal-width bins over [min, max] (a constant tensor gets one unit-wide range
around its value); NaN and infinities are counted apart. `plot_histograms` draws the activation
and, when a GradientTrace is given, the gradient histogram of each selected step side by side, on
a matplotlib `Figure` built without pyplot (no global figure state, no backend switch).

A view: depends on traces (and torch, matplotlib); nothing below it imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

__all__ = ["HistogramBins", "histogram_bins", "plot_histograms"]


@dataclass(frozen=True)
class HistogramBins:
    """`counts[i]` values fall in [edges[i], edges[i+1]) (the last bin includes its right edge)."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    n_nan: int = 0
    n_inf: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts), "n_nan": self.n_nan, "n_inf": self.n_inf}


def histogram_bins(value: torch.Tensor, bins: int = 40, value_range: Optional[tuple[float, float]] = None
                   ) -> HistogramBins:
    """Equal-width histogram of the finite values of `value` (booleans as 0/1, complex by magnitude)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"histogram_bins needs a tensor, got {type(value).__name__}")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    data = value.detach()
    if data.is_complex():
        data = data.abs()
    data = data.to(device="cpu", dtype=torch.float64).reshape(-1)
    nan = torch.isnan(data)
    inf = torch.isinf(data)
    finite = data[~(nan | inf)]
    n_nan, n_inf = int(nan.sum().item()), int(inf.sum().item())
    if value_range is not None:
        low, high = float(value_range[0]), float(value_range[1])
        if not high > low:
            raise ValueError(f"value_range must be (low, high) with high > low, got {value_range!r}")
    elif finite.numel() == 0:
        low, high = 0.0, 1.0
    else:
        low, high = finite.min().item(), finite.max().item()
        if low == high:
            low, high = low - 0.5, high + 0.5
    if finite.numel() < SERIAL_BELOW:
        counts, edges = _serial_histogram(finite, bins, low, high)
    else:
        counts, edges = torch.histogram(finite, bins=bins, range=(low, high))
    return HistogramBins(tuple(edges.tolist()), tuple(int(c) for c in counts.tolist()), n_nan, n_inf)


#: Below this many values `histogram_bins` counts with elementwise ops, which run on the calling
#: thread (torch's elementwise grain is 32,768), instead of `torch.histogram`, whose kernel enters a
#: parallel region whatever the size: on a loaded machine waiting for the second thread to be
#: scheduled cost 4 to 16 ms a call (the widget bins a value at each Step), against 0.04 ms.
SERIAL_BELOW = 32_768


def _serial_histogram(data: torch.Tensor, bins: int, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.histogram(data, bins=bins, range=(low, high))` for a 1-D float64 tensor, the same
    numbers (tests/traces/test_histograms.py checks it with torch.equal) by torch's own rule: the
    edges are `linspace(low, high, bins + 1)`; a value's bin is first estimated by linear
    interpolation, `int((x - low) * bins / (high - low))`, then found among the edges from one
    below to one above the estimate (the last edge with edge <= x); the last bin holds its right
    edge; values outside [low, high] are not counted. Counts are float64, as torch.histogram's."""
    edges = torch.linspace(low, high, bins + 1, dtype=torch.float64)
    left, right = edges[0].item(), edges[-1].item()
    data = data[(data >= left) & (data <= right)]
    estimate = ((data - left) * bins / (right - left)).to(torch.int64)
    first = (estimate - 1).clamp(min=0)
    end = (estimate + 2).clamp(max=bins + 1)  # the window of edges searched: first .. end - 1
    position = first - 1
    for offset in range(3):
        index = first + offset
        position += ((index < end) & (edges[index.clamp(max=bins)] <= data)).to(torch.int64)
    position = position.clamp(max=bins - 1)  # the right edge is in the last bin
    return torch.bincount(position, minlength=bins).to(torch.float64), edges


def _draw(axis: Any, step: Any, bins: int, colour: str) -> None:
    value = step.tensor.value
    axis.set_title(f"{step.container_id}\n{step.description}", fontsize=8)
    if not isinstance(value, torch.Tensor):
        axis.text(0.5, 0.5, step.omitted or "no value", ha="center", va="center", fontsize=7, wrap=True,
                  transform=axis.transAxes)
        axis.set_xticks([])
        axis.set_yticks([])
        return
    hist = histogram_bins(value, bins)
    widths = [hi - lo for lo, hi in zip(hist.edges, hist.edges[1:])]
    axis.bar(hist.edges[:-1], hist.counts, width=widths, align="edge", color=colour)
    extra = []
    if hist.n_nan:
        extra.append(f"{hist.n_nan} NaN")
    if hist.n_inf:
        extra.append(f"{hist.n_inf} inf")
    axis.set_xlabel(f"{step.tensor.describe()}" + (f" ({', '.join(extra)})" if extra else ""), fontsize=7)
    axis.tick_params(labelsize=7)


def plot_histograms(trace: Any, container_ids: Sequence[str], gradients: Any = None, bins: int = 40) -> Any:
    """A matplotlib Figure: one row per selected step, activation histogram left, gradient right.

    `container_ids` are activation ids of `trace`; `gradients` (a GradientTrace of the same run) adds
    the column of their gradients. An id the trace lacks raises a KeyError naming close ids.
    """
    from matplotlib.figure import Figure

    if isinstance(container_ids, str):
        container_ids = [container_ids]
    container_ids = list(container_ids)
    if not container_ids:
        raise ValueError("plot_histograms needs at least one container id, e.g. trace.container_ids[:3]")
    steps = [trace.by_container(cid) for cid in container_ids]
    grad_steps = []
    if gradients is not None:
        for step in steps:
            try:
                grad_steps.append(gradients.by_container("grad_" + step.container_id))
            except KeyError:
                grad_steps.append(None)
    columns = 2 if gradients is not None else 1
    figure = Figure(figsize=(4.2 * columns, 2.6 * len(steps)), layout="constrained")
    axes = figure.subplots(len(steps), columns, squeeze=False)
    for row, step in enumerate(steps):
        _draw(axes[row][0], step, bins, "#4c72b0")
        if gradients is not None:
            grad = grad_steps[row]
            if grad is None:
                axes[row][1].set_title(f"grad_{step.container_id}", fontsize=8)
                axes[row][1].text(0.5, 0.5, "no gradient step (tensor did not require grad)", ha="center",
                                  va="center", fontsize=7, transform=axes[row][1].transAxes)
                axes[row][1].set_xticks([])
                axes[row][1].set_yticks([])
            else:
                _draw(axes[row][1], grad, bins, "#dd8452")
    return figure
