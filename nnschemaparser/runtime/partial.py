"""Partly observed runs: the observer's calls only in the blocks a listener asked for.

A capture that keeps two layers of a 32-layer model needs the observer in those two layers (and in
the blocks on the way to them), not in the thirty others. `partial_programs(root, observed)` gives
a pair of programs compiled for one set of blocks (ids of `ModelBlockSchema`s):

- an observed `Program` whose invoker of any block outside `observed` is the other program's;
- a *counted* plain `Program` (plain generated code, fast locals) that, after each instruction
  binding a tensor where an observed run would report one, adds 1 to a counter (`counter[0]`), so
  a listener numbering its steps adds the counter and numbers them as a fully observed run does
  (`TraceListener.on_unobserved_counter`). A call it makes of a block in `observed` (a module
  reached by identity rather than through its parent) goes back to the observed program.

A call the counted program makes through a value (`call_value`: `layer(x)` for a module held in a
variable) is told first to `counted.watch`, which a run sets from its listeners'
`unobserved_call_hook()`: a recorder keeping `call=` steps learns of a call it cannot record
(its caller was not observed because nothing in the source said it calls that block) and says so.

What runs is the same code either way (a plain run is what `SchemaInterpreter.run` executes), so
outputs are the same. What a listener does not see in an unobserved block: its events, including
`on_before_mutation`, so an in-place change there of a value the listener kept from an observed
block is caught only by the value's version counter (the recorder drops such a value and says so).

Pairs are cached per schema (weakly keyed by its root, in `programs_for`), a few sets at a time;
a pair in use by one run is not lent to another (a concurrent run compiles its own).

Depends on `program` and `listeners`.
"""

from __future__ import annotations

import threading
from typing import Optional

from ..schema.model import ModelBlockSchema
from .listeners import EventObserver
from .program import Program, programs_for

__all__ = ["PartialPrograms", "partial_programs", "give_back_partial"]

_KEY = "partial"
_KEEP = 4  # sets of blocks whose programs stay compiled per schema
_LOCK = threading.Lock()


class PartialPrograms:
    """The observed program, its observer, the counted plain program and its counter, for one set of blocks."""

    __slots__ = ("observed", "observer", "counted", "counter", "blocks", "busy")

    def __init__(self, root: ModelBlockSchema, blocks: frozenset):
        self.blocks = blocks
        self.counter = [0]
        self.observer = EventObserver()
        self.observed = Program(root, self.observer, tensor_results=True)
        self.counted = Program(root, counter=self.counter)
        observed, counted = self.observed, self.counted
        self.observed.elsewhere = lambda block: None if id(block) in blocks else counted
        self.counted.elsewhere = lambda block: observed if id(block) in blocks else None
        self.busy = False


def partial_programs(root: ModelBlockSchema, blocks: frozenset) -> PartialPrograms:
    """A free pair for `blocks` (compiled now if none is cached or the cached one is in use); the
    caller sets its observer's listeners and gives it back with `give_back_partial`."""
    with _LOCK:
        cache = programs_for(root).setdefault(_KEY, {})
        pair: Optional[PartialPrograms] = cache.get(blocks)
        if pair is not None and not pair.busy:
            pair.busy = True
            pair.counter[0] = 0
            return pair
    fresh = PartialPrograms(root, blocks)
    fresh.busy = True
    with _LOCK:
        if blocks not in cache and len(cache) >= _KEEP:
            cache.pop(next(iter(cache)))
        cache.setdefault(blocks, fresh)
    return fresh


def give_back_partial(pair: PartialPrograms) -> None:
    pair.counted.watch = None
    pair.observer.reset()
    pair.observer.configure(())
    pair.counter[0] = 0
    pair.busy = False
