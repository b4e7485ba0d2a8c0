"""What a parse's runs write outside the model's tensors and attributes, and putting it back.

A parse runs the forward several times (the resolution run, eager for verification, both again when
they differ). A forward can write Python state that `preserved_state` used to leave as the last
run left it: a module global it rebinds (`global CALLS; CALLS += 1`, a helper's `MODE = 2`), a
container a global holds (`REGISTRY.append(...)`), a class attribute (`Rotary._cache = ...`), a
mutable default object (`def forward(self, x, cache={})`) or a closure variable. Left changed,
each run starts where the one before stopped: the parse leaves the user's process changed, and
verification compares eager and the schema from different states, which skips a block that is in
fact exact.

`PythonState(model)` records, before a run, for every class in the model's modules' MROs (torch's
own and builtins' excepted):

- the module globals of the module defining it (a shallow copy of its dict, and of the contents
  of each dict, list, set or bytearray a global holds);
- its class dict (class attributes, not dunders);
- the default objects and closure cells of each function the class defines, of the functions its
  module defines and of the functions those cells hold (contents of mutable defaults, the object in
  each cell);

`PythonState.reached_by(fn)` records the same for one function instead of a model: the globals of
its module and of the modules of the functions its code names (followed through their names, up to
`_REACH` functions; torch's and builtins' out), the class dicts of the classes named, the defaults
and cells of each function reached (activation patching's check of a function call it would reuse,
traces/patching.py).

`PythonState(model, held=True)` and `reached_by` also fingerprint what those names hold, two levels
in (parser/held_objects.py: a counter on a module-level object, a deque, a `defaultdict`, a cache
dict on an object, a tensor changed in place), and `changed()` names each write into them
(`module.STATS.calls`, `module.CACHE[5]`). `add_namespace(space)` records one more module's
globals; `watching_run()` records, during a run, the globals of each module whose code the run
reaches, at its first call (a function found at run time in a registry, which no name leads to).
The parse does not ask for these (its runs only need `restore()`).

`restore()` puts back what changed: rebound names their old object, added names removed,
deleted ones restored, container contents their old items. It is shallow: a write inside an object
held by one of these (a dict inside a global dict, an attribute of a global instance) and the
globals of other modules (a library's own caches) are not put back; nor is what `held` sees deeper.

Depends on torch only.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
from typing import Any, Iterator, Optional

from torch import nn

from .held_objects import HeldObjects

__all__ = ["PythonState"]

_CONTAINERS = (dict, list, set, bytearray)
_MISSING = object()


def _contents(value: Any) -> Any:
    """A shallow copy of a container's items (the key for putting them back), or None."""
    kind = type(value)
    if kind is dict:
        return dict(value)
    if kind is list or kind is bytearray:
        return kind(value)
    if kind is set:
        return set(value)
    return None


def _differs(value: Any, items: Any) -> bool:
    """Whether a container's items are no longer the recorded ones (by identity, as `_put_back` compares)."""
    if type(value) is dict:
        return len(value) != len(items) or any(value.get(k, _MISSING) is not v for k, v in items.items())
    if type(value) is set:
        return len(value) != len(items) or not value.issuperset(items)
    return len(value) != len(items) or any(a is not b for a, b in zip(value, items))


def _put_back(value: Any, items: Any) -> None:
    """Give a container its recorded items again, when they changed (compared by identity: a value
    may be a tensor, whose `==` is elementwise)."""
    if not _differs(value, items):
        return
    if type(value) in (dict, set):
        value.clear()
        value.update(items)
    else:
        value[:] = items


def _own_classes(model: nn.Module) -> list[type]:
    """The classes whose code the model's forwards run: each module's MRO, torch's and builtins' out."""
    seen: dict[type, None] = {}
    for module in model.modules():
        for cls in type(module).__mro__:
            name = getattr(cls, "__module__", "") or ""
            if cls is object or name == "builtins" or name == "torch" or name.startswith("torch."):
                continue
            seen.setdefault(cls, None)
    return list(seen)


