"""The seed's instruction contract for conditions (issue 26, point 5).

`ControlInstruction.condition` is the OpInstruction evaluating the test (or the iterable), its
`out_var` the `cond_var`; the instructions computing its operands are `prepare`, in order. Where no
op of its own computes the value last, `condition` is a named test (style "test") that only names
it: never run, never a step. Schema files keep that shape (format version 2) and refuse version 1.
"""

import json

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, TraceListener, dump_schema
from nnschemaparser.files.file_format import FormatVersionError
from nnschemaparser.files.schema_file import load_schema, save_schema, schema_to_json, schema_from_json
from nnschemaparser.lowering import intrinsics
from nnschemaparser.schema.model import (
    TEST_STYLE,
    BlockInstruction,
    ControlInstruction,
    FunctionInstruction,
    OpInstruction,
    TryInstruction,
    VarRef,
    WithInstruction,
    condition_instructions,
    is_named_test,
)


class Conditions(nn.Module):
    """One test of each shape: a plain name, a call, a short-circuit, container loops, a while."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x, flag: bool = True):
        if flag:  # a plain name: no instruction computes it
            x = x + 1
        if x.sum() > 0:  # a call: getattr, the call, then the comparison is the condition
            x = x * 2
        if x.mean() > 0 and flag:  # a short-circuit: its last instruction is an if
            x = x - 1
        for layer in self.layers:  # a container: the getattr is the condition
            x = layer(x)
        for layer in self.layers[1:]:  # a slice of a container: its entries' keys come last
            x = torch.relu(layer(x))
        squares = [v * v for v in x if v.sum() > 0]  # the comprehension's `.0` is a plain name
        n = 0
        while x.abs().max() > 0.1:  # re-evaluated before each iteration
            x = x / 2
            n = n + 1
        return x + len(squares), n


class Ran(TraceListener):
    """Every instruction a run executes, stepped or not (an `if` test included)."""

    def __init__(self):
        self.instructions = []

    def on_instruction(self, event):
        self.instructions.append(event.instruction)


def _inputs():
    torch.manual_seed(0)
    return {"x": torch.randn(2, 4) * 8}


def _controls(body):
    """Every ControlInstruction in a body, nested bodies, conditions and closures included."""
    for instr in body:
        if isinstance(instr, ControlInstruction):
            yield instr
            yield from _controls(instr.prepare)
            yield from _controls(instr.body)
            yield from _controls(instr.else_body)
        elif isinstance(instr, TryInstruction):
            for nested in (instr.body, *instr.handler_bodies, instr.else_body, instr.final_body):
                yield from _controls(nested)
        elif isinstance(instr, WithInstruction):
            yield from _controls(instr.body)
        elif isinstance(instr, FunctionInstruction) and instr.function is not None:
            yield from _controls(instr.function.body)


def _all_controls(schema):
    return [c for block in schema.iter_blocks() for c in _controls(block.body)]


def _shape(control):
    """What a condition is, comparable across a round trip."""
    cond = control.condition
    return (control.kind, control.cond_var, cond.out_var, cond.style, cond.qualified_name,
            [(type(i).__name__, i.out_var) for i in control.prepare])


def _assert_contract(control):
    cond = control.condition
    assert isinstance(cond, OpInstruction), control
    assert cond.out_var == control.cond_var
    run = condition_instructions(control)
    if is_named_test(cond):
        assert cond.target is intrinsics.assign and cond.args == [VarRef(control.cond_var)]
        assert run == control.prepare  # names the value: nothing more runs
        last = control.prepare[-1] if control.prepare else None
        assert not (isinstance(last, OpInstruction) and last.out_var == control.cond_var)
    else:
        assert run == [*control.prepare, cond]


def _parsed():
    torch.manual_seed(1)
    model = Conditions().eval()
    return model, NNParser.parse_model(model, inputs_tensors_values=_inputs())


def test_each_kind_of_test_gets_the_condition_the_contract_names():
    _, schema = _parsed()
    controls = _all_controls(schema)
    for control in controls:
        _assert_contract(control)
    top = [i for i in schema.body if isinstance(i, ControlInstruction)]
    plain, call, short, loop, sliced, while_ = top[0], top[1], top[2], top[3], top[4], top[5]
    assert plain.cond_var == "flag" and plain.prepare == [] and is_named_test(plain.condition)
    assert call.condition.display_name == ">" and [i.display_name for i in call.prepare] == ["getattr", "x.sum"]
    assert is_named_test(short.condition) and isinstance(short.prepare[-1], ControlInstruction)
    assert loop.condition.qualified_name == "builtins.getattr" and loop.prepare == []
    assert loop.iter_container == "layers"
    assert is_named_test(sliced.condition) and sliced.prepare[-1].display_name == "entry_keys"
    assert sliced.cond_var == sliced.prepare[1].out_var  # the slice is the iterable, its keys are computed after
    assert while_.kind == "while" and while_.condition.display_name == ">"
    comprehension = [c for c in controls if c.cond_var == ".0"]
    assert comprehension and all(is_named_test(c.condition) and c.prepare == [] for c in comprehension)


def test_a_round_trip_keeps_every_condition_and_its_prepare_list(tmp_path):
    model, schema = _parsed()
    path = save_schema(schema, tmp_path / "conditions.json")
    document = json.loads(path.read_text())
    control = next(i for i in document["root"]["signature"]["body"] if i["type"] == "control")
    assert document["version"] == 2 and control["prepare"] == [] and control["condition"]["style"] == TEST_STYLE
    expected = [_shape(c) for c in _all_controls(schema)]
    for loaded in (load_schema(path), load_schema(path, model=model)):
        controls = _all_controls(loaded)
        assert [_shape(c) for c in controls] == expected
        for control in controls:
            _assert_contract(control)
        assert dump_schema(loaded) == dump_schema(schema)
    bound = load_schema(path, model=model)
    got, want = SchemaInterpreter().call(bound, **_inputs()), model(**_inputs())
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_a_bound_load_keeps_the_resolved_value_of_each_condition(tmp_path):
    model, schema = _parsed()
    bound = load_schema(save_schema(schema, tmp_path / "conditions.json"), model=model)
    saved = [c.condition.resolved for c in _all_controls(schema)]
    assert [c.condition.resolved for c in _all_controls(bound)] == saved
    assert any(r is not None for r in saved)  # the ops that ran have their shape; named tests have none


def _as_version_1(document):
    """The document as version 1 wrote it: a control's condition was the list of what runs."""
    def convert(value):
        if isinstance(value, dict):
            if value.get("type") == "control":
                old = {k: convert(v) for k, v in value.items() if k not in ("prepare", "condition")}
                ran = value["prepare"] + ([] if value["condition"]["style"] == "test" else [value["condition"]])
                return {**old, "condition": [convert(i) for i in ran]}
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, list):
            return [convert(v) for v in value]
        return value

    old = convert(document)
    old["version"] = 1
    return old


