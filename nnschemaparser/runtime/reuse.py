"""Reusing the calls of a recorded run: a patched run does not run the clean prefix again.

An activation-patching sweep runs the model once per site, each time the clean run with one value
replaced. Everything before that value is bound is the clean run again. The runtime keeps no frame
snapshots (a stepped run is a generator, and a fork reruns from scratch), so the saving is made at
calls, the places a run hands work to a callee and gets one value back: block calls, and calls of
Python functions (`create_causal_mask`, any `def` of a library or of the user's module; not the
package's own intrinsics, not builtins) made by the observed blocks' code.

- `CallReuse.mode = "record"`: every such call is numbered in call order (a call's number, then the
  numbers of the calls made inside it) and kept: the block or function, its arguments (frozen:
  runtime/reuse_values.py, each tensor with its version counter at the call) and what it returned.
  A function call that made recorded calls itself (a block's forward lent to live code) is kept
  for its numbering but never reused: a block it ran may hold the site to patch.
- `mode = "replay"`: until the caller says the first intervention has fired (`fired`), a call
  numbered `n` returns the recorded result of call `n` without running, when it is the same block
  or function object and every argument is the recorded one (`reuse_values.same`: tensors the same
  object at the same version or the same bits, numbers and strings equal, modules and functions the
  same object, other objects the same object with the same attributes, containers item by item).
  Anything the freezing cannot compare makes the call run. Calls inside a reused call are skipped
  with it (the numbering jumps past them). A block the caller names in `keep_out` (one that holds the
  site about to be patched) always runs.

A recorded call is never reused when it changed an argument in place (a tensor's version moved, a
container's items or an object's attributes changed) or returned anything but a tensor, a number, a
string, `None` or a tuple of those (a list or a dict the caller could change). A recorded result
whose version counter moved since (changed in place later in that run, or by a run it was handed
to) is not reused either. Function calls the recording saw change an argument are listed in
`changed_arguments` (the caller says so).

What a call writes outside its arguments is checked by the caller: for block calls, over the whole
recorded run (parameters, buffers, module attributes, the model's globals, the random generator:
`traces/patching.py` turns reuse off with the reason); for function calls, around each recorded call
by `CallReuse.watch(fn)`, a function the caller sets that returns the check to make after the call
(the globals the function can reach, its defaults and cells, the random generators: a list of what
was written). A function call that wrote anything is never reused and is listed in `impure`; a
recording whose `watch` is None reuses no function call.

Exactness: a reused call is one whose callee sees bit-identical arguments and the same module state,
and does not draw random numbers or write state, so running it would return those same bits.

The calls are intercepted by a `Program` subclass that wraps each invoker and hands the code
generator a wrapper for function calls (`function_through`): the observed program of a partly
observed pair (runtime/partial.py) whose other program is plain (no counter: the listeners of a
patched run number no steps). The same blocks are compiled plain as well (`ReusePrograms.fast`,
`run_plain`): a replay started with `patch_at=n, patch=fn` returns `fn(result)` from call number `n`
(when the run reaches it in line with the recording; `patched` says so) and needs no observer, so a
site that is what a block call returns is patched there at the speed of a plain run.

Depends on `program`, `listeners`, `interventions` and `reuse_values`.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any, Callable, Optional

from .interventions import intervention_listener
from .listeners import EventObserver, TraceListener
from .program import Program, programs_for
from .reuse_values import freeze, result_intact, result_state, same
from ..schema.model import ModelBlockSchema

__all__ = ["CallReuse", "ReusePrograms", "reuse_programs", "give_back_reuse", "run_reusing", "run_plain",
           "reusable_function"]

_OWN = __name__.split(".")[0] + "."  # the package's own functions (intrinsics) are never intercepted


def reusable_function(target: Any) -> bool:
    """Whether a call of `target` in generated code goes through `CallReuse.call_function`: a Python
    function (`def`, `lambda`) that is not the package's own."""
    return type(target) is types.FunctionType and not (getattr(target, "__module__", None) or "").startswith(_OWN)


def _label(key: Any) -> str:
    if isinstance(key, ModelBlockSchema):
        return key.path or key.name
    return f"{getattr(key, '__module__', '?')}.{getattr(key, '__qualname__', repr(key))}"


class _Call:
    __slots__ = ("key", "arguments", "result", "state", "end", "reusable")

    def __init__(self, key: Any, arguments: Any):
        self.key = key  # the block, or the function
        self.arguments = arguments
        self.result: Any = None
        self.state: Any = None
        self.end = 0
        self.reusable = arguments is not None


