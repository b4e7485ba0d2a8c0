"""Two pipeline stages (`torch.distributed.pipelining`, ScheduleGPipe, 2 micro-batches) on a
2-process gloo group, each stage run by its own schema (`SchemaStage`): the capture names the stage,
holds the values of a one-process run of the whole model (micro-batches joined), and an edit on
stage 0 gives the output the same edit gives in one process, bit for bit."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.pipeline_workers import pipeline

    return run_group(pipeline, 2, tmp_path_factory.mktemp("pipeline"), timeout=180)


def test_each_stage_captures_every_micro_batch_under_its_own_name(ranks):
    for rank, result in enumerate(ranks):
        captures = result["captures"]
        assert [c["microbatch"] for c in captures] == [0, 1] and [c["call"] for c in captures] == [0, 1]
        assert {c["stage"] for c in captures} == {rank}
        assert {c["name"] for c in captures} == {f"layers {2 * rank}..{2 * rank + 1}"}
        assert all(c["steps"] > 0 for c in captures)


def test_the_stage_captures_hold_the_values_of_one_process_with_the_same_edit(ranks):
    for result in ranks:
        assert result["places"] > 0 and result["same_places"]
        assert result["captured_values_equal"]  # torch.cat over micro-batches == the one-process capture


def test_an_edit_on_stage_zero_gives_the_output_of_the_same_edit_in_one_process(ranks):
    assert ranks[0]["edited_marks"] == [False, True, False, True]  # h bound twice per micro-batch, the tanh edited
    last = ranks[1]
    assert last["output_equal_one_process"]  # torch.equal
    assert last["edit_changed_output"]  # the edit did reach the output
