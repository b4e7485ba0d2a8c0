"""`diverge_widget(report)`: the inspector with its Diverge tab on a `diverge` report, what
`DivergeReport.show()` returns (the view itself: diverge_view.py).

Importing this module registers it as `DivergeReport.viewer` (the widget package imports it), so
that traces, which may not import the widget, can open it.

Depends on the widget's inspector, state and diverge_view, and on traces (the report).
"""

from __future__ import annotations

from typing import Any

import torch

from ..parser.model_parser import NNParser
from ..traces.diverge import DivergeReport
from .diverge_view import DivergeSession, DivergeViewError, diverge_view_state
from .inspector import InspectorWidget
from .state import InspectorOptions, InspectorState

__all__ = ["diverge_widget"]


def diverge_widget(report: DivergeReport, **options: Any) -> InspectorWidget:
    """The inspector of side b on b's inputs, with side a's state machine beside it and the Diverge
    tab on `report` (what `report.show()` returns); `options` go to InspectorWidget (title, bins,
    limits). Both sides run without gradients. For a compiled model b, b's run is its own code run
    without the compiler (`compiled_side_schema`), each line showing its compiled region's errors."""
    view = diverge_view_state(report)
    if report.schema_a is None:
        raise DivergeViewError("this report has no schema of side a to step: read report.table instead")
    schema_b = report.schema_b if report.schema_b is not None else compiled_side_schema(report)
    widget = InspectorWidget(schema_b, dict(report.side_b["inputs"]), gradients=False,
                             title=options.pop("title", f"diverge: {schema_b.name}"), **options)
    state_a = InspectorState(report.schema_a, dict(report.side_a["inputs"]), InspectorOptions(gradients=False))
    widget.state.diverge = DivergeSession(report, state_a, view)
    widget._show_view("Diverge")
    return widget


def compiled_side_schema(report: DivergeReport) -> Any:
    """Side b's schema for a `torch.compile` wrapper's report: its own code (`model_b._orig_mod`, which
    `diverge` requires to hold a's weights and dtypes), parsed on b's inputs (a's schema where it is
    a's model). No value inside a compiled graph can be stepped to; the report's rows give each
    statement's error when its region runs compiled, and the view shows them beside both runs."""
    original = getattr(report.model_b, "_orig_mod", None)
    if original is None:
        raise DivergeViewError("this report has no schema of side b and its model_b is not a torch.compile "
                               "wrapper: read report.table instead")
    if original is report.model_a:
        return report.schema_a
    with torch.no_grad():
        return NNParser.parse_model(original, inputs_tensors_values=dict(report.side_b["inputs"]))


DivergeReport.viewer = staticmethod(diverge_widget)
