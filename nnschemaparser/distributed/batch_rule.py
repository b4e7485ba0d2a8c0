"""The batch-rows rule: a placement for an op DTensor cannot run, on a data-parallel batch shard.

Under FSDP2 each rank runs its own rows of the batch (`Shard(0)` over the data-parallel mesh dims).
Some ops take such a batch shard but have no DTensor rule, or cannot take DTensors at all:
transformers' `create_causal_mask` with eager attention reads `inputs_embeds.shape[0]` and builds a
[batch, 1, q, kv] float mask with vmap and Python ints; run again on DTensors (the recorder's rule
3) it raises, and the root's `causal_mask` was left unknown, so it could not be gathered.

Such an op's result is the rank's rows of the whole batch's result when the op treats rows
independently. This rule does not assume it: it runs the op once more on the rank's operands with
the rows changed, and keeps `Shard(0)` only when the result follows the rows:

- with two rows or more, on the first row alone and on the others: the two results, concatenated,
  must be `torch.equal` to what the rank computed;
- with one row, on the row twice: the result must be the rank's result twice.

An op that mixes rows (a mean over the batch, a batch-wide normalisation) changes with the rows it
is given and fails the check. The rule applies only on the mesh dims whose ranks hold different
batches (`batch_dims`), only to results whose first dim has the rank's number of rows, and only
when every other operand is replicated there. Like rule 3, the extra runs leave the run's world as
it was (copies of the operands, the RNG state put back, a method of an object run on a deep copy).

Depends on torch and `placement`.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from .placement import DimPlacement, Layout, local_of

__all__ = ["batch_rows_dims"]


def _swap(item: Any, replaced: dict) -> Any:
    if isinstance(item, torch.Tensor):
        return replaced.get(id(item), item)
    if isinstance(item, tuple):
        return tuple(_swap(c, replaced) for c in item)
    if isinstance(item, list):
        return [_swap(c, replaced) for c in item]
    if isinstance(item, dict):
        return {k: _swap(c, replaced) for k, c in item.items()}
    return item


def _call(call: Any, receiver: Optional[torch.Tensor], name: str, args: list, kwargs: dict, replaced: dict) -> Any:
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        if receiver is not None:
            return getattr(_swap(receiver, replaced), name)(*_swap(args, replaced), **_swap(kwargs, replaced))
        return call(*_swap(args, replaced), **_swap(kwargs, replaced))


def _same(result: Any, expected: torch.Tensor) -> bool:
    return (isinstance(result, torch.Tensor) and result.shape == expected.shape and result.dtype == expected.dtype
            and torch.equal(local_of(result), expected))


def batch_rows_dims(target: Any, receiver: Optional[torch.Tensor], args: list, kwargs: dict,
                    operands: list[tuple[torch.Tensor, Layout]], value: torch.Tensor, missing: list[int],
                    batch_dims: tuple[int, ...], callable_copy: Any, tensor_copy: Any) -> Optional[tuple]:
    """For each of `missing` (mesh dims): `Shard(0)` where the check holds on a batch dim, None
    elsewhere; None when the rule does not apply. `callable_copy()` gives the callable to run (a
    method of a copy of its object, as rule 3 runs it) or None when it cannot be copied;
    `tensor_copy` copies an operand with its strides (an in-place op then writes the copy)."""
    dims = [i for i in missing if i in batch_dims]
    if not dims or value.ndim == 0 or not isinstance(value, torch.Tensor):
        return None
    rows = None
    sharded = []
    for tensor, layout in operands:
        kinds = [layout.dims[i] for i in dims]
        if all(k.kind == "replicate" for k in kinds):
            continue
        if not all(k.kind == "shard" and k.tensor_dim == 0 for k in kinds):
            return None  # an operand placed another way on a batch dim: not a batch of rows
        local = local_of(tensor)
        if local.ndim == 0 or (rows is not None and local.shape[0] != rows):
            return None
        rows = local.shape[0]
        sharded.append((tensor, local))
    mine = local_of(value).detach()
    if rows is None or rows == 0 or mine.shape[0] != rows:
        return None
    call = callable_copy()
    if call is None:
        return None
    name = getattr(target, "__name__", "")

    def rows_as(make: Any) -> dict:
        replaced = {id(t): tensor_copy(local_of(t)) for t, _ in operands}
        replaced.update({id(t): make(x) for t, x in sharded})
        return replaced

    try:
        if rows >= 2:
            first = _call(call, receiver, name, args, kwargs, rows_as(lambda x: x[:1].clone()))
            call = callable_copy()
            rest = _call(call, receiver, name, args, kwargs, rows_as(lambda x: x[1:].clone()))
            holds = _same(first, mine[:1]) and _same(rest, mine[1:])
        else:
            twice = _call(call, receiver, name, args, kwargs, rows_as(lambda x: torch.cat([x, x])))
            holds = _same(twice, torch.cat([mine, mine]))
    except Exception:  # the op refuses other rows: the rule says nothing
        return None
    if not holds:
        return None
    return tuple(DimPlacement("shard", 0) if i in dims else None for i in missing)


def copy_callable(target: Any, owner: Any, mutable: bool) -> Any:
    """`target`, or the same method of a deep copy of its object when the object may change."""
    if not mutable:
        return target
    try:
        return getattr(copy.deepcopy(owner), target.__name__)
    except Exception:
        return None
