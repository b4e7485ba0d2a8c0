"""SchemaInterpreter: the public drivers of the runtime — plain runs, observed runs and stepping.

`run` and `call` execute a schema with the plain compiled program when there is nothing to observe,
and with an observed program otherwise. `step_run` runs the observed program inside a greenlet and
pauses it after each leaf instruction, yielding a `StepInfo` (not on the instructions of an `if` test
or of a `while` re-evaluation, as spec 000 says; traces still record those); edits apply to the paused frames and
are reported to the listeners (`TraceListener.on_edit`). With `pause_before_calls=True` it also
pauses before each sub-block call, yielding a `CallPause` (the callee, the call site, its
arguments): a pause is not a step, so step indices (edits, forks, traces) are the same with or
without them. The execution rules are the code generator's, written once; this module only drives them.

Observed programs are compiled once per schema and lent to one run at a time, with that run's
listeners plugged into their observer; a one-call capture therefore costs no compilation.

`interventions=` of `run`, `call` and `step_run` adds the listener of `runtime/interventions.py`,
which writes new values into frames with `apply_edit`, as edits do.

Depends on `program`, `binding`, `instructions`, `listeners`, `interventions` and the schema.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional, Sequence

import greenlet
import torch

from .binding import live_signature
from .instructions import operand_reader
from .interventions import InterventionListener, intervention_listener
from .partial import give_back_partial, partial_programs
from .program import Program, programs_for
from ..schema.errors import EditError, SchemaRunError
from .listeners import (RETURN_SLOT, CallEvent, EditEvent, EventObserver, InstructionEvent, StepAbandoned,
                        Observer, TraceListener, instruction_kind)
from ..schema.model import Instruction, ModelBlockSchema, ReturnInstruction, SourceLocation
from ..schema.notation import operand_text

__all__ = ["SchemaInterpreter", "StepInfo", "CallPause", "outputs_list", "source_code"]

def _programs(block: ModelBlockSchema) -> dict:
    """The compiled programs of the schema `block` (they live and die with it: `programs_for`)."""
    return programs_for(block)


def _plain_program(block: ModelBlockSchema) -> Program:
    cache = _programs(block)
    program = cache["plain"]
    if program is None:
        program = cache["plain"] = Program(block)
    return program


def outputs_list(result: Any) -> list:
    """The spec's `outputs`: a tuple result as a list of its items, anything else as a one-item list."""
    return list(result) if isinstance(result, tuple) else [result]


def _check_scope(scope: Any) -> None:
    if not isinstance(scope, dict):
        raise SchemaRunError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")


def _check_block(block: Any) -> None:
    if not isinstance(block, ModelBlockSchema):
        raise SchemaRunError(f"block must be a ModelBlockSchema (from NNParser.parse_model), got {type(block).__name__}")
    # A sub-module replaced after parsing (`model.fc2 = nn.Linear(...)`, a LoRA or quantisation
    # wrapper) needs no check here: every static child call reads the live child and runs the one
    # the model holds now (program.Program.static_call), as eager does.


@dataclass(slots=True)
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
    _notify: Optional[Callable[[EditEvent], None]] = field(default=None, repr=False, compare=False)
    _run: Any = field(default=None, repr=False, compare=False)  # the _Stepper: says whether the run has ended

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


class _Stepper(TraceListener):
    """Pauses the run after each instruction by switching to the consumer's greenlet."""

    def __init__(self, edits: Optional[dict[int, list[dict]]], listeners: Sequence[TraceListener] = (),
                 pause_before_calls: bool = False):
        self.index = 0
        self.ended = False
        self.pause_before_calls = pause_before_calls
        self.edits = edits or {}
        self.consumer: Optional[greenlet.greenlet] = None
        self.listeners = [l for l in listeners if type(l).on_edit is not TraceListener.on_edit]

    def notify(self, event: EditEvent) -> None:
        for listener in self.listeners:
            listener.on_edit(event)

    def on_instruction(self, event: InstructionEvent) -> None:
        if not event.stepped:  # an if test or a while re-evaluation (spec 000)
            return
        self.index += 1
        instr = event.instruction
        # Positional, in StepInfo's field order: this runs once per step.
        step = StepInfo(self.index, instruction_kind(instr), instr.out_var, event.depth, event.value, event.frames,
                        instr, event.path, instr.location, self.notify if self.listeners else None,
                        _run=self)
        if self.edits:
            for edit in self.edits.get(self.index, ()):
                step.edit(**edit)
        self.consumer.switch(step)

    def instruction_hook(self) -> Callable[[Instruction, dict, Any], None]:
        return self._step_directly

    def _step_directly(self, instr: Instruction, frame: dict, observer: Any) -> None:
        """`on_instruction` without its event: what the event would hold, read from the observer."""
        if observer.conditions:  # an if test or a while re-evaluation (spec 000)
            return
        self.index += 1
        if isinstance(instr, ReturnInstruction):
            value = frame.get(RETURN_SLOT)
        else:
            out = instr.out_var
            value = frame.get(out) if out else None
        step = StepInfo(self.index, instruction_kind(instr), instr.out_var, observer.depth, value, observer.frames_tuple(), instr,
                        observer.path, instr.location, self.notify if self.listeners else None, self)
        if self.edits:
            for edit in self.edits.get(self.index, ()):
                step.edit(**edit)
        self.consumer.switch(step)

    def on_before_call(self, event: CallEvent) -> None:
        if not event.stepped or not self.pause_before_calls:
            return
        instr = event.instruction
        self.consumer.switch(CallPause(self.index, instr, event.callee_path, event.callee, event.path, event.depth,
                                       event.frame, event.frames, instr.location))


