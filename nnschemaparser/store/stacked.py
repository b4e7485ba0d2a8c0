"""Stacked reads of a store: one kept value over many samples as one tensor (`stack`), and its token rows in
shuffled batches for training an SAE or a probe (`TokenBatches`, what `TraceStore.tokens` returns).

`stack(store, name, samples, positions)` gives [samples, *row] with `row` a sample's tensor (a store of
rows: without its batch axis of size 1, so GPT-2's `h.3:output` of 10 rows is [10, T, d]; a store of
whole inputs: as kept, [10, B, T, d]). When the samples' tensors lie in one shard at evenly spaced
offsets (the samples of a unit that keep the same values do), it is one strided view of a
copy-on-write mapping of its own: nothing is read until touched, and a write changes that result only.
Otherwise the tensors are copied into one. `positions` indexes the positions axis (the one after the
batch axis) as torch indexing does: an int drops it, a slice is a view, a list copies.

`TokenBatches` reads a kept value as token rows: a sample's tensor [b, T, *features] (b = 1 in a store of
rows) is b * T tokens of `features` (flattened: [n, d] batches); a 2-D tensor [b, d] is b tokens. A
position the store's mask marks as padding is no token. The order is a permutation of every token of
every sample drawn from `seed` (or the store's order without `shuffle`), then split over `world`
processes: process `rank` takes every `world`-th token of it, so the parts are disjoint and together
are every token once, and the same seed gives the same batches on every machine. It is a torch
`IterableDataset`: `DataLoader(batches, batch_size=None, num_workers=k)` splits each process's batches
over its workers (batch i to worker i % k). Reading copies each batch out of the shards (a batch never
shares memory with the store or another batch).

Depends on torch and the store's own modules (reader.py hands them its layout); never on the runtime.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterator, Optional

import torch

from .rows import MASK_KEY

__all__ = ["stack", "TokenBatches"]


def _located(store: Any, name: str, samples: Any) -> list[tuple[int, str]]:
    """[(sample, container_id)] of the kept value `name` (a step name or a container id) for `samples` (None:
    every sample that keeps it), in the order given."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a step name ('h.3:output') or a container id, got {type(name).__name__}")
    steps = store.steps
    kept = steps[steps["kept"]]
    rows = kept[kept["name"] == name]
    if not len(rows):
        rows = kept[kept["container_id"] == name]
    if not len(rows):
        import difflib

        names = sorted(set(kept["name"]))
        close = difflib.get_close_matches(name, names, n=3)
        raise KeyError(f"no sample keeps {name!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                                      f"; the store keeps {len(names)} names (store.steps.name)"))
    found = dict(zip(rows["sample"].tolist(), rows["container_id"].tolist()))
    if samples is None:
        return sorted(found.items())
    if isinstance(samples, (str, bytes)) or not hasattr(samples, "__iter__"):
        raise TypeError(f"samples must be None or an iterable of sample ids (range(10, 20)), got {type(samples).__name__}")
    out = []
    for sample in samples:
        if isinstance(sample, bool) or not isinstance(sample, numbers.Integral):
            raise TypeError(f"a sample id is an int, got {type(sample).__name__}")
        if int(sample) not in found:
            store._commit_of(sample)  # a sample not in the store: its KeyError
            raise KeyError(f"sample {sample} does not keep {name!r} (its statistics are in store.steps)")
        out.append((int(sample), found[int(sample)]))
    return out


def _row_shape(store: Any, shape: tuple) -> tuple:
    axis = store.options.batch_axis
    if axis is not None and len(shape) > axis and shape[axis] == 1:
        return shape[:axis] + shape[axis + 1:]
    return shape


def stack(store: Any, name: str, samples: Any = None, positions: Any = None) -> torch.Tensor:
    """See the module docstring (and `TraceStore.stack`)."""
    located = _located(store, name, samples)
    places = []
    for sample, cid in located:
        shard, key = store._place(sample, cid)
        dtype, shape, offset = shard.layout[key]
        places.append((sample, shard, dtype, tuple(shape), offset))
    rows = [_row_shape(store, shape) for _, _, _, shape, _ in places]
    first = places[0] if places else None
    for (sample, _, dtype, shape, _), row in zip(places, rows):
        if row != rows[0] or dtype != first[2]:
            raise ValueError(f"{name!r} is {first[2]}{list(first[3])} in sample {first[0]} but {dtype}{list(shape)} in "
                             f"sample {sample}: samples of other shapes do not stack (inputs of other lengths: pad "
                             "them to one length, or read each with store.tensor(sample, name))")
    result = _mapped(places, rows[0]) if places else None
    if result is None:
        result = torch.stack([store.tensor(sample, cid).reshape(rows[0]) for sample, cid in located]) if located else \
            torch.empty((0,))
    if positions is None:
        return result
    dim = 1 + store.options.batch_axis if store.options.rows else 2
    if dim >= result.dim():
        raise ValueError(f"{name!r} has no positions axis to index (its samples are {list(rows[0])})")
    index: Any = [slice(None)] * dim + [positions]
    if isinstance(positions, (list, tuple)):
        index[-1] = torch.as_tensor(positions, dtype=torch.long)
    return result[tuple(index)]


def _mapped(places: list, row: tuple) -> Optional[torch.Tensor]:
    """One strided view of a mapping of its own, when every tensor lies in one shard at evenly spaced offsets,
    each aligned to its element size; None otherwise."""
    shard, dtype = places[0][1], places[0][2]
    size = dtype.itemsize
    count = math.prod(row)
    nbytes = count * size
    offsets = [offset for _, s, _, _, offset in places if s is shard]
    if len(offsets) != len(places) or not count or any(o % size for o in offsets):
        return None
    spacing = offsets[1] - offsets[0] if len(offsets) > 1 else nbytes
    if spacing < nbytes or spacing % size or any(b - a != spacing for a, b in zip(offsets, offsets[1:])):
        return None
    import sys

    if sys.byteorder != "little":  # pragma: no cover - safetensors is little-endian
        return None
    span = spacing * (len(offsets) - 1) + nbytes
    mapped, at = shard.region(offsets[0], span)
    flat = torch.frombuffer(mapped, dtype=dtype, count=span // size, offset=at)
    strides, step = [], 1
    for d in reversed(row):
        strides.append(step)
        step *= d
    return flat.as_strided((len(offsets),) + row, (spacing // size,) + tuple(reversed(strides)))


class TokenBatches(torch.utils.data.IterableDataset):
    """Token rows of a kept value in batches (see the module docstring; made by `TraceStore.tokens`)."""

    def __init__(self, store: Any, name: str, batch_size: int, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world: int = 1, drop_last: bool = False, index: bool = False):
        for label, value, low in (("batch_size", batch_size, 1), ("world", world, 1), ("rank", rank, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{label} must be an int of at least {low}, got {value!r}")
        if rank >= world:
            raise ValueError(f"rank {rank} is not a rank of world {world} (0..{world - 1})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if store.options.batch_axis not in (None, 0):
            raise ValueError(f"tokens reads [batch, positions, ...] values; this store's batch axis is "
                             f"{store.options.batch_axis}: read its tensors with store.stack or store.tensor")
        self.store, self.name, self.batch_size = store, name, batch_size
        self.shuffle, self.seed, self.rank, self.world = shuffle, seed, rank, world
        self.drop_last, self.index = drop_last, index
        self._samples: list = []  # (sample, shard, key, dtype, tokens shape [P, F], valid positions or None)
        self._plan()

    def _plan(self) -> None:
        store = self.store
        features = None
        counts = []
        for sample, cid in _located(store, self.name, None):
            shard, key = store._place(sample, cid)
            dtype, shape, _ = shard.layout[key]
            shape = tuple(shape)
            if len(shape) < 2:
                raise ValueError(f"{self.name!r} is {list(shape)} in sample {sample}: a token row needs [positions, "
                                 "features] at least")
            lead = 2 if len(shape) >= 3 else 1
            rest = (math.prod(shape[lead:]),)
            if features is None:
                features = (dtype, rest)
            elif features != (dtype, rest):
                raise ValueError(f"{self.name!r} has {features[1][0]} {features[0]} features in sample "
                                 f"{self._samples[0][0]} but {rest[0]} {dtype} in sample {sample}: tokens of one "
                                 "batch need one width")
            valid = None
            mask = store._mask(sample)
            if mask is not None and tuple(mask.shape) == shape[:2] and lead == 2:
                valid = mask.reshape(-1).nonzero().flatten()
            positions = math.prod(shape[:lead])
            self._samples.append((sample, shard, key, dtype, (positions,) + rest, valid))
            counts.append(len(valid) if valid is not None else positions)
        self._counts = torch.tensor(counts, dtype=torch.long)
        self._ends = torch.cumsum(self._counts, 0)
        self.tokens = int(self._ends[-1]) if counts else 0
        self.features = features[1] if features is not None else (0,)

    def _order(self) -> torch.Tensor:
        if self.shuffle:
            order = torch.randperm(self.tokens, generator=torch.Generator().manual_seed(self.seed))
        else:
            order = torch.arange(self.tokens)
        return order[self.rank::self.world]

    def __len__(self) -> int:
        mine = len(range(self.rank, self.tokens, self.world))
        return mine // self.batch_size if self.drop_last else -(-mine // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        order = self._order()
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for number, start in enumerate(range(0, len(order), self.batch_size)):
            part = order[start:start + self.batch_size]
            if self.drop_last and len(part) < self.batch_size:
                return
            if number % workers == worker:
                yield self._read(part)

    def _read(self, tokens: torch.Tensor) -> Any:
        tokens = tokens.contiguous()
        which = torch.searchsorted(self._ends, tokens, right=True)
        local = tokens - (self._ends[which] - self._counts[which])
        dtype = self._samples[0][3] if self._samples else torch.float32
        out = torch.empty((len(tokens),) + self.features, dtype=dtype)
        where = torch.empty((len(tokens), 2), dtype=torch.long)
        for s in torch.unique(which).tolist():
            sample, shard, key, _, shape, valid = self._samples[s]
            at = (which == s).nonzero().flatten()
            rows = local[at] if valid is None else valid[local[at]]
            _, _, offset = shard.layout[key]
            data = torch.frombuffer(shard.mapping(), dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
            out[at] = data.index_select(0, rows)  # a copy out of the store's own mapping
            where[at, 0] = sample
            where[at, 1] = rows
        return (out, where) if self.index else out
