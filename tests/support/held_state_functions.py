"""Module-level functions that write into objects held by this module's globals (not the globals
themselves), for the state check of activation patching's reuse (tests/traces/
test_patching_held_state.py): a counter on a global object, a deque, a defaultdict counter, a list
inside a global dict, a cache dict on a global object, a tensor changed in place, a set, and an
object held by a closure cell and a mutable default. Each returns the same causal mask, so a run
that skips the call gets the same bits back and only the state shows the difference. They live
apart from the models that call them, so that only the check around each function call sees them."""

from __future__ import annotations

import collections

import torch


class Stats:
    def __init__(self) -> None:
        self.calls = 0
        self.cache: dict = {}


STATS = Stats()
RECENT: collections.deque = collections.deque()
COUNTS: collections.defaultdict = collections.defaultdict(int)
TABLES: dict = {"lengths": []}
TOTAL = torch.zeros(())
SEEN: set = set()


def _mask(h: torch.Tensor, scale: float) -> torch.Tensor:
    n = h.shape[1]
    return torch.triu(torch.full((n, n), -scale, dtype=h.dtype), 1)


def counted_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Increments an attribute of a global object."""
    STATS.calls += 1
    return _mask(h, scale)


def taken_count() -> int:
    """Reads the counter `counted_bias` increments, and sets it back to 0."""
    count, STATS.calls = STATS.calls, 0
    return count


def remembered_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Appends to a global deque."""
    RECENT.append(h.shape[1])
    return _mask(h, scale)


def tallied_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Counts in a global defaultdict (a dict subclass)."""
    COUNTS[h.shape[1]] += 1
    return _mask(h, scale)


def filed_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Appends to a list held by a global dict (two levels in)."""
    TABLES["lengths"].append(h.shape[1])
    return _mask(h, scale)


def stored_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Sets a key of a cache dict that is an attribute of a global object (two levels in)."""
    STATS.cache[h.shape[1]] = _mask(h, scale)
    return STATS.cache[h.shape[1]]


def summed_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Adds to a global tensor in place."""
    TOTAL.add_(1)
    return _mask(h, scale)


def seen_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Adds a new item to a global set."""
    SEEN.add(len(SEEN))
    return _mask(h, scale)


def _make_closed():
    stats = Stats()

    def closed_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
        """Increments an attribute of an object its closure cell holds."""
        stats.calls += 1
        return _mask(h, scale)

    return closed_bias, stats


closed_bias, CLOSED = _make_closed()


def defaulted_bias(h: torch.Tensor, scale: float, seen: collections.deque = collections.deque()) -> torch.Tensor:
    """Appends to its mutable default (a deque)."""
    seen.append(h.shape[1])
    return _mask(h, scale)


def held_state() -> dict:
    """What the functions above wrote, comparable with ==."""
    return {"STATS.calls": STATS.calls, "STATS.cache": sorted(STATS.cache), "RECENT": list(RECENT),
            "COUNTS": dict(COUNTS), "TABLES": {k: list(v) for k, v in TABLES.items()}, "TOTAL": TOTAL.item(),
            "SEEN": sorted(SEEN), "CLOSED.calls": CLOSED.calls,
            "default": list(defaulted_bias.__defaults__[0])}


def reset() -> None:
    """Put every object above back to its start (between the runs a test compares)."""
    STATS.calls = 0
    STATS.cache.clear()
    RECENT.clear()
    COUNTS.clear()
    TABLES["lengths"].clear()
    TOTAL.zero_()
    SEEN.clear()
    CLOSED.calls = 0
    defaulted_bias.__defaults__[0].clear()


def scaled_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Reads (and writes nothing of) the global objects above: reusing it is exact."""
    return _mask(h, scale * (STATS.calls + len(STATS.cache) + len(RECENT) + 1) + TOTAL)



def counted_causal_mask(*args, **kwargs):
    """transformers' `create_causal_mask` that counts its calls on a global object."""
    from transformers.masking_utils import create_causal_mask

    STATS.calls += 1
    return create_causal_mask(*args, **kwargs)
