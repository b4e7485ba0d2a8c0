"""`retain_freed_memory`: let glibc's malloc keep the memory a dropped capture frees, for the next one.

A capture keeps every intermediate tensor alive (GPT-2 small at 64 tokens: about 140 MB), so its
allocations cannot reuse what earlier tensors of the same run freed, as eager's do. With glibc's
default, adaptive settings the tensors of 128 KB and more that find no free heap block are mapped
one by one (`mmap`) and handed back to the kernel (`munmap`) when the trace is dropped, and the top
of the heap is trimmed: each capture then writes into fresh pages, one minor page fault and a page
zeroed by the kernel per 4 KB (20,000 to 27,000 faults a GPT-2-small capture; `bench/bench_gpt2_small.py`).
The adaptive mapping threshold does not rescue it: torch allocates with `posix_memalign`, whose
request is a little larger than the block it freed, so the threshold, raised to the freed size,
stays just below the next request.

`retain_freed_memory()` sets two of glibc's `mallopt` parameters for the whole process:
`M_MMAP_THRESHOLD` (blocks below it come from the heap, and go back to it when freed) and
`M_TRIM_THRESHOLD` (free memory at the heap's top kept up to this size). The next capture reuses
the pages the last one freed. Values are untouched: only where malloc finds memory changes.

What it costs, process-wide and for the rest of the process (glibc has no way to undo it: setting
either parameter turns its adaptive thresholds off for good):

- memory a dropped capture freed stays with the process (its resident size stays near the
  high-water mark) instead of going back to the system;
- blocks below the mapping threshold that outlive their neighbours can fragment the heap;
- blocks above it (32 MiB at most, glibc's bound on 64-bit) are still mapped one by one.

The same settings can be given before the process starts, with no code:
`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824`.

Captures need none of this by default: `traces/capture_memory.py` keeps the heap a dropped capture
freed for the next one with a block pinned at the heap's top, bounded and released on its own
(`release_capture_memory()`); once this function has been called, it places no pin.

Only glibc's malloc has these parameters: elsewhere (macOS, Windows, musl, or a process whose
`malloc` is another allocator's, preloaded) the call raises OSError and changes nothing.

Must not import anything of the package: it is about the C library, not about schemas.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

__all__ = ["HeapRetention", "find_glibc", "retain_freed_memory", "retaining"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses more


@dataclass(frozen=True)
class HeapRetention:
    """What `retain_freed_memory` set: glibc's `M_MMAP_THRESHOLD` and `M_TRIM_THRESHOLD`, in bytes, and
    the C library's version."""

    mmap_threshold: int
    trim_threshold: int
    libc_version: str


_RETAINING = False  # set once retain_freed_memory() succeeded: the process keeps freed memory for good


def retaining() -> bool:
    """Whether `retain_freed_memory()` was called in this process (and succeeded)."""
    return _RETAINING


def find_glibc() -> tuple[ctypes.CDLL | None, str, str]:
    """(glibc, its version, "") when it is this process's C library and its malloc is the one in use;
    otherwise (None, "", why): "not glibc" or "another malloc" (jemalloc, tcmalloc preloaded)."""
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None, "", "not glibc"
    version.restype = ctypes.c_char_p
    release = version().decode()
    in_use = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    if in_use != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
        return None, release, "another malloc"
    return libc, release, ""


def _glibc() -> tuple[ctypes.CDLL, str]:
    """glibc, when it is this process's C library and its malloc is the one in use; OSError otherwise."""
    libc, release, problem = find_glibc()
    if problem == "not glibc":
        raise OSError("retain_freed_memory: this process's C library is not glibc, whose malloc parameters it sets; "
                      "nothing was changed. Call it only on Linux with glibc (check sys.platform and "
                      "platform.libc_ver()).")
    if problem:
        raise OSError("retain_freed_memory: this process's malloc is not glibc's (an allocator such as jemalloc "
                      "or tcmalloc is preloaded), so glibc's parameters would change nothing; nothing was changed. "
                      "Use that allocator's own settings to keep freed memory, or run without it.")
    assert libc is not None
    return libc, release


def retain_freed_memory(mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 1 << 30) -> HeapRetention:
    """Keep memory a dropped capture freed inside the process, so the next capture reuses its pages.

    Sets glibc's `M_MMAP_THRESHOLD` (blocks smaller than `mmap_threshold` bytes come from the heap;
    at most 32 MiB) and `M_TRIM_THRESHOLD` (up to `trim_threshold` bytes free at the heap's top are
    kept) with `mallopt`, for the whole process and for good. Captures, eager runs and every other
    allocation of the process then skip the page faults of fresh memory; no value changes. The
    cost: freed memory is not given back to the system. See the module text for the details and the
    `GLIBC_TUNABLES` equivalent. Raises OSError (nothing changed) where malloc is not glibc's,
    ValueError for thresholds out of range. Calling it again sets the new values.

        >>> retain_freed_memory()  # doctest: +SKIP
        HeapRetention(mmap_threshold=33554432, trim_threshold=1073741824, libc_version='2.36')
    """
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"retain_freed_memory: {name} must be a number of bytes (an int >= 0), got {value!r}")
    if mmap_threshold > MAX_MMAP_THRESHOLD:
        raise ValueError(f"retain_freed_memory: mmap_threshold={mmap_threshold} is over glibc's bound of "
                         f"{MAX_MMAP_THRESHOLD} bytes (32 MiB); give at most that (blocks above it are always mapped)")
    if trim_threshold > 2 ** 31 - 1:
        raise ValueError(f"retain_freed_memory: trim_threshold={trim_threshold} does not fit mallopt's int; give at "
                         f"most {2 ** 31 - 1} bytes")
    libc, release = _glibc()
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for param, value in ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold)):
        if libc.mallopt(param, value) != 1:
            raise OSError(f"retain_freed_memory: glibc {release} refused mallopt({param}, {value})")
    global _RETAINING
    _RETAINING = True
    return HeapRetention(mmap_threshold, trim_threshold, release)
