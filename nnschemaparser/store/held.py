"""Kept values the store's writer holds as the run made them, instead of cloning them (writer.py's `_Unit`).

`holdable(tensor)`: a plain dense CPU tensor of at least `HOLD_BYTES` (64 KiB), contiguous, neither
conjugated nor negated, that is the whole of its storage, may be held. `shared_clones(held, others)`,
once the input's run and record are gone, clones every held tensor that anything but the writer can still reach, so that no later
run (a module that kept it) or input (a buffer the caller fills again) can write into what a shard
will hold: a storage with more references than the writer's tensors on it (and the bases of its
views) make, or a tensor object with more references than the writer's own, is someone else's too,
and every held tensor on it is cloned. Reference counts only ever make it clone more.

Not seen: a weak reference. Code that kept a value only through a `weakref` and wrote into it during
a later input would change what the shard holds (no model known to us does; a strong reference, a
module attribute or a cache entry, is seen).

Depends on torch only.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Callable, Iterable, Optional

import torch

__all__ = ["holdable", "shared_clones", "HOLD_BYTES"]

# bytes: a smaller value is cloned at once (a clone of a few KiB costs less than the reference checks of holding it)
HOLD_BYTES = 64 * 1024


def _storage_use_count() -> Optional[Callable[[Any], int]]:
    if sys.version_info >= (3, 14) or not getattr(sys, "_is_gil_enabled", lambda: True)():
        # the reference counts `shared_clones` expects are CPython 3.9-3.13's with the GIL (3.14 may borrow a
        # local's reference): elsewhere nothing is held, every kept value is cloned as before
        return None
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else (lambda storage: count(storage._cdata))


# how many references a storage has (its tensors, and Python storage objects): None where torch does not say,
# and nothing is held (every kept value is cloned)
_use_count = _storage_use_count()


def holdable(tensor: torch.Tensor, nbytes: int) -> bool:
    """Whether the writer may hold `tensor` (of `nbytes`) itself: a plain dense CPU tensor of at least `HOLD_BYTES`,
    contiguous, neither conjugated nor negated, that is the whole of its storage (a view of part of one would
    hold the rest alive)."""
    if nbytes < HOLD_BYTES or type(tensor) is not torch.Tensor or tensor.device.type != "cpu":
        return False
    if tensor.layout != torch.strided:
        return False
    if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg() or _use_count is None:
        return False
    try:
        return tensor.untyped_storage().nbytes() == nbytes
    except (RuntimeError, NotImplementedError):  # a storage without data (meta, fake, a wrapper subclass)
        return False


def shared_clones(unsettled: list, others: Iterable[torch.Tensor]) -> dict[int, torch.Tensor]:
    """{id(tensor): its clone} for each tensor of `unsettled` (the held ones, each listed once or more) that
    someone else can reach; `others` lists the holder's other references to them (each occurrence one)."""
    clones: dict[int, torch.Tensor] = {}
    held = {id(tensor): tensor for tensor in unsettled}
    # the bases of held views: a view keeps its base's tensor alive (and owns its Python object: one
    # reference however many views), so a base is the holder's too when nothing else refers to it
    bases: dict[int, torch.Tensor] = {}
    for tensor in held.values():
        base = tensor._base
        if base is not None:
            bases[id(base)] = base
    base = None
    mine: dict[int, int] = {}  # storage -> the tensors on it that are the holder's (held, or their bases)
    foreign: set[int] = set()  # storages someone else refers to (through a base of a held view)
    for key in itertools.chain(held, (k for k in bases if k not in held)):
        tensor = held.get(key)
        if tensor is None:
            tensor = bases[key]
            # its references: the views' one, `bases`, `tensor` and the call's argument
            if sys.getrefcount(tensor) != 4:
                foreign.add(tensor.untyped_storage().data_ptr())
        ptr = tensor.untyped_storage().data_ptr()
        mine[ptr] = mine.get(ptr, 0) + 1
    # the holder's own references to each tensor object
    refs: dict[int, int] = {}
    for tensor in itertools.chain(unsettled, others):
        refs[id(tensor)] = refs.get(id(tensor), 0) + 1
    for key in list(held):
        tensor = held[key]
        storage = tensor.untyped_storage()
        # anyone else's reference: to the storage (another tensor on it; `storage` is one reference), or to
        # the tensor object (the caller's input, a module's attribute; `held`, `tensor` and the call's
        # argument are three, and a base of held views has `bases` and the views' one)
        if (_use_count(storage) != mine[storage.data_ptr()] + 1
                or sys.getrefcount(tensor) != refs.get(key, 0) + (5 if key in bases else 3)):
            foreign.add(storage.data_ptr())
    for key in list(held):  # every tensor on a storage someone else can reach is cloned
        tensor = held[key]
        if tensor.untyped_storage().data_ptr() in foreign:
            clones[key] = tensor.clone()
    del tensor, storage, bases
    return clones