_EDIT_KEYS = ("values", "shape", "dtype", "frame_depth", "out_var")


def _checked_edits(edits: Any) -> dict[int, list[dict]]:
    """`edits` of step_run as {step: [edit kwargs, ...]}, or a SchemaRunError naming the first bad entry."""
    example = "e.g. {5: [{'values': torch.zeros(2, 32)}]}"
    if not isinstance(edits, dict):
        raise SchemaRunError(f"edits must map step_index (int) -> list of edit dicts, got {type(edits).__name__}; {example}")
    checked: dict[int, list[dict]] = {}
    for step, entry in edits.items():
        if type(step) is not int or step < 1:
            raise SchemaRunError(f"edits must map step_index (int) -> list of edit dicts: {step!r} is not a step index; "
                             f"steps are ints counted from 1; {example}")
        items = [entry] if isinstance(entry, dict) else entry
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, dict) for item in items):
            raise SchemaRunError(f"edits[{step}] must be an edit dict or a list of them, got {type(entry).__name__}")
        for item in items:
            unknown = [key for key in item if key not in _EDIT_KEYS]
            if unknown:
                raise SchemaRunError(f"edits[{step}]: unknown key {unknown[0]!r}; an edit takes {', '.join(_EDIT_KEYS)}")
            if "values" not in item:
                raise SchemaRunError(f"edits[{step}]: an edit needs 'values' (the new value)")
            depth = item.get("frame_depth")
            if depth is not None and (type(depth) is not int or depth < 0):
                raise SchemaRunError(f"edits[{step}]: frame_depth must be a non-negative int, got {depth!r}")
        checked[step] = list(items)
    return checked


