"""Values and operands as JSON: the tagged encoding shared by schema files and trace files.

JSON null, booleans, integers, finite floats, strings and arrays (Python lists) stand for
themselves; everything else is an object tagged by "kind" (docs/FORMAT.md lists them all):

    tuple / dict / set / frozenset / size    containers (dict items are [key, value] pairs)
    float ("nan", "inf", "-inf") / complex / bytes / ellipsis / pyslice
    torch ("float32", "strided") / device    torch constants, by exact name
    callable ("torch.nn.functional.linear")  an allowlisted callable, by exact name
    global (namespace, name, type, qualname) an object of the model's own code, resolved only by
                                             load_schema(..., model=...)
    var / const / slice                      operands only: VarRef, Const(value, text), SliceOf

Decoding never imports, evaluates or unpickles: callables come from the allowlist, globals from a
`Resolver`. Depends on schema, allowlist, file_format and errors.
"""

from __future__ import annotations

import json
import math
import re
import sys
import types
from typing import Any, Callable, Optional

import torch

from .allowlist import (
    ATTRIBUTE_ACCESSORS,
    callable_name,
    global_problem,
    resolve_callable,
    resolve_torch_constant,
    torch_constant_name,
)
from ..schema.errors import SchemaFormatError, SchemaRunError
from .file_format import (
    DecodeBudget,
    FileLimitError,
    MalformedFileError,
    UnsafeReferenceError,
    get_str,
    is_array,
    is_object,
    record,
)
from ..schema.model import Const, SliceOf, VarRef

__all__ = ["ValueEncoder", "ValueDecoder", "Resolver", "UnresolvedReference", "qualified_name", "GLOBAL_KINDS",
           "module_for_file"]

GLOBAL_KINDS = ("function", "class", "module", "object")
_DEVICE = re.compile(r"(cpu|cuda|mps|meta|xpu|hpu|mtia|privateuseone)(:[0-9]{1,4})?\Z")
_NAMESPACE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?\Z")
_MAX_NAME = 4096


def qualified_name(value: Any) -> tuple[str, str]:
    """(type, "module.qualname") describing an object a file refers to by global reference."""
    if isinstance(value, types.ModuleType):
        return "module", value.__name__
    if isinstance(value, type):
        return "class", f"{value.__module__}.{value.__qualname__}"
    qualname = getattr(value, "__qualname__", None)
    if callable(value) and isinstance(qualname, str):
        module = getattr(value, "__module__", None)
        if not isinstance(module, str):
            owner = getattr(value, "__self__", None)
            module = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
        return "function", f"{module}.{qualname}" if module else qualname
    cls = type(value)
    return "object", f"{cls.__module__}.{cls.__qualname__}"


class UnresolvedReference:
    """Stands for an object of the model's code in a schema loaded without its model.

    Dumps and walks show it by name; calling it (or running the schema) says what is missing.
    """

    __slots__ = ("namespace", "name", "kind", "qualname", "__name__", "__qualname__")

    def __init__(self, namespace: str, name: str, kind: str, qualname: str):
        self.namespace = namespace
        self.name = name
        self.kind = kind
        self.qualname = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]
        self.__qualname__ = self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SchemaRunError(f"{self.qualname} is part of the model's code, which a schema file does not contain; "
                             "this schema needs the model: load_schema(path, model=...)")

    def __repr__(self) -> str:
        return f"<unresolved {self.qualname}: load_schema(path, model=...) to bind it>"


class Resolver:
    """Turns a global reference of a file into an object; this base leaves a placeholder."""

    def resolve_global(self, namespace: str, name: str, kind: str, qualname: str, where: str) -> Any:
        return UnresolvedReference(namespace, name, kind, qualname)


# --- encoding ---------------------------------------------------------------------------------


