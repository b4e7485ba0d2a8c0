"""Interventions seen from the runtime: what `interventions=` of `run`, `call` and `step_run` plugs in.

An intervention replaces the value a variable was bound to, at every place a selector names, before
the rest of the forward reads it. The runtime does not read selectors (their grammar, `keep=`'s, is
the traces stage's, `traces/selection.py`, and the runtime never imports a later stage): the traces
stage hands it, once, the function that turns an `interventions=` argument into a listener
(`use_interventions`, called by `traces/interventions.py` when it is imported, which importing the
package does). The runtime adds that listener to the run after the run's own listeners, tells it
which of them want to hear of edits and how to number steps, observes the blocks it asks for, and
asks it after the run whether every intervention found a site (`finish`).

The listener writes each new value into the live frame with `stepping.apply_edit`, the one
function that edits frames (`StepInfo.edit` calls it too), and reports it as an `EditEvent`.

Depends on `listeners`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from .listeners import TraceListener
from ..schema.errors import SchemaRunError
from ..schema.model import ModelBlockSchema

__all__ = ["InterventionListener", "use_interventions", "intervention_listener"]


class InterventionListener(TraceListener):
    """What the runtime expects of the listener an `interventions=` argument becomes.

    `observe`: ids of the blocks it must observe (None: every block). `edit_listeners`: the run's
    listeners to tell of each replacement (`on_edit`), `value_listeners` those to tell of values
    reported at a site (`on_value`: an SAE's features), both set by the runtime before the run. `step_of`:
    None, or a function giving the number of the step being made (stepped runs). `finish()` runs
    after the run returned and raises when an intervention matched nothing.
    """

    every_instruction = False
    observe: Optional[frozenset] = None

    def __init__(self) -> None:
        self.edit_listeners: list[TraceListener] = []
        self.value_listeners: list[TraceListener] = []
        self.step_of: Optional[Callable[[], int]] = None

    def finish(self) -> None:
        """Raise when an intervention matched nothing in the run that ended."""


_COMPILER: list[Callable[[ModelBlockSchema, Any], InterventionListener]] = []


def use_interventions(compiler: Callable[[ModelBlockSchema, Any], InterventionListener]) -> None:
    """Set the function that turns `(root, interventions)` into the run's `InterventionListener`."""
    _COMPILER[:] = [compiler]


def intervention_listener(root: ModelBlockSchema, interventions: Any,
                          listeners: Sequence[TraceListener]) -> InterventionListener:
    """The listener of `interventions` for a run of `root` whose own listeners are `listeners`."""
    if not _COMPILER:
        raise SchemaRunError("interventions= needs the traces stage, which reads selectors; import "
                             "nnschemaparser (or nnschemaparser.traces.interventions) first")
    listener = _COMPILER[0](root, interventions)
    base = TraceListener.on_edit
    listener.edit_listeners = [l for l in listeners if getattr(type(l), "on_edit", base) is not base]
    listener.value_listeners = [l for l in listeners if getattr(type(l), "on_value", TraceListener.on_value)
                                is not TraceListener.on_value]
    return listener
