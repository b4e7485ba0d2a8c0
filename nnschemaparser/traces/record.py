"""capture_run: one call that runs a schema with an ActivationRecorder and bundles what came out.

`ExecutionRecord` holds the outputs, the `ActivationTrace`, the root block's variables as they
were when it returned (`scope`), and, after the caller's backward pass, the `GradientTrace`.

Depends on interpreter, recorder and traces; never on views.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any, Optional

from .sampling import CaptureLimits
from ..runtime.listeners import RETURN_SLOT
from ..schema.errors import SchemaRunError
from ..runtime.interpreter import SchemaInterpreter, outputs_list
from .logged import capture_logged, logged_plan
from .wrapped import check_keep_reaches
from .recorder import ActivationRecorder
from ..runtime.coverage import LiveCallDetector
from ..runtime.backward_watch import watch_backward
from ..schema.model import ModelBlockSchema, coverage_frame
from .trace import ActivationTrace, GradientTrace
from .dropped import warn_dropped
from .estimate import check_fits, default_budget
from .capture_memory import capture_ended, capture_started

__all__ = ["ExecutionRecord", "capture_run"]


@dataclass
class ExecutionRecord:
    """What `capture_run` returns: outputs, trace, root scope, and gradients once backward ran."""

    outputs: list
    trace: ActivationTrace
    scope: dict
    recorder: ActivationRecorder = field(repr=False)
    live_calls: Optional[list] = field(default=None, repr=False)

    def coverage(self, helpers: bool = False):
        """What ran outside the schema during this run, as `ModelBlockSchema.coverage()` says it
        for the parse-time run (a branch the example input did not take may reach other code),
        and, once a backward pass went through the outputs, what it ran as real modules (rows of
        `phase` "backward": a checkpoint's recomputation, an adjoint solve).
        Only for a run made with `capture_run(..., coverage=True)`."""
        if self.live_calls is None:
            raise SchemaRunError("this run did not watch for live calls; run capture_run(..., coverage=True) "
                                 "(it traces Python calls during the run, which costs time), or read "
                                 "schema.coverage() for the parse-time run")
        return coverage_frame(self.live_calls, helpers)

    @property
    def gradients(self) -> GradientTrace:
        """The GradientTrace of this run; call backward() on something computed from `outputs` first."""
        if not self.recorder.capture_grads:
            raise SchemaRunError("this record has no gradients; run capture_run(..., capture_grads=True)")
        return self.recorder.collect_gradients()


def capture_run(block: ModelBlockSchema, scope: dict, capture_grads: bool = False,
                limits: Optional[CaptureLimits] = None, keep: Any = None,
                coverage: bool = False, observe_all: bool = False, limit_policy: str = "earliest",
                memory_check: bool = True, interventions: Any = None) -> ExecutionRecord:
    """Run `block` on `scope` ({input name: value}), capturing every intermediate tensor.

    The run goes through the same runtime `Program` as `SchemaInterpreter.run`, so outputs equal eager ones
    bit for bit; the schema itself is not modified. With `capture_grads=True`, call backward() on
    a loss built from `record.outputs`, then read `record.gradients`. With `coverage=True` the run
    also watches for code outside the schema (`runtime.coverage.LiveCallDetector`, a trace function,
    so the run is slower), and arms the same watch for a later backward pass through the outputs
    (`runtime.backward_watch`): `record.coverage()` lists both. The cyclic garbage collector
    is paused while the run goes (and resumed after it, if it was on).

    `keep` records only the steps a selector names (`"model.layers.3:hidden_states"`, `"op=*linear"`,
    `"call=model.layers.3"`, a list of terms; traces/selection.py): the others are not recorded, and
    the kept steps keep the numbers and container ids they have in a capture of everything. `call=`
    keeps a block's output where its caller binds it (what a forward hook on the module sees).

    A capture of everything runs the schema's logged program (traces/logged.py): plain generated
    code appending each tensor result to a list, the trace's steps built from it when read, equal
    to an observed capture's. With `keep=` the selector is compiled into the code
    (traces/keep_plan.py): the generated code appends only the kept tensors and counts the others,
    each instruction's decision made where its code is written (or, for a callee read at run time,
    by the module called). A schema whose closures bind tensors, with a selector whose block globs
    tell their callers' paths apart, cannot be decided there and runs observed, as below.

    `limits`, `interventions`, `coverage=True` and `observe_all=True` run the observed program,
    which hears of every step as it happens (so does a run that may bind inference tensors, which
    have no version counter: `logged.logged_plan`). With `keep=`, blocks that hold nothing the
    selector can keep (and lead to nothing it can) then run their plain generated code, which only
    counts the tensors they bind, and a `call=` term observes only the blocks that call what it
    names. A call it names that a block left unobserved makes through a value (a module passed in
    as an argument) cannot be recorded: a `KeepMissedWarning` names it and the fix. An in-place
    change, inside an unobserved block, of a value kept from an observed one is seen after it
    happens (the value dropped, `omitted` saying why); `observe_all=True`, like the logged program,
    sees it before (the value kept as captured).

    `interventions` ({selector: fn or tensor}, traces/interventions.py) replaces the values the
    selectors name as the run goes: the trace holds the new values (their steps `edited`), and
    gradients flow through them.

    Memory: before running, a capture without `limits` estimates its peak memory, what it keeps
    plus the working memory alive at its highest point (traces/estimate.py: a cheap bound from the
    parse-time shapes, then a dry run on fake tensors when the bound is not far below the budget)
    and refuses with `CaptureTooLargeError`, naming the estimate and the fixes, when that exceeds
    `MEMORY_FRACTION` (70%) of the available memory (/proc/meminfo MemAvailable);
    `memory_check=False` skips this. With `limits`, `limit_policy`
    says what happens past `CaptureLimits(max_tensors=..., max_bytes=...)`: "earliest" (the
    default) keeps the first values and drops every later one, "latest" evicts the oldest kept
    values so the last ones stay, "refuse" raises `CaptureTooLargeError` before running when the
    estimate does not fit the limits. Whatever was dropped is listed in `trace.dropped` and summed
    up in one `CaptureLimitWarning`.
    """
    if limit_policy not in ("earliest", "latest", "refuse"):
        raise ValueError(f"limit_policy must be 'earliest', 'latest' or 'refuse', got {limit_policy!r}")
    recorder = ActivationRecorder(capture_grads=capture_grads, limits=limits, keep=keep,
                                  limit_policy="earliest" if limit_policy == "refuse" else limit_policy)
    recorder.defer_warnings = True  # said after the run, pointing at the caller
    if isinstance(block, ModelBlockSchema):
        check_keep_reaches(block, recorder.keep)  # a keep of a wrapped model's paths, given its wrapper's schema
    if isinstance(block, ModelBlockSchema) and isinstance(scope, dict):
        if limits is not None and limit_policy == "refuse":
            check_fits(block, scope, recorder.keep, limits.max_bytes, f"CaptureLimits(max_bytes={limits.max_bytes})",
                       max_tensors=limits.max_tensors,
                       fixes="raise max_bytes, or let the capture drop values past it (limit_policy='earliest' "
                             "or 'latest')")
        elif limits is None and memory_check:
            budget = default_budget()
            if budget is not None:
                check_fits(block, scope, recorder.keep, *budget,
                           fixes="bound it: limits=CaptureLimits(max_bytes=..., max_tensors=...) with "
                                 "limit_policy='latest' keeps the last values that fit (memory_check=False runs "
                                 "it anyway)")
    # The cyclic GC is paused for the run: a capture allocates a record and keeps a tensor per step,
    # which starts young-generation collections that find nothing to free and, now and then, a
    # full collection of every object of the process (the slow rounds). Reference counting still
    # frees everything as usual; cycles made during the run wait until it ends.
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    heap_token = capture_started()  # the heap a dropped capture freed, kept for this one (capture_memory.py)
    try:
        detector = LiveCallDetector(block) if coverage else contextlib.nullcontext()
        with detector:  # what runs live, seen from the forwards' code objects
            logs, plan = (False, None) if coverage or observe_all else \
                logged_plan(block, scope, recorder, interventions)
            if logs:
                outputs = outputs_list(capture_logged(recorder, block, scope, plan))
            else:
                observe = recorder.keep.blocks_to_observe(block) if recorder.keep is not None and observe_all is False \
                    else None
                outputs = SchemaInterpreter(listeners=[recorder], observe=observe).run(block=block, scope=scope,
                                                                                       interventions=interventions)
    finally:
        if collecting:
            gc.enable()
    capture_ended(heap_token)
    said = bool(getattr(recorder, "pending_warnings", None))
    recorder.emit_warnings(stacklevel=2)
    trace = recorder.trace  # what it kept, counted without building its steps
    if recorder.keep is not None and not said and not trace._steps and not any(len(item) for item in trace._pending):
        import warnings

        from .missed import KeepMissedWarning, kept_nothing_message

        warnings.warn(KeepMissedWarning(kept_nothing_message(recorder.keep)), stacklevel=2)
    if limits is not None:
        warn_dropped(recorder.trace, recorder.limit_policy)
    live_calls = None
    if coverage:  # and what a backward pass through the outputs runs (rows of phase "backward")
        live_calls = [call.as_row() for call in detector.calls]
        watch_backward(block, outputs, live_calls)
    return ExecutionRecord(outputs=outputs, trace=recorder.trace, scope=_root_scope(block, scope, recorder.root_frame),
                           recorder=recorder, live_calls=live_calls)


def _root_scope(block: ModelBlockSchema, scope: dict, frame: Optional[dict]) -> dict:
    """The root block's variables when it returned, without its `self` and weights."""
    if frame is None:
        return dict(scope)
    sig = block.signature
    hidden = set(sig.weight_refs) if sig is not None else set()
    if sig is not None and sig.self_name:
        hidden.add(sig.self_name)
    return {k: v for k, v in frame.items() if k not in hidden and k != RETURN_SLOT}
