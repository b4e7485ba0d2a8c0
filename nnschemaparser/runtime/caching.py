"""Caching decorators around a schema: the real cache decides, the schema runs each miss.

A `functools.lru_cache` (or `functools.cache`) is C code holding the function it wraps; it cannot
be rebuilt around the schema as a Python decorator is (`functions.rebind_wrapper`), and a copy of
it would not be the user's cache. So the schema calls the real cache, and for the duration of that
call the wrapped function object carries a *trampoline* as its `__code__`: a code with the same free
variables whose one instruction calls a dispatcher. The dispatcher runs the schema's body when this
thread's schema call armed it (a miss: the cache calls the function), and the original code (a
clone of the function, same globals, defaults and closure) for any other caller or thread. Hits,
misses, `cache_info()` and what the cache keeps are what eager gives; the function gets its own
`__code__` back when the last schema call through it ends, also when the body raises, recursion
through the cache included.

Depends on nothing else of the package.
"""

from __future__ import annotations

import functools
import threading
import types
import warnings
import weakref
from typing import Any, Callable, Optional

__all__ = ["is_cache", "caches_inner", "CachedLevel", "original_code_of"]

_CACHE_TYPE = functools._lru_cache_wrapper
_SENTINEL = "__nnschemaparser_cache_dispatch__"
_LOCK = threading.RLock()
_LOCAL = threading.local()  # .armed: {id(function): what a miss runs now, on this thread}
# id(function) -> [function, its own code, its clone, schema calls under way]
_INSTALLED: dict[int, list] = {}
# function -> (its own code, its trampoline, its clone), kept while the function lives
_PREPARED: "weakref.WeakKeyDictionary[types.FunctionType, tuple]" = weakref.WeakKeyDictionary()


def is_cache(value: Any) -> bool:
    """True for a `functools.lru_cache` / `functools.cache` wrapper around a Python function."""
    return isinstance(value, _CACHE_TYPE) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType)


def caches_inner(value: Any, inner: Any) -> bool:
    """True when `value` is a cache of `inner` (a decorator's cell: diffusers' `lru_cache_unless_export`
    closes over both the function and its cache)."""
    return is_cache(value) and value.__wrapped__ is inner


def original_code_of(function: Any) -> Any:
    """The code `function` runs when no schema call goes through its cache (its own `__code__`)."""
    with _LOCK:
        entry = _INSTALLED.get(id(function))
        if entry is not None and entry[0] is function:
            return entry[1]
    return function.__code__


class CachedLevel:
    """The cache level of a rebuilt decorator chain: calls the real `cache`; a miss runs `body`
    (the schema, or the decorators inside the cache rebuilt around it) instead of the function's code."""

    __slots__ = ("cache", "body", "__weakref__")

    def __init__(self, cache: Any, body: Callable):
        self.cache = cache
        self.body = body

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return cached_call(self.cache, self.body, args, kwargs)

    def __getattr__(self, name: str) -> Any:  # cache_info(), cache_clear(), __wrapped__: the real cache's
        return getattr(self.cache, name)


def cached_call(cache: Any, body: Callable, args: tuple, kwargs: dict) -> Any:
    """`cache(*args, **kwargs)`, where a miss runs `body(*args, **kwargs)`."""
    function = cache.__wrapped__
    key = id(function)
    _install(function)
    armed = _armed()
    previous = armed.get(key)
    armed[key] = body
    try:
        return cache(*args, **kwargs)
    finally:
        if previous is None:
            armed.pop(key, None)
        else:
            armed[key] = previous
        _uninstall(function)


def _armed() -> dict:
    armed = getattr(_LOCAL, "armed", None)
    if armed is None:
        armed = _LOCAL.armed = {}
    return armed


def _install(function: types.FunctionType) -> None:
    with _LOCK:
        entry = _INSTALLED.get(id(function))
        if entry is not None:
            entry[3] += 1
            return
        code = function.__code__
        prepared = _PREPARED.get(function)
        if prepared is None or prepared[0] is not code or prepared[2].__defaults__ is not function.__defaults__ \
                or prepared[2].__kwdefaults__ is not function.__kwdefaults__:
            clone = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                                       function.__closure__)
            clone.__kwdefaults__ = function.__kwdefaults__
            clone.__qualname__ = function.__qualname__
            prepared = _PREPARED[function] = (code, _trampoline(code.co_freevars, _dispatcher(id(function), clone)),
                                              clone)
        _INSTALLED[id(function)] = [function, code, prepared[2], 1]
        function.__code__ = prepared[1]


def _uninstall(function: types.FunctionType) -> None:
    with _LOCK:
        entry = _INSTALLED[id(function)]
        entry[3] -= 1
        if entry[3] == 0:
            del _INSTALLED[id(function)]
            function.__code__ = entry[1]


def _dispatcher(key: int, clone: types.FunctionType) -> Callable[[tuple, dict], Any]:
    def dispatch(args: tuple, kwargs: dict) -> Any:
        armed = getattr(_LOCAL, "armed", None)
        body = armed.get(key) if armed else None
        if body is None:  # another caller, another thread, or live code the body called: the original
            return clone(*args, **kwargs)
        armed[key] = None  # consumed: a call the body makes live reaches the original code
        try:
            return body(*args, **kwargs)
        finally:
            armed[key] = body

    return dispatch


_TEMPLATES: dict[tuple, types.CodeType] = {}


def _trampoline(freevars: tuple, dispatch: Callable) -> types.CodeType:
    """A code with the free variables `freevars` (a function's `__code__` must keep its closure's
    count) that returns `dispatch(args, kwargs)`, `dispatch` held as a constant."""
    template = _TEMPLATES.get(freevars)
    if template is None:
        names = list(freevars)
        touch = f"            ({', '.join(names)},)\n" if names else ""
        source = (f"def _outer():\n"
                  + (f"    {' = '.join(names)} = None\n" if names else "")
                  + "    def trampoline(*args, **kwargs):\n"
                  + "        if False:\n" + (touch or "            pass\n")
                  + f"        return {_SENTINEL!r}(args, kwargs)\n"
                  + "    return trampoline\n")
        namespace: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # "'str' object is not callable": replaced below
            exec(compile(source, "<nnschemaparser cache trampoline>", "exec"), namespace)
        template = namespace["_outer"]().__code__
        assert template.co_freevars == tuple(freevars)
        _TEMPLATES[freevars] = template
    consts = tuple(dispatch if const == _SENTINEL else const for const in template.co_consts)
    return template.replace(co_consts=consts)

