"""A capture from a logged run: the trace's steps built from the run's log.

`capture_run` without `limits`, `interventions` or `coverage=True` runs the schema's logged
program (runtime/step_log.py): plain generated code that appends `(instruction, value, version)`
for each tensor result, with no call per step; with `keep=`, the kept logged program its selector
is compiled to (traces/keep_plan.py), which appends only the kept results, each with its number
(`(instruction, value, version, number)`), and counts the others. `capture_logged` drives it with an
`ActivationRecorder` and leaves the recorder and its trace as an observed capture would:

- the root's inputs and outputs are recorded by the recorder as always (`on_run_start`,
  `on_run_end`);
- in between, the trace's pending records hold one `LogSpan`, which becomes the very records an
  observed run makes (numbers, descriptions, op names, block paths, depths, container ids) when
  the trace is read: step numbers are positions in the log (or the numbers a kept log carries),
  depths and block paths come from its entry and exit marks, descriptions from the recorder's own
  tables;
- a value about to be changed in place by an instruction flagged `mutates` is copied first
  (`_MutationWatch`, the recorder's `on_before_mutation` on the log), and a value whose version
  counter moved otherwise is dropped at the run's end with the recorder's reason;
- with `capture_grads`, a tensor that requires grad is hooked at the run's end (or, if an
  instruction is about to change it in place, right before): the gradient of the value recorded.
  One case differs from an observed capture: a value changed in place by an op the schema does not
  flag as mutating gets no gradient (an observed capture hooked it before the change).

Shapes and dtypes are read when the steps are built: a value still holds them (its version is
unchanged since the run, or it was dropped and keeps its tensor's metadata), except those the
caller can reach and reshape in place before reading the trace (the outputs, the root's scope),
whose shapes are read at the run's end.

Depends on runtime (step_log, listeners), recorder, keep_plan, selection, tensor_walk and the schema.
"""

from __future__ import annotations

import operator
from typing import Any, Iterator, Optional

import torch

from ..runtime.step_log import FUNCTION, LoggedRun, loggable, run_logged
from ..schema.model import BlockInstruction, ModelBlockSchema, OpInstruction
from .keep_plan import KeepPlan, keep_plan
from .selection import is_block_call
from .recorder import ActivationRecorder
from .tensor_walk import _shape, _storage_ptr, mutated_tensors, tensors_in

__all__ = ["LogSpan", "capture_logged", "logged_plan", "inference_inputs", "module_holds_inference"]

_VALUE, _LOGGED_VERSION = operator.itemgetter(1), operator.itemgetter(2)
_VERSION_OF = torch.Tensor._version.__get__
_GRAD_OF = torch.Tensor.requires_grad.__get__

_DROPPED = ("changed in place after capture by an op the schema does not flag as mutating (e.g. inplace "
            "passed positionally); the value at capture time was not kept")


class LogSpan:
    """The activation steps of a logged run, in the trace's pending records until they are read."""

    __slots__ = ("entries", "marks", "base", "numbered", "describe", "dropped", "shapes")

    def __init__(self, run: LoggedRun, base: int, recorder: ActivationRecorder):
        self.entries = run.steps
        self.marks = run.marks
        self.base = base  # the number of the step before the first one (the root's inputs)
        # a kept log's entries carry their number (from the base) as their fourth item, the callee after it
        self.numbered = run.count is not None
        # not the recorder itself: it holds the trace, which holds this span (a cycle would keep the
        # values alive until a collection); until it is built, the span holds the schema it describes
        self.describe = _Descriptions(recorder)
        self.dropped: dict[int, str] = {}  # position -> why its value was not kept
        self.shapes: dict[int, tuple] = {}  # position -> shape at the run's end, for values the caller can reach

    def __len__(self) -> int:
        return len(self.entries)

    def number(self, position: int) -> int:
        """The step number of the entry at `position`."""
        return self.base + (self.entries[position][3] if self.numbered else position + 1)

    def records(self) -> list[list]:
        """The pending records (`recorder._build_steps`' layout) of these steps, as an observed run makes them."""
        return list(self.iter_records())

    def iter_records(self) -> Iterator[list]:
        """`records()` one at a time (a caller looking for one may stop early)."""
        describe = self.describe
        ops, describe_op, describe_block = describe._ops, describe._describe_op, describe._describe_block
        marks, count = self.marks, len(self.marks)
        dropped, shapes = self.dropped, self.shapes
        stack: list[tuple] = []  # (block, path) of each live frame
        block: Any = None
        path = ""
        places: dict[int, tuple] = {}
        m = 0
        number = base = self.base
        numbered = self.numbered
        at = 4 if numbered else 3  # where the callee is, when the entry has one
        for position, entry in enumerate(self.entries):
            while m < count and marks[m][1] <= position:
                kind = marks[m][0]
                if kind is None:
                    stack.pop()
                elif kind is FUNCTION:
                    stack.append((block, path))
                else:
                    place = places.get(id(kind))
                    if place is None:
                        entered = kind.block
                        place = places[id(kind)] = (entered, entered.path or entered.name)
                    stack.append(place)
                block, path = stack[-1] if stack else (None, "")
                m += 1
            number = base + entry[3] if numbered else number + 1
            instr, value = entry[0], entry[1]
            described = ops.get(id(instr))
            if described is None or described[2] is not instr:
                if instr.__class__ is OpInstruction or isinstance(instr, OpInstruction):
                    described = describe_op(instr, {instr.target.name: entry[at]} if len(entry) > at else {})
                else:
                    described = describe_block(instr, {instr.callee_var: entry[at]} if len(entry) > at else {}, block)
            omitted = dropped.get(position) if dropped else None
            shape = shapes.get(position) if shapes else None
            if shape is None:
                try:
                    shape = value.size()  # `.shape`'s torch.Size, read faster (bench/bench_tensor_reads.py)
                except (RuntimeError, TypeError):  # a nested tensor has no single shape
                    shape = ()
            kept = None if omitted is not None else (value.detach() if value.requires_grad else value)
            yield [number, described[0], "activation", instr.out_var, described[1], path, kept, len(stack) - 1,
                   omitted, (), shape, value.dtype]


