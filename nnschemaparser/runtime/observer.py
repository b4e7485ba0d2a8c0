"""Control signals, the observer interface, and the set of files that make up the execution core.

The compiled closures return control flow as values: None (go on), BREAK, CONTINUE, RETURN (the
returned value waits in the frame under RETURN_SLOT). `Observer` is what an observed program
reports to (listeners, captures and stepping subclass it); `StepAbandoned` unwinds a paused stepped
run. `ENGINE_FILES` names the modules whose frames are instruction closures (and the name of the
generated call closures, `GENERATED_FILE`), so that error
reporting (`unbound_reads`, exception notes) can tell engine frames from the model's own code.

Depends on the schema only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .functions import InterpretedFunction
from ..schema.model import Instruction, ModelBlockSchema

__all__ = ['BREAK', 'CONTINUE', 'RETURN', 'RETURN_SLOT', 'ENGINE_FILES', 'GENERATED_FILE', 'StepAbandoned', 'Observer']


BREAK = "<break>"
CONTINUE = "<continue>"
RETURN = "<return>"
RETURN_SLOT = "$return"

# The file name of the call closures `operands.call_closure` generates (their code has no file).
GENERATED_FILE = "<nnschemaparser call>"

ENGINE_FILES = frozenset([*(str(Path(__file__).with_name(f"{name}.py"))
                            for name in ("program", "functions", "operands", "compile_calls", "compile_control",
                                         "module_hooks")), GENERATED_FILE])


class StepAbandoned(BaseException):
    """Thrown into a paused stepped run to unwind it; never caught by `except` clauses of the model."""


class Observer:
    """What an observed program reports. Every hook is a no-op here; subclasses override some."""

    def enter_block(self, block: ModelBlockSchema, frame: dict) -> None:
        """A block (forward or method) starts, with its bound frame."""

    def exit_block(self, block: ModelBlockSchema, frame: dict, result: Any) -> None:
        """A block returned `result`."""

    def fail_block(self, block: ModelBlockSchema, frame: dict, exc: BaseException) -> None:
        """A block raised `exc` (it may still be caught by the caller's try)."""

    def before(self, instr: Instruction, frame: dict) -> None:
        """A mutating instruction is about to run (its operands may change in place)."""

    def after(self, instr: Instruction, frame: dict) -> None:
        """A leaf instruction ran; its value (if any) is `frame[instr.out_var]`."""

    def before_call(self, instr: Instruction, frame: dict, callee: Any, callee_path: str) -> None:
        """A sub-block call (`instr`) is about to run `callee` (its block, or None when it is not in
        the schema). Only programs compiled with `Program(..., calls=True)` report it."""

    def begin_condition(self) -> None:
        """The test of an `if` (or a `while` re-evaluation) starts: its instructions are not steps."""

    def end_condition(self) -> None:
        """That test ended (normally or not)."""

    def enter_function(self, fn: "InterpretedFunction", frame: dict) -> None:
        """A closure, lambda or comprehension helper starts."""

    def exit_function(self, fn: "InterpretedFunction", frame: dict) -> None:
        """A closure returned or raised."""
