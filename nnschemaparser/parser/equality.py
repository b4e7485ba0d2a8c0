"""Exact structural comparison of two forward results: what "bit-identical to eager" means here.

Tensors compare with `torch.equal` (plus dtype and shape; meta tensors, which hold no values, by
dtype and shape only); mappings by keys in order (ModelOutput is
one), lists and tuples by type and the items they hold (read by the base type, whatever a subclass's
`__iter__` does), other objects (a KV cache, a dataclass) by their instance
attributes, recursively; anything else with `==`. Used by the sweep, the benchmarks and the tests.
Depends on torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

__all__ = ["Mismatch", "first_mismatch", "max_abs_diff", "tensors_of"]

_MAX_DEPTH = 32


@dataclass(frozen=True)
class Mismatch:
    """Where two results first differ and how."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def first_mismatch(expected: Any, actual: Any, path: str = "output", _depth: int = 0,
                   _seen: Optional[set] = None) -> Optional[Mismatch]:
    """None when `actual` equals `expected` exactly; else the first difference found."""
    if _depth > _MAX_DEPTH:
        return None
    seen = _seen if _seen is not None else set()
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return Mismatch(path, f"expected a tensor, got {type(actual).__name__}")
        if expected.dtype != actual.dtype:
            return Mismatch(path, f"dtype {actual.dtype} != {expected.dtype}")
        if expected.shape != actual.shape:
            return Mismatch(path, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}")
        if expected.is_meta or actual.is_meta:
            # meta tensors hold no values (a model built under torch.device("meta")): equal dtype
            # and shape is all there is to compare
            return None if expected.is_meta == actual.is_meta else Mismatch(
                path, f"device {actual.device} != {expected.device}")
        if not torch.equal(expected, actual):
            if expected.is_floating_point() and torch.equal(expected.isnan(), actual.isnan()) and \
                    torch.equal(torch.nan_to_num(expected, nan=0.0), torch.nan_to_num(actual, nan=0.0)):
                return None  # same values with NaN in the same places
            return Mismatch(path, f"values differ (max abs diff {_diff(expected, actual):.3g})")
        return None
    if type(expected) is not type(actual):
        return Mismatch(path, f"type {type(actual).__name__} != {type(expected).__name__}")
    if isinstance(expected, Mapping):
        if list(expected.keys()) != list(actual.keys()):
            return Mismatch(path, f"keys {list(actual.keys())} != {list(expected.keys())}")
        for key in expected:
            found = first_mismatch(expected[key], actual[key], f"{path}[{key!r}]", _depth + 1, seen)
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        expected_items, actual_items = _items(expected), _items(actual)
        if len(expected_items) != len(actual_items):
            return Mismatch(path, f"length {len(actual_items)} != {len(expected_items)}")
        for index, (e, a) in enumerate(zip(expected_items, actual_items)):
            found = first_mismatch(e, a, f"{path}[{index}]", _depth + 1, seen)
            if found:
                return found
        return None
    if isinstance(expected, float) and math.isnan(expected):
        return None if isinstance(actual, float) and math.isnan(actual) else Mismatch(path, f"{actual!r} != nan")
    if isinstance(expected, (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, torch.Size)):
        return None if expected == actual else Mismatch(path, f"{actual!r} != {expected!r}")
    attrs_e = getattr(expected, "__dict__", None)
    attrs_a = getattr(actual, "__dict__", None)
    if attrs_e is not None and attrs_a is not None and not isinstance(expected, type):
        if id(expected) in seen:
            return None
        seen.add(id(expected))
        return first_mismatch(dict(attrs_e), dict(attrs_a), path, _depth + 1, seen)
    if expected is actual:
        return None
    try:
        equal = expected == actual
        if isinstance(equal, bool) and equal:
            return None
    except Exception:  # objects whose == is not a plain comparison
        pass
    return Mismatch(path, f"{type(actual).__name__} values differ")


def _items(value: Any) -> list:
    """The items a list or tuple holds, read by the base type: a subclass may override `__iter__` or
    `__len__` (even to raise), and what is compared is the data, not those methods."""
    base = tuple if isinstance(value, tuple) else list
    return list(base.__iter__(value))


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool:
        return float((a != b).any())
    if a.is_complex():
        return float((a.detach() - b.detach()).abs().max())
    return float((a.detach().double() - b.detach().double()).abs().nan_to_num(nan=float("inf")).max())


def tensors_of(value: Any, _depth: int = 0, _seen: Optional[set] = None) -> list[torch.Tensor]:
    """Every tensor inside a result, in a deterministic order."""
    seen = _seen if _seen is not None else set()
    if _depth > _MAX_DEPTH:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in tensors_of(v, _depth + 1, seen)]
    if isinstance(value, (list, tuple)):
        return [t for v in _items(value) for t in tensors_of(v, _depth + 1, seen)]
    attrs = getattr(value, "__dict__", None)
    if attrs is not None and not isinstance(value, (type, torch.nn.Module)) and id(value) not in seen:
        seen.add(id(value))
        return [t for v in attrs.values() for t in tensors_of(v, _depth + 1, seen)]
    return []


def max_abs_diff(expected: Any, actual: Any) -> float:
    """The largest absolute difference over matching tensors (inf when the structures differ)."""
    a, b = tensors_of(expected), tensors_of(actual)
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return math.inf
        worst = max(worst, _diff(x, y))
    return worst
