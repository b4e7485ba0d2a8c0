"""Rows are samples: a batched input (DataLoader batches of a padded GPT-2 dataset) is split into rows, each with
its own statistics, kept tensors, reductions and top-k, padding left out of them; checked against forward hooks on
the same batches (GPT-2 built from its config, random weights, offline).

What "the same" means here: the store runs each batch once, as the model does, and splits it. A row's kept tensor
is `torch.equal` to the row of what a forward hook on the batched model sees; its statistics equal (==) those the
store's own summariser gives of that hooked row's unmasked positions (the arithmetic is the same: one tensor, one
kernel). A reduction over rows (a channel mean over every token of every row) is summed in another order than a
float64 mean over the hooked tokens: compared per value, the difference printed and bounded by float64 rounding.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader

from nnschemaparser import StoreMismatchError, capture_dataset
from nnschemaparser.store.statistics import summarise
from tests.support.exactness import hooked_outputs
from tests.support.store_models import tiny_gpt2

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LENGTHS = [8, 5, 8, 3, 6, 8, 7, 2, 8, 4]  # 10 texts, right-padded to 8 in batches of 4 (the last of 2)
STATISTICS = ("mean", "std", "min", "max", "abs_sum", "l2", "n_nan", "n_inf", "frac_zero")


def _texts():
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(1, 128, (n,), generator=generator) for n in LENGTHS]


def _collate(texts):
    width = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, :len(t)], mask[i, :len(t)] = t, 1
    return {"input_ids": ids, "attention_mask": mask}


def _loader():
    return DataLoader(_texts(), batch_size=4, collate_fn=_collate)


def _hooked_rows(model, loader):
    """Per row of the dataset, in order: (layer outputs by index as [1, T, d] rows, its mask [1, T] as bool)."""
    rows = []
    for batch in loader:
        seen = hooked_outputs(model.h, lambda: model(**batch))
        for r in range(batch["input_ids"].shape[0]):
            rows.append(({i: out[r:r + 1] for i, out in enumerate(seen)}, batch["attention_mask"][r:r + 1] != 0))
    return rows


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    model, schema = tiny_gpt2(2)
    path = tmp_path_factory.mktemp("rows") / "s"
    store = capture_dataset(schema, _loader(), path, keep="call=h.*", mask="attention_mask", top_k=4, progress=False)
    return model, schema, store, _hooked_rows(model, _loader())


def test_each_row_of_a_batch_is_a_sample_numbered_by_a_running_count_recorded_in_the_manifest(padded):
    _, _, store, hooked = padded
    assert store.samples == list(range(len(LENGTHS))) and store.batch_axis == 0
    options = json.loads((store.path / "manifest.json").read_text())["options"]
    assert options["batch_axis"] == 0 and options["sample_ids"] == "running row count"
    assert options["mask"] == "attention_mask"
    texts = _texts()
    for sample, text in enumerate(texts):
        scope = store.scope(sample)
        assert scope["input_ids"].shape == (1, 8) and torch.equal(scope["input_ids"][0, :len(text)], text)
        assert torch.equal(store.mask(sample), hooked[sample][1])


def test_a_rows_kept_tensor_is_the_row_a_forward_hook_sees(padded):
    _, _, store, hooked = padded
    for sample, (layers, _) in enumerate(hooked):
        for layer, row in layers.items():
            assert torch.equal(store.tensor(sample, f"h.{layer}:output"), row), (sample, layer)


def test_a_rows_statistics_are_those_of_its_unmasked_positions(padded):
    _, _, store, hooked = padded
    steps = store.steps
    for sample, (layers, mask) in enumerate(hooked):
        for layer, row in layers.items():
            found = steps[(steps["sample"] == sample) & (steps["name"] == f"h.{layer}:output")].iloc[0]
            unmasked = row[mask]  # [valid positions, d]
            expected = summarise([unmasked])[0]
            assert [found[k] for k in STATISTICS] == expected, (sample, layer)
            assert found["numel"] == LENGTHS[sample] * 32 and list(found["shape"]) == [1, 8, 32]
            if LENGTHS[sample] < 8:  # the padding changes what the whole row would give
                assert summarise([row])[0] != expected


def test_top_k_ranks_rows_by_the_norm_of_their_unmasked_positions(padded):
    _, _, store, hooked = padded
    reduction = store.reduction("h.1:output")
    norms = {sample: summarise([layers[1][mask]])[0][5] for sample, (layers, mask) in enumerate(hooked)}
    expected = sorted(norms, key=lambda s: (-norms[s], s))[:4]
    assert [sample for sample, _, _ in reduction.top] == expected
    assert [l2 for _, _, l2 in reduction.top] == [norms[s] for s in expected]
    assert reduction.count == len(LENGTHS)


def test_a_rows_reductions_count_unmasked_tokens_only(padded):
    _, _, store, hooked = padded
    reduction = store.reduction("h.1:output")
    tokens = torch.cat([layers[1][mask] for layers, mask in hooked]).double()  # [every unmasked token, d]
    assert tokens.shape[0] == sum(LENGTHS)
    # the histogram: each value's bin, as the store bins float32 (in float32), counted exactly
    values = torch.cat([layers[1][mask].reshape(-1) for layers, mask in hooked])
    index = ((values - reduction.edges[0].float()) * (len(reduction.histogram) / 16.0)).clamp(-1, 64).add(1)
    counts = torch.bincount(index.to(torch.int32), minlength=66)
    assert torch.equal(reduction.histogram, counts[1:65]) and reduction.underflow == counts[0]
    # the channel mean and variance: float64 over the same tokens, summed in another order (Chan's merges of the
    # rows' per-element figures against one mean over all of them): per value, within float64 rounding
    mean_difference = (reduction.channel_mean - tokens.mean(0)).abs().max().item()
    var_difference = (reduction.channel_var - tokens.var(0)).abs().max().item()
    print(f"channel mean: max difference {mean_difference:.3e}; channel variance: {var_difference:.3e}")
    assert mean_difference <= 1e-13 * tokens.abs().max().item()
    assert var_difference <= 1e-12 * tokens.var(0).max().item()
    # rows of other lengths: the per-element figures are off, and say why
    assert reduction.mean is None and "shapes differ" in reduction.note


def test_rows_without_a_mask_are_whole_rows_and_batch_axis_none_keeps_the_batch_as_one_sample(tmp_path):
    model, schema = tiny_gpt2(2)
    loader = _loader()
    rows = capture_dataset(schema, loader, tmp_path / "rows", keep="call=h.*", progress=False)
    whole = capture_dataset(schema, loader, tmp_path / "whole", keep="call=h.*", batch_axis=None, progress=False)
    hooked = _hooked_rows(model, loader)
    assert rows.samples == list(range(10)) and whole.samples == [0, 1, 2]
    steps = rows.steps
    for sample, (layers, _) in enumerate(hooked):
        found = steps[(steps["sample"] == sample) & (steps["name"] == "h.0:output")].iloc[0]
        assert [found[k] for k in STATISTICS] == summarise([layers[0]])[0] and found["numel"] == 8 * 32
    reduction = rows.reduction("h.0:output")
    assert reduction.count == 10 and tuple(reduction.mean.shape) == (1, 8, 32)
    stacked = torch.cat([layers[0] for layers, _ in hooked]).double()
    print(f"per-element mean over rows: max difference {(reduction.mean[0] - stacked.mean(0)).abs().max().item():.3e}")
    assert (reduction.mean[0] - stacked.mean(0)).abs().max() <= 1e-13 * stacked.abs().max()
    batch = whole.tensor(1, "h.0:output")
    assert batch.shape == (4, 8, 32) and torch.equal(batch, torch.cat([hooked[i][0][0] for i in range(4, 8)]))
    assert whole.reduction("h.0:output").count == 3 and [s for s, _, _ in whole.reduction("h.0:output").top] != []


def test_a_resume_of_rows_writes_the_missing_inputs_and_refuses_other_batching(tmp_path):
    _, schema = tiny_gpt2(2)
    batches = list(_loader())
    path = tmp_path / "s"
    capture_dataset(schema, batches[:1], path, keep="call=h.1", mask="attention_mask", block_size=1, progress=False)
    resumed = capture_dataset(schema, batches, path, keep="call=h.1", mask="attention_mask", block_size=1,
                              progress=False)
    whole = capture_dataset(schema, batches, tmp_path / "w", keep="call=h.1", mask="attention_mask", block_size=1,
                            progress=False)
    assert resumed.samples == whole.samples == list(range(10))
    for sample in range(10):
        assert torch.equal(resumed.tensor(sample, "h.1:output"), whole.tensor(sample, "h.1:output"))
    a, b = resumed.reduction("h.1:output"), whole.reduction("h.1:output")
    assert torch.equal(a.channel_mean, b.channel_mean) and a.top == b.top
    with pytest.raises(StoreMismatchError, match="batch_axis: 0 there, None here"):
        capture_dataset(schema, batches, path, keep="call=h.1", mask="attention_mask", block_size=1,
                        batch_axis=None, progress=False)
    with pytest.raises(StoreMismatchError, match="mask: 'attention_mask' there, None here"):
        capture_dataset(schema, batches, path, keep="call=h.1", block_size=1, progress=False)


def test_a_callable_mask_and_bad_batches_are_explained(tmp_path):
    _, schema = tiny_gpt2(2)
    batches = list(_loader())
    store = capture_dataset(schema, batches, tmp_path / "c", keep="call=h.1", progress=False,
                            mask=lambda scope: scope["input_ids"] != 0)
    assert store.steps[store.steps["name"] == "h.1:output"]["numel"].tolist() == [n * 32 for n in LENGTHS]
    with pytest.raises(ValueError, match="mask='padding' names no input of this batch"):
        capture_dataset(schema, batches, tmp_path / "m", mask="padding", progress=False)
    bad = dict(batches[0], attention_mask=torch.ones(3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="disagree on the batch size"):
        capture_dataset(schema, [bad], tmp_path / "b", progress=False)


def test_an_unbatched_input_read_as_rows_is_refused_when_no_output_bears_the_batch_out(tmp_path):
    """A model of unbatched [C, H, W] images: dim 0 of its input is no batch, and its output has no such axis."""
    from nnschemaparser import NNParser

    class Pool(torch.nn.Module):
        def forward(self, image):
            return image.mean(dim=(1, 2)).sum().reshape(1)

    schema = NNParser.parse_model(model=Pool(), inputs_tensors_values={"image": torch.randn(3, 4, 4)})
    with pytest.raises(ValueError, match=r"read as 3 rows along batch_axis=0, but no output .* batch_axis=None"):
        capture_dataset(schema, [{"image": torch.randn(3, 4, 4)}], tmp_path / "s", progress=False)
    store = capture_dataset(schema, [{"image": torch.randn(3, 4, 4)}], tmp_path / "s", progress=False, batch_axis=None)
    assert store.samples == [0]


def test_llama_rows_left_padded_keep_the_hooked_rows_and_count_their_real_tokens(tmp_path):
    """A tiny Llama (from its config) on left-padded batches: each row's kept layer output is the row a forward
    hook sees, its statistics those of its real (unmasked) positions, which sit at the end of the row."""
    import transformers

    from nnschemaparser import NNParser

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    config._attn_implementation = "eager"
    model = transformers.LlamaModel(config).eval()
    generator = torch.Generator().manual_seed(4)
    lengths = [6, 3, 6, 4, 5, 2]
    batches = []
    for start in (0, 3):
        ids = torch.zeros(3, 6, dtype=torch.long)
        mask = torch.zeros(3, 6, dtype=torch.long)
        for r, n in enumerate(lengths[start:start + 3]):
            ids[r, 6 - n:] = torch.randint(1, 64, (n,), generator=generator)
            mask[r, 6 - n:] = 1
        batches.append({"input_ids": ids, "attention_mask": mask, "use_cache": False})
    schema = NNParser.parse_model(model=model, inputs_tensors_values=batches[0])
    store = capture_dataset(schema, batches, tmp_path / "s", keep="call=layers.*", mask="attention_mask",
                            progress=False)
    assert store.samples == list(range(6))
    steps = store.steps
    for start, batch in zip((0, 3), batches):
        seen = hooked_outputs(model.layers, lambda batch=batch: model(**batch))
        for r in range(3):
            sample, real = start + r, batch["attention_mask"][r:r + 1] != 0
            for layer, out in enumerate(seen):
                row = out[r:r + 1]
                assert torch.equal(store.tensor(sample, f"layers.{layer}:output"), row)
                found = steps[(steps["sample"] == sample) & (steps["name"] == f"layers.{layer}:output")].iloc[0]
                assert [found[k] for k in STATISTICS] == summarise([row[real]])[0]
                assert found["numel"] == lengths[sample] * 32
