"""The generated functions (runtime/codegen.py) keep the execution rules of every program mode.

A capture whose listeners want tensor results only runs a program that calls the observer only
where a tensor was bound (and fuses method fetches); its trace must be the trace of the
every-instruction program, step for step. Errors inside a generated body still name the failing
instruction, and the keyword-binding plans still raise CPython's own TypeError.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter
from nnschemaparser.runtime.listeners import TraceListener
from nnschemaparser.traces.recorder import ActivationRecorder


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x, *, bias=None, **extra):
        h = self.proj(x).view(2, 4, 2).transpose(1, 2)
        h = h.reshape(2, 8) * self.scale + (bias if bias is not None else 0)
        h.add_(1.0)
        if h.sum() > 0:
            h = -h
        return h[0] + h[1], extra.get("tag")


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        outs = []
        for block in self.blocks:
            y, _ = block(x, bias=x, tag="t")
            outs.append(y)
            x = x + y
        return torch.stack(outs)


class EveryInstruction(TraceListener):
    """A listener that wants every instruction: it forces the every-instruction program."""

    every_instruction = True

    def __init__(self) -> None:
        self.count = 0

    def on_instruction(self, event) -> None:
        self.count += 1


def _trace(schema, inputs, extra=()):
    recorder = ActivationRecorder()
    out = SchemaInterpreter(listeners=[recorder, *extra]).run(block=schema, scope=dict(inputs))
    return out, recorder.trace.steps


def test_tensor_results_capture_records_the_same_steps_as_the_every_instruction_program():
    torch.manual_seed(0)
    model = Stack().eval()
    inputs = {"x": torch.randn(2, 8)}
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with torch.no_grad():
        eager = model(**inputs)
        fast_out, fast = _trace(schema, inputs)
        every = EveryInstruction()
        slow_out, slow = _trace(schema, inputs, [every])
    assert every.count > len(slow)  # the second run really observed every instruction
    assert torch.equal(fast_out[0], eager) and torch.equal(slow_out[0], eager)
    assert len(fast) == len(slow) > 0
    for a, b in zip(fast, slow):
        assert (a.container_id, a.description, a.op_name, a.out_var, a.block_path, a.frame_depth) == \
               (b.container_id, b.description, b.op_name, b.out_var, b.block_path, b.frame_depth)
        assert torch.equal(a.tensor.value, b.tensor.value)
    # a fused method call still describes the method it called
    assert any(step.op_name == "Tensor.view" for step in fast)


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        z = y + 1
        return z.view(3, 7)


def test_an_error_inside_a_generated_body_names_the_failing_instruction():
    model = Failing().eval()
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(3, 4)}, verify=False,
                                  resolve=False)
    with pytest.raises(RuntimeError) as caught:
        SchemaInterpreter().run(block=schema, scope={"x": torch.randn(3, 4)})
    notes = getattr(caught.value, "__notes__", [])
    assert any("view" in note and "Failing.forward" in note for note in notes), notes


class Keywords(nn.Module):
    def forward(self, x, y=2, *, scale=3, **rest):
        return x * y * scale + len(rest)


class CallsKeywords(nn.Module):
    def __init__(self, **call) -> None:
        super().__init__()
        self.inner = Keywords()
        self.call = call

    def forward(self, x):
        return self.inner(x, **self.call)


@pytest.mark.parametrize("call", [{"y": 1, "scale": 2, "other": 5}, {"scale": 2}, {}])
def test_keyword_binding_plans_bind_as_python_does(call):
    model = CallsKeywords(**call)
    x = torch.ones(2)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


def test_keyword_binding_plans_raise_pythons_error_for_a_keyword_given_twice():
    model = CallsKeywords(x=1)
    x = torch.ones(2)
    with pytest.raises(TypeError) as eager:
        model(x)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x}, resolve=False, verify=False)
    with pytest.raises(TypeError) as ours:
        SchemaInterpreter().run(block=schema, scope={"x": x})
    assert str(ours.value) == str(eager.value)


def test_ifs_nested_deeper_than_the_generated_code_may_indent_run_as_python_does(tmp_path, monkeypatch):
    """Past 24 levels an `if` stays a closure (whose own body is generated again): Python's parser
    limits indentation, and 40 nested ifs must still run, capture and match eager."""
    depth = 40
    lines = ["import torch", "from torch import nn", "", "class Deep(nn.Module):", "    def forward(self, x):"]
    for level in range(depth):
        lines.append("        " + "    " * level + f"if x.sum() > {-1000 - level}:")
    lines.append("        " + "    " * depth + "x = x + 1")
    lines.append("        return x * 2")
    (tmp_path / "deep_ifs_module.py").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("deep_ifs_module")
    model, x = module.Deep(), torch.randn(3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    assert not schema.skipped
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))
    recorder = ActivationRecorder()
    SchemaInterpreter(listeners=[recorder]).run(block=schema, scope={"x": x})
    assert len(recorder.trace.steps) > depth  # every test's sum and comparison was recorded
