"""Collective stepping of an FSDP2 model on 2 gloo ranks: the agreements interleave with the model's
own all-gathers, a sharded edit of the batch reaches each rank as its rows, and a NaN on one rank
stops both at the same step."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.collective_workers import fsdp

    return run_group(fsdp, 2, tmp_path_factory.mktemp("fsdp"), timeout=180)


def test_an_fsdp2_model_is_stepped_by_every_rank_together(ranks):
    for rank in ranks:
        assert rank["skipped"] == []
        assert rank["edited"]  # its rows of the whole batch's value
        assert rank["output_equal"]  # the unsharded model on the edited rows, torch.equal (NaN where sqrt(-1))
    assert ranks[0]["nan"] == ranks[1]["nan"]
    assert ranks[0]["nan"]["at"]["var"] == "root" and ranks[0]["nan"]["reasons"] == {"1": "root has a NaN or an Inf"}