class SchemaInterpreter:
    """Runs a schema by re-dispatching every instruction to the real torch callables.

    `capture_values=True` fills each executed instruction's `resolved` with a detached snapshot;
    `listeners` receive events (TraceRecorder, ActivationRecorder, your own TraceListener).
    """

    def __init__(self, capture_values: bool = False, listeners: Optional[Sequence[TraceListener]] = None,
                 observe: Optional[frozenset] = None):
        self.capture_values = capture_values
        self.listeners = list(listeners or [])
        self.step_outputs: Optional[list] = None
        # `observe`: ids of the blocks whose runs the listeners see (the root always); the others
        # run plain code that counts their tensor results (runtime/partial.py). None: all of them.
        if observe is not None and not isinstance(observe, frozenset):
            raise SchemaRunError(f"observe must be a frozenset of block ids or None, got {type(observe).__name__}")
        self.observe = observe

    def _execute(self, block: ModelBlockSchema, scope: dict, call: Optional[tuple] = None,
                 interventions: Any = None) -> Any:
        """Run with `scope`, or, with `call=(args, kwargs)`, as that call (`scope` then names them)."""
        _check_block(block)
        _check_scope(scope)
        listeners, observe = self.listeners, self.observe
        intervening = None
        if interventions is not None:
            intervening = intervention_listener(block, interventions, listeners)
            # the run's own listeners decide what they need; the interventions add the blocks they can touch
            wanted = observe if listeners or self.capture_values else frozenset()
            observe = None if wanted is None or intervening.observe is None else wanted | intervening.observe
            listeners = [*listeners, intervening]
        if not listeners and not self.capture_values:
            program = _plain_program(block)
            return program.run_root(scope) if call is None else program.call_root(*call)
        if observe is not None and _tensor_results(listeners, self.capture_values):
            result = self._execute_partly(block, scope, call, listeners, observe)
        else:
            program, observer = _borrow(block, listeners, self.capture_values)
            try:
                for listener in listeners:
                    listener.on_run_start(block, scope)
                result = program.run_root(scope) if call is None else program.call_root(*call)
                for listener in listeners:
                    listener.on_run_end(result)
            finally:
                _give_back(block, program, observer)
        if intervening is not None:
            intervening.finish()
        return result

    def _execute_partly(self, block: ModelBlockSchema, scope: dict, call: Optional[tuple],
                        listeners: Sequence[TraceListener], observe: frozenset) -> Any:
        """`_execute` observing only the blocks of `observe` (and the root)."""
        pair = partial_programs(block, observe | {id(block)})
        try:
            pair.observer.configure(listeners)
            hooks = [hook for hook in (listener.unobserved_call_hook() for listener in listeners)
                     if hook is not None]
            if hooks:
                pair.counted.watch = hooks[0] if len(hooks) == 1 else lambda module: [hook(module) for hook in hooks]
            for listener in listeners:
                listener.on_unobserved_counter(pair.counter)
                listener.on_run_start(block, scope)
            program = pair.observed
            result = program.run_root(scope) if call is None else program.call_root(*call)
            for listener in listeners:
                listener.on_run_end(result)
        finally:
            give_back_partial(pair)
        return result

    def run(self, block: ModelBlockSchema, scope: dict, interventions: Any = None) -> list:
        """Run `block` with inputs `scope` ({name: value}); returns the outputs as a list.

        The inputs are passed as `model(x, ...)` would get them: positionally in the signature's
        order while each is given, the rest by keyword. A forward's `*args` extras are given under
        its name as a tuple or list (`{"x": x, "args": (y, z)}` runs `model(x, y, z)`); names
        forward does not have go to its `**kwargs`.

        `interventions` ({selector: fn or tensor}, traces/interventions.py) replaces the values
        the selectors name before the rest of the forward reads them; None runs the plain program.
        """
        return outputs_list(self._execute(block, scope, interventions=interventions))

    def call(self, block: ModelBlockSchema, *args: Any, interventions: Any = None, **kwargs: Any) -> Any:
        """Run `block` like `module(*args, **kwargs)`, with the arguments passed exactly as given
        (positional extras go to forward's `*args`); returns exactly what forward returns.
        `interventions` is `run`'s, read by `call` itself (never passed to forward)."""
        _check_block(block)
        sig = block.signature
        if sig is None and block.module is not None:
            sig = live_signature(block.module.forward)
        names = list(sig.params) if sig is not None else []
        if len(args) > len(names) and (sig is None or sig.vararg is None):
            raise SchemaRunError(f"{block.name}.forward takes {len(names)} positional inputs, got {len(args)}")
        twice = [name for name in names[:len(args)] if name in kwargs]
        if twice:
            raise SchemaRunError(f"{block.name}.forward got {twice[0]!r} both positionally and by keyword")
        scope = {**dict(zip(names, args)), **kwargs}  # what listeners are told the inputs are
        if len(args) > len(names):
            scope[sig.vararg] = tuple(args[len(names):])
        return self._execute(block, scope, (args, kwargs), interventions)

    def step_run(self, block: ModelBlockSchema, scope: dict, edits: Optional[dict[int, list[dict]]] = None,
                 pause_before_calls: bool = False, interventions: Any = None) -> Generator[StepInfo, None, list]:
        """Yield one StepInfo per executed instruction; return (and store in step_outputs) the outputs.

        `pause_before_calls=True` also yields a `CallPause` before each sub-block call (a child's
        forward, a method schema, a module value with a block): not a step, so the StepInfo
        indices are the same as without it.

        The instructions of an `if` test, and of a `while` test after its first evaluation, are not
        steps (condition expressions of if/while re-evaluations are not stepped); captures and
        traces of the same run still record them.

        `edits` maps a step_index to edit keyword dicts applied when that step is reached, so a run
        can be forked from a previous one at a given step. Bad arguments raise here, before the
        first step. Closing or dropping the generator early unwinds the paused run.

        `interventions` is `run`'s: a step shows the value an intervention made (applied before
        the step's `edits`). Every block is observed in a stepped run.
        """
        _check_block(block)
        _check_scope(scope)
        if edits is not None:
            edits = _checked_edits(edits)
        intervening = intervention_listener(block, interventions, self.listeners) if interventions is not None else None
        self.step_outputs = None
        return self._steps(block, scope, edits, bool(pause_before_calls), intervening)

    def _steps(self, block: ModelBlockSchema, scope: dict, edits: Optional[dict[int, list[dict]]],
               pause_before_calls: bool = False,
               intervening: Optional[InterventionListener] = None) -> Generator[StepInfo, None, list]:
        stepper = _Stepper(edits, self.listeners, pause_before_calls)
        listeners = [*self.listeners, stepper]
        if intervening is not None:  # before the stepper, so a step shows the new value
            intervening.step_of = lambda: stepper.index + 1
            listeners.insert(-1, intervening)
        program, observer = _borrow(block, listeners, self.capture_values, pause_before_calls)
        runner = greenlet.greenlet(lambda: program.run_root(scope))
        owner = threading.get_ident()
        finished = False
        try:
            for listener in listeners[:-1]:  # the stepper needs no start
                listener.on_run_start(block, scope)
            stepper.consumer = greenlet.getcurrent()
            item = runner.switch()
            while not runner.dead:
                yield item
                # The generator may be resumed from another greenlet than the one that started it.
                if threading.get_ident() != owner:
                    raise SchemaRunError("a stepped run can only be advanced from the thread that started it; call "
                                         "next() on it from that thread (or start a step_run per thread)")
                stepper.consumer = greenlet.getcurrent()
                item = runner.switch()
            finished = True
        finally:
            stepper.ended = True
            if not finished and not runner.dead and threading.get_ident() == owner:
                try:
                    runner.throw(StepAbandoned())
                except StepAbandoned:
                    pass
            if runner.dead:
                _give_back(block, program, observer, pause_before_calls)
        for listener in listeners[:-1]:
            listener.on_run_end(item)
        self.step_outputs = outputs_list(item)
        missed = sorted(step for step in stepper.edits if step > stepper.index)
        if missed:
            raise EditError(f"edits for step{'s' if len(missed) > 1 else ''} {', '.join(map(str, missed))} never "
                            f"applied: the run ended after {stepper.index} steps (its outputs are in step_outputs)")
        if intervening is not None:
            intervening.finish()
        return self.step_outputs


