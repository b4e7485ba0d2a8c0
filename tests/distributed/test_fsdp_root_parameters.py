"""An FSDP2 root holding parameters of its own (a child without its own `fully_shard`) runs under
its schema on 2 gloo ranks in every kind of run, equal to eager FSDP2 on the same ranks, with the
user's root hooks run once per call as in eager.

The parse once left FSDP2's record of the root's group saying "unsharded" while the module held its
shards again (the state guard put the registered parameters back), so the root's pre-forward hook
gathered nothing and the run failed with `aten.addmm.default got mixed torch.Tensor and DTensor`."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    from tests.support.fsdp_root_workers import root_parameters

    return run_group(root_parameters, 2, tmp_path_factory.mktemp("fsdp_root"), timeout=180)


@pytest.fixture(scope="module")
def collective(tmp_path_factory):
    from tests.support.fsdp_root_workers import collective_and_logical

    return run_group(collective_and_logical, 2, tmp_path_factory.mktemp("fsdp_root_collective"), timeout=180)


def test_a_plain_call_of_an_fsdp2_root_with_its_own_linear_equals_eager_outputs_and_gradient_shards(plain):
    for rank in plain:
        assert rank["skipped"] == []
        assert rank["call_output_equal"] and rank["call_grads_equal"]


def test_a_capture_of_an_fsdp2_root_with_its_own_linear_records_the_root_linear_and_equals_eager(plain):
    for rank in plain:
        assert rank["capture_output_equal"] and rank["capture_grads_equal"]
        assert rank["capture_head_steps"] > 0 and rank["capture_head_equal"]


def test_a_step_run_of_an_fsdp2_root_with_its_own_linear_reaches_the_end_with_eager_outputs(plain):
    for rank in plain:
        assert rank["steps"] > 0 and rank["step_output_equal"]


def test_the_users_root_hooks_run_once_per_call_in_plain_capture_and_step_runs(plain):
    for rank in plain:
        assert rank["call_hooks"] == [1, 1]
        assert rank["capture_hooks"] == [1, 1]
        assert rank["step_hooks"] == [1, 1]


def test_the_state_guard_copies_no_fsdp2_shard_for_a_forward_that_writes_none(plain):
    # FSDP2's sharded parameters are DTensors: guarded through their local shards, not cloned up front
    for rank in plain:
        assert rank["guard_copied"] == []
        assert rank["guard_after_output_equal"]


def test_a_collective_run_of_an_fsdp2_root_with_its_own_linear_stops_in_it_and_ends_with_eager_outputs(collective):
    for rank in collective:
        assert rank["collective_output_equal"]
        assert rank["stopped_in"] == "head" and rank["stopped_output_equal"]


def test_a_logical_capture_runs_the_root_hooks_once_and_gathers_the_root_linear_of_one_process(collective):
    for rank in collective:
        assert rank["collective_hooks"] == [1, 1]
        assert rank["logical_hooks"] == [1, 1]
        assert rank["logical_output_equal"] and rank["logical_head_equal"]
