"""InspectorWidget: the notebook front end of an inspector session, as an anywidget.

Small state travels as traits: `step_index`, `step_info` (the current StepInfo in brief), `status`,
`error`, `runs`, `edit_list`, `blocks` (never-executed blocks) — each re-sent only when it changes.
The block tree travels once, as `tree` (the first rows under a byte budget); everything else is
fetched by message (see messages.py): subtrees, source, trace pages, comparisons, histogram bins.
The Python methods mirror the buttons and read the same state the browser shows.

The browser code is `static/widget.js` and `static/widget.css`, built from the ESM modules in js/
by `python -m nnschemaparser.widget.build`. Depends on the widget's state, messages and
static_html modules, on anywidget/traitlets, and on the parser for `inspect_model_widget`.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import ChainMap
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import anywidget
import traitlets

from ..traces.sampling import CaptureLimits
from ..runtime.interpreter import CallPause, StepInfo
from ..parser.model_parser import NNParser
from ..schema.model import ModelBlockSchema
from .edits import EditSpec
from .messages import handle_message, json_safe
from .logical_view import logical_view_state
from .patch_view import open_patched, patch_view_state
from .diverge_view import diverge_step
from .routing_view import has_experts, routing_frame
from .runs import RunRecord
from .state import InspectorOptions, InspectorState

__all__ = ["InspectorWidget", "inspect_model_widget"]

_STATIC = Path(__file__).parent / "static"
_log = logging.getLogger(__name__)


def _notebook_namespace() -> Mapping[str, Any]:
    """The notebook's own names, live (a name defined after the widget is still seen by edits)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    return getattr(shell, "user_ns", None) or {} if shell is not None else {}


