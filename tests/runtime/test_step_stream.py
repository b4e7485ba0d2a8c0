"""step_run's StepInfo stream on transformers GPT-2 and Llama, field by field, against a trace of the same run.

The reference is recorded by a listener on a plain observed run (the observer's event path, not the
stepper): every stepped instruction event, with its value cloned and the names of every live frame
at that moment. A stepped run must yield exactly that stream, whichever way the stepper is fed (its
direct hook, or events when another listener shares the run), and each StepInfo must show the run
paused at its own step: its frames hold what they held then, and its value is the one its frame binds.
"""

import copy
import dataclasses

import pytest
import torch

from nnschemaparser import NNParser, SchemaInterpreter, StepInfo, TraceListener
from nnschemaparser.schema.errors import SchemaRunError
from nnschemaparser.schema.model import ReturnInstruction
from tests.support.compile_faults import tiny_gpt2, tiny_llama

PLAIN = (int, float, bool, str, bytes, type(None), torch.Size, torch.dtype, torch.device, slice, type)
FIELDS = ("step_index", "kind", "out_var", "frame_depth", "value", "scope_frames", "instruction", "block_path",
          "location")


def _frozen(value):
    """What the value was at this moment: tensors cloned, containers walked."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_frozen(v) for v in value) if type(value) in (tuple, list) else value
    return value


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if type(a) in (tuple, list) and type(b) is type(a):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, PLAIN):
        return a == b
    # an object made by the run (a bound method of this run's dict, an output record): the two runs
    # made one each, so they agree on its type and, for a method, on its name
    return getattr(a, "__name__", None) == getattr(b, "__name__", None)


class Reference(TraceListener):
    """Every stepped instruction of a run, as a StepInfo would show it at that moment."""

    def __init__(self):
        self.rows = []

    def on_instruction(self, event):
        if not event.stepped:
            return
        instr = event.instruction
        self.rows.append({
            "step_index": len(self.rows) + 1,
            "kind": type(instr).__name__.replace("Instruction", "").lower(),
            "out_var": instr.out_var,
            "frame_depth": event.depth,
            "value": _frozen(event.value if event.has_value or isinstance(instr, ReturnInstruction) else None),
            "frames": [sorted(frame) for frame in event.frames],
            "instruction": instr,
            "block_path": event.path,
            "location": instr.location,
        })


class Other(TraceListener):
    """A second instruction listener: the stepper then hears events instead of its direct hook."""

    def __init__(self):
        self.count = 0

    def on_instruction(self, event):
        self.count += 1


def _check_stream(schema, inputs, listeners):
    reference = Reference()
    SchemaInterpreter(listeners=[reference]).run(schema, dict(inputs))
    rows = reference.rows
    assert len(rows) > 100
    interpreter = SchemaInterpreter(listeners=listeners)
    seen = 0
    for step in interpreter.step_run(schema, dict(inputs)):
        assert type(step) is StepInfo
        row = rows[seen]
        seen += 1
        where = f"step {step.step_index} ({row['block_path']}:{row['out_var']})"
        for name in ("step_index", "kind", "out_var", "frame_depth", "block_path", "location"):
            assert getattr(step, name) == row[name], f"{where}: {name} {getattr(step, name)!r} != {row[name]!r}"
        assert step.instruction is row["instruction"], where
        assert _same(step.value, row["value"]), f"{where}: value differs"
        assert [sorted(frame) for frame in step.scope_frames] == row["frames"], f"{where}: frames differ"
        assert step.source == (str(row["location"]) if row["location"] is not None else "")
        frame = step.scope_frames[step.frame_depth]
        if step.out_var and step.kind not in ("return", "delete") and step.out_var in frame:
            assert frame[step.out_var] is step.value, f"{where}: the value is not the one its frame binds"
        assert [f.name for f in dataclasses.fields(step)][:len(FIELDS)] == list(FIELDS)
    assert seen == len(rows)
    return interpreter.step_outputs


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_step_stream_equals_the_trace_of_the_same_run(factory):
    model, inputs = factory(layers=2)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        for listeners in ([], [Other()]):
            outputs = _check_stream(schema, inputs, listeners)
            assert torch.equal(outputs[0].last_hidden_state, expected)


def test_step_stream_edits_apply_at_the_same_step_on_llama():
    model, inputs = tiny_llama(layers=1)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with torch.no_grad():
        steps = [(s.step_index, s.out_var, s.value) for s in SchemaInterpreter().step_run(schema, dict(inputs))]
        index, name, value = next((i, n, v) for i, n, v in steps[len(steps) // 2:]
                                  if isinstance(v, torch.Tensor) and v.is_floating_point())
        zeros = torch.zeros_like(value)
        forked = SchemaInterpreter()
        seen = {}
        for step in forked.step_run(schema, dict(inputs), edits={index: [{"values": zeros}]}):
            seen[step.step_index] = step.value
        assert torch.equal(seen[index], zeros)
        live = SchemaInterpreter()
        for step in live.step_run(schema, dict(inputs)):
            if step.step_index == index:
                assert step.out_var == name
                step.edit(values=zeros)
        assert torch.equal(live.step_outputs[0].last_hidden_state, forked.step_outputs[0].last_hidden_state)
        assert not torch.equal(forked.step_outputs[0].last_hidden_state, model(**inputs).last_hidden_state)


def test_step_info_reads_kind_out_var_depth_and_location_yet_copies_and_replaces_as_a_dataclass():
    model, inputs = tiny_gpt2(layers=1)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with torch.no_grad():
        steps = list(SchemaInterpreter().step_run(schema, dict(inputs)))
    step = next(s for s in steps if s.frame_depth > 0 and s.kind == "op" and isinstance(s.value, torch.Tensor))
    # what a step does not store is its instruction's and its frames', read when asked for
    assert step.kind == "op" and step.out_var == step.instruction.out_var
    assert step.location is step.instruction.location
    assert step.frame_depth == len(step.scope_frames) - 1
    assert copy.copy(step) == step and copy.copy(step).kind == step.kind
    doubled = dataclasses.replace(step, value=step.value * 2)
    assert torch.equal(doubled.value, step.value * 2) and doubled.out_var == step.out_var
    assert doubled.frame_depth == step.frame_depth and doubled._run is None
    assert "kind='op'" in repr(step) and f"frame_depth={step.frame_depth}" in repr(step)
    other = next(s for s in steps if s.kind != "op")
    with pytest.raises(SchemaRunError, match="kind is read from the instruction"):
        dataclasses.replace(step, kind=other.kind)
    with pytest.raises(SchemaRunError, match="frame_depth is read from the frames"):
        dataclasses.replace(step, frame_depth=step.frame_depth + 1)
    moved = dataclasses.replace(step, instruction=other.instruction, kind=other.kind, out_var=other.out_var,
                                location=other.location)
    assert moved.kind == other.kind and moved.location is other.location
    # a step keeps its instruction's site (the generated function's list, an index), not the instruction
    assert step.instruction is step._sites[step._site] and len(step._sites) > 1
    placed = copy.copy(step)
    placed.instruction = other.instruction
    assert placed.instruction is other.instruction and placed.kind == other.kind and step.kind == "op"


class _Statements(torch.nn.Module):
    """Steps of every kind of value: an op's tensor, a non-tensor, an expression statement, a
    `del`, a closure's own steps, an in-place call, and two returns (one per branch)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, flag: bool = True):
        h = self.fc(x)
        n = h.shape[-1] * 2
        scratch = h + n
        scratch.mul_(0.5)
        del scratch
        h.size()
        double = lambda t: t * 2  # noqa: E731
        h = double(h)
        if flag:
            return h.relu()
        return h - 1, n


