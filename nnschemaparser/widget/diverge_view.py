"""The inspector's Diverge view: a `diverge` report as source lines with a local-error bar each, and
both configurations' runs stepped to the line clicked.

`diverge_widget(report)` (widget/diverge_widget.py: what `DivergeReport.show()` returns) is an `InspectorWidget` of side b's
schema on b's inputs (the configuration under test: the source lines the report names are b's),
holding a second `InspectorState` of side a (the reference) as `state.diverge.state_a`; both are
made without gradients. Each side's steps run under its settings and autocast
(`traces.diverge_runs.side_context`, entered on the run thread, where autocast takes effect).

`diverge_view_state(report)` is what the browser's `diverge` request gets: the report's rows in run
order, cut into stretches of one block (a block path and file; a caller's rows resume after its
callee's), each stretch with its rows (the report's table rows in order: line, the first line of the
source, variable, occurrence, status, local and carried error, bound, flagged), the index of the
first flagged row (`first`), and the range of the error bars' log scale (`log_range`: the decades
of the smallest and largest positive error and bound).

`diverge_step(state, row)` (a click or Enter on a line) steps both runs to the row's statement: each
side's finished base run gives the step at which the row's variable was bound the row's
occurrence-th time in its block at its line (a's block, line and variable from the report's
alignment), and the side's active run is run to it (`InspectorState.run_to`: b's is the inspector's,
so its tree, source and step card follow). The reply: the row, and for each side the step, the
value's dtype, shape and statistics (`traces.tables.tensor_statistics`), or a note when the side
has no such statement (an inserted, deleted or untaken row).

A compiled model b (`torch.compile`) has no values to step to inside its graphs: its run here is its
own code without the compiler (widget/diverge_widget.py, `compiled_side_schema`), and b's reply adds
the row's compiled region and errors (`compiled`) from the report. Each view row then carries its
`region` (the report's) and `region_text` (the words the browser shows), and b's side words name
the backend (`compile_regions.compiled_backend`).

`diverge_module` is the view's browser code (static/diverge.js, sent when its tab first opens).

Depends on the widget's state, and on traces (the report, statistics, side settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..schema.errors import NNSchemaError
from ..traces.compile_regions import compiled_backend
from ..traces.diverge import DivergeReport
from ..traces.diverge_runs import side_context
from ..traces.tables import tensor_statistics
from .patch_view import _number
from .state import InspectorOptions, InspectorState

__all__ = ["diverge_view_state", "diverge_reply", "diverge_step", "diverge_module",
           "DivergeSession", "DivergeViewError"]

_MODULE = Path(__file__).resolve().parent / "static" / "diverge.js"


class DivergeViewError(NNSchemaError):
    """The Diverge view cannot show the report, or step to the row asked for."""


@dataclass
class DivergeSession:
    """The report, side a's state machine, and the view's state (what the kernel holds)."""

    report: DivergeReport = field(repr=False)
    state_a: InspectorState = field(repr=False)
    view: dict
    selected: Optional[int] = None


def diverge_view_state(report: DivergeReport) -> dict:
    """The Diverge view of `report` (see the module docstring)."""
    if not isinstance(report, DivergeReport):
        raise DivergeViewError(f"the Diverge view shows a DivergeReport (nnschemaparser.diverge(...)), got "
                               f"{type(report).__name__}")
    table = report.table
    blocks: list[dict] = []
    positive = []
    for index, row in enumerate(table.to_dict("records")):
        path = row["block_path"] or ""
        if not blocks or blocks[-1]["block"] != path or blocks[-1]["file"] != row["file"]:
            blocks.append({"block": path, "file": row["file"], "rows": []})  # a new stretch of one block, in run order
        block = blocks[-1]
        source = str(row["source"] or "")
        local, carried, bound = _number(row["local_error"]), _number(row["carried_error"]), _number(row["bound"])
        positive += [v for v in (local, bound) if v is not None and v > 0]
        block["rows"].append({"index": index, "line": _int(row["line"]), "line_a": _int(row.get("line_a")),
                              "file": row["file"], "text": source.splitlines()[0].strip() if source else "",
                              "source": source, "source_a": row["source_a"] if isinstance(row.get("source_a"), str) else None,
                              "var": row["out_var"], "occurrence": _int(row["occurrence"]), "status": row["status"],
                              "local": local, "carried": carried, "bound": bound, "flagged": bool(row["flagged"]),
                              "region": row["region"] if isinstance(row.get("region"), str) else None,
                              "region_text": region_words(row.get("region"))})
    flagged = [i for i, f in enumerate(table["flagged"]) if bool(f)] if len(table) else []
    low = math.floor(math.log10(min(positive))) if positive else -8
    high = math.ceil(math.log10(max(positive))) if positive else 0
    return {"blocks": blocks, "rows": len(table), "first": flagged[0] if flagged else None,
            "flagged": len(flagged), "log_range": [low, max(high, low + 1)], "summary": report.summary(),
            "bound_factor": report.bound_factor, "compiled": bool(report.side_b.get("compiled")),
            "sides": {"a": _side_words(report.side_a, report.model_a), "b": _side_words(report.side_b, report.model_b)}}


def _int(value: Any) -> Optional[int]:
    number = _number(value)
    return None if number is None else int(number)


def _backend_name(model: Any) -> str:
    try:
        return compiled_backend(model)[2]
    except TypeError:  # not a wrapper dynamo made: the report still shows, without the name
        return "(unknown)"


def region_words(region: Any) -> Optional[str]:
    """A compiled row's region as the view says it ("statement": the statement compiled alone)."""
    if not isinstance(region, str) or not region:
        return None
    return "this statement alone" if region == "statement" else region


