"""The listener layer: the observer calls of generated code become event records for recorders, steppers and views.

`TraceListener` documents each hook as a no-op; subclasses override what they need. `EventObserver`
is the runtime-side adapter: it keeps the stack of live frames (so every event knows its frame depth
and block path), optionally snapshots values into `instruction.resolved` (capture_values), and fans
each event out, in order, to the listeners that override its hook; an event nobody listens to is
never built. One observer serves many runs: `configure` swaps its listeners between runs.

`Observer` (the interface the generated code calls), the signals of parts compiled apart and
`StepAbandoned` live here too.

Depends on schema and notation; never on views.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from ..schema.notation import value_repr
from ..schema.model import (
    BlockInstruction,
    DeleteInstruction,
    FunctionInstruction,
    Instruction,
    ModelBlockSchema,
    OpInstruction,
    RaiseInstruction,
    ReturnInstruction,
    TensorReprWithValue,
)

__all__ = ["Observer", "StepAbandoned", "BREAK", "CONTINUE", "RETURN", "RETURN_SLOT", "TraceListener", "BlockEvent", "InstructionEvent", "CallEvent", "EditEvent", "EventObserver", "instruction_kind",
           "snapshot"]


# Signals of a part compiled apart (a statement nested past Python's limits): it returns None (go
# on), BREAK, CONTINUE or RETURN (the returned value waits in the frame under RETURN_SLOT). An
# observed function's return value waits there too while `after` sees it.
BREAK = "<break>"
CONTINUE = "<continue>"
RETURN = "<return>"
RETURN_SLOT = "$return"


class StepAbandoned(BaseException):
    """Thrown into a paused stepped run to unwind it; never caught by `except` clauses of the model."""


class Observer:
    """What an observed program reports. Every hook is a no-op here; `EventObserver` (below), the
    parser's resolver and tests subclass it."""

    def enter_block(self, block: ModelBlockSchema, frame: dict) -> None:
        """A block (forward or method) starts, with its bound frame."""

    def exit_block(self, block: ModelBlockSchema, frame: dict, result: Any) -> None:
        """A block returned `result`."""

    def fail_block(self, block: ModelBlockSchema, frame: dict, exc: BaseException) -> None:
        """A block raised `exc` (it may still be caught by the caller's try)."""

    def before(self, instr: Instruction, frame: dict) -> None:
        """A mutating instruction is about to run (its operands may change in place)."""

    # An observer whose `after` takes the instruction's site and the value it bound instead,
    # `after(sites, k, frame, value)` with `sites[k]` the instruction: its programs pass a list of
    # the generated function's instructions and a constant index (no reference to the instruction
    # object itself, which a run finds cold in the cache), and `f.get(out_var)` (a return: the
    # return slot; else None) read with the name as a constant (stepping.SteppingObserver).
    after_takes_site = False

    def after(self, instr: Instruction, frame: dict) -> None:
        """A leaf instruction ran; its value (if any) is `frame[instr.out_var]`."""

    def before_call(self, instr: Instruction, frame: dict, callee: Any, callee_path: str) -> None:
        """A sub-block call (`instr`) is about to run `callee` (its block, or None when it is not in
        the schema). Only programs compiled with `Program(..., calls=True)` report it."""

    def begin_condition(self) -> None:
        """The test of an `if` (or a `while` re-evaluation) starts: its instructions are not steps."""

    def end_condition(self) -> None:
        """That test ended (normally or not)."""

    def enter_function(self, fn: Any, frame: dict) -> None:
        """A closure, lambda or comprehension helper (an `InterpretedFunction`) starts."""

    def exit_function(self, fn: Any, frame: dict) -> None:
        """A closure returned or raised."""


# Event records are slotted, not frozen: a frozen dataclass costs several times more to build, and
# one event is built per executed instruction. Treat them as read-only all the same.


@dataclass(slots=True)
class BlockEvent:
    """A block was entered or left. `result` is set on exit; `frame` is the block's live scope."""

    block: ModelBlockSchema
    frame: dict
    depth: int
    path: str
    result: Any = None


@dataclass(slots=True)
class InstructionEvent:
    """A leaf instruction ran in `block` (at `path`); `value` is what it bound (None if nothing).

    `stepped` is False for the instructions of an `if` test or of a `while` test after its first
    evaluation (spec: condition expressions of if/while re-evaluations are not stepped): traces
    record them, `step_run` does not pause on them.
    """

    instruction: Instruction
    frame: dict
    depth: int
    block: ModelBlockSchema
    path: str
    value: Any
    has_value: bool
    frames: tuple
    stepped: bool = True