class _Descriptions:
    """What the recorder's description methods read (its per-schema tables and root), without the recorder."""

    __slots__ = ("_ops", "_calls", "_root", "_module_blocks")

    def __init__(self, recorder: ActivationRecorder):
        self._ops, self._calls, self._root = recorder._ops, recorder._calls, recorder._root
        self._module_blocks = recorder._module_blocks

    _describe_op = ActivationRecorder._describe_op
    _describe_block = ActivationRecorder._describe_block
    _blocks_by_module = ActivationRecorder._blocks_by_module


class _MutationWatch:
    """`on_mutation` of a logged run: a logged value about to change in place is copied first."""

    def __init__(self, recorder: ActivationRecorder, base: int):
        self.recorder = recorder
        self.base = base
        self.numbered = recorder.keep is not None  # a kept log: each entry carries its number
        self.indexed = 0
        self.storages: dict[int, list[int]] = {}

    def __call__(self, instr: Any, frame: dict, entries: list) -> None:
        targets = mutated_tensors(instr, frame)
        if not targets:
            return
        self.recorder.on_before_mutation(instr, frame)  # the root's inputs, which the recorder holds itself
        storages = self.storages
        start, end = self.indexed, len(entries)  # indexed lazily: a run without in-place ops pays nothing
        try:  # the common case written out: dense tensors, whose storage has a data pointer
            for position in range(start, end):
                storages.setdefault(entries[position][1].untyped_storage().data_ptr(), []).append(position)
            if 0 in storages:  # a storage without data (meta, fake): `_storage_ptr` says what it is
                raise TypeError
        except (RuntimeError, NotImplementedError, TypeError):  # sparse, meta, fake: `_storage_ptr` says
            storages.pop(0, None)
            for lists in storages.values():
                while lists and lists[-1] >= start:
                    lists.pop()
            for position in range(start, end):
                ptr = _storage_ptr(entries[position][1])
                if ptr:
                    storages.setdefault(ptr, []).append(position)
        self.indexed = end
        recorder = self.recorder
        for tensor in targets:
            ptr = _storage_ptr(tensor)
            for position in (storages.pop(ptr, None) if ptr else None) or ():
                entry = entries[position]
                value, number = entry[1], self.base + (entry[3] if self.numbered else position + 1)
                if recorder.capture_grads and value.requires_grad and value._version == entry[2]:
                    recorder._tracked.add(number)
                    recorder._hook(value, number)
                copy = value.detach().clone()
                entries[position] = (entry[0], copy, copy._version) + entry[3:]
                recorder.changed_in_place.add(number)


