"""One stepped run as the inspector keeps it: its trace, its gradients, and where each step ran.

A run is recorded by two listeners. The package's `ActivationRecorder` writes the run's
`ActivationTrace` (one step per captured tensor, edits included) and hooks gradients;
`StepLog` writes one row per StepInfo (every leaf instruction, tensor or not), maps each
StepInfo to the trace step it produced, and notes the tree nodes executed and the blocks entered.
At the end of the run the gradients of `loss_fn(outputs)` are taken with `torch.autograd.grad`, which
feeds the recorder's hooks without touching any parameter's `.grad`.

Trace rows for the widget's table are built incrementally with the traces' own DataFrame code (a
row per trace step, computed once, recomputed only when an edit changes the step).

Depends on listeners, recorder, traces, frames, capture (limits), notation and the widget's tree;
knows nothing about widgets or the browser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..traces.sampling import CaptureLimits
from ..traces.frames import STEP_COLUMNS
from ..runtime.listeners import BlockEvent, EditEvent, InstructionEvent, TraceListener, instruction_kind
from ..schema.notation import instruction_text, value_repr
from ..traces.recorder import ActivationRecorder, tensors_in
from ..schema.model import BlockInstruction, ModelBlockSchema, OpInstruction, ReturnInstruction, VarRef
from ..traces.trace import ActivationTrace, GradientTrace
from .attention_calls import attention_function_name, capture_call
from .edits import EditSpec
from .tree import BlockTree, shape_text

__all__ = ["RunRecord", "StepLog", "default_loss", "TRACE_COLUMNS", "STEP_ROW_COLUMNS"]

# The trace table: the traces' DataFrame columns, plus the StepInfo index that produced the step and
# whether an edit replaced its value.
TRACE_COLUMNS = list(STEP_COLUMNS) + ["step_index", "edited"]
STEP_ROW_COLUMNS = ["step", "block", "var", "kind", "op", "shape", "depth", "line", "node", "trace_step", "text",
                    "edited"]


def _op_name(instr: Any) -> str:
    if isinstance(instr, OpInstruction):
        name = instr.qualified_name
        return instr.display_name if not name or name.startswith("$") else name
    if isinstance(instr, BlockInstruction):
        return "CALL " + (instr.callee_var or instr.block_ref.path or "self")
    return instruction_kind(instr)


def _differentiable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()


def default_loss(outputs: list) -> torch.Tensor:
    """The sum of squares of every differentiable output tensor (the spec's `outputs[0].pow(2).sum()`)."""
    tensors = [t for item in outputs for _, t in tensors_in(item) if _differentiable(t)]
    if not tensors:
        raise ValueError("no output of the run requires grad, so there is nothing to differentiate; give the "
                         "inputs requires_grad=True or keep the model's parameters trainable")
    return sum(t.float().pow(2).sum() for t in tensors)


@dataclass
class RunRecord:
    """A run: its id, its name, the edits it replays, its trace, its StepInfo rows and (after the end)
    gradients. `id` is the run's identity, never given to another run of the inspector; `name` is for
    display ("base", "fork 1") and may be given again to a later run once this one is gone or renamed."""

    name: str
    recorder: ActivationRecorder
    id: int = 0
    edits: list[EditSpec] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    trace_index: dict[int, int] = field(default_factory=dict)  # trace step -> StepInfo index
    live: list[torch.Tensor] = field(default_factory=list)
    returned: dict[int, torch.Tensor] = field(default_factory=dict)  # StepInfo index -> value (see StepLog)
    block_stack: list[tuple[str, int]] = field(default_factory=list)  # (path, tree node) of each live block
    entered_paths: set[str] = field(default_factory=set)  # blocks entered whose first own step is to come
    entry_steps: set[int] = field(default_factory=set)  # StepInfo indices that are a block call's first own step
    entered: set[int] = field(default_factory=set)
    executed: set[int] = field(default_factory=set)
    attention_calls: list[dict] = field(default_factory=list)  # inputs of each attention call (attention_calls.py)
    gradients: Optional[GradientTrace] = None
    outputs: Optional[list] = None
    finished: bool = False
    error: str = ""
    grad_note: str = ""
    version: int = 0
    _rows: list[dict] = field(default_factory=list, repr=False)
    _dirty: set[int] = field(default_factory=set, repr=False)

    @property
    def trace(self) -> ActivationTrace:
        return self.recorder.trace

    @property
    def is_fork(self) -> bool:
        return bool(self.edits)

    def summary(self) -> dict:
        return {"id": self.id, "name": self.name, "steps": len(self.steps), "trace_steps": len(self.trace.steps),
                "edits": len(self.edits), "finished": self.finished, "error": self.error, "fork": self.is_fork}

    def step_row(self, step_index: int) -> dict:
        if not 1 <= step_index <= len(self.steps):
            raise KeyError(f"run {self.name!r} (#{self.id}) has steps 1..{len(self.steps)}, not {step_index}")
        return self.steps[step_index - 1]

    def trace_rows(self) -> list[dict]:
        """One dict per trace step (TRACE_COLUMNS), computed once per step and again after an edit."""
        steps = self.trace.steps
        todo = sorted(self._dirty | set(range(len(self._rows), len(steps))))
        if todo:
            frame = ActivationTrace(steps=[steps[i] for i in todo]).to_dataframe()
            records = frame.astype(object).to_dict("records")  # NaN stays NaN: a NaN mean is news
            for index, record in zip(todo, records):
                step = steps[index]
                record["shape"] = list(step.tensor.shape)
                record["step_index"] = self.trace_index.get(step.step)
                record["edited"] = bool(getattr(step, "edited", False))
                if index < len(self._rows):
                    self._rows[index] = record
                else:
                    self._rows.append(record)
            self._dirty.clear()
        return self._rows

    def to_dataframe(self) -> Any:
        """The run's trace DataFrame: the traces' columns plus `step_index` and `edited` (needs pandas)."""
        frame = self.trace.to_dataframe()
        frame["step_index"] = [self.trace_index.get(step.step) for step in self.trace.steps]
        frame["edited"] = [bool(getattr(step, "edited", False)) for step in self.trace.steps]
        return frame

    def steps_dataframe(self) -> Any:
        """One row per StepInfo of the run (every leaf instruction), STEP_ROW_COLUMNS (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.steps, columns=STEP_ROW_COLUMNS)

    def collect_gradients(self, loss_fn: Callable[[list], Any]) -> None:
        """Gradients of `loss_fn(outputs)` into the recorder's hooks, then the GradientTrace."""
        if self.outputs is None:
            self.grad_note = "the run has not finished"
            return
        tensors = [t for t in self.live if t.requires_grad]
        try:
            loss = loss_fn(self.outputs)
            if not tensors:
                raise ValueError("no step of the run produced a tensor that requires grad")
            torch.autograd.grad(loss, tensors, allow_unused=True)
        except Exception as exc:  # shown next to the histograms; the run itself stands
            self.grad_note = f"no gradients: {type(exc).__name__}: {exc}"
            self.gradients = None
        else:
            self.gradients = self.recorder.collect_gradients()
            self.grad_note = ""
        self.live.clear()


class StepLog(TraceListener):
    """Fills a RunRecord's StepInfo rows; must come after the run's ActivationRecorder in the listeners."""

    def __init__(self, record: RunRecord, tree: BlockTree, keep_live: bool = True):
        self.record = record
        self.tree = tree
        self.keep_live = keep_live
        self._seen_trace = 0
        self._last_of_var: dict[tuple[int, str], int] = {}  # (frame depth, var) -> its latest trace step
        self._not_attention: set[int] = set()  # ids of op instructions whose fixed callee is no attention call

    def _map_new_trace_steps(self, step_index: int) -> Optional[int]:
        steps = self.record.trace.steps
        last = None
        for step in steps[self._seen_trace:]:
            self.record.trace_index[step.step] = step_index
            self._last_of_var[(step.frame_depth, step.out_var)] = step.step
            last = step.step
        self._seen_trace = len(steps)
        return last

    def trace_step_of(self, depth: int, var: str) -> Optional[int]:
        """The latest trace step that bound `var` in frame `depth` so far (None: none did)."""
        self._map_new_trace_steps(len(self.record.steps))
        return self._last_of_var.get((depth, var))

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self._map_new_trace_steps(0)
        for value in scope.values():
            for _, tensor in tensors_in(value):
                if self.keep_live and tensor.requires_grad and tensor.is_floating_point():
                    self.record.live.append(tensor)

    def on_block_enter(self, event: BlockEvent) -> None:
        node = self.tree.node_of_block(event.block)
        if node >= 0:
            self.record.entered.add(node)
        self.record.block_stack.append((event.path, node))
        self.record.entered_paths.add(event.path)

    def on_block_exit(self, event: BlockEvent) -> None:
        if self.record.block_stack:
            self.record.block_stack.pop()

    def on_instruction(self, event: InstructionEvent) -> None:
        record = self.record
        instr = event.instruction
        step_index = len(record.steps) + 1
        node = self.tree.node_of_instruction(instr)
        if node >= 0:
            record.executed.add(node)
        if not event.stepped:  # an if test or a while re-evaluation: traced, but no step (spec 000)
            return
        value = event.value
        if event.path in record.entered_paths:  # a block's first own step may follow calls of its sub-blocks
            record.entered_paths.discard(event.path)
            record.entry_steps.add(step_index)
        record.steps.append({
            "step": step_index, "block": event.path, "var": instr.out_var, "kind": instruction_kind(instr),
            "op": _op_name(instr), "shape": shape_text(value_repr(value)) if event.has_value else "",
            "depth": event.depth, "line": instr.location.lineno if instr.location is not None else 0,
            "node": node, "trace_step": self._map_new_trace_steps(step_index), "text": instruction_text(instr),
            "edited": False})
        if isinstance(instr, ReturnInstruction) and len(instr.out_vars) == 1 and isinstance(value, torch.Tensor):
            # a return is not a trace step of its own: show the trace step of the variable it returns,
            # unless that tensor was changed in place since (then the trace holds its older value, and
            # the value returned is kept here, as it is now)
            bound = self._last_of_var.get((event.depth, instr.out_vars[0]))
            if bound is not None and bound in record.recorder.changed_in_place:
                record.returned[step_index] = value.detach().clone()
                bound = None
            record.steps[-1]["trace_step"] = bound
        if self.keep_live and _differentiable(value):
            record.live.append(value)
        if isinstance(instr, OpInstruction) and id(instr) not in self._not_attention:
            self._note_attention(instr, event, step_index)

    def _note_attention(self, instr: OpInstruction, event: InstructionEvent, step_index: int) -> None:
        """Keep the inputs of an attention call, for its heads recomputed on demand."""
        if not isinstance(instr.target, VarRef) and not attention_function_name(instr.target):
            self._not_attention.add(id(instr))  # a callee fixed at lowering time: decided once
            return
        call = capture_call(instr, event.frame)
        if call is not None:
            call.update(step=step_index, block=event.path, node=self.record.steps[-1]["node"])
            self.record.attention_calls.append(call)

    def on_edit(self, event: EditEvent) -> None:
        record = self.record
        if not record.steps:
            return
        row = record.steps[-1]
        if row["var"] == event.name:
            row["edited"] = True
            row["shape"] = shape_text(value_repr(event.new))
        if row["trace_step"] is not None:
            record._dirty.add(row["trace_step"] - 1)
        if self.keep_live and _differentiable(event.new):
            record.live.append(event.new)
        record.version += 1

    def on_run_end(self, outputs: Any) -> None:
        self._map_new_trace_steps(len(self.record.steps))


def new_record(name: str, edits: list[EditSpec], gradients: bool, limits: Optional[CaptureLimits],
               run_id: int = 0) -> RunRecord:
    return RunRecord(name=name, recorder=ActivationRecorder(capture_grads=gradients, limits=limits),
                     edits=list(edits), id=run_id)