@dataclass(slots=True)
class CallEvent:
    """A sub-block call is about to run: `instruction` in `block` (at `path`, frame `depth`) calls
    `callee` (its block; None when it is not in the schema), named `callee_path`. No value yet and
    not a step: only stepped runs that pause before calls report it (`step_run(pause_before_calls=True)`);
    `stepped` is False inside an `if` test or a `while` re-evaluation, as for instructions."""

    instruction: Instruction
    frame: dict
    depth: int
    block: ModelBlockSchema
    path: str
    callee: Optional[ModelBlockSchema]
    callee_path: str
    frames: tuple
    stepped: bool = True


@dataclass(frozen=True)
class EditEvent:
    """`name` in frame `depth` went from `old` to `new` by an edit made at step `step_index`."""

    step_index: int
    depth: int
    name: str
    old: Any
    new: Any


class TraceListener:
    """Base class of listeners: every hook does nothing.

    `every_instruction = False` on a subclass says its `on_instruction` only wants instructions
    that bound a tensor, and returns: the observer then builds no event for the others (the getattr
    of a method, an unpacked int, a constant), which is most of what a capture of tensors would
    otherwise pay for.
    """

    every_instruction: bool = True

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        """A run of `root` starts with the given input scope."""

    def on_block_enter(self, event: BlockEvent) -> None:
        """A block's frame has been bound and its body is about to run."""

    def on_block_exit(self, event: BlockEvent) -> None:
        """A block returned `event.result`."""

    def on_instruction(self, event: InstructionEvent) -> None:
        """A leaf instruction ran; its bound value is `event.value`."""

    def on_before_mutation(self, instruction: Instruction, frame: dict) -> None:
        """An instruction that may change its operands in place is about to run."""

    def on_before_call(self, event: "CallEvent") -> None:
        """A sub-block call is about to run (only in stepped runs that pause before calls; not a step)."""

    def on_edit(self, event: "EditEvent") -> None:
        """A stepped run's edit replaced a variable of a live frame (see SchemaInterpreter.step_run)."""

    def on_value(self, path: str, depth: int, name: str, value: Any, description: str, op: str) -> None:
        """A value computed beside the instructions, reported as a variable of the block at `path`
        (frame `depth`) named `name`: an SAE's features at an intervention's site (`Site.record`).
        It comes after the instruction (and the edit) of the site it was computed at."""

    def on_run_end(self, outputs: Any) -> None:
        """The run returned `outputs` (what forward returns)."""

    def on_unobserved_counter(self, counter: list) -> None:
        """Before `on_run_start` of a partly observed run (`SchemaInterpreter(observe=...)`,
        runtime/partial.py): `counter[0]` is, at any moment, how many tensor results the blocks run
        unobserved have bound so far; a listener numbering steps adds it to its own count."""

    def unobserved_call_hook(self) -> Optional[Callable[[Any], None]]:
        """None, or `watch(module)` for a partly observed run: called before a block left unobserved
        calls a module held in a value (the caller's generated frame is the caller's caller)."""
        return None

    def tensor_result_hook(self) -> Optional[Callable[[Instruction, dict, Any], None]]:
        """None, or a function `after(instruction, frame, observer)` the observer calls instead of
        building an `InstructionEvent` for `on_instruction`: used only when this listener is the
        run's one instruction listener, has `every_instruction = False` and values are not captured.
        It gets what the event would hold from the frame and the observer (`depth`, `block`,
        `path`, `frames`, `frames_tuple()`, `conditions`) and must do exactly what `on_instruction`
        does with the event."""
        return None

    def instruction_hook(self) -> Optional[Callable[[Instruction, dict, Any], None]]:
        """Like `tensor_result_hook`, for a listener with `every_instruction = True`: called for
        every instruction instead of building an `InstructionEvent`, when this listener is the run's
        one instruction listener and values are not captured (the stepper uses it)."""
        return None


_KINDS = {
    OpInstruction: "op",
    BlockInstruction: "block",
    ReturnInstruction: "return",
    FunctionInstruction: "function",
    DeleteInstruction: "delete",
    RaiseInstruction: "raise",
}