# Observed programs, compiled once per block and lent to one run at a time. A run that is still in
# progress (a paused step_run, a run nested in another) simply gets a freshly compiled one.
# Programs that announce sub-block calls (for pauses before calls) are kept apart ("idle_calls"):
# the others are compiled without those announcements.
def _borrow(block: ModelBlockSchema, listeners: Sequence[TraceListener],
            capture_values: bool, calls: bool = False) -> tuple[Program, EventObserver]:
    tensors = _tensor_results(listeners, capture_values)
    idle = _programs(block).setdefault(_idle_key(calls, tensors), [])
    try:
        program, observer = idle.pop() if idle else _compile_observed(block, calls, tensors)
    except IndexError:  # another thread took the last one
        program, observer = _compile_observed(block, calls, tensors)
    observer.configure(listeners, capture_values)
    return program, observer


def _idle_key(calls: bool, tensors: bool) -> str:
    """Which pool of idle programs: with or without call announcements, every result or tensors only."""
    return "idle" + ("_calls" if calls else "") + ("_tensors" if tensors else "")


def _tensor_results(listeners: Sequence[TraceListener], capture_values: bool) -> bool:
    """Whether every listener wants tensor results only (`every_instruction = False`)."""
    return not capture_values and not any(getattr(listener, "every_instruction", True) for listener in listeners)


def _compile_observed(block: ModelBlockSchema, calls: bool = False,
                      tensors: bool = False) -> tuple[Program, EventObserver]:
    observer = EventObserver()
    return Program(block, observer, calls=calls, tensor_results=tensors), observer


def _give_back(block: ModelBlockSchema, program: Program, observer: EventObserver, calls: bool = False) -> None:
    observer.reset()
    observer.configure(())
    idle = _programs(block).setdefault(_idle_key(calls, program.tensor_results), [])
    if len(idle) < 4:
        idle.append((program, observer))


def source_code(block: ModelBlockSchema, observed: bool = False) -> str:
    """The Python source the runtime generated for `block`'s forward (or method): what a plain run
    executes (`observed=True`: what a capture or stepped run executes, over the frame dict `f`).

    Names are the source's; temporaries `$t3` are `_t3`; calls of children are written as calls
    of their invokers (`_fc1((x,), {})`), registered weights read live (`weight = _params[...]`)."""
    if not isinstance(block, ModelBlockSchema):
        raise SchemaRunError(f"source_code takes a ModelBlockSchema, got {type(block).__name__}")
    if block.signature is None or block.skip_reason is not None:
        raise SchemaRunError(f"block {block.path or block.name!r} is not interpreted "
                             f"({block.skip_reason or 'no lowered forward'}): it has no generated code")
    program = Program(block, Observer() if observed else None)
    return program.unit(block).source
