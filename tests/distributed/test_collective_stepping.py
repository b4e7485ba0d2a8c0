"""Collective stepping on a 2-process gloo group: every rank stops at the same step, edits of the
logical value, 100 pause/resume cycles, diverging ranks, a driver rank with a follower.

One group runs every scenario (tests/support/collective_workers.py's `stepping`: spawning ranks is
the slow part); each test below asserts on what the ranks reported. The group has a hard deadline
and is killed by pid past it (tests/support/collective_group.py).
"""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.collective_workers import stepping

    return run_group(stepping, 2, tmp_path_factory.mktemp("stepping"), timeout=180)


def test_a_nan_on_one_rank_stops_every_rank_at_the_same_step(ranks):
    first, second = ranks[0]["nan"], ranks[1]["nan"]
    assert first["at"] == second["at"] == {"step": first["at"]["step"], "block": "Rooted", "var": "root"}
    # only rank 1 has the NaN; rank 0 stopped because rank 1's breakpoint hit, and knows why
    assert first["reasons"] == second["reasons"] == {"1": "root has a NaN or an Inf"}
    for rank in ranks:
        assert rank["nan"]["outputs_equal_eager"] and rank["nan"]["ended"]


def test_a_predicate_set_on_rank_zero_only_stops_rank_one_too(ranks):
    assert ranks[0]["predicate"]["at"] == ranks[1]["predicate"]["at"]
    assert ranks[0]["predicate"]["at"]["var"] == "out"
    assert ranks[1]["predicate"]["reasons"] == {"0": "out is bound is true"}


def test_a_replicated_edit_gives_every_rank_the_logical_value(ranks):
    for rank in ranks:
        assert rank["replicated"] and rank["replicated_output_equal"]


def test_a_sharded_edit_gives_each_rank_its_piece_of_the_logical_value(ranks):
    for rank in ranks:
        assert rank["sharded"] and rank["sharded_output_equal"]


def test_an_edit_one_rank_refuses_is_applied_on_no_rank_and_names_the_rank(ranks):
    for rank in ranks:
        assert "applied on no rank" in rank["refused"] and "rank 1:" in rank["refused"] \
            and "rank 0:" not in rank["refused"], rank["refused"]
        assert "shape (3, 4)" in rank["refused"]
        assert rank["refused_kept"]


def test_ranks_given_different_logical_values_refuse_the_edit(ranks):
    for rank in ranks:
        assert "different logical values" in rank["different"] and rank["different_kept"]


def test_one_hundred_pause_resume_cycles_stop_every_rank_at_the_same_steps(ranks):
    stops = [rank["cycles"]["stops"] for rank in ranks]
    assert len(stops[0]) == 101  # h = self.fc(x), then the 100 rounds of the loop
    assert stops[0] == stops[1]
    # a breakpoint on values agrees every step instead of each stop: the same stops
    assert ranks[0]["cycles_values"] == ranks[1]["cycles_values"] == stops[0]
    for rank in ranks:
        assert rank["cycles_output_equal"]


def test_ranks_taking_other_branches_raise_instead_of_stepping_out_of_step(ranks):
    for rank in ranks:
        assert "no longer run the same instructions" in rank["diverged"], rank["diverged"]
        assert rank["diverged_ended"]


def test_ranks_giving_different_commands_are_told_so(ranks):
    for rank in ranks:
        assert "the ranks gave different commands" in rank["commands"], rank["commands"]


def test_a_follower_carries_out_the_driver_commands(ranks):
    driver, follower = ranks[0]["driven"], ranks[1]["driven"]
    assert driver["at"] == follower["at"] and driver["at"]["var"] == "root"
    assert driver["reasons"] == follower["reasons"] == {"1": "root has a NaN or an Inf"}
    assert driver["edited"] is True
    assert driver["hit_steps"] == follower["hit_steps"] == [driver["at"]["step"]]
    # the edit given on rank 0 only reached rank 1 as its own piece: both outputs are the edited ones
    assert driver["output_equal"] and follower["output_equal"]
