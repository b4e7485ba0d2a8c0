"""The inspector's request/reply protocol: one handler per message type, answering from the state.

The browser sends `{"type": ..., "id": n, ...}`; `handle_message` calls `on_<type>` and returns
`{"type": "reply", "id": n, "ok": true, "data": ...}` or `{"ok": false, "error": "..."}`. Commands
(step, step_into, step_over, step_out, continue, run_to, reset, edit, ...) change the state and the widget then syncs
its small traits; queries (children, source, table, compare, hist) return data that is never kept in
a trait: the tree's subtrees, a page of a run's trace, a page of a comparison, histogram bins.
Replies are JSON-safe: non-finite floats travel as the strings "nan", "inf", "-inf".

Depends on the widget's state; knows nothing about traitlets or the browser.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from ..schema.errors import NNSchemaError
from .block_actions import run_to_output
from .logical_view import logical_module, logical_reply
from .patch_view import close_patched, open_patched, patch_reply
from .diverge_view import diverge_reply, diverge_step
from .routing_view import routing_view
from .runs import TRACE_COLUMNS
from .state import InspectorError, InspectorState
from .tensor_views import MAX_SIDE

__all__ = ["handle_message", "json_safe", "table_page", "MAX_PAGE_SIZE"]

MAX_PAGE_SIZE = 500
_STATIC = Path(__file__).resolve().parent / "static"
# the bundles the browser may ask for by name: the views bundle, and the tabs of the `views` trait (lazytab.js)
_MODULES = {"views": "views.js", "Logical": "logical.js", "Patch": "patch.js", "Diverge": "diverge.js"}
# The comparison table: the traces' diff columns plus the StepInfo index of each side.
COMPARE_COLUMNS = ["container_id", "status", "changed", "max_abs_diff", "mean_abs_diff", "step_a", "step_b",
                   "step_index_a", "step_index_b", "description", "out_var", "op_name", "block_path",
                   "shape_a", "shape_b"]


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as strings and tuples as lists, ready for JSON."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


#: The largest magnitude a number of a message may have (a step, a page, a node id, a dim).
MAX_MESSAGE_INT = 2 ** 53
#: The longest text field of a message (a search query, a file name, a block path); edit
#: expressions have their own bound (edits.MAX_EXPRESSION_CHARS).
MAX_MESSAGE_TEXT = 10_000


def _whole(value: Any, key: str) -> int:
    """`value` as a whole number, or InspectorError naming `key` (no bool, no NaN or Infinity, no
    fraction, nothing past MAX_MESSAGE_INT)."""
    if isinstance(value, bool):
        raise InspectorError(f"{key} must be a whole number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise InspectorError(f"{key} must be a whole number, got {value!r}")
        value = int(value)
    elif isinstance(value, str) and len(value) <= 20:
        try:
            value = int(value.strip())
        except ValueError:
            raise InspectorError(f"{key} must be a whole number, got {value!r}") from None
    elif not isinstance(value, int):
        raise InspectorError(f"{key} must be a whole number, got {_brief(value)}")
    if abs(value) > MAX_MESSAGE_INT:
        raise InspectorError(f"{key} must be at most {MAX_MESSAGE_INT} in size, got {_brief(value)[:40]}")
    return value


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}... (a {type(value).__name__})"


def _int(message: dict, key: str, default: int) -> int:
    value = message.get(key, default)
    return default if value is None else _whole(value, key)


def _text(message: dict, key: str) -> str:
    """A text field ('' when absent), at most MAX_MESSAGE_TEXT characters."""
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise InspectorError(f"{key} must be text, got {_brief(value)}")
    value = str(value)
    if len(value) > MAX_MESSAGE_TEXT:
        raise InspectorError(f"{key} is {len(value)} characters, more than {MAX_MESSAGE_TEXT}")
    return value


def _since(message: dict) -> Any:
    return None if message.get("since") is None else _whole(message["since"], "since")


def _sort_key(column: str) -> Callable[[dict], tuple]:
    def key(row: dict) -> tuple:
        value = row.get(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return (1, 0)
        if isinstance(value, (int, float)):
            return (0, value)
        return (0, str(value))

    return key


def table_page(rows: list[dict], columns: list[str], page: int = 0, size: int = 50, sort: str = "",
               desc: bool = False, filters: dict | None = None) -> dict:
    """One page of `rows` after filtering (case-insensitive substring per column) and sorting."""
    size = max(1, min(int(size), MAX_PAGE_SIZE))
    selected = rows
    for column, needle in (filters or {}).items():
        if not needle:
            continue
        if column not in columns:
            raise InspectorError(f"cannot filter by {column!r}; the columns are {', '.join(columns)}")
        needle = str(needle).lower()
        selected = [r for r in selected if needle in str(r.get(column, "")).lower()]
    if sort:
        if sort not in columns:
            raise InspectorError(f"cannot sort by {sort!r}; the columns are {', '.join(columns)}")
        selected = sorted(selected, key=_sort_key(sort), reverse=bool(desc))
    total = len(selected)
    pages = max(1, math.ceil(total / size))
    page = max(0, min(int(page), pages - 1))
    chunk = selected[page * size:(page + 1) * size]
    return {"columns": columns, "rows": [[r.get(c) for c in columns] for r in chunk], "total": total,
            "page": page, "pages": pages, "size": size}


def _after_command(state: InspectorState, message: dict) -> Any:
    """With `with_hist`, a stepping command's reply carries the new step's histograms, and with
    `with_debug` the breakpoint view (the stop reason, the run's hits), the call stack and the inline
    values of the step's source, so the browser updates its whole view after one round trip, not four."""
    if state.moved_hook is not None:
        state.moved_hook()
    out: dict = {}
    if message.get("with_debug"):
        out.update(breakpoints=state.view_breakpoints(), call_stack=state.call_stack())
        position = state.position
        node = state.tree.node_of_instruction(position.instruction) if position is not None else -1
        if node >= 0:  # the inline values of the step's source, as the `inline` request gives them
            out["inline"] = state.inline_values(state.tree.block_of(node))
    if message.get("with_hist") and state.position is not None:
        out["hist"] = state.histograms()
    keep = message.get("with_tensor")
    if isinstance(keep, dict) and state.position is not None:
        tensor = _step_tensor(state, keep)
        if tensor is not None:
            out["tensor"] = tensor
    return out or None


def _step_tensor(state: InspectorState, keep: dict) -> dict | None:
    """The new step's heatmap for the reply of a stepping command (one round trip less per step),
    with the dims and indices the view keeps when they fit the new value; `{"error": ...}` when it
    cannot be shown, None when the step binds no tensor (the view keeps what it shows)."""
    trace_step = state.view_step().get("trace_step")
    if not trace_step:
        return None
    query = {"type": "tensor", "trace_step": trace_step, "against": keep.get("against") or None}
    try:
        if keep.get("dims") is not None:
            try:
                return {"query": {"trace_step": trace_step},
                        "view": _Handlers.on_tensor(state, {**query, "dims": keep.get("dims"), "index": keep.get("index")})}
            except NNSchemaError:
                pass  # the kept dims do not fit this value: its defaults
        return {"query": {"trace_step": trace_step}, "view": _Handlers.on_tensor(state, query)}
    except NNSchemaError as exc:
        return {"query": {"trace_step": trace_step}, "error": str(exc)}


def _var_words(state: InspectorState, page: dict, runs: dict) -> None:
    """A table page's `out_var` cells in source words: a temporary `$tN` becomes the text of the
    statement that computed it (found through the row's StepInfo index in the run it names)."""
    columns = page["columns"]
    at = columns.index("out_var")
    op = columns.index("op_name")
    for row in page["rows"]:  # an intrinsic's op by its own name: `unpack`, not `intrinsics.unpack`
        if isinstance(row[op], str) and "intrinsics." in row[op]:
            row[op] = row[op].rsplit("intrinsics.", 1)[1]
    for row in page["rows"]:
        for column, record in runs.items():
            index = row[columns.index(column)]
            if isinstance(index, int) and 1 <= index <= len(record.steps):
                row[at] = state.tree.var_words(record.step_row(index)["node"], row[at] or "")
                break
        else:
            row[at] = state.tree.var_words(-1, row[at] or "")


class _Handlers:
    """`on_<type>(state, message)` for each message type."""

    @staticmethod
    def on_step(state: InspectorState, message: dict) -> Any:
        state.step()
        return _after_command(state, message)

    @staticmethod
    def on_step_into(state: InspectorState, message: dict) -> Any:
        state.step_into()
        return _after_command(state, message)

    @staticmethod
    def on_step_over(state: InspectorState, message: dict) -> Any:
        state.step_over()
        return _after_command(state, message)

    @staticmethod
    def on_continue(state: InspectorState, message: dict) -> Any:
        state.continue_()
        return _after_command(state, message)

    @staticmethod
    def on_run_to(state: InspectorState, message: dict) -> Any:
        state.run_to(_int(message, "step", 0))
        return _after_command(state, message)

    @staticmethod
    def on_reset(state: InspectorState, message: dict) -> Any:
        state.reset()
        return _after_command(state, message)

    @staticmethod
    def on_edit(state: InspectorState, message: dict) -> Any:
        try:
            spec = state.edit(_text(message, "action"), message.get("argument"))
        except NNSchemaError as exc:
            state.error = str(exc)
            raise
        return spec.to_dict()

    @staticmethod
    def on_remove_edit(state: InspectorState, message: dict) -> Any:
        state.remove_edit(_int(message, "index", -1))

    @staticmethod
    def on_clear_edits(state: InspectorState, message: dict) -> Any:
        state.clear_edits()

    @staticmethod
    def on_children(state: InspectorState, message: dict) -> Any:
        nodes = message.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise InspectorError("children needs nodes=[node ids]")
        rows = []
        for node in nodes[:64]:
            try:
                rows.extend(state.tree.children_rows(_whole(node, "each of nodes")))
            except (KeyError, TypeError, ValueError) as exc:
                raise InspectorError(str(exc).strip('"')) from None
        return {"rows": rows}

    @staticmethod
    def on_source(state: InspectorState, message: dict) -> Any:
        try:
            return state.tree.source(_int(message, "block", -1))
        except KeyError as exc:
            raise InspectorError(str(exc).strip('"')) from None

    @staticmethod
    def on_table(state: InspectorState, message: dict) -> Any:
        run = state.run(message.get("run") or None)
        filters = message.get("filters") or {}
        if not isinstance(filters, dict):
            raise InspectorError("filters must be an object {column: text}")
        page = table_page(run.trace_rows(), TRACE_COLUMNS, _int(message, "page", 0), _int(message, "size", 50),
                          str(message.get("sort") or ""), bool(message.get("desc")), filters)
        page["run"] = run.name
        _var_words(state, page, {"step_index": run})
        return page

    @staticmethod
    def on_compare(state: InspectorState, message: dict) -> Any:
        result = state.compare(message.get("a") or None, message.get("b") or None)
        only = bool(message.get("only_changed"))
        rows = [r for r in result["rows"] if r["status"] != "ok" or r["changed"]] if only else result["rows"]
        first_index = result["first_index"]
        if only and first_index is not None:
            first_index = 0  # the filtered rows start with the first divergence
        size = max(1, min(_int(message, "size", 50), MAX_PAGE_SIZE))
        page = _int(message, "page", 0)
        if message.get("jump") and first_index is not None:
            page = first_index // size
        out = table_page(rows, COMPARE_COLUMNS, page, size)
        a = state.run(message["a"]) if message.get("a") else state.ensure_base()  # as state.compare picks them
        b = state.run(message["b"]) if message.get("b") else state.active
        _var_words(state, out, {"step_index_a": a, "step_index_b": b})
        out.update({k: result[k] for k in ("a", "b", "summary", "first", "pairs")})
        if out["first"]:
            first = {"columns": COMPARE_COLUMNS, "rows": [[out["first"].get(c) for c in COMPARE_COLUMNS]]}
            _var_words(state, first, {"step_index_a": a, "step_index_b": b})
            out["first"] = {**out["first"], "out_var": first["rows"][0][COMPARE_COLUMNS.index("out_var")]}
        out["first_index"] = first_index
        return out

    @staticmethod
    def on_hist(state: InspectorState, message: dict) -> Any:
        run = message.get("run") or None
        if message.get("trace_step") is not None:
            return state.histograms(run=run, trace_step=_int(message, "trace_step", 0))
        step = message.get("step_index")
        try:
            return state.histograms(None if step is None else _int(message, "step_index", 0), run)
        except KeyError as exc:  # a step the run does not have
            raise InspectorError(str(exc).strip('"')) from None

    # -- go anywhere: search, breakpoints, step out, call stack (issue 11) --------------------------

    @staticmethod
    def on_search(state: InspectorState, message: dict) -> Any:
        query = _text(message, "query")
        results = state.search(query, _int(message, "limit", 200), lowered=bool(message.get("lowered", True)))
        # "never ran" only once a run has finished; before that a row not run is "not run yet"
        return {"query": query, "results": results, "finished": state.any_finished()}

    @staticmethod
    def on_break_at(state: InspectorState, message: dict) -> Any:
        if message.get("nonfinite"):
            state.break_on_nonfinite()
        elif message.get("line") is not None:
            state.break_at(line=_int(message, "line", 0), file=_text(message, "file"))
        elif message.get("block"):
            state.break_at(_text(message, "block"))
        else:
            state.break_at(_int(message, "node", -1))
        return state.view_breakpoints(_since(message))

    @staticmethod
    def on_inline(state: InspectorState, message: dict) -> Any:
        block = _int(message, "block", -1)
        if not 0 <= block < len(state.tree):
            raise InspectorError(f"there is no tree node {block}")
        return state.inline_values(block, message.get("run") or None)

    @staticmethod
    def on_remove_breakpoint(state: InspectorState, message: dict) -> Any:
        state.remove_breakpoint(_int(message, "index", -1))
        return state.view_breakpoints(_since(message))

    @staticmethod
    def on_clear_breakpoints(state: InspectorState, message: dict) -> Any:
        state.clear_breakpoints()
        return state.view_breakpoints(_since(message))

    @staticmethod
    def on_breakpoints(state: InspectorState, message: dict) -> Any:
        return state.view_breakpoints(_since(message))

    @staticmethod
    def on_step_out(state: InspectorState, message: dict) -> Any:
        state.step_out()
        return _after_command(state, message)

    @staticmethod
    def on_run_to_here(state: InspectorState, message: dict) -> Any:
        if message.get("line") is not None:
            state.run_to_here(line=_int(message, "line", 0), file=_text(message, "file"))
        else:
            state.run_to_here(_int(message, "node", -1))
        return _after_command(state, message)

    @staticmethod
    def on_run_to_trace(state: InspectorState, message: dict) -> Any:
        state.run_to_trace_step(message.get("run") or None, _int(message, "trace_step", 0))
        return _after_command(state, message)

    @staticmethod
    def on_run_to_output(state: InspectorState, message: dict) -> Any:
        output = run_to_output(state, _int(message, "node", -1))
        return {**(_after_command(state, message) or {}), "output": output}

    @staticmethod
    def on_locate(state: InspectorState, message: dict) -> Any:
        return state.locate(message.get("run") or None, _int(message, "trace_step", 0))

    @staticmethod
    def on_call_stack(state: InspectorState, message: dict) -> Any:
        return {"frames": state.call_stack()}


    @staticmethod
    def on_tensor(state: InspectorState, message: dict) -> Any:
        dims, index = message.get("dims"), message.get("index")
        if dims is not None:
            if not isinstance(dims, list) or len(dims) > 2:
                raise InspectorError("dims must be a list of one or two dim numbers")
            dims = [_whole(d, "each of dims") for d in dims]
        if index is not None:
            if not isinstance(index, list) or len(index) > 64:
                raise InspectorError("index must be a list with an index (or null) per dim")
            index = [None if i is None else _whole(i, "each of index") for i in index]
        step = message.get("step_index")
        trace_step = message.get("trace_step")
        return state.tensor_view(None if step is None else _int(message, "step_index", 0), message.get("run") or None,
                                 trace_step=None if trace_step is None else _int(message, "trace_step", 0),
                                 dims=dims, index=index, against=message.get("against") or None,
                                 max_side=max(1, min(_int(message, "max_side", MAX_SIDE), MAX_SIDE)))

    @staticmethod
    def on_attention(state: InspectorState, message: dict) -> Any:
        if message.get("block"):  # a fused attention call's heads, recomputed from its inputs
            return state.recomputed_attention_view(str(message["block"]), message.get("run") or None,
                                                   _int(message, "batch", 0))
        step = message.get("step_index")
        trace_step = message.get("trace_step")
        return state.attention_view(None if step is None else _int(message, "step_index", 0),
                                    message.get("run") or None,
                                    trace_step=None if trace_step is None else _int(message, "trace_step", 0),
                                    batch=_int(message, "batch", 0))

    @staticmethod
    def on_trends(state: InspectorState, message: dict) -> Any:
        return state.trends(message.get("run") or None, str(message.get("stat") or "norm"))

    @staticmethod
    def on_tree_colours(state: InspectorState, message: dict) -> Any:
        return state.tree_colours(message.get("run") or None, str(message.get("stat") or "norm"),
                                  message.get("against") or None)

    @staticmethod
    def on_layers(state: InspectorState, message: dict) -> Any:
        runs = message.get("runs")
        if runs is not None and not isinstance(runs, list):
            raise InspectorError("runs must be a list of run names")
        return state.layers(str(message.get("var") or "hidden_states"), str(message.get("stat") or "norm"), runs)

    @staticmethod
    def on_routing(state: InspectorState, message: dict) -> Any:
        return routing_view(state, message.get("run") or None)

    @staticmethod
    def on_logical(state: InspectorState, message: dict) -> Any:
        return logical_reply(state)

    @staticmethod
    def on_logical_module(state: InspectorState, message: dict) -> Any:
        return logical_module()

    # the Patch and Diverge views (patch_view.py, diverge_view.py)
    on_patch = staticmethod(lambda state, message: patch_reply(state))
    on_patch_open = staticmethod(lambda state, message: open_patched(state, _int(message, "row", -1)))
    on_patch_close = staticmethod(lambda state, message: close_patched(state))
    on_diverge = staticmethod(lambda state, message: diverge_reply(state))
    on_diverge_step = staticmethod(lambda state, message: diverge_step(state, _int(message, "row", -1)))

    @staticmethod
    def on_module(state: InspectorState, message: dict) -> Any:
        """The code of a bundle loaded on demand (static/views.js: the Compare, Trends, Layers and
        Routing tabs; logical.js, patch.js, diverge.js: the Logical, Patch and Diverge tabs), so that
        the initial widget state stays small."""
        name = _text(message, "name")
        if name not in _MODULES:
            raise InspectorError(f"there is no browser module {name!r}; the modules are {', '.join(sorted(_MODULES))}")
        return {"name": name, "code": (_STATIC / _MODULES[name]).read_text(encoding="utf-8")}

    @staticmethod
    def on_same_statement(state: InspectorState, message: dict) -> Any:
        runs = message.get("runs")
        if runs is not None and not isinstance(runs, list):
            raise InspectorError("runs must be a list of run names")
        return state.same_statement(_int(message, "node", -1), runs, message.get("var") or None)


def handle_message(state: InspectorState, message: Any) -> dict:
    """The reply to one browser message (never raises for a bad request: the reply says what was wrong)."""
    if not isinstance(message, dict):
        return {"type": "reply", "id": None, "ok": False, "error": "a message must be a JSON object"}
    request_id = message.get("id")
    kind = message.get("type")
    handler = getattr(_Handlers, f"on_{kind}", None) if isinstance(kind, str) else None
    if handler is None:
        known = sorted(name[3:] for name in vars(_Handlers) if name.startswith("on_"))
        return {"type": "reply", "id": request_id, "ok": False,
                "error": f"unknown message type {kind!r}; known: {', '.join(known)}"}
    try:
        data = handler(state, message)
    except NNSchemaError as exc:
        return {"type": "reply", "id": request_id, "ok": False, "error": str(exc)}
    except SystemExit as exc:  # the model's code or a notebook name called sys.exit: a reply, the kernel lives
        return {"type": "reply", "id": request_id, "ok": False,
                "error": f"{kind} stopped: the code it ran called sys.exit({exc.code!r}); the kernel is still running"}
    except KeyboardInterrupt:  # the kernel was interrupted mid-request: the front end still gets its reply
        return {"type": "reply", "id": request_id, "ok": False,
                "error": f"{kind} was interrupted (KeyboardInterrupt); Reset starts a new run"}
    return {"type": "reply", "id": request_id, "ok": True, "data": json_safe(data)}
