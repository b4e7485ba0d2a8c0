"""Small runtime functions the lowering emits for Python constructs that are not a single call.

Each one does exactly what the CPython bytecode for the construct does, with the same exceptions
and messages, so an interpreted run raises what the eager forward raises. This module depends on
the standard library only; the save/load allowlist names these functions one by one (those in
`__all__`). `run_import` and `DeferredImport` are deliberately not in `__all__`: a file must never
make a run import something, so a schema holding them refers to them as the model's code does and
runs only when loaded with its model (whose fresh lowering holds the same objects).
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

__all__ = [
    "assign",
    "build_tuple",
    "build_list",
    "build_set",
    "build_dict",
    "merge_kwargs",
    "unpack",
    "unpack_starred",
    "fstring",
    "not_in",
    "contains",
    "raise_name_error",
    "make_slice",
    "truth",
    "iterate",
    "spread",
    "entry_keys",
]


def assign(value: Any) -> Any:
    """`name = value`: binds the value itself (no copy)."""
    return value


def build_tuple(*items: Any) -> tuple:
    """`(a, *b, c)`"""
    return items


def build_list(*items: Any) -> list:
    """`[a, *b, c]`"""
    return list(items)


def build_set(*items: Any) -> set:
    """`{a, *b, c}`"""
    return set(items)


def build_dict(*pairs_or_maps: Any) -> dict:
    """`{k: v, **m}`: each argument is a (key, value) pair or, marked by `_Spread`, a mapping to merge."""
    result: dict = {}
    for item in pairs_or_maps:
        if isinstance(item, _Spread):
            result.update(item.mapping)
        else:
            key, value = item
            result[key] = value
    return result


class _Spread:
    """Marks a `**mapping` entry of a dict display."""

    __slots__ = ("mapping",)

    def __init__(self, mapping: Any):
        if not hasattr(mapping, "keys"):
            raise TypeError(f"'{type(mapping).__name__}' object is not a mapping")
        self.mapping = mapping


def spread(mapping: Any) -> _Spread:
    return _Spread(mapping)


def merge_kwargs(*mappings: Any) -> dict:
    """`f(**a, **b)`: merges keyword mappings, refusing a repeated key as CPython does."""
    result: dict = {}
    for mapping in mappings:
        if not hasattr(mapping, "keys"):
            raise TypeError(f"argument after ** must be a mapping, not {type(mapping).__name__}")
        for key in mapping.keys():
            if key in result:
                raise TypeError(f"got multiple values for keyword argument '{key}'")
            result[key] = mapping[key]
    return result


def unpack(value: Any, count: int) -> tuple:
    """`a, b = value`: iterate and check the length, with CPython's messages."""
    try:
        iterator = iter(value)
    except TypeError:
        raise TypeError(f"cannot unpack non-iterable {type(value).__name__} object") from None
    items = []
    for item in iterator:
        items.append(item)
        if len(items) > count:
            raise ValueError(f"too many values to unpack (expected {count})")
    if len(items) < count:
        raise ValueError(f"not enough values to unpack (expected {count}, got {len(items)})")
    return tuple(items)


def unpack_starred(value: Any, before: int, after: int) -> tuple:
    """`a, *rest, z = value`: the starred target receives a list."""
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"cannot unpack non-iterable {type(value).__name__} object") from None
    if len(items) < before + after:
        raise ValueError(f"not enough values to unpack (expected at least {before + after}, got {len(items)})")
    middle = items[before:len(items) - after]
    return tuple(items[:before]) + (middle,) + tuple(items[len(items) - after:])


def fstring(*pieces: Any) -> str:
    """An f-string: each piece is a literal str or a (value, conversion, format_spec) triple."""
    out = []
    for piece in pieces:
        if isinstance(piece, str):
            out.append(piece)
            continue
        value, conversion, spec = piece
        if conversion == "r":
            value = repr(value)
        elif conversion == "s":
            value = str(value)
        elif conversion == "a":
            value = ascii(value)
        out.append(format(value, spec))
    return "".join(out)


