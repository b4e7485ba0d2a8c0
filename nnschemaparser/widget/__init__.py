"""The notebook inspector: step, edit and compare runs of a schema inside a cell.

    from nnschemaparser.widget import InspectorWidget, inspect_model_widget

    widget = inspect_model_widget(model, inputs={"x": x})   # parse + inspector in one call
    widget                                                  # displays the tree, stepper, tables...
    widget.step(); widget.step_over(); widget.run_to(5); widget.continue_(); widget.reset()

Module map (lower to higher): statements (a block's source statements by span, their one-line
text), tree (the compact block tree, one row per statement), edits (edit specs), runs (one run: its
ActivationTrace, GradientTrace and StepInfo rows), tensor_views (heatmap slices, attention heads,
trends, per-layer series), value_memo (a value's statistics and bins once per value and version), tensor_requests (the state's tensor-view requests, a mixin), state (the state machine: stepping, edits, runs,
comparison with compare_traces, bins with histogram_bins), messages (the browser's requests),
static_html (the page without a kernel), inspector (the anywidget), build (js/ -> static/),
logical_view (a sharded run's logical values, placement badges), patch_view (activation patching's
heatmap, a cell opened as a patched run), diverge_view (a diverge report's lines, both runs stepped to one), diverge_widget (report.show()),
shared_page (what a share holds, and its page: the static page of a shared schema),
share_server (`nnschemaparser serve`: the plan and share deployment, Starlette).
The widget is a view: nothing below imports it.

Stage 8. May import: `schema`, `runtime`, `parser`, `traces`, `inspection`, `files`, `distributed`.
"""

from typing import Any

from .state import InspectorError, InspectorOptions, InspectorState

__all__ = ["InspectorWidget", "inspect_model_widget", "InspectorState", "InspectorOptions", "InspectorError"]


def __getattr__(name: str) -> Any:
    # anywidget is imported on first use only, so `python -m nnschemaparser.widget.build` and the
    # state machine work without it (and before static/ exists).
    if name in ("InspectorWidget", "inspect_model_widget"):
        from . import inspector

        return getattr(inspector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
