"""Every input path of the inspector typed (issue 23): hostile widget messages get a reply that says
what is wrong, an edit expression or a breakpoint predicate that calls sys.exit or is interrupted
becomes a reply (the kernel lives), identical breakpoints are kept once and a reply for the version
the front end holds leaves the unchanged list out; any text in a model's source keeps the static page
valid; a trace file whose shape overflows is a typed refusal."""

from __future__ import annotations

import json
import re
import struct
import sys

import pytest
import torch

from nnschemaparser import NNParser, TensorContainer
from nnschemaparser.files.trace_file import load_trace, save_trace
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.traces.trace import ActivationTrace, TraceStep
from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.debugger import MAX_BREAKPOINTS
from nnschemaparser.widget.messages import handle_message
from nnschemaparser.widget.static_html import static_page
from tests.support.widget_models import mlp_case


@pytest.fixture
def state():
    _, x, schema = mlp_case()
    inspector = InspectorState(schema, {"x": x})
    yield inspector
    inspector.close()


def reply(state, **message):
    answer = handle_message(state, {"id": 3, **message})
    json.dumps(answer, allow_nan=False)
    assert answer["id"] == 3 and answer["type"] == "reply"
    return answer


def _at_a_tensor_step(state) -> None:
    for _ in range(20):
        assert reply(state, type="step")["ok"]
        current = state.current
        if state.pause is None and current is not None and isinstance(current.value, torch.Tensor) \
                and current.out_var:
            return
    raise AssertionError("no step binds a tensor")


@pytest.mark.parametrize("message, error", [
    ({"type": "run_to", "step": float("inf")}, "step must be a whole number, got inf"),
    ({"type": "run_to", "step": float("nan")}, "step must be a whole number, got nan"),
    ({"type": "run_to", "step": 1e300}, "step must be at most"),
    ({"type": "run_to", "step": 2.5}, "step must be a whole number, got 2.5"),
    ({"type": "run_to", "step": -1}, "steps are numbered from 1"),
    ({"type": "hist", "step_index": -1}, "has steps"),
    ({"type": "hist", "step_index": float("inf")}, "step_index must be a whole number"),
    ({"type": "table", "page": float("inf")}, "page must be a whole number"),
    ({"type": "tensor", "dims": ["a", "b"]}, "each of dims must be a whole number, got 'a'"),
    ({"type": "tensor", "dims": [0, 1, 2]}, "dims must be a list of one or two dim numbers"),
    ({"type": "tensor", "index": [{"x": 1}]}, "each of index must be a whole number"),
    ({"type": "children", "nodes": [float("inf")]}, "each of nodes must be a whole number"),
    ({"type": "remove_edit", "index": float("-inf")}, "index must be a whole number"),
    ({"type": "break_at", "line": float("inf")}, "line must be a whole number"),
    ({"type": "break_at", "line": 3, "file": {"a": 1}}, "file must be text"),
    ({"type": "attention", "batch": float("inf")}, "batch must be a whole number"),
    ({"type": "search", "query": "q" * 1_000_000}, "query is 1000000 characters, more than 10000"),
    ({"type": "edit", "action": ["zero"]}, "action must be text"),
])
def test_a_hostile_message_gets_a_reply_naming_the_problem(state, message, error):
    answer = reply(state, **message)
    assert answer["ok"] is False and error in answer["error"]
    assert len(answer["error"]) < 400  # the reply names the problem, it does not echo the payload


def test_a_megabyte_expression_is_refused_before_it_is_compiled(state):
    _at_a_tensor_step(state)
    answer = reply(state, type="edit", action="expression", argument="1+" * 500_000 + "1")
    assert answer["ok"] is False and "more than 10000; define a function in the notebook" in answer["error"]
    assert state.edits == []


@pytest.mark.parametrize("expression, error", [
    ("__import__('sys').exit(3)", "called sys.exit(3); nothing was changed"),
    ("exit()", "called sys.exit(None); nothing was changed"),
    ("(_ for _ in ()).throw(KeyboardInterrupt)", "was interrupted; nothing was changed"),
])
def test_sys_exit_or_an_interrupt_in_an_edit_expression_is_a_reply_and_the_kernel_lives(state, expression, error):
    _at_a_tensor_step(state)
    value = state.current.value.clone()
    answer = reply(state, type="edit", action="expression", argument=expression)
    assert answer["ok"] is False and error in answer["error"]
    assert state.edits == [] and torch.equal(state.current.value, value)
    assert reply(state, type="edit", action="expression", argument="value * 2")["ok"]  # still working


