"""Where `diverge` keeps the values its runs hand on: in memory up to a budget, on disk past it.

The keep run holds each row's value `A` until the force run (and, when it is made, the replay) has
used it, and the force run holds `L` until the replay; for a large model that is one tensor per row
of the whole model. `RowValues` is such a table (row key -> tensor): a value goes to memory while
the values held, counted once per storage (a row bound to a tensor an earlier row holds costs
nothing), stay within `Spill.budget` bytes, else it is written to `Spill`'s temporary folder and
read back when a later run asks for it, with its shape, strides, dtype and device, so the run
forced with it computes what it would have from memory. A value taken out (`pop`) frees its
memory or deletes its file. `budget=None` holds everything in memory.

Writing costs a copy to disk and reading one back: a few hundred MB/s on a laptop's SSD, so the
budget is spent first and only what is past it is slowed down (bench/bench_diverge.py --memory).

Depends on torch only; never on views.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

__all__ = ["Spill", "RowValues", "DEFAULT_BUDGET"]

#: The default budget of held values (bytes): past it, rows go to disk.
DEFAULT_BUDGET = 2 * 1024 ** 3


class Spill:
    """The budget (bytes, None: no limit) shared by a comparison's tables, and the folder past it.

    `held` is the bytes held in memory now (each storage once), `peak` the most held at once,
    `written` the bytes written to disk and `files` how many values went there."""

    def __init__(self, budget: Optional[int] = DEFAULT_BUDGET):
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
            raise ValueError(f"memory_budget must be a number of bytes (an int >= 0) or None for no limit, got "
                             f"{budget!r}")
        self.budget = budget
        self.held = self.peak = self.written = self.files = 0
        self._storages: dict[int, list] = {}  # storage pointer -> [bytes, how many held values use it]
        self._folder: Optional[Path] = None
        self._count = 0

    def admit(self, value: torch.Tensor) -> bool:
        """Count `value` as held in memory if the budget allows (True), else False (it goes to disk)."""
        ptr, size = _storage(value)
        entry = self._storages.get(ptr)
        if entry is not None:
            entry[1] += 1
            return True
        if self.budget is not None and self.held + size > self.budget and _writable(value):
            return False
        self._storages[ptr] = [size, 1]
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def release(self, value: torch.Tensor) -> None:
        ptr = _storage(value)[0]
        entry = self._storages.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.held -= entry[0]
            del self._storages[ptr]

    def write(self, value: torch.Tensor) -> tuple:
        """`value`'s bytes to a new file; what `read` needs to make it again."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="nnsp_diverge_rows_"))
        self._count += 1
        path = self._folder / f"{self._count}.bin"
        flat = value.detach().contiguous().cpu().reshape(-1)
        flat.view(torch.uint8).numpy().tofile(path)
        nbytes = flat.numel() * flat.element_size()
        self.written += nbytes
        self.files += 1
        return (path, nbytes, value.dtype, tuple(value.shape), value.stride(), value.device)

    @staticmethod
    def read(record: tuple) -> torch.Tensor:
        path, nbytes, dtype, shape, stride, device = record
        flat = torch.from_file(str(path), shared=False, size=nbytes, dtype=torch.uint8).view(dtype).reshape(shape)
        if flat.stride() == tuple(stride) and flat.device == device:
            return flat
        out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        out.copy_(flat)  # the strides the value had: a run forced with it computes the same bits
        return out

    def close(self) -> None:
        """Delete the folder (and every file left in it)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class RowValues(MutableMapping):
    """A table of kept values (see the module docstring), a mapping like the dict it replaces."""

    def __init__(self, spill: Spill):
        self.spill = spill
        self._memory: dict = {}
        self._disk: dict = {}

    def in_memory(self, key: Any) -> bool:
        return key in self._memory

    def __setitem__(self, key: Any, value: torch.Tensor) -> None:
        self._drop(key)
        if self.spill.admit(value):
            self._memory[key] = value
        else:
            self._disk[key] = self.spill.write(value)

    def __getitem__(self, key: Any) -> torch.Tensor:
        value = self._memory.get(key)
        if value is not None:
            return value
        return Spill.read(self._disk[key])

    def __delitem__(self, key: Any) -> None:
        if key not in self._memory and key not in self._disk:
            raise KeyError(key)
        self._drop(key)

    def pop(self, key: Any, *default: Any) -> Any:  # one read of a value on disk, then its file goes
        if key in self._memory:
            value = self._memory.pop(key)
            self.spill.release(value)
            return value
        if key in self._disk:
            record = self._disk.pop(key)
            value = Spill.read(record)
            record[0].unlink(missing_ok=True)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def _drop(self, key: Any) -> None:
        old = self._memory.pop(key, None)
        if old is not None:
            self.spill.release(old)
        record = self._disk.pop(key, None)
        if record is not None:
            record[0].unlink(missing_ok=True)

    def __contains__(self, key: object) -> bool:
        return key in self._memory or key in self._disk

    def __iter__(self) -> Iterator:
        yield from list(self._memory)
        yield from list(self._disk)

    def __len__(self) -> int:
        return len(self._memory) + len(self._disk)


def _storage(value: torch.Tensor) -> tuple[int, int]:
    try:
        storage = value.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # no plain storage (a subclass): counted by itself
        return id(value), value.numel() * value.element_size()


def _writable(value: torch.Tensor) -> bool:
    """Whether `value` can go to disk and come back with the same strides: a plain dense tensor."""
    if type(value) is not torch.Tensor or value.layout != torch.strided or value.numel() == 0:
        return False
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(value.shape, value.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True
