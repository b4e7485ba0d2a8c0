"""Dataset-level reductions of the kept variables, mergeable across units, shards and processes.

A variable is `block_path:out_var` (an input's block path is empty: `:input_ids`); a variable bound
again in the same input is another one, `block_path:out_var#2` for its second binding, and so on
(`attn_output = ...; attn_output = attn_output.transpose(1, 2)` gives two). For each one a
`ReductionState` keeps, in float64:

- per element: count, mean and M2 (sum of squared deviations) over the occurrences whose shape is
  that of the first one (an occurrence of another shape turns the per-element figures off, with a
  note);
- per channel (the last dimension): rows, mean and M2 over every other dimension;
- a fixed-bin histogram: `bins` equal bins over [low, high), and counts below, above and NaN (a
  value's bin is worked out in float32 for float32 and narrower values, in float64 for float64 and
  integers: `_binning`);
- the top-k occurrences by the l2 norm of the tensor: (l2, sample, step), largest first.

Occurrences are folded one by one in sample order within a unit (Welford's update; per channel,
each occurrence's own mean and M2 merged in) and states are merged unit by unit in unit order (Chan
et al.'s pairwise update for mean and M2), so the result depends only on the units, never on which process wrote which unit: a store written by 1, 2 or 4 processes gives
bit-equal reductions.

Depends on torch and store.shards; never on the runtime or views.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = ["ReductionState", "Reduction", "fold_together", "encode_states", "decode_states"]

_F64 = torch.float64
_STACK = 2 ** 16  # elements stacked at once when variables are folded together (512 KiB in float64: a stack
# that stays in a core's cache; a larger variable is folded alone)


def _merge(n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: int, mean_b: torch.Tensor,
           m2_b: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    n = n_a + n_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    return n, mean, m2


def _binning(data: torch.Tensor) -> torch.Tensor:
    """The values as the histogram bins them: float32 and narrower floats (and booleans) in float32, float64 and
    integers in float64 (exact to 2**53), so a float32 variable is binned without a float64 copy."""
    if data.dtype == torch.float32 or data.dtype == _F64:
        return data
    if data.is_floating_point() or data.dtype == torch.bool:
        return data.to(torch.float32)
    return data.to(_F64)


def _bin_counts(rows: torch.Tensor, bins: int, low: float, high: float, may_hold_nan: bool) -> torch.Tensor:
    """int64 [rows, bins + 3] counts of each row of `rows` (values as `_binning` gives them): index 0 below
    `low`, 1..bins the bins, bins + 1 at or above `high`, bins + 2 NaN.

    v = (x - low) * bins / (high - low), clamped to [-1, bins] and shifted by 1: then v >= 0, so truncating
    it to an integer is its floor; NaN (clamp keeps it) is set to bins + 2. One bincount counts every row,
    each row's indices offset by its row number times bins + 3."""
    width = bins + 3
    index = (rows - low).mul_(bins / (high - low)).clamp_(-1, bins).add_(1)
    if may_hold_nan:
        index = index.nan_to_num_(nan=bins + 2)
    index = index.to(torch.int32)
    count = rows.shape[0]
    if count > 1:
        index += torch.arange(0, count * width, width, dtype=torch.int32).unsqueeze(1)
    return torch.bincount(index.reshape(-1), minlength=count * width).reshape(count, width)


