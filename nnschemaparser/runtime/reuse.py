"""Reusing the block calls of a recorded run: a patched run does not run the clean prefix again.

An activation-patching sweep runs the model once per site, each time the clean run with one value
replaced. Everything before that value is bound is the clean run again. The runtime keeps no frame
snapshots (a stepped run is a generator, and a fork reruns from scratch), so the saving is made at
block calls, the one place a run hands work to a callee and gets one value back:

- `CallReuse.mode = "record"`: every block call the observed blocks make is numbered in call order
  (a call's number, then the numbers of the calls made inside it) and kept: the block, its
  arguments (each tensor with its version counter at the call) and what it returned.
- `mode = "replay"`: until the caller says the first intervention has fired (`fired`), a call
  numbered `n` returns the recorded result of call `n` without running, when it is the same block
  and every argument is the recorded one: a tensor is the same object still at its recorded version,
  or one of the same type, dtype, shape, strides and device with the same bits; a number, string,
  `None`, dtype or device is of the same type and equal (floats bit for bit); a module, function or
  class is the same object; tuples, lists and dicts are compared item by item. Anything else (a
  cache object, an instance of a user class) makes the call run. Calls inside a reused call are
  skipped with it (the numbering jumps past them). A block the caller names in `keep_out` (one
  that holds the site about to be patched) always runs.

A recorded call is never reused when it changed an argument in place (a tensor's version moved, a
list or dict's items changed) or returned anything but a tensor, a number, a string, `None` or a
tuple of those (a list or a dict the caller could change). A recorded result whose version counter
moved since (changed in place later in that run, or by a run it was handed to) is not reused either.
What the recorded run wrote outside its arguments (parameters, buffers, module attributes, globals,
the random generator) is the caller's to check before it enables a replay: `traces/patching.py`
does, and turns reuse off with the reason when the model writes state or draws random numbers.

Exactness: a reused call is one whose callee sees bit-identical arguments and the same module state,
and does not draw random numbers or write state, so running it would return those same bits.

The calls are intercepted by a `Program` subclass that wraps each invoker (the observed program of a
partly observed pair, runtime/partial.py: the blocks a site can be in run observed, the others plain).

Depends on `program`, `listeners` and `interventions`.
"""

from __future__ import annotations

import math
import threading
import types
import weakref
from enum import Enum
from typing import Any, Callable, Optional

import torch
from torch import nn

from .interventions import intervention_listener
from .listeners import EventObserver, TraceListener
from .program import Program, programs_for
from ..schema.model import ModelBlockSchema

__all__ = ["CallReuse", "ReusePrograms", "reuse_programs", "give_back_reuse", "run_reusing"]

_PRIMITIVE = (type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.Size)
_BY_IDENTITY = (nn.Module, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, Enum)
_UNSUPPORTED = "an argument or result the reuse cannot compare or hand out again"
_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _freeze(value: Any) -> Any:
    """What is recorded of an argument: tensors with their versions, containers item by item."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested:
            raise TypeError(_UNSUPPORTED)
        return ("t", value, value._version)
    kind = type(value)
    if kind in _PRIMITIVE or kind is float:
        return ("v", value)
    if isinstance(value, _BY_IDENTITY):
        return ("o", value)
    if kind is tuple or kind is list:
        return (kind, tuple(_freeze(item) for item in value))
    if kind is dict:
        return (dict, tuple((key, _freeze(item)) for key, item in value.items()))
    raise TypeError(_UNSUPPORTED)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same type, dtype, shape, strides, device and bits (NaNs and signed zeros as stored)."""
    if (type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride()
            or a.device != b.device or a.requires_grad != b.requires_grad or a.layout != b.layout):
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        as_int = _INT_OF_SIZE.get(a.element_size())
        if as_int is None:
            return False
        a, b = a.view(as_int), b.view(as_int)
    return torch.equal(a, b)


