"""Issue 42, point 9 (speed): a stepping command's reply brings the new step's heatmap (the view
asks for it with `with_tensor`, one round trip less per step), and the widget's traits (the step
card) go out before the reply's extras are computed (`moved_hook`)."""

from __future__ import annotations

import json

from nnschemaparser.widget import InspectorState, InspectorWidget
from nnschemaparser.widget.messages import handle_message
from tests.support.widget_models import mlp_case


def _step(state, **extra):
    reply = handle_message(state, {"type": "step", "id": 1, "with_hist": True, **extra})
    json.dumps(reply, allow_nan=False)
    assert reply["ok"], reply
    return reply["data"]


def test_the_step_reply_carries_the_heatmap_the_tensor_request_gives():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    seen = 0
    while state.status != "finished":
        data = _step(state, with_tensor={})
        trace_step = state.view_step().get("trace_step")
        if not trace_step:
            assert data is None or "tensor" not in data  # no tensor bound: the view keeps what it shows
            continue
        seen += 1
        alone = handle_message(state, {"type": "tensor", "id": 2, "trace_step": trace_step})["data"]
        assert data["tensor"] == {"query": {"trace_step": trace_step}, "view": alone}
    assert seen >= 3
    state.close()


def test_kept_dims_are_used_when_they_fit_and_dropped_when_not():
    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    while not state.view_step().get("trace_step"):
        _step(state)
    state.reset()
    while True:  # a step with a 2-d value, then the kept dims (1, 0) and a 5-d request that fits no value
        data = _step(state, with_tensor={"dims": [1, 0], "index": [None, None]})
        if data and "tensor" in data:
            break
    view = data["tensor"]["view"]
    trace_step = data["tensor"]["query"]["trace_step"]
    want = state.tensor_view(trace_step=trace_step, dims=[1, 0], index=[None, None])
    assert view == want and view["dims"] == [1, 0]
    state.reset()
    while True:
        data = _step(state, with_tensor={"dims": [7, 9], "index": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]})
        if data and "tensor" in data:
            break
    assert data["tensor"]["view"] == state.tensor_view(trace_step=data["tensor"]["query"]["trace_step"])
    state.close()


def test_the_widget_syncs_the_new_step_before_the_reply_extras():
    _, x, schema = mlp_case()
    widget = InspectorWidget(schema, scope={"x": x})
    order = []
    original_hist = widget._state.histograms

    def histograms(*args, **kwargs):
        order.append(("hist", json.dumps(widget.step_info, sort_keys=True)))
        return original_hist(*args, **kwargs)

    widget._state.histograms = histograms
    widget.observe(lambda change: order.append(("step_info", json.dumps(change["new"], sort_keys=True))),
                   names="step_info")
    for index in range(1, 6):
        widget._on_message(widget, {"type": "step", "id": index, "with_hist": True}, [])
        now = json.dumps(widget.step_info, sort_keys=True)
        # the trait (the step card) changed first, and the histograms saw it already at the new step
        assert order[-2:] == [("step_info", now), ("hist", now)], order[-2:]
    widget.close()
