"""`diverge_logical`: one process against a sharded run of the same model, by source statement.

One gloo group of 2 processes on 127.0.0.1 (tests/support/collective_group.py: a hard timeout,
every process killed by its pid when it fails or runs late) runs every case in turn on the
attention + MLP `Block` of tests/support/distributed_models.py: tensor parallel (ColwiseParallel /
RowwiseParallel, DTensor) fault-free, with a row-parallel layer rounding its partial sums to
bfloat16 before the all-reduce, with rank 1's part of a column-parallel output scaled, and FSDP2
with each rank its own half of the batch; then a tiny transformers Llama (random weights, offline),
tensor parallel on its projections (fault-free and with layer 1's `down_proj` rounding its partial
sums to bfloat16) and under FSDP2.
"""

from __future__ import annotations

import pytest

from tests.support.collective_group import run_group

KINDS = ["tp", "tp_bf16_reduce", "tp_scaled_rank", "fsdp", "llama_tp", "llama_tp_bf16_reduce", "llama_fsdp"]
LLAMA = "transformers/models/llama/modeling_llama.py"
MODELS = "tests/support/distributed_models.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from tests.support.diverge_workers import diverge_ranks

    return run_group(diverge_ranks, 2, tmp_path_factory.mktemp("diverge_logical"), timeout=240, args=(KINDS,))


def _rows(ranks, kind):
    return ranks[0][kind]["rows"]


def _row(rows, block_path, line, var):
    found = [r for r in rows if r["block_path"] == block_path and r["line"] == line and r["out_var"] == var]
    assert len(found) == 1, (block_path, line, var, found)
    return found[0]


def test_only_rank_0_gets_the_report(ranks):
    for kind in KINDS:
        assert ranks[1][kind] == {"rank": 1, "report": True}  # None on rank 1
        assert "rows" in ranks[0][kind]


def test_fault_free_tensor_parallel_flags_nothing_and_names_each_sum_over_shards(ranks):
    result = ranks[0]["tp"]
    rows = result["rows"]
    assert result["first"] is None and not any(r["flagged"] for r in rows)
    assert len(rows) == 17 and {r["status"] for r in rows} == {"matched"}
    assert _row(rows, "attn", 22, "q")["placement"] == "S(1)@tp"
    assert _row(rows, "mlp", 37, "hidden")["placement"] == "S(2)@tp"
    summed = [r for r in rows if r["sums_here"]]
    partial = [r for r in rows if r["placement"] == "P(sum)@tp"]
    assert [(r["block_path"], r["out_var"]) for r in partial] == [("attn.o", "return"), ("mlp.down", "return")]
    assert {id(r) for r in partial} <= {id(r) for r in summed}
    for row in summed:  # the reordered sum is said, with its size, and is within what float32 explains
        assert "sums over shards" in row["note"] and f"{row['local_error']:.3g}" in row["note"], row
        assert row["local_error"] <= row["bound"]
    assert any(r["local_error"] > 0 for r in partial), "the all-reduce adds in another order: the table must show it"
    for row in rows:
        if not row["reduced"]:  # no sum over shards on the way: bit for bit one process
            assert row["local_error"] == 0.0 and row["carried_error"] == 0.0, row
        elif not row["sums_here"]:  # computed from a summed value: it carries, it adds nothing
            assert row["local_error"] == 0.0 and "carries" in row["note"], row


def test_partial_sums_rounded_to_bf16_before_the_all_reduce_are_named_at_their_line(ranks):
    result = ranks[0]["tp_bf16_reduce"]
    first = result["first"]
    assert first is not None and first["file"].endswith(MODELS)
    assert (first["block_path"], first["line"], first["out_var"]) == ("mlp", 38, "return")
    assert first["source"] == "return self.down(hidden * 2)"
    rows = result["rows"]
    flagged = [r for r in rows if r["flagged"]]
    assert len(flagged) == 1
    assert 1e-4 < flagged[0]["local_error"] < 2 ** -7  # a bfloat16 rounding, far above 8 eps of float32
    assert "beyond the bound" in flagged[0]["note"]
    # the style is a subclass of RowwiseParallel with its own _prepare_output_fn: its output is still
    # where the partial sums are added, and the row says so
    assert flagged[0]["sums_here"] and flagged[0]["note"].startswith("this statement sums over shards"), flagged[0]
    clean = {(r["block_path"], r["line"], r["out_var"]): r for r in ranks[0]["tp"]["rows"]}
    for row in rows[:rows.index(flagged[0])]:  # everything before it is what the fault-free run gives
        key = (row["block_path"], row["line"], row["out_var"])
        assert (row["local_error"], row["carried_error"]) == (clean[key]["local_error"], clean[key]["carried_error"])