def fold_together(states: list["ReductionState"], batches: list[tuple[list, list, list, list]],
                  kernel: Any = None) -> None:
    """Fold each batch `(values, samples, steps, l2s)` into its state (one state per variable, all with the
    same bins and range). `kernel`: the C code of native.py (`Kernel.fold`), which gives the per-element mean
    and M2 and the histogram counts of batches of contiguous float32 or float64 values in one pass over
    them (the mean and M2 with sums in occurrence order; the counts those of torch); None, torch's reductions.

    A batch whose occurrences share one shape is folded at once: its per-element and per-channel mean
    and M2 are computed over the batch in float64 (the mean, then the squared deviations from it) and
    merged in with Chan's update; its histogram and top k are those of its occurrences. Batches of the
    same shape, length and dtype are stacked together ([variables, occurrences, ...]) up to `_STACK`
    elements, so many small variables cost the torch calls of one; a variable whose batch holds more is
    folded a few columns (elements of each occurrence) at a time, so its float64 copies stay in the
    cache (each element's mean and M2 are its own; the histogram counts add up). A batch of several shapes, or of one occurrence,
    is folded one by one (`add`). The figures equal one-by-one folding up to float64 rounding; which
    occurrences and variables go together depends only on the unit (writer.py), so a store gives
    bit-equal reductions whichever process wrote a unit."""
    groups: dict[tuple, list[int]] = {}
    for index, (state, (values, samples, steps, l2s)) in enumerate(zip(states, batches)):
        shape = tuple(values[0].shape)
        if len(values) == 1 or any(tuple(v.shape) != shape for v in values):
            for value, sample, step, l2 in zip(values, samples, steps, l2s):
                state.add(value, sample, step, l2)
            continue
        dtypes = {v.dtype for v in values}
        key = (shape, len(values), dtypes.pop() if len(dtypes) == 1 else None, state.bins, state.low, state.high)
        groups.setdefault(key, []).append(index)
    for (shape, k, dtype, _, _, _), members in groups.items():
        if kernel is not None and dtype is not None and shape and math.prod(shape) and _fold_stacked(
                [states[i] for i in members], [batches[i] for i in members], shape, k, False, kernel):
            continue  # the C code folded them all in one call (it reads each occurrence where it lies)
        # stacked a few variables at a time: at most _STACK elements (more is slower: the passes over a
        # stack that left the cache cost more than the calls they save)
        step = max(1, _STACK // max(1, k * math.prod(shape)))
        for at in range(0, len(members), step):
            chunk = members[at:at + step]
            _fold_stacked([states[i] for i in chunk], [batches[i] for i in chunk], shape, k, dtype is None)


def _fold_stacked(states: list["ReductionState"], batches: list[tuple[list, list, list, list]], shape: tuple, k: int,
                  mixed: bool, kernel: Any = None) -> bool:
    """Fold batches of one shape and length; with `kernel`, by its C code or not at all (False: the values are
    not what it reads; nothing is changed, and the caller folds them with torch)."""
    count = len(states)
    parts = []
    for values, _, _, _ in batches:
        for v in values:
            v = v.detach() if v.requires_grad else v
            if v.is_complex():
                v = v.abs()
            parts.append(v if v.is_cpu else v.to("cpu"))
    if mixed:  # occurrences of several dtypes: stacked in float64
        parts = [v.to(_F64) for v in parts]
    size = math.prod(shape)
    reference = states[0]
    stacked = None
    if kernel is not None:  # the C code's one pass: no stack, no float64 copies
        folded = kernel.fold(parts, count, k, reference.bins, reference.low, reference.high)
        if folded is None:
            return False
        mean, m2, counts = folded
        mean, m2 = mean.reshape((count,) + shape), m2.reshape((count,) + shape)
        data = None
    else:
        stacked = torch.stack(parts).reshape((count, k) + shape)
        mean, m2, counts, data = _torch_figures(stacked, count, k, shape, size, states[0], batches)
    first = [batch[1][0] for batch in batches]
    for j, state in enumerate(states):
        state.count += k
        if state.element_note:
            continue
        if state.element_shape is None:  # the rows of this fold's own new tensors, held as they are
            state.element_shape, state.element_n = shape, k
            state.element_mean, state.element_m2 = mean[j], m2[j]
        elif shape == state.element_shape:
            if kernel is not None and kernel.merge(state.element_n, state.element_mean, state.element_m2, k, mean[j],
                                                   m2[j]):
                state.element_n += k  # merged in place by the C code, as `_merge` would give them
            else:
                state.element_n, state.element_mean, state.element_m2 = _merge(
                    state.element_n, state.element_mean, state.element_m2, k, mean[j], m2[j])
        else:
            state._element_off(f"shapes differ ({list(state.element_shape)} and {list(shape)} at sample {first[j]})")
    # per channel, from the per-element figures: each position of a channel holds k values, so the
    # channel's mean is the mean of its positions' means and its M2 their M2 plus k times the squared
    # deviations of those means (Chan's merge of equal groups), computed on one occurrence's size
    if shape and math.prod(shape):
        channels = shape[-1]
        means = mean.reshape(count, -1, channels)
        channel_mean, channel_m2 = _channel_figures(means, m2.reshape(count, -1, channels), k)
        for j, state in enumerate(states):
            state._channel_merge(means.shape[1] * k, channel_mean[j].clone(), channel_m2[j].clone(), channels, first[j])
    elif not shape:
        for j, state in enumerate(states):
            state._channels(data[j].reshape(-1, 1), first[j])
    for j, (state, (values, samples, steps, l2s)) in enumerate(zip(states, batches)):
        state._add_counts(counts[j])
        norms = list(l2s)
        if any(n is None for n in norms):
            own = stacked[j] if stacked is not None else torch.stack(parts[j * k:(j + 1) * k])
            computed = torch.linalg.vector_norm(own.reshape(k, -1).to(_F64), dim=1).tolist() \
                if own.numel() else [0.0] * k
            norms = [n if n is not None else c for n, c in zip(norms, computed)]
        state._offer(list(zip(norms, samples, steps)))
    return True


_CHANNEL_CHUNK = 1 << 17  # elements (1 MiB of float64) of squared deviations worked out at once


def _channel_figures(means: torch.Tensor, m2: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each variable's per-channel mean and M2 ([count, channels]) from its per-element ones ([count, positions,
    channels], k values each): `means.mean(1)` and `m2.sum(1) + (means - mean).square().sum(1) * k`, the squared
    deviations worked out a few variables at a time (about _CHANNEL_CHUNK elements) in one buffer, not in a new
    array of all of them (fresh pages, out of the cache), each variable's sum over its positions being the one
    torch gives over the whole stack, bit for bit."""
    channel_mean = means.mean(1)
    sums = m2.sum(1)
    count, positions, channels = means.shape
    step = max(1, _CHANNEL_CHUNK // max(1, positions * channels))
    if step >= count:
        return channel_mean, sums + (means - channel_mean.unsqueeze(1)).square_().sum(1) * k
    deviations = torch.empty_like(sums)
    buffer = torch.empty((step, positions, channels), dtype=means.dtype)
    for at in range(0, count, step):
        end = min(count, at + step)
        part = buffer[:end - at]
        torch.sub(means[at:end], channel_mean[at:end].unsqueeze(1), out=part)
        torch.sum(part.square_(), 1, out=deviations[at:end])
    return channel_mean, sums + deviations * k


def _torch_figures(stacked: torch.Tensor, count: int, k: int, shape: tuple, size: int, reference: "ReductionState",
                   batches: list) -> tuple:
    """The per-element mean and M2, the histogram counts and (for scalar variables) the float64 values of
    `stacked` ([variables, occurrences, *shape]) with torch's reductions."""
    width = max(1, _STACK // (count * k))  # elements of each occurrence in float64 at a time
    data = None
    if size <= width:
        data = stacked.to(_F64)
        mean = data.mean(1)  # [variables, *shape]
        deviation = data - mean.unsqueeze(1)
        m2 = deviation.square_().sum(1)
        del deviation
    else:  # each element's figures are its own: a few columns at a time, so the float64 copies stay in cache
        data = None
        columns = stacked.reshape(count, k, size)
        mean = torch.empty((count, size), dtype=_F64)
        m2 = torch.empty((count, size), dtype=_F64)
        for at in range(0, size, width):
            part = columns[:, :, at:at + width].to(_F64)
            part_mean = part.mean(1)
            mean[:, at:at + width] = part_mean
            m2[:, at:at + width] = part.sub_(part_mean.unsqueeze(1)).square_().sum(1)
        mean, m2 = mean.reshape((count,) + shape), m2.reshape((count,) + shape)
    finite = all(l2 is not None and math.isfinite(l2) for batch in batches for l2 in batch[3])
    binned = _binning(stacked).reshape(count, -1)
    span = max(1, _STACK // count)  # values of each variable binned at a time (the counts add up exactly)
    counts = None
    for at in range(0, max(1, binned.shape[1]), span):
        part = _bin_counts(binned[:, at:at + span], reference.bins, reference.low, reference.high,
                           may_hold_nan=not finite)
        counts = part if counts is None else counts.add_(part)
    return mean, m2, counts, data


@dataclass
class ReductionState:
    """The partial reductions of one variable (see the module docstring)."""

    bins: int
    low: float
    high: float
    top_k: int
    count: int = 0  # occurrences folded
    element_shape: Optional[tuple] = None
    element_n: int = 0
    element_mean: Optional[torch.Tensor] = None
    element_m2: Optional[torch.Tensor] = None
    element_note: str = ""
    channels: Optional[int] = None
    channel_n: int = 0
    channel_mean: Optional[torch.Tensor] = None
    channel_m2: Optional[torch.Tensor] = None
    channel_note: str = ""
    histogram: Optional[torch.Tensor] = None  # int64 [bins + 3]: the bins, under, over, NaN
    top: list = field(default_factory=list)  # [(l2, sample, step)]

    def __post_init__(self) -> None:
        if self.histogram is None:
            self.histogram = torch.zeros(self.bins + 3, dtype=torch.int64)

    def add(self, value: torch.Tensor, sample: int, step: int, l2: Optional[float] = None) -> None:
        """Fold one occurrence (a tensor of any real or boolean dtype) into the state; `l2`, its norm if known."""
        data = value.detach()
        if data.is_complex():
            data = data.abs()
        data = data.to("cpu")
        binned = _binning(data)
        data = data.to(_F64)
        self.count += 1
        shape = tuple(data.shape)
        # per element: Welford's update, in place (one occurrence is a count of 1)
        if not self.element_note:
            if self.element_shape is None:
                self.element_shape, self.element_n = shape, 1
                self.element_mean, self.element_m2 = data.clone(), torch.zeros_like(data)
            elif shape == self.element_shape:
                self.element_n += 1
                delta = data - self.element_mean
                self.element_mean.add_(delta, alpha=1.0 / self.element_n)
                self.element_m2.addcmul_(delta, data - self.element_mean)
            else:
                self._element_off(f"shapes differ ({list(self.element_shape)} and {list(shape)} at sample {sample})")
        rows = data.reshape(-1, shape[-1]) if data.dim() else data.reshape(1, 1)
        self._channels(rows, sample)
        flat = data.reshape(-1)
        self._bin(binned.reshape(-1))
        # top k
        if l2 is None:
            l2 = torch.linalg.vector_norm(flat).item() if flat.numel() else 0.0
        self._offer([(l2, sample, step)])

    def add_many(self, values: list, samples: list, steps: list, l2s: list) -> None:
        """Fold occurrences in order, as a batch when they share one shape (else one by one, as `add`):
        `fold_together` of this state alone."""
        fold_together([self], [(values, samples, steps, l2s)])

    def _channel_merge(self, n: int, mean: torch.Tensor, m2: torch.Tensor, channels: int, sample: int) -> None:
        if self.channel_note:
            return
        if self.channels is None:
            self.channels, self.channel_n, self.channel_mean, self.channel_m2 = channels, n, mean, m2
        elif self.channels == channels:
            self.channel_n, self.channel_mean, self.channel_m2 = _merge(
                self.channel_n, self.channel_mean, self.channel_m2, n, mean, m2)
        else:
            self.channel_note = f"channel counts differ ({self.channels} and {channels} at sample {sample})"
            self.channels, self.channel_mean, self.channel_m2 = None, None, None

    def _channels(self, rows: torch.Tensor, sample: int) -> None:
        if not self.channel_note and rows.shape[0] > 0:
            if self.channels is None or self.channels == rows.shape[1]:
                mean = rows.mean(0)
                m2 = (rows - mean).square_().sum(0)
                if self.channels is None:
                    self.channels, self.channel_n, self.channel_mean, self.channel_m2 = rows.shape[1], rows.shape[0], \
                        mean, m2
                else:
                    self.channel_n, self.channel_mean, self.channel_m2 = _merge(
                        self.channel_n, self.channel_mean, self.channel_m2, rows.shape[0], mean, m2)
            else:
                self.channel_note = f"channel counts differ ({self.channels} and {rows.shape[1]} at sample {sample})"
                self.channels, self.channel_mean, self.channel_m2 = None, None, None

    def _bin(self, flat: torch.Tensor, may_hold_nan: bool = True) -> None:
        self._add_counts(_bin_counts(flat.reshape(1, -1), self.bins, self.low, self.high, may_hold_nan)[0])

    def _add_counts(self, counts: torch.Tensor) -> None:
        hist = self.histogram
        hist[:self.bins] += counts[1:self.bins + 1]
        hist[self.bins] += counts[0]
        hist[self.bins + 1:] += counts[self.bins + 1:]

    def _element_off(self, note: str) -> None:
        self.element_note = note
        self.element_shape, self.element_mean, self.element_m2 = None, None, None

    def _offer(self, items: list) -> None:
        merged = self.top + items
        # largest norm first (NaN last), ties by sample and step: a total order, the same for any split
        merged.sort(key=lambda t: (math.isnan(t[0]), -t[0] if not math.isnan(t[0]) else 0.0, t[1], t[2]))
        self.top = merged[:self.top_k]

    def merge(self, other: "ReductionState") -> None:
        """Fold `other` (the state of a later unit) into this one."""
        self.count += other.count
        if not self.element_note:
            if other.element_note:
                self._element_off(other.element_note)
            elif other.element_shape is not None:
                if self.element_shape is None:
                    self.element_shape, self.element_n = other.element_shape, other.element_n
                    self.element_mean, self.element_m2 = other.element_mean.clone(), other.element_m2.clone()
                elif other.element_shape == self.element_shape:
                    self.element_n, self.element_mean, self.element_m2 = _merge(
                        self.element_n, self.element_mean, self.element_m2, other.element_n, other.element_mean,
                        other.element_m2)
                else:
                    self._element_off(f"shapes differ ({list(self.element_shape)} and {list(other.element_shape)})")
        if not self.channel_note:
            if other.channel_note:
                self.channel_note, self.channels, self.channel_mean, self.channel_m2 = other.channel_note, None, None, None
            elif other.channels is not None:
                if self.channels is None:
                    self.channels, self.channel_n = other.channels, other.channel_n
                    self.channel_mean, self.channel_m2 = other.channel_mean.clone(), other.channel_m2.clone()
                elif other.channels == self.channels:
                    self.channel_n, self.channel_mean, self.channel_m2 = _merge(
                        self.channel_n, self.channel_mean, self.channel_m2, other.channel_n, other.channel_mean,
                        other.channel_m2)
                else:
                    self.channel_note = f"channel counts differ ({self.channels} and {other.channels})"
                    self.channels, self.channel_mean, self.channel_m2 = None, None, None
        self.histogram = self.histogram + other.histogram
        self._offer(list(other.top))


@dataclass(frozen=True)
class Reduction:
    """The merged reductions of one variable over a whole store.

    `mean` and `var` are per element (None, with `note`, when the variable's shape varies); `var`
    and `channel_var` are unbiased (n - 1, as torch.var). `histogram` holds `bins` counts over
    `edges`; `underflow`, `overflow` and `nan` count the rest. `top` lists (sample, step, l2) of the
    largest l2 norms.
    """

    variable: str
    count: int
    mean: Optional[torch.Tensor]
    var: Optional[torch.Tensor]
    channel_mean: Optional[torch.Tensor]
    channel_var: Optional[torch.Tensor]
    edges: torch.Tensor
    histogram: torch.Tensor
    underflow: int
    overflow: int
    nan: int
    top: list
    note: str = ""

    @staticmethod
    def of(variable: str, state: ReductionState) -> "Reduction":
        def var(n: int, m2: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            if m2 is None:
                return None
            return m2 / (n - 1) if n > 1 else torch.full_like(m2, math.nan)

        bins = state.bins
        note = "; ".join(n for n in (state.element_note, state.channel_note) if n)
        return Reduction(variable, state.count, state.element_mean, var(state.element_n, state.element_m2),
                         state.channel_mean, var(state.channel_n, state.channel_m2),
                         torch.linspace(state.low, state.high, bins + 1, dtype=_F64), state.histogram[:bins].clone(),
                         int(state.histogram[bins]), int(state.histogram[bins + 1]), int(state.histogram[bins + 2]),
                         [(s, st, l2) for l2, s, st in state.top], note)


def encode_states(states: dict[str, ReductionState]) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors (keyed `<index>.<field>`) and a JSON-able description of `states`, in name order."""
    tensors: dict[str, torch.Tensor] = {}
    items = []
    for index, name in enumerate(sorted(states)):
        state = states[name]
        for key in ("element_mean", "element_m2", "channel_mean", "channel_m2", "histogram"):
            value = getattr(state, key)
            if value is not None:  # a state's per-element figures may be a row of a fold's tensor: written as a view
                # (write_shard reads its bytes); safetensors' own encoder (big-endian machines) wants tensors apart
                tensors[f"{index}.{key}"] = value.contiguous() if sys.byteorder == "little" else value.clone()
        items.append({"variable": name, "count": state.count,
                      "element_shape": list(state.element_shape) if state.element_shape is not None else None,
                      "element_n": state.element_n, "element_note": state.element_note,
                      "channels": state.channels, "channel_n": state.channel_n, "channel_note": state.channel_note,
                      "top": [[l2.hex(), s, st] for l2, s, st in state.top]})
    return tensors, {"bins": None, "items": items}


def decode_states(items: Any, tensors: Any, bins: int, low: float, high: float, top_k: int,
                  source: str) -> dict[str, ReductionState]:
    """The states of a reductions file (its JSON items and a `tensor(key)` reader), checked."""
    from ..files.file_format import MalformedFileError, get_int, get_list, get_str, is_array, record

    states: dict[str, ReductionState] = {}
    keys = set(tensors.keys())
    used = set()
    for index, item in enumerate(items):
        where = f"{source}: items[{index}]"
        record(item, where, ("variable", "count", "element_shape", "element_n", "element_note", "channels",
                             "channel_n", "channel_note", "top"))
        name = get_str(item, "variable", where, max_chars=4096)
        if name in states:
            raise MalformedFileError(f"{where}: variable {name!r} twice")
        state = ReductionState(bins, low, high, top_k, count=get_int(item, "count", where))
        shape = item["element_shape"]
        if shape is not None and (not is_array(shape) or any(type(d) is not int or d < 0 for d in shape)):
            raise MalformedFileError(f"{where}.element_shape: expected an array of dimensions or null")
        state.element_shape = tuple(shape) if shape is not None else None
        # a reduction that holds a mean has seen an occurrence: a count of 0 would divide by zero in the merge
        state.element_n = get_int(item, "element_n", where, low=0 if shape is None else 1)
        state.element_note = get_str(item, "element_note", where, max_chars=4096)
        channels = item["channels"]
        if channels is not None and (type(channels) is not int or channels <= 0):
            raise MalformedFileError(f"{where}.channels: expected a positive integer or null")
        state.channels = channels
        state.channel_n = get_int(item, "channel_n", where, low=0 if channels is None else 1)
        state.channel_note = get_str(item, "channel_note", where, max_chars=4096)

        def take(key: str, dtype: torch.dtype, shape: Optional[tuple]) -> Optional[torch.Tensor]:
            full = f"{index}.{key}"
            if shape is None:
                if full in keys:
                    raise MalformedFileError(f"{where}: tensor {full!r} given for an absent reduction")
                return None
            if full not in keys:
                raise MalformedFileError(f"{where}: tensor {full!r} is missing")
            value = tensors.tensor(full)
            if value.dtype != dtype or tuple(value.shape) != tuple(shape):
                raise MalformedFileError(f"{where}: tensor {full!r} is {value.dtype}{list(value.shape)}, expected "
                                         f"{dtype}{list(shape)}")
            used.add(full)
            return value

        state.element_mean = take("element_mean", _F64, state.element_shape)
        state.element_m2 = take("element_m2", _F64, state.element_shape)
        channel_shape = (channels,) if channels is not None else None
        state.channel_mean = take("channel_mean", _F64, channel_shape)
        state.channel_m2 = take("channel_m2", _F64, channel_shape)
        state.histogram = take("histogram", torch.int64, (bins + 3,))
        top = []
        for position, entry in enumerate(get_list(item, "top", where)):
            if (not is_array(entry) or len(entry) != 3 or type(entry[0]) is not str or type(entry[1]) is not int
                    or type(entry[2]) is not int):
                raise MalformedFileError(f"{where}.top[{position}]: expected [l2 as hex, sample, step]")
            try:
                top.append((float.fromhex(entry[0]), entry[1], entry[2]))
            except (ValueError, OverflowError):
                raise MalformedFileError(f"{where}.top[{position}]: {entry[0]!r} is not a float in hex") from None
        if len(top) > top_k:
            raise MalformedFileError(f"{where}.top: {len(top)} entries, the store keeps {top_k}")
        state.top = top
        states[name] = state
    if keys - used:
        raise MalformedFileError(f"{source}: tensor {sorted(keys - used)[0]!r} belongs to no variable")
    return states
