"""A collective run never hangs: a rank that raises (in its model, or in its own code inside
`with run:`) ends the other ranks with `RankFailedError` naming it and its exception, and a rank that
stops answering ends the others with `CollectiveTimeoutError` after the run's timeout."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.collective_workers import failing

    return run_group(failing, 2, tmp_path_factory.mktemp("failing"), timeout=120)


def test_a_rank_whose_model_raises_ends_the_other_with_an_error_naming_it(ranks):
    failed, other = ranks[1]["raises"], ranks[0]["raises"]
    assert failed["error"] == "RuntimeError" and "invalid for input of size 8" in failed["text"]
    assert other["error"] == "RankFailedError" and other["rank"] == 1 and other["type"] == "RuntimeError"
    assert "rank 1 raised RuntimeError: shape '[3, 5]' is invalid" in other["text"]
    assert other["seconds"] < 20  # far below the run's 60 s timeout: the side channel said so


def test_a_rank_whose_own_code_raises_inside_the_run_ends_the_other(ranks):
    failed, other = ranks[0]["user"], ranks[1]["user"]
    assert failed["error"] == "ValueError"
    assert other["error"] == "RankFailedError" and other["rank"] == 0 and other["type"] == "ValueError"
    assert "notebook code failed" in other["text"] and other["seconds"] < 20


def test_a_rank_that_stops_answering_ends_the_other_with_a_timeout(ranks):
    waiting = ranks[0]["silent"]
    assert waiting["error"] == "CollectiveTimeoutError", waiting
    assert "waited 3 s" in waiting["text"] and 2.5 < waiting["seconds"] < 15


def test_a_late_rank_learns_that_the_other_gave_up_waiting(ranks):
    late = ranks[1]["silent"]
    assert late["error"] == "RankFailedError" and late["rank"] == 0, late
    assert late["type"] == "CollectiveTimeoutError" and "waited 3 s" in late["text"]


def test_a_rank_failing_while_the_other_waits_in_the_models_own_collective_is_named(ranks):
    failed, other = ranks[1]["in_model"], ranks[0]["in_model"]
    assert failed["error"] == "RuntimeError" and "invalid for input of size 8" in failed["text"]
    # rank 0 waited in FSDP's all-gather: only the group's 5 s timeout ends that, and then the error
    # it raises names rank 1 and its exception (the gloo error is its cause)
    assert other["error"] == "RankFailedError" and other["rank"] == 1 and other["type"] == "RuntimeError", other
    assert 3 < other["seconds"] < 30