@pytest.mark.parametrize("flag", [True, False])
def test_a_step_value_is_what_the_frame_binds_for_every_kind_of_instruction(flag):
    """The stepped program passes its observer each step's value itself (the variable read with its
    name in the generated code, the return slot for a return, None otherwise): a step shows what the
    event path, which reads the instruction, shows at the same instruction, in every frame."""
    torch.manual_seed(0)
    model, x = _Statements(), torch.randn(2, 4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x, "flag": flag})
    reference = Reference()
    with torch.no_grad():
        SchemaInterpreter(listeners=[reference]).run(schema, {"x": x, "flag": flag})
        alone = SchemaInterpreter()
        steps = [(s.kind, s.out_var, _frozen(s.value)) for s in alone.step_run(schema, {"x": x, "flag": flag})]
        expected = model(x, flag)
    kinds = {kind for kind, _, _ in steps}
    assert {"op", "block", "function", "return", "delete"} <= kinds, kinds
    assert any(value is None for _, _, value in steps), "a step that binds nothing shows None"
    assert len(steps) == len(reference.rows)
    for (kind, out_var, value), row in zip(steps, reference.rows):
        assert (kind, out_var) == (row["kind"], row["out_var"])
        assert _same(value, row["value"]), f"{kind} {out_var!r}: {value!r} != {row['value']!r}"
    outputs = alone.step_outputs
    assert _same(outputs[0], expected) if flag else _same(tuple(outputs), expected)