def capture_logged(recorder: ActivationRecorder, block: ModelBlockSchema, scope: dict,
                   plan: Optional[KeepPlan] = None) -> Any:
    """Run `block` on `scope` through its logged program (with `plan`, the recorder's `keep=`
    compiled: traces/keep_plan.py), `recorder` recording as in an observed run; returns what
    forward returned."""
    recorder.on_run_start(block, scope)
    base = recorder._count
    outputs, run = run_logged(block, scope, _MutationWatch(recorder, base), plan)
    span = LogSpan(run, base, recorder)
    entries = span.entries
    count = len(entries) if run.count is None else run.count  # the tensor results, logged or not
    if run.returns:  # the root's frame as it returned (or as it entered, when no return ran)
        instr, frame = run.returns[-1]
        if instr is not None:
            recorder._return_vars = (list(instr.out_vars), instr.as_tuple)
        if instr is not None or count:
            recorder.root_frame = frame
    dropped, shapes = span.dropped, span.shapes
    # The tensors the caller gets back (outputs, the root's scope) may be reshaped in place before the
    # trace is read: theirs are the shapes read now; every other value's is read when its step is built.
    reachable = {id(tensor) for _, tensor in tensors_in(outputs)}
    if recorder.root_frame is not None:
        reachable.update(id(value) for value in recorder.root_frame.values() if isinstance(value, torch.Tensor))
    # the versions and ids read with `map` and compared as lists (in C); the steps walked only where one differs
    values = list(map(_VALUE, entries))
    if list(map(_VERSION_OF, values)) != list(map(_LOGGED_VERSION, entries)):
        for position, entry in enumerate(entries):
            if entry[1]._version != entry[2]:
                dropped[position] = _DROPPED
    ids = list(map(id, values))
    if not reachable.isdisjoint(ids):
        for position in [p for p, i in enumerate(ids) if i in reachable]:
            if position not in dropped:
                shapes[position] = _shape(values[position])
    if torch.is_grad_enabled() and any(map(_GRAD_OF, values)):  # hooks, and detached values (no graph kept)
        capture_grads, tracked = recorder.capture_grads, recorder._tracked
        for position, entry in enumerate(entries):
            value = entry[1]
            if value.requires_grad:
                if capture_grads:
                    number = span.number(position)
                    tracked.add(number)
                    if position not in dropped:
                        recorder._hook(value, number)
                entries[position] = (entry[0], value.detach()) + entry[2:]
    recorder._count += count
    if recorder.keep is not None and recorder.keep.calls:
        _end_with_calls(recorder, span, outputs)
    else:
        recorder._records.append(span)
        recorder.on_run_end(outputs)
    return outputs


def _end_with_calls(recorder: ActivationRecorder, span: LogSpan, outputs: Any) -> None:
    """The recorder's end of a kept run whose selector has `call=` terms. Its check that each such
    term kept something (`missed.empty_call_terms`) reads the pending records: it is given, for each
    term, the first of the span's records it matches (the span is walked only until every term has
    one, so the rest of its records are still built when the trace is read), then the span."""
    keep, records = recorder.keep, recorder._records
    left = [t for t in keep.terms if t.call is not None]
    witnesses = []
    for record in span.iter_records():
        hit = [t for t in left if t.matches(record[5], record[3], record[4], record[2], is_block_call(record[1]))]
        if hit:
            witnesses.append(record)
            left = [t for t in left if t not in hit]
            if not left:
                break
    at = len(records)
    records.extend(witnesses)
    recorder.on_run_end(outputs)
    records[at:at + len(witnesses)] = [span]


def logged_plan(block: Any, scope: Any, recorder: ActivationRecorder,
                interventions: Any) -> tuple[bool, Optional[KeepPlan]]:
    """(whether `capture_run` records through a logged program, the plan of its `keep=` selector):
    nothing asks for a decision per step that the code cannot make (no `limits`, no
    `interventions`, a `keep=` selector `keep_plan` can compile, a recorder whose class does not
    override the per-step hooks; `coverage=True` and `observe_all=True` are the caller's tests), no
    inference tensor can come out (their version cannot be read: not under
    `torch.inference_mode()`, none among the inputs, weights and buffers) and the schema can be
    logged (`runtime.step_log.loggable`)."""
    kind = type(recorder)
    if not (isinstance(block, ModelBlockSchema) and isinstance(scope, dict) and interventions is None
            and recorder.limits is None
            and kind.on_instruction is ActivationRecorder.on_instruction
            and kind.on_before_mutation is ActivationRecorder.on_before_mutation
            and kind.on_value is ActivationRecorder.on_value and loggable(block) is None
            and not _inference_tensors(block, scope)):
        return False, None
    if recorder.keep is None:
        return True, None
    plan, _ = keep_plan(block, recorder.keep)
    return plan is not None, plan


def _inference_tensors(block: ModelBlockSchema, scope: dict) -> bool:
    """Whether the run may bind inference tensors, which have no version counter to log."""
    return inference_inputs(scope) or module_holds_inference(block.module)


def inference_inputs(scope: dict) -> bool:
    """Whether a run on `scope` starts with inference tensors: under `torch.inference_mode()`, or one
    among the inputs."""
    if torch.is_inference_mode_enabled():
        return True
    return any(tensor.is_inference() for value in scope.values() for _, tensor in tensors_in(value))


def module_holds_inference(module: Any) -> bool:
    """Whether a parameter or buffer of `module` (or of a module under it) is an inference tensor."""
    if not isinstance(module, torch.nn.Module):
        return False
    # the module tree walked by hand: `parameters()` and `buffers()` name every module on the way,
    # which costs about a millisecond a run on a 32-layer model
    stack, seen = [module], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for tensors in (current._parameters, current._buffers):
            for tensor in tensors.values():
                if tensor is not None and tensor.is_inference():
                    return True
        stack.extend(child for child in current._modules.values() if child is not None)
    return False