def _float(value: float) -> Any:
    if math.isfinite(value):
        return value
    return {"kind": "float", "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


class ValueEncoder:
    """Encodes values and operands; `namespace` is the module whose globals the current code reads.

    With `collect` (a dict), every global reference is also recorded as (namespace, name) -> objects:
    load_schema uses that on a fresh lowering of the live model to know what the model's code names.
    """

    def __init__(self, max_depth: int = 64, collect: Optional[dict] = None, allow_globals: bool = True):
        self.namespace = ""
        self.max_depth = max_depth
        self.collect = collect
        self.allow_globals = allow_globals

    def operand(self, op: Any, site: str, depth: int = 0) -> Any:
        if isinstance(op, VarRef):
            return {"kind": "var", "name": op.name}
        if isinstance(op, Const):
            return {"kind": "const", "text": op.text, "value": self.value(op.value, op.text, depth + 1)}
        if isinstance(op, SliceOf):
            return {"kind": "slice", "lower": self.operand(op.lower, site, depth + 1),
                    "upper": self.operand(op.upper, site, depth + 1), "step": self.operand(op.step, site, depth + 1)}
        kind = type(op)
        if kind is tuple or kind is list or kind is dict:
            self._deep(depth, site)
            if kind is dict:
                items = [[self.operand(k, f"{site}[{i}]", depth + 1), self.operand(v, f"{site}[{i}]", depth + 1)]
                         for i, (k, v) in enumerate(op.items())]
                return {"kind": "dict", "items": items}
            items = [self.operand(item, f"{site}[{i}]", depth + 1) for i, item in enumerate(op)]
            return items if kind is list else {"kind": "tuple", "items": items}
        return self.value(op, site, depth)

    def _deep(self, depth: int, site: str) -> None:
        if depth > self.max_depth:
            raise SchemaFormatError(f"cannot save {site or 'a value'}: nested deeper than {self.max_depth} levels "
                                    "(a self-referencing container?)")

    def value(self, value: Any, site: str, depth: int = 0) -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is str:
            return value
        if kind is float:
            return _float(value)
        if kind in (list, tuple, dict, set, frozenset):
            self._deep(depth, site)
            if kind is dict:
                items = [[self.value(k, f"{site}[{i}]", depth + 1), self.value(v, f"{site}[{i}]", depth + 1)]
                         for i, (k, v) in enumerate(value.items())]
                return {"kind": "dict", "items": items}
            items = [self.value(item, f"{site}[{i}]", depth + 1) for i, item in enumerate(value)]
            if kind is list:
                return items
            if kind is tuple:
                return {"kind": "tuple", "items": items}
            items.sort(key=lambda item: json.dumps(item, sort_keys=True))  # a stable order for sets
            return {"kind": kind.__name__, "items": items}
        if kind is complex:
            return {"kind": "complex", "real": _float(value.real), "imag": _float(value.imag)}
        if kind is bytes:
            return {"kind": "bytes", "hex": value.hex()}
        if value is Ellipsis:
            return {"kind": "ellipsis"}
        if kind is slice:
            return {"kind": "pyslice", "start": self.value(value.start, site, depth + 1),
                    "stop": self.value(value.stop, site, depth + 1), "step": self.value(value.step, site, depth + 1)}
        if kind is torch.Size:
            return {"kind": "size", "items": [int(d) for d in value]}
        if kind is torch.device:
            return {"kind": "device", "value": str(value)}
        name = torch_constant_name(value)
        if name is not None:
            return {"kind": "torch", "name": name}
        name = callable_name(value)
        if name is not None:
            return {"kind": "callable", "name": name}
        return self.global_ref(value, site)

    def global_ref(self, value: Any, site: str) -> dict:
        if isinstance(value, UnresolvedReference):  # a schema loaded without its model saves as it was read
            return {"kind": "global", "namespace": value.namespace, "name": value.name, "type": value.kind,
                    "qualname": value.qualname}
        ref_kind, qualname = qualified_name(value)
        if not self.allow_globals:
            raise SchemaFormatError(f"cannot save a {qualname} object here: only plain values (numbers, strings, "
                                    "containers of them) can be saved in this file")
        if not site:
            raise SchemaFormatError(f"cannot save a {qualname} object: it is neither a plain value nor on the "
                                    "allowlist, and no source name refers to it")
        if self.collect is not None:
            self.collect.setdefault((self.namespace, site), []).append(value)
        return {"kind": "global", "namespace": self.namespace, "name": site, "type": ref_kind, "qualname": qualname}


# --- decoding ---------------------------------------------------------------------------------

_VALUE_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tuple": (("kind", "items"), ()),
    "dict": (("kind", "items"), ()),
    "set": (("kind", "items"), ()),
    "frozenset": (("kind", "items"), ()),
    "size": (("kind", "items"), ()),
    "float": (("kind", "value"), ()),
    "complex": (("kind", "real", "imag"), ()),
    "bytes": (("kind", "hex"), ()),
    "ellipsis": (("kind",), ()),
    "pyslice": (("kind", "start", "stop", "step"), ()),
    "torch": (("kind", "name"), ()),
    "device": (("kind", "value"), ()),
    "callable": (("kind", "name"), ()),
    "global": (("kind", "namespace", "name", "type", "qualname"), ()),
    "var": (("kind", "name"), ()),
    "const": (("kind", "text", "value"), ()),
    "slice": (("kind", "lower", "upper", "step"), ()),
}
_OPERAND_ONLY = ("var", "const", "slice")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class ValueDecoder:
    """Decodes what ValueEncoder wrote; every refusal names the entry (`where`)."""

    def __init__(self, resolver: Optional[Resolver], limits_depth: int = 128, budget: Optional[DecodeBudget] = None):
        self.resolver = resolver  # None: plain values only, no callable and no global (trace files)
        self.max_depth = limits_depth
        # What the decoded values take is charged to the file's budget before they are built: a
        # file's identical records are one object (bounded_json), the values built from them are not.
        self.charge = budget.charge if budget is not None else _no_charge
        self._vars: dict[str, VarRef] = {}  # VarRef is frozen: one per name

    def operand(self, data: Any, where: str, depth: int = 0) -> Any:
        if is_array(data):
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(data), "a list operand")
            return [self.operand(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(data)]
        if not is_object(data):
            return self.value(data, where, depth)
        kind = self._kind(data, where)
        if kind == "var":
            name = get_str(data, "name", where)
            ref = self._vars.get(name)
            if ref is None:
                self.charge(_OBJECT_BYTES + 64, "a variable")
                ref = self._vars[name] = VarRef(name)
            return ref
        if kind == "const":
            text = get_str(data, "text", where)
            self.charge(_OBJECT_BYTES, "a constant")
            return Const(self.value(data["value"], f"{where}.value", depth + 1), text)
        if kind == "slice":
            self.charge(_OBJECT_BYTES, "a slice")
            return SliceOf(*(self.operand(data[key], f"{where}.{key}", depth + 1) for key in ("lower", "upper", "step")))
        if kind == "tuple":
            items = self._items(data, where)
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(items), "a tuple operand")
            return tuple(self.operand(item, f"{where}.items[{i}]", depth + 1) for i, item in enumerate(items))
        if kind == "dict":
            return self._dict(data, where, depth, self.operand)
        return self.value(data, where, depth)

    def _kind(self, data: dict, where: str) -> str:
        kind = data.get("kind")
        if type(kind) is not str or kind not in _VALUE_FIELDS:
            raise MalformedFileError(f"{where}: unknown value kind {kind!r}; known: {', '.join(_VALUE_FIELDS)}")
        required, optional = _VALUE_FIELDS[kind]
        record(data, where, required, optional)
        return kind

    @staticmethod
    def _items(data: dict, where: str) -> list:
        items = data["items"]
        if not is_array(items):
            raise MalformedFileError(f"{where}.items: expected an array")
        return items

    def _dict(self, data: dict, where: str, depth: int, decode: Callable) -> dict:
        result = {}
        items = self._items(data, where)
        self.charge(_DICT_BYTES + _ENTRY_BYTES * len(items), "a dict")
        for i, pair in enumerate(items):
            if not is_array(pair) or len(pair) != 2:
                raise MalformedFileError(f"{where}.items[{i}]: expected a [key, value] pair")
            key = decode(pair[0], f"{where}.items[{i}][0]", depth + 1)
            try:
                if key in result:
                    raise MalformedFileError(f"{where}.items[{i}]: duplicate key {key!r}")
                result[key] = decode(pair[1], f"{where}.items[{i}][1]", depth + 1)
            except TypeError:
                raise MalformedFileError(f"{where}.items[{i}]: the key is not hashable") from None
        return result

    def value(self, data: Any, where: str, depth: int = 0) -> Any:
        if depth > self.max_depth:
            raise FileLimitError(f"{where}: values nested deeper than {self.max_depth} levels")
        kind_of = type(data)
        if data is None or kind_of is bool or kind_of is int or kind_of is str:
            return data
        if kind_of is float:
            if not math.isfinite(data):
                raise MalformedFileError(f"{where}: a non-finite number must be written as a tagged float")
            return data
        if kind_of is list or kind_of is tuple:  # a JSON array (a tuple when decoded by bounded_json)
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(data), "a list")
            return [self.value(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(data)]
        if not is_object(data):
            raise MalformedFileError(f"{where}: unexpected {kind_of.__name__}")
        kind = self._kind(data, where)
        if kind in _OPERAND_ONLY:
            raise MalformedFileError(f"{where}: a {kind!r} entry can only appear as an instruction operand")
        if kind == "tuple":
            items = self._items(data, where)
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(items), "a tuple")
            return tuple(self.value(item, f"{where}.items[{i}]", depth + 1) for i, item in enumerate(items))
        if kind == "dict":
            return self._dict(data, where, depth, self.value)
        if kind in ("set", "frozenset"):
            raw = self._items(data, where)
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(raw) + _DICT_BYTES + _ENTRY_BYTES * len(raw), "a set")
            items = [self.value(item, f"{where}.items[{i}]", depth + 1) for i, item in enumerate(raw)]
            try:
                return set(items) if kind == "set" else frozenset(items)
            except TypeError:
                raise MalformedFileError(f"{where}: a {kind} item is not hashable") from None
        if kind == "size":
            items = self._items(data, where)
            if not all(type(d) is int and 0 <= d < 2 ** 62 for d in items):
                raise MalformedFileError(f"{where}: a torch.Size holds non-negative integers only")
            self.charge(_LIST_BYTES + _ITEM_BYTES * len(items), "a torch.Size")
            return torch.Size(items)
        if kind == "float":
            text = data["value"]
            if text not in _NON_FINITE:
                raise MalformedFileError(f"{where}: a tagged float is \"nan\", \"inf\" or \"-inf\", got {text!r}")
            return _NON_FINITE[text]
        if kind == "complex":
            self.charge(_OBJECT_BYTES, "a complex number")
            return complex(self._real(data["real"], f"{where}.real"), self._real(data["imag"], f"{where}.imag"))
        if kind == "bytes":
            text = get_str(data, "hex", where)
            self.charge(_OBJECT_BYTES + len(text), "bytes")
            try:
                return bytes.fromhex(text)
            except ValueError:
                raise MalformedFileError(f"{where}.hex: not hexadecimal") from None
        if kind == "ellipsis":
            return Ellipsis
        if kind == "pyslice":
            self.charge(_OBJECT_BYTES, "a slice")
            return slice(*(self.value(data[key], f"{where}.{key}", depth + 1) for key in ("start", "stop", "step")))
        if kind == "torch":
            return resolve_torch_constant(data["name"], where)
        if kind == "device":
            text = get_str(data, "value", where)
            if not _DEVICE.match(text):
                raise MalformedFileError(f"{where}: {text[:40]!r} is not a device like 'cpu' or 'cuda:0'")
            self.charge(_OBJECT_BYTES, "a device")
            return torch.device(text)
        if kind == "callable":
            if self.resolver is None:
                raise UnsafeReferenceError(f"{where}: a callable ({data['name']!r}) is not allowed in this file; "
                                           "only plain values are")
            target = resolve_callable(data["name"], where)
            guarded = ATTRIBUTE_ACCESSORS.get(target) if _hashable(target) else None
            # getattr & co. passed around as values get their names checked at run time.
            return guarded[0] if guarded is not None else target
        return self.global_ref(data, where)

    def _real(self, data: Any, where: str) -> float:
        if type(data) is int or type(data) is float:
            return float(data)
        value = self.value(data, where) if is_object(data) else None
        if type(value) is not float:
            raise MalformedFileError(f"{where}: expected a number")
        return value

    def global_ref(self, data: dict, where: str) -> Any:
        if self.resolver is None:
            raise UnsafeReferenceError(f"{where}: a reference to code ({data.get('qualname')!r}) is not allowed in "
                                       "this file; only plain values are")
        namespace = get_str(data, "namespace", where, max_chars=_MAX_NAME)
        name = get_str(data, "name", where, max_chars=_MAX_NAME)
        kind = get_str(data, "type", where)
        qualname = get_str(data, "qualname", where, max_chars=_MAX_NAME)
        if kind not in GLOBAL_KINDS:
            raise MalformedFileError(f"{where}.type: {kind!r} is not one of {', '.join(GLOBAL_KINDS)}")
        if not _NAMESPACE.match(namespace):
            raise MalformedFileError(f"{where}.namespace: {namespace[:60]!r} is not a dotted module name")
        if not name:
            raise MalformedFileError(f"{where}.name: empty")
        problem = global_problem(qualname)
        if problem is not None:
            raise UnsafeReferenceError(f"{where}: {problem}; the file is refused and nothing was run")
        self.charge(_OBJECT_BYTES, "a reference")
        return self.resolver.resolve_global(namespace, name, kind, qualname, where)


# what decoded values take at most (CPython, 64-bit): a list, tuple or torch.Size with its spare
# slots and the list a generator builds it through, a dict or set and its table's growth, a small
# object with its attribute dict. Worst cases: an empty tuple costs nothing, but is charged as one
# that is not, so a file of a million tiny containers is refused whatever their contents.
_LIST_BYTES, _ITEM_BYTES = 128, 9
_DICT_BYTES, _ENTRY_BYTES = 184, 40
_OBJECT_BYTES = 128


def _no_charge(amount: int, what: str = "") -> None:
    pass


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_FILE_MODULES: dict[str, str] = {}


def module_for_file(filename: str) -> str:
    """The name of the loaded module whose source is `filename` ("" when none is), from sys.modules."""
    if not filename:
        return ""
    found = _FILE_MODULES.get(filename)
    if found is not None:
        return found
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType):
            path = module.__dict__.get("__file__")
            if isinstance(path, str) and path not in _FILE_MODULES:
                _FILE_MODULES[path] = name
    return _FILE_MODULES.setdefault(filename, "")
