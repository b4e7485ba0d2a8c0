"""One logical model (issue 25, point 1): a sharded run's values, placed and gathered, against one process.

Each group is real processes on 127.0.0.1 (gloo), spawned once per kind for the module (a hard
timeout; every process killed by its pid when the group fails or runs late): tensor parallel on a
1-D mesh (2 processes), FSDP2 (2), FSDP2 x tensor parallel on a 2-D mesh (4), a tensor-parallel run
whose ranks were given different inputs (2), and rank 0's widget (2).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.harness import run_group

REDUCED = "sum over shards"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    results: dict = {}

    def get(kind: str, world: int = 2) -> list[dict]:
        if kind not in results:
            results[kind] = run_group(kind, world, tmp_path_factory.mktemp(kind))
        return results[kind]

    return get


def _rows(result: dict) -> dict:
    return {row["container_id"]: row for row in result["table"]}


def _shapes(result: dict) -> dict:
    return {row["container_id"]: (tuple(row["shape"]), tuple(row["local_shape"])) for row in result["frame"]}


def test_tensor_parallel_values_gather_to_the_one_process_values(group):
    results = group("tp")
    assert [r["table"] for r in results[1:]] == [results[0]["table"]], "every rank gets the same comparison"
    result = results[0]
    assert result["skipped"] == {} and result["skip_reason"] is None
    rows, shapes = _rows(result), _shapes(result)
    # the column-parallel projections' values are shards of the last dim, then of the heads
    assert rows["attn_q_0004"]["placement"] == "S(2)@tp" and shapes["attn_q_0004"] == ((2, 4, 32), (2, 4, 16))
    assert rows["attn_0007"]["placement"] == "S(1)@tp" and shapes["attn_0007"] == ((2, 4, 4, 8), (2, 2, 4, 8))
    assert rows["attn_0019"]["variable"] == "scores" and rows["attn_0019"]["placement"] == "S(1)@tp"
    assert rows["mlp_0029"]["variable"] == "hidden" and rows["mlp_0029"]["placement"] == "S(2)@tp"
    exact = [row for row in rows.values() if not row["reduced"]]
    assert len(exact) >= 20
    for row in exact:  # no sum over shards on the way: bit for bit the one-process value
        assert row["exact"] is True and row["max_abs_diff"] == 0.0, row


def test_row_parallel_partial_sums_report_their_difference_instead_of_exactness(group):
    rows = _rows(group("tp")[0])
    partial = [row for row in rows.values() if row["placement"] == "P(sum)@tp"]
    assert [row["container_id"] for row in partial] == ["attn_o_0023", "mlp_down_0031"]
    reduced = [row for row in rows.values() if row["reduced"]]
    assert {"attn_0024", "Block_0026", "mlp_up_0027", "output_0035"} <= {row["container_id"] for row in reduced}
    for row in reduced:
        assert REDUCED in row["reason"], row
        assert row["max_abs_diff"] is not None and row["max_abs_diff"] < 1e-5
        assert row["exact"] == (row["max_abs_diff"] == 0.0)
    assert any(row["exact"] is False and row["max_abs_diff"] > 0 for row in partial), \
        "the sum over shards adds in another order here; the table must say so, not claim exactness"
    assert not any("UNEXPECTED" in row["reason"] for row in rows.values())


def test_fsdp2_activations_are_batch_shards_equal_to_one_process(group):
    # The root's own group holds the norm's weights: right after parsing, FSDP2 believes them
    # unsharded while the module holds the shards again; capture_logical puts the state right first.
    results = group("fsdp")
    result = results[0]
    assert result["skipped"] == {} and result["skip_reason"] is None
    rows, shapes = _rows(result), _shapes(result)
    assert len(rows) == 35
    for cid, row in rows.items():
        assert row["placement"] == "S(0)@dp", row  # every rank holds its share of the batch
        assert row["exact"] is True and row["max_abs_diff"] == 0.0, row
        whole, local = shapes[cid]
        assert whole[0] == 2 * local[0] and whole[1:] == local[1:]
    assert result["output_equal"] is True


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh_gathers_both_dims(group):
    results = group("2d", 4)
    assert {tuple(r["mesh"]) for r in results} == {(2, 2)}
    rows, shapes = _rows(results[0]), _shapes(results[0])
    assert rows["input_0001"]["placement"] == "S(0)@dp·R@tp"
    assert rows["attn_q_0004"]["placement"] == "S(0)@dp·S(2)@tp"
    assert shapes["attn_q_0004"] == ((4, 4, 32), (2, 4, 16))
    assert rows["attn_o_0023"]["placement"] == "S(0)@dp·P(sum)@tp"
    assert rows["output_0035"]["placement"] == "S(0)@dp·R@tp"
    for row in rows.values():
        assert "unknown" not in row["reason"], row
        if row["reduced"]:
            assert REDUCED in row["reason"] and row["max_abs_diff"] < 1e-5
        else:
            assert row["exact"] is True and row["max_abs_diff"] == 0.0, row
    assert [r["table"] for r in results[1:]] == [results[0]["table"]] * 3


def test_values_that_differ_across_ranks_are_never_claimed_replicated(group):
    result = group("diverge")[0]  # tensor parallel, but each rank was given another input
    placements = result["placements"]
    assert placements["input_0001"][0] == "?@tp" and "differs across mesh dim 'tp'" in placements["input_0001"][1]
    for cid in ("attn_q_0004", "attn_0024", "output_0035"):  # everything computed from it is unknown too
        assert placements[cid][0].startswith("?"), (cid, placements[cid])
        assert "not replicated" in placements[cid][1]
    assert "cannot be gathered" in result["gather_error"] and "input_placements" in result["gather_error"]


def test_rank0_widget_shows_logical_shapes_stats_and_placement_badges(group):
    result = group("widget")[0]
    assert result["before"]["ok"] is False and "show_logical" in result["before"]["error"]
    assert result["logical_trait"] == [False, True]  # the browser adds its Logical tab on the change
    reply = result["widget"]
    assert reply["ok"] is True
    view = reply["data"]
    assert view["mesh"] == {"dims": ["tp"], "shape": [2]}
    rows = {row["container_id"]: row for row in view["rows"]}
    assert len(rows) == 35
    q = rows["attn_q_0004"]
    assert q["badge"] == "S(2)@tp" and q["local_shape"] == [2, 4, 16] and q["logical_shape"] == [2, 4, 32]
    assert "sharded on tensor dim 2 over mesh dim 'tp'" in q["placement"]
    assert rows["attn_o_0023"]["badge"] == "P(sum)@tp" and rows["attn_o_0023"]["reduced"] is True
    for cid, row in rows.items():
        assert row["logical_shape"] == result["reference"][cid], cid  # the whole tensor's shape
        assert row["stats"]["numel"] == int(torch.tensor(row["logical_shape"]).prod())
        assert sum(row["bins"]["counts"]) == row["stats"]["numel"]
        if not row["reduced"]:  # statistics of the whole tensor, as one process computes them
            assert row["stats"]["mean"] == result["reference_mean"][cid], cid


def test_rank0_widget_compares_each_logical_value_with_one_process(group):
    result = group("widget")[0]
    view = result["widget"]["data"]
    table = {row["container_id"]: row for row in result["table"]}  # compare_logical on the same trace
    assert view["compared"] is True and view["ranks"] == 2
    exact = 0
    for row in view["rows"]:
        compare, expected = row["compare"], table[row["container_id"]]
        assert compare == {"exact": expected["exact"], "max_abs_diff": expected["max_abs_diff"],
                           "reason": expected["reason"]}, row["container_id"]
        if not row["reduced"]:
            assert compare["exact"] is True and compare["max_abs_diff"] == 0.0, row["container_id"]
        elif not compare["exact"]:  # a sum over shards: the difference is given, not exactness claimed
            assert compare["max_abs_diff"] > 0 and "in another order" in compare["reason"], row["container_id"]
        exact += compare["exact"] is True
    assert view["exact"] == exact
