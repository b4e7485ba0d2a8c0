"""A capture of everything read as columns: what an activation store writes of a logged run.

`capture_run(schema, scope)` leaves a logged run's steps in one `LogSpan` (traces/logged.py), and
`LogSpan.records()` makes each step's record, with a Python loop over the steps that walks the
entry and exit marks and looks up every description: about as long again as the run, on a
dispatch-bound model. A store writes thousands of runs of one schema that take the same path.
`LoggedColumns` runs the same logged capture (`capture_logged`, with an `ActivationRecorder`, the
root's inputs and outputs recorded as always) and gives the steps as parallel lists; the metadata
of the span's steps (numbers, descriptions, out vars, op names, block paths, depths) is worked out
by `records()` once and reused for every later run whose log has the same instructions, marks and
callees (compared as lists, in C), so a run costs the log's values, shapes and dtypes read with
`map` over the steps. The lists equal those of the records `capture_run`'s trace holds, value for
value (`tests/store/test_logged_columns.py`).

What a span's metadata depends on, and is compared: each step's instruction (by identity), the
marks (the blocks entered and left, and where), the step numbers' base (the root's input count),
and, for a step whose description reads the callee fetched at run time, what `_describe_op` /
`_describe_block` read of it: the callees' types first (which decide how each is compared), then a
module or a block call's target by identity (held, so its id is not reused; one `map(operator.is_)`),
a builtin method by its owner's type and its name (read with `map`), another callable by its owner's
type and its name.

A run `capture_run` would not log (`logged.logged_plan`: an inference tensor among the inputs, a schema
that cannot be logged) is left to the caller: `capture` gives None. The model's weights and buffers
are checked for inference tensors once, when the object is made.

Depends on the runtime (step_log, interpreter), the schema and this stage's logged capture.
"""

from __future__ import annotations

import operator
import types
from typing import Any, Optional

import torch

from ..runtime.interpreter import outputs_list
from ..runtime.program import programs_for
from ..runtime.step_log import loggable
from ..schema.model import BlockInstruction, ModelBlockSchema
from .capture_memory import capture_ended, capture_started
from .estimate import check_fits, default_budget
from .logged import LogSpan, capture_logged, inference_inputs, module_holds_inference
from .recorder import ActivationRecorder

__all__ = ["LoggedColumns", "StepFields"]

_INSTR, _VALUE, _CALLEE = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)
_SELF, _NAME = operator.attrgetter("__self__"), operator.attrgetter("__name__")  # of a builtin method
_SHAPE_OF = torch.Tensor.size  # the torch.Size `.shape` gives, read faster (bench/bench_tensor_reads.py)
_DTYPE_OF = torch.Tensor.dtype.__get__
_GRAD_OF = torch.Tensor.requires_grad.__get__

# numbers, descriptions, slot types, out vars, op names, block paths, values, depths, omitted, shapes, dtypes
StepFields = tuple


class _SpanMeta:
    """The metadata of one span's steps and what it was worked out from."""

    __slots__ = ("instrs", "marks", "base", "callee_at", "take_callees", "kinds", "take_builtin", "take_same",
                 "take_others", "keys", "same", "columns")

    def __init__(self, span: LogSpan, records: list[list]):
        entries = span.entries
        self.instrs = list(map(_INSTR, entries))
        self.marks = list(span.marks)
        self.base = span.base
        self.callee_at = [p for p, entry in enumerate(entries) if len(entry) > 3]
        self.take_callees = _getter(self.callee_at)
        callees = [entries[p][3] for p in self.callee_at]
        self.kinds = list(map(type, callees))
        # by what the recorder's `_describe_op` / `_describe_block` read of the callee: a builtin method of an op
        # (most callees: `x.view`), its owner's type and its name; a module or a block call's target, the object
        # itself (held, so its id stays its own); another callable, its owner's type and name
        method, module = types.BuiltinMethodType, torch.nn.Module
        builtin, same, others = [], [], []
        for k, (p, callee, kind) in enumerate(zip(self.callee_at, callees, self.kinds)):
            block = isinstance(self.instrs[p], BlockInstruction)
            (builtin if kind is method and not block else same if block or isinstance(callee, module) else
             others).append(k)
        self.take_builtin, self.take_same, self.take_others = _getter(builtin), _getter(same), _getter(others)
        self.same = self.take_same(callees)
        self.keys = self._keys(callees)
        n = len(records)
        # numbers, descriptions, slot types, out vars, op names, block paths, depths; and omitted when nothing is
        self.columns = ([r[0] for r in records], [r[1] for r in records], ["activation"] * n,
                        [r[3] for r in records], [r[4] for r in records], [r[5] for r in records],
                        [r[7] for r in records], [None] * n)

    def _keys(self, callees: list) -> tuple:
        """The owners' types and the names of the builtin methods (read with `map`), and what is read of the
        other callables that are neither modules nor block targets (few)."""
        builtin = self.take_builtin(callees)
        others = []
        for callee in self.take_others(callees):
            owner = getattr(callee, "__self__", None)
            name = getattr(callee, "__name__", None)
            others.append((type(owner) if owner is not None else None, name if isinstance(name, str) else type(callee)))
        return list(map(type, map(_SELF, builtin))), list(map(_NAME, builtin)), others

    def fits(self, span: LogSpan) -> bool:
        entries = span.entries
        if span.base != self.base or len(entries) != len(self.instrs) or span.marks != self.marks:
            return False
        if list(map(_INSTR, entries)) != self.instrs:
            return False
        if not self.callee_at:
            return True
        try:
            callees = list(map(_CALLEE, self.take_callees(entries)))
        except IndexError:  # pragma: no cover - an instruction's log line has a fixed arity
            return False
        if list(map(type, callees)) != self.kinds:  # the kinds decide how each callee is compared
            return False
        return all(map(operator.is_, self.take_same(callees), self.same)) and self._keys(callees) == self.keys


