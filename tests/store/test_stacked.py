"""Stacked and streaming reads: `store.stack` equals per-sample `tensor()` reads (a mapped view when it can be),
`store.tokens` gives every unmasked token once, split disjointly over ranks and deterministic for a seed, reads
share no writable memory, and a linear probe trained from `store.tokens` equals one trained from forward hooks on
the same tokens in the same order. GPT-2 built from its config (random weights, offline)."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from torch.utils.data import DataLoader

from nnschemaparser import capture_dataset
from tests.support.exactness import hooked_outputs
from tests.support.store_models import Blocks, tiny_gpt2

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _mapped_file(address: int):
    """The file mapped at `address` in this process (Linux's /proc/self/maps), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            low, high = (int(x, 16) for x in parts[0].split("-"))
            if low <= address < high:
                return parts[5] if len(parts) > 5 else None
    return None


def _texts(n: int, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 13, (n,), generator=generator).tolist()
    return [torch.randint(1, 128, (k,), generator=generator) for k in lengths]


def _collate(texts):
    ids = torch.zeros(len(texts), 12, dtype=torch.long)
    mask = torch.zeros(len(texts), 12, dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, :len(t)], mask[i, :len(t)] = t, 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    model, schema = tiny_gpt2(2)
    texts = _texts(40)
    loader = DataLoader(texts, batch_size=8, collate_fn=_collate)
    store = capture_dataset(schema, loader, tmp_path_factory.mktemp("stacked") / "s", keep="call=h.1",
                            mask="attention_mask", block_size=2, progress=False)
    hooked = {}  # (sample, position) -> what a forward hook on h[1] sees there
    sample = 0
    for batch in loader:
        out = hooked_outputs([model.h[1]], lambda batch=batch: model(**batch))[0]
        for r in range(out.shape[0]):
            for p in range(int(batch["attention_mask"][r].sum())):
                hooked[(sample, p)] = out[r, p]
            sample += 1
    return texts, store, hooked


def test_stack_equals_per_sample_reads_and_is_a_view_of_the_shard_when_it_can_be(gpt2):
    texts, store, _ = gpt2
    whole = store.stack("h.1:output")
    assert whole.shape == (40, 12, 32)
    assert torch.equal(whole, torch.cat([store.tensor(s, "h.1:output") for s in range(40)]))
    some = store.stack("h.1:output", samples=[17, 3, 9])
    assert torch.equal(some, torch.cat([store.tensor(s, "h.1:output") for s in (17, 3, 9)]))
    unit = store.stack("h.1:output", samples=range(16, 32))  # block 1: inputs 2 and 3, one shard
    assert _mapped_file(unit.data_ptr()) is not None and _mapped_file(unit.data_ptr()).endswith(".safetensors")
    assert torch.equal(unit, whole[16:32])
    assert torch.equal(store.stack("h.1:output", positions=slice(2, 5)), whole[:, 2:5])
    assert torch.equal(store.stack("h.1:output", samples=[1, 2], positions=[0, 7]), whole[1:3][:, [0, 7]])
    assert torch.equal(store.stack("h.1:output", positions=0), whole[:, 0])
    with pytest.raises(KeyError, match="h.1:output"):
        store.stack("h.1:outptu")
    with pytest.raises(KeyError, match="sample 99 is not in this store"):
        store.stack("h.1:output", samples=[99])


def test_reads_share_no_writable_memory(gpt2, tmp_path):
    _, store, _ = gpt2
    shard = sorted((store.path / "tensors").iterdir())[0]
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    first = store.tensor(3, "h.1:output")
    first.fill_(7.0)
    assert not torch.equal(store.tensor(3, "h.1:output"), first)  # a later read is the stored value
    stacked = store.stack("h.1:output", samples=range(0, 8))
    kept = stacked.clone()
    stacked.zero_()
    assert torch.equal(store.stack("h.1:output", samples=range(0, 8)), kept)
    assert torch.equal(store.tensor(3, "h.1:output")[0], kept[3])
    # a tensor of 64 KiB or more is a view of a mapping of its own: written into, it changes alone
    model = Blocks(width=128, depth=1).eval()
    from nnschemaparser import NNParser

    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(2, 128)})
    big = capture_dataset(schema, [{"x": torch.randn(160, 128)}], tmp_path / "big", keep="layers.0:out",
                          batch_axis=None, progress=False)
    name = [n for n in big.steps["name"] if n.startswith("layers.0:out")][0]
    a, b = big.tensor(0, name), big.tensor(0, name)
    assert a.numel() * 4 >= 64 * 1024 and _mapped_file(a.data_ptr()).endswith(".safetensors")
    value = a.clone()
    a.add_(1.0)
    assert torch.equal(b, value) and torch.equal(big.tensor(0, name), value)
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == digest


