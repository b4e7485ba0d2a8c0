"""How much memory a capture will keep, before it runs: `estimate_capture`, and the refusal that uses it.

What is estimated (and what "measured" means), two figures:

- `total_bytes`: the bytes of the distinct storages the capture's trace keeps alive, each storage
  once however many steps alias it (a view, an unpacked item), clones made before an in-place
  change included: `kept_bytes(trace)` measures exactly that on a trace;
- `peak_bytes`: the capture's highest memory, what the refusal compares with the budget: the
  storages alive at the worst moment of the run, i.e. the values kept so far plus the working
  memory of that moment (temporaries that die later, a kept-nothing layer's attention scores) and,
  with autograd on, what the graph saves for backward. Weights and inputs, there before the run,
  are not counted (nor views or in-place results of them). bench/bench_capture_memory.py compares
  it with a fresh process's measured peak (VmHWM reset after the parse, minus VmRSS before the
  capture, the heap trimmed first): within 5% on a Llama (every value kept, and two layers kept)
  and GPT-2 at 512 tokens, autograd on or off. Not counted: memory inside a kernel (a matmul's
  workspace), Python's objects for the trace, the allocator's own overhead.

How: a *dry run*. The schema is captured (with the same `keep=` selector, the same recorder) on fake
tensors (`torch._subclasses.FakeTensorMode`), under the caller's grad mode: every op computes only
the shape, dtype and aliasing of its result, from the schema's own code, so loops, branches on shapes
and views count as in the real run; no data is allocated and the model's weights are only read as
metadata. A dispatch mode inside it (`_LiveBytes`) counts each storage an op makes from that op until
its last tensor is gone (the same code runs, so the same values die at the same points), and keeps
the highest sum. A model whose forward reads tensor *values* (`.item()`, a branch on `x.sum() > 0`,
`nonzero` routing) cannot run on fake tensors: the estimate then comes from the shapes the
parse-time run recorded on each instruction (`method="parse shapes"`): every tensor-binding
instruction counted once (a loop's iterations and aliasing are not seen; `peak_bytes` is that same
figure), its dimensions rescaled where an input dimension differs from the parse-time input's,
which is a rough figure and says so (`note`).

`check_fits` is what `capture_run` calls before running: a cheap bound first (the parse-time shapes
of every value the run makes, kept or not, rescaled, times 8), and the dry run only when that bound
does not fit already; a capture whose estimate (`peak_bytes`; `value_bytes` against
`CaptureLimits(max_bytes=...)`) exceeds the budget raises `CaptureTooLargeError` naming the estimate,
the budget and the fixes.

Depends on torch, schema, runtime (the interpreter), recorder, selection and trace.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime.interpreter import SchemaInterpreter
from ..schema.errors import SchemaRunError
from ..schema.model import (BlockInstruction, ControlInstruction, ModelBlockSchema, OpInstruction, TensorRepr,
                            TryInstruction, WithInstruction, condition_instructions)
from .recorder import ActivationRecorder
from .selection import KeepSelector, keep_selector

__all__ = ["CaptureEstimate", "CaptureTooLargeError", "estimate_capture", "kept_bytes", "available_memory",
           "MEMORY_FRACTION"]

MEMORY_FRACTION = 0.7  # of MemAvailable: the default budget of a capture without limits
_SCREEN_FACTOR = 8  # the cheap bound: parse-time sizes, rescaled, times this


class CaptureTooLargeError(SchemaRunError):
    """A capture whose estimated memory does not fit its budget, refused before it runs; `estimate`
    (a CaptureEstimate) and `budget` (bytes) say by how much."""

    def __init__(self, message: str, estimate: "CaptureEstimate", budget: int):
        super().__init__(message)
        self.estimate = estimate
        self.budget = budget


@dataclass(frozen=True)
class CaptureEstimate:
    """The memory a capture would keep: `total_bytes` over `steps` kept steps, per block in `blocks`
    ({block path: (steps, bytes)}; a storage shared by several steps counts at the first).
    `method` is "dry run" (fake tensors: shapes, dtypes and aliasing as the real run has them) or
    "parse shapes" (the parse-time run's shapes, rescaled: rough, see `note`)."""

    total_bytes: int
    steps: int
    blocks: dict = field(default_factory=dict)
    method: str = "dry run"
    keep: Optional[str] = None
    note: str = ""
    value_bytes: int = 0  # every kept value's own size, aliases not removed: what CaptureLimits.max_bytes counts
    peak_bytes: int = 0  # the capture's highest memory: kept values plus the working memory alive then

    def frame(self):
        """One row per block: `block_path`, `steps`, `bytes`, `share` of the total (a DataFrame)."""
        import pandas as pd

        rows = [{"block_path": path, "steps": steps, "bytes": nbytes,
                 "share": nbytes / self.total_bytes if self.total_bytes else 0.0}
                for path, (steps, nbytes) in self.blocks.items()]
        return pd.DataFrame(rows, columns=["block_path", "steps", "bytes", "share"])

    def __str__(self) -> str:
        return (f"{_size(self.total_bytes)} kept in {self.steps} steps, peak {_size(self.peak_bytes)} ({self.method}"
                f"{', keep=' + repr(self.keep) if self.keep else ''})")


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return f"{nbytes} bytes"  # pragma: no cover


def _storage_key(tensor: torch.Tensor) -> tuple:
    try:
        storage = tensor.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):  # sparse, nested: no one storage
        return id(tensor), tensor.numel() * tensor.element_size()


