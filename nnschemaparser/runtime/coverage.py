"""What ran outside the schema: a detector of live calls, independent of the lowering.

The lowering knows what it could not lower (a skipped block); it cannot know what it *missed*: a
library helper that receives a bound method and calls it, an attention processor object calling a
module's children, a decorator dispatching to another implementation, a parametrization computing a
weight when it is read. `LiveCallDetector` finds all of them the same way, from the code objects of
the model's own forwards: while it is active (a trace function on the running thread), any
execution of a module's *original* forward code is a live call, since an interpreted forward runs
generated code, never the original. For each such call it records the module, the generated frame
that led to it (block path, instruction, file:line) and the non-module code in between (the helper
that made the call), and counts repeats.

The program adds what it knows without a profile hook (`Program.live_log`): a skipped block called,
a lent forward reached from live code (see `program.Program.lending`).

Depends on the schema and `functions` (to read generated frames).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from torch import nn

from ..schema.model import ModelBlockSchema
from .caching import original_code_of
from .functions import META_KEY, FunctionMeta, is_rebound
from .reached import how_reached

__all__ = ["LiveCall", "LiveCallDetector", "active_detector", "dispatched_calls", "original_code", "merge_live_calls", "COVERAGE_COLUMNS",
           "generated_caller", "forward_code", "module_forward_codes"]

from ..schema.model import COVERAGE_COLUMNS  # noqa: E402  (the columns of `coverage()`, in order)

# What a decorator that returns a value it keeps may call: nn.Module's attribute access, and the
# program's runners (which enter the schema, counted apart).
_ACCESS_FILES = ("torch/nn/modules/module.py", "nnschemaparser/runtime/")
# Frames of torch's own call machinery, never "the helper that made the call".
_PLUMBING_FILES = ("torch/nn/modules/module.py", "torch/nn/utils/parametrize.py", "torch/_dynamo", "torch/_compile.py",
                   "torch/utils/_contextlib.py", "contextlib.py", "nnschemaparser/runtime/")


@dataclass
class LiveCall:
    """One region that ran outside the schema, and how many times.

    `kind`: "module" (a module's original forward ran), "callable" (non-module code a forward
    called reached interpreted modules: its own code ran as one call), "dispatch" (a decorator
    around an interpreted forward called something other than the schema), "replaced" (a forward
    replaced on the instance after parsing ran), "cached" (a miss of a `functools.lru_cache` the
    schema called in a form it does not interpret: the cached body ran live; `via` names the cache;
    a cached method or global called by name runs its body interpreted, `runtime.caching`). `module` is the module's path in the model ("" for
    the root, None when the module is not part of the schema), `via` the non-module function that
    called it (e.g. `transformers.pytorch_utils.apply_chunking_to_forward`), `block` and `location`
    where the schema made the call that led there. `phase` is "forward", or "backward" for what
    autograd ran while gradients were computed (a checkpoint's recomputation, an adjoint solve).
    """

    module: Optional[str]
    module_type: str
    kind: str
    callee: str
    via: str
    block: str
    location: str
    reason: str
    calls: int = 1
    phase: str = "forward"
    key: tuple = field(default=(), repr=False, compare=False)

    def as_row(self) -> dict:
        return {name: getattr(self, name) for name in COVERAGE_COLUMNS}


def original_code(function: Any) -> Optional[Any]:
    """The code object a (possibly decorated) Python function finally runs."""
    seen = 0
    while isinstance(function, types.FunctionType) and "__wrapped__" in function.__dict__ and seen < 16:
        function = function.__dict__["__wrapped__"]
        seen += 1
    function = getattr(function, "__func__", function)
    if isinstance(function, types.FunctionType):
        return original_code_of(function)  # its own code, also while a schema call through its cache runs
    return getattr(function, "__code__", None)


def _qualname(code: Any, frame: Any) -> str:
    module = frame.f_globals.get("__name__", "")
    name = getattr(code, "co_qualname", code.co_name)
    return f"{module}.{name}" if module else name


def _is_plumbing(code: Any) -> bool:
    filename = code.co_filename.replace("\\", "/")
    return any(part in filename for part in _PLUMBING_FILES)


def generated_caller(frame: Any, stop_codes: frozenset = frozenset()) -> tuple[Optional[Any], list, bool]:
    """(the nearest generated frame above `frame`, the non-plumbing frames in between (outermost
    last), True when one of them runs a code of `stop_codes`)."""
    between = []
    nested = False
    current = frame.f_back
    while current is not None:
        meta = current.f_globals.get(META_KEY)
        if isinstance(meta, FunctionMeta):
            return current, between, nested
        code = current.f_code
        if code in stop_codes:
            nested = True
        if not _is_plumbing(code):
            between.append(current)
        current = current.f_back
    return None, between, nested


def describe_generated(frame: Optional[Any]) -> tuple[str, str]:
    """(block label, "file:line") of the instruction a generated frame is executing."""
    while frame is not None and not isinstance(frame.f_globals.get(META_KEY), FunctionMeta):
        frame = frame.f_back  # up to the nearest generated frame
    if frame is None:
        return "", ""
    meta = frame.f_globals.get(META_KEY)
    block = meta.block_ref() if meta.block_ref is not None else None
    label = ""
    if block is not None:
        label = block.path or block.name
        if block.method_name:
            label = f"{label}.{block.method_name}" if block.path else block.method_name
    instrs = meta.at(frame.f_code, frame.f_lasti)
    location = ""
    for instr in instrs:
        if instr.location is not None:
            location = f"{instr.location.filename}:{instr.location.lineno}"
            break
    if not location:
        location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return label, location


_ACTIVE = threading.local()  # the detector active on this thread, if any


def active_detector() -> Optional["LiveCallDetector"]:
    return getattr(_ACTIVE, "detector", None)


# What a detector watches, per schema (weakly keyed by its root; blocks are held weakly below).
_STATIC: "weakref.WeakKeyDictionary[ModelBlockSchema, tuple]" = weakref.WeakKeyDictionary()
# The original forward code of each nn.Module class seen (None: no Python forward), weakly by class.
_CLASS_CODES: "weakref.WeakKeyDictionary[type, Any]" = weakref.WeakKeyDictionary()


def forward_code(cls: type) -> Optional[Any]:
    """The code object `cls`'s forward finally runs (through its decorators); None for a forward
    with no Python code (TorchScript's compiled forward, `_forward_unimplemented`)."""
    try:
        function = inspect.getattr_static(cls, "forward", None)
    except Exception:  # noqa: BLE001 - a class whose attribute lookup fails has nothing to watch
        return None
    if isinstance(function, (staticmethod, classmethod)):
        function = function.__func__
    if not isinstance(function, types.FunctionType) or function.__name__ == "_forward_unimplemented":
        return None
    return original_code(function)


def module_forward_codes() -> set:
    """The original forward code of every `nn.Module` class loaded now (not only the model's)."""
    codes = set()
    seen = set()
    todo = [nn.Module]
    while todo:
        for cls in type.__subclasses__(todo.pop()):
            if cls in seen:
                continue
            seen.add(cls)
            todo.append(cls)
            try:
                code = _CLASS_CODES[cls]
            except KeyError:
                code = _CLASS_CODES[cls] = forward_code(cls)
            except TypeError:  # not weakly referenceable
                code = forward_code(cls)
            if code is not None:
                codes.add(code)
    return codes


class LiveCallDetector:
    """While active, records every execution of a module forward's original code (a live call):
    the forwards of the model's modules and of every other `nn.Module` class loaded when it starts
    (a module held in a dict, a global, or built per call runs one of those).

    Use as a context manager around a run of the schema `root` (on this thread):
    `with LiveCallDetector(root) as found: program.run_root(scope)`, then `found.calls`.
    `phase="backward"` marks what it finds as run while gradients were computed.
    """

    def __init__(self, root: ModelBlockSchema, phase: str = "forward"):
        static = _STATIC.get(root)
        if static is None:
            static = _STATIC[root] = self._watch(root)
        tree_codes, self.paths, self.blocks, self.stop_codes, self.wrappers = static
        # every module class's forward, the tree's first (a dict: the wrappers' codes map to [])
        self.other_codes = frozenset(module_forward_codes() - self.stop_codes)
        self.codes = dict.fromkeys(self.other_codes, None)
        self.codes.update(tree_codes)
        self.phase = phase
        self.found: dict[tuple, LiveCall] = {}
        # decorated forwards whose decorator ran and called Python code: {block id: (weak block, label,
        # location, count)}; a decorator's frame running now: [weak block, label, location, called]
        self.wrapped: dict[int, list] = {}
        self.pending: dict[Any, list] = {}
        # generated frames now running a skipped block (`note_skipped`): what runs below is its region
        self.inside: list = []
        self._previous = None
        self._thread = None

    def _watch(self, root: ModelBlockSchema) -> tuple:
        """(codes to watch, module id -> path, module id -> block, the codes as a frozenset)."""
        codes: dict[Any, list] = {}
        paths: dict[int, str] = {}
        blocks: dict[int, Any] = {}  # weak references to the blocks
        wrappers: dict[Any, list] = {}  # a decorator's wrapper code -> the blocks it wraps (weakly)
        for block in root.iter_blocks():
            wrapper = block.wrapper
            if isinstance(wrapper, types.FunctionType) and block.skip_reason is None:
                wrappers.setdefault(wrapper.__code__, []).append(weakref.ref(block))  # one code, many uses
            module = block.module
            if module is None or block.method_name is not None:
                continue
            paths.setdefault(id(module), block.path)
            blocks.setdefault(id(module), weakref.ref(block))
            code = forward_code(type(module))
            if code is not None:
                codes.setdefault(code, [])
            if block.instance_forward is not None:  # a forward replaced on the instance, lowered
                codes.setdefault(block.instance_forward.__func__.__code__, [])
        model = root.module
        if model is not None:
            for path, module in model.named_modules(remove_duplicate=False):
                paths.setdefault(id(module), path)
                code = forward_code(type(module))
                if code is not None:
                    codes.setdefault(code, [])
        stop = frozenset(codes)
        for code in wrappers:
            codes.setdefault(code, [])
        for block in root.iter_blocks():  # caching decorators the forwards can call: their bodies
            if block.module is not None:
                wrappers.update(_cached_functions(type(block.module)))
        for code in wrappers:
            codes.setdefault(code, [])
        return codes, paths, blocks, stop, wrappers

    @property
    def calls(self) -> list[LiveCall]:
        return list(self.found.values())

    def note_skipped(self, block: ModelBlockSchema, frame: Any) -> None:
        """A skipped block called from generated `frame` (`Program.call_block`): counted here,
        whether or not it has Python code the trace function sees (TorchScript, a compiled module,
        a class whose `__call__` never calls its forward); what runs inside the call is its region
        until `left_skipped`."""
        generated = frame
        while generated is not None and not isinstance(generated.f_globals.get(META_KEY), FunctionMeta):
            generated = generated.f_back
        self.inside.append((generated, block.module))
        label, location = describe_generated(frame)
        key = ("module", block.path, "", label, location, self.phase)
        entry = self.found.get(key)
        if entry is not None:
            entry.calls += 1
            return
        module_type = type(block.module).__qualname__
        callee = f"{module_type}.{block.method_name or 'forward'}"
        self.found[key] = LiveCall(module=block.path, module_type=module_type, kind="module",
                                   callee=callee, via="", block=label, location=location,
                                   reason=f"skipped: {block.skip_reason}", phase=self.phase, key=key)

    def left_skipped(self) -> None:
        if self.inside:
            self.inside.pop()

    def __enter__(self) -> "LiveCallDetector":
        # A trace function (not a profile hook): CPython calls it for each new Python frame only,
        # never for C calls, so a run of torch ops pays little. A tracer already set (a debugger,
        # coverage.py) keeps working: it is called as before and its local tracer kept.
        self._outer = active_detector()
        _ACTIVE.detector = self
        self._previous = sys.gettrace()
        codes = self.codes
        on_call = self._on_call
        previous = self._previous
        halted = self._halted = [False]
        outer = self._outer

        def off() -> None:  # `halt()` from another thread: this thread's tracer goes at its next call
            sys.settrace(previous)
            _ACTIVE.detector = outer

        pending = self.pending
        called = self._called

        if previous is None:
            def trace(frame: Any, event: str, arg: Any) -> Any:
                if halted[0]:
                    return off()
                if pending and frame.f_back in pending:
                    called(frame)
                if frame.f_code in codes and on_call(frame):
                    return self._returns(None)  # a decorator's frame: watch it return
                return None
        else:
            def trace(frame: Any, event: str, arg: Any) -> Any:
                if halted[0]:
                    off()
                elif event == "call":
                    if pending and frame.f_back in pending:
                        called(frame)
                    if frame.f_code in codes and on_call(frame):
                        return self._returns(previous(frame, event, arg))
                return previous(frame, event, arg)

        sys.settrace(trace)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)
        _ACTIVE.detector = self._outer

    def halt(self) -> None:
        """Stop watching, from any thread: the watched thread's tracer removes itself at its next
        Python call (what it found so far stays in `calls`)."""
        self._halted[0] = True

    def _cache_miss(self, frame: Any, decorator: str) -> None:
        caller, _, _ = generated_caller(frame)
        if caller is None:
            return  # not reached from the schema
        label, location = describe_generated(caller)
        module = _caller_module(caller)
        path = self.paths.get(id(module)) if isinstance(module, nn.Module) else None
        callee = _qualname(frame.f_code, frame)
        key = ("cached", callee, label, location, self.phase)
        entry = self.found.get(key)
        if entry is not None:
            entry.calls += 1
            return
        self.found[key] = LiveCall(
            module=path, module_type=type(module).__qualname__ if module is not None else "", kind="cached",
            callee=callee, via=decorator, block=label, location=location, phase=self.phase, key=key,
            reason=(f"{callee} is cached by {decorator} and was called as one call, not in a form whose body the "
                    "schema runs on a miss (a cached method called as self.<name>(...), a cached function called by "
                    "its global name): on a miss (counted in calls) its body ran live, not interpreted; a hit "
                    "returns the kept value, as in eager"))

    def _called(self, frame: Any) -> None:
        """A decorator's frame (pending) called `frame`: anything but a module's attribute access
        (`getattr(self, key)` on an nn.Module) and this package's runners is code run."""
        filename = frame.f_code.co_filename.replace("\\", "/")
        if not any(part in filename for part in _ACCESS_FILES):
            self.pending[frame.f_back][3] = True

    def _returns(self, outer: Any) -> Any:
        """A local tracer for a decorator's frame, calling `outer` (a tracer set before) too."""
        def local(frame: Any, event: str, arg: Any) -> Any:
            nonlocal outer
            if event == "return":
                self._returned(frame)
            if outer is not None:
                outer = outer(frame, event, arg)
            return local

        return local

    def _returned(self, frame: Any) -> None:
        """A decorator's frame returned. One that called no Python code (vit-pytorch's `singleton`
        returning the module it keeps on the instance, a cache hit) ran nothing of the method, as in
        eager; one that did either entered the schema or dispatched elsewhere (`dispatched_calls`)."""
        ref, label, location, called = self.pending.pop(frame, (None, "", "", False))
        block = ref() if ref is not None else None
        if block is None or not called:
            return
        entry = self.wrapped.get(id(block))
        if entry is None:
            self.wrapped[id(block)] = [ref, label, location, 1]
        else:
            entry[3] += 1

    def _on_call(self, frame: Any) -> bool:
        refs = self.wrappers.get(frame.f_code)
        if isinstance(refs, str):  # the body of a cached function: a miss of its cache, run live
            self._cache_miss(frame, refs)
            return False
        if refs is not None:  # a decorator around an interpreted forward: did it call the schema?
            ref = _wrapped_block(frame, refs)
            if ref is None or ref() is None:
                return False
            self.pending[frame] = [ref, *describe_generated(frame.f_back), False]
            return True  # counted when it returns, if it called Python code (`_returned`)
        # a module forward nested in a live one of the model is inside that region; one nested in a
        # live module that is no sub-module has a row of its own (no path covers it), via that one
        caller, between, nested = generated_caller(frame, self.stop_codes)
        code = frame.f_code
        module = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if nested or any(caller is f and caller is not None or module is m for f, m in self.inside):
            return  # inside another live forward of the model, or a skipped block: that is the region
        path = self.paths.get(id(module)) if isinstance(module, nn.Module) else None
        ref = self.blocks.get(id(module)) if module is not None else None
        block = ref() if ref is not None else None
        module_type = type(module).__qualname__ if module is not None else ""
        via = ""
        if between:  # the outermost helper; in backward, the innermost (the caller is autograd)
            outer = between[0] if self.phase == "backward" else between[-1]
            via = _qualname(outer.f_code, outer)
        label, location = describe_generated(caller)
        # modules that are no sub-module (made per call, `ACT2FN[name](x)`) count together by class
        key = ("module", path if path is not None else f"<{module_type}>", via, label, location, self.phase)
        entry = self.found.get(key)
        if entry is not None:
            entry.calls += 1
            return
        if block is not None and block.skip_reason is not None:
            reason = f"skipped: {block.skip_reason}"
        elif path is None:
            callers = tuple(m for m in (f.f_locals.get(f.f_code.co_varnames[0]) if f.f_code.co_argcount else None
                                        for f in between) if isinstance(m, nn.Module) and id(m) not in self.paths)
            how = how_reached(module, _caller_module(caller), via, callers)
            reason = (f"not a sub-module of the parsed model ({how}): it has no "
                      f"block and runs as the real module, reached from {label or 'outside the schema'}"
                      + (f" at {location}" if location else ""))
        elif via:
            reason = (f"{via} (a function the schema runs as one call) called it, so its forward ran as the "
                      "real module")
        elif caller is None:
            reason = "called from outside any interpreted forward"
        else:
            reason = "its forward ran as the real module"
        if self.phase == "backward":
            reason = (f"ran during backward: {via or 'autograd'} called its original forward while gradients were "
                      "computed (a checkpoint's recomputation, an adjoint solve); "
                      + ("it is not a sub-module" if path is None else
                         f"skipped: {block.skip_reason}" if block is not None and block.skip_reason else
                         "the schema is not lent to backward") + ", so it ran as the real module")
        self.found[key] = LiveCall(module=path, module_type=module_type, kind="module",
                                   callee=f"{module_type}.forward", via=via, block=label, location=location,
                                   reason=reason, phase=self.phase, key=key)


def _wraps(frame: Any, wrapper: Any) -> bool:
    """True when the wrapper code running in `frame` is `wrapper` itself (its body runs live) or the
    program's copy of it around the schema: each free variable holds what `wrapper`'s closure holds,
    or, where that is the function it wraps, a runner `rebind_wrapper` put there. One wrapper code
    serves every function its decorator decorates (`contextmanager`'s `helper`, a cache's wrapper),
    so the code alone does not say which function this call is for."""
    closure = getattr(wrapper, "__closure__", None) or ()
    names = frame.f_code.co_freevars
    if len(names) != len(closure):
        return False
    inner = getattr(wrapper, "__wrapped__", None)
    local = frame.f_locals
    for name, cell in zip(names, closure):
        try:
            own = cell.cell_contents
        except ValueError:
            continue
        value = local.get(name, own)
        if value is not own and not (own is inner and is_rebound(value)):
            return False
    return True


def _cached_functions(cls: type) -> dict:
    """{code of a cached function's body: the cache's name} for the caching decorators (functools'
    `lru_cache` / `cache`, directly or inside a wrapper such as diffusers' `lru_cache_unless_export`)
    on `cls`'s methods and on the module globals its forward reads."""
    found: dict = {}
    candidates = [value for klass in cls.__mro__ for value in vars(klass).values()]
    forward = inspect.getattr_static(cls, "forward", None)
    if isinstance(forward, types.FunctionType):
        names = forward.__code__.co_names
        candidates += [forward.__globals__.get(name) for name in names]
    for value in candidates:
        value = getattr(value, "__func__", value)
        cells = [value] + [c.cell_contents for c in getattr(value, "__closure__", None) or ()
                           if isinstance(value, types.FunctionType) and _filled(c)]
        for item in cells:
            if isinstance(item, functools._lru_cache_wrapper):
                code = original_code(item.__wrapped__)
                if code is not None:
                    found[code] = "functools.lru_cache"
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _wrapped_block(frame: Any, refs: list) -> Optional[Any]:
    """Of the blocks a decorator's wrapper code wraps (one decorator on many forwards or methods,
    one decorated forward on many instances), the one this call is for, if any: one whose wrapper
    this is (`_wraps`: the same code also runs for functions the schema has no block for), and of
    those the one whose module the wrapper got first (one decorator on two methods of one instance
    is told apart no further: the first is taken)."""
    refs = [ref for ref in refs if (block := ref()) is not None and _wraps(frame, block.wrapper)]
    if len(refs) <= 1:
        return refs[0] if refs else None
    code = frame.f_code
    local = frame.f_locals
    first = local.get(code.co_varnames[0]) if code.co_argcount else None
    if first is None and code.co_flags & inspect.CO_VARARGS:
        args = local.get(code.co_varnames[code.co_argcount + code.co_kwonlyargcount])
        first = args[0] if isinstance(args, tuple) and args else None
    for ref in refs:
        block = ref()
        if block is not None and block.module is first:
            return ref
    return None


def _caller_module(frame: Optional[Any]) -> Any:
    """The module (or object) whose interpreted forward the generated `frame` runs."""
    meta = frame.f_globals.get(META_KEY) if frame is not None else None
    block = meta.block_ref() if isinstance(meta, FunctionMeta) and meta.block_ref is not None else None
    return block.module if block is not None else None


def dispatched_calls(detector: "LiveCallDetector", entered: set) -> list[LiveCall]:
    """Decorated forwards whose decorator ran while their schema was never entered: the decorator
    dispatched to something else (an implementation this package does not know), which ran live."""
    out = []
    for ref, label, location, count in detector.wrapped.values():
        block = ref()
        if block is None or id(block) in entered:
            continue
        wrapper = block.wrapper
        qualname = getattr(getattr(wrapper, "__code__", None), "co_qualname", getattr(wrapper, "__qualname__", "?"))
        module_type = type(block.module).__qualname__
        method = block.method_name or "forward"
        out.append(LiveCall(module=block.path, module_type=module_type, kind="dispatch", callee=qualname, via="",
                            block=label, location=location, calls=count,
                            reason=(f"the decorator of {module_type}.{method} ({qualname}) called something other than "
                                    "the schema (it dispatches to another implementation, or returned a value it "
                                    "kept, as a cache does), which ran as real code"),
                            key=("dispatch", block.path, method, label, location)))
    return out


def merge_live_calls(*groups: Iterable[LiveCall]) -> list[LiveCall]:
    """One list of live calls, repeats of the same region added up."""
    merged: dict[tuple, LiveCall] = {}
    for group in groups:
        for call in group:
            key = call.key or (call.kind, call.module, call.via, call.block, call.location)
            entry = merged.get(key)
            if entry is None:
                merged[key] = LiveCall(**{**call.__dict__})
            else:
                entry.calls += call.calls
    return list(merged.values())
