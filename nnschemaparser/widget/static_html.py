"""The inspector without a kernel: one self-contained HTML page with every run, as the notebook showed it.

The page embeds the same browser code as the widget (static/static.js: widget.js with the views of
views.js built in, and widget.css) and a JSON
payload: every tree row, the source of every block, and for *every* run its trace rows, the
histogram bins of its steps (all of them up to MAX_HISTOGRAM_STEPS per run), its trends and, for
the steps the user looked at in the tensor view (`state.viewed`) plus a bounded sample of others,
heatmaps and attention heads, and the tree colours (each stat; divergence of each compared pair); the comparison of the base run with each other run (and the last pair
compared) is stored whole, with the per-step differences (`b - a` heatmaps) of the steps looked at
and the first divergence. A stand-in model in the page answers the widget's requests from that
payload, so Trace, Compare, the tensor view and Trends work with no kernel; stepping and edits are
disabled and say that they need one.

Size budget (`bench/bench_widget.py` and tests/widget/test_static_html.py measure it): heatmaps of the
steps looked at keep the widget's cap (128 cells per side); the sample keeps at most
MAX_SAMPLED_TENSORS steps per run at SAMPLED_SIDE cells per side, so a run adds at most
MAX_SAMPLED_TENSORS * SAMPLED_SIDE**2 numbers (about 1 MB of JSON) beyond its trace rows and bins.

The page's one executable script is the inline module script (the bundle and a two-line boot);
the payload sits in a `type="application/json"` element, escaped so that it cannot end it.
`content_security_policy(page)` gives the policy a server sends with a page (share_server.py):
scripts only by that script's SHA-256, styles inline, nothing fetched.

Depends on the widget's state, runs, messages and tensor_views modules; never on anywidget.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from pathlib import Path
from typing import Optional

from ..schema.errors import NNSchemaError
from .messages import COMPARE_COLUMNS, json_safe
from .runs import TRACE_COLUMNS, RunRecord
from .state import InspectorState
from .tensor_views import STATS, TensorViewError, layer_series

__all__ = ["static_payload", "static_page", "write_static_html", "content_security_policy", "MAX_HISTOGRAM_STEPS",
           "MAX_SAMPLED_TENSORS", "SAMPLED_SIDE"]

MAX_HISTOGRAM_STEPS = 400
MAX_SAMPLED_TENSORS = 12
SAMPLED_SIDE = 48
SEP = "\u0000"  # joins run name, trace step and the other run into a payload key
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


def _key(*parts: object) -> str:
    return SEP.join(str(p) for p in parts)


def _sample(n: int, k: int) -> list[int]:
    """k trace step numbers spread evenly over 1..n (all of them when n <= k)."""
    if n <= k:
        return list(range(1, n + 1))
    return sorted({1 + round(i * (n - 1) / (k - 1)) for i in range(k)})


def _pairs(state: InspectorState, runs: list[RunRecord]) -> list[tuple[str, str]]:
    base = next((r for r in runs if r.finished and not r.edits), None)
    pairs = [(base.name, r.name) for r in runs if base is not None and r is not base and r.finished]
    last = state.last_compare
    if last and (last["a"], last["b"]) not in pairs and {last["a"], last["b"]} <= {r.name for r in runs}:
        pairs.append((last["a"], last["b"]))
    return pairs


def _tensors(state: InspectorState, runs: list[RunRecord], pairs: list[tuple[str, str]]) -> tuple[dict, dict]:
    viewed: dict[str, set[int]] = {}
    for name, step in state.viewed:
        viewed.setdefault(name, set()).add(step)
    tensors: dict[str, dict] = {}
    attention: dict[str, dict] = {}

    def add(run: RunRecord, step: int, side: int, against: str = "") -> None:
        key = _key(run.name, step, against)
        if key in tensors:
            return
        try:
            view = state.tensor_view(run=run.name, trace_step=step, against=against or None, max_side=side)
        except NNSchemaError:  # no value kept, not a tensor, another path: the page says so when asked
            return
        tensors[key] = view
        if view.get("attention") and not against:
            attention[_key(run.name, step)] = state.attention_view(run=run.name, trace_step=step)

    kept_viewed = list(state.viewed)
    try:
        for run in runs:
            for step in sorted(viewed.get(run.name, ())):
                add(run, step, 128)
            for step in _sample(len(run.trace.steps), MAX_SAMPLED_TENSORS):
                add(run, step, SAMPLED_SIDE)
        by_name = {r.name: r for r in runs}
        for a, b in pairs:
            result = state.compare(a, b)
            steps = set(viewed.get(b, ())) | ({result["first"]["step_b"]} if result["first"] and
                                              result["first"]["step_b"] is not None else set())
            for step in sorted(steps):
                add(by_name[b], step, 128, against=a)
    finally:
        state.viewed[:] = kept_viewed  # writing the page is not looking at a step
    return tensors, attention


def _layers(runs: list[RunRecord]) -> dict:
    out = {}
    for stat in STATS:
        series = []
        for run in runs:
            try:
                series.append({"run": run.name, **layer_series(run.trace.steps, "hidden_states", stat)})
            except TensorViewError:
                continue
        if series:
            out[_key("hidden_states", stat)] = {"var": "hidden_states", "stat": stat, "series": series}
    return out


def static_payload(state: InspectorState, title: str = "", max_histogram_steps: int = MAX_HISTOGRAM_STEPS) -> dict:
    """The data the static page renders: traits, tree rows, sources, and every run's traces, bins,
    comparisons, heatmaps and trends (see the module docstring for what is kept)."""
    tree = state.tree
    run = _last_run(state)
    runs = [r for r in state.runs if r.trace.steps or r is run]
    sources = {}
    for node in tree.blocks:
        source = tree.source(node)
        if source.get("text") or source.get("note"):
            sources[str(node)] = source

    def hists_of(record: RunRecord) -> dict:
        return {str(step.step): state.histograms(run=record.name, trace_step=step.step)
                for step in record.trace.steps[:max_histogram_steps]}

    pairs = _pairs(state, runs)
    compares = {}
    for a, b in pairs:
        result = state.compare(a, b)
        compares[_key(a, b)] = {k: result[k] for k in ("a", "b", "summary", "first", "first_index", "pairs", "rows")}
    tensors, attention = _tensors(state, runs, pairs)
    traits = {
        "title": title or state.schema.name,
        "tree": {"rows": tree.rows(range(len(tree))), "total": len(tree), "root": 0},
        "step_info": _step_view(state, run),
        "step_index": len(run.steps),
        "status": "static",
        "error": "",
        "runs": [r.summary() for r in runs],
        "edit_list": [spec.to_dict() for spec in run.edits],
        "blocks": state.view_blocks(),
        "compare_pairs": [list(p) for p in pairs],
    }
    trace = {"run": run.name, "columns": TRACE_COLUMNS, "rows": run.trace_rows()}
    traces = {r.name: {"run": r.name, "columns": TRACE_COLUMNS, "rows": r.trace_rows()} for r in runs}
    run_hists = {r.name: (hists_of(r) if r is not run else None) for r in runs}
    hists = hists_of(run)
    run_hists[run.name] = hists
    trends = {_key(r.name, stat): state.trends(r.name, stat) for r in runs for stat in STATS}
    colours = {_key(r.name, stat, ""): state.tree_colours(r.name, stat) for r in runs for stat in STATS}
    colours.update({_key(b, "", a): state.tree_colours(b, against=a) for a, b in pairs})
    return json_safe({"traits": traits, "sources": sources, "trace": trace, "hists": hists, "traces": traces,
                      "run_hists": run_hists, "compares": compares, "compare_columns": COMPARE_COLUMNS,
                      "tensors": tensors, "attention": attention, "trends": trends, "layers": _layers(runs),
                      "tree_colours": colours,
                      "sep": SEP})


def _script_safe(text: str) -> str:
    """JSON text made safe inside a <script> element: every `<`, `>` and `&` written as its JSON
    escape, so no text (`</script>`, `<!--`, `<script`) can end or change the element, and the
    payload stays valid JSON that JSON.parse reads back unchanged (a `<` occurs only inside strings)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_MODULE_SCRIPT = '<script type="module">'
