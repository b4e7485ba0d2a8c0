"""Capture memory: the heap a dropped capture freed stays with the process for the next capture.

A capture keeps every value alive, so its values cannot reuse what its earlier ones freed, as eager
does: they grow glibc's heap (GPT-2 small at 64 tokens: about 100 MB). When the record is dropped,
the freed values merge into the free chunk at the top of the heap, and glibc hands that back to the
system (it trims the top past its trim threshold). The next capture then writes into fresh pages:
a minor page fault and a page zeroed by the kernel per 4 KB, 18,000 a GPT-2-small capture: 1.23x
eager, 1.03x with the pin below (`bench/bench_gpt2_small.py`; what else was tried:
`bench/bench_heap_faults.py`).

glibc gives memory back only from the top of its heap. So, at the end of a capture that grew the
heap, a block is allocated from the top, above every value: *the pin*. While it stands, the values
freed below it stay as free chunks in the heap, and the next capture's allocations reuse them: no
fresh pages, no faults. glibc's parameters are untouched (compare `traces/heap.py`); the pin is an
ordinary block, and when it is freed glibc trims the top as it would have.

Bounds (what `CaptureMemory` reports):

- released by `release_capture_memory()`, and by a watch thread when no capture has run for
  `idle_seconds` (10 s by default; `keep_capture_memory(idle_seconds=...)`): the pin is freed, and
  `malloc_trim(0)` gives the free pages back (blocks made while the pin stood and still in use, a
  cache or the last run's metadata, may sit among the freed values, where glibc's trim of the top
  alone would not reach; the trim returns the process's other free heap pages too, which later
  allocations there fault in again, once);
- at most the largest capture's heap bytes: the heap bytes freed since the pin was placed
  (`retained_bytes`, mallinfo2's free bytes less the top, over what they were) are checked against the most one capture
  kept (`bound_bytes`) at each capture's start and by the watch (every second while a pin stands);
  past it, the pin is released;
- a pin stays where it is while the captures fit below it; a capture that grew the heap above it
  gets a new pin at the new top (the old one is freed);
- never placed: with another malloc than glibc's (jemalloc, tcmalloc preloaded; other systems),
  glibc before 2.33 (no `mallinfo2`), after `keep_capture_memory(False)` or `retain_freed_memory()`
  (the process keeps freed memory already), for a capture that kept under 1 MiB of heap, for one
  whose allocations came from another arena than the main one (a thread's), or when no block can be
  had from the top without a mapping of its own (`placed_fails` counts those).

What it calls of glibc is public: `malloc`, `realloc`, `free`, `malloc_trim`, `sbrk(0)` and
`mallinfo2` (bytes in use and free, and `keepcost`, the size of the top chunk, which starts at
`sbrk(0) - keepcost`). A pin is accepted only when
malloc returned the block at the top chunk's start (16 bytes in, past the chunk's header); a
rejected try is shrunk with `realloc` before it is freed, so a try that glibc mapped (`mmap`) on
its own does not raise glibc's adaptive mapping threshold when it is unmapped.

`capture_started()` and `capture_ended(token)` are what a capture path calls around its run
(`capture_run` does). Must not import anything of the package but `traces.heap`.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import heap

__all__ = ["CaptureMemory", "capture_memory_held", "capture_ended", "capture_started", "keep_capture_memory",
           "release_capture_memory"]

MIN_CAPTURE_BYTES = 1 << 20  # a capture that kept less gets no pin (glibc's trim threshold is 128 KiB and up)
_FIRST_PIN = 64 << 10  # above glibc's largest tcache and fastbin blocks: a free from any thread merges at once
_TRIES = 8  # 64 KiB to 8 MiB, doubling: past the free chunks in the bins, to the top
_CHUNK_HEADER = 2 * ctypes.sizeof(ctypes.c_size_t)
_WATCH_PERIOD = 1.0  # seconds between the watch's checks of the bound while a pin stands


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@dataclass(frozen=True)
class CaptureMemory:
    """What captures keep of the heap now (`capture_memory_held()`).

    `enabled`: captures place a pin (`keep_capture_memory`); `reason`: why no pin can be placed in
    this process ("" where one can); `pin_bytes`: the pin block's size (0 when none; its pages are
    untouched but the first); `retained_bytes`: heap bytes freed since the pin was placed, kept
    below it; `bound_bytes`: the most one capture kept since the last release (past it the pin
    goes); `idle_seconds`: how long after the last capture the pin stays; `placed`, `placed_fails`:
    pins placed, and captures that could not get one, since the process started."""

    enabled: bool
    reason: str
    pin_bytes: int
    retained_bytes: int
    bound_bytes: int
    idle_seconds: float
    placed: int
    placed_fails: int


class _Glibc:
    """The four calls of glibc this module makes, typed."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self.mallinfo2 = libc.mallinfo2  # AttributeError before glibc 2.33
        self.mallinfo2.restype = _Mallinfo2
        self.mallinfo2.argtypes = ()
        self.sbrk = libc.sbrk
        self.sbrk.restype = ctypes.c_void_p
        self.sbrk.argtypes = (ctypes.c_long,)
        self.malloc = libc.malloc
        self.malloc.restype = ctypes.c_void_p
        self.malloc.argtypes = (ctypes.c_size_t,)
        self.realloc = libc.realloc
        self.realloc.restype = ctypes.c_void_p
        self.realloc.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        self.free = libc.free
        self.free.restype = None
        self.free.argtypes = (ctypes.c_void_p,)
        self.malloc_trim = libc.malloc_trim
        self.malloc_trim.restype = ctypes.c_int
        self.malloc_trim.argtypes = (ctypes.c_size_t,)

    def top_start(self, info: _Mallinfo2) -> int:
        return (self.sbrk(0) or 0) - info.keepcost