class PythonState:
    """The Python state a forward of `model` can write, recorded now; `restore()` puts it back."""

    def __init__(self, model: nn.Module, held: bool = False) -> None:
        self.held: Optional[HeldObjects] = HeldObjects() if held else None
        self.unwatched: list[str] = []  # modules `watching_run` could not record, said by `changed()`
        self.namespaces: list[tuple[dict, dict, list]] = []  # (dict, its copy, [(container, items)])
        self.classes: list[tuple[type, dict]] = []
        self.defaults: list[tuple[Any, list]] = []  # (container, items)
        self.cells: list[tuple[Any, Any]] = []  # (cell, object)
        self.seen_functions: set[int] = set()
        seen_spaces: set[int] = set()
        for cls in _own_classes(model):
            module = sys.modules.get(getattr(cls, "__module__", "") or "")
            space = getattr(module, "__dict__", None)
            if isinstance(space, dict) and id(space) not in seen_spaces:
                seen_spaces.add(id(space))
                held = [(value, items) for value in space.values()
                        if (items := _contents(value)) is not None]
                self.namespaces.append((space, dict(space), held))
                self._hold_space(space)
                for value in list(space.values()):  # the module's own functions (helpers the forward calls)
                    if isinstance(value, types.FunctionType) and value.__module__ == cls.__module__:
                        self._function(value)
            attrs = {k: v for k, v in vars(cls).items() if not (k.startswith("__") and k.endswith("__"))}
            self.classes.append((cls, attrs))
            self._hold_class(cls, attrs)
            for value in attrs.values():
                self._function(value)

    @classmethod
    def empty(cls, held: bool = True) -> "PythonState":
        """A state with nothing recorded yet (`add_namespace`, `watching_run` add to it)."""
        state = cls.__new__(cls)
        state.namespaces, state.classes, state.defaults, state.cells = [], [], [], []
        state.seen_functions = set()
        state.held = HeldObjects() if held else None
        state.unwatched = []
        return state

    @classmethod
    def reached_by(cls, fn: Any) -> "PythonState":
        """The Python state `fn`'s call can write through the names its code (and the code of the
        functions those names hold, transitively) reads; see the module docstring."""
        state = cls.empty()
        spaces: set[int] = set()
        todo, seen, classes = [fn], set(), set()
        while todo and len(seen) < _REACH:
            value = todo.pop()
            if not isinstance(value, types.FunctionType) or id(value) in seen or _foreign(value):
                continue
            if isinstance(getattr(value, "__wrapped__", None), types.FunctionType):  # a decorated function
                todo.append(value.__wrapped__)
            seen.add(id(value))
            state._function_parts(value)
            space = value.__globals__
            if id(space) not in spaces:
                spaces.add(id(space))
                held = [(item, items) for item in space.values() if (items := _contents(item)) is not None]
                state.namespaces.append((space, dict(space), held))
                state._hold_space(space)
            for name in _names(value.__code__):
                named = space.get(name, _MISSING)
                if isinstance(named, type) and not _foreign(named) and named not in classes:
                    classes.add(named)
                    attrs = {k: v for k, v in vars(named).items() if not (k.startswith("__") and k.endswith("__"))}
                    state.classes.append((named, attrs))
                    state._hold_class(named, attrs)
                    todo.extend(v.__func__ if isinstance(v, (staticmethod, classmethod)) else v for v in attrs.values())
                elif isinstance(named, types.FunctionType):
                    todo.append(named)
            todo.extend(_cell_value(cell) for cell in value.__closure__ or ())
        return state

    def add_namespace(self, space: dict) -> None:
        """Record one more module's globals (and, with `held`, what they hold)."""
        held = [(item, items) for item in space.values() if (items := _contents(item)) is not None]
        self.namespaces.append((space, dict(space), held))
        self._hold_space(space)

    @contextlib.contextmanager
    def watching_run(self) -> Iterator[None]:
        """While the `with` block runs, record the globals of each module whose code it runs, at the
        first call into that module (before that code writes anything): state written by code the
        model reaches at run time (a function found in a registry, a helper of a module run as is),
        which no name in the model's code leads to. torch's, the standard library's, builtins' and
        this package's modules are left out, and so is code run by the garbage collector's callbacks
        (`gc.callbacks`). A trace function does it (CPython calls it for each new
        Python frame only, never for C calls); a tracer already set (a debugger, coverage.py) is
        called as before and its local tracer kept."""
        known = {id(space) for space, _, _ in self.namespaces}
        previous = sys.gettrace()
        add = self.add_namespace
        # the garbage collector's callbacks (gc.callbacks: a profiler's timer, hypothesis's) run inside
        # the run whenever a collection starts or stops, but are no code of the model's
        collector = {code for code in map(_code_of, gc.callbacks) if code is not None}

        def trace(frame: Any, event: str, arg: Any) -> Any:
            space = frame.f_globals
            if id(space) not in known and not (collector and _called_by(frame, collector)):
                known.add(id(space))
                if _watched_module(space.get("__name__")):
                    try:
                        add(space)
                    except Exception as exc:  # never into the run: `changed()` says it was not watched
                        self.unwatched.append(f"the globals of {space.get('__name__')} could not be watched "
                                              f"({type(exc).__name__}: {exc})")
            return previous(frame, event, arg) if previous is not None else None

        sys.settrace(trace)
        try:
            yield
        finally:
            sys.settrace(previous)

    def _function(self, value: Any) -> None:
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        while isinstance(getattr(value, "__wrapped__", None), types.FunctionType):  # a decorated method
            self._function_parts(value)
            value = value.__wrapped__
        self._function_parts(value)

    def _function_parts(self, fn: Any) -> None:
        if not isinstance(fn, types.FunctionType) or id(fn) in self.seen_functions:
            return
        self.seen_functions.add(id(fn))
        code, held = fn.__code__, self.held
        if fn.__defaults__ or fn.__kwdefaults__:
            positional = code.co_varnames[:code.co_argcount][code.co_argcount - len(fn.__defaults__ or ()):]
            for name, value in [*zip(positional, fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).items()]:
                items = _contents(value)
                if items is not None:
                    self.defaults.append((value, items))
                if held is not None:
                    held.add(f"{fn.__module__}.{fn.__qualname__}'s default {name}", value)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            value = _cell_value(cell)
            self.cells.append((cell, value))
            if held is not None and value is not _MISSING:
                held.add(f"{fn.__module__}.{fn.__qualname__}'s closure variable {name}", value)
            self._function(value)  # a helper defined beside the class: its own cells and defaults

    def _hold_space(self, space: dict) -> None:
        """Fingerprint what a module's globals hold (dunders such as `__builtins__` aside)."""
        if self.held is None:
            return
        self.held.add_names(space.get("__name__", "a module"), list(space.items()))

    def _hold_class(self, cls: type, attrs: dict) -> None:
        if self.held is not None:
            self.held.add_names(f"{getattr(cls, '__module__', '?')}.{cls.__qualname__}", attrs.items())

    def changed(self) -> list[str]:
        """What differs from the recorded state, one phrase each (nothing is put back)."""
        out: list[str] = []
        for space, before, held in self.namespaces:
            where = space.get("__name__", "a module")
            out += [f"global {key!r} of {where} added" for key in space if key not in before]
            out += [f"global {key!r} of {where} rebound" for key, value in before.items()
                    if space.get(key, _MISSING) is not value]
            if self.held is None:  # else named below, with what is held deeper
                out += [f"the items of a {type(value).__name__} held by {where} changed" for value, items in held
                        if _differs(value, items)]
        for cls, attrs in self.classes:
            now = {k: v for k, v in vars(cls).items() if not (k.startswith("__") and k.endswith("__"))}
            out += [f"class attribute {cls.__name__}.{key} written" for key in now.keys() | attrs.keys()
                    if now.get(key, _MISSING) is not attrs.get(key, _MISSING)]
        if self.held is None:
            out += [f"a mutable default ({type(value).__name__}) changed" for value, items in self.defaults
                    if _differs(value, items)]
        out += ["a closure variable rebound" for cell, value in self.cells if _cell_value(cell) is not value]
        return out + (self.held.changed() if self.held is not None else []) + self.unwatched

    def restore(self) -> None:
        """Put back every recorded name, class attribute, container's items and cell."""
        for space, before, held in self.namespaces:
            for key in [k for k in space if k not in before]:
                del space[key]
            for key, value in before.items():
                if space.get(key, _MISSING) is not value:
                    space[key] = value
            for value, items in held:
                _put_back(value, items)
        for cls, attrs in self.classes:
            now = {k for k in vars(cls) if not (k.startswith("__") and k.endswith("__"))}
            for key in now - attrs.keys():
                delattr(cls, key)
            for key, value in attrs.items():
                if vars(cls).get(key, _MISSING) is not value:
                    setattr(cls, key, value)
        for value, items in self.defaults:
            _put_back(value, items)
        for cell, value in self.cells:
            now = _cell_value(cell)
            if now is value:
                continue
            if value is _MISSING:
                del cell.cell_contents
            else:
                cell.cell_contents = value


