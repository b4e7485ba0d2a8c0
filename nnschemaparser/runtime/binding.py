"""Binding call arguments to parameters as CPython does, with CPython's TypeError messages.

A frame-dict function (observed runs, closures) binds its arguments itself, so
a call with wrong arguments must fail exactly as the eager call would: the same checks in the same
order (keywords first, then too many positionals, then missing positionals, then missing keyword-
only arguments), and the same text, which names the function by its `__qualname__`
("Model.forward.<locals>.inner") and counts `self` for methods. `root_call` turns a root's input scope ({name: value}) into the
`(args, kwargs)` of the call `model(x, ...)` a user would write. `merge_kwargs` merges a call's
keywords with a `**mapping` as CPython does, with CPython's errors. `entry_signature` says which
parameters a call `module(...)` binds (a class's own `__call__`'s, else forward's), `eager_callee`
what eager calls for a sub-block call (to word a keyword error as CPython would).

Depends on torch's `nn.Module`, schema and errors only.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Optional

from torch import nn

from ..schema.errors import SchemaRunError
from ..schema.model import FunctionSchema, ModelBlockSchema

__all__ = ["entry_signature", "eager_callee", "bind_arguments", "binder", "block_qualname", "nested_qualname", "root_call", "live_signature",
           "merge_kwargs", "function_str", "INLINED_COMPREHENSIONS"]

INLINED_COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>")  # no scope of their own since 3.12 (PEP 709)
_COMPREHENSION_NAMES = {"<listcomp>": "<listcomp>", "<setcomp>": "<setcomp>", "<dictcomp>": "<dictcomp>",
                        "<gencomp>": "<genexpr>"}


def bind_arguments(qualname: str, schema: FunctionSchema, params: tuple, counts_self: bool, args: tuple,
                   kwargs: dict, defaults: dict) -> dict:
    """The frame of a call of `schema` with `args` / `kwargs`; raises CPython's TypeError on a mismatch."""
    frame: dict[str, Any] = dict(zip(params, args))
    if schema.vararg is not None:
        frame[schema.vararg] = tuple(args[len(params):])
    extra = {}
    for key, value in kwargs.items():
        if key in params or key in schema.kwonly:
            if key in frame:
                raise TypeError(f"{qualname}() got multiple values for argument '{key}'")
            frame[key] = value
        elif schema.kwarg is not None:
            extra[key] = value
        else:
            raise TypeError(f"{qualname}() got an unexpected keyword argument '{key}'")
    if schema.kwarg is not None:
        frame[schema.kwarg] = extra
    if len(args) > len(params) and schema.vararg is None:
        raise TypeError(_too_many_positional(qualname, schema, params, counts_self, len(args), defaults, frame))
    required = [p for p in params if p not in defaults]
    required_kwonly = [p for p in schema.kwonly if p not in defaults]
    for kind, names in (("positional", required), ("keyword-only", required_kwonly)):
        missing = [p for p in names if p not in frame]
        if missing:
            raise TypeError(_missing_message(qualname, kind, missing))
    for name in tuple(params) + tuple(schema.kwonly):
        if name not in frame:
            frame[name] = defaults[name]
    return frame


