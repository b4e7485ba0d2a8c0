"""`diverge_widget(report)`: the inspector with its Diverge tab on a `diverge` report, what
`DivergeReport.show()` returns (the view itself: diverge_view.py).

Importing this module registers it as `DivergeReport.viewer` (the widget package imports it), so
that traces, which may not import the widget, can open it.

Depends on the widget's inspector, state and diverge_view, and on traces (the report).
"""

from __future__ import annotations

from typing import Any

from ..traces.diverge import DivergeReport
from .diverge_view import DivergeSession, DivergeViewError, diverge_view_state
from .inspector import InspectorWidget
from .state import InspectorOptions, InspectorState

__all__ = ["diverge_widget"]


def diverge_widget(report: DivergeReport, **options: Any) -> InspectorWidget:
    """The inspector of side b on b's inputs, with side a's state machine beside it and the Diverge
    tab on `report` (what `report.show()` returns); `options` go to InspectorWidget (title, bins,
    limits). Both sides run without gradients."""
    view = diverge_view_state(report)
    if report.schema_b is None or report.schema_a is None:
        raise DivergeViewError("this report has no schema of side b (a torch.compile wrapper's report localizes "
                               "inside compiled regions, with no run of b to step): read report.table instead")
    widget = InspectorWidget(report.schema_b, dict(report.side_b["inputs"]), gradients=False,
                             title=options.pop("title", f"diverge: {report.schema_b.name}"), **options)
    state_a = InspectorState(report.schema_a, dict(report.side_a["inputs"]), InspectorOptions(gradients=False))
    widget.state.diverge = DivergeSession(report, state_a, view)
    widget._show_view("Diverge")
    return widget


DivergeReport.viewer = staticmethod(diverge_widget)
