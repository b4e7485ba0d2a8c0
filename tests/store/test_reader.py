"""TraceStore reads a store back: SQL over the statistics, mapped tensors, traces the rest of the API takes."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from nnschemaparser import TraceStore, capture_dataset, capture_run, compare_traces, diff_summary, save_trace, load_trace
from nnschemaparser.store.reader import NOT_KEPT
from nnschemaparser.widget.inspector import InspectorWidget
from tests.support.store_models import blocks, inputs, statistics_mismatches, tiny_gpt2, token_inputs


@pytest.fixture(scope="module")
def gpt2_store(tmp_path_factory):
    model, schema = tiny_gpt2()
    data = token_inputs(12)
    path = tmp_path_factory.mktemp("store") / "gpt2"
    store = capture_dataset(schema, data, path, keep="h.*.attn:attn_output, h.*.mlp", block_size=5, progress=False)
    return model, schema, data, store


def test_queries_answer_which_inputs_make_nans_and_the_top_inputs_by_norm(tmp_path):
    _, schema = blocks()
    store = capture_dataset(schema, inputs(20, nan_at=(3, 11)), tmp_path / "s", keep="head", block_size=8,
                            progress=False)
    nan = store.query("select distinct sample from steps where block_path = 'head' and out_var = 'logits' "
                      "and n_nan > 0 order by sample")
    assert list(nan["sample"]) == [3, 11]
    top = store.query("select sample, l2 from steps where block_path = 'layers.1' and out_var = 'out' "
                      "order by l2 desc, sample limit 5")
    frame = store.steps
    expected = frame[(frame.block_path == "layers.1") & (frame.out_var == "out")].sort_values(
        ["l2", "sample"], ascending=[False, True]).head(5)
    assert list(top["sample"]) == list(expected["sample"]) and list(top["l2"]) == list(expected["l2"])


def test_a_small_tensor_is_a_copy_never_a_view_of_the_stores_own_mapping(gpt2_store):
    """A tensor under 64 KiB is copied out of the shard (a view of a mapping of its own per small tensor would
    spend the process's mappings); a larger one is a view of a mapping of its own (tests/store/test_stacked.py)."""
    _, _, _, store = gpt2_store
    row = store.steps[store.steps["kept"] & (store.steps["out_var"] == "attn_output")].iloc[0]
    tensor = store.tensor(int(row["sample"]), row["container_id"])
    shard = store._shards[store._where[f"{row['sample']}/{row['container_id']}"]]
    mapping = shard.mapping()
    start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    assert not start <= tensor.data_ptr() < start + len(mapping)
    dtype, shape, offset = shard.layout[f"{row['sample']}/{row['container_id']}"]
    assert torch.equal(tensor, torch.frombuffer(mapping, dtype=dtype, count=tensor.numel(), offset=offset).reshape(shape))
    assert list(tensor.shape) == list(row["shape"]) and str(tensor.dtype) == row["dtype"]


def test_trace_of_a_sample_equals_a_capture_of_that_input_with_the_same_keep(gpt2_store):
    _, schema, data, store = gpt2_store
    trace = store.trace(7)
    kept = capture_run(schema, dict(data[7]), keep="h.*.attn:attn_output, h.*.mlp, slot=input").trace
    assert [s.container_id for s in trace if s.value is not None] == [s.container_id for s in kept]
    for step in kept:
        assert torch.equal(trace.by_container(step.container_id).value, step.value)
    full = capture_run(schema, dict(data[7])).trace
    assert [s.container_id for s in trace] == [s.container_id for s in full]
    summary = diff_summary(compare_traces(full, trace))
    assert summary["changed"] == 0 and summary["unchanged"] == len(kept)
    assert all(s.omitted == NOT_KEPT for s in trace if s.value is None)
    other = diff_summary(compare_traces(store.trace(7), store.trace(8)))  # two samples compared
    assert other["changed"] > 0 and other["total"] == len(trace)


def test_a_stored_trace_saves_and_loads_like_any_trace(gpt2_store, tmp_path):
    _, _, _, store = gpt2_store
    trace = store.trace(2)
    kept = [s for s in trace if s.value is not None]
    loaded = load_trace(save_trace(type(trace)(kept, root=trace.root), tmp_path / "t.safetensors"))
    assert all(torch.equal(a.value, b.value) for a, b in zip(kept, loaded))


def test_a_sample_opens_in_the_inspector_widget_and_its_run_matches_the_store(gpt2_store):
    _, schema, data, store = gpt2_store
    scope = store.scope(4)
    assert torch.equal(scope["input_ids"], data[4]["input_ids"])
    widget = InspectorWidget(schema, scope, gradients=False)
    try:
        widget.continue_()
        assert widget.status == "finished"
        run = widget.run_records[-1].trace
        summary = diff_summary(compare_traces(store.trace(4), run))
        kept = sum(1 for s in store.trace(4) if s.value is not None)
        assert summary["changed"] == 0 and summary["unchanged"] == kept and summary["only_in_a"] == 0
        frame = widget.trace()
        rows = store.steps[store.steps["sample"] == 4]
        assert list(frame["container_id"]) == list(rows["container_id"])
        for (_, ours), (_, theirs) in zip(rows.iterrows(), frame.iterrows()):  # the widget's are tensor_statistics
            assert not statistics_mismatches(ours, theirs), ours["container_id"]
    finally:
        widget.close()


def test_reductions_merge_to_the_statistics_of_all_kept_occurrences(gpt2_store):
    _, _, _, store = gpt2_store
    name = "h.1.attn:attn_output"
    assert name in store.variables
    reduction = store.reduction(name)
    frame = store.steps
    rows = frame[(frame.block_path == "h.1.attn") & (frame.out_var == "attn_output")]
    firsts = rows.groupby("sample").head(1)  # the first binding of the variable in each input
    values = torch.stack([store.tensor(int(r.sample), r.container_id).double() for r in firsts.itertuples()])
    assert reduction.count == len(store) == len(values)
    # Chan's pairwise merge in float64, against torch's one-pass mean: the same up to float64 rounding
    assert torch.allclose(reduction.mean, values.mean(0), rtol=1e-12, atol=1e-15)
    assert torch.allclose(reduction.var, values.var(0), rtol=1e-9, atol=1e-15)
    channels = values.reshape(-1, values.shape[-1])
    assert torch.allclose(reduction.channel_mean, channels.mean(0), rtol=1e-12, atol=1e-15)
    flat = values.reshape(-1)
    inside = flat[(flat >= -8) & (flat < 8)]
    expected = torch.floor((inside + 8) / (16 / 64)).long().bincount(minlength=64)
    assert torch.equal(reduction.histogram, expected)
    assert reduction.underflow + reduction.overflow + reduction.nan + int(reduction.histogram.sum()) == flat.numel()
    # the top inputs by l2: the l2 of the statistics table, largest first, ties by sample
    norms = sorted(((r.l2, int(r.sample), int(r.step)) for r in firsts.itertuples()), key=lambda t: (-t[0], t[1]))
    assert [(s, st, l2) for l2, s, st in norms[:len(reduction.top)]] == reduction.top
    assert len(reduction.top) == min(len(store), store.options.top_k)
    with pytest.raises(KeyError, match="did you mean"):
        store.reduction("h.1.attn:attn_outpt")


def test_an_unknown_sample_names_the_samples_the_store_has(gpt2_store):
    _, _, _, store = gpt2_store
    with pytest.raises(KeyError, match="not in this store.*12 complete inputs"):
        store.trace(99)
    with pytest.raises(TypeError, match="sql must be a string"):
        store.query(3)
    assert math.isfinite(store.query("select max(l2) as m from steps")["m"][0])


def test_reductions_of_many_variables_read_back_within_the_decode_budget(tmp_path):
    """A reductions file of a hundred variables is dense JSON metadata beside small tensors: the budget
    is the whole file's, as for the shard headers (a bug found by the notebook: 4x the text alone refused it)."""
    _, schema = tiny_gpt2(layers=3)
    store = capture_dataset(schema, token_inputs(20), tmp_path / "s", keep="*", block_size=20, progress=False)
    name = store.commits[0].reductions_file
    from nnschemaparser.store.shards import ShardFile

    assert len(ShardFile(store.path / name, store.limits).metadata["reductions"]) > 64 * 1024
    assert len(store.variables) > 100
    assert store.reduction(store.variables[0]).count == 20


def test_sample_ids_from_a_query_are_accepted_as_they_come(gpt2_store):
    _, _, _, store = gpt2_store
    sample = store.query("select sample from steps order by l2 desc limit 1")["sample"][0]  # a numpy int64
    assert len(store.trace(sample)) == len(store.trace(int(sample)))
    with pytest.raises(TypeError, match="a sample id is an int"):
        store.trace(True)


def test_a_mistaken_query_raises_duckdbs_own_error(gpt2_store):
    import duckdb

    _, _, _, store = gpt2_store
    with pytest.raises(duckdb.BinderException, match="no_such_column"):
        store.query("select no_such_column from steps")


def test_a_store_keeping_block_outputs_by_call_holds_what_capture_run_keeps(tmp_path):
    _, schema = tiny_gpt2()
    data = token_inputs(4)
    store = capture_dataset(schema, data, tmp_path / "s", keep="call=h.1", block_size=4, progress=False)
    for sample in (0, 3):
        kept = capture_run(schema, dict(data[sample]), keep="call=h.1, slot=input").trace
        assert any(s.op_name == "h.1" for s in kept)
        trace = store.trace(sample)
        assert [s.container_id for s in trace if s.value is not None] == [s.container_id for s in kept]
        for step in kept:
            assert torch.equal(trace.by_container(step.container_id).value, step.value)
