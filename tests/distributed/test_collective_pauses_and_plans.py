"""Collective runs that pause before sub-block calls (`pause_before_calls=True`) and take planned
edits by step index (`edits=`), on 2 gloo ranks: every rank pauses at the same call, a planned edit
gives each rank its part of the logical value, as `run.edit` does at a stop."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def paused(tmp_path_factory):
    from tests.support.collective_plan_workers import pauses

    return run_group(pauses, 2, tmp_path_factory.mktemp("pauses"), timeout=180)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from tests.support.collective_plan_workers import plans

    return run_group(plans, 2, tmp_path_factory.mktemp("plans"), timeout=180)


def test_stepping_a_collective_run_pauses_every_rank_before_the_same_calls_as_a_local_run(paused):
    first, second = paused
    assert first["sequence"] == second["sequence"] == first["local_sequence"] == second["local_sequence"]
    calls = [item[1] for item in first["sequence"] if item[0] == "call"]
    assert calls == ["fc1", "fc2"]
    for rank in paused:
        assert rank["step_output_equal"]


def test_nothing_is_edited_at_a_pause_before_a_call_on_any_rank(paused):
    for rank in paused:
        assert "paused before the call of fc2" in rank["edit_at_pause"] and "nothing can be edited" in rank["edit_at_pause"]


def test_continue_runs_past_pauses_before_calls_to_the_breakpoint(paused):
    first, second = paused
    assert first["continue_stop"] == second["continue_stop"] and first["continue_stop"][2] == "out"
    for rank in paused:
        assert rank["continue_pause"] and rank["continue_output_equal"]


def test_a_planned_sharded_edit_gives_each_rank_its_piece_as_an_edit_at_the_stop_does(planned):
    for rank in planned:
        assert rank["planned_value_is_piece"]
        assert rank["planned_equals_interactive"] and rank["planned_output_equal"] and rank["planned_finish_equal"]


def test_a_planned_edit_one_shape_off_is_applied_on_no_rank_and_the_run_goes_on(planned):
    for rank in planned:
        assert "applied on no rank" in rank["refused"] and "rank 0:" in rank["refused"] and "rank 1:" in rank["refused"]
        assert rank["refused_kept"] and rank["refused_output_equal"]


def test_a_planned_edit_past_the_end_raises_on_every_rank_with_the_outputs_kept(planned):
    for rank in planned:
        assert "never applied" in rank["late"] and "10000" in rank["late"] and rank["late_outputs_kept"]


def test_bad_planned_edits_are_refused_before_any_step_naming_the_entry(planned):
    for rank in planned:
        step = rank["relu_step"]
        assert rank["bad"][0].startswith("SchemaRunError") and "0 is not a step index" in rank["bad"][0]
        assert f"edits[{step}]: unknown key 'value'" in rank["bad"][1]
        assert f"edits[{step}]: 'values' must be the whole (logical) value" in rank["bad"][2]
        assert "edits must map a step index" in rank["bad"][3]
        assert f"edits[{step}]: placement='diagonal'" in rank["bad"][4]
