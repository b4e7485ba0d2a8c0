"""Generated functions point at the user's code: tracebacks, profilers and the generated text.

The runtime compiles each forward to a real Python function whose code carries the user's file name
and, line by line, the position of the instruction it runs (runtime/codegen.py). These tests check
what a user sees through that: the traceback of an error inside an interpreted forward, cProfile's
attribution, the text `source_code` returns, and that compiled programs live outside the schema.
"""

from __future__ import annotations

import cProfile
import gc
import inspect
import pstats
import traceback
import weakref

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run, source_code


class Reshapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        hidden = self.proj(x)
        doubled = hidden * 2
        return doubled.view(3, 7)  # 12 elements: view fails


class WithClosure(nn.Module):
    def forward(self, x):
        scale = 3
        parts = [t * scale for t in x]
        return torch.stack(parts).view(5, 5)  # 12 elements: view fails


FAILING_LINE = "return doubled.view(3, 7)  # 12 elements: view fails"


def _line_of(cls: type, text: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _schema(model: nn.Module, x: torch.Tensor):
    return NNParser.parse_model(model=model, inputs_tensors_values={"x": x}, verify=False, resolve=False)


@pytest.mark.parametrize("how", ["run", "capture"])
def test_an_error_inside_an_interpreted_forward_has_a_frame_with_the_users_file_line_and_text(how):
    model = Reshapes().eval()
    schema = _schema(model, torch.randn(3, 4))
    with pytest.raises(RuntimeError) as caught:
        if how == "run":
            SchemaInterpreter().run(schema, {"x": torch.randn(3, 4)})
        else:
            capture_run(schema, {"x": torch.randn(3, 4)})
    frames = traceback.extract_tb(caught.value.__traceback__)
    ours = [fr for fr in frames if fr.filename == __file__ and fr.name == "forward"]
    assert ours, [f"{fr.filename}:{fr.lineno} {fr.name}" for fr in frames]
    assert ours[-1].lineno == _line_of(Reshapes, FAILING_LINE)
    assert ours[-1].line == FAILING_LINE
    assert not any("nnschemaparser call" in fr.filename for fr in frames)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "`doubled.view(3, 7)`" in notes and "Reshapes.forward" in notes and "$t" not in notes


def test_a_forward_keeping_a_frame_for_its_closures_points_at_the_users_line_too():
    model = WithClosure().eval()
    schema = _schema(model, torch.randn(3, 4))
    with pytest.raises(RuntimeError) as caught:
        SchemaInterpreter().run(schema, {"x": torch.randn(3, 4)})
    ours = [fr for fr in traceback.extract_tb(caught.value.__traceback__) if fr.filename == __file__]
    assert ours[-1].lineno == _line_of(WithClosure, "torch.stack(parts)")
    assert ours[-1].line.startswith("return torch.stack(parts).view(5, 5)")


def test_cprofile_attributes_the_interpreted_forward_to_the_models_own_file_and_line():
    model = Reshapes().eval()
    x = torch.randn(3, 4)
    schema = _schema(model, x)
    interpreter = SchemaInterpreter()
    profile = cProfile.Profile()
    profile.enable()
    try:
        interpreter.call(schema.sub_blocks["proj"], x)
    finally:
        profile.disable()
    entries = pstats.Stats(profile).stats
    linear_forward = inspect.getsourcefile(nn.Linear.forward)
    hits = [key for key in entries if key[0] == linear_forward and key[2] == "forward"]
    assert hits and hits[0][1] == inspect.getsourcelines(nn.Linear.forward)[1]


def test_source_code_reads_like_the_forward_with_its_names():
    model = Reshapes().eval()
    schema = _schema(model, torch.randn(3, 4))
    text = source_code(schema)
    assert text.startswith("def forward(self, x):")
    assert "hidden = " in text and "doubled = hidden * 2" in text and "= doubled.view\n" in text
    assert "f[" not in text  # a plain run keeps its variables as fast locals
    compile(text, "<generated>", "exec")
    observed = source_code(schema, observed=True)
    assert "f['doubled'] = f['hidden'] * 2" in observed and "_after(" in observed
    linear = source_code(schema.sub_blocks["proj"])
    assert "weight = " in linear and "_globals['F'].linear(input, weight, bias)" in linear  # F read live, as CPython reads it


def test_compiled_programs_and_caches_live_outside_the_schema_and_go_with_it():
    model = Reshapes().eval()
    x = torch.randn(3, 4)
    schema = _schema(model, x)
    schema.sub_blocks["proj"].body  # noqa: B018 - the schema as parsed
    before = [set(vars(block)) for block in schema.iter_blocks()]
    with pytest.raises(RuntimeError):
        SchemaInterpreter().run(schema, {"x": x})
    linear = schema.sub_blocks["proj"]
    record = capture_run(linear, {"input": x})
    steps = list(SchemaInterpreter().step_run(linear, {"input": x}))
    assert [set(vars(block)) for block in schema.iter_blocks()] == before  # nothing cached in the schema
    ref = weakref.ref(schema)
    del schema, linear, record, steps
    gc.collect()
    assert ref() is None  # the programs and description caches kept for it did not keep it alive


MODEL_FILE = '''
import torch
from torch import nn


class FromAFile(nn.Module):
    def forward(self, x):
        wide = x * 2
        return wide.view(5, 5)
'''


def test_a_traceback_shows_the_line_written_even_when_the_models_file_is_gone(tmp_path, monkeypatch):
    import importlib
    import linecache
    import sys

    path = tmp_path / "gone_model.py"
    path.write_text(MODEL_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("gone_model")
    try:
        model = module.FromAFile()
        schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(3, 4)}, verify=False,
                                      resolve=False)
        path.unlink()
        linecache.clearcache()  # nothing left to read the file from
        with pytest.raises(RuntimeError) as caught:
            SchemaInterpreter().run(schema, {"x": torch.randn(3, 4)})
        ours = [fr for fr in traceback.extract_tb(caught.value.__traceback__) if fr.filename == str(path)]
        assert ours and ours[-1].lineno == 9 and ours[-1].line == "return wide.view(5, 5)"
    finally:
        sys.modules.pop("gone_model", None)
