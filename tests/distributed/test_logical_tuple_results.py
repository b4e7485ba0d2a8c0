"""The parts of an op's tuple result get their placements in a logical capture (2 gloo processes).

`gate, value = self.up(x).chunk(2, dim=-1)` binds a tuple, not a tensor: the interpreter's fast
path never showed it to the recorder, so the getitems read its parts as replicated values, the
check after the run found them different on the ranks, and every value computed from them had an
unknown placement (on a transformers Llama under FSDP2: 872 of 944 values, from `q, k =
apply_rotary_pos_emb(...)` on).
"""

from __future__ import annotations

import pytest
import torch

from tests.support.collective_group import run_group
from tests.support.distributed_tuple import tuple_parts


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_group(tuple_parts, 2, tmp_path_factory.mktemp("tuple"), timeout=180)


def test_the_parts_of_a_tuple_result_are_batch_shards_under_fsdp2(ranks):
    steps = ranks[0]["steps"]
    by_var = {s["var"]: s for s in steps}
    for var in ("gate", "value"):
        assert by_var[var]["badge"] == "S(0)@dp", by_var[var]
    assert all(s["badge"] == "S(0)@dp" for s in steps), [s for s in steps if s["badge"] != "S(0)@dp"]
    assert ranks[0]["steps"] == ranks[1]["steps"]


def test_values_after_a_tuple_split_gather_to_the_one_process_values(ranks):
    rows = {row["variable"]: row for row in ranks[0]["table"]}
    for var in ("gate", "value"):
        assert rows[var]["exact"] is True, rows[var]
    assert all(row["exact"] is True for row in ranks[0]["table"]), [r for r in ranks[0]["table"] if r["exact"] is not True]


def test_a_reason_shared_by_many_failed_values_is_given_once_with_their_count():
    from nnschemaparser.distributed.logical import _reasons

    same = "_operator.getitem differs across mesh dim 'dp'"
    assert _reasons([same] * 9) == f"{same} (9 values)"
    assert _reasons([same, "x differs across mesh dim 'tp'", same]) == f"{same} (2 values); x differs across mesh dim 'tp'"


def test_an_op_run_again_sees_its_operands_with_their_own_strides():
    """The rerun that gives a value its placement copies each operand: a contiguous copy of a
    `chunk` view made `torch.sigmoid` take another loop on AVX-512 and round differently, and the
    value's placement was lost ("DTensor's rules gave another value or none")."""
    from nnschemaparser.distributed.recorder import layout_copy

    rows = torch.randn(3, 5, 2 * 16, generator=torch.Generator().manual_seed(1))
    gate, value = rows.chunk(2, dim=-1)
    views = [gate, value, rows.transpose(0, 2), rows[:, :1].expand(3, 4, 32), rows[:, ::2, 3:], rows]
    for view in views:
        copied = layout_copy(view)
        assert copied.shape == view.shape and copied.stride() == view.stride(), (view.stride(), copied.stride())
        assert torch.equal(copied, view)
        assert copied.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
        assert torch.equal(torch.sigmoid(copied), torch.sigmoid(view))
    copied = layout_copy(gate)
    copied.add_(1)
    assert not torch.equal(copied, gate)  # a copy, not the rank's tensor