def _same(frozen: Any, value: Any) -> bool:
    """Whether `value` is what `frozen` recorded (see the module docstring)."""
    tag = frozen[0]
    if tag == "t":
        recorded, version = frozen[1], frozen[2]
        if recorded._version != version:  # changed in place since: it no longer holds what was passed
            return False
        if value is recorded:
            return True
        return isinstance(value, torch.Tensor) and _bits_equal(value, recorded)
    if tag == "v":
        recorded = frozen[1]
        if type(value) is not type(recorded):
            return False
        if type(value) is float:
            return value == recorded and math.copysign(1.0, value) == math.copysign(1.0, recorded)
        return value == recorded
    if tag == "o":
        return value is frozen[1]
    if type(value) is not tag:
        return False
    items = frozen[1]
    if tag is dict:
        return len(value) == len(items) and all(key in value and _same(item, value[key]) for key, item in items)
    return len(value) == len(items) and all(_same(item, part) for item, part in zip(items, value))


def _result_state(value: Any) -> Any:
    """The versions of a result that may be handed out again (a tensor, a primitive, a tuple of those)."""
    if isinstance(value, torch.Tensor):
        return value._version
    if type(value) in _PRIMITIVE or type(value) is float:
        return None
    if type(value) is tuple:
        return tuple(_result_state(item) for item in value)
    raise TypeError(_UNSUPPORTED)