class InspectorWidget(anywidget.AnyWidget):
    """Step, edit and compare runs of `schema` on the inputs `scope`, in a notebook cell.

    `InspectorWidget(schema, scope={"x": x})` displays itself when it is the last value of a cell.
    Options: `gradients` (take gradients of `loss_fn(outputs)` after each run; default loss: the sum
    of squares of the differentiable outputs), `namespace` (names for edit expressions; the
    notebook's names are always there), `limits` (a CaptureLimits bounding the values each run
    keeps; default: all, as aliases), `bins` (histogram bins), `title`.
    """

    _esm = _STATIC / "widget.js"
    _css = _STATIC / "widget.css"

    title = traitlets.Unicode("").tag(sync=True)
    mode = traitlets.Unicode("live").tag(sync=True)
    tree = traitlets.Dict().tag(sync=True)
    step_index = traitlets.Int(0).tag(sync=True)
    step_info = traitlets.Dict().tag(sync=True)
    status = traitlets.Unicode("ready").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    runs = traitlets.List().tag(sync=True)
    edit_list = traitlets.List().tag(sync=True)
    blocks = traitlets.Dict().tag(sync=True)
    #: The tree's lowered view: one row per instruction ($t temporaries, attribute fetches) instead
    #: of one per source statement; the browser's "Lowered" button and `l` key set it too.
    show_lowered = traitlets.Bool(False).tag(sync=True)
    #: Whether the schema has MoE experts blocks: the browser shows its Routing tab only then.
    moe = traitlets.Bool(False).tag(sync=True)
    #: Whether show_logical was called: the browser adds its Logical tab then.
    logical = traitlets.Bool(False)  # not synced: the browser reads `views`
    #: The tabs whose code comes on request ({"Logical" / "Patch" / "Diverge": times shown}): the
    #: browser adds each once it is here, and fetches its view again when its count changes.
    views = traitlets.Dict().tag(sync=True)
    #: The breakpoint list's version: a breakpoint set from Python (break_at) is listed at once.
    breakpoints_version = traitlets.Int(0).tag(sync=True)

    def __init__(self, schema: ModelBlockSchema, scope: Mapping[str, Any], *, gradients: bool = True,
                 loss_fn: Optional[Callable[[list], Any]] = None, namespace: Optional[Mapping[str, Any]] = None,
                 limits: Optional[CaptureLimits] = None, bins: int = 40, title: str = "") -> None:
        extra = ChainMap(dict(namespace or {}), _notebook_namespace())
        options = InspectorOptions(gradients=gradients, loss_fn=loss_fn, namespace=extra, limits=limits, bins=bins)
        self._state = InspectorState(schema, scope, options)
        # The kernel may run a cell (widget.step()) and a button's message on different threads
        # at once; every use of the state holds this lock.
        self._lock = threading.RLock()
        super().__init__(title=title or schema.name, tree=self._state.tree.initial(options.tree_bytes),
                         moe=has_experts(schema))
        self.on_msg(self._on_message)
        self._state.moved_hook = self._sync  # the new step's traits go out before the reply is built
        self._sync()

    # -- plumbing ------------------------------------------------------------------------------

    def _sync(self) -> None:
        state = self._state
        with self.hold_sync():
            self.step_info = json_safe(state.view_step())
            self.step_index = state.step_index
            self.status = state.status
            self.error = state.error
            self.runs = state.view_runs()
            self.edit_list = state.view_edits()
            self.blocks = state.view_blocks()
            self.breakpoints_version = state.breakpoints.version

    def _do(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run one state operation under the lock, then sync the traits (also when it raised)."""
        with self._lock:
            try:
                return method(*args, **kwargs)
            finally:
                self._sync()

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        try:
            reply = self._do(handle_message, self._state, content)
        except Exception as exc:  # a bug of ours: the browser gets the message, the log the traceback
            _log.error("inspector message %r failed:\n%s", content, traceback.format_exc())
            reply = {"type": "reply", "id": content.get("id") if isinstance(content, dict) else None,
                     "ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
        self.send(reply)

    def close(self) -> None:
        """Close the widget's views and stop its run thread (abandoning a paused run)."""
        with self._lock:
            self._state.close()
        super().close()

    def handle(self, message: dict) -> dict:
        """Answer one browser message from Python (what the front end does; handy in tests)."""
        return self._do(handle_message, self._state, message)

    # -- the buttons ---------------------------------------------------------------------------

    def step(self) -> "Optional[StepInfo | CallPause]":
        """Step into: run one instruction, or stop before a sub-block call (a CallPause: "about to
        call ..."); from that pause, enter the callee. The button "Step" (keys s, i)."""
        return self._do(self._state.step)

    def step_into(self) -> "Optional[StepInfo | CallPause]":
        """The same as `step`: one instruction, stopping before a sub-block call, entering it from there."""
        return self._do(self._state.step_into)

    def step_over(self) -> Optional[StepInfo]:
        """Run to the next instruction of this frame or an outer one (from the pause before a call:
        the call's own completion step); the button "Step over" (o)."""
        return self._do(self._state.step_over)

    def continue_(self) -> Optional[StepInfo]:
        """Run to the end; the button "Continue"."""
        return self._do(self._state.continue_)

    def run_to(self, step_index: int) -> Optional[StepInfo]:
        """Run to step `step_index` (an earlier one replays from the start); the button "Run to"."""
        return self._do(self._state.run_to, step_index)

    def reset(self, scope: Optional[Mapping[str, Any]] = None) -> None:
        """Start a new run (on `scope` if given) replaying the queued edits; the button "Reset"."""
        self._do(self._state.reset, scope)

    def edit(self, action: str, argument: Any = None) -> EditSpec:
        """Edit the current step's value: "zero", "scale" (factor), "noise" (std) or "expression" (text).

        A bad edit raises EditError, changes nothing, and shows its message in the widget.
        """
        def edit_or_report() -> EditSpec:
            try:
                return self._state.edit(action, argument)
            except Exception as exc:
                self._state.error = str(exc)
                raise

        return self._do(edit_or_report)

    def remove_edit(self, index: int) -> EditSpec:
        """Drop queued edit `index` (the next run no longer replays it)."""
        return self._do(self._state.remove_edit, index)

    def clear_edits(self) -> None:
        self._do(self._state.clear_edits)

    # -- go anywhere: search, breakpoints, step out, call stack --------------------------------

    def search(self, query: str, limit: int = 200) -> Any:
        """The tree rows matching `query` (block paths like "h.1.attn" first, then variables, op names,
        instruction text) as a DataFrame: node, kind, text, source (the source text the row shows in
        the source view, "" where that is `text`), op, shape, line, block, path (a block's own path,
        else the path of the block holding the row), ran (whether any run so far ran the row),
        ancestors."""
        import pandas as pd

        with self._lock:
            rows = self._state.search(query, limit)
        return pd.DataFrame(rows, columns=["node", "kind", "text", "source", "op", "shape", "line", "block", "path",
                                           "ran", "ancestors"])

    def break_at(self, where: Any = None, *, line: Optional[int] = None, file: str = "",
                 when: Optional[Callable[[StepInfo], Any]] = None) -> dict:
        """Add a breakpoint: a tree node id, a block path (on entry), `line=` (in `file`), or a predicate
        `when=lambda step: ...`; Continue stops at its next hit (see `breakpoint_hits`)."""
        return self._do(self._state.break_at, where, line=line, file=file, when=when)

    def run_to_here(self, node: Optional[int] = None, *, line: Optional[int] = None, file: str = "") -> Any:
        """Continue to tree row `node` or source `line` (a one-time breakpoint); "Run to here"."""
        return self._do(self._state.run_to_here, node, line=line, file=file)

    def run_to_trace_step(self, run: Optional[str], trace_step: int) -> Any:
        """Run the active run to the step matching trace step `trace_step` of run `run` (a trace or
        compare row); "Run to this step" under the histograms."""
        return self._do(self._state.run_to_trace_step, run, trace_step)

    def break_on_nonfinite(self) -> dict:
        """Stop at the first step whose value holds a NaN or an Inf."""
        return self._do(self._state.break_on_nonfinite)

    def clear_breakpoints(self) -> None:
        self._do(self._state.clear_breakpoints)

    @property
    def breakpoint_hits(self) -> list[dict]:
        """Every breakpoint stop of the runs kept: breakpoint index, reason, step, block, variable,
        line, `run_id` (the id of the run it stopped, never given to another run) and `run` (that
        run's name now; names may be given again). An abandoned run's hits go with it."""
        with self._lock:
            return self._state.hits_view()

    @property
    def stop_reason(self) -> str:
        """Why the last command stopped where it did ("entered transformer.h.1.attn", "target not
        reached: ..."), "" when it simply ran its course; cleared by the next command and by Reset."""
        return self._state.stop_reason

    def step_out(self) -> Optional[StepInfo]:
        """Run until the current block has returned (the first step of the caller's frame); the
        button "Step out" (u). From the pause before a call, the caller's block is the one left."""
        return self._do(self._state.step_out)

    def call_stack(self) -> list[dict]:
        """The paused step's frames, root first, with their visible variables, shapes and stats."""
        with self._lock:
            return self._state.call_stack()

    # -- reading the state ---------------------------------------------------------------------

    @property
    def current(self) -> Optional[StepInfo]:
        """The current StepInfo (None before the first step); see `pause` for a pause before a call."""
        return self._state.current

    @property
    def pause(self) -> Optional[CallPause]:
        """The pause before a sub-block call the run is stopped at (None when it is at a step)."""
        return self._state.pause

    @property
    def state(self) -> InspectorState:
        """The state machine behind the widget."""
        return self._state

    @property
    def edits(self) -> list[EditSpec]:
        """The queued edits: replayed by every run started after them."""
        return list(self._state.edits)

    @property
    def run_records(self) -> list[RunRecord]:
        return list(self._state.runs)

    @property
    def traces(self) -> dict:
        """The activation trace of every run so far, by run name, as DataFrames (needs pandas)."""
        with self._lock:
            return {run.name: run.to_dataframe() for run in self._state.runs}

    def trace(self, run: Optional[str] = None) -> Any:
        """The trace DataFrame of one run (default: the active run), with the StepInfo index of each step."""
        with self._lock:
            return self._state.run(run).to_dataframe()

    def gradient_trace(self, run: Optional[str] = None) -> Any:
        """The GradientTrace of a finished run (None when no gradients were taken)."""
        return self._state.run(run).gradients

    def steps(self, run: Optional[str] = None) -> Any:
        """One row per StepInfo of a run (every leaf instruction), as a DataFrame."""
        return self._state.run(run).steps_dataframe()

    def compare(self, run_a: Optional[str] = None, run_b: Optional[str] = None) -> Any:
        """Compare two runs' traces (default: base vs the active run); the TraceDiff DataFrame.

        `frame.attrs` holds the run names, the diff_summary and the row of the first divergence.
        """
        from ..traces.frames import diffs_to_dataframe

        result = self._do(self._state.compare, run_a, run_b)
        frame = diffs_to_dataframe(result["diffs"])
        frame["step_index_a"] = [row["step_index_a"] for row in result["rows"]]
        frame["step_index_b"] = [row["step_index_b"] for row in result["rows"]]
        frame.attrs.update({k: result[k] for k in ("a", "b", "summary", "first_index")})
        return frame

    @property
    def last_compare(self) -> Optional[dict]:
        """The summary of the last comparison, from Python or from the widget's Compare tab."""
        return self._state.last_compare

    def histograms(self, step: Optional[int] = None, run: Optional[str] = None, *,
                   trace_step: Optional[int] = None) -> dict:
        """The activation and gradient bins of a step (StepInfo index, default current) or trace step."""
        with self._lock:
            return self._state.histograms(step, run, trace_step=trace_step)

    def moe_routing(self, run: Optional[str] = None) -> Any:
        """The MoE routing of the inputs as a DataFrame (`nnschemaparser.moe_routing`): one row per
        experts call, token and rank with block, layer, call, token, rank, expert and weight, the
        router's top-k exactly. It is read from a fresh run of the inputs, so `run`'s edits are not
        replayed (`frame.attrs["note"]` says so); `run` (default: the active run) must exist."""
        with self._lock:
            return routing_frame(self._state, run)

    def show_logical(self, trace: Any, bins: int = 20, reference: Any = None) -> dict:
        """Hold the logical view of a sharded run (`distributed.capture_logical`'s trace): whole-tensor
        shapes and statistics with a placement badge per value; the browser's `logical` request gets
        it (its Logical tab). `reference`: one process's ActivationTrace on the whole inputs, to show
        per value whether the gathered one is exact or its max abs diff. A collective: every rank
        calls it (each gathers the same values); rank 0 shows it."""
        view = logical_view_state(trace, bins=bins, reference=reference)
        with self._lock:
            self._state.logical_view = view
        self.logical = True
        self._show_view("Logical")
        return view

    def show_patching(self, table: Any, attribution: Any = None) -> dict:
        """Show an `activation_patching` DataFrame in the Patch tab: a heatmap of `effect` by layer x
        position (or head, or by site), colours diverging around 0, with the `attribution_patching`
        DataFrame of the same sweep beside it when given. A click (or Enter) on a cell opens that
        row's patched run as the active run, stepped to its first divergence from the clean run
        (`open_patched`). The table must be of this inspector's schema. Returns the view's state."""
        held = patch_view_state(table, attribution)
        with self._lock:
            self._state.patch_view = held
        self._show_view("Patch")
        return held.view

    def _show_view(self, name: str) -> None:
        """Add tab `name` in the browser (or make it fetch its view again)."""
        self.views = {**self.views, name: self.views.get(name, 0) + 1}

    def open_patched(self, row: int) -> dict:
        """Open row `row` of the shown patching table as the active run (what a click on its cell does)."""
        return self._do(open_patched, self._state, row)

    def diverge_step(self, row: int) -> dict:
        """Step both runs of the Diverge view to row `row` of the report (what a click on its line does)."""
        return self._do(diverge_step, self._state, row)

    def attention_heads(self, block_path: str, run: Optional[str] = None, call: int = -1) -> dict:
        """The attention weights of the attention call in `block_path` (sdpa, flash or eager alike),
        recomputed from the call's own query, key, mask and scale, with the token labels: {"weights":
        tensor [batch, heads, q, k], "tokens", "recomputed": True, "function", "step", "note", ...}."""
        with self._lock:
            return self._state.recomputed_attention(block_path, run, call)

    def same_statement(self, node: int, runs: Optional[list] = None, var: Optional[str] = None) -> dict:
        """Tree row `node` inside a layer of a ModuleList and the same row in every other layer: the
        value each bound, per run (stats and the trace step to open it); the browser's Layers tab."""
        with self._lock:
            return self._state.same_statement(node, runs, var)

    @property
    def never_run(self) -> list[str]:
        """The paths of the interpreted blocks no finished run entered (experts never routed to...)."""
        return self._state.never_run_paths()

    def to_html(self, path: str | Path) -> Path:
        """Write a static page (no kernel needed) with every run, their comparisons, histograms,
        heatmaps of the steps looked at (and a sample) and trends; see docs/WIDGET.md."""
        from .static_html import write_static_html

        with self._lock:
            return write_static_html(self._state, path, title=self.title)


def inspect_model_widget(model: Any, inputs: Mapping[str, Any], **options: Any) -> InspectorWidget:
    """Parse `model` on the example `inputs` ({forward parameter name: value}) and return its inspector.

    The model's parameters, buffers and training mode are left as they were. `options` go to
    InspectorWidget (gradients, loss_fn, namespace, limits, title).
    """
    if not isinstance(inputs, Mapping) or not inputs:
        raise TypeError("inspect_model_widget needs inputs={forward parameter name: example value}, "
                        "e.g. inputs={'x': torch.randn(2, 16)}")
    schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))
    return InspectorWidget(schema, scope=dict(inputs), **options)
