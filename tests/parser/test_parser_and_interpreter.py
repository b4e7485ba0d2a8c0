"""Core behaviour of parse_model and SchemaInterpreter beyond single constructs: fallback of children
the lowering cannot express, state preservation, error notes, capture, dump and trace formats."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.support.exactness import assert_schema_matches_eager

from nnschemaparser import (
    NNParser,
    ParseError,
    SchemaInterpreter,
    SchemaRunError,
    TensorReprWithValue,
    TraceRecorder,
    UnsupportedSyntaxError,
    dump_schema,
)
from nnschemaparser.examples.mlp import MLP
from nnschemaparser.lowering.statements import lower_source


class UsesMatch(nn.Module):
    def forward(self, x, mode: str = "double"):
        match mode:
            case "double":
                return x * 2
            case _:
                return x


class UsesGeneratorForward(nn.Module):
    def forward(self, x):
        yield x * 2


class HasAwkwardChildren(nn.Module):
    def __init__(self):
        super().__init__()
        self.matcher = UsesMatch()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.matcher(x))


def test_child_with_match_statement_is_skipped_with_reason_and_outputs_still_match():
    schema = assert_schema_matches_eager(HasAwkwardChildren(), {"x": torch.randn(2, 4)})
    assert list(schema.skipped) == ["matcher"]
    assert "Match" in schema.skipped["matcher"] and "test_parser_and_interpreter.py" in schema.skipped["matcher"]
    assert schema.sub_blocks["fc"].skip_reason is None


def test_a_delegating_generator_is_refused_by_the_lowering():
    with pytest.raises(UnsupportedSyntaxError, match="yield from"):
        lower_source("def forward(self, x):\n    yield from x\n")


def test_a_nested_generator_function_is_refused_by_the_lowering():
    with pytest.raises(UnsupportedSyntaxError, match="generator function"):
        lower_source("def forward(self, x):\n    def inner():\n        yield x\n    return list(inner())\n")


def test_lowering_keeps_source_names_and_numbers_temporaries():
    fn = lower_source("def forward(x):\n    hidden = x.relu()\n    return hidden + 1\n")
    names = [i.out_var for i in fn.body]
    assert names == ["$t1", "hidden", "$t2", ""]


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.register_buffer("calls", torch.zeros(()))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        return self.drop(self.fc(self.bn(x)))


@pytest.mark.parametrize("train", [False, True])
def test_parsing_leaves_parameters_buffers_modes_and_rng_unchanged(train):
    model = Stateful().train(train)
    model.bn.eval()  # a mixed tree of modes must come back as it was
    before = copy.deepcopy(model.state_dict())
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    NNParser.parse_model(model=model, inputs_tensors_shapes={"x": (8, 4)})
    assert [m.training for m in model.modules()] == modes
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_buffers_mutate_exactly_as_in_eager():
    assert_schema_matches_eager(Stateful(), {"x": torch.randn(8, 4)}, train=True)


class RaisesInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        hidden = self.fc(x)
        return hidden @ x  # shape mismatch for (2, 4) @ (2, 4)


def test_model_exception_keeps_its_type_with_a_note_naming_instruction_and_line():
    model = RaisesInside()
    schema = NNParser.parse_model(model=model, resolve=False)
    with pytest.raises(RuntimeError) as info:
        SchemaInterpreter().call(schema, x=torch.randn(2, 4))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    # the note shows the source the user wrote, not the lowered form (`$t1 = hidden @ x`)
    assert "`hidden @ x`" in notes and "$t1" not in notes
    assert "test_parser_and_interpreter.py:" in notes and "RaisesInside.forward" in notes


def test_eager_failure_during_parse_is_reported_as_the_models_own_error():
    with pytest.raises(ParseError, match="in eager mode too"):
        NNParser.parse_model(model=RaisesInside(), inputs_tensors_shapes={"x": (2, 4)})


def test_capture_values_fills_resolved_with_detached_snapshots():
    model = MLP(16, 8, 4).eval()
    x = torch.randn(2, 16, requires_grad=True)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    outputs = SchemaInterpreter(capture_values=True).run(block=schema, scope={"x": x})
    hidden = next(i for i in schema.body if i.out_var == "hidden")
    assert isinstance(hidden.resolved, TensorReprWithValue)
    assert not hidden.resolved.value.requires_grad
    assert torch.equal(hidden.resolved.value, model.fc1(x).detach())
    assert torch.equal(outputs[0], model(x))


def test_bad_inputs_get_errors_that_name_the_fix():
    with pytest.raises(ParseError, match="construct it first"):
        NNParser.parse_model(model=MLP, inputs_tensors_shapes={"x": (2, 784)})
    with pytest.raises(ParseError, match="inputs_tensors_shapes"):
        NNParser.parse_model(model=MLP())
    with pytest.raises(ParseError, match="unknown dtype"):
        NNParser.parse_model(model=MLP(), inputs_tensors_shapes={"x": (2, 784)}, inputs_tensors_dtypes={"x": "f33"})
    schema = NNParser.parse_model(model=MLP(), resolve=False)
    with pytest.raises(SchemaRunError, match="missing the input 'x'"):
        SchemaInterpreter().run(block=schema, scope={})
    with pytest.raises(SchemaRunError, match="does not take"):
        SchemaInterpreter().run(block=schema, scope={"x": torch.randn(1, 784), "y": 1})


def test_dump_and_trace_follow_the_documented_format(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(2, 784)
    schema = NNParser.parse_model(model=model, inputs_tensors_shapes={"x": (2, 784)},
                                  inputs_tensors_dtypes={"x": "torch.float32"}, inputs_tensors_values={"x": x})
    text = dump_schema(schema=schema, path=tmp_path / "schema.txt")
    first_block = text.split("\n\n")[0]
    assert first_block == "\n".join([
        "=== BLOCK MLP ===", "inputs:", "  - x = torch.float32[2, 784]", "outputs:", "  - torch.float32[2, 10]",
        "weights:", "  (none)", "sub-blocks:", "  - fc1(Linear)", "  - fc2(Linear)", "body:",
        "  hidden = CALL fc1(x)  -> torch.float32[2, 256]",
        "  $t1 = getattr(hidden, 'relu')  -> builtin_function_or_method",
        "  activated = hidden.relu()  -> torch.float32[2, 256]",
        "  $t2 = CALL fc2(activated)  -> torch.float32[2, 10]",
        "  RETURN $t2"])
    tracer = TraceRecorder()
    SchemaInterpreter(capture_values=True, listeners=[tracer]).run(block=schema, scope={"x": x})
    tracer.save(tmp_path / "trace.txt")
    lines = (tmp_path / "trace.txt").read_text().splitlines()
    stats = f"abs_sum={x.double().abs().sum().item():.4f} min={x.min().item():.4f} max={x.max().item():.4f}"
    assert lines[0] == "[00001] ENTER BLOCK MLP"
    assert lines[1] == f"[00002]   in x = torch.float32[2, 784] {stats}"
    assert lines[2] == "[00003]   ENTER BLOCK Linear"
    assert lines[4].startswith("[00005]     $t1 = F.linear(input, weight, bias)  [torch.float32[2, 256] abs_sum=")
    assert lines[5].startswith("[00006]   EXIT BLOCK Linear -> (torch.float32[2, 256] abs_sum=")
    assert lines[6].startswith("[00007]   hidden = CALL fc1 [Linear]  [torch.float32[2, 256] abs_sum=")


def test_make_demo_entry_point_writes_both_files_and_reports_exactness(tmp_path, capsys):
    from nnschemaparser.examples.demo import main

    assert main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "schema.txt").read_text().startswith("=== BLOCK MLP ===")
    assert (tmp_path / "trace.txt").read_text().startswith("[00001] ENTER BLOCK MLP")
    printed = capsys.readouterr().out
    assert "bit for bit: True" in printed
    page = (tmp_path / "inspector.html").read_text()
    assert (tmp_path / "inspector.html").resolve().as_uri() in printed and "make lab" in printed
    assert "fork 1" in page and "compare_pairs" in page


def test_random_inputs_from_shapes_and_dtypes_alone_are_enough():
    class Embeds(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8, 4)

        def forward(self, ids, mask):
            return self.emb(ids) * mask.unsqueeze(-1)

    schema = NNParser.parse_model(model=Embeds(), inputs_tensors_shapes={"ids": (2, 3), "mask": (2, 3)},
                                  inputs_tensors_dtypes={"ids": "torch.int64", "mask": "torch.bool"})
    assert schema.inputs["ids"].dtype == "torch.int64" and schema.inputs["mask"].dtype == "torch.bool"
    assert schema.outputs[0].shape == (2, 3, 4)


def test_source_that_no_longer_matches_the_code_is_refused_not_misread(tmp_path):
    namespace: dict = {}
    source = "import torch\nfrom torch import nn\n\nclass Borrowed(nn.Module):\n    def forward(self, x):\n        return x * 3\n"
    decoy = tmp_path / "decoy.py"
    decoy.write_text("\n" * 4 + "def something_else(self, x):\n    return x * 5\n")
    exec(compile(source, str(decoy), "exec"), namespace)  # code whose filename points at other text
    model = namespace["Borrowed"]()
    schema = NNParser.parse_model(model=model, inputs_tensors_shapes={"x": (2,)})
    assert schema.skip_reason is not None and "not 'forward'" in schema.skip_reason
    x = torch.randn(2)
    assert torch.equal(SchemaInterpreter().call(schema, x=x), x * 3)