def instruction_kind(instr: Instruction) -> str:
    kind = _KINDS.get(instr.__class__)
    if kind is None:
        kind = _KINDS[instr.__class__] = instr.__class__.__name__.replace("Instruction", "").lower()
    return kind


def snapshot(value: Any) -> Any:
    """A detached view of a tensor (shares storage), or the value itself."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    return value


class EventObserver(Observer):
    """Turns the generated code's observer calls into events for `listeners`, tracking frames and block paths.

    `after` runs once per executed instruction, so what every event shares is kept ready instead of
    recomputed: the depth, block and path of the innermost frame, and the tuple of live frames
    (rebuilt only when a block or function is entered or left, not per instruction).
    """

    def __init__(self, listeners: Sequence[TraceListener] = (), capture_values: bool = False):
        self.frames: list[dict] = []
        self.paths: list[str] = []
        self.blocks: list[ModelBlockSchema] = []
        self._frames_tuple: Optional[tuple] = None
        self.depth = -1
        self.block: Optional[ModelBlockSchema] = None
        self.path = ""
        self.conditions = 0  # how many unstepped condition tests are running
        self.configure(listeners, capture_values)

    def configure(self, listeners: Sequence[TraceListener], capture_values: bool = False) -> None:
        """Point this observer (and the program compiled around it) at other listeners, between runs."""
        self.listeners = list(listeners)
        self.capture_values = capture_values
        # Only listeners that override a hook are called for it, and no event is built for a hook
        # nobody listens to: block events and instruction events are the per-step cost.
        self._mutation_listeners = _overriding(self.listeners, "on_before_mutation")
        self._call_listeners = _overriding(self.listeners, "on_before_call")
        self._enter_listeners = _overriding(self.listeners, "on_block_enter")
        self._exit_listeners = _overriding(self.listeners, "on_block_exit")
        self._instruction_listeners = _overriding(self.listeners, "on_instruction")
        self._instruction_calls = tuple(listener.on_instruction for listener in self._instruction_listeners)
        self._instruction_wants = tuple((listener.on_instruction, bool(listener.every_instruction))
                                        for listener in self._instruction_listeners)
        self._every = all(every for _, every in self._instruction_wants)
        self._any_every = any(every for _, every in self._instruction_wants)
        self._direct: Optional[Callable[[Instruction, dict, Any], None]] = None
        if not capture_values and len(self._instruction_listeners) == 1:
            only = self._instruction_listeners[0]
            self._direct = only.instruction_hook() if self._any_every else only.tensor_result_hook()

    def reset(self) -> None:
        self.conditions = 0
        self.frames.clear()
        self.paths.clear()
        self.blocks.clear()
        self._moved()

    def _moved(self) -> None:
        """The frame stack changed: refresh what the next events share."""
        self._frames_tuple = None
        self.depth = len(self.frames) - 1
        self.block = self.blocks[-1] if self.blocks else None
        self.path = self.paths[-1] if self.paths else ""

    def frames_tuple(self) -> tuple:
        """The live frames, outermost first (rebuilt only when a block or function is entered or left)."""
        frames = self._frames_tuple
        if frames is None:
            frames = self._frames_tuple = tuple(self.frames)
        return frames

    @staticmethod
    def block_path(block: ModelBlockSchema) -> str:
        return block.path or block.name

    def enter_block(self, block: ModelBlockSchema, frame: dict) -> None:
        self.frames.append(frame)
        path = block.path or block.name
        self.paths.append(path)
        self.blocks.append(block)
        self._frames_tuple = None
        self.depth += 1
        self.block = block
        self.path = path
        if self._enter_listeners:
            event = BlockEvent(block, frame, self.depth, path)
            for listener in self._enter_listeners:
                listener.on_block_enter(event)

    def exit_block(self, block: ModelBlockSchema, frame: dict, result: Any) -> None:
        if self._exit_listeners:
            event = BlockEvent(block, frame, len(self.frames) - 1, self.paths[-1], result)
            for listener in self._exit_listeners:
                listener.on_block_exit(event)
        # `_pop` written out: this runs once per block call of every observed run
        frames, paths, blocks = self.frames, self.paths, self.blocks
        frames.pop()
        paths.pop()
        blocks.pop()
        self._frames_tuple = None
        self.depth = len(frames) - 1
        self.block = blocks[-1] if blocks else None
        self.path = paths[-1] if paths else ""

    def fail_block(self, block: ModelBlockSchema, frame: dict, exc: BaseException) -> None:
        self._pop()

    def _pop(self) -> None:
        self.frames.pop()
        self.paths.pop()
        self.blocks.pop()
        self._moved()

    def begin_condition(self) -> None:
        self.conditions += 1

    def end_condition(self) -> None:
        self.conditions -= 1

    def enter_function(self, fn: Any, frame: dict) -> None:
        self.frames.append(frame)
        self.paths.append(self.paths[-1] if self.paths else "")
        self.blocks.append(self.blocks[-1] if self.blocks else fn.unit.block)
        self._moved()

    def exit_function(self, fn: Any, frame: dict) -> None:
        self._pop()

    def before(self, instr: Instruction, frame: dict) -> None:
        for listener in self._mutation_listeners:
            listener.on_before_mutation(instr, frame)

    def before_call(self, instr: Instruction, frame: dict, callee: Optional[ModelBlockSchema], callee_path: str) -> None:
        if not self._call_listeners:
            return
        frames = self._frames_tuple
        if frames is None:
            frames = self._frames_tuple = tuple(self.frames)
        event = CallEvent(instr, frame, self.depth, self.block, self.path, callee, callee_path, frames,
                          self.conditions == 0)
        for listener in self._call_listeners:
            listener.on_before_call(event)

    def after(self, instr: Instruction, frame: dict) -> None:
        direct = self._direct
        if direct is not None:  # one instruction listener with its own hook: no event to build
            direct(instr, frame, self)
            return
        returns = instr.__class__ is ReturnInstruction or isinstance(instr, ReturnInstruction)
        if returns:
            value, has_value = frame.get(RETURN_SLOT), True
        else:
            out = instr.out_var
            value = frame.get(out, _UNSET) if out else _UNSET
            has_value = value is not _UNSET
            if not has_value:
                value = None
        if self.capture_values and has_value and instr.out_var:
            repr_ = value_repr(value)
            instr.resolved = TensorReprWithValue(shape=repr_.shape, dtype=repr_.dtype, value=snapshot(value))
        calls = self._instruction_calls
        if not calls:
            return
        if self._every:
            wanted = True
        else:
            wanted = returns or isinstance(value, torch.Tensor)
            if not wanted and not self._any_every:
                return
        frames = self._frames_tuple
        if frames is None:
            frames = self._frames_tuple = tuple(self.frames)
        event = InstructionEvent(instr, frame, self.depth, self.block, self.path, value, has_value, frames,
                                 self.conditions == 0)
        if wanted:
            for call in calls:
                call(event)
        else:
            for call, every in self._instruction_wants:
                if every:
                    call(event)


_UNSET = object()


def _overriding(listeners: Sequence[TraceListener], hook: str) -> list[TraceListener]:
    base = getattr(TraceListener, hook)
    return [listener for listener in listeners if getattr(type(listener), hook, base) is not base]


def block_label(block: Optional[ModelBlockSchema]) -> str:
    if block is None:
        return ""
    return block.name if not block.method_name else f"{block.name}.{block.method_name}"


def observed_run(observer: Observer, block: ModelBlockSchema, fn: Callable[[dict], Any], frame: dict) -> Any:
    """Run the generated frame function `fn` of `block`, told to `observer` (enter, exit or fail)."""
    if fn.__code__.co_flags & inspect.CO_GENERATOR:
        return observed_generator(observer, block, fn(frame), frame)
    observer.enter_block(block, frame)
    try:
        result = fn(frame)
    except BaseException as exc:
        observer.fail_block(block, frame, exc)
        raise
    observer.exit_block(block, frame, result)
    return result


def observed_generator(observer: Observer, block: ModelBlockSchema, generator: Any, frame: dict) -> Any:
    """A generator block's generator, observed: each stretch it runs (to a `yield`, or to its end)
    is entered and left as the block, so listeners see its steps inside it, in the order they run."""
    sent, thrown = None, None
    while True:
        observer.enter_block(block, frame)
        try:
            value = generator.send(sent) if thrown is None else generator.throw(thrown)
        except StopIteration as stop:
            observer.exit_block(block, frame, stop.value)
            return stop.value
        except BaseException as exc:
            observer.fail_block(block, frame, exc)
            raise
        observer.exit_block(block, frame, value)
        sent, thrown = None, None
        try:
            sent = yield value
        except GeneratorExit:
            generator.close()
            raise
        except BaseException as exc:  # thrown in by the user (a `with` block's exception): pass it on
            thrown = exc
