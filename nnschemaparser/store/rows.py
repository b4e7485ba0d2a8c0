"""Rows of a batched input: how many a batch holds, each row's values, and the padding mask.

A batched input (a DataLoader batch, a tokenizer's padded batch) is run once, as it is, and then split:
each row is a sample of the store, with its own statistics, kept tensors, reductions and top-k.

- The batch size is read from the root's tensor inputs of more than `batch_axis + 1` dimensions (an
  `input_ids` of [batch, positions], an `x` of [batch, features]): their size along `batch_axis`, which
  must agree (a size of 1 is a broadcast input, as a `position_ids` of [1, positions]). An input with
  no such tensor is one sample.
- A value of the run is split when it has the batch size along `batch_axis`: row r is its slice
  `r:r+1` there (a view, the batch axis kept with size 1, as a run of that row alone has it). Any other
  value (a weight, a causal mask of [1, 1, T, T], a scalar) is shared: every row's steps hold it whole.
  A value that has the batch size along that axis by chance (a [batch] vector of something else) is
  split too: pass `batch_axis=None` to keep inputs whole.
- Sample ids are a running count of rows over the inputs in order: the first input's rows are 0..B-1,
  the next input's follow, so ids stay dense when the last batch is shorter or sizes vary. The store's
  manifest records `batch_axis` and this numbering; a resume must give the same inputs in the same
  order (as for inputs as samples).

The mask (`mask=` an input's name, or a callable of the input's scope) is [batch, positions]; a zero is
padding. For each row, a value whose axes `batch_axis` and `batch_axis + 1` (0 and 1 without
`batch_axis`) have the mask's sizes is masked: its figures (the step's statistics, numel included), its
reductions and its top-k norm are those of its unmasked positions, as a [n_positions, *rest] tensor.
Other values (an attention's [batch, heads, T, T] weights, the root's inputs) are counted whole. The
kept tensor is the row as the model computed it, padding included; the row's mask is kept beside it
(`MASK_KEY`), which `TraceStore.tokens` reads.

Depends on torch only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

__all__ = ["Batching", "MASK_KEY", "mask_text"]

MASK_KEY = "@mask"  # a row's mask in the shards: "<sample>/@mask", bool [1, positions]

MaskSpec = Union[None, str, Callable[[dict], Any]]


def mask_text(mask: MaskSpec) -> Optional[str]:
    """The text a store's options record of `mask` (a resume compares it)."""
    if mask is None or isinstance(mask, str):
        return mask
    return f"callable {getattr(mask, '__module__', '?')}.{getattr(mask, '__qualname__', type(mask).__name__)}"


