"""Hardening found while securing schema files (issue 13, point 5): each case has its own test."""

import threading

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter
from nnschemaparser.schema.errors import EditError, ParseError, SchemaRunError


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 3)
        self.blocks = nn.ModuleList([nn.Linear(3, 3)])

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = self.fc2(h)
        for block in self.blocks:
            h = block(h)
        return h * 2


def _x():
    return torch.linspace(-1.0, 1.0, 8).reshape(2, 4)


def _parsed():
    torch.manual_seed(0)
    model = TwoLayer().eval()
    return model, NNParser.parse_model(model, inputs_tensors_values={"x": _x()})


@pytest.mark.parametrize("replace", ["fc2", "blocks.0"])
def test_a_sub_module_replaced_after_parse_is_followed_as_eager_follows_it(replace):
    model, schema = _parsed()
    assert torch.equal(SchemaInterpreter().call(schema, _x()), model(_x()))
    torch.manual_seed(1)
    if replace == "fc2":
        model.fc2 = nn.Linear(4, 3)
    else:
        model.blocks[0] = nn.Linear(3, 3)
    expected = model(_x())
    stepper = SchemaInterpreter()
    for got in (SchemaInterpreter().run(schema, {"x": _x()})[0], SchemaInterpreter().call(schema, _x())):
        assert torch.equal(got, expected)
    for _ in stepper.step_run(schema, {"x": _x()}):
        pass
    assert torch.equal(stepper.step_outputs[0], expected)


def test_a_sub_module_removed_after_parse_fails_as_eager_fails():
    model, schema = _parsed()
    del model.fc2
    with pytest.raises(AttributeError) as eager:
        model(_x())
    with pytest.raises(AttributeError) as ours:
        SchemaInterpreter().call(schema, _x())
    assert str(ours.value) == str(eager.value)


def test_call_passes_positional_inputs_positionally_to_root_pre_hooks():
    model, schema = _parsed()
    seen = []

    def pre_hook(module, args, kwargs):
        seen.append((len(args), sorted(kwargs)))
        return (args[0] * 3,), kwargs

    model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    expected = model(_x())
    got = SchemaInterpreter().call(schema, _x())
    assert torch.equal(expected, got)
    assert seen == [(1, []), (1, [])]


def test_call_refuses_an_input_given_positionally_and_by_keyword():
    _, schema = _parsed()
    with pytest.raises(SchemaRunError, match="both positionally and by keyword"):
        SchemaInterpreter().call(schema, _x(), x=_x())


@pytest.mark.parametrize("edits, message", [
    ({"5": []}, "not a step index"),
    ({0: [{"values": 1}]}, "not a step index"),
    ({True: [{"values": 1}]}, "not a step index"),
    ({2.0: [{"values": 1}]}, "not a step index"),
    ({2: "values"}, "must be an edit dict"),
    ({2: [{"value": torch.zeros(2, 4)}]}, "unknown key 'value'"),
    ({2: [{"shape": (2, 4)}]}, "needs 'values'"),
    ({2: [{"values": torch.zeros(2, 4), "frame_depth": True}]}, "frame_depth must be a non-negative int"),
    ([(2, {})], "edits must map"),
])
def test_step_run_edits_are_validated_before_the_first_step(edits, message):
    _, schema = _parsed()
    with pytest.raises(SchemaRunError, match=message):
        SchemaInterpreter().step_run(schema, {"x": _x()}, edits=edits)


def test_an_edit_for_a_step_that_never_comes_is_reported_at_the_end():
    model, schema = _parsed()
    interpreter = SchemaInterpreter()
    steps = interpreter.step_run(schema, {"x": _x()}, edits={10_000: [{"values": torch.zeros(2, 3)}]})
    with pytest.raises(EditError, match=r"step 10000 never applied: the run ended after \d+ steps"):
        for _ in steps:
            pass
    assert torch.equal(interpreter.step_outputs[0], model(_x()))


def test_step_info_edit_after_the_run_has_ended_raises():
    _, schema = _parsed()
    infos = list(SchemaInterpreter().step_run(schema, {"x": _x()}))
    last = infos[-2]
    before = last.scope_frames[last.frame_depth][last.out_var]
    with pytest.raises(EditError, match="the run has ended"):
        last.edit(values=torch.zeros_like(before))
    assert last.scope_frames[last.frame_depth][last.out_var] is before


def test_frame_depth_true_is_refused_not_read_as_frame_one():
    _, schema = _parsed()
    steps = SchemaInterpreter().step_run(schema, {"x": _x()})
    info = next(steps)
    with pytest.raises(EditError, match="frame_depth True is not visible"):
        info.edit(values=info.value, frame_depth=True)
    with pytest.raises(EditError, match="frame_depth True is not visible"):
        info.visible_names(frame_depth=True)
    steps.close()


def test_next_from_another_thread_gives_the_packages_own_error():
    _, schema = _parsed()
    steps = SchemaInterpreter().step_run(schema, {"x": _x()})
    next(steps)
    errors = []

    def advance():
        try:
            next(steps)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=advance)
    worker.start()
    worker.join()
    assert len(errors) == 1 and isinstance(errors[0], SchemaRunError), errors
    assert "thread that started it" in str(errors[0])


@pytest.mark.parametrize("shape, message", [
    ((2, -4), "negative dimension"),
    ((10 ** 6, 10 ** 6), "more than the"),
    ((2, 4.5), "tuple of ints"),
    ((2, True), "tuple of ints"),
    (4, "tuple of ints"),
])
def test_a_negative_or_absurd_input_shape_is_a_parse_error(shape, message):
    with pytest.raises(ParseError, match=message):
        NNParser.parse_model(TwoLayer(), inputs_tensors_shapes={"x": shape})
