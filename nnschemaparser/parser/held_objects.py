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
| a tensor | version counter, data pointer, shape (an inference tensor: a copy, `_COPY_LIMIT`) | a write in place |
| a `torch.Generator` | its state | numbers drawn from it |

Not seen: writes three levels in or deeper (`STATE.cache[key].append(x)`), into tuples' and
frozensets' items, inside objects without a `__dict__` (`__slots__`, C types such as a numpy array
or `random.Random`), into an inference tensor above `_COPY_LIMIT` elements (only a new data pointer
or shape), into functions and what wraps them (`fn.calls += 1`, an `lru_cache`'s table, a
`functools.partial`), and `logging`'s and `typing`'s own objects (a logger's level cache), which are
bookkeeping and are skipped on purpose. Names and attributes spelled as dunders (`__builtins__`,
`__spec__`, `__wrapped__`) are not looked into.

Depends on torch only.
"""

from __future__ import annotations

import collections
import functools
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
           frozenset, range, type(None), functools.partial, type(functools.lru_cache(None)(len)))
_BOOKKEEPING = ("logging", "typing")  # modules whose objects' writes are bookkeeping, not computation


_SKIP = frozenset(_OPAQUE)  # exact types passed over without a look (the common case: a function, a str)


def _label_key(label: str, key: Any) -> str:
    if key is not _MISSING and isinstance(key, (str, int, float, bool, type(None))) and len(text := repr(key)) <= 40:
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
        # (parent's index or -1, the name or the step from the parent, kind, object, fingerprint);
        # labels are spelled out only for a write (a watch takes thousands of fingerprints per sweep)
        self.items: list[tuple[int, Any, str, Any, Any]] = []
        self.seen: set[int] = set()
        self.refused: list[str] = []  # objects that could not be fingerprinted, said by `changed()`

    def add(self, label: str, value: Any, depth: int = _DEPTH) -> None:
        """Record `value` (named `label`) and, while `depth` allows, the objects it holds."""
        if type(value) not in _SKIP:
            self._root(label, value, depth)

    def add_names(self, where: str, names: Any) -> None:
        """`add` each (name, value) of `names` as `where.name`, dunders (`__builtins__`) aside."""
        skip, add = _SKIP, self._root
        for key, value in names:
            if type(value) not in skip and not (type(key) is str and key[:2] == "__" == key[-2:]):
                add((where, key), value, _DEPTH)

    def _root(self, step: Any, value: Any, depth: int) -> None:
        try:
            self._add(-1, step, value, depth)
        except Exception as exc:  # an object whose own code refuses to be read (a subclass's __iter__)
            name = step if type(step) is str else f"{step[0]}.{step[1]}"
            self.refused.append(f"{name} could not be fingerprinted ({type(exc).__name__}: {exc})")

    def _add(self, parent: int, step: Any, value: Any, depth: int) -> None:
        if id(value) in self.seen or isinstance(value, _OPAQUE):
            return
        if isinstance(value, torch.Tensor):
            self.seen.add(id(value))
            self.items.append((parent, step, "tensor", value, _tensor_print(value)))
            return
        if isinstance(value, dict):
            items, kind = dict(dict.items(value)), "dict"  # stored items: a subclass's __getitem__ may make new ones
        elif isinstance(value, (list, collections.deque)):
            items, kind = list.copy(value) if isinstance(value, list) else list(value), "list"
        elif isinstance(value, set):
            items, kind = set.copy(value), "set"
        elif isinstance(value, bytearray):
            items, kind = bytes(value), "bytes"
        elif type(value) is torch.Generator:
            items, kind = value.get_state(), "generator"
        else:
            attrs = _attributes(value)
            if attrs is None:
                return
            items, kind = dict(attrs), "object"
        self.seen.add(id(value))
        here = len(self.items)
        self.items.append((parent, step, kind, value, items))
        if depth > 1:
            add, skip = self._add, _SKIP
            if kind == "dict":
                for key, item in items.items():
                    if type(item) not in skip:
                        add(here, ("[]", key), item, depth - 1)
            elif kind == "object":
                for key, item in items.items():
                    if type(item) not in skip and not (type(key) is str and key[:2] == "__" == key[-2:]):
                        add(here, (".", key), item, depth - 1)
            elif kind == "list":
                for item in items:
                    if type(item) not in skip:
                        add(here, ("[]", _MISSING), item, depth - 1)

    def label(self, index: int) -> str:
        """The name of the object at `index`: `module.STATS.cache[5]`."""
        parent, step, *_ = self.items[index]
        if parent < 0:
            return step if type(step) is str else f"{step[0]}.{step[1]}"
        base, (how, key) = self.label(parent), step
        return f"{base}.{key}" if how == "." else _label_key(base, key)

    def changed(self) -> list[str]:
        """Each write seen, named (`module.STATS.calls`, `module.CACHE[5]`, `module.LOG[...]`)."""
        out: list[str] = list(self.refused)
        for index, (_, _, kind, value, before) in enumerate(self.items):
            try:
                out += self._written(index, kind, value, before)
            except Exception as exc:
                out.append(f"{self.label(index)} could not be compared ({type(exc).__name__}: {exc})")
        return out

    def _written(self, index: int, kind: str, value: Any, before: Any) -> list[str]:
        """The writes into the object at `index` since its fingerprint `before`."""
        if kind == "tensor":
            return [f"{self.label(index)} (a tensor changed in place)"] if _tensor_changed(value, before) else []
        if kind == "generator":
            return [] if torch.equal(value.get_state(), before) else [f"{self.label(index)} (a generator drew numbers)"]
        if kind in ("dict", "object"):
            now = value if kind == "dict" else _attributes(value) or {}
            if len(now) == len(before) and all(dict.get(now, k, _MISSING) is v for k, v in before.items()):
                return []
            keys = [k for k in [*before, *(k for k in dict.keys(now) if k not in before)]
                    if dict.get(now, k, _MISSING) is not before.get(k, _MISSING)]
            label = self.label(index)
            out = [_label_key(label, k) if kind == "dict" else f"{label}.{k}" for k in keys[:_PER_OBJECT]]
            return out + ([f"{len(keys) - _PER_OBJECT} more of {label}"] if len(keys) > _PER_OBJECT else [])
        if kind == "list":
            now = list.copy(value) if isinstance(value, list) else list(value)
            same = len(now) == len(before) and all(a is b for a, b in zip(now, before))
        elif kind == "bytes":
            same = bytes(value) == before
        else:  # a set
            same = len(value) == len(before) and value.issuperset(before)
        return [] if same else [f"{self.label(index)}[...]"]


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