def _side_words(side: dict, model: Any) -> str:
    compiled = bool(side.get("compiled"))
    side_model = model
    model = getattr(model, "_orig_mod", model) if compiled else model
    parts = [type(model).__name__]
    if side.get("dtype") is not None:
        parts.append(str(side["dtype"]).replace("torch.", ""))
    if side.get("device") is not None:
        parts.append(str(side["device"]))
    if side.get("autocast") is not None:
        parts.append(f"autocast {str(side['autocast']).replace('torch.', '')}")
    if compiled:
        parts.append(f"torch.compile, backend {_backend_name(side_model)} (stepped: its code without the compiler)")
    if side.get("settings"):
        parts.append(f"settings {side['settings']!r}" if isinstance(side["settings"], dict) else "settings")
    module = type(model).__module__
    return f"{' · '.join(parts)} ({module})"


def diverge_reply(state: Any) -> dict:
    """The browser's `diverge` request: the view the kernel holds (and the row selected)."""
    session = _session(state)
    return {**session.view, "selected": session.selected}


def _session(state: Any) -> DivergeSession:
    session = getattr(state, "diverge", None)
    if session is None:
        raise DivergeViewError("no Diverge view in this inspector: open it with report.show() on the report "
                               "nnschemaparser.diverge returned")
    return session


def _in_side(state: InspectorState, side: dict, fn: Any) -> Any:
    """`fn()` on the state's run thread under the side's settings and autocast."""
    def job() -> Any:
        with side_context(side.get("settings"), side.get("autocast"), side.get("device") or torch.device("cpu")):
            return fn()

    return state.run_thread.call(job)


def _find_step(state: InspectorState, side: dict, block: str, line: int, var: str, occurrence: int) -> Optional[int]:
    base = _in_side(state, side, state.ensure_base)
    seen = -1
    for row in base.steps:
        if row["block"] == block and row["line"] == line and row["var"] == var:
            seen += 1
            if seen == occurrence:
                return int(row["step"])
    return None


def _side_value(state: InspectorState, side: dict, where: Optional[tuple], name: str) -> dict:
    if where is None:
        return {"side": name, "step": None, "note": f"side {name} has no such statement (see the row's status)"}
    block, line, var, occurrence = where
    if not block:  # a compiled report names the root "" (traces/compile_regions.block_label); a run, by its name
        block = state.schema.path or state.schema.name
    step = _find_step(state, side, block, line, var, occurrence)
    if step is None:
        return {"side": name, "step": None, "block": block, "line": line, "var": var,
                "note": f"side {name}'s run binds {var} at line {line} of {block or '(root)'} fewer than "
                        f"{occurrence + 1} times"}
    _in_side(state, side, lambda: state.run_to(step))
    value = state.current.value if state.current is not None else None
    out = {"side": name, "step": step, "block": block, "line": line, "var": var, "run": state.active.name}
    if isinstance(value, torch.Tensor):
        stats = {k: _number(v) if isinstance(v, float) else v for k, v in tensor_statistics(value).items()}
        out.update(dtype=str(value.dtype).replace("torch.", ""), shape=list(value.shape), stats=stats)
    else:
        out["note"] = f"the step's value is a {type(value).__name__}, not a tensor"
    return out


def diverge_step(state: Any, index: int) -> dict:
    """Step both runs to row `index`'s statement (see the module docstring)."""
    session = _session(state)
    report = session.report
    table = report.table
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(table):
        raise DivergeViewError(f"there is no row {index!r} in the report; it has rows 0..{len(table) - 1}")
    row = table.iloc[index]
    path, file, line, var, occurrence = (row["block_path"], row["file"], int(row["line"]), row["out_var"],
                                         int(row["occurrence"]))
    status = row["status"]
    where_a = where_b = None
    if status in ("matched", "edited", "untaken"):
        where_b = (path, line, var, occurrence)
        paired = report.alignment.b_to_a.get((path, file, line)) if report.alignment is not None else None
        if paired is not None:
            name_a = report.alignment.var_b_to_a.get((path, file, line), {}).get(var, var)
            where_a = (path, paired[1], name_a, occurrence)
        elif report.alignment is None or report.schema_b is report.schema_a:
            where_a = where_b
    elif status == "inserted":
        where_b = (path, line, var, occurrence)
    elif status == "deleted":
        where_a = (path, line, var, occurrence)
    session.selected = index
    view_row = next(r for b in session.view["blocks"] for r in b["rows"] if r["index"] == index)
    side_b = _side_value(state, report.side_b, where_b, "b")
    if report.side_b.get("compiled"):  # b's run is its code without the compiler; the row says what compiling adds
        region = row.get("region")
        side_b["compiled"] = {"region": region if isinstance(region, str) else None,
                              "local_error": _number(row["local_error"]), "carried_error": _number(row["carried_error"])}
        side_b["note"] = (f"b is compiled (backend {_backend_name(report.model_b)}): its run here is its own code "
                          f"without the compiler (the same values as a's). Compiled as "
                          f"{region_words(region) or 'part of a larger region'}, this statement's value is "
                          f"{_words(row['local_error'])} from eager on the same inputs")
    return {"row": view_row, "a": _side_value(session.state_a, report.side_a, where_a, "a"), "b": side_b}


def _words(error: Any) -> str:
    number = _number(error)
    return "not measured" if number is None else f"off by {number:.3g} (max |compiled - eager|)"


def diverge_module() -> dict:
    """The browser's `diverge_module` request: the Diverge view's code (an ES module's source)."""
    if not _MODULE.is_file():
        raise DivergeViewError(f"{_MODULE} is missing: rebuild the browser files (python -m nnschemaparser.widget.build)")
    return {"code": _MODULE.read_text(encoding="utf-8")}