@pytest.mark.parametrize("raise_it, reason", [
    (lambda: sys.exit(4), "called sys.exit(4)"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "was interrupted"),
])
def test_sys_exit_or_an_interrupt_in_a_breakpoint_predicate_stops_the_run_with_the_reason(state, raise_it, reason):
    def stop_here(step):
        return raise_it()

    state.break_at(when=stop_here)
    assert reply(state, type="continue")["ok"]
    assert state.status == "paused" and reason in state.stop_reason


def test_sys_exit_anywhere_in_a_request_is_a_reply(state, monkeypatch):
    monkeypatch.setattr(type(state), "step", lambda self: sys.exit(5))
    answer = reply(state, type="step")
    assert answer["ok"] is False and "called sys.exit(5); the kernel is still running" in answer["error"]
    monkeypatch.setattr(type(state), "step", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    answer = reply(state, type="step")
    assert answer["ok"] is False and "interrupted (KeyboardInterrupt)" in answer["error"]


def test_identical_breakpoints_are_kept_once_and_a_reply_leaves_out_an_unchanged_list(state):
    first = reply(state, type="break_at", node=1)["data"]
    assert len(first["items"]) == 1
    for _ in range(3000):
        again = reply(state, type="break_at", node=1, since=first["version"])["data"]
    assert again == {"version": first["version"], "hits": [], "reason": "", "run": "base", "run_id": 1, "hits_total": 0,
                     "unchanged": True}
    assert len(state.breakpoints.items) == 1
    added = reply(state, type="break_at", line=2, since=first["version"])["data"]
    assert added["version"] == first["version"] + 1 and len(added["items"]) == 2  # changed: the list is sent
    assert "items" in reply(state, type="breakpoints")["data"]  # no version held: the whole list


def test_breakpoints_are_capped_with_a_reply_that_says_so(state):
    for line in range(1, MAX_BREAKPOINTS + 1):
        assert reply(state, type="break_at", line=line)["ok"]
    answer = reply(state, type="break_at", line=MAX_BREAKPOINTS + 1)
    assert answer["ok"] is False and "the most an inspector keeps" in answer["error"]


def test_run_to_here_on_an_existing_breakpoint_keeps_it(state):
    reply(state, type="break_at", node=2)
    assert reply(state, type="run_to_here", node=2)["ok"]
    assert [bp["node"] for bp in state.view_breakpoints()["items"]] == [2]


# -- the static page ------------------------------------------------------------------------------

TRICKY = ["<!--", "-->", "<script>", "</script>", "<!-- <script>", "&lt;", "\u2028", "</SCRIPT >"]


class Commented(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        note = "<!-- a comment opener, </script> and <script> in a string"  # <!-- in a comment too -->
        return self.fc(x) if note else x


def test_any_text_in_a_models_source_keeps_the_static_pages_data_valid_json():
    schema = NNParser.parse_model(Commented().eval(), inputs_tensors_shapes={"x": (2, 4)})
    state = InspectorState(schema, {"x": torch.randn(2, 4)})
    try:
        page = static_page(state, title="".join(TRICKY), preface="".join(TRICKY))
    finally:
        state.close()
    (data,) = re.findall(r'<script type="application/json" id="nnsp-data">(.*?)</script>', page, re.S)
    assert "<" not in data and ">" not in data  # nothing in the payload can open or close an element
    payload = json.loads(data)  # and it is still JSON
    assert any("<!-- a comment opener, </script> and <script>" in json.dumps(v) for v in payload["sources"].values())
    assert payload["traits"]["title"] == "".join(TRICKY) if "title" in payload["traits"] else True
    assert page.count("</script>") == 2  # the data's and the module script's own


# -- a trace file whose shape overflows -----------------------------------------------------------


def test_a_trace_shape_whose_strides_overflow_is_a_typed_refusal(tmp_path):
    container = TensorContainer(shape=(0, 2, 2), dtype="torch.float32", value=torch.zeros(0, 2, 2),
                                container_id="blk_0001", slot_type="activation")
    step = TraceStep(1, "blk_0001", "a step", "activation", "v1", "torch.add", "blk", container)
    path = save_trace(ActivationTrace([step], root="Blk"), tmp_path / "t.safetensors")
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    huge = [0, 2 ** 61, 2 ** 61]
    header["blk_0001"]["shape"] = huge
    document = json.loads(header["__metadata__"]["trace"])
    document["steps"][0]["tensor"]["shape"] = huge
    header["__metadata__"]["trace"] = json.dumps(document)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    with pytest.raises(SchemaFormatError, match=r"the shape \[0, 2305843009213693952, 2305843009213693952\] is "
                                                r"larger than a tensor can be laid out"):
        load_trace(path)