def binder(qualname: str, schema: FunctionSchema, params: tuple, counts_self: bool) -> Callable[[tuple, dict, dict], dict]:
    """`bind(args, kwargs, defaults)`: `bind_arguments` for `schema` with its plan worked out once.

    The names, their order and the frame built are `bind_arguments`'s; a call it cannot bind (a
    keyword given twice or unknown, too many positionals, a missing argument) is handed to
    `bind_arguments` itself, which raises CPython's TypeError.
    """
    names = frozenset(params) | frozenset(schema.kwonly)
    every = tuple(params) + tuple(schema.kwonly)
    vararg, kwarg = schema.vararg, schema.kwarg
    count = len(params)

    def bind(args: tuple, kwargs: dict, defaults: dict) -> dict:
        if len(args) > count and vararg is None:
            return bind_arguments(qualname, schema, params, counts_self, args, kwargs, defaults)
        frame: dict[str, Any] = dict(zip(params, args))
        if vararg is not None:
            frame[vararg] = tuple(args[count:])
        if kwarg is not None:
            extra = {}
            for key, value in kwargs.items():
                if key not in names:
                    extra[key] = value
                elif key in frame:
                    return bind_arguments(qualname, schema, params, counts_self, args, kwargs, defaults)
                else:
                    frame[key] = value
            frame[kwarg] = extra
        else:
            for key, value in kwargs.items():
                if key not in names or key in frame:
                    return bind_arguments(qualname, schema, params, counts_self, args, kwargs, defaults)
                frame[key] = value
        for name in every:
            if name not in frame:
                if name not in defaults:
                    return bind_arguments(qualname, schema, params, counts_self, args, kwargs, defaults)
                frame[name] = defaults[name]
        return frame

    return bind


def _too_many_positional(qualname: str, schema: FunctionSchema, params: tuple, counts_self: bool, given: int,
                         defaults: dict, frame: dict) -> str:
    offset = 1 if counts_self else 0  # a bound method counts `self`
    count, given = len(params) + offset, given + offset
    with_default = sum(1 for p in params if p in defaults)
    if with_default:
        sig, plural = f"from {count - with_default} to {count}", True
    else:
        sig, plural = str(count), count != 1
    kwonly_given = sum(1 for p in schema.kwonly if p in frame)
    kwonly = ""
    if kwonly_given:
        kwonly = (f" positional argument{'s' if given != 1 else ''} (and {kwonly_given} keyword-only "
                  f"argument{'s' if kwonly_given != 1 else ''})")
    verb = "was" if given == 1 and not kwonly_given else "were"
    return f"{qualname}() takes {sig} positional argument{'s' if plural else ''} but {given}{kwonly} {verb} given"


def _missing_message(qualname: str, kind: str, missing: list) -> str:
    """CPython's "f() missing 3 required positional arguments: 'a', 'b', and 'c'"."""
    names = [repr(m) for m in missing]
    if len(names) == 1:
        listed = names[0]
    elif len(names) == 2:
        listed = f"{names[0]} and {names[1]}"
    else:
        listed = ", ".join(names[:-2]) + f", {names[-2]}, and {names[-1]}"
    return f"{qualname}() missing {len(names)} required {kind} argument{'s' if len(names) > 1 else ''}: {listed}"


def block_qualname(block: ModelBlockSchema, fallback: str) -> str:
    """The `__qualname__` of the function a block runs ("Linear.forward", "Base.helper")."""
    key = block.method_name or "forward"
    if "." in key:  # a super() call: the key is already "Class.method"
        return key
    fn = getattr(type(block.module), key, None)
    fn = getattr(fn, "__func__", fn)
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return getattr(fn, "__qualname__", None) or fallback


def nested_qualname(outer_qualname: str, outer_name: str, outer_is_block: bool, name: str) -> str:
    """CPython's `__qualname__` of a closure, lambda or comprehension defined in function `outer_name`."""
    name = _COMPREHENSION_NAMES.get(name, name)
    if outer_is_block or outer_name not in _COMPREHENSION_NAMES:
        return f"{outer_qualname}.<locals>.{name}"
    if sys.version_info >= (3, 12) and outer_name in INLINED_COMPREHENSIONS:
        return f"{outer_qualname.rsplit('.', 1)[0]}.{name}"  # inlined: the enclosing function's scope
    return f"{outer_qualname}.{name}"  # a comprehension scope adds no `<locals>`


def live_signature(forward: Callable) -> Optional[FunctionSchema]:
    """The parameters of a live (bound) forward as a FunctionSchema without a body, or None."""
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    sig = FunctionSchema(name=getattr(forward, "__name__", "forward"))
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            sig.params.append(param.name)
        elif param.kind == param.VAR_POSITIONAL:
            sig.vararg = param.name
        elif param.kind == param.KEYWORD_ONLY:
            sig.kwonly.append(param.name)
        else:
            sig.kwarg = param.name
        if param.default is not param.empty:
            sig.defaults[param.name] = param.default
    return sig


