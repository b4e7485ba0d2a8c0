"""The inspector's Python-side state machine: one stepped run at a time, its edits, the runs so far.

`InspectorState` drives `SchemaInterpreter.step_run` one StepInfo at a time (step, step over,
continue, run to, reset; Step also stops at the pause before a sub-block call, a `CallPause`, so
that into and over are a choice there), applies and queues edits (a run with edits is a fork of the base run),
keeps every finished run as a `RunRecord` (with its ActivationTrace and GradientTrace), compares two
runs with `compare_traces` and bins a step's activation and gradient with `histogram_bins`. Its
`view_*` methods give the small JSON dicts the widget syncs as traits; the browser's requests are
answered by `messages.handle_message`. Nothing here imports traitlets or anywidget, so
the whole state machine is testable without a kernel.

Each run draws from its own copy of the CPU random generator, seeded from the state at construction,
so runs with dropout replay the same masks and the notebook's own generator is left untouched.

A paused run lives in a greenlet, and a greenlet can only be resumed from the thread that made it,
while a kernel may deliver the widget's messages on different threads. So every run is driven on
one worker thread owned by the state (`_RunThread`, in run_driver.py with the run driver); callers
on any thread wait for it, and the caller's grad mode is carried over to each call.

The tensor views (heatmap slices, differences of two runs, attention heads, trends, per-layer series,
tree colours) are the methods of `TensorRequests` (tensor_requests.py), which InspectorState inherits;
`viewed` remembers the steps asked for, so the static page keeps their heatmaps.

Depends on interpreter, errors, schema, capture (limits), compare, histograms and the widget's
tree/runs/edits/tensor_requests modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from ..traces.sampling import CaptureLimits
from ..traces.compare import TraceDiff, compare_traces, diff_summary
from ..schema.errors import EditError, NNSchemaError
from ..traces.frames import diffs_to_dataframe
from ..runtime.interpreter import CallPause, StepInfo
from ..schema.model import ModelBlockSchema
from .edits import EditSpec, apply_edit_spec, parse_edit
from .runs import RunRecord, default_loss, new_record
from .tree import INITIAL_TREE_BYTES, BlockTree
from .debugger import Breakpoints, Navigation
from . import value_memo
from .tensor_requests import TensorRequests
from .run_targets import RunTargets
from .run_driver import _Buffers, _RunDriver, _RunThread

__all__ = ["InspectorState", "InspectorOptions", "InspectorError"]


class InspectorError(NNSchemaError):
    """A request the inspector cannot carry out (unknown run, step out of range, nothing to step)."""


@dataclass(frozen=True)
class InspectorOptions:
    """Options of an inspector session.

    `gradients`: take the gradients of `loss_fn(outputs)` at the end of each run (default loss: the
    sum of squares of the differentiable outputs). `namespace`: extra names for edit expressions
    (the widget adds the notebook's names). `limits`: a CaptureLimits bounding the values each
    run's ActivationRecorder keeps (None: every value, as aliases). `bins`: histogram bins.
    """

    gradients: bool = True
    loss_fn: Optional[Callable[[list], Any]] = None
    namespace: Optional[Mapping[str, Any]] = None
    limits: Optional[CaptureLimits] = None
    tree_bytes: int = INITIAL_TREE_BYTES
    bins: int = 40


class InspectorState(RunTargets, Navigation, TensorRequests):
    """Stepping, edits, runs and comparisons of one schema on one input scope (search, breakpoints,
    step out and the call stack come from `debugger.Navigation`; tensor views from
    `tensor_requests.TensorRequests`; per-run bookkeeping from `run_targets.RunTargets`)."""

    navigation_error = InspectorError

    def __init__(self, schema: ModelBlockSchema, scope: Mapping[str, Any], options: Optional[InspectorOptions] = None):
        if not isinstance(schema, ModelBlockSchema):
            raise InspectorError(f"the inspector needs a ModelBlockSchema (from NNParser.parse_model), got "
                                 f"{type(schema).__name__}; parse the model first or use inspect_model_widget")
        if not isinstance(scope, Mapping):
            raise InspectorError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")
        self.schema = schema
        self.run_thread = _RunThread()
        self.scope = dict(scope)
        self.options = options or InspectorOptions()
        self.tree = BlockTree(schema)
        # called once a stepping command has moved the run, before its reply's extras (histograms,
        # heatmap, call stack) are computed: the widget syncs its traits, so the step card paints first
        self.moved_hook: Optional[Callable[[], None]] = None
        self.rng_state = torch.get_rng_state()
        self.buffers = _Buffers(schema)
        self.runs: list[RunRecord] = []
        self._last_run_id = 0  # run ids count up and are never given twice
        self.edits: list[EditSpec] = []
        self.current: Optional[StepInfo] = None
        self.pause: Optional[CallPause] = None  # paused before a sub-block call (after `current`)
        self.status = "ready"
        self.error = ""
        self.last_compare: Optional[dict] = None
        self._driver: Optional[_RunDriver] = None
        self._block_status: dict[int, str] = {}
        self._dropped_entered: set[int] = set()  # blocks entered and rows run by finished runs no longer kept
        self._dropped_executed: set[int] = set()
        self._compare_cache: Optional[tuple] = None
        self.breakpoints = Breakpoints(self.tree)
        self.stop_reason = ""
        self.viewed: list[tuple[str, int]] = []  # (run, trace step) of every tensor view asked for
        self.interventions: Optional[list] = None  # what every new run applies (a patched run: patch_view.py)
        self.reset()

    # -- runs ----------------------------------------------------------------------------------

    @property
    def active(self) -> RunRecord:
        return self._driver.record

    @property
    def step_index(self) -> int:
        return self.current.step_index if self.current is not None else 0

    def _name(self, fork: bool) -> str:
        taken = {run.name for run in self.runs}
        stem = "fork" if fork else "base"
        if not fork and stem not in taken:
            return stem
        k = 1 if fork else 2
        while f"{stem} {k}" in taken:
            k += 1
        return f"{stem} {k}"

    def run(self, name: "Optional[str | int]" = None) -> RunRecord:
        """The run called `name`, or whose id is `name` (an int; default: the active run)."""
        if name is None or name == "":
            return self.active
        if isinstance(name, int) and not isinstance(name, bool):
            for run in self.runs:
                if run.id == name:
                    return run
            known = ", ".join(f"#{r.id} {r.name!r}" for r in self.runs) or "(none)"
            raise InspectorError(f"no run has id {name}; the runs kept are {known}")
        for run in self.runs:
            if run.name == name:
                return run
        known = ", ".join(repr(r.name) for r in self.runs) or "(none)"
        raise InspectorError(f"no run named {name!r}; the runs so far are {known}")

    def reset(self, scope: Optional[Mapping[str, Any]] = None) -> None:
        """Abandon the current run and start a new one (on `scope` if given) replaying the queued edits."""
        if scope is not None:
            if not isinstance(scope, Mapping):
                raise InspectorError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")
            self.scope = dict(scope)
        if self._driver is not None:
            self._driver.close()
            if not self.active.finished:  # an abandoned run is gone, and with it its breakpoint hits
                self._forget_run(self.active)
        record = self._new_record(fork=bool(self.edits or self.interventions), edits=self.edits)
        self.runs.append(record)
        self.breakpoints.version += 1  # the hit counts listed are the new run's
        self._driver = _RunDriver(self, record)
        self.current = None
        self.pause = None
        self.status = "ready"
        self.error = ""
        self.stop_reason = ""  # why the run stopped belongs to that run

    def close(self) -> None:
        """Abandon the paused run (if any) and stop the run thread; a later step starts both again."""
        try:
            if self.status == "paused":
                self.reset()  # unwinds the paused greenlet on its own thread
        except RuntimeError:  # interpreter shutdown: no thread can run it any more
            pass
        self.run_thread.shutdown()

    def _new_record(self, fork: bool, edits: list[EditSpec]) -> RunRecord:
        self._last_run_id += 1
        return new_record(self._name(fork), edits, self.options.gradients, self.options.limits, self._last_run_id)

    def _advance(self, stop_at_calls: bool = False) -> bool:
        """One step (with `stop_at_calls`, or the pause before a sub-block call that comes first);
        False when the run cannot go on (finished or failed)."""
        if self.status in ("finished", "error"):
            return False
        while True:
            try:
                step = self._driver.advance()
            except Exception as exc:
                self.pause = None
                self.status = "error"
                self.error = f"the run failed at step {self.step_index + 1}: {type(exc).__name__}: {exc}"
                self.active.error = self.error
                return False
            if not isinstance(step, CallPause):
                break
            if stop_at_calls:
                self.pause = step
                self.status = "paused"
                return True
        self.pause = None
        if step is None:
            self._finish()
            return False
        self.current = step
        self.status = "paused"
        for spec in self.active.edits:
            if spec.step_index == step.step_index:
                try:
                    apply_edit_spec(step, spec, self._namespace())
                except EditError as exc:
                    self.error = f"the queued edit '{spec.describe()}' could not be replayed: {exc}"
        return True

    def _finish(self) -> None:
        self.status = "finished"
        record = self.active
        if self.options.gradients:
            record.collect_gradients(self.options.loss_fn or default_loss)
        self._update_block_status()

    def _new_action(self) -> None:
        """A new command: the message of the one before it (a refused edit, a replay) and the reason the
        run stopped are gone with it; a failed run keeps its error until Reset."""
        if self.status != "error":
            self.error = ""
        self.stop_reason = ""

    @property
    def position(self) -> "Optional[StepInfo | CallPause]":
        """Where the run is paused: the pause before a sub-block call, else the current step."""
        return self.pause if self.pause is not None else self.current

    def step(self) -> "Optional[StepInfo | CallPause]":
        """Step into: run one instruction, or stop at the pause before a sub-block call when one comes
        first; from that pause, enter the callee (its first instruction). Returns `position`."""
        self._new_action()
        self._advance(stop_at_calls=True)
        return self.position

    step_into = step

    def step_over(self) -> Optional[StepInfo]:
        """Run until the next step in the current frame or an outer one (a sub-block call runs whole;
        from the pause before a call, that is the call's own completion step)."""
        self._new_action()
        position = self.position
        depth = position.frame_depth if position is not None else None
        while self._advance():
            if depth is None or self.current.frame_depth <= depth:
                break
        return self.current

    def continue_(self) -> Optional[StepInfo]:
        """Run to the next breakpoint hit (see `break_at`), else to the end of the run."""
        self._new_action()
        while self._advance_checked():
            pass
        return self.current

    def run_to(self, step_index: int) -> Optional[StepInfo]:
        """Run until `step_index`; an earlier index replays the run from the start (same edits)."""
        if isinstance(step_index, bool) or not isinstance(step_index, int):
            try:
                step_index = int(step_index)
            except (TypeError, ValueError):
                raise InspectorError(f"run_to needs a step number, got {step_index!r}") from None
        if step_index < 1:
            raise InspectorError(f"steps are numbered from 1; run_to({step_index}) has nowhere to go")
        self._new_action()
        place = self._place()
        if step_index < self.step_index or (self.status in ("finished", "error") and step_index != self.step_index):
            self.reset()
            place = (0, False)
        while self.step_index < step_index and self._advance():
            pass
        if self.step_index < step_index and self.status == "finished":
            self._not_reached(place, f"step {step_index}")
        return self.current

    # -- edits ---------------------------------------------------------------------------------

    def _namespace(self) -> dict:
        return dict(self.options.namespace or {})

    def edit(self, action: str, argument: Any = None) -> EditSpec:
        """Edit the current step's value now and queue the edit; the run becomes a fork of the base run."""
        if self.pause is not None:
            raise EditError(f"paused before the call of {self.pause.callee_path}: there is no value of a step to edit "
                            "here; Step into the call, Step over it, or edit the step that bound an argument")
        if self.current is None or self.status != "paused":
            raise EditError("there is no paused step to edit; press Step first" if self.status == "ready" else
                            f"the run is {self.status}; press Reset to start a new run, then step to an edit point")
        try:
            spec = parse_edit(self.current, action, argument, seed=len(self.edits) + 1000 * self.current.step_index)
            apply_edit_spec(self.current, spec, self._namespace())
        except EditError as exc:  # in source words: "'$t74' is a float" names the statement instead
            message = self.tree.in_source_words(self.tree.node_of_instruction(self.current.instruction), str(exc))
            self.error = message  # shown until the next command
            if message != str(exc):
                raise EditError(message) from None
            raise
        record = self.active
        record.edits.append(spec)
        self.edits.append(spec)
        if not record.name.startswith("fork"):
            record.name = self._name(fork=True)
        self.error = ""
        return spec

    def remove_edit(self, index: int) -> EditSpec:
        """Drop queued edit `index`; the next run (after Reset) no longer replays it."""
        if not isinstance(index, int) or not 0 <= index < len(self.edits):
            raise InspectorError(f"there is no queued edit {index!r}; the queue has {len(self.edits)}")
        self._new_action()
        return self.edits.pop(index)

    def clear_edits(self) -> None:
        self._new_action()
        self.edits.clear()

    # -- comparison and histograms -------------------------------------------------------------

    def ensure_base(self) -> RunRecord:
        """The latest finished run without edits; one is run to the end first if there is none."""
        for run in reversed(self.runs):
            if run.finished and not run.edits:
                return run
        record = self._new_record(fork=False, edits=[])
        driver = _RunDriver(self, record)
        try:
            while driver.advance() is not None:
                pass
        finally:
            driver.close()
        if self.options.gradients:
            record.collect_gradients(self.options.loss_fn or default_loss)
        self.runs.insert(0, record)
        self._update_block_status()
        return record

    def compare(self, run_a: Optional[str] = None, run_b: Optional[str] = None) -> dict:
        """Compare two runs' traces (default: the base run and the active run) with compare_traces.

        Returns the summary, the first divergence and one row per TraceDiff (the traces' diff
        DataFrame columns plus the StepInfo index of each side).
        """
        a = self.run(run_a) if run_a else self.ensure_base()
        b = self.run(run_b) if run_b else self.active
        key = (id(a), a.version, len(a.trace.steps), id(b), b.version, len(b.trace.steps))
        if self._compare_cache is None or self._compare_cache[0] != key:
            diffs = compare_traces(a.trace, b.trace)
            self._compare_cache = (key, diffs, _diff_rows(diffs, a, b))
        _, diffs, rows = self._compare_cache
        first = next((i for i, d in enumerate(diffs) if d.changed or d.status != "ok"), None)
        self.last_compare = {"a": a.name, "b": b.name, "pairs": len(diffs), "summary": diff_summary(diffs),
                             "first": rows[first] if first is not None else None, "first_index": first}
        return {**self.last_compare, "rows": rows, "diffs": diffs}

    def histograms(self, step: Optional[int] = None, run: Optional[str] = None, *,
                   trace_step: Optional[int] = None) -> dict:
        """Activation and gradient bins of one step, by StepInfo index (default: the current step) or
        by trace step number; computed with the traces' `histogram_bins`, once per value (value_memo)."""
        record = self.run(run)
        if trace_step is None and step is None and self.pause is not None and record is self.active:
            trace_step = self.pause_trace_step()  # paused before a call: its first tensor argument
        if trace_step is None:
            index = self.step_index if step is None and record is self.active else step
            if index is None:
                index = len(record.steps)
            row = record.step_row(int(index))
            trace_step = row["trace_step"]
            if trace_step is None and row["step"] in record.returned:
                activation = self._bins(record.returned[row["step"]], None)
                note = {"note": "a returned value changed in place after it was bound: its gradient is that "
                                "of the tensor it was bound as"}
                return {"run": record.name, "step_index": row["step"], "trace_step": None, "var": row["var"],
                        "block": row["block"], "activation": activation, "gradient": note}
            if trace_step is None:
                note = {"note": f"step {row['step']} binds no tensor ({row['shape'] or 'no value'})"}
                return {"run": record.name, "step_index": row["step"], "trace_step": None, "var": row["var"],
                        "block": row["block"], "activation": note, "gradient": note}
        steps = record.trace.steps
        if not 1 <= int(trace_step) <= len(steps):
            raise InspectorError(f"run {record.name!r} has trace steps 1..{len(steps)}, not {trace_step}")
        traced = steps[int(trace_step) - 1]
        activation = self._bins(traced.tensor.value, traced.omitted)
        if record.gradients is not None:
            try:
                grad_step = record.gradients.for_activation(traced.container_id)
            except KeyError:
                gradient = {"note": "this tensor does not require grad"}
            else:
                gradient = self._bins(grad_step.tensor.value, grad_step.omitted)
        elif not self.options.gradients:
            gradient = {"note": "gradients are off for this inspector (gradients=False)"}
        elif not record.finished:
            gradient = {"note": "gradients come when the run has finished"}
        else:
            gradient = {"note": record.grad_note or "no gradients for this run"}
        changed = traced.step in record.recorder.changed_in_place
        if changed and isinstance(activation, dict) and "note" not in activation:
            activation["changed_later"] = ("the tensor was changed in place later in the run; this is its value at "
                                           f"trace step {traced.step}")
        return {"run": record.name, "step_index": record.trace_index.get(traced.step), "trace_step": traced.step,
                "container_id": traced.container_id, "var": traced.out_var, "block": traced.block_path,
                "activation": activation, "gradient": gradient, "changed_later": changed}

    def _bins(self, value: Any, omitted: Optional[str]) -> dict:
        if value is None:
            return {"note": omitted or "no value"}
        try:
            return value_memo.bins(value, self.options.bins)
        except (TypeError, ValueError, RuntimeError) as exc:
            return {"note": f"cannot bin this value: {exc}"}

    # -- views (the small JSON state the widget syncs) -----------------------------------------

    def view_step(self) -> dict:
        if self.pause is not None:
            return self.view_pause()
        step = self.current
        if step is None:
            return {"index": 0, "run": self.active.name}
        node = self.tree.node_of_instruction(step.instruction)
        value = step.value
        view = {"index": step.step_index, "run": self.active.name, "kind": step.kind, "var": step.out_var,
                "block": step.block_path, "depth": step.frame_depth, "node": node,
                "ancestors": self.tree.ancestors(node) if node >= 0 else [],
                "source_block": self.tree.block_of(node) if node >= 0 else -1,
                "line": step.location.lineno if step.location is not None else 0,
                "file": step.location.filename if step.location is not None else "",
                "type": type(value).__name__}
        row = self.active.step_row(step.step_index)
        # `text`: source words (the statement the instruction belongs to, as the source view shows it);
        # `instruction`: the lowered instruction ($t temporaries, intrinsics), for the lowered view only
        view.update(text=row["text"], instruction=row["text"], edited=row["edited"], trace_step=row["trace_step"])
        if node >= 0:
            holder = self.tree.statement_nodes.get(node, node)
            view["statement"] = self.tree.source_text(holder)
            view["text"] = self.tree.source_words(node)
        loc = step.location
        if loc is not None and loc.end_lineno:  # the column range of the instruction's source
            view.update(col=loc.col, end_line=loc.end_lineno, end_col=loc.end_col)
        if isinstance(value, torch.Tensor):
            view["shape"] = list(value.shape)
            view["dtype"] = str(value.dtype).replace("torch.", "")
            stats = value_memo.statistics(value)
            view["stats"] = {k: stats[k] for k in ("mean", "std", "min", "max", "numel")}
        elif isinstance(value, (bool, int, float)) or value is None:
            view["value"] = repr(value)
        return view

    def view_runs(self) -> list[dict]:
        return [run.summary() for run in self.runs]

    def view_edits(self) -> list[dict]:
        return [spec.to_dict() for spec in self.edits]

    def view_blocks(self) -> dict:
        """Blocks no run entered so far: {"known": any run finished, "never": [...], "live": [...]}."""
        known = any(run.finished for run in self.runs)
        never = sorted(n for n, s in self._block_status.items() if s == "never")
        live = sorted(n for n, s in self._block_status.items() if s == "live")
        return {"known": known, "never": never, "live": live, "untaken": list(getattr(self, "_untaken", []))}

    def never_run_paths(self) -> list[str]:
        """The paths of the outermost blocks no run entered so far (never-routed experts...); their
        own sub-blocks never ran either and are marked in the tree, not listed here."""
        never = set(self.view_blocks()["never"])
        return [self.tree.block_path(n) for n in sorted(never)
                if not any(a in never for a in self.tree.ancestors(n))]



def _diff_rows(diffs: list[TraceDiff], a: RunRecord, b: RunRecord) -> list[dict]:
    frame = diffs_to_dataframe(diffs)
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    for row in rows:
        for side in ("step_a", "step_b"):
            row[side] = int(row[side]) if row[side] is not None else None
        row["shape_a"] = list(row["shape_a"]) if row["shape_a"] is not None else None
        row["shape_b"] = list(row["shape_b"]) if row["shape_b"] is not None else None
        row["step_index_a"] = a.trace_index.get(row["step_a"]) if row["step_a"] is not None else None
        row["step_index_b"] = b.trace_index.get(row["step_b"]) if row["step_b"] is not None else None
    return rows