class _Pin:
    """The process's one pin and its settings; every change under `lock`."""

    def __init__(self) -> None:
        self.enabled = True
        self.idle_seconds = 10.0
        self.placed = 0
        self.placed_fails = 0
        self._reset_locks()
        self.glibc: Optional[_Glibc] = None
        self.reason: Optional[str] = None  # None: not looked up yet
        self.clear()

    def _reset_locks(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.watch: Optional[threading.Thread] = None

    def clear(self) -> None:
        self.address = 0  # the pin block (malloc's pointer), 0 when none
        self.size = 0
        self.end = 0  # the top chunk's start when it was placed: nothing above it in use since
        self.bound = 0
        self.free_base = 0  # mallinfo2's free bytes below the top when the pin was placed (the values alive)
        self.last = 0.0

    def lib(self) -> Optional[_Glibc]:
        if self.reason is None:
            libc, _, problem = heap.find_glibc()
            if problem == "not glibc":
                self.reason = "this process's C library is not glibc: captures keep no freed memory"
            elif problem:
                self.reason = ("this process's malloc is not glibc's (an allocator such as jemalloc or tcmalloc is "
                               "preloaded): captures keep no freed memory; that allocator's own settings can")
            else:
                try:
                    self.glibc, self.reason = _Glibc(libc), ""
                except AttributeError:
                    self.reason = ("this glibc has no mallinfo2 (before 2.33), which the pin reads: captures keep no "
                                   "freed memory")
        return self.glibc if self.enabled and not self.reason and not heap.retaining() else None

    def retained(self, glibc: _Glibc) -> int:
        info = glibc.mallinfo2()
        return max(0, info.fordblks - info.keepcost - self.free_base) if self.address else 0

    def release(self) -> int:
        """Free the pin and trim (lock held); the bytes it kept: the pin and what was freed below it."""
        if not self.address:
            return 0
        assert self.glibc is not None
        held = self.size + self.retained(self.glibc)
        self.glibc.free(self.address)
        # blocks made while the pin stood and still in use (a cache, the last run's metadata) may sit
        # among the freed values, below which glibc's own trim of the top does not reach
        self.glibc.malloc_trim(0)
        self.clear()
        return held

    def place(self, glibc: _Glibc) -> bool:
        """A block at the top chunk's start, trying sizes from 64 KiB up; the old pin freed once placed."""
        size = _FIRST_PIN
        for _ in range(_TRIES):
            top = glibc.top_start(glibc.mallinfo2())
            block = glibc.malloc(size)
            if not block:
                break
            if block == top + _CHUNK_HEADER:
                old = self.address
                info = glibc.mallinfo2()
                self.address, self.size, self.end = block, size, glibc.top_start(info)
                if old:
                    glibc.free(old)
                    info = glibc.mallinfo2()
                self.free_base = info.fordblks - info.keepcost
                self.placed += 1
                return True
            # from a free chunk below, or mapped on its own: shrunk first, so that unmapping it does not
            # raise glibc's adaptive threshold (free raises it to the size of a mapped block it unmaps)
            glibc.free(glibc.realloc(block, 1) or block)
            size *= 2
        self.placed_fails += 1
        return False

    def watch_loop(self) -> None:
        with self.wake:
            while True:
                if not self.address:
                    self.wake.wait()
                    continue
                left = self.last + self.idle_seconds - time.monotonic()
                if left <= 0 or (self.glibc is not None and self.retained(self.glibc) > self.bound):
                    self.release()
                    continue
                self.wake.wait(min(left, _WATCH_PERIOD))

    def start_watch(self) -> None:
        if self.watch is None or not self.watch.is_alive():
            self.watch = threading.Thread(target=self.watch_loop, name="nnschemaparser-capture-memory", daemon=True)
            self.watch.start()


_PIN = _Pin()
if hasattr(os, "register_at_fork"):  # a forked child has no watch thread, and maybe a lock held by another
    os.register_at_fork(after_in_child=_PIN._reset_locks)


def capture_started() -> Optional[tuple[int, int]]:
    """Before a capture runs: the heap's bytes in use and its top chunk's start (the token for
    `capture_ended`), or None where no pin is placed. A pin holding more than the bound is released."""
    glibc = _PIN.lib()
    if glibc is None:
        if _PIN.address:  # switched off by retain_freed_memory() since
            release_capture_memory()
        return None
    with _PIN.lock:
        if _PIN.address and _PIN.retained(glibc) > _PIN.bound:
            _PIN.release()
        info = glibc.mallinfo2()
        return info.uordblks, glibc.top_start(info)


def capture_ended(token: Optional[tuple[int, int]]) -> None:
    """After a capture returned its values: a pin above them when the capture grew the heap by
    `MIN_CAPTURE_BYTES` or more and no pin stands above them already (none, or the capture's blocks
    went past it)."""
    if token is None:
        return
    glibc = _PIN.lib()
    if glibc is None:
        return
    with _PIN.lock:
        info = glibc.mallinfo2()
        kept, top = info.uordblks - token[0], glibc.top_start(info)
        _PIN.last = time.monotonic()
        if kept < MIN_CAPTURE_BYTES:
            return
        _PIN.bound = max(_PIN.bound, kept)
        # blocks in use above the pin that the capture did not make (the top moved before it) need no new one
        if not _PIN.address or (top != _PIN.end and top > token[1]):
            if not _PIN.place(glibc):
                return
        _PIN.start_watch()
        _PIN.wake.notify()


def release_capture_memory() -> int:
    """Give back now the heap memory kept for the next capture; the bytes it held (0 when none).

    Frees the pin (see `traces/capture_memory.py`) and calls glibc's `malloc_trim(0)`, so the pages
    the dropped captures freed go back to the system (with any other free pages of the heap). The
    next capture places a new pin, unless `keep_capture_memory(False)`. Safe to call anywhere, any
    number of times.

        >>> release_capture_memory()  # doctest: +SKIP
        104857600
    """
    with _PIN.lock:
        return _PIN.release()


def keep_capture_memory(enabled: bool = True, idle_seconds: Optional[float] = None) -> CaptureMemory:
    """Whether captures keep the heap they freed for the next capture (on by default), and for how long.

    `enabled=False` releases the pin now and places no more; `idle_seconds` (> 0) is how long after
    the last capture the pin stays (10 s by default). Returns `capture_memory_held()`. Only with
    glibc's malloc (see `CaptureMemory.reason`); elsewhere nothing is ever kept.

        >>> keep_capture_memory(False).pin_bytes  # doctest: +SKIP
        0
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"keep_capture_memory: enabled must be True or False, got {enabled!r}")
    if idle_seconds is not None and (isinstance(idle_seconds, bool) or not isinstance(idle_seconds, (int, float))
                                     or not idle_seconds > 0):
        raise ValueError(f"keep_capture_memory: idle_seconds must be a number of seconds > 0, got {idle_seconds!r}")
    with _PIN.lock:
        _PIN.enabled = enabled
        if idle_seconds is not None:
            _PIN.idle_seconds = float(idle_seconds)
        if not enabled:
            _PIN.release()
        _PIN.wake.notify()
    return capture_memory_held()


def capture_memory_held() -> CaptureMemory:
    """What captures keep of the heap now: the pin, the freed bytes below it, the bound (`CaptureMemory`)."""
    _PIN.lib()
    with _PIN.lock:
        retained = _PIN.retained(_PIN.glibc) if _PIN.address and _PIN.glibc is not None else 0
        reason = _PIN.reason or ("" if not heap.retaining() else
                                 "retain_freed_memory() was called: the process keeps freed memory already")
        return CaptureMemory(enabled=_PIN.enabled, reason=reason, pin_bytes=_PIN.size if _PIN.address else 0,
                             retained_bytes=retained, bound_bytes=_PIN.bound, idle_seconds=_PIN.idle_seconds,
                             placed=_PIN.placed, placed_fails=_PIN.placed_fails)
