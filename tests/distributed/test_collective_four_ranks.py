"""Four gloo ranks: a NaN on the last rank only stops all four at the same step, and a sharded edit
of the logical value gives each rank its own rows."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.collective_workers import four_ranks

    return run_group(four_ranks, 4, tmp_path_factory.mktemp("four"), timeout=240)


def test_a_nan_on_the_last_of_four_ranks_stops_them_all_at_one_step(ranks):
    assert len({str(rank["at"]) for rank in ranks}) == 1 and ranks[0]["at"]["var"] == "root"
    assert all(rank["reasons"] == {"3": "root has a NaN or an Inf"} for rank in ranks)
    assert all(rank["edited"] and rank["output_equal"] for rank in ranks)
