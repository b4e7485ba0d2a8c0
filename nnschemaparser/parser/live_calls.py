"""What the parser does with the live-call detector's findings, and Python's own RNG state.

`lend_reached` marks the interpreted blocks whose original forward live code ran on the example
run, so the next run lends them the schema (`runtime.lending`); `helpers_of` turns the program's
notes of live helpers into coverage rows. `python_rng_states` / `set_python_rng_states` save and
replay Python's `random` and numpy's global generator, which a forward may draw from (layer
dropout): verification runs the schema and eager from the same states, and parsing leaves them
as it found them.

Depends on the schema and `runtime.coverage`.
"""

from __future__ import annotations

import random
import sys
from typing import Any, Optional

from ..runtime.coverage import LiveCall
from ..schema.model import ModelBlockSchema

__all__ = ["lend_reached", "helpers_of", "python_rng_states", "set_python_rng_states", "skipped_key", "unreached_rows"]


def lend_reached(root: ModelBlockSchema, calls: list) -> bool:
    """Mark the interpreted blocks whose original forward live code ran (`reached_live`): runs lend
    them the schema as their forward. True when there was one to mark."""
    marked = False
    for call in calls:
        if call.kind != "module" or call.module is None:
            continue
        try:
            block = root.find(call.module)
        except KeyError:
            continue
        if block.skip_reason is None and block.signature is not None and not block.reached_live:
            block.reached_live = marked = True
    return marked


def helpers_of(calls: Any) -> list:
    """The program's notes of live helpers that called interpreted modules, as coverage rows."""
    out = []
    for call in calls:
        call = LiveCall(**{**call.__dict__})
        call.kind = "helper"
        out.append(call)
    return out


def skipped_key(row: dict, root_key: str) -> str:
    """The key of `schema.skipped` naming a coverage row's region: the module's path ("<root>" for
    the root); for a module that is no sub-module, "<Class from block>"; " (backward)" added for
    what ran while gradients were computed."""
    if row["module"] is None:
        key = f"<{row['module_type']} from {row['block'] or 'outside the schema'}>"
    else:
        key = row["module"] or root_key
    return f"{key} (backward)" if row.get("phase") == "backward" else key


def _covers(row: dict, path: str, root_skipped: bool) -> bool:
    module = row["module"]
    if module is None or row["kind"] == "helper":
        return False
    if module == "":
        return root_skipped or path == ""
    return path == module or path.startswith(module + ".")


def unreached_rows(root: ModelBlockSchema) -> list:
    """Coverage rows (0 calls) for the skipped blocks no row covers: a skipped block the parse run
    did not call (a branch it did not take, or no run at all), so that every region `skipped`
    lists is in `coverage()` too."""
    rows = [row for row in root.live_calls if row.get("phase", "forward") == "forward"]
    out = []
    for block in root.iter_blocks():
        if block.skip_reason is None or any(_covers(row, block.path, root.skip_reason is not None) for row in rows):
            continue
        if any(row["module"] == block.path and row["callee"].endswith(f".{block.method_name or 'forward'}")
               for row in out):
            continue
        module_type = type(block.module).__qualname__ if block.module is not None else block.name
        out.append({"module": block.path, "module_type": module_type, "kind": "module",
                    "callee": f"{module_type}.{block.method_name or 'forward'}", "via": "", "block": "",
                    "location": "", "calls": 0, "phase": "forward",
                    "reason": f"skipped: {block.skip_reason} (no call of it was seen at parse time)"})
    return out


def python_rng_states() -> tuple:
    """Python's `random` and numpy's global generator states (a forward may draw from them)."""
    numpy_state = None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy_state = numpy.random.get_state()
    return random.getstate(), numpy_state


def set_python_rng_states(states: Optional[tuple]) -> None:
    if states is None:
        return
    python_state, numpy_state = states
    random.setstate(python_state)
    if numpy_state is not None:
        sys.modules["numpy"].random.set_state(numpy_state)
