"""The inspector's Patch view: activation patching's effects as a heatmap, attribution beside them,
and any cell opened as a patched run of the inspector.

`patch_view_state(table, attribution)` reads the DataFrame of `activation_patching` (columns `site`,
`layer`, `position` or `head` when asked, `effect`, `run`) and, when given, the one of
`attribution_patching` on the same sites (`attribution`, matched on site and position / head; a
row missing from it is an error naming it). The grid's rows are the layers when every site has a
layer number and one site per layer, else the sites; its columns are the positions or heads, or
one column ("value") when the sweep patched whole values. Each cell: row, column, the table's row
number, `effect` and `attribution`. The colour scales are symmetric around 0 (`scale`: the largest
magnitude of each). The `PatchedRun` of each row stays in the kernel (`PatchView.runs`).

`open_patched(state, row)` (the browser's `patch_open`: a click or Enter on a cell) makes the
row's patched run the inspector's active run: a clean run on the patched run's inputs is run to the
end first (kept as a run, named "clean"), then the fork (the same inputs with the row's
intervention, named "patch ...") is compared with it (`InspectorState.compare`, the inspector's own
comparison), and the active run is stepped to the first divergence, which the reply names (the
browser then opens the Compare tab on the pair, first divergence selected). Every new run of the
inspector applies the intervention after that (Reset replays it, as queued edits are replayed);
`close_patched` (the browser's "Back to the inspector's inputs") puts the inspector's own inputs
back and drops it.

`patch_module` is the view's browser code (static/patch.js, built apart from widget.js and sent when
the tab first opens, so the initial widget state does not grow).

Depends on the widget's state and runs, and on traces (the comparison, PatchedRun).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..schema.errors import NNSchemaError
from ..traces.patch_sites import PatchedRun

__all__ = ["patch_view_state", "patch_reply", "patch_module", "open_patched", "close_patched", "PatchView",
           "PatchViewError", "MAX_CELLS"]

_MODULE = Path(__file__).resolve().parent / "static" / "patch.js"
#: The most cells the view shows (a larger sweep: pass a slice of the table).
MAX_CELLS = 20_000


class PatchViewError(NNSchemaError):
    """The Patch view cannot show what it was given, or open the cell asked for."""


@dataclass
class PatchView:
    """What the kernel holds for the Patch view: the state the browser reads and each row's PatchedRun."""

    view: dict
    runs: list = field(repr=False, default_factory=list)
    scope: Any = field(repr=False, default=None)  # the inspector's own inputs, put back by close_patched
    opened: Optional[int] = None


def _number(value: Any) -> Optional[float]:
    """`value` as a float, or None where it is none or not finite (JSON has no inf or NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _table_of(table: Any, what: str, column: str) -> Any:
    import pandas as pd

    if hasattr(table, "table") and not isinstance(table, pd.DataFrame):
        table = table.table
    if not isinstance(table, pd.DataFrame):
        raise PatchViewError(f"{what} must be the DataFrame of {what.split()[0]}_patching, got {type(table).__name__}")
    missing = [c for c in ("site", column) if c not in table.columns]
    if missing:
        raise PatchViewError(f"{what} has no column {', '.join(missing)}: pass the DataFrame "
                             f"{'activation_patching' if column == 'effect' else 'attribution_patching'} returned")
    return table


def patch_view_state(table: Any, attribution: Any = None) -> PatchView:
    """The Patch view of an `activation_patching` table, with the `attribution_patching` table of the
    same sweep beside it when given (see the module docstring)."""
    table = _table_of(table, "activation patching table", "effect")
    if "run" not in table.columns:
        raise PatchViewError("the activation patching table has no `run` column (the PatchedRun of each row): pass "
                             "the DataFrame activation_patching returned, not a selection of its columns")
    if len(table) > MAX_CELLS:
        raise PatchViewError(f"the table has {len(table)} rows, more than the view shows ({MAX_CELLS}); pass a "
                             f"slice, e.g. table[table.layer < 8]")
    if not len(table):
        raise PatchViewError("the activation patching table is empty: at= named no site to patch")
    part = "position" if "position" in table.columns else "head" if "head" in table.columns else None
    sites = list(dict.fromkeys(table["site"]))
    layers = table["layer"] if "layer" in table.columns else None
    by_layer = layers is not None and not layers.isna().any()
    if by_layer:
        layer_of = {s: int(v) for s, v in zip(table["site"], layers)}
        by_layer = len(set(layer_of.values())) == len(sites)
    rows = sorted(sites, key=lambda s: layer_of[s]) if by_layer else sites
    row_index = {s: i for i, s in enumerate(rows)}
    columns = sorted({int(v) for v in table[part]}) if part else [0]
    col_index = {c: i for i, c in enumerate(columns)}
    estimate = None
    if attribution is not None:
        attribution = _table_of(attribution, "attribution table", "attribution")
        if part and part not in attribution.columns:
            raise PatchViewError(f"the attribution table has no `{part}` column: run attribution_patching with "
                                 f"per={part!r}, as the activation patching sweep was")
        keys = zip(attribution["site"], attribution[part]) if part else ((s, 0) for s in attribution["site"])
        estimate = {(s, int(p)): _number(a) for (s, p), a in zip(keys, attribution["attribution"])}
    cells = []
    for number, (site, effect) in enumerate(zip(table["site"], table["effect"])):
        column = int(table[part].iloc[number]) if part else 0
        cell = {"row": row_index[site], "col": col_index[column], "index": number, "effect": _number(effect)}
        if estimate is not None:
            if (site, column) not in estimate:
                raise PatchViewError(f"the attribution table has no row for site {site!r}"
                                     f"{f' {part} {column}' if part else ''}: compute both tables with the same at= "
                                     "and per= on the same clean and corrupted inputs")
            cell["attribution"] = estimate[(site, column)]
        cells.append(cell)
    runs = list(table["run"])
    bad = next((r for r in runs if not isinstance(r, PatchedRun)), None)
    if bad is not None:
        raise PatchViewError(f"the `run` column holds a {type(bad).__name__}, not a PatchedRun: pass the DataFrame "
                             "activation_patching returned")

    def scale(key: str) -> float:
        values = [abs(c[key]) for c in cells if c.get(key) is not None]
        return max(values) if values else 0.0

    view = {
        "row_axis": "layer" if by_layer else "site", "col_axis": part or "value",
        "rows": [{"site": s, "layer": layer_of[s] if by_layer else None,
                  "label": f"{layer_of[s]}" if by_layer else s} for s in rows],
        "cols": columns, "cells": cells, "attribution": estimate is not None,
        "scale": {"effect": scale("effect"), "attribution": scale("attribution") if estimate is not None else None},
        "clean_metric": _number(table.attrs.get("clean_metric")),
        "corrupted_metric": _number(table.attrs.get("corrupted_metric")),
    }
    return PatchView(view, runs)


def patch_reply(state: Any) -> dict:
    """The browser's `patch` request: the Patch view the kernel holds (and which cell is open)."""
    held = getattr(state, "patch_view", None)
    if held is None:
        raise PatchViewError("no Patch view in this inspector: call widget.show_patching(table) with the DataFrame "
                             "of activation_patching (and attribution=the one of attribution_patching)")
    return {**held.view, "opened": held.opened}


