"""The inspector without a kernel: one self-contained HTML page with the tree and the last run's trace.

The page embeds the same browser code as the widget (static/widget.js and widget.css) and a JSON
payload: every tree row, the source of every block, the last run's trace rows and the histogram
bins of its first steps. A stand-in model in the page answers the widget's requests from that
payload; stepping, edits and comparisons are disabled and say that they need a kernel.

Depends on the widget's state, runs and messages modules; never on anywidget.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Optional

from .messages import json_safe
from .runs import TRACE_COLUMNS, RunRecord
from .state import InspectorState

__all__ = ["static_payload", "static_page", "write_static_html", "MAX_HISTOGRAM_STEPS"]

MAX_HISTOGRAM_STEPS = 400
_STATIC = Path(__file__).parent / "static"


def _last_run(state: InspectorState) -> RunRecord:
    finished = [run for run in state.runs if run.finished]
    return finished[-1] if finished else state.active


def _step_view(state: InspectorState, run: RunRecord) -> dict:
    if not run.steps:
        return {"index": 0, "run": run.name}
    row = run.steps[-1]
    node = row["node"]
    view = {"index": row["step"], "run": run.name, "kind": row["kind"], "var": row["var"], "block": row["block"],
            "depth": row["depth"], "node": node, "ancestors": state.tree.ancestors(node) if node >= 0 else [],
            "source_block": state.tree.block_of(node) if node >= 0 else -1, "line": row["line"],
            "text": row["text"], "type": row["shape"] or "value", "edited": row["edited"],
            "trace_step": row["trace_step"] or (run.trace.steps[-1].step if run.trace.steps else None)}
    rows = run.trace_rows()
    if rows and view["trace_step"] == rows[-1]["step"]:
        view["stats"] = {k: rows[-1][k] for k in ("mean", "std", "min", "max", "numel")}
    return view


def static_payload(state: InspectorState, title: str = "", max_histogram_steps: int = MAX_HISTOGRAM_STEPS) -> dict:
    """The data the static page renders: traits, every tree row, sources, the last trace, histograms."""
    tree = state.tree
    run = _last_run(state)
    sources = {}
    for node in tree.blocks:
        source = tree.source(node)
        if source.get("text") or source.get("note"):
            sources[str(node)] = source
    hists = {str(step.step): state.histograms(run=run.name, trace_step=step.step)
             for step in run.trace.steps[:max_histogram_steps]}
    traits = {
        "title": title or state.schema.name,
        "tree": {"rows": tree.rows(range(len(tree))), "total": len(tree), "root": 0},
        "step_info": _step_view(state, run),
        "step_index": len(run.steps),
        "status": "static",
        "error": "",
        "runs": [run.summary()],
        "edit_list": [spec.to_dict() for spec in run.edits],
        "blocks": state.view_blocks(),
    }
    trace = {"run": run.name, "columns": TRACE_COLUMNS, "rows": run.trace_rows()}
    return json_safe({"traits": traits, "sources": sources, "trace": trace, "hists": hists})


def _script_safe(text: str) -> str:
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def static_page(state: InspectorState, title: str = "") -> str:
    """The HTML text of the static page."""
    bundle = (_STATIC / "widget.js").read_text()
    css = (_STATIC / "widget.css").read_text()
    if "</script" in bundle.lower():
        raise ValueError("static/widget.js contains '</script', which cannot be inlined; rebuild it")
    data = _script_safe(json.dumps(static_payload(state, title), separators=(",", ":"), default=str))
    name = html.escape(title or state.schema.name)
    boot = ('const __data = JSON.parse(document.getElementById("nnsp-data").textContent);\n'
            '__nnsp["index"].default.render({ model: __nnsp["index"].createStaticModel(__data), '
            'el: document.getElementById("nnsp-static") });\n')
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"color-scheme\" content=\"light dark\">\n"
        f"<title>{name} · nnschemaparser</title>\n<style>\n{css}\n"
        "body { margin: 16px; background: #fafafa; }\n"
        "@media (prefers-color-scheme: dark) { body { background: #121212; } }\n</style>\n</head>\n<body>\n"
        "<div id=\"nnsp-static\"></div>\n"
        f"<script type=\"application/json\" id=\"nnsp-data\">{data}</script>\n"
        f"<script type=\"module\">\n{bundle}\n{boot}</script>\n</body>\n</html>\n"
    )


def write_static_html(state: InspectorState, path: str | Path, title: Optional[str] = None) -> Path:
    """Write the static page of `state` to `path`; returns the path."""
    path = Path(path)
    path.write_text(static_page(state, title or ""), encoding="utf-8")
    return path
