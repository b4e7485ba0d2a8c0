"""What the objects that globals, class attributes, closure cells and defaults hold contain, and
what changed in them, named.

`PythonState` (parser/python_state.py) sees a name rebound and the items of a container a global
holds; a function can also write *into* an object: `STATS.calls += 1` on a module-level instance,
`COUNTS[key] += 1` on a `defaultdict`, `RECENT.append(x)` on a deque, `CACHE[key].append(x)`,
`STATE.cache[key] = value`, `TOTAL.add_(1)` on a global tensor. `HeldObjects.add(label, value)`
takes a fingerprint of `value` and of what it holds, two levels deep (the object a name holds, and
each object that object holds directly), and `changed()` names each write after the fact:
`module.STATS.calls`, `module.COUNTS[5]`, `module.TABLES['lengths'][...]`,
`module.TOTAL (a tensor changed in place)`.

| object | fingerprint | a write seen |
|---|---|---|
| dict and its subclasses (`defaultdict`, `OrderedDict`, `Counter`) | its items, values by identity | a key added, removed or rebound |
| list, deque, bytearray | its items by identity, so its length | an item set, added or removed |
| set | its items | an item added or removed |
| an instance with a `__dict__` (no class, module or function) | its attributes by identity | an attribute set, added or deleted |
| a tensor | its version counter, data pointer and shape (a copy of an inference tensor, which has no version counter, up to `_COPY_LIMIT` elements) | a change in place, `set_`, a resize |
| a `torch.Generator` | its state | numbers drawn from it |

Not seen: writes three levels in or deeper (`STATE.cache[key].append(x)`), into tuples' and
frozensets' items, inside objects without a `__dict__` (`__slots__`, C types such as a numpy array
or `random.Random`), into an inference tensor above `_COPY_LIMIT` elements (only a new data pointer
or shape), into the function objects themselves (`fn.calls += 1`, an `lru_cache`'s table), and
`logging`'s own objects (a logger's level cache), which are bookkeeping and are skipped on purpose.
Names spelled as dunders (`__builtins__`, `__spec__`) are not looked into.

Depends on torch only.
"""

from __future__ import annotations

import collections
import types
from typing import Any

import torch

__all__ = ["HeldObjects"]

_DEPTH = 2  # the object a name holds, and the objects it holds directly
_COPY_LIMIT = 1 << 16  # elements of an inference tensor copied to compare (it has no version counter)
_PER_OBJECT = 3  # writes named per object (the rest are counted)
_MISSING = object()
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType, staticmethod, classmethod, property, str, bytes, int, float, complex, bool, tuple,
           frozenset, range, type(None))
_BOOKKEEPING = ("logging",)  # modules whose objects' writes are bookkeeping, not computation


def _label_key(label: str, key: Any) -> str:
    if isinstance(key, (str, int, float, bool, type(None))) and len(text := repr(key)) <= 40:
        return f"{label}[{text}]"
    return f"{label}[...]"


def _attributes(value: Any) -> Any:
    """An instance's own attribute dict, or None (classes, modules, functions, logging's objects)."""
    if isinstance(value, _OPAQUE):
        return None
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except Exception:  # no __dict__ (slots, C types), or an attribute hook that refuses
        return None
    if type(attrs) is not dict:
        return None
    module = type(value).__module__ or ""
    if module.split(".")[0] in _BOOKKEEPING:
        return None
    return attrs


def _tensor_print(value: torch.Tensor) -> tuple:
    try:
        version, copy = value._version, None
    except RuntimeError:  # an inference tensor keeps no version counter: compare its bits
        version = None
        copy = value.detach().clone() if value.numel() <= _COPY_LIMIT else None
    try:
        pointer = value.data_ptr()
    except RuntimeError:  # sparse or otherwise without one storage
        pointer = None
    return version, pointer, tuple(value.shape), copy


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


class HeldObjects:
    """Fingerprints of objects names hold (`add`), and `changed()`: the writes into them since."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Any, Any]] = []  # (label, kind, object, fingerprint)
        self.seen: set[int] = set()

    def add(self, label: str, value: Any, depth: int = _DEPTH) -> None:
        """Record `value` (named `label`) and, while `depth` allows, the objects it holds."""
        if isinstance(value, _OPAQUE) or id(value) in self.seen:
            return
        if isinstance(value, torch.Tensor):
            self.seen.add(id(value))
            self.items.append((label, "tensor", value, _tensor_print(value)))
            return
        if isinstance(value, torch.Generator):
            self.seen.add(id(value))
            self.items.append((label, "generator", value, value.get_state()))
            return
        if isinstance(value, dict):
            items, kind = dict(dict.items(value)), "dict"  # the stored items: a subclass's __getitem__ may make new ones
            inner = [(_label_key(label, k), v) for k, v in items.items()]
        elif isinstance(value, (list, collections.deque)):
            items, kind = list.copy(value) if isinstance(value, list) else list(value), "list"
            inner = [(f"{label}[...]", v) for v in items]
        elif isinstance(value, bytearray):
            items, kind, inner = bytes(value), "bytes", []
        elif isinstance(value, set):
            items, kind, inner = set.copy(value), "set", []
        else:
            attrs = _attributes(value)
            if attrs is None:
                return
            items, kind = dict(attrs), "object"
            inner = [(f"{label}.{k}", v) for k, v in items.items()]
        self.seen.add(id(value))
        self.items.append((label, kind, value, items))
        if depth > 1:
            for name, item in inner:
                self.add(name, item, depth - 1)

    def changed(self) -> list[str]:
        """Each write seen, named (`module.STATS.calls`, `module.CACHE[5]`, `module.LOG[...]`)."""
        out: list[str] = []
        for label, kind, value, before in self.items:
            if kind == "tensor":
                if _tensor_changed(value, before):
                    out.append(f"{label} (a tensor changed in place)")
            elif kind == "generator":
                if not torch.equal(value.get_state(), before):
                    out.append(f"{label} (a generator drew numbers)")
            elif kind in ("dict", "object"):
                now = value if kind == "dict" else _attributes(value) or {}
                if len(now) == len(before) and all(dict.get(now, k, _MISSING) is v for k, v in before.items()):
                    continue
                keys = [k for k in [*before, *(k for k in dict.keys(now) if k not in before)]
                        if dict.get(now, k, _MISSING) is not before.get(k, _MISSING)]
                named = [_label_key(label, k) if kind == "dict" else f"{label}.{k}" for k in keys[:_PER_OBJECT]]
                out += named + ([f"{len(keys) - _PER_OBJECT} more of {label}"] if len(keys) > _PER_OBJECT else [])
            elif kind == "list":
                now = list.copy(value) if isinstance(value, list) else list(value)
                if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                    out.append(f"{label}[...]")
            elif kind == "bytes":
                if bytes(value) != before:
                    out.append(f"{label}[...]")
            elif len(value) != len(before) or not value.issuperset(before):
                out.append(f"{label}[...]")
        return out


def _tensor_changed(value: torch.Tensor, before: tuple) -> bool:
    version, pointer, shape, copy = before
    now = _tensor_print(value) if version is not None else (None, _pointer(value), tuple(value.shape), None)
    if now[1] != pointer or now[2] != shape:
        return True
    if version is not None:
        return now[0] != version
    return copy is not None and not _same_bits(value, copy)


def _pointer(value: torch.Tensor) -> Any:
    try:
        return value.data_ptr()
    except RuntimeError:
        return None