def _result_intact(value: Any, state: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value._version == state
    if type(value) is tuple:
        return all(_result_intact(item, part) for item, part in zip(value, state))
    return True


class _Call:
    __slots__ = ("block", "arguments", "result", "state", "end", "reusable")

    def __init__(self, block: ModelBlockSchema, arguments: Any):
        self.block = block
        self.arguments = arguments
        self.result: Any = None
        self.state: Any = None
        self.end = 0
        self.reusable = arguments is not None


class CallReuse:
    """The block calls of a recorded run and the rule that hands their results to a later run.

    `mode`: "off" (calls run), "record" (calls run and are kept, `calls` restarted by `start`) or
    "replay" (see the module docstring). In a replay, `keep_out(block)` says which blocks must run
    (those holding the site to patch) and the caller sets `fired = True` when the first intervention
    is applied: from then on every call runs. `reused` and `ran` count the replay's calls.
    """

    def __init__(self) -> None:
        self.mode = "off"
        self.calls: list[_Call] = []
        self.next: Optional[int] = None
        self.fired = False
        self.keep_out: Callable[[ModelBlockSchema], bool] = lambda block: False
        self.reused = 0
        self.ran = 0
        self.root: Optional[weakref.ref] = None  # the schema's root (weakly: the cache of programs is keyed by it)

    def start(self, mode: str, keep_out: Optional[Callable[[ModelBlockSchema], bool]] = None) -> None:
        """Before a run: "record" forgets the calls kept so far; "replay" starts at call 0."""
        if mode not in ("off", "record", "replay"):
            raise ValueError(f"mode must be 'off', 'record' or 'replay', got {mode!r}")
        self.mode = mode
        self.fired = False
        self.reused = self.ran = 0
        self.next = 0
        self.keep_out = keep_out or (lambda block: False)
        if mode == "record":
            self.calls = []

    def forget(self) -> None:
        """Drop the recorded calls (and the values they hold)."""
        self.calls = []
        self.mode = "off"

    def wrap(self, block: ModelBlockSchema, invoke: Callable[[Any, dict], Any]) -> Callable[[Any, dict], Any]:
        """The invoker of `block` that records or reuses its calls (the root's is left as it is). It holds
        the block weakly, as programs do, so a dropped schema is freed with its cached programs."""
        if self.root is not None and block is self.root():
            return invoke
        block_ref = weakref.ref(block)

        def call(args: Any, kwargs: dict) -> Any:
            mode = self.mode
            if mode == "off":
                return invoke(args, kwargs)
            if mode == "record":
                return self._record(block_ref(), invoke, args, kwargs)
            return self._replay(block_ref(), invoke, args, kwargs)

        return call

    def _record(self, block: ModelBlockSchema, invoke: Callable, args: Any, kwargs: dict) -> Any:
        try:
            arguments = (_freeze(tuple(args)), _freeze(dict(kwargs)))
        except TypeError:
            arguments = None
        entry = _Call(block, arguments)
        self.calls.append(entry)
        result = invoke(args, kwargs)
        entry.end = len(self.calls)
        if entry.reusable and _same(arguments[0], tuple(args)) and _same(arguments[1], dict(kwargs)):
            try:
                entry.state = _result_state(result)
                entry.result = result
            except TypeError:
                entry.reusable = False
        else:  # an argument changed in place during the call: running it again would do that again
            entry.reusable = False
            entry.arguments = None
        return result

    def _replay(self, block: ModelBlockSchema, invoke: Callable, args: Any, kwargs: dict) -> Any:
        n = self.next
        if self.fired or n is None or n >= len(self.calls):
            self.next = None
            self.ran += 1
            return invoke(args, kwargs)
        entry = self.calls[n]
        if entry.block is not block:  # the run took another way: nothing later lines up
            self.next = None
            self.ran += 1
            return invoke(args, kwargs)
        if (entry.reusable and not self.keep_out(block) and _result_intact(entry.result, entry.state)
                and _same(entry.arguments[0], tuple(args)) and _same(entry.arguments[1], dict(kwargs))):
            self.next = entry.end
            self.reused += 1
            return entry.result
        self.next = n + 1
        self.ran += 1
        result = invoke(args, kwargs)
        if self.next is not None:
            self.next = entry.end
        return result


class _InterceptingProgram(Program):
    """An observed program whose invokers go through a `CallReuse`."""

    def __init__(self, root: ModelBlockSchema, observer: EventObserver, reuse: CallReuse):
        super().__init__(root, observer, tensor_results=True)
        self.reuse = reuse

    def invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        invoke = self.invokers.get(id(block))
        if invoke is not None:
            return invoke
        invoke = self.invokers[id(block)] = self.reuse.wrap(block, super().invoker(block))
        return invoke


class ReusePrograms:
    """A partly observed pair (runtime/partial.py) whose observed program records or reuses calls."""

    __slots__ = ("observed", "observer", "counted", "counter", "blocks", "reuse", "busy")

    def __init__(self, root: ModelBlockSchema, blocks: frozenset):
        self.blocks = blocks
        self.counter = [0]
        self.reuse = CallReuse()
        self.reuse.root = weakref.ref(root)
        self.observer = EventObserver()
        self.observed = _InterceptingProgram(root, self.observer, self.reuse)
        self.counted = Program(root, counter=self.counter)
        observed, counted = self.observed, self.counted
        self.observed.elsewhere = lambda block: None if id(block) in blocks else counted
        self.counted.elsewhere = lambda block: observed if id(block) in blocks else None
        self.busy = False


_KEY = "reuse"
_LOCK = threading.Lock()


def reuse_programs(root: ModelBlockSchema, blocks: Optional[frozenset]) -> ReusePrograms:
    """A free pair observing `blocks` (None: every block), compiled once per schema and set of blocks;
    give it back with `give_back_reuse` (which forgets its recorded calls)."""
    if blocks is None:
        blocks = frozenset(id(b) for b in root.iter_blocks())
    blocks = blocks | {id(root)}
    with _LOCK:
        cache = programs_for(root).setdefault(_KEY, {})
        pair: Optional[ReusePrograms] = cache.get(blocks)
        if pair is not None and not pair.busy:
            pair.busy = True
            return pair
    fresh = ReusePrograms(root, blocks)
    fresh.busy = True
    with _LOCK:
        if blocks not in cache and len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache.setdefault(blocks, fresh)
    return fresh


def give_back_reuse(pair: ReusePrograms) -> None:
    pair.reuse.forget()
    pair.observer.reset()
    pair.observer.configure(())
    pair.counter[0] = 0
    pair.busy = False


def run_reusing(pair: ReusePrograms, root: ModelBlockSchema, scope: dict, interventions: Any,
                listeners: tuple[TraceListener, ...] = ()) -> Any:
    """Run `root` on `scope` with `interventions` through `pair` (its `reuse` set by the caller);
    returns what forward returns. An intervention that changed nothing raises after the run."""
    intervening = intervention_listener(root, interventions, listeners) if interventions is not None else None
    every = [*listeners, intervening] if intervening is not None else list(listeners)
    try:
        pair.observer.configure(every)
        for listener in every:
            listener.on_unobserved_counter(pair.counter)
            listener.on_run_start(root, scope)
        result = pair.observed.run_root(scope)
        for listener in every:
            listener.on_run_end(result)
    finally:
        pair.observer.reset()
        pair.observer.configure(())
        pair.counter[0] = 0
        pair.reuse.mode = "off"
    if intervening is not None:
        intervening.finish()
    return result
