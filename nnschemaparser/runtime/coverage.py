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

import inspect
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from torch import nn

from ..schema.model import ModelBlockSchema
from .functions import META_KEY, FunctionMeta

__all__ = ["LiveCall", "LiveCallDetector", "active_detector", "dispatched_calls", "original_code", "merge_live_calls", "COVERAGE_COLUMNS",
           "generated_caller"]

from ..schema.model import COVERAGE_COLUMNS  # noqa: E402  (the columns of `coverage()`, in order)

# Frames of torch's own call machinery, never "the helper that made the call".
_PLUMBING_FILES = ("torch/nn/modules/module.py", "torch/nn/utils/parametrize.py", "torch/_dynamo", "torch/_compile.py",
                   "torch/utils/_contextlib.py", "contextlib.py", "nnschemaparser/runtime/")


@dataclass
class LiveCall:
    """One region that ran outside the schema, and how many times.

    `kind`: "module" (a module's original forward ran), "callable" (non-module code a forward
    called reached interpreted modules: its own code ran as one call), "dispatch" (a decorator
    around an interpreted forward called something other than the schema), "replaced" (a forward
    replaced on the instance after parsing ran). `module` is the module's path in the model ("" for
    the root, None when the module is not part of the schema), `via` the non-module function that
    called it (e.g. `transformers.pytorch_utils.apply_chunking_to_forward`), `block` and `location`
    where the schema made the call that led there.
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
        if current.f_code in stop_codes:
            nested = True
        if not _is_plumbing(current.f_code):
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


class LiveCallDetector:
    """While active, records every execution of a model forward's original code (a live call).

    Use as a context manager around a run of the schema `root` (on this thread):
    `with LiveCallDetector(root) as found: program.run_root(scope)`, then `found.calls`.
    """

    def __init__(self, root: ModelBlockSchema):
        static = _STATIC.get(root)
        if static is None:
            static = _STATIC[root] = self._watch(root)
        self.codes, self.paths, self.blocks, self.stop_codes, self.wrappers = static
        self.found: dict[tuple, LiveCall] = {}
        # decorated forwards whose decorator ran: {block id: (weak block, label, location, count)}
        self.wrapped: dict[int, list] = {}
        self._previous = None
        self._thread = None

    def _watch(self, root: ModelBlockSchema) -> tuple:
        """(codes to watch, module id -> path, module id -> block, the codes as a frozenset)."""
        self.codes: dict[Any, list] = {}
        self.paths: dict[int, str] = {}
        self.blocks: dict[int, Any] = {}  # weak references to the blocks
        wrappers: dict[Any, Any] = {}  # a decorated forward's wrapper code -> its block (weakly)
        for block in root.iter_blocks():
            wrapper = block.wrapper
            if isinstance(wrapper, types.FunctionType) and block.skip_reason is None:
                wrappers.setdefault(wrapper.__code__, weakref.ref(block))
            module = block.module
            if module is None or block.method_name is not None:
                continue
            self.paths.setdefault(id(module), block.path)
            self.blocks.setdefault(id(module), weakref.ref(block))
            self._add(type(module))
        model = root.module
        if model is not None:
            for path, module in model.named_modules(remove_duplicate=False):
                self.paths.setdefault(id(module), path)
                self._add(type(module))
        stop = frozenset(self.codes)
        for code in wrappers:
            self.codes.setdefault(code, [])
        return self.codes, self.paths, self.blocks, stop, wrappers

    def _add(self, cls: type) -> None:
        function = inspect.getattr_static(cls, "forward", None)
        if isinstance(function, (staticmethod, classmethod)):
            function = function.__func__
        if not isinstance(function, types.FunctionType) or function.__name__ == "_forward_unimplemented":
            return  # TorchScript's compiled forward, a C forward: no Python code to watch
        code = original_code(function)
        if code is not None:
            self.codes.setdefault(code, [])

    @property
    def calls(self) -> list[LiveCall]:
        return list(self.found.values())

    def note_skipped(self, block: ModelBlockSchema, frame: Any) -> None:
        """A skipped block called from generated `frame` whose forward has no Python code the
        profile hook would see (TorchScript, a compiled module): count it here."""
        function = inspect.getattr_static(type(block.module), "forward", None)
        if isinstance(function, types.FunctionType) and original_code(function) in self.codes:
            return  # its own code runs: `_on_call` counts it
        label, location = describe_generated(frame)
        key = ("module", block.path, "", label, location)
        entry = self.found.get(key)
        if entry is not None:
            entry.calls += 1
            return
        module_type = type(block.module).__qualname__
        self.found[key] = LiveCall(module=block.path, module_type=module_type, kind="module",
                                   callee=f"{module_type}.forward", via="", block=label, location=location,
                                   reason=f"skipped: {block.skip_reason}", key=key)

    def __enter__(self) -> "LiveCallDetector":
        # A trace function (not a profile hook): CPython calls it for each new Python frame only,
        # never for C calls, so a run of torch ops pays little. A tracer already set (a debugger,
        # coverage.py) keeps working: it is called as before and its local tracer kept.
        _ACTIVE.detector = self
        self._previous = sys.gettrace()
        codes = self.codes
        on_call = self._on_call
        previous = self._previous

        if previous is None:
            def trace(frame: Any, event: str, arg: Any) -> None:
                if frame.f_code in codes:
                    on_call(frame)
                return None
        else:
            def trace(frame: Any, event: str, arg: Any) -> Any:
                if event == "call" and frame.f_code in codes:
                    on_call(frame)
                return previous(frame, event, arg)

        sys.settrace(trace)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)
        _ACTIVE.detector = None

    def _on_call(self, frame: Any) -> None:
        ref = self.wrappers.get(frame.f_code)
        if ref is not None:  # a decorator around an interpreted forward: did it call the schema?
            block = ref()
            if block is not None:
                entry = self.wrapped.get(id(block))
                if entry is None:
                    label, location = describe_generated(frame.f_back)
                    self.wrapped[id(block)] = [ref, label, location, 1]
                else:
                    entry[3] += 1
            return
        caller, between, nested = generated_caller(frame, self.stop_codes)
        if nested:
            return  # inside another live forward: that one is the region reported
        code = frame.f_code
        module = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        path = self.paths.get(id(module)) if isinstance(module, nn.Module) else None
        ref = self.blocks.get(id(module)) if module is not None else None
        block = ref() if ref is not None else None
        module_type = type(module).__qualname__ if module is not None else ""
        via = ""
        if between:
            outer = between[-1]
            via = _qualname(outer.f_code, outer)
        label, location = describe_generated(caller)
        if block is not None and block.skip_reason is not None:
            reason = f"skipped: {block.skip_reason}"
        elif path is None:
            reason = "not a sub-module of the parsed model: it has no block and runs as the real module"
        elif via:
            reason = (f"{via} (a function the schema runs as one call) called it, so its forward ran as the "
                      "real module")
        elif caller is None:
            reason = "called from outside any interpreted forward"
        else:
            reason = "its forward ran as the real module"
        # modules that are no sub-module (made per call, `ACT2FN[name](x)`) count together by class
        key = ("module", path if path is not None else f"<{module_type}>", via, label, location)
        entry = self.found.get(key)
        if entry is not None:
            entry.calls += 1
            return
        self.found[key] = LiveCall(module=path, module_type=module_type, kind="module",
                                   callee=f"{module_type}.forward", via=via, block=label, location=location,
                                   reason=reason, key=key)


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
        out.append(LiveCall(module=block.path, module_type=module_type, kind="dispatch", callee=qualname, via="",
                            block=label, location=location, calls=count,
                            reason=(f"the decorator of {module_type}.forward ({qualname}) called something other than "
                                    "the schema (it dispatches to another implementation), which ran as real code"),
                            key=("dispatch", block.path, label, location)))
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
