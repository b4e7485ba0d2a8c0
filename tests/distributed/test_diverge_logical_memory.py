"""`diverge_logical(memory_budget=)`: the row values each rank holds between runs stay within the
budget, past it they go to disk, and the report is the same as with no budget.

One gloo group of 2 processes on 127.0.0.1 (tests/support/collective_group.py: spawned, one thread
each, every process killed by its pid on failure or past the timeout) runs each case twice, with
`memory_budget=None` and with a budget of a few values (tests/support/diverge_workers.budget_ranks):
the tensor-parallel `Block` whose row-parallel layer rounds its partial sums to bfloat16 (a flagged
first row), FSDP2 with a batch half per rank, and a tiny tensor-parallel transformers Llama.
"""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group

KINDS = ["tp_bf16_reduce", "fsdp", "llama_tp"]
BUDGET = 4096  # bytes per rank: a few of the Block's values (2 x 4 x 32 float32 = 1 KiB each)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.diverge_workers import budget_ranks

    return run_group(budget_ranks, 2, tmp_path_factory.mktemp("diverge_logical_memory"), timeout=240,
                     args=(KINDS, BUDGET))


@pytest.mark.parametrize("kind", KINDS)
def test_a_tiny_budget_spills_and_gives_the_same_report_as_none(ranks, kind):
    held, spilled = ranks[0][kind]["held"], ranks[0][kind]["spilled"]
    assert spilled["rows"] == held["rows"]  # every column of every row, errors to the bit
    assert spilled["first"] == held["first"]
    if kind == "tp_bf16_reduce":
        assert held["first"] is not None and held["first"]["source"] == "return self.down(hidden * 2)"
    assert [r[kind]["spilled"] for r in ranks[1:]] == [{"rank": 1, "report": True}]
    assert "went to disk" in spilled["summary"] and "went to disk" not in held["summary"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_rank_holds_at_most_the_budget_and_without_one_holds_more(ranks, kind):
    held, spilled = ranks[0][kind]["held"]["memory"], ranks[0][kind]["spilled"]["memory"]
    assert held["budget"] is None and spilled["budget"] == BUDGET
    assert len(spilled["ranks"]) == len(held["ranks"]) == 2
    for rank, (free, bounded) in enumerate(zip(held["ranks"], spilled["ranks"])):
        assert free["files"] == 0 and free["peak_held"] > BUDGET, (rank, free)  # the budget is not idle here
        assert 0 < bounded["peak_held"] <= BUDGET, (rank, bounded)
        assert bounded["files"] > 0 and bounded["written"] > 0, (rank, bounded)
    assert spilled["peak_held"] == max(r["peak_held"] for r in spilled["ranks"])
    assert spilled["files"] == sum(r["files"] for r in spilled["ranks"])


def test_a_bad_budget_is_refused_on_every_rank_saying_what_to_pass(ranks):
    for rank in ranks:
        assert "memory_budget must be a number of bytes" in rank["bad"] and "None for no limit" in rank["bad"]
