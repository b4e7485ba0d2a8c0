"""What a share holds and the page `nnschemaparser serve` answers for it at `/p/<id>`.

A share upload is the `.neurarch.json` graph and, from the `nnschemaparser` command, the model's
schema file document (`share_document`: `files.schema_file.schema_to_json`, with the file paths of
its file table made relative: the schema carries the lowered forward, its variable names and source
text, resolved shapes and dtypes; never weights). The server treats the document as hostile data:
`check_shared_schema` decodes it with the schema file loader and no model (bounded by
`share_limits`, every record typed and checked, nothing imported, evaluated or called), and
`inspector_page` renders what was decoded with the inspector's static page (static_html.py, the
built bundle in static/) with the plan card above it; the schema is never bound to a model or run.
A graph-only share (an older client, a graph written by another tool, `--share-graph-only`) gets
`graph_page`: the card, the layers by scope and the node table, with no script.

Every text from an upload is escaped (html.escape, and the static page's script-safe JSON payload).

Depends on files.schema_file (the encoder and the model-less decoder), files.file_format (limits,
errors), schema, and the widget's state and static_html.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any, Optional

from ..files.file_format import FileLimits
from ..files.schema_file import schema_from_json, schema_to_json
from ..schema.model import ModelBlockSchema
from .state import InspectorState
from .static_html import static_page

__all__ = ["share_document", "share_limits", "check_shared_schema", "inspector_page", "graph_page"]


def _shared_path(path: str, module: str, root: Path) -> str:
    """A file of the table as a share names it: relative to `root` when inside it, else by its module."""
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except (ValueError, OSError):
        pass
    if module:
        return module.replace(".", "/") + ".py"
    return Path(path).name


def share_document(schema: ModelBlockSchema, root: Optional[str | os.PathLike] = None) -> dict:
    """The schema file document `--share` uploads: `schema_to_json(schema)` with each file of its
    table named relative to `root` (default: the current directory), or by its module when outside."""
    document = schema_to_json(schema)
    base = Path(root if root is not None else os.getcwd()).resolve()
    for entry in document.get("files", []):
        entry["path"] = _shared_path(entry["path"], entry.get("module") or "", base)
    return document


def share_limits(max_body: int) -> FileLimits:
    """The loader's bounds for a schema inside a request body of at most `max_body` bytes."""
    defaults = FileLimits()
    return FileLimits(max_file_bytes=max_body, max_string_chars=min(defaults.max_string_chars, max_body),
                      max_decoded_bytes=min(defaults.max_decoded_bytes, 32 * max_body + (1 << 20)))


def check_shared_schema(document: Any, limits: FileLimits, where: str = "schema") -> ModelBlockSchema:
    """Decode an uploaded schema document without a model (SchemaFormatError when it is not a valid one)."""
    return schema_from_json(document, None, limits=limits, source=where)


def inspector_page(schema: ModelBlockSchema, title: str, card: str) -> str:
    """The inspector's static page of a decoded, model-less schema: its block tree, shapes and
    sources (no run: it has no weights), with `card` above it."""
    state = InspectorState(schema, {})
    note = ("A shared schema: the block tree, the shapes and dtypes its owner's run resolved and the "
            "forward sources.\nIt has no weights and no values, so nothing here runs; select a block to read "
            "its source.\n")
    try:
        return static_page(state, title=title, preface=card.rstrip("\n") + "\n\n" + note)
    finally:
        state.close()


def graph_page(graph: dict[str, Any], card: str, token: str) -> str:
    """The page of a graph-only share: the card, the layers grouped by scope, the node table; no script."""
    esc = html.escape
    nodes = graph.get("nodes", [])
    by_scope: dict[str, list[dict]] = {}
    for node in nodes:
        by_scope.setdefault(str(node.get("scope", "")), []).append(node)
    tree = []
    for scope in sorted(by_scope):
        items = "".join(f"<li><code>{esc(str(n.get('id')))}</code> <b>{esc(str(n.get('type')))}</b> "
                        f"{esc(json.dumps(n.get('outputShape')))}</li>" for n in by_scope[scope])
        tree.append(f"<details open><summary>{esc(scope or '(root)')} <small>{len(by_scope[scope])} nodes"
                    f"</small></summary><ul>{items}</ul></details>")
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in (
            n.get("id"), n.get("type"), n.get("scope"), json.dumps(n.get("inputShape")),
            json.dumps(n.get("outputShape")), n.get("paramCount"), json.dumps(n.get("params"))[:300])) + "</tr>"
        for n in nodes)
    title = esc(str(graph.get("name") or "graph"))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title} · nnschemaparser</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}pre{background:#f6f6f6;"
            "padding:1em}table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ddd;padding:2px 6px;"
            "text-align:left}code{font-size:95%}</style></head><body>"
            f"<h1>{title}</h1><pre>{esc(card)}</pre>"
            "<p>Shared as a graph only (no schema), so this page lists its layers; a share made with "
            "<code>nnschemaparser ... --share</code> opens in the inspector.</p>"
            f"<h2>Layers by scope</h2>{''.join(tree)}"
            f"<h2>Nodes</h2><table><tr><th>id</th><th>type</th><th>scope</th><th>input</th><th>output</th>"
            f"<th>params</th><th>hyperparameters</th></tr>{rows}</table>"
            f"<p><a href='../api/v1/graphs/{esc(token)}'>the graph as JSON</a></p></body></html>")