class Batching:
    """How a store splits its inputs: `axis` (None: an input is one sample) and the `mask` (see the module
    docstring)."""

    def __init__(self, axis: Optional[int], mask: MaskSpec = None):
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int) or axis < 0):
            raise ValueError(f"batch_axis must be None (each input one sample) or a non-negative axis, got {axis!r}")
        if mask is not None and not isinstance(mask, str) and not callable(mask):
            raise TypeError(f"mask must be None, the name of an input whose zeros are padding (mask="
                            f"'attention_mask') or a callable of the input's scope; got {type(mask).__name__}")
        self.axis, self.mask = axis, mask

    @property
    def trivial(self) -> bool:
        return self.axis is None and self.mask is None

    def rows(self, scope: dict) -> int:
        """The rows of an input (1 without an axis, or when no input carries one)."""
        axis = self.axis
        if axis is None:
            return 1
        sizes = {name: int(value.shape[axis]) for name, value in scope.items()
                 if isinstance(value, torch.Tensor) and value.dim() > axis + 1}
        distinct = set(sizes.values()) - {1}
        if len(distinct) > 1:
            listed = ", ".join(f"{name} {size}" for name, size in sizes.items())
            raise ValueError(f"the inputs disagree on the batch size along batch_axis={axis} ({listed}); give inputs "
                             "of one batch size (or 1, broadcast), another batch_axis, or batch_axis=None to keep "
                             "each input whole")
        return distinct.pop() if distinct else 1

    def mask_of(self, scope: dict, rows: int) -> Optional[torch.Tensor]:
        """The input's mask as bool [rows, positions] on the CPU (None without one)."""
        mask = self.mask
        if mask is None:
            return None
        if isinstance(mask, str):
            if mask not in scope:
                raise ValueError(f"mask={mask!r} names no input of this batch (its inputs: {', '.join(scope)}); name "
                                 "the input whose zeros are padding (mask='attention_mask'), or pass a callable")
            value = scope[mask]
        else:
            value = mask(scope)
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            what = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"the mask ({mask_text(mask)}) is {what}; a mask is [batch, positions], zeros for padding")
        if self.axis is not None and value.shape[0] != rows:
            raise ValueError(f"the mask ({mask_text(mask)}) has {value.shape[0]} rows, the batch {rows}")
        return value.detach().to("cpu") != 0

    def check_outputs(self, outputs: Any, rows: int, scope: dict) -> None:
        """Refuse a split no output of the run bears out: when no output tensor has `rows` along the batch axis,
        the inputs' axis was not a batch (an unbatched [C, H, W] image read as C rows, say)."""
        axis = self.axis
        found, stack = [], [outputs]
        while stack and len(found) < 10000:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
        if found and not any(t.dim() > axis and t.shape[axis] == rows for t in found):
            shapes = ", ".join(f"{name} {list(v.shape)}" for name, v in scope.items() if isinstance(v, torch.Tensor))
            raise ValueError(f"an input ({shapes}) was read as {rows} rows along batch_axis={axis}, but no output of "
                             f"the model has {rows} along that axis (outputs {[list(t.shape) for t in found[:4]]}): "
                             "its inputs are not batched there. Pass batch_axis=None (each input one sample) or the "
                             "axis the batch lies on")

    def split(self, values: list, rows: int) -> list:
        """For each value, its `rows` row views (None: shared by every row). A value held by several steps is
        split once, so each row's values repeat the same objects as the batch's did."""
        axis = self.axis
        done: dict[int, Any] = {}
        out: list = []
        for value in values:
            parts = None
            if isinstance(value, torch.Tensor) and value.dim() > axis and value.shape[axis] == rows:
                key = id(value)
                parts = done.get(key)
                if parts is None:
                    try:
                        parts = done[key] = value.split(1, dim=axis)
                    except (RuntimeError, NotImplementedError):  # a layout torch cannot slice: shared
                        parts = done[key] = None
            out.append(parts)
        return out

    def masked(self, value: Any, mask: torch.Tensor) -> Any:
        """`value`'s unmasked positions as [n, *rest] when its axes (batch_axis, batch_axis + 1) have the mask's
        sizes; `value` itself otherwise. A row whose unmasked positions are one run (right or left padding)
        gives a view of them (`narrow`), any other mask a copy."""
        axis = self.axis or 0
        if (not isinstance(value, torch.Tensor) or value.dim() < axis + 2 or value.shape[axis] != mask.shape[0]
                or value.shape[axis + 1] != mask.shape[1] or value.layout != torch.strided):
            return value
        if axis:
            value = value.movedim((axis, axis + 1), (0, 1))
        run = self._run(mask)
        if run is not None:
            return value[0].narrow(0, run[0], run[1])
        return value[mask.to(value.device)]

    def _run(self, mask: torch.Tensor) -> Optional[tuple[int, int]]:
        """(start, length) of a one-row mask's unmasked positions when they are one run; None otherwise (several
        rows, or holes). Kept for the mask last asked about (every value of a row asks with the same one)."""
        last = getattr(self, "_last", None)
        if last is not None and last[0] is mask:
            return last[1]
        run = None
        if mask.shape[0] == 1:
            where = mask[0].nonzero().flatten()
            if len(where) and int(where[-1]) - int(where[0]) + 1 == len(where):
                run = (int(where[0]), len(where))
            elif not len(where):
                run = (0, 0)
        self._last = (mask, run)
        return run

    def run_of(self, mask: torch.Tensor) -> Optional[tuple[int, int]]:
        """(start, length) of the one run of unmasked positions of a one-row mask, when `masked` takes a value
        of batch axis 0 (or None) to `value[0].narrow(0, start, length)`; None otherwise."""
        return self._run(mask) if not self.axis else None

    def key(self, mask: Optional[torch.Tensor]) -> Any:
        """What tells apart the rows whose values the store's summariser can plan alike: the count of unmasked
        positions (`statistics.Summariser` keeps a plan per key)."""
        return None if mask is None else int(mask.sum())
