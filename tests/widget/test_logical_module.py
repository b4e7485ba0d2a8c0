"""The Logical tab's browser code is sent on request (`logical_module`), not in the initial state."""

from __future__ import annotations

import json

import pytest

from nnschemaparser.widget.logical_view import LogicalViewError, logical_module, logical_reply
from nnschemaparser.widget.messages import handle_message


def test_the_logical_tab_code_comes_on_request_and_is_not_in_the_initial_state():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget import InspectorWidget
    from tests.support.debugger_models import llama_case

    _, inputs, schema = llama_case(1)
    widget = InspectorWidget(schema, inputs, gradients=False)
    state = json.dumps(widget.get_state(), ensure_ascii=False)
    assert "nnsp-lg-badge" not in state and '\\"module\\"' in state  # only the loader (lazytab.js) is in widget.js
    assert widget.logical is False and widget.views == {}  # no Logical tab until show_logical
    reply = handle_message(widget.state, {"type": "module", "name": "Logical", "id": 1})
    assert reply["ok"] is True
    code = reply["data"]["code"]
    assert "nnsp-lg-badge" in code and "LogicalView" in code and code == logical_module()["code"]
    widget.close()


def test_the_logical_request_without_show_logical_says_what_to_call():
    class Bare:
        logical_view = None

    with pytest.raises(LogicalViewError, match=r"widget.show_logical\(record.trace\) on every rank"):
        logical_reply(Bare())
