"""The per-step statistics of tensor objects over the same elements (views, reshapes) are computed once."""

import math

import torch

from nnschemaparser.store import statistics
from nnschemaparser.store.statistics import summarise


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                                               and math.isnan(y)) for x, y in zip(a, b))


def test_views_over_the_same_elements_share_figures_bit_for_bit():
    generator = torch.Generator().manual_seed(3)
    for numel in (96, statistics.SMALL * 2):  # a stacked small tensor, and one reduced on its own
        x = torch.randn(numel, generator=generator)
        views = [x.view(2, -1), x.reshape(4, -1), x.view(-1, 8).view(-1)]
        rows = summarise([x] + views)
        alone = [summarise([v])[0] for v in [x] + views]  # each computed with nothing to share
        for row, own in zip(rows, alone):
            assert _same(row, own), (numel, row, own)


def test_tensors_at_one_address_with_other_elements_are_summarised_each():
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(4, 64, generator=generator)
    head = x[:2]  # the same first address, half the elements
    rows = summarise([x, head, x.double()])
    assert not _same(rows[0], rows[1])
    assert _same(rows[1], summarise([head.clone()])[0])
    assert rows[1][3] == float(head.max()) and rows[0][3] == float(x.max())
    y = x.clone()
    y[0, 0] = 100.0  # another tensor of the same shape and dtype: its own figures
    assert summarise([x, y])[1][3] == 100.0
