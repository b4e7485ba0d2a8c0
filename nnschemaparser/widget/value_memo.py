"""A step's statistics and histogram bins, computed once per value (issue 42, Step latency).

A Step redraws the step card (the value's statistics), the call stack (each frame variable's
statistics), the inline values and the histograms: most of those values were there at the last
step, unchanged. `statistics(value)` and `bins(value, n)` give what `traces.tables.tensor_statistics`
and `traces.histograms.histogram_bins` give, computed again only when the value is a different
tensor or was changed in place since: the key is the tensor's identity (held by a weak reference,
so a freed tensor's reused id never matches) and its version counter (bumped by every in-place
change, shared with its views). A tensor without a version counter (made in inference mode) is
computed every time. At most `LIMIT` values are kept, the least recently used dropped first.

Depends on traces (tables, histograms) and torch; used by the widget's state and debugger.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch

from ..traces.histograms import histogram_bins
from ..traces.tables import tensor_statistics

__all__ = ["statistics", "bins", "LIMIT"]

#: How many (value, kind) results are kept.
LIMIT = 1024

_memo: "OrderedDict[tuple, tuple[weakref.ref, int, Any]]" = OrderedDict()


def _version(value: torch.Tensor) -> Optional[int]:
    try:
        return int(value._version)
    except (RuntimeError, AttributeError):  # an inference tensor has no version counter
        return None


def _cached(value: Any, kind: tuple, compute: Callable[[Any], Any]) -> Any:
    if not isinstance(value, torch.Tensor):
        return compute(value)
    version = _version(value)
    if version is None:
        return compute(value)
    key = (id(value),) + kind
    held = _memo.get(key)
    if held is not None and held[0]() is value and held[1] == version:
        _memo.move_to_end(key)
        return held[2]
    result = compute(value)
    try:
        ref = weakref.ref(value)
    except TypeError:  # pragma: no cover - torch tensors take weak references
        return result
    _memo[key] = (ref, version, result)
    _memo.move_to_end(key)
    while len(_memo) > LIMIT:
        _memo.popitem(last=False)
    return result


def statistics(value: Any) -> dict[str, Any]:
    """`tensor_statistics(value)`, once per value and version (a copy: the caller may change it)."""
    return dict(_cached(value, ("stats",), tensor_statistics))


def bins(value: Any, n: int) -> dict[str, Any]:
    """`histogram_bins(value, bins=n).to_dict()`, once per value, version and `n` (a copy)."""
    out = _cached(value, ("bins", n), lambda v: histogram_bins(v, bins=n).to_dict())
    return {key: list(item) if isinstance(item, list) else item for key, item in out.items()}
