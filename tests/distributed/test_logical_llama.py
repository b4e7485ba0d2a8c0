"""`capture_logical` on a transformers Llama under FSDP2 (2 gloo ranks): the parts of a tuple an op
returns (`apply_rotary_pos_emb`, a KV cache's `update`) get placements, and the placement rules' second
run of an op changes nothing the first run holds (in-place writes, the RNG, a cache object)."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.support.logical_llama import fsdp_llama_placements

    return run_group(fsdp_llama_placements, 2, tmp_path_factory.mktemp("logical_llama"), timeout=300)


@pytest.fixture(scope="module")
def eager_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.support.logical_llama import fsdp_llama_placements

    return run_group(fsdp_llama_placements, 2, tmp_path_factory.mktemp("logical_llama_eager"), timeout=300,
                     args=("eager",))


def test_the_causal_mask_of_an_eager_fsdp2_llama_is_a_batch_shard_and_gathers_exactly(eager_llama):
    # eager attention: the root builds a [batch, 1, q, kv] float mask (create_causal_mask), which DTensor
    # cannot run again; the batch-rows rule (distributed/batch_rule.py) places it, checked on the rank's rows
    for rank in eager_llama:
        assert rank["unknown"] == {}, list(rank["unknown"].items())[:3]
        assert rank["mask"] == [["S(0)@dp", [2, 1, 6, 6]]]
        assert rank["rows"] == rank["steps"] and rank["exact"] == rank["steps"], rank["reasons"]


def test_every_value_of_a_fsdp2_llama_has_a_placement(llama):
    # q and k come out of `apply_rotary_pos_emb` as a tuple, k and v out of the KV cache's `update`,
    # the attention output out of CPU sdpa (no DTensor rule in torch: distributed/attention_rule.py)
    for rank in llama:
        assert rank["skipped"] == []
        assert rank["unknown"] == {}, list(rank["unknown"].items())[:3]
        for name in ("model.layers.0.self_attn:query_states", "model.layers.0.self_attn:key_states",
                     "model.layers.0.self_attn:attn_output", "model.layers.1.mlp.down_proj:$t1"):
            assert name in rank["names"]
        assert rank["badges"] == ["R", "S(0)@dp"]


def test_every_value_of_a_fsdp2_llama_gathers_to_one_process_exactly(llama):
    for rank in llama:
        assert rank["rows"] == rank["steps"] and rank["exact"] == rank["steps"], rank["reasons"]


def test_a_logical_capture_of_a_fsdp2_llama_keeps_the_outputs_of_a_plain_capture(llama):
    for rank in llama:
        assert rank["local_equal"]


def test_the_placement_rules_run_no_in_place_write_or_random_draw_twice(tmp_path):
    from tests.support.logical_llama import fsdp_in_place_and_random

    for rank in run_group(fsdp_in_place_and_random, 2, tmp_path, timeout=180):
        assert rank["output_equal"], rank
        assert rank["plain_equal"] and rank["capture_equal"]
        assert rank["badges"]["FSDPInPlaceAndRandom:hidden"] == "S(0)@dp"
