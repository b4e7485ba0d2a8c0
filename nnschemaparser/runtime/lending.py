"""Schema forwards lent to modules while a run goes, so that live code reaching them is interpreted.

The parser's live-call detector (`coverage`) sees which interpreted modules live code called on
the example run: a library helper given a module or a bound method (`apply_chunking_to_forward`,
`torch.utils.checkpoint`), an attention processor object calling `attn.to_q`, an explicit
`lin.forward(x)`, a parametrization computing a weight. It marks their blocks `reached_live`
(a method a forward reads as a value, `self.feed_forward_chunk`, is marked by the lowering). For
the length of each run, `lending` puts a callable on each such instance, under `forward` (what
`Module._call_impl` calls, with the module's hooks) or the method's name (what `getattr(self,
name)` finds first), that runs the block's schema in the running program; afterwards every
instance attribute is as it was. Called on another thread (the model used eagerly while a stepped
run is paused there, or between its steps), a lent callable is the real forward or method. A live helper that called a
lent forward is counted in the program's `live_log` (coverage rows of kind "helper").

Depends on the schema and `coverage`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

from ..schema.model import ModelBlockSchema
from .coverage import LiveCall, describe_generated, generated_caller

__all__ = ["lending", "lent_values"]

try:  # a stepped run executes in a greenlet of the caller's thread: lent callables belong to it
    from greenlet import getcurrent as _current
except ImportError:  # pragma: no cover - greenlet comes with the package's dependencies
    _current = threading.get_ident


def lent_values(program: Any) -> list:
    """(module, attribute, schema callable) for each block live code reached at parse time
    (`reached_live`): a forward that library code calls through the module, or a method a
    forward passes as a value (`apply_chunking_to_forward(self.feed_forward_chunk, ...)`)."""
    lent = []
    for block in program.root.iter_blocks():
        if block.reached_live and block.skip_reason is None and block.module is not None:
            if block.method_name is None:
                lent.append((block.module, "forward", _lent_forward(program, block)))
            elif "." not in block.method_name and block.signature is not None:
                lent.append((block.module, block.method_name, _lent_method(program, block)))
    return lent


def _lent_forward(program: Any, block: ModelBlockSchema) -> Callable:
    """The instance `forward` a module gets while a run goes: `Module._call_impl` (with the
    module's hooks) calls it when live code (a library helper, a processor object) calls the
    module, and it runs the block's schema in this program, so the call is interpreted. Called on
    another thread (the model used eagerly while a stepped run is paused), it is the class forward."""
    direct = program._direct(block)
    module = block.module
    original = type(module).forward
    owner = _current
    log = program.live_log
    label = block.path

    def schema_forward(*args: Any, **kwargs: Any) -> Any:
        if owner() != schema_forward.thread:
            return original(module, *args, **kwargs)
        _note_live_caller(log, sys._getframe(), label, type(module).__qualname__)
        return direct(args, kwargs)

    schema_forward.thread = None
    schema_forward.schema_lent = True
    schema_forward.__wrapped__ = original.__get__(module)  # inspect.signature sees the forward's
    schema_forward.__name__ = getattr(original, "__name__", "forward")
    schema_forward.__qualname__ = getattr(original, "__qualname__", "forward")
    return schema_forward


def _lent_method(program: Any, block: ModelBlockSchema) -> Callable:
    """The bound method a forward reads as a value (`self.feed_forward_chunk`) while a run goes:
    calling it, from wherever, runs the method's schema (on another thread: the real method)."""
    module = block.module
    name = block.method_name
    original = block.function if block.function is not None else getattr(type(module), name)
    invoke_block = weakref.ref(block)
    owner = _current

    def schema_method(*args: Any, **kwargs: Any) -> Any:
        if owner() != schema_method.thread:
            return original(module, *args, **kwargs)
        return program.invoker(invoke_block())(args, kwargs)

    schema_method.thread = None
    schema_method.__wrapped__ = original.__get__(module)
    schema_method.__name__ = getattr(original, "__name__", name)
    schema_method.__qualname__ = getattr(original, "__qualname__", name)
    return schema_method


@contextlib.contextmanager

def lending(lent: list) -> Iterator[None]:
    """While the block runs, each (module, attribute, callable) of `lent` is on the instance."""
    if not lent:
        yield
        return
    absent = object()
    saved = []
    thread = _current()
    for module, attr, lent_value in lent:
        store = module.__dict__
        previous = store.get(attr, absent)
        if previous is not absent and getattr(previous, "__wrapped__", None) is None:
            continue  # a forward the user put on the instance: it runs, as in eager
        saved.append((store, attr, previous, lent_value, lent_value.thread))
        lent_value.thread = thread
        store[attr] = lent_value
    try:
        yield
    finally:
        for store, attr, previous, lent_value, old_thread in reversed(saved):
            lent_value.thread = old_thread
            if previous is absent:
                store.pop(attr, None)
            else:
                store[attr] = previous


def _note_live_caller(log: dict, frame: Any, module_path: str, module_type: str) -> None:
    """Count the live code (a helper, a processor object) that called the lent forward of `module_path`."""
    caller, between, _ = generated_caller(frame)
    if not between:
        return
    outer = between[-1]
    name = outer.f_globals.get("__name__", "")
    callee = f"{name}.{getattr(outer.f_code, 'co_qualname', outer.f_code.co_name)}"
    inner = between[0]
    inner_name = f"{inner.f_globals.get('__name__', '')}.{getattr(inner.f_code, 'co_qualname', inner.f_code.co_name)}"
    label, location = describe_generated(caller)
    key = ("callable", callee, label, location)
    entry = log.get(key)
    if entry is not None:
        entry.calls += 1
        return
    log[key] = LiveCall(module=None, module_type="", kind="callable", callee=callee,
                        via=inner_name if inner is not outer else "", block=label, location=location,
                        reason=(f"{callee} ran as one call (its own code is not interpreted); the module "
                                f"{module_path or '<root>'} ({module_type}) it called was interpreted"), key=key)