def _getter(positions: list[int]) -> Any:
    """A C-level `lambda seq: tuple(seq[i] for i in positions)`."""
    if not positions:
        return lambda seq: ()
    if len(positions) == 1:
        only = positions[0]
        return lambda seq: (seq[only],)
    return operator.itemgetter(*positions)


_KEY = "logged columns"  # the last span metadata of a schema's runs, kept in its cache of programs


class LoggedColumns:
    """Logged captures of one schema as step columns (see the module text); one per run of inputs."""

    def __init__(self, schema: ModelBlockSchema):
        self.schema = schema
        self.usable = (isinstance(schema, ModelBlockSchema) and loggable(schema) is None
                       and not module_holds_inference(schema.module))

    @property
    def meta(self) -> Optional[_SpanMeta]:
        """The metadata of the last span read of this schema's runs (kept with the schema's programs, from store to store)."""
        return programs_for(self.schema).get(_KEY)

    def capture(self, scope: Any) -> Optional[tuple[list, StepFields]]:
        """(outputs, step fields) of a capture of everything of `scope`, as `capture_run(schema, scope)` records it
        (its memory check included); None where capture_run would not log the run (the caller runs capture_run)."""
        schema = self.schema
        if not self.usable or not isinstance(scope, dict) or inference_inputs(scope):
            return None
        budget = default_budget()
        if budget is not None:
            check_fits(schema, scope, None, *budget,
                       fixes="bound it: limits=CaptureLimits(max_bytes=..., max_tensors=...) with "
                             "limit_policy='latest' keeps the last values that fit (memory_check=False runs it anyway)")
        recorder = ActivationRecorder()
        recorder.defer_warnings = True
        heap_token = capture_started()  # the heap the last input's dropped values freed (capture_memory.py)
        outputs = outputs_list(capture_logged(recorder, schema, scope))
        capture_ended(heap_token)
        recorder.emit_warnings(stacklevel=3)
        return outputs, self.fields(recorder.trace._pending)

    def fields(self, pending: list) -> StepFields:
        """The step fields of a trace's pending records: lists, and one LogSpan."""
        spans = [k for k, item in enumerate(pending) if type(item) is not list]
        if len(spans) != 1:
            return _of_records(_expanded(pending))
        k = spans[0]
        span = pending[k]
        meta = self.meta
        if meta is None or not meta.fits(span):
            meta = programs_for(self.schema)[_KEY] = _SpanMeta(span, span.records())
        values, shapes, dtypes, omitted = _span_values(span, meta.columns[7])
        before, after = pending[:k], pending[k + 1:]
        numbers, descriptions, slot_types, out_vars, op_names, paths, depths, _ = meta.columns
        if not before and not after:
            return numbers, descriptions, slot_types, out_vars, op_names, paths, values, depths, omitted, shapes, dtypes
        head, tail = _of_records(before), _of_records(after)
        middle = (numbers, descriptions, slot_types, out_vars, op_names, paths, values, depths, omitted, shapes, dtypes)
        return tuple(a + b + c for a, b, c in zip(head, middle, tail))


def _span_values(span: LogSpan, none: list) -> tuple[list, list, list, list]:
    """(values as kept, shapes, dtypes, omitted) of a span's steps, as `LogSpan.records` reads them."""
    entries = span.entries
    raw = list(map(_VALUE, entries))
    try:
        shapes = list(map(_SHAPE_OF, raw))
    except (RuntimeError, TypeError):  # a nested tensor has no single shape
        shapes = []
        for value in raw:
            try:
                shapes.append(value.shape)
            except (RuntimeError, TypeError):
                shapes.append(())
    dtypes = list(map(_DTYPE_OF, raw))
    values = [v.detach() if v.requires_grad else v for v in raw] if any(map(_GRAD_OF, raw)) else raw
    if span.shapes:
        for position, shape in span.shapes.items():
            shapes[position] = shape
    omitted = none
    if span.dropped:
        omitted = list(none)
        if values is raw:
            values = list(raw)
        for position, why in span.dropped.items():
            omitted[position] = why
            values[position] = None
    return values, shapes, dtypes, omitted


def _expanded(pending: list) -> list[list]:
    records: list[list] = []
    for item in pending:
        records.extend([item] if type(item) is list else item.records())
    return records


def _of_records(records: list[list]) -> StepFields:
    """The step fields of pending records (the recorder's `_build_steps` layout)."""
    if not records:
        return ([],) * 11
    numbers, descriptions, slot_types, out_vars, op_names, paths, values, depths, omitted, _, shapes, dtypes = \
        map(list, zip(*records))
    return numbers, descriptions, slot_types, out_vars, op_names, paths, values, depths, omitted, shapes, dtypes
