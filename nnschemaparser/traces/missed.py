"""What a `keep=` selector named and a capture could not keep: `KeepMissedWarning` and its messages.

Two cases, both said rather than left as a trace that is silently short:

- a call a `call=` term names, made through a value (a module passed in as an argument, which the
  lowering could not see as a block call) from a block the capture did not observe: the counted
  program tells the recorder before the call (`Program.watch`), and there is no frame to number
  the step from (`missed_calls_warning` names caller, callee and the selector that records it);
- a `call=` term that kept nothing in a run: a block returning a tuple or a dict binds no tensor at
  its call (`empty_call_terms`).

Depends on the standard library and the selector (`selection`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable

from .selection import KeepSelector, is_block_call, path_matches

__all__ = ["KeepMissedWarning", "generated_caller", "call_watch", "missed_calls_warning", "empty_call_terms"]


class KeepMissedWarning(UserWarning):
    """A `call=` selector named a call that a partly observed capture could not record (see the message)."""


def generated_caller(frame: Any) -> str:
    """The block path of the nearest generated function on the stack from `frame` ("?" if none)."""
    from ..runtime.functions import META_KEY

    while frame is not None:
        meta = frame.f_globals.get(META_KEY)
        if meta is not None and meta.block_ref is not None:
            block = meta.block_ref()
            if block is not None:
                return block.path or block.name
        frame = frame.f_back
    return "?"


def call_watch(keep: KeepSelector, blocks_by_module: Callable[[], dict],
               note: Callable[[tuple[str, str]], None]) -> Callable[[Any], None]:
    """`watch(module)` for `Program.watch`: `note((caller path, callee path))` for each call of a
    block `keep`'s `call=` terms name, from the caller the generated frame below says."""
    def watch(module: Any) -> None:
        block = blocks_by_module().get(id(module))
        if block is not None and keep.keeps_call_of(block.path):
            caller = generated_caller(sys._getframe(2))  # call_value's caller: the generated function
            if keep.keeps_call_of(block.path, caller):
                note((caller, block.path))

    return watch


def missed_calls_warning(keep: KeepSelector, missed: list[tuple[str, str]]) -> KeepMissedWarning:
    """The warning for the (caller path, callee path) calls a run could not record."""
    calls = sorted(set(missed))
    listed = "; ".join(f"{callee} called from {caller}" for caller, callee in calls[:5]) + \
        ("; ..." if len(calls) > 5 else "")
    return KeepMissedWarning(
        f"keep={keep.text()!r} names {len(missed)} call(s) this capture did not record ({listed}): each was "
        f"made through a value (not a child the source names) from a block the capture did not observe. "
        f"Name the caller too (keep='{calls[0][0]} call={calls[0][1]}') or run capture_run(..., "
        f"observe_all=True) to record them")


def empty_call_terms(keep: KeepSelector, steps: Iterable[tuple[str, str, str, str, str]],
                     missed: list[tuple[str, str]]) -> list[KeepMissedWarning]:
    """A warning for each `call=` term of `keep` that matched none of the kept `steps` ((block path,
    variable, op, slot, description) each), unless a missed call explains it already."""
    steps = list(steps)
    callees = [callee for _, callee in missed]
    said = []
    for term in keep.terms:
        if term.call is None or any(term.matches(b, v, o, t, is_block_call(d)) for b, v, o, t, d in steps) \
                or any(path_matches(callee, term.call, inside=False) for callee in callees):
            continue
        said.append(KeepMissedWarning(
            f"keep term {term.text()!r} kept nothing in this run: no call of a block it names returned a "
            f"tensor here. A block returning a tuple or a dict (an attention's (output, weights)) binds no "
            f"tensor at its call: keep what its caller takes out of it ('<caller path>:<variable>'), or "
            f"check the path (schema.find)"))
    return said


def kept_nothing_message(keep: KeepSelector, what: str = "this whole input") -> str:
    """What a `KeepMissedWarning` says when `keep` kept no value over `what` (capture_run, capture_dataset)."""
    return (f"keep={keep.text()!r} kept nothing over {what}: no step's block path, variable, op or call "
            f"matched it. Check the paths against schema.iter_blocks() (a path glob's `*` stays within one "
            f"segment; `**` crosses dots). A model wrapped after parsing (nnsight, PEFT, accelerate, "
            f"torch.compile) is not what the schema runs: parse the inner model (PEFT's "
            f"model.get_base_model(), a compiled model's _orig_mod, nnsight's ._module)")
