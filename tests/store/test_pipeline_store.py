"""A tiny transformers Llama split into 2 pipeline stages (`torch.distributed.pipelining`, ScheduleGPipe,
2 micro-batches, `SchemaStage` per stage) on 2 spawned gloo processes fills one store with
`capture_pipeline_dataset`; it equals the store `capture_dataset` writes from the unsplit model in one
process: the same samples (the micro-batches' rows back in the batch's order), the same names whichever
rank ran a layer, every kept value and every statistic `torch.equal`. What is not supported is refused
on every rank together."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser import NNParser, TraceStore, capture_dataset
from tests.support.collective_group import run_group
from tests.support.pipeline_store import KEEP, batches, llama

FIGURES = ["numel", "mean", "std", "min", "max", "abs_sum", "l2", "n_nan", "n_inf", "frac_zero", "kept", "shape",
           "dtype"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.support.pipeline_store import pipeline_store

    tmp = tmp_path_factory.mktemp("pipeline_store")
    ranks = run_group(pipeline_store, 2, tmp, timeout=240, args=(str(tmp),))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs
    try:
        model = llama()
        data = batches()
        schema = NNParser.parse_model(model, inputs_tensors_values=data[0])
        one = capture_dataset(schema, data, tmp / "one", keep=KEEP, block_size=2, progress=False)
    finally:
        torch.set_num_threads(threads)
    return TraceStore(tmp / "pipeline"), one, ranks


def test_a_pipeline_split_model_writes_the_kept_values_of_one_process(stores):
    pipeline, one, ranks = stores
    assert [r["samples"] for r in ranks] == [12, 12] and [r["again"] for r in ranks] == [12, 12]
    assert {c.rank for c in pipeline.commits} == {0}  # rank 0 wrote every block
    assert pipeline.samples == one.samples == list(range(12))  # 3 inputs of 4 rows, in 2 micro-batches each
    assert pipeline.variables == one.variables
    assert {"layers.3:output", "layers.0.self_attn:query_states", "norm:output", "embed_tokens:output"} <= \
        set(pipeline.variables)
    for name in one.variables:
        a, b = pipeline.stack(name), one.stack(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(pipeline.stack("input_ids"), one.stack("input_ids"))  # the root inputs, kept whole
    for sample in (0, 5, 11):
        assert torch.equal(pipeline.scope(sample)["input_ids"], one.scope(sample)["input_ids"])


def test_every_step_of_the_model_has_the_statistics_of_one_process_under_its_name(stores):
    pipeline, one, _ = stores
    mine = pipeline.steps.set_index(["sample", "name"]).sort_index()
    theirs = one.steps.set_index(["sample", "name"]).sort_index()
    assert mine.index.is_unique and theirs.index.is_unique
    # what only one process has: the unsplit root's own variables and its output (the stages' glue instead)
    only_one = {name for _, name in theirs.index.difference(mine.index)}
    assert only_one and all(name.startswith("LlamaModel:") or "last_hidden_state" in name for name in only_one), \
        sorted(only_one)
    assert mine.index.difference(theirs.index).empty  # nothing the unsplit model does not have
    shared = mine.loc[theirs.index.intersection(mine.index)]
    assert len(shared) > 12 * 200  # every step inside layers 0-3, the embedding, the rotary table and the norm
    # a call's out_var is the variable the stage's own code binds it to: named as the stage's author wrote it
    for column in FIGURES + ["block_path", "op_name", "description", "slot_type"]:
        left, right = shared[column].tolist(), theirs.loc[shared.index, column].tolist()
        assert [str(x) for x in left] == [str(x) for x in right], column
    for name in ("layers.2:output", "layers.1.mlp.down_proj:output"):
        a, b = pipeline.reduction(name), one.reduction(name)
        assert torch.equal(a.mean, b.mean) and torch.equal(a.var, b.var) and torch.equal(a.histogram, b.histogram)
        assert [(s, l2) for s, _, l2 in a.top] == [(s, l2) for s, _, l2 in b.top], name  # step numbers are the store's


def test_what_a_pipeline_store_cannot_hold_is_refused_on_every_rank(stores):
    refused = [r["refused"] for r in stores[2]]
    for rank in refused:
        assert "stage 1 has PlacedEdits" in rank["edits"], rank
        assert "rank 1: stage 1: its block 'layers.0." in rank["paths"] and "no sub-module" in rank["paths"], rank
        assert "stage 1: LogicalCaptureError: stage 1: micro-batch 1 ran other steps" in rank["branching"], rank
        assert "data-dependent control flow" in rank["branching"], rank
        assert "micro-batches of one row" in rank["one_row"] and "at least 2 rows" in rank["one_row"], rank


def test_without_a_process_group_it_says_to_use_capture_dataset():
    from nnschemaparser import capture_pipeline_dataset
    from nnschemaparser.distributed import LogicalCaptureError

    with pytest.raises(LogicalCaptureError, match="initialised process group.*use capture_dataset"):
        capture_pipeline_dataset(None, None, [], "unused")
