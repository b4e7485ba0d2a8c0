"""`capture_logical` on a model sharded by transformers' own tensor parallelism (`tp_plan="auto"`, 2
gloo ranks): every value gets a placement (the styles' `tp_forward` is read, the one-rank mesh dims
`pp`, `dp_replicate` and `fsdp` are replicated), and `compare_logical` finds every value's twin though the
sharded model records fewer steps (each styled Linear runs as one call)."""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.support.logical_hf_tp import hf_tp_placements, save_llama

    folder = tmp_path_factory.mktemp("hf_tp")
    save_llama(str(folder / "llama"))
    return run_group(hf_tp_placements, 2, folder, timeout=300, args=(str(folder / "llama"),))


def test_every_value_of_a_tp_plan_auto_llama_has_a_placement(tp):
    for rank in tp:
        assert "tp" in rank["mesh"]
        assert rank["unknown"] == []
        badge, source = rank["q_proj"]
        assert badge.endswith("S(2)@tp") and "ColwiseParallel" in source
        assert rank["o_proj"] == ["R", True]  # all-reduced: a sum over shards
        assert not rank["embed_reduced"]  # a vocab-parallel lookup adds exact zeros
        assert rank["gate_reduced"]  # computed from the first layer's sums, though colwise itself sums nothing


def test_compare_logical_of_a_tp_plan_auto_llama_is_clean(tp):
    for rank in tp:
        assert rank["compared"] == rank["rows"] == rank["steps"]
        assert rank["exact"] > 0
        assert all(reason.startswith("computed from a sum over shards") for reason in rank["not_exact_reasons"]), \
            rank["not_exact_reasons"]
