"""The per-rank part of a logical edit (`local_part`), and the errors that need no process group."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser.distributed import CollectiveError, collective_step_run
from nnschemaparser.distributed.collective import local_part
from nnschemaparser.schema.errors import EditError


def test_a_shard_gives_each_rank_its_torch_chunk_piece():
    logical = torch.arange(10.0).reshape(5, 2)
    pieces = [local_part(logical, None, "shard:0", rank, 2) for rank in range(2)]
    assert [tuple(p.shape) for p in pieces] == [(3, 2), (2, 2)]
    assert torch.equal(torch.cat(pieces), logical)
    columns = [local_part(logical, None, ("shard", -1), rank, 2) for rank in range(2)]
    assert torch.equal(torch.cat(columns, dim=1), logical)
    assert local_part(logical, None, None, 1, 2) is logical  # replicated: the value itself
    assert local_part(logical, None, "replicate", 0, 2) is logical


def test_torch_placements_are_understood():
    from torch.distributed.tensor import Replicate, Shard

    logical = torch.arange(8.0).reshape(4, 2)
    assert torch.equal(local_part(logical, None, Shard(0), 1, 2), logical[2:])
    assert local_part(logical, None, Replicate(), 1, 2) is logical


def test_unknown_placements_and_values_are_refused():
    with pytest.raises(EditError, match="placement='rows' is not one an edit knows"):
        local_part(torch.zeros(2), None, "rows", 0, 2)
    with pytest.raises(EditError, match="names no dimension"):
        local_part(torch.zeros(2), None, "shard:3", 0, 2)
    with pytest.raises(EditError, match="gives the whole tensor"):
        local_part([1.0], None, None, 0, 2)


def test_a_collective_run_without_a_process_group_says_how_to_start_one():
    with pytest.raises(CollectiveError, match="init_process_group"):
        collective_step_run(None, {})


@pytest.mark.parametrize("edits, message", [
    ([(2, {})], r"edits must map a step index \(int\) to an edit dict or a list of them, got list; "
                r"e\.g\. \{5: \[\{'values': whole_value, 'placement': 'shard:0'\}\]\}"),
    ({0: {"values": torch.zeros(2)}}, r"edits must map a step index \(int\) to an edit dict or a list of them: "
                                      r"0 is not a step index \(steps are ints counted from 1\); e\.g\."),
    ({3: "values"}, r"edits\[3\] must be an edit dict or a list of them, got str"),
    ({3: {"value": torch.zeros(2)}}, r"edits\[3\]: unknown key 'value'; an edit takes values, out_var, frame_depth, "
                                     r"placement, shape, dtype"),
    ({3: {"shape": (2,)}}, r"edits\[3\]: 'values' must be the whole \(logical\) value as a plain tensor, got NoneType"),
    ({3: {"values": torch.zeros(2), "placement": "diagonal"}}, r"edits\[3\]: placement='diagonal'"),
    ({3: {"values": torch.zeros(2), "frame_depth": -1}}, r"edits\[3\]: frame_depth must be a non-negative int"),
])
def test_planned_edits_share_step_runs_check_and_name_the_bad_entry(edits, message):
    from nnschemaparser.distributed.collective_parts import planned_edits
    from nnschemaparser.schema.errors import SchemaRunError

    with pytest.raises(SchemaRunError, match=message):
        planned_edits(edits)


def test_planned_edits_come_in_step_order_as_copies():
    from nnschemaparser.distributed.collective_parts import planned_edits

    edit = {"values": torch.zeros(2), "placement": "shard:0"}
    plan = planned_edits({7: edit, 2: [edit, {"values": torch.ones(2)}]})
    assert list(plan) == [2, 7] and len(plan[2]) == 2
    assert plan[7][0] is not edit and plan[7][0]["values"] is edit["values"] and plan[7][0]["placement"] == "shard:0"
