"""What a kept logged program logs: the plan a `keep=` selector is compiled to (runtime/step_log.py).

The traces stage builds a `LogPlan` from a selector (traces/keep_plan.py); the code generator
(runtime/reporting.py) asks it, for each op or block call binding a tensor, what to write there.
A decision that needs the callee read at run time is a `KeptIds` (a module's identity says it) or a
callable. Nothing here runs anything: this module only names the bargain.

Depends on nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KeptIds", "LogPlan"]


@dataclass(frozen=True, slots=True)
class KeptIds:
    """A decision read off the callee at run time: kept when `id(callee) in ids` is not `default`
    (the ids are those of the schema's modules whose call is decided otherwise than `default`)."""

    ids: frozenset
    default: bool


class LogPlan:
    """What a kept logged program logs (built by the traces stage from a `keep=` selector).

    `key`: what programs compiled with this plan are cached by (equal keys, equal decisions);
    `decision(instr, unit)`: for an op or block call binding `instr.out_var` in the compiled
    function `unit`, True (logged), False (counted only), a `KeptIds`, or `keep(callee) -> bool`
    for an instruction whose callee is read at run time."""

    key: Any = None

    def decision(self, instr: Any, unit: Any) -> Any:
        raise NotImplementedError