def _finish(state: Any) -> None:
    while state._advance():
        pass


def open_patched(state: Any, index: int) -> dict:
    """Make row `index`'s patched run the active run, stepped to its first divergence from the clean
    run (see the module docstring); returns the two run names, the cell and the first divergence."""
    held = getattr(state, "patch_view", None)
    if held is None:
        patch_reply(state)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(held.runs):
        raise PatchViewError(f"there is no row {index!r} in the Patch view; it has rows 0..{len(held.runs) - 1}")
    patched: PatchedRun = held.runs[index]
    if patched.schema is not state.schema:
        raise PatchViewError(f"row {index}'s patched run is of another schema ({patched.schema.name}) than this "
                             "inspector's; show the table in the inspector of the schema it was computed on")
    if held.scope is None:
        held.scope = state.scope
    # the clean run: the patched run's inputs, no intervention, to the end
    state.interventions = None
    state.reset(dict(patched.inputs))
    clean = state.active
    clean.name = _fresh(state, "clean", clean)
    _finish(state)
    # the fork, run to the end once to find where it first differs from the clean run
    state.interventions = list(patched.interventions)
    state.reset()
    fork = state.active
    fork.name = _fresh(state, f"patch {patched.site}{_part(held.view, index)}", fork)
    _finish(state)
    result = state.compare(clean.name, fork.name)
    first = result["first"]
    step = first["step_index_b"] if first is not None else None
    if step is not None:
        state.runs.remove(fork)  # the run the user steps is the one stopped at the divergence
        state.reset()
        state.active.name = fork.name
        state.run_to(int(step))
        result = state.compare(clean.name, fork.name)
        first = result["first"]
    held.opened = index
    cell = held.view["cells"][index]
    return {"clean": clean.name, "fork": fork.name, "index": index, "site": patched.site, "effect": cell["effect"],
            "first": first, "step_index": step,
            "note": "" if first is not None else "the patched run equals the clean run at every step"}


def close_patched(state: Any) -> dict:
    """Drop the patched run's intervention and put the inspector's own inputs back (a new run)."""
    held = getattr(state, "patch_view", None)
    state.interventions = None
    scope = held.scope if held is not None and held.scope is not None else None
    state.reset(scope)
    if held is not None:
        held.opened = None
        held.scope = None
    return {"run": state.active.name}


def _part(view: dict, index: int) -> str:
    cell = view["cells"][index]
    axis = view["col_axis"]
    return "" if axis == "value" else f" {axis} {view['cols'][cell['col']]}"


def _fresh(state: Any, stem: str, record: Any) -> str:
    taken = {run.name for run in state.runs if run is not record}
    if stem not in taken:
        return stem
    k = 2
    while f"{stem} ({k})" in taken:
        k += 1
    return f"{stem} ({k})"


def patch_module() -> dict:
    """The browser's `patch_module` request: the Patch view's code (an ES module's source)."""
    if not _MODULE.is_file():
        raise PatchViewError(f"{_MODULE} is missing: rebuild the browser files (python -m nnschemaparser.widget.build)")
    return {"code": _MODULE.read_text(encoding="utf-8")}