_REACH = 256  # functions followed from one function (the state check of a call stays bounded)


def _foreign(value: Any) -> bool:
    """torch's and builtins' own code, whose module state is not the model's."""
    name = getattr(value, "__module__", "") or ""
    return name == "builtins" or name == "torch" or name.startswith("torch.")


_PACKAGE = __name__.split(".")[0]


def _watched_module(name: Any) -> bool:
    """Whether a module's globals are the user's or a library's state (not torch's, the standard
    library's, builtins' or this package's; generated code, whose globals have no `__name__`, is out)."""
    if type(name) is not str:
        return False
    top = name.split(".")[0]
    return top not in ("torch", "builtins", _PACKAGE) and top not in sys.stdlib_module_names


def _names(code: Any) -> list[str]:
    """The global names a code object and the code nested in it (comprehensions, closures) read."""
    out, todo = [], [code]
    while todo:
        current = todo.pop()
        out.extend(current.co_names)
        todo.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return out


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _code_of(callback: Any) -> Optional[types.CodeType]:
    """The code object a callable runs first (a function's, a bound method's), or None."""
    callback = getattr(callback, "__func__", callback)
    return getattr(callback, "__code__", None)


def _called_by(frame: Any, codes: set) -> bool:
    """Whether `frame` runs inside a call of one of `codes` (itself, or a frame below it)."""
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