def test_an_old_version_file_is_refused_naming_the_versions_and_the_fix(tmp_path):
    model, schema = _parsed()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_as_version_1(schema_to_json(schema))))
    for attempt in (lambda: load_schema(path), lambda: load_schema(path, model=model),
                    lambda: schema_from_json(json.loads(path.read_text()))):
        with pytest.raises(FormatVersionError) as info:
            attempt()
        message = str(info.value)
        assert "format version 1" in message and "reads version 2 only" in message
        assert "condition" in message and "prepare" in message
        assert "re-parse the model with NNParser.parse_model and save it again with save_schema" in message


# What step_run stepped on this model before conditions were split into prepare + condition (the
# schema of format version 1), recorded from that release: the same steps, in the same order.
STEPS_BEFORE = [
    'x', '$t7', '$t1', '', 'x', '$t1', '', 'x', '$t1', '', 'x', '$t8',
    '$t9', '$t10', '$layer_key', '$t1', '', '$t11', 'x', '$layer_key', '$t1', '', '$t11', 'x',
    '$t17', '$result', '$t15', '$t16', '$t15', '$t16', '', 'squares', 'n', '$t21', '$t20', '$t22',
    '$t19', '$t18', 'x', 'n', 'x', 'n', 'x', 'n', '$t23', '$t24', '',
]


def test_named_tests_are_never_run_or_stepped_and_the_steps_are_those_of_before():
    model, schema = _parsed()
    named = {id(c.condition) for c in _all_controls(schema) if is_named_test(c.condition)}
    assert named
    interpreter = SchemaInterpreter()
    steps = list(interpreter.step_run(schema, _inputs()))
    assert [s.out_var for s in steps] == STEPS_BEFORE
    assert [s.step_index for s in steps] == list(range(1, len(steps) + 1))
    assert not {id(s.instruction) for s in steps} & named
    ran = Ran()
    SchemaInterpreter(listeners=[ran]).call(schema, **_inputs())
    assert len(ran.instructions) == 74 and not {id(i) for i in ran.instructions} & named  # 74 before too
    got, want = interpreter.step_outputs, model(**_inputs())
    assert torch.equal(got[0], want[0]) and got[1] == want[1] == 3  # the while test ran 4 times


def test_the_dump_shows_prepare_then_the_condition_op_and_no_named_test():
    _, schema = _parsed()
    lines = [line.split("  -> ")[0].strip() for line in dump_schema(schema).splitlines()]
    at = lines.index("IF $t1:")
    assert lines[at - 3:at] == ["$t3 = getattr(x, 'sum')", "$t2 = x.sum()", "$t1 = $t2 > 0"]
    assert lines[lines.index("IF flag:") - 1] == "body:"  # a named test: nothing shown before the IF
    assert not any(line.startswith("TEST ") for line in lines)


def test_a_control_instruction_needs_an_op_binding_its_cond_var():
    with pytest.raises(TypeError, match="condition is an OpInstruction binding cond_var 'c'"):
        ControlInstruction(kind="if", cond_var="c")
    with pytest.raises(TypeError, match="binding 'other'"):
        ControlInstruction(kind="if", cond_var="c", condition=OpInstruction(out_var="other"))
    with pytest.raises(TypeError):
        ControlInstruction(kind="if", cond_var="c", condition=BlockInstruction(out_var="c"))


def test_every_condition_of_a_parsed_gpt2_is_an_op_binding_cond_var():
    from nnschemaparser.validation.zoo import get_case

    case = get_case("gpt2")
    model = case.build().eval()
    schema = NNParser.parse_model(model, inputs_tensors_values=case.make_inputs(model))
    controls = _all_controls(schema)
    assert len(controls) > 10
    for control in controls:
        assert isinstance(control.condition, OpInstruction)
        assert control.condition.out_var == control.cond_var
        _assert_contract(control)
    assert any(is_named_test(c.condition) for c in controls)
    assert any(not is_named_test(c.condition) for c in controls)