_BOOT = ('const __data = JSON.parse(document.getElementById("nnsp-data").textContent);\n'
         '__nnsp["index"].default.render({ model: __nnsp["index"].createStaticModel(__data), '
         'el: document.getElementById("nnsp-static") });\n')


def static_page(state: InspectorState, title: str = "", preface: str = "") -> str:
    """The HTML text of the static page; `preface` (plain text, e.g. a plan card) is shown above the
    inspector, escaped."""
    bundle = (_STATIC / "static.js").read_text()  # the widget with the lazily loaded views built in
    css = (_STATIC / "widget.css").read_text()
    if "</script" in bundle.lower():
        raise ValueError("static/static.js contains '</script', which cannot be inlined; rebuild it")
    data = _script_safe(json.dumps(static_payload(state, title), separators=(",", ":"), default=str))
    name = html.escape(title or state.schema.name)
    top = (f"<pre class=\"nnsp-preface\" aria-label=\"Plan card\">{html.escape(preface)}</pre>\n"
           if preface else "")
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"color-scheme\" content=\"light dark\">\n"
        f"<title>{name} · nnschemaparser</title>\n<style>\n{css}\n"
        "body { margin: 16px; background: #fafafa; }\n"
        ".nnsp-preface { font: 12px/1.35 ui-monospace, monospace; overflow-x: auto; margin: 0 0 12px; }\n"
        "@media (prefers-color-scheme: dark) { body { background: #121212; } .nnsp-preface { color: #ddd; } }\n"
        "</style>\n</head>\n<body>\n"
        f"{top}<div id=\"nnsp-static\"></div>\n"
        f"<script type=\"application/json\" id=\"nnsp-data\">{data}</script>\n"
        f"{_MODULE_SCRIPT}\n{bundle}\n{_BOOT}</script>\n</body>\n</html>\n"
    )


def content_security_policy(page: str) -> str:
    """The Content-Security-Policy to serve `page` (a static_page text) with: its module script by
    hash, inline styles, and nothing else (no fetch, no other script, no frame, no form, no base)."""
    start = page.rfind(_MODULE_SCRIPT)
    end = page.rfind("</script>")
    if start < 0 or end < start:
        raise ValueError("not a static inspector page: it has no module script")
    script = page[start + len(_MODULE_SCRIPT):end]
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def write_static_html(state: InspectorState, path: str | Path, title: Optional[str] = None) -> Path:
    """Write the static page of `state` to `path`; returns the path."""
    path = Path(path)
    path.write_text(static_page(state, title or ""), encoding="utf-8")
    return path
