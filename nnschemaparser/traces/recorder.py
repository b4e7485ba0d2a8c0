"""ActivationRecorder: a listener that turns a run into an `ActivationTrace` (and a `GradientTrace`).

Which results become steps: the root's tensor inputs ("input"), every tensor bound by an op or a
sub-block call anywhere in the tree ("activation"; a bound method fetched by `getattr` is not a
tensor, so it is not a step), and the root's tensor outputs ("output").

Values are kept as detached aliases, not copies. What makes them "the value at capture time" is
the runtime's `on_before_mutation` event: right before an instruction flagged `mutates` runs (`x.add_()`,
`y[0] = ...`, `F.relu(x, inplace=True)`), the recorder clones the kept values whose storage is the
storage of the operand about to change (and note the step in `changed_in_place`, so a view can say
the tensor was changed later). Storages are indexed lazily, on the first mutation, so a
run without in-place ops pays nothing for this. In-place changes made where the schema cannot see
them (inside a skipped child, inside a torch function) are not detected.

Steps are written lazily: a run appends one plain list per tensor (the value as kept, its shape
and dtype at capture) to the trace's pending records, and the trace builds the `TraceStep`s when
`trace.steps` is read; the in-place bookkeeping above works on step numbers, so it reaches a step
whether it is still a record or already built.

Gradients use tensor hooks registered at capture time: a hook receives the gradient with respect to
the value the step recorded, even when the tensor is changed in place later, and leaves `.grad`
of the user's tensors alone.

Depends on schema, listeners, traces, descriptions, tensor_walk, sampling (for `CaptureLimits` and
`sample_tensor`), selection and missed (what a `keep=` selector could not keep is said there);
never on the interpreter or any view.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Optional, Sequence

import torch

from .sampling import EVICTED, LIMIT_POLICIES, CaptureLimits, sample_tensor
from .missed import call_watch, empty_call_terms, missed_calls_warning
from .selection import KeepSelector, is_block_call, keep_selector
from .descriptions import callee_name, describe_block_call, describe_op, lower_first, op_name_of
from ..runtime.listeners import EditEvent, InstructionEvent, TraceListener
from ..schema.model import (BlockInstruction, Instruction, ModelBlockSchema, OpInstruction, ReturnInstruction,
                            TensorContainer, VarRef)
from .trace import ActivationTrace, GradientTrace, TraceStep
from .tensor_walk import _shape, _storage_ptr, _version, mutated_tensors, tensors_in

__all__ = ["ActivationRecorder", "tensors_in", "mutated_tensors"]

_Tensor = torch.Tensor
_NUMBERS = [f"{n:04d}" for n in range(10000)]
_DTYPE_TEXT: dict[torch.dtype, str] = {}
_VALUE, _OMITTED, _SAMPLE = 6, 8, 9  # positions in a pending step record (see ActivationRecorder._add)



def _build_steps(prefixes: dict[str, str], records: list[list]) -> list[TraceStep]:
    """The TraceSteps of pending records `[number, description, slot_type, out_var, op_name, block_path,
    value, depth, omitted, sample, shape, dtype]`; `prefixes` caches container-id prefixes by key."""
    steps = []
    for number, description, slot_type, out_var, op_name, block_path, value, depth, omitted, sample, shape, \
            dtype in records:
        key = slot_type if slot_type != "activation" else block_path
        prefix = prefixes.get(key)
        if prefix is None:
            prefix = prefixes[key] = key.replace(".", "_") + "_"
        cid = prefix + _NUMBERS[number] if number < 10000 else f"{prefix}{number:04d}"
        text = _DTYPE_TEXT.get(dtype)
        if text is None:
            text = _DTYPE_TEXT[dtype] = str(dtype)
        steps.append(TraceStep(number, cid, description, slot_type, out_var, op_name, block_path,
                               TensorContainer(tuple(shape), text, value, cid, slot_type), None, depth, omitted,
                               sample))
    return steps


# The description caches of each schema's runs, kept as long as the schema lives, outside it
# (weakly keyed by the root; no entry refers to a block but weakly, so the entry goes with it).
_TABLES: "weakref.WeakKeyDictionary[ModelBlockSchema, tuple]" = weakref.WeakKeyDictionary()


def _description_tables(root: ModelBlockSchema) -> tuple[dict, dict, dict]:
    """The description caches of `root`'s runs: (ops, calls, container-id prefixes).

    Every entry is keyed by what its text depends on and holds the instruction it was made for, so
    a hit is checked by identity.
    """
    tables = _TABLES.get(root)
    if tables is None:
        tables = _TABLES[root] = ({}, {}, {})
    return tables


class ActivationRecorder(TraceListener):
    """Records every tensor of a run into `trace` (an ActivationTrace), one step each.

    `capture_grads=True` also hooks every captured tensor that requires grad; after your backward
    pass, `collect_gradients()` returns the GradientTrace. `limits` (a CaptureLimits) bounds what is
    kept: once `max_tensors` values are kept, or a value would take the kept bytes past `max_bytes`,
    that step and every later one keep only their metadata: value None, `omitted` says which quota
    ran out and `sample` holds up to `max_samples_per_tensor` leading elements
    (`limit_policy="earliest"`); with `limit_policy="latest"` a new value evicts the oldest kept ones
    until it fits (they keep a sample; `omitted` says they were evicted), so the last values of the
    run are the ones kept. `trace.dropped` lists what the limits dropped either way.
    `max_traversal_nodes` and `max_container_depth` bound the walk through structured root inputs
    and outputs.

    `keep` (a selector, see traces/selection.py: `"model.layers.3:hidden_states"`, a KeepTerm or a
    list) records only the steps it names; the others are counted, not recorded, so a kept step's
    number and container id are those it has in a capture of everything.

    Reusable: each run starts a fresh trace, so traces of earlier runs stay intact.
    """

    every_instruction = False  # only tensor results (and returns) can become steps

    def __init__(self, capture_grads: bool = False, limits: Optional[CaptureLimits] = None, keep: Any = None,
                 limit_policy: str = "earliest"):
        self.keep: Optional[KeepSelector] = keep_selector(keep)
        self.defer_warnings = False  # capture_run sets it and warns after the run (the warning then points at its caller)
        if limit_policy not in LIMIT_POLICIES:
            raise ValueError(f"limit_policy must be one of {', '.join(map(repr, LIMIT_POLICIES))}, got {limit_policy!r}")
        self.limit_policy = limit_policy
        if limits is not None and not isinstance(limits, CaptureLimits):
            raise TypeError(f"limits must be a nnschemaparser.CaptureLimits or None, got {type(limits).__name__}; "
                            "build one with CaptureLimits(max_tensors=..., max_bytes=...)")
        self.capture_grads = bool(capture_grads)
        self.limits = limits
        self.trace = ActivationTrace()
        self.root_frame: Optional[dict] = None
        # Descriptions by instruction (ops with a fixed callee, blocks by path) or by called module;
        # a run takes the tables of its schema (`_description_tables`), so they outlive one capture.
        self._ops: dict[int, tuple] = {}
        self._calls: dict[tuple, tuple] = {}
        self._prefixes: dict[str, str] = {}
        self._next_counter: Optional[list] = None
        self._start_state(None)

    # -- run lifecycle ----------------------------------------------------------------------

    def _start_state(self, root: Optional[ModelBlockSchema]) -> None:
        self._root = root
        self._root_path = (root.path or root.name) if root is not None else ""
        self._module_blocks: Optional[dict[int, ModelBlockSchema]] = None
        self._kept = 0
        self._kept_bytes = 0
        self._exhausted: Optional[str] = None
        self._held: deque = deque()  # (number, bytes) of the values kept under limit_policy="latest", oldest first
        self._storages: dict[int, list[int]] = {}  # storage pointer -> numbers of the steps keeping it
        self._versions: list[int] = []  # version counter of each recorded value, as captured (by position)
        # With a keep selector the recorded steps are a subset: their numbers by position, and back
        self._numbers: Optional[list[int]] = [] if self.keep is not None else None
        self._positions: Optional[dict[int, int]] = {} if self.keep is not None else None
        self._records: list[list] = []  # the trace's pending records (see `_add`)
        self._count = 0  # steps seen by this recorder in this run
        # In a partly observed run, the tensors the unobserved blocks bound so far (`_unseen[0]`):
        # a step's number is both counts together, as in a run observed everywhere
        self._partly = self._next_counter is not None
        self._unseen = self._next_counter if self._next_counter is not None else [0]
        self._next_counter = None
        self._indexed = 0  # recorded positions whose storages are indexed
        self._grads: dict[int, torch.Tensor] = {}
        self._tracked: set[int] = set()
        self._hooked: dict[tuple[int, int], tuple[torch.Tensor, list[int]]] = {}
        self._return_vars: Optional[tuple[list[str], bool]] = None
        self.root_frame = None
        # (caller path, callee path) of each call a `call=` term names that this run could not
        # record: made through a value from a block the capture did not observe (warned at the end)
        self.missed_calls: list[tuple[str, str]] = []
        self.pending_warnings: list[Warning] = []  # emitted at the run's end, or by capture_run after it
        # trace step numbers whose tensor an instruction later changed in place: the step kept a
        # copy of its value as captured, and the live tensor differs from it afterwards
        self.changed_in_place: set[int] = set()

    def on_unobserved_counter(self, counter: list) -> None:
        self._next_counter = counter

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self._start_state(root)
        self._ops, self._calls, self._prefixes = _description_tables(root)
        self.trace = ActivationTrace(root=root.name)
        self.trace._build = functools.partial(_build_steps, self._prefixes)
        self._records = self.trace._pending
        sig = root.signature
        order = list(sig.params) + ([sig.vararg] if sig.vararg else []) + list(sig.kwonly) + \
            ([sig.kwarg] if sig.kwarg else []) if sig is not None else []
        names = [n for n in order if n in scope] + [n for n in scope if n not in order]
        for name in names:
            for suffix, tensor in tensors_in(scope[name], self.limits):
                self._add(tensor, "input", "Initial input tensor", name + suffix, "", "", 0)

    def on_instruction(self, event: InstructionEvent) -> None:
        instr = event.instruction
        if instr.__class__ is ReturnInstruction:
            self._returned(instr, event.frame, event.depth)
        elif isinstance(event.value, _Tensor):
            self._took(instr, event.frame, event.value, event.depth, event.block, event.path, event.frames)

    def tensor_result_hook(self) -> Optional[Callable[[Instruction, dict, Any], None]]:
        """`after(instr, frame, observer)` for the observer's direct path (see TraceListener), unless a
        subclass overrides `on_instruction`, which then gets its events as usual."""
        if type(self).on_instruction is not ActivationRecorder.on_instruction:
            return None
        returned, took, tensor = self._returned, self._took, _Tensor

        def after(instr: Instruction, frame: dict, observer: Any) -> None:
            if instr.__class__ is ReturnInstruction:
                returned(instr, frame, observer.depth)
                return
            out = instr.out_var
            value = frame.get(out) if out else None
            if isinstance(value, tensor):
                took(instr, frame, value, observer.depth, observer.block, observer.path, observer.frames)

        return after

    def _returned(self, instr: ReturnInstruction, frame: dict, depth: int) -> None:
        if depth == 0:
            self._return_vars = (list(instr.out_vars), instr.as_tuple)
            self.root_frame = frame

    def _took(self, instr: Instruction, frame: dict, value: torch.Tensor, depth: int, block: ModelBlockSchema,
              path: str, frames: Sequence[dict]) -> None:
        """`instr` bound the tensor `value` in `frame` (of `block`, at `path`, `depth`): one step."""
        # One lookup per step on the hot path: ops with a fixed callee are described once.
        if self.root_frame is None:
            self.root_frame = frames[0]
        keep = self.keep
        if keep is not None and (not keep.may_keep_activations(path) or keep.calls and keep.keeps_calls_only(path)
                                 and instr.__class__ is OpInstruction and instr.target.__class__ is not VarRef):
            # a step the selector cannot keep (there, or no block call where only calls are kept):
            # numbered as `_add` would number it, never described
            if instr.__class__ is OpInstruction or isinstance(instr, (OpInstruction, BlockInstruction)):
                self._count += 1
            return
        described = self._ops.get(id(instr))
        if described is None or described[2] is not instr:
            if instr.__class__ is OpInstruction or isinstance(instr, OpInstruction):
                described = self._describe_op(instr, frame)
            elif isinstance(instr, BlockInstruction):
                described = self._describe_block(instr, frame, block)
            else:
                return
        self._add(value, "activation", described[0], instr.out_var, described[1], path, depth)

    def on_value(self, path: str, depth: int, name: str, value: Any, description: str, op: str) -> None:
        if isinstance(value, _Tensor):  # reported at an intervention's site (an SAE's features): a step of its own
            self._add(value, "activation", description, name, op, path, depth)

    def on_before_mutation(self, instruction: Instruction, frame: dict) -> None:
        targets = mutated_tensors(instruction, frame)
        if not targets:
            return
        self._index_storages()
        for tensor in targets:
            ptr = _storage_ptr(tensor)
            numbers = self._storages.pop(ptr, None) if ptr else None
            for number in numbers or ():
                value = self._value_of(number)
                if value is not None:
                    value = value.detach().clone()
                    self._set_value(number, value)
                    self._versions[self._position(number)] = _version(value)
                    self.changed_in_place.add(number)

    def on_edit(self, event: EditEvent) -> None:
        """An edit of the variable the last step bound replaces that step's value (later edits do not)."""
        steps = self.trace.steps
        if not steps or not isinstance(event.new, _Tensor):
            return
        step = steps[-1]
        if step.slot_type != "activation" or step.out_var != event.name or step.frame_depth != event.depth:
            return
        old = event.old
        if not isinstance(old, _Tensor) or step.tensor.value is None or (
                step.tensor.value is not old and _storage_ptr(step.tensor.value) != _storage_ptr(old)):
            return
        new = event.new
        if self._indexed >= len(steps):  # re-index the step under the new value's storage
            for ptr, indexed in list(self._storages.items()):
                self._storages[ptr] = [n for n in indexed if n != step.step]
            self._indexed = len(steps) - 1
        step.tensor.value = new.detach() if new.requires_grad else new
        self._versions[len(steps) - 1] = _version(new)
        step.tensor.shape = _shape(new)
        step.tensor.dtype = str(new.dtype)
        step.edited = True
        if self.capture_grads:
            for entry in self._hooked.values():
                if entry[0] is old and step.step in entry[1]:
                    entry[1].remove(step.step)
            self._tracked.discard(step.step)
            if new.requires_grad:
                self._tracked.add(step.step)
                self._hook(new, step.step)

    def emit_warnings(self, stacklevel: int = 2) -> None:
        """Warn what this run has to say (`KeepMissedWarning`s), once; `stacklevel` as warnings.warn's."""
        pending, self.pending_warnings = self.pending_warnings, []
        for warning in pending:
            warnings.warn(warning, stacklevel=stacklevel + 1)

    def unobserved_call_hook(self) -> Optional[Callable[[Any], None]]:
        if self.keep is None or not self.keep.calls:
            return None
        return call_watch(self.keep, self._blocks_by_module, lambda missed: self.missed_calls.append(missed))

    def on_run_end(self, outputs: Any) -> None:
        if self.keep is not None and self.keep.calls:
            kept = [(r[5], r[3], r[4], r[2], r[1]) for r in self._records] + \
                [(s.block_path, s.out_var, s.op_name, s.slot_type, s.description) for s in self.trace._steps]
            self.pending_warnings.extend(empty_call_terms(self.keep, kept, self.missed_calls))
        if self.missed_calls:
            self.pending_warnings.append(missed_calls_warning(self.keep, self.missed_calls))
        if not self.defer_warnings:
            self.emit_warnings(stacklevel=3)
        self._drop_changed_values()
        names, as_tuple = self._return_vars or ([], False)
        if as_tuple and isinstance(outputs, tuple) and len(names) == len(outputs):
            items = [(name, item) for name, item in zip(names, outputs)]
        else:
            items = [(names[0] if len(names) == 1 else "output", outputs)]
        for name, item in items:
            for suffix, tensor in tensors_in(item, self.limits):
                self._add(tensor, "output", "Model output tensor", name + suffix, "", self._root_path, 0)
        self._hooked = {}  # the hooks stay on the tensors; only the identity map is dropped

    # -- steps ------------------------------------------------------------------------------

    def _add(self, tensor: torch.Tensor, slot_type: str, description: str, out_var: str, op_name: str,
             block_path: str, depth: int) -> None:
        # The hot path of a capture: one list per tensor, in the field order of `_build_steps`, which
        # makes the TraceStep (container id, shape tuple, dtype text, two dataclasses) when the trace
        # is read. What is recorded here is all the step will hold: the value as kept now, its shape
        # and dtype now, so a later in-place change (of the tensor or of its shape) cannot leak in.
        number = self._count = self._count + 1
        number += self._unseen[0]
        keep = self.keep
        if keep is not None:
            if not keep.matches(block_path, out_var, op_name, slot_type, keep.calls and is_block_call(description)):
                return  # counted (the numbers stay those of a full capture), not recorded
            self._positions[number] = len(self._numbers)  # type: ignore[index]
            self._numbers.append(number)  # type: ignore[union-attr]
        requires_grad = tensor.requires_grad
        if self.limits is None:
            value, omitted, sample = (tensor.detach() if requires_grad else tensor), None, ()
        else:
            value, omitted, sample = self._bounded(tensor, number)
        try:
            shape = tensor.size()  # `.shape`'s torch.Size, read faster (bench/bench_tensor_reads.py)
        except (RuntimeError, TypeError):  # a nested tensor has no single shape
            shape = ()
        self._records.append([number, description, slot_type, out_var, op_name, block_path, value, depth, omitted,
                              sample, shape, tensor.dtype])
        if value is None:
            self._versions.append(-1)
        else:
            try:
                self._versions.append(value._version)
            except (RuntimeError, AttributeError):  # as _version(): no version counter
                self._versions.append(-1)
                if isinstance(value, torch.Tensor) and value.is_inference():  # changes in place, uncounted:
                    self._records[-1][_VALUE] = value.clone()  # the value as it is now, a copy of its own
        if requires_grad and self.capture_grads:
            self._tracked.add(number)
            if value is not None:
                self._hook(tensor, number)

    def _position(self, number: int) -> int:
        """Where step `number` is among the recorded steps (all of them without a keep selector)."""
        return number - 1 if self._positions is None else self._positions[number]

    def _number_at(self, position: int) -> int:
        return position + 1 if self._numbers is None else self._numbers[position]

    def _record_of(self, number: int) -> Optional[list]:
        """Step `number`'s pending record, or None once the trace has built its TraceStep."""
        built = len(self.trace._steps)
        position = self._position(number)
        return self._records[position - built] if position >= built else None

    def _value_of(self, number: int) -> Any:
        record = self._record_of(number)
        return record[_VALUE] if record is not None else self.trace._steps[self._position(number)].tensor.value

    def _set_value(self, number: int, value: Any, omitted: Optional[str] = None) -> None:
        record = self._record_of(number)
        if record is not None:
            record[_VALUE] = value
            if omitted is not None:
                record[_OMITTED] = omitted
            return
        step = self.trace._steps[self._position(number)]
        step.tensor.value = value
        if omitted is not None:
            step.omitted = omitted

    def _drop_changed_values(self) -> None:
        """Values changed in place by an instruction not flagged `mutates` cannot be trusted: drop them.

        Every in-place op bumps the version counter that a kept alias shares with its tensor, so a
        version that moved since capture means the kept value is no longer the captured one.
        """
        versions = self._versions
        why = ("changed in place after capture by an op the schema does not flag as mutating (e.g. inplace "
               "passed positionally); the value at capture time was not kept")
        if self._partly:
            why = ("changed in place after capture, inside a block this capture did not observe (it holds nothing "
                   "keep= names) or by an op the schema does not flag as mutating; the value at capture time was "
                   "not kept: capture_run(..., observe_all=True) observes every block and keeps it")
        # one pass over the values where they are: built steps first, then the pending records
        built, records = self.trace._steps, self._records
        count = len(built)
        for position, captured in enumerate(versions):
            value = built[position].tensor.value if position < count else records[position - count][_VALUE]
            if value is None:
                continue
            try:
                now = value._version
            except (RuntimeError, AttributeError):  # as _version(): no version counter
                now = -1
            if now != captured:
                self._set_value(self._number_at(position), None, why)

    def _bounded(self, tensor: torch.Tensor, number: int) -> tuple[Any, Optional[str], tuple]:
        limits = self.limits
        nbytes = tensor.numel() * tensor.element_size()
        reason = self._exhausted
        if self.limit_policy == "latest":
            if nbytes > limits.max_bytes:
                reason = f"max_bytes quota: this tensor alone ({nbytes} bytes) is larger than max_bytes ({limits.max_bytes})"
            else:
                held = self._held
                while held and (len(held) >= limits.max_tensors or self._kept_bytes + nbytes > limits.max_bytes):
                    self._evict(*held.popleft())
                held.append((number, nbytes))
                self._kept_bytes += nbytes
                return (tensor.detach() if tensor.requires_grad else tensor), None, ()
        elif reason is None:
            if self._kept >= limits.max_tensors:
                reason = f"max_tensors quota reached ({limits.max_tensors} values kept)"
            elif self._kept_bytes + nbytes > limits.max_bytes:
                reason = (f"max_bytes quota reached ({self._kept_bytes} of {limits.max_bytes} bytes kept when a "
                          f"tensor of {nbytes} bytes came)")
            else:
                self._kept += 1
                self._kept_bytes += nbytes
                return (tensor.detach() if tensor.requires_grad else tensor), None, ()
            self._exhausted = reason  # like ModelCapture: once a quota runs out, no later value is kept
        per_sample = limits.max_samples_per_tensor
        values, _, why = sample_tensor(tensor, per_sample, per_sample * tensor.element_size())
        if why:
            reason += f"; no sample: {why}"
        return None, reason, values

    def _evict(self, number: int, nbytes: int) -> None:
        """limit_policy="latest": step `number`'s value makes room for a later one (a sample stays)."""
        self._kept_bytes -= nbytes
        value = self._value_of(number)
        limits = self.limits
        per_sample = limits.max_samples_per_tensor
        sample: tuple = ()
        why = ""
        if isinstance(value, _Tensor):
            sample, _, omission = sample_tensor(value, per_sample, per_sample * value.element_size())
            why = f"; no sample: {omission}" if omission else ""
        self._set_value(number, None, f"{EVICTED} (limit_policy='latest' keeps the latest values within "
                                      f"max_tensors={limits.max_tensors}, max_bytes={limits.max_bytes}){why}")
        record = self._record_of(number)
        if record is not None:
            record[_SAMPLE] = sample
        else:
            self.trace._steps[self._position(number)].sample = sample
        self._versions[self._position(number)] = -1

    def _index_storages(self) -> None:
        storages = self._storages
        for position in range(self._indexed, len(self._versions)):
            number = self._number_at(position)
            value = self._value_of(number)
            if value is not None:
                ptr = _storage_ptr(value)
                if ptr:
                    storages.setdefault(ptr, []).append(number)
        self._indexed = len(self._versions)

    # -- descriptions -----------------------------------------------------------------------

    def _describe_op(self, instr: OpInstruction, frame: dict) -> tuple:
        if isinstance(instr.target, VarRef):  # a callee fetched at run time may differ next time
            callee = frame.get(instr.target.name)
            if isinstance(callee, torch.nn.Module):  # `for layer in self: x = layer(x)` runs its block
                key = (id(instr), id(callee))
                cached = self._calls.get(key)
                if cached is None or cached[2] is not instr or cached[3] is not callee:
                    block = self._blocks_by_module().get(id(callee))
                    path = block.path if block is not None else type(callee).__name__
                    text = describe_block_call(path, block) if block is not None else \
                        f"Call to module {type(callee).__name__}"
                    cached = self._calls[key] = (text, path, instr, callee)
                return cached
            # What the description reads of a callee fetched at run time: its owner's type and name.
            owner = getattr(callee, "__self__", None)
            name = getattr(callee, "__name__", None)
            key = (id(instr), type(owner) if owner is not None else None,
                   name if isinstance(name, str) else type(callee))
            cached = self._calls.get(key)
            if cached is None or cached[2] is not instr:
                cached = self._calls[key] = (describe_op(callee_name(instr, frame)), op_name_of(instr, frame), instr)
            return cached
        described = self._ops[id(instr)] = (describe_op(callee_name(instr, frame)), op_name_of(instr, frame), instr)
        return described

    def _describe_block(self, instr: BlockInstruction, frame: dict, block: ModelBlockSchema) -> tuple:
        ref = instr.block_ref
        if instr.callee_var is not None:
            target = frame.get(instr.callee_var)
            key = (id(instr), id(target))
            cached = self._calls.get(key)
            if cached is None or cached[2] is not instr or cached[3] is not target:
                block = self._blocks_by_module().get(id(target))
                path = block.path if block is not None else ref.path
                cached = self._calls[key] = (describe_block_call(path, block, ref.method), path, instr, target)
            return cached
        key = (id(instr), id(block))
        cached = self._calls.get(key)
        if cached is None or cached[2] is not instr or cached[3]() is not block:
            try:
                callee: Optional[ModelBlockSchema] = block.find(ref.path)
            except KeyError:
                callee = None
            path = callee.path if callee is not None else ref.path
            cached = (describe_block_call(path, callee, ref.method), path, instr, weakref.ref(block))
            self._calls[key] = cached
        return cached

    def _blocks_by_module(self) -> dict[int, ModelBlockSchema]:
        if self._module_blocks is None:
            self._module_blocks = {}
            if self._root is not None:
                for block in self._root.iter_blocks():
                    if block.module is not None and block.method_name is None:
                        self._module_blocks.setdefault(id(block.module), block)
        return self._module_blocks

    # -- gradients --------------------------------------------------------------------------

    def _hook(self, tensor: torch.Tensor, number: int) -> None:
        # One hook per tensor version: after an in-place change the same object is another autograd
        # value, whose gradient differs from the one of the value captured before the change.
        key = (id(tensor), tensor._version)
        entry = self._hooked.get(key)
        if entry is not None and entry[0] is tensor:
            entry[1].append(number)
            return
        numbers = [number]
        store = self._grads

        def keep_gradient(grad: Optional[torch.Tensor], _numbers=numbers, _store=store) -> None:
            if grad is None:  # an unused output of a multi-output op (a piece of torch.split)
                return
            grad = grad.detach()
            for n in _numbers:
                previous = _store.get(n)
                # A first gradient is copied: autograd may reuse the buffer it hands to hooks.
                _store[n] = grad.clone() if previous is None else previous + grad

        tensor.register_hook(keep_gradient)
        self._hooked[key] = (tensor, numbers)

    def collect_gradients(self) -> GradientTrace:
        """The gradients of the last run's captured tensors, after your backward pass.

        One step per captured tensor that required grad, in activation order, with id `grad_<id>`
        and `source_container_id` pointing back. A tensor no gradient reached (backward not called
        yet, or not part of what was differentiated) has value None and says so in `omitted`.
        """
        if not self.capture_grads:
            raise RuntimeError("this ActivationRecorder does not capture gradients; create it with "
                               "ActivationRecorder(capture_grads=True) before the run")
        gradients = GradientTrace(root=self.trace.root)
        for step in self.trace.steps:
            if step.step not in self._tracked:
                continue
            grad = self._grads.get(step.step)
            omitted = None
            if grad is None:
                omitted = ("the activation value was not kept (capture limits)" if step.omitted else
                           "no gradient flows here: what was differentiated does not depend on this value "
                           "(or backward() was not called yet)")
            cid = "grad_" + step.container_id
            shape = _shape(grad) if grad is not None else step.tensor.shape
            dtype = str(grad.dtype) if grad is not None else step.tensor.dtype
            container = TensorContainer(shape=shape, dtype=dtype, value=grad, container_id=cid, slot_type="gradient")
            gradients.append(TraceStep(step.step, cid, f"Gradient of {lower_first(step.description)}", "gradient",
                                       step.out_var, step.op_name, step.block_path, container, step.container_id,
                                       step.frame_depth, omitted))
        return gradients
