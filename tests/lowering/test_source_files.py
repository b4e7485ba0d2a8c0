"""Regression: the source of a forward is read from its own file, even when another file holds the same code.

CPython's code objects compare equal without their file name, so the lowering's source cache
(keyed by code object) gave a forward defined at the same line of a second file, with the same
bytecode, the first file's name and text: the schema (its signature, every instruction's location,
the schema file's table, a share's page) named the wrong file. Found when two test files defined
the same two-layer model.
"""

import importlib.util
import sys
import textwrap

import torch

from nnschemaparser import NNParser, SchemaInterpreter

SOURCE = textwrap.dedent('''
    from torch import nn


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            COMMENT
            return self.fc2(self.fc1(x).relu())
''')


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_same_forward_in_two_files_is_lowered_with_each_files_own_name_and_text(tmp_path):
    # a comment changes the text, not the bytecode: the two forwards' code objects compare equal
    first, second = tmp_path / "first_copy.py", tmp_path / "second_copy.py"
    first.write_text(SOURCE.replace("COMMENT", "# the first file"))
    second.write_text(SOURCE.replace("COMMENT", "# the second file"))
    try:
        models = [_load(first, "first_copy").TwoLayer(), _load(second, "second_copy").TwoLayer()]
        assert models[0].forward.__code__ == models[1].forward.__code__  # what made the cache share them
        schemas = [NNParser.parse_model(model=m, inputs_tensors_shapes={"x": (2, 16)}) for m in models]
    finally:
        sys.modules.pop("first_copy", None)
        sys.modules.pop("second_copy", None)
    for schema, path, comment in zip(schemas, (first, second), ("# the first file", "# the second file")):
        assert schema.signature.filename == str(path)
        assert comment in schema.signature.source
        assert {i.location.filename for i in schema.body if i.location is not None} == {str(path)}
    x = torch.randn(2, 16)
    for schema, model in zip(schemas, models):
        assert torch.equal(SchemaInterpreter().run(schema, {"x": x.clone()})[0], model(x))