def test_one_ranks_scaled_shard_is_named_and_its_error_is_carried_not_added_after(ranks):
    result = ranks[0]["tp_scaled_rank"]
    first = result["first"]
    assert (first["block_path"], first["line"], first["out_var"]) == ("mlp", 37, "hidden")
    assert first["source"] == "hidden = torch.relu(self.up(x))"
    rows = result["rows"]
    hidden = _row(rows, "mlp", 37, "hidden")
    assert 1e-3 < hidden["local_error"] <= 0.0051  # 1.01 on half the columns, relative to the scale
    after = rows[rows.index(hidden) + 1:]
    assert after and all(r["carried_error"] > r["bound"] for r in after)  # the error travels on ...
    assert not any(r["flagged"] for r in after)  # ... but the statements after it add nothing of their own
    assert sum(r["flagged"] for r in rows) == 1


def test_fsdp2_batch_shards_against_one_process_on_the_whole_batch(ranks):
    result = ranks[0]["fsdp"]
    assert result["whole_equal"] is True and result["whole_shape"] == [4, 4, 32]  # both ranks' halves joined
    rows = result["rows"]
    assert result["first"] is None and len(rows) == 17
    assert {r["status"] for r in rows} == {"matched"} and {r["block_path"] for r in rows} >= {"Block", "attn", "mlp"}
    for row in rows:
        assert row["placement"] == "S(0)@dp" and not row["reduced"], row
        assert row["local_error"] == 0.0 and row["carried_error"] == 0.0, row


def test_fault_free_tensor_parallel_llama_flags_nothing(ranks):
    result = ranks[0]["llama_tp"]
    rows = result["rows"]
    assert result["first"] is None and len(rows) > 80 and {r["status"] for r in rows} == {"matched"}
    partial = [r for r in rows if r["placement"] == "P(sum)@tp"]
    assert sorted({r["block_path"].split(".", 3)[-1] for r in partial}) == ["mlp.down_proj", "self_attn.o_proj"]
    assert len(partial) == 4 and all(r["sums_here"] and r["local_error"] <= r["bound"] for r in partial)
    for row in rows:
        if row["bound"] is None:  # an integer row (positions): compared for equality
            assert row["local_error"] == 0.0 and row["carried_error"] == 0.0, row
            continue
        assert row["local_error"] <= row["bound"], row
        if row["local_error"] > 0 and not row["reduced"]:  # a column split computed with other roundings: said
            assert "although no sum over shards" in row["note"], row


def test_bf16_rounded_partial_sums_in_a_llama_layer_are_named_at_their_line(ranks):
    result = ranks[0]["llama_tp_bf16_reduce"]
    first = result["first"]
    assert first["file"].endswith(LLAMA) and first["block_path"] == "model.layers.1.mlp"
    assert first["out_var"] == "down_proj" and first["source"].startswith("down_proj = self.down_proj(")
    assert sum(r["flagged"] for r in result["rows"]) == 1  # layer 0, and everything after it, add nothing


def test_fsdp2_llama_is_one_process_bit_for_bit(ranks):
    result = ranks[0]["llama_fsdp"]
    rows = result["rows"]
    assert result["first"] is None and len(rows) > 80
    assert {r["placement"] for r in rows} == {"S(0)@dp", "R"}  # rotary cos / sin are replicated
    assert all(r["local_error"] == 0.0 and r["carried_error"] == 0.0 for r in rows)
    assert rows[-1]["block_path"] == "LlamaForCausalLM" and rows[-1]["out_var"] == "logits"


def test_diverge_logical_outside_a_process_group_says_what_to_do():
    import torch.distributed as dist

    from nnschemaparser import DivergeError, NNParser
    from nnschemaparser.distributed import diverge_logical
    from tests.support.distributed_models import block

    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    model = block().eval()
    import torch

    x = torch.randn(1, 2, 32)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    with pytest.raises(DivergeError, match="init_process_group.*use diverge"):
        diverge_logical(schema, {"x": x}, model)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    from tests.support.diverge_workers import diverge_ranks

    return run_group(diverge_ranks, 4, tmp_path_factory.mktemp("diverge_logical_2d"), timeout=300, args=(["2d"],))


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh_cuts_a_values_on_both_dims(four):
    assert [r["2d"] for r in four[1:]] == [{"rank": n, "report": True} for n in (1, 2, 3)]
    result = four[0]["2d"]
    assert result["whole_equal"] is True and result["whole_shape"] == [4, 4, 32]
    rows = result["rows"]
    assert result["first"] is None and len(rows) == 17
    assert _row(rows, "attn", 22, "q")["placement"] == "S(0)@dp·S(1)@tp"
    partial = [r for r in rows if r["placement"] == "S(0)@dp·P(sum)@tp"]
    assert len(partial) == 2 and all(r["sums_here"] and 0 <= r["local_error"] <= r["bound"] for r in partial)
    for row in rows:  # forced with a's value cut on both mesh dims: only the sums over shards add anything
        if row not in partial:
            assert row["local_error"] == 0.0, row
        if not row["reduced"]:
            assert row["carried_error"] == 0.0, row
