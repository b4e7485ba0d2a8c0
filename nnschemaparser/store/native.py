"""The store's statistics kernel: `_statistics.c`, built with the system C compiler on first use.

torch reads a tensor once for each figure (sum, min and max, magnitudes, their sum, their least, the
norm, and the counts): about seven passes over every value of every input. The C kernel reads each
tensor once and gives all nine raw figures, with float64 sums in an order its source fixes (so the
figures do not depend on how a machine vectorises it). It reads views where they lie and float16 and
bfloat16 tensors as they are (widened exactly, a few thousand elements at a time): no copy of a tensor
is made for it. `statistics.Summariser` uses it when it is
there and torch's reductions when it is not; the engine a unit was written with is in its commit
("statistics": `ENGINE` or "torch"), as the two round the last bits differently.

How it is found: runtime/native_build.py builds the library once per (source, compiler, flags, CPU)
into `$NNSCHEMAPARSER_CACHE` (default `$XDG_CACHE_HOME/nnschemaparser` or `~/.cache/nnschemaparser`),
under `native/`, written to a temporary name and renamed (processes that build it at once do not
clash). No compiler, a build that fails, or `NNSCHEMAPARSER_NATIVE=0` (read whenever a Summariser is
made) leaves torch's reductions; `problem()` says why the kernel is not in use.

Depends on ctypes, numpy and torch only.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ..runtime import native_build

__all__ = ["ENGINE", "KINDS", "kernel", "problem", "switched_off", "Kernel"]

ENGINE = "native-2"  # the figures of _statistics.c, version 2 (nsp_statistics_version): the statistics as
# version 1's ("native-1", which older stores record), and the reductions folded by the C code too
_VERSION = 2
_SOURCE = Path(__file__).with_name("_statistics.c")

# what the float32 kernel reads at an address (`kinds`): float32, or a narrower float it widens exactly
KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_DTYPE_OF = torch.Tensor.dtype.__get__
_CPU_OF = torch.Tensor.is_cpu.__get__
_LAYOUT_OF = torch.Tensor.layout.__get__


class Kernel:
    """The loaded library: `figures(tensors)` gives float64 [len(tensors), 9] (sum, min, max, magnitude sum,
    least magnitude, sum of squares, NaN count, inf count, zero count) of strided CPU float32 (or float16 and
    bfloat16: their float32 copies' figures) or float64 tensors (a view is read as its contiguous copy:
    gathered in the C code); min, max and the least magnitude skip NaN."""

    MAX_DIMS = 64  # a view of more dimensions is copied by the caller (the C code's index has 64 places)

    def __init__(self, library: ctypes.CDLL, path: Path):
        self.path = path
        self._calls = {}
        for dtype, name in ((torch.float32, "nsp_summary_f32"), (torch.float64, "nsp_summary_f64")):
            call = getattr(library, name)
            call.restype = ctypes.c_int64
            call.argtypes = (ctypes.c_int64,) + (ctypes.c_void_p,) * 7
            self._calls[dtype] = call
        self._folds = {}
        for dtype, name in ((torch.float32, "nsp_fold_f32"), (torch.float64, "nsp_fold_f64")):
            call = getattr(library, name)
            call.restype = ctypes.c_int64
            call.argtypes = (ctypes.c_int64,) * 3 + (ctypes.c_void_p,) * 3 + (ctypes.c_int64, ctypes.c_double,
                                                                              ctypes.c_double, ctypes.c_void_p)
            self._folds[dtype] = call
        self._merge = library.nsp_merge
        self._merge.restype = ctypes.c_int64
        self._merge.argtypes = (ctypes.c_int64,) + (ctypes.c_void_p,) * 4 + (ctypes.c_double, ctypes.c_double)

    def fold(self, values: Sequence[torch.Tensor], count: int, k: int, bins: int, low: float,
             high: float) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The per-element mean and M2 (float64 [count, size]) and the histogram counts (int64 [count, bins + 3]:
        under, the bins, over, NaN) of `count` variables of `k` occurrences each (`values`, variable by variable,
        all of one shape and dtype): see `nsp_fold` in _statistics.c. None where the values are not all
        contiguous CPU float32 (or all float64) tensors of one size, or k < 1: the caller folds them with torch."""
        if k < 1 or count < 1 or len(values) != count * k:
            return None
        dtype = values[0].dtype
        call = self._folds.get(dtype)
        size = values[0].numel()
        if call is None or size == 0 or not (high > low) or bins < 1:
            return None
        for v in values:
            if (v.dtype != dtype or not v.is_cpu or v.layout != torch.strided or v.numel() != size
                    or not v.is_contiguous()):
                return None
        ptrs = np.fromiter(map(torch.Tensor.data_ptr, values), np.int64, len(values))
        mean = torch.empty((count, size), dtype=torch.float64)
        m2 = torch.empty((count, size), dtype=torch.float64)
        counts = torch.zeros((count, bins + 3), dtype=torch.int64)
        if call(count, k, size, ptrs.ctypes.data, mean.data_ptr(), m2.data_ptr(), bins, float(low), float(high),
                counts.data_ptr()) != 0:
            raise MemoryError("store reductions kernel: no memory for the histograms")
        return mean, m2, counts

    def merge(self, n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: int, mean_b: torch.Tensor,
              m2_b: torch.Tensor) -> bool:
        """Chan's merge of (n_b, mean_b, m2_b) into (n_a, mean_a, m2_a), in place: the figures reductions.py's
        `_merge` gives, bit for bit (`nsp_merge` in _statistics.c). False, and nothing changed, where the four
        are not contiguous CPU float64 tensors of one size with mean_a and m2_a apart from the others."""
        size = mean_a.numel()
        four = (mean_a, m2_a, mean_b, m2_b)
        for t in four:
            if t.dtype != torch.float64 or not t.is_cpu or t.layout != torch.strided or t.numel() != size \
                    or not t.is_contiguous():
                return False
        if n_a < 1 or n_b < 1 or size == 0:
            return False
        spans = [(t.data_ptr(), t.data_ptr() + 8 * size) for t in four]
        for i in (0, 1):  # what is written overlaps nothing else (torch's ops would read it before writing)
            for j, (start, end) in enumerate(spans):
                if i != j and spans[i][0] < end and start < spans[i][1]:
                    return False
        n = n_a + n_b
        self._merge(size, mean_a.data_ptr(), m2_a.data_ptr(), mean_b.data_ptr(), m2_b.data_ptr(), n_b / n,
                    n_a * n_b / n)
        return True

    def figures(self, tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> np.ndarray:
        """The raw figures of `tensors`, all of `dtype` (float32 or float64; float32 takes float16 and bfloat16
        tensors too), CPU and strided (checked here); the caller keeps them alive for the call."""
        allowed = set(KINDS) if dtype == torch.float32 else {dtype}
        if (set(map(_DTYPE_OF, tensors)) - allowed or not all(map(_CPU_OF, tensors))
                or set(map(_LAYOUT_OF, tensors)) - {torch.strided}):
            raise ValueError(f"store statistics kernel: expected strided CPU {dtype} tensors")
        tensors = [t if t.dim() <= self.MAX_DIMS else t.contiguous() for t in tensors]
        views = [t for t in tensors if not t.is_contiguous()]
        ndims = np.fromiter((0 if t.is_contiguous() else t.dim() for t in tensors), np.int64, len(tensors))
        kinds = np.fromiter((KINDS[t.dtype] for t in tensors), np.int64, len(tensors)) if dtype == torch.float32 \
            else None
        return self.raw(dtype, np.fromiter(map(torch.Tensor.data_ptr, tensors), np.int64, len(tensors)),
                        np.fromiter(map(torch.Tensor.numel, tensors), np.int64, len(tensors)), ndims,
                        np.asarray([n for t in views for n in t.shape], dtype=np.int64),
                        np.asarray([n for t in views for n in t.stride()], dtype=np.int64), kinds)

    def raw(self, dtype: torch.dtype, ptrs: np.ndarray, numels: np.ndarray, ndims: np.ndarray, sizes: np.ndarray,
            strides: np.ndarray, kinds: Optional[np.ndarray] = None) -> np.ndarray:
        """`figures` of tensors given by their addresses and element counts (int64 arrays), the views among them
        (ndims[k] > 0) by their sizes and strides in elements, one after the other in `sizes` and `strides`;
        `kinds` (float32 only; None: all float32) what each address holds (`KINDS`: 1 float16, 2 bfloat16).
        Nothing is checked: the caller (statistics.py's plan) has checked that each address is that of a live
        strided CPU tensor of that dtype with that many elements and that layout."""
        count = len(ptrs)
        out = np.empty((count, 9), dtype=np.float64)
        if count:
            arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (ptrs, numels, ndims, sizes, strides)]
            if kinds is not None:
                arrays.append(np.ascontiguousarray(kinds, dtype=np.int64))
            addresses = [a.ctypes.data for a in arrays] + ([] if kinds is not None else [None])
            if self._calls[dtype](count, *addresses, out.ctypes.data) != 0:
                raise MemoryError("store statistics kernel: no memory for its buffer")
        return out


def switched_off() -> bool:
    """Whether `NNSCHEMAPARSER_NATIVE` is 0 (or no, off, false) now: read at each `Summariser()`, so a process can
    write one store with the kernel and the next with torch's reductions."""
    return native_build.switched_off()


def _load() -> Kernel:
    library, target = native_build.load(_SOURCE, "statistics")
    version = library.nsp_statistics_version
    version.restype = ctypes.c_int64
    if version() != _VERSION:
        raise RuntimeError(f"{target} gives figures of version {version()}, not {_VERSION}: delete it to rebuild")
    return Kernel(library, target)


_loaded = native_build.Loaded(_load)


def kernel() -> Optional[Kernel]:
    """The statistics kernel of this process, built or loaded on the first call; None where it cannot be had
    or `switched_off()` (`problem()` says why)."""
    return _loaded.get()


def problem() -> Optional[str]:
    """Why `kernel()` is None (None when it is not)."""
    return _loaded.problem()