class CallReuse:
    """The calls of a recorded run and the rule that hands their results to a later run.

    `mode`: "off" (calls run), "record" (calls run and are kept, `calls` restarted by `start`) or
    "replay" (see the module docstring). In a replay, `keep_out(block)` says which blocks must run
    (those holding the site to patch) and the caller sets `fired = True` when the first intervention
    is applied: from then on every call runs. `reused` and `ran` count the replay's calls.
    `watch(fn)` (set by the caller; None: no function call is reused) is called before each function
    call of a recording and returns a function listing, after it, what the call wrote; `impure` and
    `changed_arguments` list `(function name, reasons)` and function names the recording refused.
    """

    def __init__(self) -> None:
        self.mode = "off"
        self.calls: list[_Call] = []
        self.next: Optional[int] = None
        self.fired = False
        self.keep_out: Callable[[ModelBlockSchema], bool] = lambda block: False
        self.reused = 0
        self.ran = 0
        self.memo: dict = {}
        self.watch: Optional[Callable[[Callable], Callable[[], list]]] = None
        self.impure: list[tuple[str, list]] = []
        self.changed_arguments: list[str] = []
        self.returned: Optional[int] = None  # record: the number of the block call that returned last
        self.returned_value: Any = None  # and what it returned
        self.patch_at: Optional[int] = None  # replay: the number of the call whose result `patch` replaces
        self.patch: Optional[Callable[[Any], Any]] = None
        self.patched = False
        self.root: Optional[weakref.ref] = None  # the schema's root (weakly: the cache of programs is keyed by it)

    def start(self, mode: str, keep_out: Optional[Callable[[ModelBlockSchema], bool]] = None,
              patch_at: Optional[int] = None, patch: Optional[Callable[[Any], Any]] = None) -> None:
        """Before a run: "record" forgets the calls kept so far; "replay" starts at call 0. `patch_at`,
        `patch`: in a replay, call number `patch_at` (reached in line with the recording) returns
        `patch(its result)` and fires (`patched` says whether it happened)."""
        if mode not in ("off", "record", "replay"):
            raise ValueError(f"mode must be 'off', 'record' or 'replay', got {mode!r}")
        self.mode = mode
        self.fired = self.patched = False
        self.patch_at, self.patch = patch_at, patch
        self.reused = self.ran = 0
        self.next = 0
        self.memo = {}
        self.keep_out = keep_out or (lambda block: False)
        if mode == "record":
            self.calls = []
            self.impure = []
            self.changed_arguments = []

    def forget(self) -> None:
        """Drop the recorded calls (and the values they hold)."""
        self.calls = []
        self.memo = {}
        self.mode = "off"
        self.watch = None
        self.impure = []
        self.changed_arguments = []
        self.patch = self.returned_value = None

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
                return self._record(block_ref(), invoke, args, kwargs, None)
            return self._replay(block_ref(), invoke, args, kwargs, True)

        return call

    def call_function(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """`fn(*args, **kwargs)`, recorded or answered from the recording (what generated code calls)."""
        mode = self.mode
        if mode == "off":
            return fn(*args, **kwargs)
        if mode == "replay" and (self.fired or self.next is None):
            self.ran += 1
            return fn(*args, **kwargs)
        invoke = lambda a, k: fn(*a, **k)  # noqa: E731
        if mode == "record":
            return self._record(fn, invoke, args, kwargs, self.watch)
        return self._replay(fn, invoke, args, kwargs, False)

    def _record(self, key: Any, invoke: Callable, args: Any, kwargs: dict, watch: Any) -> Any:
        try:
            arguments = (freeze(tuple(args)), freeze(dict(kwargs)))
        except TypeError:
            arguments = None
        function = not isinstance(key, ModelBlockSchema)
        entry = _Call(key, arguments if not function or watch is not None else None)
        number = len(self.calls)
        self.calls.append(entry)
        check = watch(key) if function and entry.reusable else None
        result = invoke(args, kwargs)
        entry.end = len(self.calls)
        if not function:
            self.returned, self.returned_value = number, result
        elif entry.end > number + 1:  # it ran blocks of the schema (lent forwards): one may hold a site
            entry.reusable = False
        if not entry.reusable:
            entry.arguments = None
            return result
        wrote = check() if check is not None else []
        if wrote:
            self.impure.append((_label(key), wrote))
            entry.reusable = False
        elif same(arguments[0], tuple(args), self.memo) and same(arguments[1], dict(kwargs), self.memo):
            try:
                entry.state = result_state(result)
                entry.result = result
            except TypeError:
                entry.reusable = False
        else:  # an argument changed in place during the call: running it again would do that again
            entry.reusable = False
            if function:
                self.changed_arguments.append(_label(key))
        if not entry.reusable:
            entry.arguments = None
        return result

    def _replay(self, key: Any, invoke: Callable, args: Any, kwargs: dict, is_block: bool) -> Any:
        n = self.next
        if self.fired or n is None or n >= len(self.calls):
            self.next = None
            self.ran += 1
            return invoke(args, kwargs)
        entry = self.calls[n]
        if entry.key is not key:  # the run took another way: nothing later lines up
            self.next = None
            self.ran += 1
            return invoke(args, kwargs)
        if n == self.patch_at:
            return self._patch(entry, invoke, args, kwargs)
        memo = self.memo
        if (entry.reusable and not (is_block and self.keep_out(key)) and result_intact(entry.result, entry.state)
                and same(entry.arguments[0], args if type(args) is tuple else tuple(args), memo)
                and same(entry.arguments[1], kwargs if type(kwargs) is dict else dict(kwargs), memo)):
            self.next = entry.end
            self.reused += 1
            return entry.result
        self.next = n + 1
        self.ran += 1
        result = invoke(args, kwargs)
        if self.next is not None:
            self.next = entry.end
        return result

    def _patch(self, entry: _Call, invoke: Callable, args: Any, kwargs: dict) -> Any:
        """The patched call: its result (recorded, when it may be handed out, else run) through `patch`."""
        memo = self.memo
        if (entry.reusable and result_intact(entry.result, entry.state) and same(entry.arguments[0], tuple(args), memo)
                and same(entry.arguments[1], dict(kwargs), memo)):
            self.reused += 1
            result = entry.result
        else:
            self.next = None
            self.ran += 1
            result = invoke(args, kwargs)
        self.fired = self.patched = True
        self.next = None
        return self.patch(result)


class _InterceptingProgram(Program):
    """A program (observed, or plain with `observer=None`) whose invokers, and calls of Python
    functions, go through a `CallReuse`."""

    def __init__(self, root: ModelBlockSchema, observer: Optional[EventObserver], reuse: CallReuse):
        super().__init__(root, observer, tensor_results=True)
        self.reuse = reuse

    def function_through(self, target: Any) -> Optional[Callable[[Callable, tuple, dict], Any]]:
        """What the code generator calls a function call through (`through(fn, args, kwargs)`), or None."""
        return self.reuse.call_function if reusable_function(target) else None

    def invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        invoke = self.invokers.get(id(block))
        if invoke is not None:
            return invoke
        invoke = self.invokers[id(block)] = self.reuse.wrap(block, super().invoker(block))
        return invoke


class ReusePrograms:
    """A partly observed pair (runtime/partial.py) whose observed program records or reuses calls."""

    __slots__ = ("observed", "observer", "plain", "fast", "blocks", "reuse", "busy")

    def __init__(self, root: ModelBlockSchema, blocks: frozenset):
        self.blocks = blocks
        self.reuse = CallReuse()
        self.reuse.root = weakref.ref(root)
        self.observer = EventObserver()
        self.observed = _InterceptingProgram(root, self.observer, self.reuse)
        self.plain = Program(root)  # no counter: what a patched run's listeners need is in the observed blocks
        observed, plain = self.observed, self.plain
        self.observed.elsewhere = lambda block: None if id(block) in blocks else plain
        self.plain.elsewhere = lambda block: observed if id(block) in blocks else None
        # the observed blocks compiled plain, their calls through `reuse` as well: a run patched by
        # `CallReuse.patch` needs no observer (`run_plain`)
        self.fast = _InterceptingProgram(root, None, self.reuse)
        self.fast.elsewhere = lambda block: None if id(block) in blocks else plain
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
    pair.busy = False


def run_plain(pair: ReusePrograms, scope: dict) -> Any:
    """Run the root on `scope` through `pair`'s plain intercepting program (its `reuse` set by the
    caller, a patch by `start(patch_at=, patch=)`); returns what forward returns."""
    try:
        return pair.fast.run_root(scope)
    finally:
        pair.reuse.mode = "off"


def run_reusing(pair: ReusePrograms, root: ModelBlockSchema, scope: dict, interventions: Any,
                listeners: tuple[TraceListener, ...] = ()) -> Any:
    """Run `root` on `scope` with `interventions` through `pair` (its `reuse` set by the caller);
    returns what forward returns. An intervention that changed nothing raises after the run. The
    listeners see the observed blocks' steps only (no `on_unobserved_counter`)."""
    intervening = intervention_listener(root, interventions, listeners) if interventions is not None else None
    every = [*listeners, intervening] if intervening is not None else list(listeners)
    try:
        pair.observer.configure(every)
        for listener in every:
            listener.on_run_start(root, scope)
        result = pair.observed.run_root(scope)
        for listener in every:
            listener.on_run_end(result)
    finally:
        pair.observer.reset()
        pair.observer.configure(())
        pair.reuse.mode = "off"
    if intervening is not None:
        intervening.finish()
    return result
