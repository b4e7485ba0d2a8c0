"""Stepping: what a stepped run yields (`StepInfo`, `CallPause`), how an edit is applied, and the
listener that pauses the run at each step (`Stepper`).

A stepped run executes in a greenlet and switches to its consumer once per step, and the consumer
switches back when it asks for the next step: two switches a step. A run that can stay in generated
code runs its blocks as generators instead and yields each step (runtime/step_generators.py). What
runs around them is kept to the bone, since it runs once per executed instruction (3,780 times in a
forward of a 32-layer tiny Llama): a `StepInfo` is filled in slot by slot without a call of its
`__init__` (`SteppingObserver.step`), and the observer's `after` (the function the generated code
calls after each instruction) switches it out with a bound method the stepper keeps ready.
The step never touches its instruction object: the generated code hands
`after` the instruction's site (its function's list of instructions and a constant index) and the
value it bound (read there with the name as a constant). A run reaches each of its thousands of
instruction objects once and finds it cold in the cache: reading `out_var` off it and holding a
reference to it cost 0.3-0.65 us a step inside a run of the tiny Llama (bench/bench_step_pieces.py),
more than the rest of `after`.

Depends on `listeners`, `instructions` and the schema; `interpreter` drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .instructions import operand_reader
from .listeners import (CallEvent, EditEvent, EventObserver, InstructionEvent, TraceListener,
                        instruction_kind)
from ..schema.errors import EditError, SchemaRunError
from ..schema.model import Instruction, SourceLocation
from ..schema.notation import operand_text

__all__ = ["StepInfo", "CallPause", "Stepper", "SteppingObserver", "apply_edit", "checked_edits"]


@dataclass(init=False)
class StepInfo:
    """One executed instruction of a stepped run, with the live frames it can edit.

    A step stores what only it knows (its index, value, frames, instruction's site and block path);
    the rest is read when asked for, not copied at each step: `instruction` is looked up from its
    site (the generated function's list of instructions and an index in it), `kind`, `out_var` and
    `location` are its instruction's, `frame_depth` is the innermost of `scope_frames`
    (`len(scope_frames) - 1`). All nine are dataclass fields all the same (`fields`, `asdict`,
    `replace`, `==` and the repr see them). The stepper fills the stored slots without calling
    `__init__` (`SteppingObserver.after`, `_step`): a slot added here must be set there too.
    """

    __slots__ = ("step_index", "value", "scope_frames", "_sites", "_site", "block_path", "_run")

    step_index: int
    kind: str = property(lambda self: instruction_kind(self.instruction),  # type: ignore[assignment]
                         doc='What ran: "op", "block", "return", "function", "delete", "raise", ...')
    out_var: str = property(lambda self: self.instruction.out_var,  # type: ignore[assignment]
                            doc="The variable the step bound (\"\" when it binds none, as a return).")
    frame_depth: int = property(lambda self: len(self.scope_frames) - 1,  # type: ignore[assignment]
                                doc="The depth of the step's own frame in `scope_frames` (0: the root's).")
    value: Any
    scope_frames: tuple
    instruction: Instruction = property(lambda self: self._sites[self._site],  # type: ignore[assignment]
                                        lambda self, instruction: self._place(instruction),
                                        doc="The instruction that ran (looked up from the step's site).")
    block_path: str
    location: Optional[SourceLocation] = property(lambda self: self.instruction.location,  # type: ignore[assignment]
                                                  doc="Where the instruction comes from in the source.")
    # `_run` (a slot, not a field): the Stepper, which says whether the run has ended and tells edits

    def __init__(self, step_index: int, kind: str, out_var: str, frame_depth: int, value: Any,
                 scope_frames: tuple, instruction: Instruction, block_path: str,
                 location: Optional[SourceLocation], _run: Any = None) -> None:
        self.step_index = step_index
        self.value = value
        self.scope_frames = scope_frames
        self._place(instruction)
        self.block_path = block_path
        self._run = _run
        for name, given in (("kind", kind), ("out_var", out_var), ("frame_depth", frame_depth),
                            ("location", location)):
            if given != getattr(self, name):
                source = "scope_frames" if name == "frame_depth" else "instruction"
                raise SchemaRunError(f"StepInfo: {name} is read from the {source.split('_')[-1]} "
                                     f"({getattr(self, name)!r}), got {given!r}; pass another {source} to change it")

    def _place(self, instruction: Instruction) -> None:
        """Make `instruction` the step's own site."""
        self._sites = (instruction,)
        self._site = 0

    @property
    def _notify(self) -> Optional[Callable[[EditEvent], None]]:
        run = self._run
        return run._notify if run is not None else None

    @property
    def source(self) -> str:
        return str(self.location) if self.location is not None else ""

    def visible_names(self, frame_depth: Optional[int] = None) -> list[str]:
        depth = self.frame_depth if frame_depth is None else frame_depth
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth < len(self.scope_frames):
            raise EditError(f"step {self.step_index}: frame_depth {depth!r} is not visible; frames "
                            f"0..{len(self.scope_frames) - 1} are")
        return sorted(self.scope_frames[depth])

    def edit(self, values: Any = None, shape: Any = None, dtype: Any = None, frame_depth: Optional[int] = None,
             out_var: Optional[str] = None) -> None:
        """Replace a visible variable before the next instruction runs.

        Defaults: the variable this step bound, in its own frame. The new value must have the
        variable's current shape and dtype, unless `shape` / `dtype` say which new ones are intended.
        On any error nothing is changed.
        """
        if self._run is not None and self._run.ended:
            raise EditError(f"step {self.step_index}: the run has ended, so there is nothing left to edit; edit a "
                            "step while the run is paused at it (inside the loop over step_run)")
        depth = self.frame_depth if frame_depth is None else frame_depth
        name = out_var or self.out_var
        old = apply_edit(self.scope_frames, depth, name, values, shape, dtype, self.step_index)
        if self._notify is not None:
            self._notify(EditEvent(self.step_index, depth, name, old, values))
        if self.value is not None and (out_var is None or out_var == self.out_var) and \
                (frame_depth is None or frame_depth == self.frame_depth):
            self.value = self.scope_frames[self.frame_depth][self.out_var]


@dataclass
class CallPause:
    """A stepped run paused *before* a sub-block call (`step_run(..., pause_before_calls=True)`).

    Not a step: `after_step` steps have run, and the next step (`after_step + 1`) is the callee's
    first instruction when the callee is interpreted, else the call's own completion step. The
    call is `instruction` in `block_path` at frame `frame_depth`; `callee_path` names what it calls
    (`transformer.h.1.attn`), `callee` is that block (None when it is not in the schema).
    `arguments()` reads the values the call is about to pass. Nothing can be edited here: edit the
    step that bound an argument, or step into the call.
    """

    after_step: int
    instruction: Instruction
    callee_path: str
    callee: Optional[ModelBlockSchema]
    block_path: str
    frame_depth: int
    frame: dict
    scope_frames: tuple
    location: Optional[SourceLocation]

    kind = "call"

    @property
    def source(self) -> str:
        return str(self.location) if self.location is not None else ""

    @property
    def interpreted(self) -> bool:
        """Whether stepping into the call reaches the callee's own instructions (its schema runs)."""
        callee = self.callee
        return callee is not None and callee.skip_reason is None and callee.signature is not None

    def arguments(self) -> list[tuple[str, Any]]:
        """(label, value) of each argument the call passes, in order: a positional argument by its
        operand (`hidden_states`, `*args`), a keyword one by its keyword; a `**kwargs` splat by its
        keys. An operand that cannot be read (yet) is left out."""
        instr, frame = self.instruction, self.frame
        out: list[tuple[str, Any]] = []
        stars = set(getattr(instr, "star_args", ()) or ())

        def read(op: Any) -> Any:
            return operand_reader(op)(frame)

        for index, op in enumerate(getattr(instr, "args", ())):
            try:
                out.append((("*" if index in stars else "") + operand_text(op), read(op)))
            except Exception:  # noqa: BLE001 - a view of the call; the call itself will say what is wrong
                continue
        args_var = getattr(instr, "args_var", None)
        if args_var is not None and args_var in frame:
            out.append((f"*{args_var}", frame[args_var]))
        for key, op in getattr(instr, "kwargs", {}).items():
            try:
                out.append((key, read(op)))
            except Exception:  # noqa: BLE001
                continue
        kwargs_var = getattr(instr, "kwargs_var", None)
        extra = frame.get(kwargs_var) if kwargs_var is not None else None
        if isinstance(extra, dict):
            out.extend((str(key), value) for key, value in extra.items())
        return out

    def __repr__(self) -> str:
        names = ", ".join(label for label, _ in self.arguments())
        return f"CallPause(after step {self.after_step}: about to call {self.callee_path}({names}) at {self.source})"


def apply_edit(frames: Sequence[dict], depth: int, name: str, values: Any, shape: Any, dtype: Any,
               step_index: int) -> Any:
    """Validate, then bind `values` to `name` in `frames[depth]`; returns the replaced value."""
    if not frames:
        raise EditError("there is no live frame to edit")
    if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth < len(frames):
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
        if not isinstance(want_dtype, torch.dtype):
            raise EditError(f"step {step_index}: dtype={dtype!r} is not a torch dtype; pass e.g. torch.float16 "
                            "or 'torch.float16'")
        if tuple(values.shape) != want_shape:
            if shape is not None:
                raise EditError(f"step {step_index}: the edit of {name!r} gives shape {tuple(values.shape)} but "
                                f"declares shape={want_shape}; make them agree")
            raise EditError(f"step {step_index}: {name!r} has shape {tuple(current.shape)}; the edit gives "
                            f"{tuple(values.shape)} (pass shape=... to change the shape on purpose)")
        if values.dtype != want_dtype:
            if dtype is not None:
                raise EditError(f"step {step_index}: the edit of {name!r} gives dtype {values.dtype} but declares "
                                f"dtype={want_dtype}; make them agree")
            raise EditError(f"step {step_index}: {name!r} has dtype {current.dtype}; the edit gives {values.dtype} "
                            f"(pass dtype=... to change the dtype on purpose)")
        if values.device != current.device:
            raise EditError(f"step {step_index}: {name!r} lives on {current.device}; the edit is on {values.device}")
    frame[name] = values
    return current


class Stepper(TraceListener):
    """Pauses the run after each stepped instruction by switching to the consumer's greenlet.

    `attach(consumer)` says which greenlet that is (the generator may be resumed from another);
    `index` counts the steps so far, `ended` is set once the run is over or abandoned.
    """

    def __init__(self, edits: Optional[dict[int, list[dict]]], listeners: Sequence[TraceListener] = (),
                 pause_before_calls: bool = False):
        self.index = 0
        self.ended = False
        self.pause_before_calls = pause_before_calls
        self.edits = edits or {}
        self.consumer: Any = None
        self.switch: Optional[Callable[[Any], Any]] = None
        self.listeners = [l for l in listeners if type(l).on_edit is not TraceListener.on_edit]
        self._notify = self.notify if self.listeners else None

    def attach(self, consumer: Any) -> None:
        """Pause into the greenlet `consumer` from now on."""
        self.consumer = consumer
        self.switch = consumer.switch

    def notify(self, event: EditEvent) -> None:
        for listener in self.listeners:
            listener.on_edit(event)

    def on_instruction(self, event: InstructionEvent) -> None:
        if not event.stepped:  # an if test or a while re-evaluation (spec 000)
            return
        self._pause(event.instruction, event.value, event.frames, event.path)

    def _pause(self, instr: Instruction, value: Any, frames: tuple, path: str) -> None:
        self.index += 1
        step = _step(self.index, value, frames, instr, path, self)
        if self.edits:
            for edit in self.edits.get(self.index, ()):
                step.edit(**edit)
        self.switch(step)

    def on_before_call(self, event: CallEvent) -> None:
        if not event.stepped or not self.pause_before_calls:
            return
        instr = event.instruction
        self.switch(CallPause(self.index, instr, event.callee_path, event.callee, event.path, event.depth,
                              event.frame, event.frames, instr.location))


class SteppingObserver(EventObserver):
    """The observer of a stepped run's programs. When the stepper is the run's one instruction
    listener and values are not captured, its `after` (which the generated code calls after every
    instruction) is the step itself: the StepInfo is built here, slot by slot, and the run switches
    to its consumer, with no event and no call in between. Otherwise it is `EventObserver.after`.

    Its programs pass `after` the instruction's site (the generated function's list of
    instructions and a constant index) and the value it bound, read in the generated code with the
    variable's name as a constant (`Observer.after_takes_site`): a step neither reads nor takes a
    reference to the instruction object, which a run reaches once per step and finds cold in the
    cache (bench/bench_step_pieces.py). The step keeps the site; its `instruction` is looked up when
    asked for.
    """

    after_takes_site = True

    def configure(self, listeners: Sequence[TraceListener], capture_values: bool = False) -> None:
        super().configure(listeners, capture_values)
        only = self._instruction_listeners
        self._stepper: Optional[Stepper] = only[0] if not capture_values and len(only) == 1 and \
            type(only[0]) is Stepper else None

    def after(self, sites: list, site: int, frame: dict, value: Any) -> None:  # type: ignore[override]
        stepper = self._stepper
        if stepper is None:
            EventObserver.after(self, sites[site], frame)
            return
        info = self.step(sites, site, frame, value)
        if info is not None:
            stepper.switch(info)

    def step(self, sites: list, site: int, frame: dict, value: Any) -> Optional[StepInfo]:
        """The step of the instruction at `sites[site]`, which bound `value`; None in an if test or a
        while re-evaluation (spec 000). `after` switches it out to the consumer's greenlet; a run of
        generators (runtime/step_generators.py) `yield`s it. Only a run whose stepper is its one
        instruction listener takes either path."""
        if self.conditions:
            return None
        stepper = self._stepper
        stepper.index = index = stepper.index + 1
        frames = self._frames_tuple
        if frames is None:
            frames = self.frames_tuple()
        info = _new(StepInfo)
        info.step_index = index
        info.value = value
        info.scope_frames = frames
        info._sites = sites
        info._site = site
        info.block_path = self.path
        info._run = stepper
        if stepper.edits:
            for edit in stepper.edits.get(index, ()):
                info.edit(**edit)
        return info


_new = object.__new__


def _step(index: int, value: Any, frames: tuple, instr: Instruction, path: str, stepper: Stepper) -> StepInfo:
    """A StepInfo of the stored slots (what `SteppingObserver.after` writes out inline)."""
    info = _new(StepInfo)
    info.step_index = index
    info.value = value
    info.scope_frames = frames
    info._place(instr)
    info.block_path = path
    info._run = stepper
    return info


_EDIT_KEYS = ("values", "shape", "dtype", "frame_depth", "out_var")


def _needs_values(edit: dict) -> Optional[str]:
    return None if "values" in edit else "an edit needs 'values' (the new value)"


def checked_edits(edits: Any, keys: Sequence[str] = _EDIT_KEYS,
                  example: str = "e.g. {5: [{'values': torch.zeros(2, 32)}]}",
                  check: Callable[[dict], Optional[str]] = _needs_values) -> dict[int, list[dict]]:
    """`edits` of step_run as {step: [edit kwargs, ...]} (each edit a copy), or a SchemaRunError
    naming the first bad entry. A collective run checks its own `edits=` with its `keys`, `example`
    and `check(edit)` (what is wrong with one edit's values, a phrase, or None;
    distributed/collective_parts.py)."""
    if not isinstance(edits, dict):
        raise SchemaRunError(f"edits must map a step index (int) to an edit dict or a list of them, got "
                             f"{type(edits).__name__}; {example}")
    checked: dict[int, list[dict]] = {}
    for step, entry in edits.items():
        if type(step) is not int or step < 1:
            raise SchemaRunError(f"edits must map a step index (int) to an edit dict or a list of them: {step!r} is "
                                 f"not a step index (steps are ints counted from 1); {example}")
        items = [entry] if isinstance(entry, dict) else entry
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, dict) for item in items):
            raise SchemaRunError(f"edits[{step}] must be an edit dict or a list of them, got {type(entry).__name__}")
        for item in items:
            unknown = [key for key in item if key not in keys]
            if unknown:
                raise SchemaRunError(f"edits[{step}]: unknown key {unknown[0]!r}; an edit takes {', '.join(keys)}")
            problem = check(item)
            if problem is not None:
                raise SchemaRunError(f"edits[{step}]: {problem}")
            depth = item.get("frame_depth")
            if depth is not None and (type(depth) is not int or depth < 0):
                raise SchemaRunError(f"edits[{step}]: frame_depth must be a non-negative int, got {depth!r}")
        checked[step] = [dict(item) for item in items]
    return checked
