"""An edit of a tensor-parallel activation across 2 ranks (column- then row-parallel linears on a
1-D mesh, gloo): given whole, it reaches each rank as its own shard, whether the variable is a
DTensor (its placements say how) or a plain local shard (`placement=Shard(-1)`)."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.collective_workers import tensor_parallel

    return run_group(tensor_parallel, 2, tmp_path_factory.mktemp("tp"), timeout=180)


@pytest.mark.parametrize("kind", ["dtensor", "local"])
def test_an_edit_of_a_column_parallel_activation_gives_each_rank_its_shard(ranks, kind):
    for rank in ranks:
        seen = rank[kind]
        assert seen["skipped"] == [] and seen["is_dtensor"] == (kind == "dtensor")
        assert seen["local_piece"]  # torch.equal to the rank's columns of the logical value
        if kind == "dtensor":
            assert seen["placements"] == ["S(1)"] and seen["logical"]  # full_tensor() is the logical value


@pytest.mark.parametrize("kind", ["dtensor", "local"])
def test_the_row_parallel_output_after_the_edit_is_the_sum_over_shards(ranks, kind):
    for rank in ranks:
        seen = rank[kind]
        # bit for bit the same sum of per-rank partial products done in one process; against one
        # process's plain matmul the additions run in another order, and the difference is stated
        assert seen["output_equal_same_sum"]
        assert seen["max_difference"] < 1e-5