def test_tokens_give_every_unmasked_token_once_split_disjointly_over_ranks_and_fixed_by_the_seed(gpt2):
    texts, store, hooked = gpt2
    total = sum(len(t) for t in texts)
    batches = store.tokens("h.1:output", batch_size=16, seed=3, index=True)
    assert batches.tokens == total and len(batches) == -(-total // 16)
    seen = []
    for values, where in batches:
        assert values.shape[1:] == (32,) and len(values) <= 16
        for value, (sample, position) in zip(values, where.tolist()):
            assert torch.equal(value, hooked[(sample, position)])
            seen.append((sample, position))
    assert sorted(seen) == sorted(hooked) and len(seen) == total  # every unmasked token, once; no padding
    again = [where.tolist() for _, where in store.tokens("h.1:output", 16, seed=3, index=True)]
    assert [p for w in again for p in map(tuple, w)] == seen
    other = [p for _, w in store.tokens("h.1:output", 16, seed=4, index=True) for p in map(tuple, w.tolist())]
    assert other != seen and sorted(other) == sorted(seen)
    parts = [[p for _, w in store.tokens("h.1:output", 16, seed=3, rank=r, world=3, index=True)
              for p in map(tuple, w.tolist())] for r in range(3)]
    assert sorted(parts[0] + parts[1] + parts[2]) == sorted(seen)
    assert not set(parts[0]) & set(parts[1]) and not set(parts[1]) & set(parts[2]) and not set(parts[0]) & set(parts[2])
    ordered = [p for _, w in store.tokens("h.1:output", 64, shuffle=False, index=True) for p in map(tuple, w.tolist())]
    assert ordered == sorted(hooked)
    loaded = list(DataLoader(store.tokens("h.1:output", 16, seed=3), batch_size=None))  # a torch IterableDataset
    assert len(loaded) == len(batches) and all(torch.equal(a, b) for a, (b, _) in zip(loaded, batches))
    workers = list(DataLoader(store.tokens("h.1:output", 16, seed=3), batch_size=None, num_workers=2))
    assert sorted(map(tuple, torch.cat(workers).tolist())) == sorted(map(tuple, torch.cat(loaded).tolist()))
    assert len(workers) == len(loaded)  # the batches split over the two workers, each once
    assert len(list(store.tokens("h.1:output", 16, drop_last=True))) == total // 16
    with pytest.raises(ValueError, match="rank 3 is not a rank of world 3"):
        store.tokens("h.1:output", 16, rank=3, world=3)


def test_a_linear_probe_trained_from_store_tokens_equals_one_trained_from_forward_hooks(gpt2):
    """Compared: the same probe (same initial weights), trained with the same SGD steps on the batches
    `store.tokens` gives and on the batches built from forward-hook outputs for the same (sample, position)
    pairs in the same order. Same data, same order: the weights are torch.equal and so are the accuracies.
    The label: whether the token at that position is in the first half of the vocabulary (id < 64)."""
    texts, store, hooked = gpt2

    def label(where):
        return torch.tensor([float(texts[s][p] < 64) for s, p in where.tolist()])

    def train(batches_of):
        torch.manual_seed(0)
        probe = torch.nn.Linear(32, 1)
        optimiser = torch.optim.SGD(probe.parameters(), lr=0.5)
        for epoch in range(30):
            for values, where in batches_of(epoch):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(probe(values).squeeze(1), label(where))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        return probe

    def from_store(epoch):
        return store.tokens("h.1:output", 32, seed=epoch, index=True)

    def from_hooks(epoch):  # the same pairs in the same order, their values from the hooks
        for _, where in store.tokens("h.1:output", 32, seed=epoch, index=True):
            yield torch.stack([hooked[(s, p)] for s, p in where.tolist()]), where

    a, b = train(from_store), train(from_hooks)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    every = sorted(hooked)
    values = torch.stack([hooked[k] for k in every])
    truth = label(torch.tensor(every))
    with torch.no_grad():
        accuracy_a = ((a(values).squeeze(1) > 0).float() == truth).float().mean().item()
        accuracy_b = ((b(values).squeeze(1) > 0).float() == truth).float().mean().item()
    print(f"probe accuracy from store.tokens {accuracy_a:.3f}, from hooks {accuracy_b:.3f} "
          f"(chance {max(truth.mean().item(), 1 - truth.mean().item()):.3f})")
    assert accuracy_a == accuracy_b and accuracy_a > max(truth.mean().item(), 1 - truth.mean().item())