def _breakdown(trace: Any) -> tuple[int, int, dict, int]:
    seen: set = set()
    blocks: dict[str, list[int]] = {}
    total = steps = values = 0
    for step in trace:
        value = step.value
        if not isinstance(value, torch.Tensor):
            continue
        steps += 1
        values += value.numel() * value.element_size()
        key, nbytes = _storage_key(value)
        entry = blocks.setdefault(step.block_path or f"({step.slot_type})", [0, 0])
        entry[0] += 1
        if key not in seen:
            seen.add(key)
            entry[1] += nbytes
            total += nbytes
    return total, steps, {path: (n, b) for path, (n, b) in blocks.items()}, values


def kept_bytes(trace: Any) -> int:
    """The bytes of the distinct storages a trace's kept values hold (what `estimate_capture` estimates)."""
    return _breakdown(trace)[0]


def _fake_value(mode: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return mode.from_tensor(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_fake_value(mode, v) for v in value)
    if isinstance(value, list):
        return [_fake_value(mode, v) for v in value]
    if isinstance(value, dict):
        return {k: _fake_value(mode, v) for k, v in value.items()}
    return value


def _parse_scope(schema: ModelBlockSchema) -> dict:
    """Zero-filled inputs of the parse-time shapes and dtypes (tensor inputs only)."""
    scope = {}
    for name, rep in schema.inputs.items():
        dtype = getattr(torch, rep.dtype.replace("torch.", ""), None) if rep.dtype.startswith("torch.") else None
        if isinstance(dtype, torch.dtype):
            scope[name] = torch.zeros(tuple(rep.shape), dtype=dtype, device="meta")
    return scope


class _LiveBytes(TorchDispatchMode):
    """Inside the dry run's FakeTensorMode: the bytes of the storages the run's ops made that are
    alive, and their highest value. A storage counts from the op that made it until the last tensor
    on it is gone (a weakref finalizer per tensor); a view or an in-place result of a tensor that was
    there before the run (a weight, an input) makes no new memory and is not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, list[int]] = {}  # storage key -> [live tensors on it, its bytes]
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = None
        for value in _tensors(out):
            try:
                storage = value.untyped_storage()
                key, nbytes = storage._cdata, storage.nbytes()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            entry = self.refs.get(key)
            if entry is None:
                if inputs is None:
                    inputs = {_storage_key(t)[0] for t in _tensors((args, kwargs))}
                if key in inputs:  # memory that was there before the run
                    continue
                entry = self.refs[key] = [0, nbytes]
                self.live += nbytes
                if self.live > self.peak:
                    self.peak = self.live
            entry[0] += 1
            weakref.finalize(value, self._release, key)
        return out

    def _release(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            self.live -= entry[1]
            del self.refs[key]


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _dry_run(schema: ModelBlockSchema, scope: dict, selector: Optional[KeepSelector]) -> CaptureEstimate:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    recorder = ActivationRecorder(keep=selector)
    observe = selector.blocks_to_observe(schema) if selector is not None else None
    live = _LiveBytes()
    # under the caller's grad mode, as the capture runs: with autograd on, what backward would need stays alive
    with mode, live:
        fake = {}
        for name, value in scope.items():
            if isinstance(value, torch.Tensor) and value.is_meta:  # parse-time shapes: made in the mode
                fake[name] = torch.zeros(value.shape, dtype=value.dtype)
            else:
                fake[name] = _fake_value(mode, value)
        SchemaInterpreter(listeners=[recorder], observe=observe).run(schema, fake)
    total, steps, blocks, values = _breakdown(recorder.trace)
    return CaptureEstimate(total, steps, blocks, "dry run", selector.text() if selector is not None else None,
                           "a capture of these input shapes on fake tensors", values, max(live.peak, total))


def _instructions(body: list):
    for instr in body:
        yield instr
        if isinstance(instr, ControlInstruction):
            yield from _instructions(list(condition_instructions(instr)) + list(instr.body) +
                                     list(instr.else_body or []))
        elif isinstance(instr, TryInstruction):
            yield from _instructions(list(instr.body) + [i for b in instr.handler_bodies for i in b] +
                                     list(instr.else_body or []) + list(instr.final_body or []))
        elif isinstance(instr, WithInstruction):
            yield from _instructions(list(instr.body))


def _dims(schema: ModelBlockSchema, scope: dict) -> dict:
    """Parse-time input dimension -> this scope's, where they differ (the rescaling of parse shapes)."""
    mapping: dict[int, int] = {}
    for name, rep in schema.inputs.items():
        value = scope.get(name)
        if isinstance(value, torch.Tensor) and value.dim() == len(rep.shape):
            for old, new in zip(rep.shape, value.shape):
                if old != new and old > 1:
                    mapping[int(old)] = int(new)
    return mapping


def _op_of(block: ModelBlockSchema, instr: Any) -> tuple[str, str, bool]:
    """(op name, slot, is a block call) of an instruction's step as far as it is known before a run:
    a block call's callee path (a module held in a variable: the path the source names); no op name
    for anything else (op= terms are not seen here)."""
    if not isinstance(instr, BlockInstruction):
        return "", "activation", False
    try:
        callee = block.find(instr.block_ref.path) if instr.callee_var is None else None
    except KeyError:
        callee = None
    return (callee.path if callee is not None else instr.block_ref.path), "activation", True


def _parse_shapes(schema: ModelBlockSchema, scope: dict, selector: Optional[KeepSelector],
                  why: str = "") -> CaptureEstimate:
    mapping = _dims(schema, scope)
    blocks: dict[str, list[int]] = {}
    total = steps = 0
    for block in schema.iter_blocks():
        path = block.path or block.name
        for instr in _instructions(block.body):
            rep = getattr(instr, "resolved", None)
            if not isinstance(instr, (OpInstruction, BlockInstruction)) or not instr.out_var or \
                    not isinstance(rep, TensorRepr) or not rep.dtype.startswith("torch."):
                continue
            if selector is not None and not selector.matches(path, instr.out_var, *_op_of(block, instr)):
                continue
            dtype = getattr(torch, rep.dtype.replace("torch.", ""), None)
            if not isinstance(dtype, torch.dtype):
                continue
            shape = [mapping.get(int(d), int(d)) for d in rep.shape]
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            entry = blocks.setdefault(path, [0, 0])
            entry[0] += 1
            entry[1] += nbytes
            steps += 1
            total += nbytes
    note = ("the parse-time run's shapes, each tensor-binding instruction once (loops, aliasing and "
            "data-dependent shapes not seen)" + (f"; the dry run could not run: {why}" if why else ""))
    return CaptureEstimate(total, steps, {p: (n, b) for p, (n, b) in blocks.items()}, "parse shapes",
                           selector.text() if selector is not None else None, note, total, total)


def estimate_capture(schema: ModelBlockSchema, keep: Any = None, scope: Optional[dict] = None) -> CaptureEstimate:
    """The memory `capture_run(schema, scope, keep=keep)` would keep, and its peak, estimated without running it.

    `scope` ({input name: value}) as capture_run takes it; None: the parse-time inputs' shapes and
    dtypes (`schema.inputs`; other inputs take their defaults). Call it under the grad mode the
    capture will run in (with autograd on, what backward needs stays alive). Returns a
    `CaptureEstimate` (`total_bytes` kept, `peak_bytes`, `steps`, `blocks`, `.frame()` per block). See the module docstring for what is
    estimated and how; where the dry run cannot run, the estimate says so (`method`, `note`)."""
    if not isinstance(schema, ModelBlockSchema):
        raise SchemaRunError(f"estimate_capture takes a ModelBlockSchema, got {type(schema).__name__}")
    if scope is not None and not isinstance(scope, dict):
        raise SchemaRunError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")
    selector = keep_selector(keep)
    scope = _parse_scope(schema) if scope is None else scope
    try:
        return _dry_run(schema, scope, selector)
    except SchemaRunError:
        raise
    except Exception as exc:  # a forward reading values (.item(), nonzero) cannot run on fake tensors
        return _parse_shapes(schema, scope, selector, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


_READ: list = [-1.0, None]  # when available_memory last read the system, and what it read


def available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (psutil's `available` where there is no /proc); None if
    neither. Read at most every 0.25 s (a loop of small captures reads it once)."""
    now = time.monotonic()
    if now - _READ[0] < 0.25:
        return _READ[1]
    _READ[1] = _read_available()
    _READ[0] = now
    return _READ[1]


def _read_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no psutil, or it cannot read the system
        return None


# per schema: {(input signature, selector): CaptureEstimate} of the dry runs `check_fits` made
_ESTIMATES: "weakref.WeakKeyDictionary[ModelBlockSchema, dict]" = weakref.WeakKeyDictionary()


def _signature(scope: dict) -> Optional[tuple]:
    items = []
    for name, value in sorted(scope.items(), key=lambda item: str(item[0])):
        if isinstance(value, torch.Tensor):
            items.append((name, tuple(value.shape), value.dtype))
        else:
            try:
                hash(value)
            except TypeError:
                return None  # a structured input: estimated afresh each time
            items.append((name, type(value).__name__, value if isinstance(value, (bool, int, str, type(None))) else
                          id(value)))
    return tuple(items)


def check_fits(schema: ModelBlockSchema, scope: dict, selector: Optional[KeepSelector], budget: int,
               what: str, max_tensors: Optional[int] = None,
               fixes: str = "give a larger limit") -> Optional[CaptureEstimate]:
    """Raise CaptureTooLargeError when the capture's estimate exceeds `budget` bytes (`what` names
    the budget in the message) or keeps more than `max_tensors` values; the estimate made, or None
    where the cheap bound already fit (only without `max_tensors`)."""
    cache = _ESTIMATES.get(schema)
    if cache is None:
        cache = _ESTIMATES[schema] = {}
    if max_tensors is None:
        dims = _dims(schema, scope)
        # every value the run makes, kept or not: the peak holds the working memory of what is not kept
        rough_key = ("rough", tuple(sorted(dims.items())))
        rough = cache.get(rough_key)
        if rough is None:
            rough = cache[rough_key] = _parse_shapes(schema, scope, None).total_bytes
        if rough * _SCREEN_FACTOR <= budget:
            return None
    key = _signature(scope)
    estimate = cache.get((key, selector)) if key is not None else None
    if estimate is None:
        estimate = estimate_capture(schema, selector, scope)
        if key is not None:
            cache[(key, selector)] = estimate
    if max_tensors is not None and estimate.steps > max_tensors:
        raise CaptureTooLargeError(
            f"this capture would keep {estimate.steps} tensors ({_size(estimate.total_bytes)}, {estimate.method}), "
            f"more than CaptureLimits(max_tensors={max_tensors}). Keep less (keep='<block>:<variable>'), raise "
            f"max_tensors, or let the capture drop values (limit_policy='earliest' or 'latest')", estimate, budget)
    # CaptureLimits.max_bytes counts each kept value's own size; memory, the capture's peak (each
    # storage once: what it keeps plus the working memory alive at its highest point)
    needed = estimate.value_bytes if max_tensors is not None else max(estimate.peak_bytes, estimate.total_bytes)
    if needed > budget:
        largest = sorted(estimate.blocks.items(), key=lambda item: -item[1][1])[:3]
        where = ", ".join(f"{path} {_size(nbytes)}" for path, (_, nbytes) in largest)
        amount = f"keep about {_size(needed)}" if max_tensors is not None else \
            f"need about {_size(needed)} at its peak (keeping {_size(estimate.total_bytes)})"
        raise CaptureTooLargeError(
            f"this capture would {amount} ({estimate.steps} tensors; "
            f"{estimate.method}; largest: {where}), more than {what} ({_size(budget)}). Keep less: "
            f"keep='<block>:<variable>' (estimate_capture(schema, keep=..., scope=...) says what a selector "
            f"costs), run shorter inputs, or {fixes}", estimate, budget)
    return estimate


def default_budget() -> Optional[tuple[int, str]]:
    """The budget of a capture without limits: MEMORY_FRACTION of the available memory (None: unknown)."""
    available = available_memory()
    if available is None:
        return None
    fraction = MEMORY_FRACTION
    return int(available * fraction), f"{fraction:.0%} of the available memory ({_size(available)} MemAvailable)"
