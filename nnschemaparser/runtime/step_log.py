"""Logged runs: plain generated code that appends each tensor result to a per-run log.

A capture of everything needs, per step, the value, what made it and where; it need not hear of the
step while the run goes. A `LoggingProgram` is a plain program (fast locals, no observer) whose
generated code (runtime/reporting.py) writes, where an observed capture would report a tensor,

    _log((instruction, value, value._version))          # or (..., callee) where the callee is read at run time

into `StepLog.steps`, and marks in `StepLog.marks` each block's entry `(unit, position)` and exit
`(None, position)` (closures: `(FUNCTION, position)` and `(None, position)`, told by their
`InterpretedFunction`), where `position` is how many steps were logged before. The root block
keeps a frame dict; each of its returns logs `(instruction, frame)` in `StepLog.returns`. An
instruction that may change its operands in place calls `StepLog.before(instr, names)` first,
which hands it to `on_mutation` (the recorder: a kept value about to change is copied). The
recorder (traces/logged.py) builds the trace's steps from the log after the run, when they are
read: step numbers are positions, depths and block paths come from the marks.

A schema with a generator block (a forward with `yield`) is not logged (`loggable`): a
generator's stretches run at its consumer's depth, which entry and exit marks cannot say.

A *kept* logged program (`LoggingProgram(root, plan)`) logs only what a `LogPlan` keeps (a
`keep=` selector compiled by traces/keep_plan.py): the code generator asks the plan, once per
instruction and function, whether the tensor it binds is kept (`True`), only counted (`False`,
`count[0] += 1`), or decided by the callee read at run time (`KeptIds`: the ids of the modules
whose call is kept, or not; a callable for the rest). Every tensor result adds 1 to
`StepLog.count[0]` and a kept one is logged as `(instruction, value, version, number[, callee])`,
`number` the count after it: the step's number in a capture of everything. Marks and `before`
calls are written as in the full log.

Programs are cached per schema (in `programs_for`); kept ones per plan key too, a few at a time
(`KEEP_PROGRAMS`); one in use by a run is not lent to another.

Depends on the schema, `program`, `listeners` and `log_plan`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..schema.model import ModelBlockSchema, YieldInstruction
from .instructions import walk_instructions
from .listeners import Observer
from .log_plan import KeptIds, LogPlan
from .program import Program, programs_for

__all__ = ["StepLog", "LoggedRun", "LoggingProgram", "LogPlan", "KeptIds", "FUNCTION", "loggable", "run_logged"]

FUNCTION = "<function>"  # the mark of a closure's frame (its path and block are its caller's)
_KEY, _KEPT_KEY, _LOCK = "logging", "logging-kept", threading.Lock()
KEEP_PROGRAMS = 4  # kept logged programs (plans) compiled per schema at a time


@dataclass(slots=True)
class LoggedRun:
    """What a logged run left: its steps, marks and the root's returns (see the module text)."""

    steps: list
    marks: list
    returns: list
    count: Optional[int] = None  # a kept log's tensor results, logged or not (None: every one was logged)


class StepLog:
    """The per-run lists a logged program's code appends to (kept across runs, emptied by `take`)."""

    __slots__ = ("steps", "marks", "returns", "count", "on_mutation")

    def __init__(self) -> None:
        self.steps: list = []
        self.marks: list = []
        self.returns: list = []
        self.count: list = [0]  # a kept log's count of tensor results (its code adds to `count[0]`)
        # `on_mutation(instr, names, steps)`: an instruction is about to change its operands in place
        self.on_mutation: Optional[Callable[[Any, dict, list], None]] = None

    def before(self, instr: Any, names: dict) -> None:
        if self.on_mutation is not None:
            self.on_mutation(instr, names, self.steps)

    def take(self, counted: bool = False) -> LoggedRun:
        """The run's lists, copied (the generated code keeps appending to these very objects);
        `counted`: a kept log, whose `count` goes with them."""
        taken = LoggedRun(self.steps.copy(), self.marks.copy(), self.returns.copy(),
                          self.count[0] if counted else None)
        self.clear()
        return taken

    def clear(self) -> None:
        self.steps.clear()
        self.marks.clear()
        self.returns.clear()
        self.count[0] = 0


class _FunctionMarks(Observer):
    """What a closure tells of its frame in a logged run: a mark at its entry and exit."""

    def __init__(self, log: StepLog):
        self.mark, self.steps = log.marks.append, log.steps

    def enter_function(self, fn: Any, frame: dict) -> None:
        self.mark((FUNCTION, len(self.steps)))

    def exit_function(self, fn: Any, frame: dict) -> None:
        self.mark((None, len(self.steps)))


class LoggingProgram(Program):
    """A plain program whose code logs each tensor result in `log`, or those `plan` keeps (see the module text)."""

    def __init__(self, root: ModelBlockSchema, plan: Optional[LogPlan] = None):
        self.log = StepLog()
        self.log_plan = plan
        super().__init__(root)
        self.frame_observer = _FunctionMarks(self.log)
        self.busy = False

    def frame_reason(self, block: ModelBlockSchema) -> Optional[str]:
        return "its variables are the capture's root scope" if block is self.root else None


def loggable(root: ModelBlockSchema) -> Optional[str]:
    """None when a run of `root` can be logged, else why not (cached per schema)."""
    cache = programs_for(root)
    if "loggable" not in cache:
        cache["loggable"] = _why_not(root)
    return cache["loggable"]


def _why_not(root: ModelBlockSchema) -> Optional[str]:
    if root.skip_reason is not None or root.signature is None or root.module is None:
        return "the root block does not run as a schema"
    for block in root.iter_blocks():
        sig = block.signature
        if sig is not None and block.skip_reason is None and any(
                isinstance(instr, YieldInstruction) for instr in walk_instructions(sig.body)):
            return f"{block.path or block.name} is a generator"
    return None


def run_logged(root: ModelBlockSchema, scope: dict,
               on_mutation: Optional[Callable[[Any, dict, list], None]] = None,
               plan: Optional[LogPlan] = None) -> tuple[Any, LoggedRun]:
    """Run `root` on `scope` with a logging program (with `plan`, the kept one compiled for its key):
    (what forward returned, the run's log)."""
    with _LOCK:
        if plan is None:
            cache, key = programs_for(root), _KEY
        else:
            cache, key = programs_for(root).setdefault(_KEPT_KEY, {}), plan.key
        program = cache.get(key)
        if program is None or program.busy:
            fresh = LoggingProgram(root, plan)
            if program is None:
                if plan is not None and len(cache) >= KEEP_PROGRAMS:
                    cache.pop(next(iter(cache)))
                cache[key] = fresh
            program = fresh
        program.busy = True
    log = program.log
    log.clear()
    log.on_mutation = on_mutation
    try:
        outputs = program.run_root(scope)
        return outputs, log.take(plan is not None)
    finally:
        log.clear()
        log.on_mutation = None
        program.busy = False
