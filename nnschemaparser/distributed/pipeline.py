"""A schema per pipeline stage (`torch.distributed.pipelining`), with captures and whole-batch edits.

The tracer-based `pipeline(module, mb_args, split_spec=...)` splits an `torch.export` graph, so what
runs in each stage is FX code, not the module's forward: a schema cannot run there. Manual stages
can: split the model's layers into one module per stage (`nn.Module`s holding the stage's share of
the layers, the same sub-modules as the whole model), parse each with `NNParser.parse_model`, and
give `PipelineStage` a `SchemaStage(module, schema, stage_index)` instead of the module. A schedule
(`ScheduleGPipe`, ...) then calls it once per micro-batch, and each call runs the stage's schema on
that micro-batch: bit for bit the stage module's own forward.

- `capture=True` (and `keep=` as in `capture_run`) keeps one `StageCapture` per call: the stage
  index and name, the micro-batch, and the `ActivationTrace` of that call.
- `edits=[PlacedEdit(block, var, values)]` replaces a variable when a call binds it. `values` is the
  value for the whole batch; each micro-batch gets its piece along `dim` (the schedule splits the
  batch with `torch.tensor_split`, and so does the edit), so an edit on stage 0 gives the output
  the same edit gives in one process. `microbatches` says how many pieces the schedule makes
  (calls are counted, micro-batch = call number modulo `microbatches`; `reset()` restarts the count).

Depends on the runtime (the interpreter and `apply_edit`) and the traces' recorder only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ..runtime.interpreter import SchemaInterpreter, apply_edit
from ..runtime.listeners import EditEvent, InstructionEvent, TraceListener
from ..schema.errors import EditError, SchemaRunError
from ..schema.model import ModelBlockSchema
from ..traces.recorder import ActivationRecorder
from ..traces.trace import ActivationTrace

__all__ = ["SchemaStage", "StageCapture", "PlacedEdit", "PlaceEditor"]


@dataclass
class PlacedEdit:
    """Replace `var` in block `block` (a path of the stage's schema, "" for its root) the
    `occurrence`-th time a run binds it (1: the first) with the run's piece of `values`, the value
    for the whole batch: with `dim=None` every run gets `values` itself; with `dim=d` run i of n gets
    `torch.tensor_split(values, n, d)[i]` (a micro-batch's rows)."""

    block: str
    var: str
    values: torch.Tensor
    occurrence: int = 1
    dim: Optional[int] = 0

    def __post_init__(self) -> None:
        if not isinstance(self.block, str) or not isinstance(self.var, str) or not self.var:
            raise EditError("PlacedEdit needs block= (a block path, '' for the root) and var= (a variable name)")
        if not isinstance(self.values, torch.Tensor):
            raise EditError(f"PlacedEdit values must be a tensor, got {type(self.values).__name__}")
        if type(self.occurrence) is not int or self.occurrence < 1:
            raise EditError(f"PlacedEdit occurrence counts bindings from 1, got {self.occurrence!r}")
        if self.dim is not None and (type(self.dim) is not int or not -self.values.dim() <= self.dim < self.values.dim()):
            raise EditError(f"PlacedEdit dim={self.dim!r} is not a dimension of the {self.values.dim()}-d values "
                            "(None: the same value for every micro-batch)")

    def piece(self, index: int, count: int) -> torch.Tensor:
        if self.dim is None or count == 1:
            return self.values
        return torch.tensor_split(self.values, count, self.dim)[index].clone()


class PlaceEditor(TraceListener):
    """The listener applying `PlacedEdit`s to one run (micro-batch `index` of `count`); tells the
    listeners after it (a recorder) of each edit, so a capture holds the value the run went on with."""

    every_instruction = False

    def __init__(self, edits: Sequence[PlacedEdit], index: int = 0, count: int = 1,
                 notify: Sequence[TraceListener] = ()):
        self.edits = list(edits)
        self.index, self.count = index, count
        self.notify = list(notify)
        self.seen: dict[int, int] = {}
        self.applied: list[PlacedEdit] = []

    def on_instruction(self, event: InstructionEvent) -> None:
        out = event.instruction.out_var
        for number, edit in enumerate(self.edits):
            if edit.var != out or edit.block != event.path:
                continue
            self.seen[number] = self.seen.get(number, 0) + 1
            if self.seen[number] != edit.occurrence:
                continue
            new = edit.piece(self.index, self.count)
            old = apply_edit(event.frames, event.depth, out, new, None, None, 0)
            self.applied.append(edit)
            for listener in self.notify:
                listener.on_edit(EditEvent(0, event.depth, out, old, new))

    def missed(self) -> list[PlacedEdit]:
        return [edit for edit in self.edits if edit not in self.applied]


@dataclass
class StageCapture:
    """What one call of a stage recorded: `stage` (its index), `name`, `microbatch`, `call` (counted
    from 0 since the stage was made or reset) and the `trace` of that call."""

    stage: int
    name: str
    microbatch: int
    call: int
    trace: ActivationTrace = field(repr=False)

    def __repr__(self) -> str:
        return (f"StageCapture(stage {self.stage} {self.name!r}, micro-batch {self.microbatch}, "
                f"{len(self.trace.steps)} steps)")


class SchemaStage(nn.Module):
    """A pipeline stage's module, run by its schema (see the module docstring)."""

    def __init__(self, module: nn.Module, schema: ModelBlockSchema, stage_index: int, *, name: str = "",
                 capture: bool = False, keep: Any = None, edits: Sequence[PlacedEdit] = (), microbatches: int = 1):
        super().__init__()
        if not isinstance(module, nn.Module) or not isinstance(schema, ModelBlockSchema):
            raise SchemaRunError("SchemaStage(module, schema, stage_index): the stage's nn.Module and its schema "
                                 "from NNParser.parse_model(module, ...)")
        if schema.module is not module:
            raise SchemaRunError("the schema given to SchemaStage was parsed from another module; parse the stage's "
                                 "own module (NNParser.parse_model(module, ...))")
        if type(stage_index) is not int or stage_index < 0:
            raise SchemaRunError(f"stage_index must be a non-negative int, got {stage_index!r}")
        if type(microbatches) is not int or microbatches < 1:
            raise SchemaRunError(f"microbatches must be a positive int (the schedule's n_microbatches), got {microbatches!r}")
        for edit in edits:
            if not isinstance(edit, PlacedEdit):
                raise EditError(f"edits must be PlacedEdit(block, var, values), got {type(edit).__name__}")
        self.module = module
        self.schema = schema
        self.stage_index = stage_index
        self.stage_name = name or f"stage {stage_index}"
        self.capture = bool(capture)
        self.keep = keep
        self.edits = list(edits)
        self.microbatches = microbatches
        self.captures: list[StageCapture] = []
        self.calls = 0

    def reset(self) -> None:
        """Forget the captures and start counting calls (micro-batches) from 0 again."""
        self.captures.clear()
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call, microbatch = self.calls, self.calls % self.microbatches
        self.calls += 1
        listeners: list[TraceListener] = []
        recorder = ActivationRecorder(keep=self.keep) if self.capture else None
        if recorder is not None:
            listeners.append(recorder)
        editor = None
        if self.edits:
            editor = PlaceEditor(self.edits, microbatch, self.microbatches, notify=listeners[:])
            listeners.append(editor)
        result = SchemaInterpreter(listeners=listeners).call(self.schema, *args, **kwargs)
        if editor is not None and editor.missed():
            names = ", ".join(f"{e.block or '<root>'}:{e.var} (binding {e.occurrence})" for e in editor.missed())
            raise EditError(f"{self.stage_name}, micro-batch {microbatch}: the run never bound {names}; the stage's "
                            "block paths and variables are those of its own schema")
        if recorder is not None:
            self.captures.append(StageCapture(self.stage_index, self.stage_name, microbatch, call, recorder.trace))
        return result
