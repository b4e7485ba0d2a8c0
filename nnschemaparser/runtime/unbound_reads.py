"""Reads of variables that hold no value: the engine's KeyError becomes CPython's NameError.

The engine keeps a function's variables in a dict, so reading one that is not bound raises
KeyError(name) inside an instruction closure. CPython raises UnboundLocalError for a local and
NameError for a free variable of a closure or comprehension, and a model's `except` clauses must see
those. A KeyError of the model's own code (a dict lookup) is told apart by where it was raised.

Depends on schema and argument_binding only; the engine passes the names of its files.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from .argument_binding import INLINED_COMPREHENSIONS
from ..schema.model import Instruction, SliceOf, VarRef

__all__ = ["unbound_error", "read_names"]


def read_names(instr: Instruction) -> set:
    """The frame variables an instruction reads itself (not those of its nested bodies)."""
    names: set = set()

    def walk(op: Any) -> None:
        if isinstance(op, VarRef):
            names.add(op.name)
        elif isinstance(op, SliceOf):
            walk(op.lower), walk(op.upper), walk(op.step)
        elif isinstance(op, (list, tuple)):
            for item in op:
                walk(item)
        elif isinstance(op, dict):
            for key, value in op.items():
                walk(key), walk(value)

    for attr in ("target", "args", "kwargs", "exc", "cause", "defaults", "kw_defaults"):
        walk(getattr(instr, attr, None))
    for attr in ("args_var", "kwargs_var", "cond_var", "callee_var", "context_var"):
        value = getattr(instr, attr, None)
        if value:
            names.add(value)
    names.update(getattr(instr, "out_vars", None) or ())
    return names


def unbound_error(exc: KeyError, engine_files: frozenset, free_vars: tuple, function_name: str) -> Optional[BaseException]:
    """The error CPython raises for the unbound read `exc` is, or None when `exc` is no such read.

    The innermost instruction closure (a frame of one of `engine_files` with an `_i` instruction and an `f`
    frame dict) must have nothing but engine frames below it, must read the name, and the name must
    be missing from its frame. `free_vars` and `function_name` describe the function whose frame it
    is: a free variable is a NameError unless the function is a comprehension inlined by Python 3.12+.
    """
    if len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return None
    name = exc.args[0]
    instr, frame, fused = None, None, None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in engine_files:
            instr, frame = None, None
        else:
            local = tb.tb_frame.f_locals
            candidate, fetch = local.get("_i"), local.get("_r")
            if candidate is None and "_at" in local:  # a generated body: the instruction of the failing line
                candidate, fetch = local["_at"].get(tb.tb_lineno, (None, None))
            if isinstance(candidate, Instruction) and isinstance(local.get("f"), dict):
                instr, frame = candidate, local["f"]
                fused = fetch  # a fused method call also reads its getattr's receiver
        tb = tb.tb_next
    if instr is None or name in frame:
        return None
    if name not in read_names(instr) and not (isinstance(fused, Instruction) and name in read_names(fused)):
        return None
    inlined = sys.version_info >= (3, 12) and function_name in INLINED_COMPREHENSIONS
    if name in free_vars and not inlined:
        if sys.version_info >= (3, 11):
            error: BaseException = NameError(f"cannot access free variable '{name}' where it is not associated "
                                             "with a value in enclosing scope")
        else:
            error = NameError(f"free variable '{name}' referenced before assignment in enclosing scope")
    elif sys.version_info >= (3, 11):
        error = UnboundLocalError(f"cannot access local variable '{name}' where it is not associated with a value")
    else:
        error = UnboundLocalError(f"local variable '{name}' referenced before assignment")
    return error.with_traceback(exc.__traceback__)
