"""histogram_bins (the widget's binning) and plot_histograms (activation and gradient side by side)."""

import numpy
import pytest
import torch
from matplotlib.figure import Figure

from nnschemaparser.traces.histograms import HistogramBins, histogram_bins, plot_histograms
from nnschemaparser.traces.record import capture_run
from tests.support.trace_models import spec_mlp


def test_bins_match_numpy_on_the_finite_values_and_count_nan_and_inf_apart():
    torch.manual_seed(0)
    values = torch.randn(1000)
    values[:3] = float("nan")
    values[3:5] = float("inf")
    hist = histogram_bins(values, bins=17)
    finite = values[torch.isfinite(values)].double().numpy()
    counts, edges = numpy.histogram(finite, bins=17, range=(finite.min(), finite.max()))
    assert isinstance(hist, HistogramBins)
    assert list(hist.counts) == counts.tolist()
    assert hist.edges == pytest.approx(edges.tolist(), rel=1e-12)
    assert hist.n_nan == 3 and hist.n_inf == 2 and hist.total == 995


def test_constant_boolean_and_empty_tensors_still_bin():
    constant = histogram_bins(torch.full((4, 4), 2.0), bins=4)
    assert constant.edges[0] == 1.5 and constant.edges[-1] == 2.5 and constant.total == 16
    flags = histogram_bins(torch.tensor([True, False, True]), bins=2)
    assert flags.counts == (1, 2)
    empty = histogram_bins(torch.zeros(0), bins=3)
    assert empty.counts == (0, 0, 0)
    fixed = histogram_bins(torch.tensor([0.0, 5.0, 10.0]), bins=2, value_range=(0.0, 4.0))
    assert fixed.counts == (1, 0)
    assert histogram_bins(torch.arange(4.0), bins=2).to_dict()["counts"] == [2, 2]


def test_bad_bins_and_ranges_are_refused():
    with pytest.raises(ValueError, match="bins"):
        histogram_bins(torch.ones(3), bins=0)
    with pytest.raises(ValueError, match="value_range"):
        histogram_bins(torch.ones(3), value_range=(1.0, 1.0))
    with pytest.raises(TypeError, match="tensor"):
        histogram_bins([1.0, 2.0])


def test_plot_shows_activation_and_gradient_side_by_side():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x.clone().requires_grad_(True)}, capture_grads=True)
    record.outputs[0].pow(2).sum().backward()
    ids = ["MLP_0003", "MLP_0004"]
    figure = plot_histograms(record.trace, ids, gradients=record.gradients, bins=8)
    assert isinstance(figure, Figure)
    axes = figure.axes
    assert len(axes) == 4
    assert [a.get_title().split("\n")[0] for a in axes] == ["MLP_0003", "grad_MLP_0003", "MLP_0004", "grad_MLP_0004"]
    heights = [int(p.get_height()) for p in axes[2].patches]
    assert heights == list(histogram_bins(record.trace.by_container("MLP_0004").value, 8).counts)
    grad_heights = [int(p.get_height()) for p in axes[3].patches]
    assert grad_heights == list(histogram_bins(record.gradients.by_container("grad_MLP_0004").value, 8).counts)


def test_plot_without_gradients_has_one_column_and_refuses_unknown_ids():
    _, x, schema = spec_mlp()
    trace = capture_run(schema, {"x": x}).trace
    figure = plot_histograms(trace, "fc1_0002")
    assert len(figure.axes) == 1
    with pytest.raises(KeyError, match="fc1_0002"):
        plot_histograms(trace, ["fc1_002"])
    with pytest.raises(ValueError, match="at least one"):
        plot_histograms(trace, [])


def _edge_cases(generator: torch.Generator):
    """Values a binning rule can get wrong: on the edges, at the ends, tiny and huge ranges, repeats."""
    for trial in range(400):
        n = int(torch.randint(1, 600, (1,), generator=generator))
        kind = trial % 5
        if kind == 0:
            x = torch.randn(n, generator=generator, dtype=torch.float64)
        elif kind == 1:
            x = torch.randn(n, generator=generator, dtype=torch.float64) * 1e-30
        elif kind == 2:
            x = torch.randint(-5, 6, (n,), generator=generator).double()
        elif kind == 3:
            x = (torch.rand(n, generator=generator, dtype=torch.float64) * 1e6).round() / 7
        else:
            x = torch.randn(n, generator=generator).double() * 1e12
        bins = int(torch.randint(1, 90, (1,), generator=generator))
        low, high = x.min().item(), x.max().item()
        if trial % 3 == 0:  # a range inside the values: some fall outside it
            low, high = low * 0.5, high * 0.5
        if not high > low:
            low, high = low - 0.5, high + 0.5
        if trial % 2 == 0:  # values exactly on every edge
            x = torch.cat([x, torch.linspace(low, high, bins + 1, dtype=torch.float64)])
        yield x, bins, low, high


def test_the_serial_count_of_small_values_is_torch_histogram_exactly():
    from nnschemaparser.traces.histograms import _serial_histogram

    for x, bins, low, high in _edge_cases(torch.Generator().manual_seed(0)):
        counts, edges = torch.histogram(x, bins=bins, range=(low, high))
        serial_counts, serial_edges = _serial_histogram(x, bins, low, high)
        assert torch.equal(serial_counts, counts), (bins, low, high)
        assert torch.equal(serial_edges, edges)


def test_small_and_large_values_take_the_two_paths_and_give_torch_histogram_counts():
    from nnschemaparser.traces import histograms

    torch.manual_seed(1)
    for n in (histograms.SERIAL_BELOW - 1, histograms.SERIAL_BELOW + 1):
        values = torch.randn(n)
        values[::97] = 0.0
        hist = histogram_bins(values, bins=33)
        data = values.double()
        counts, edges = torch.histogram(data, bins=33, range=(data.min().item(), data.max().item()))
        assert list(hist.counts) == [int(c) for c in counts.tolist()] and hist.total == n
        assert list(hist.edges) == edges.tolist()
