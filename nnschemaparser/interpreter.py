"""SchemaInterpreter: the public drivers of the engine — plain runs, observed runs and stepping.

`run` and `call` execute a schema with the plain compiled program when there is nothing to observe,
and with an observed program otherwise. `step_run` runs the observed program inside a greenlet and
pauses it after each leaf instruction, yielding a `StepInfo`; edits apply to the paused frames. The
execution rules are the engine's, written once; this module only drives them.

Depends on engine, listeners, schema and errors.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Generator, Optional, Sequence

import greenlet
import torch

from .engine import Program, StepAbandoned
from .errors import EditError, SchemaRunError
from .listeners import EventObserver, InstructionEvent, TraceListener, instruction_kind
from .schema import Instruction, ModelBlockSchema, SourceLocation

__all__ = ["SchemaInterpreter", "StepInfo", "outputs_list"]

_PLAIN: "weakref.WeakKeyDictionary[ModelBlockSchema, Program]" = weakref.WeakKeyDictionary()


def _plain_program(block: ModelBlockSchema) -> Program:
    program = _PLAIN.get(block)
    if program is None:
        program = Program(block)
        _PLAIN[block] = program
    return program


def outputs_list(result: Any) -> list:
    """The spec's `outputs`: a tuple result as a list of its items, anything else as a one-item list."""
    return list(result) if isinstance(result, tuple) else [result]


def _check_block(block: Any) -> None:
    if not isinstance(block, ModelBlockSchema):
        raise SchemaRunError(f"block must be a ModelBlockSchema (from NNParser.parse_model), got {type(block).__name__}")


@dataclass
class StepInfo:
    """One executed instruction of a stepped run, with the live frames it can edit."""

    step_index: int
    kind: str
    out_var: str
    frame_depth: int
    value: Any
    scope_frames: tuple
    instruction: Instruction
    block_path: str
    location: Optional[SourceLocation]
    _pending: list = field(default_factory=list, repr=False)

    @property
    def source(self) -> str:
        return str(self.location) if self.location is not None else ""

    def visible_names(self, frame_depth: Optional[int] = None) -> list[str]:
        depth = self.frame_depth if frame_depth is None else frame_depth
        return sorted(self.scope_frames[depth])

    def edit(self, values: Any = None, shape: Any = None, dtype: Any = None, frame_depth: Optional[int] = None,
             out_var: Optional[str] = None) -> None:
        """Replace a visible variable before the next instruction runs.

        Defaults: the variable this step bound, in its own frame. The new value must have the
        variable's current shape and dtype, unless `shape` / `dtype` say which new ones are intended.
        On any error nothing is changed.
        """
        apply_edit(self.scope_frames, self.frame_depth if frame_depth is None else frame_depth,
                   out_var or self.out_var, values, shape, dtype, self.step_index)
        if self.value is not None and (out_var is None or out_var == self.out_var) and \
                (frame_depth is None or frame_depth == self.frame_depth):
            self.value = self.scope_frames[self.frame_depth][self.out_var]


def apply_edit(frames: Sequence[dict], depth: int, name: str, values: Any, shape: Any, dtype: Any,
               step_index: int) -> None:
    if not frames:
        raise EditError("there is no live frame to edit")
    if not isinstance(depth, int) or not 0 <= depth < len(frames):
        raise EditError(f"step {step_index}: frame_depth {depth} is not visible; frames 0..{len(frames) - 1} are")
    frame = frames[depth]
    if not name or name not in frame:
        visible = ", ".join(sorted(k for k in frame if not k.startswith("$return"))) or "(none)"
        raise EditError(f"step {step_index}: no variable {name!r} in frame {depth}; visible there: {visible}")
    if values is None:
        raise EditError(f"step {step_index}: edit needs values=... (the new value of {name!r})")
    current = frame[name]
    if isinstance(current, torch.Tensor):
        if not isinstance(values, torch.Tensor):
            raise EditError(f"step {step_index}: {name!r} is a tensor; the edit must give a tensor, "
                            f"got {type(values).__name__}")
        want_shape = tuple(shape) if shape is not None else tuple(current.shape)
        want_dtype = dtype if dtype is not None else current.dtype
        if isinstance(want_dtype, str):
            want_dtype = getattr(torch, want_dtype.replace("torch.", ""), None)
        if tuple(values.shape) != want_shape:
            raise EditError(f"step {step_index}: {name!r} has shape {tuple(current.shape)}; the edit gives "
                            f"{tuple(values.shape)} (pass shape=... to change the shape on purpose)")
        if values.dtype != want_dtype:
            raise EditError(f"step {step_index}: {name!r} has dtype {current.dtype}; the edit gives {values.dtype} "
                            f"(pass dtype=... to change the dtype on purpose)")
        if values.device != current.device:
            raise EditError(f"step {step_index}: {name!r} lives on {current.device}; the edit is on {values.device}")
    frame[name] = values