def contains(item: Any, container: Any) -> bool:
    """`item in container`"""
    return item in container


def not_in(item: Any, container: Any) -> bool:
    """`item not in container`"""
    return item not in container


def raise_name_error(name: str) -> None:
    """A name the lowering could not resolve: raise what CPython raises when the line runs."""
    raise NameError(f"name '{name}' is not defined")


def make_slice(lower: Any, upper: Any, step: Any) -> slice:
    return slice(lower, upper, step)


def truth(value: Any) -> bool:
    """`bool(value)` as an `if` or `while` tests it."""
    return bool(value)


def iterate(value: Any):
    """`iter(value)` as a `for` loop starts it."""
    return iter(value)


def entry_keys(container: Any, index: Any = None, reverse: bool = False) -> Any:
    """The index or key in `container` of each entry a loop over a view of it visits, in order.

    A loop over `container[index]` (a slice of an nn.ModuleList or nn.Sequential) visits the entries
    `range(len(container))[index]`; `reverse` reverses that (`reversed(...)`); a container with keys
    (an nn.ModuleDict's `.values()` or `.items()`) gives its keys. The lowering evaluates it once,
    beside the loop's iterable, and each iteration reads the entry's key at the loop's position.
    Never changes the container and calls nothing of it but `len` and `keys`.
    """
    if index is None and not reverse and callable(getattr(container, "keys", None)):
        return list(container.keys())
    keys = range(len(container))
    if index is not None:
        keys = keys[index]
    return keys[::-1] if reverse else keys



class DeferredImport:
    """One import statement's target, imported when the statement runs: what CPython's IMPORT_NAME
    (and IMPORT_FROM, for `attr`) does.

    `import a.b` gives the top-level package (what it binds), `import a.b as c` (`leaf`) the module
    itself, `from a.b import c` (`attr`) the attribute, else the submodule, else CPython's
    ImportError; `package` resolves relative names. The lowering emits one only for an import that
    failed at lowering time: a branch that never runs must not fail (`if is_npu: import torch_npu`),
    and one that runs raises what Python raises. What it imports is fixed when it is made (a file
    cannot change it), and equal statements of one package share one object.
    """

    __slots__ = ("name", "package", "level", "attr", "leaf")
    _made: dict = {}

    def __new__(cls, name: str, package: str, level: int = 0, attr: str = "", leaf: bool = False) -> "DeferredImport":
        key = (name, package, level, attr, leaf)
        found = cls._made.get(key)
        if found is None:
            found = super().__new__(cls)
            found.name, found.package, found.level, found.attr, found.leaf = key
            cls._made[key] = found
        return found

    def __call__(self) -> Any:
        fromlist = (self.attr,) if self.attr else None
        module = builtins.__import__(self.name, {"__package__": self.package, "__name__": self.package}, None,
                                     fromlist, self.level)
        if self.attr:
            return _import_from(module, self.attr)
        if self.leaf:
            for part in self.name.split(".")[1:]:
                module = _import_from(module, part)
        return module

    def __repr__(self) -> str:
        spelled = "." * self.level + self.name
        return f"<import {spelled}{'.' + self.attr if self.attr else ''}>"


def run_import(spec: DeferredImport) -> Any:
    """`import ...` / `from ... import ...` when the statement runs (`spec` says what)."""
    if type(spec) is not DeferredImport:
        raise TypeError(f"run_import needs a DeferredImport, got {type(spec).__name__}")
    return spec()


def _import_from(module: Any, name: str) -> Any:
    """`from module import name`: the attribute, else the submodule, else CPython's ImportError."""
    try:
        return getattr(module, name)
    except AttributeError:
        pass
    full = f"{getattr(module, '__name__', '')}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    where = getattr(module, "__file__", None) or "unknown location"
    raise ImportError(f"cannot import name {name!r} from {getattr(module, '__name__', '?')!r} ({where})",
                      name=getattr(module, "__name__", None), path=getattr(module, "__file__", None))