def root_call(sig: Optional[FunctionSchema], scope: dict, label: str = "forward") -> tuple[tuple, dict]:
    """The `(args, kwargs)` of the call `model(...)` that `scope` stands for.

    Inputs are bound positionally, in the signature's order, as long as each parameter is given
    (a forward pre-hook then sees `args == (x,)`, as for `model(x)`); the rest are keywords. The
    `*args` of a forward are given under its name, as a tuple or list of the positional extras
    (`scope={"x": x, "args": (y, z)}` is `model(x, y, z)`); the parameters before it are then all
    passed positionally, their defaults filling the ones not given. Other names are keywords
    (`**kwargs` collects the ones forward does not name).
    """
    kwargs = dict(scope)
    if sig is None:
        return (), kwargs
    extras: tuple = ()
    if sig.vararg is not None and sig.vararg in kwargs:
        given = kwargs.pop(sig.vararg)
        if not isinstance(given, (tuple, list)):
            raise SchemaRunError(f"scope[{sig.vararg!r}] holds the positional extras of {label}(*{sig.vararg}); "
                                 f"give a tuple or list of them, e.g. {{{sig.vararg!r}: (y, z)}}, "
                                 f"not a {type(given).__name__}")
        extras = tuple(given)
    args = []
    for name in sig.params:
        if name in kwargs:
            args.append(kwargs.pop(name))
        elif extras:
            if name not in sig.defaults:
                raise SchemaRunError(f"scope gives *{sig.vararg} to {label} but not its input {name!r}, which comes "
                                     f"before it; pass scope={{{name!r}: ..., {sig.vararg!r}: (...)}}")
            args.append(sig.defaults[name])
        else:
            break
    return (*args, *extras), kwargs


def _collect(**kwargs: Any) -> dict:
    return kwargs


def function_str(x: Any) -> str:
    """How CPython names a callee in a call's TypeError (`_PyObject_FunctionStr`): `mod.qualname()`."""
    try:
        qualname = x.__qualname__
    except AttributeError:
        return str(x)
    module = getattr(x, "__module__", None)
    return f"{module}.{qualname}()" if module is not None and module != "builtins" else f"{qualname}()"


def merge_kwargs(kw: dict, extra: Any, callee: Callable[[], Any]) -> dict:
    """The keywords of `callee()(**kw, **extra)`, merged by CPython itself.

    A keyword given twice, a non-mapping after `**` or a key that is not a string raises the
    TypeError CPython raises for that call, worded with the callee's name as CPython words it.
    """
    try:
        return _collect(**kw, **extra)
    except TypeError as exc:
        text = str(exc)
        own = function_str(_collect)
        if not text.startswith(own):
            raise
        raise TypeError(function_str(callee()) + text[len(own):]) from None


def entry_signature(module: Any, forward_signature: Optional[FunctionSchema]) -> Optional[FunctionSchema]:
    """The parameters a call `module(...)` binds: those of the class's own `__call__` when it
    names some (PyG's `Aggregation.__call__(x, index, ...)`), else forward's (the schema's, or
    the live forward's when the block has none)."""
    if module is None:
        return forward_signature
    if type(module).__call__ is not nn.Module.__call__:
        own = live_signature(module.__call__)
        if own is not None and own.params:
            return own
    if forward_signature is None:
        return live_signature(module.forward)
    return forward_signature


def eager_callee(module: Any, method: Optional[str]) -> Any:
    """What eager calls for a sub-block call (the module, its method, or `super()`'s `Class.method`),
    read only to word a keyword error as CPython would."""
    if method is None or module is None:
        return module
    if "." in method:
        owner, name = method.rsplit(".", 1)
        for cls in type(module).__mro__:
            if cls.__name__ == owner and name in vars(cls):
                return getattr(cls, name).__get__(module)
        return module
    return getattr(module, method)