class _Stepper(TraceListener):
    """Pauses the run after each instruction by switching to the consumer's greenlet."""

    def __init__(self, edits: Optional[dict[int, list[dict]]]):
        self.index = 0
        self.edits = edits or {}
        self.consumer: Optional[greenlet.greenlet] = None

    def on_instruction(self, event: InstructionEvent) -> None:
        self.index += 1
        step = StepInfo(step_index=self.index, kind=instruction_kind(event.instruction),
                        out_var=event.instruction.out_var, frame_depth=event.depth, value=event.value,
                        scope_frames=event.frames, instruction=event.instruction, block_path=event.path,
                        location=event.instruction.location)
        for edit in self.edits.get(self.index, ()):
            step.edit(**edit)
        self.consumer.switch(step)


class SchemaInterpreter:
    """Runs a schema by re-dispatching every instruction to the real torch callables.

    `capture_values=True` fills each executed instruction's `resolved` with a detached snapshot;
    `listeners` receive events (TraceRecorder, ActivationRecorder, your own TraceListener).
    """

    def __init__(self, capture_values: bool = False, listeners: Optional[Sequence[TraceListener]] = None):
        self.capture_values = capture_values
        self.listeners = list(listeners or [])
        self.step_outputs: Optional[list] = None
        self._observed: "weakref.WeakKeyDictionary[ModelBlockSchema, tuple[Program, EventObserver]]" = \
            weakref.WeakKeyDictionary()

    def _observed_program(self, block: ModelBlockSchema, extra: Sequence[TraceListener] = ()) -> tuple[Program, EventObserver]:
        if extra:
            observer = EventObserver([*self.listeners, *extra], self.capture_values)
            return Program(block, observer), observer
        cached = self._observed.get(block)
        if cached is None:
            observer = EventObserver(self.listeners, self.capture_values)
            cached = (Program(block, observer), observer)
            self._observed[block] = cached
        cached[1].reset()
        return cached

    def _execute(self, block: ModelBlockSchema, scope: dict) -> Any:
        _check_block(block)
        if not isinstance(scope, dict):
            raise SchemaRunError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")
        if not self.listeners and not self.capture_values:
            return _plain_program(block).run_root(scope)
        program, observer = self._observed_program(block)
        for listener in self.listeners:
            listener.on_run_start(block, scope)
        result = program.run_root(scope)
        for listener in self.listeners:
            listener.on_run_end(result)
        return result

    def run(self, block: ModelBlockSchema, scope: dict) -> list:
        """Run `block` with inputs `scope` ({name: value}); returns the outputs as a list."""
        return outputs_list(self._execute(block, scope))

    def call(self, block: ModelBlockSchema, *args: Any, **kwargs: Any) -> Any:
        """Run `block` like `module(*args, **kwargs)`; returns exactly what forward returns."""
        _check_block(block)
        if args:
            sig = block.signature
            if sig is None:
                return block.module(*args, **kwargs)
            names = list(sig.params)
            if len(args) > len(names) and sig.vararg is None:
                raise SchemaRunError(f"{block.name}.forward takes {len(names)} positional inputs, got {len(args)}")
            kwargs = {**dict(zip(names, args)), **kwargs}
            if len(args) > len(names):
                raise SchemaRunError("extra positional inputs for *args are not supported by call(); use run()")
        return self._execute(block, kwargs)

    def step_run(self, block: ModelBlockSchema, scope: dict,
                 edits: Optional[dict[int, list[dict]]] = None) -> Generator[StepInfo, None, list]:
        """Yield one StepInfo per executed instruction; return (and store in step_outputs) the outputs.

        `edits` maps a step_index to edit keyword dicts applied when that step is reached, so a run
        can be forked from a previous one at a given step.
        """
        _check_block(block)
        self.step_outputs = None
        stepper = _Stepper(edits)
        program, observer = self._observed_program(block, extra=[stepper])
        for listener in self.listeners:
            listener.on_run_start(block, scope)
        runner = greenlet.greenlet(lambda: program.run_root(scope))
        finished = False
        try:
            stepper.consumer = greenlet.getcurrent()
            item = runner.switch()
            while not runner.dead:
                yield item
                stepper.consumer = greenlet.getcurrent()
                item = runner.switch()
            finished = True
        finally:
            if not finished and not runner.dead:
                try:
                    runner.throw(StepAbandoned())
                except StepAbandoned:
                    pass
        for listener in self.listeners:
            listener.on_run_end(item)
        self.step_outputs = outputs_list(item)
        return self.step_outputs
