"""A model defined in a notebook cell parses and runs: there `inspect.getsource(cls)` fails, but the
sources of its methods are available, and the parser reads methods, not classes."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

CELLS = [
    """
import inspect
import torch
from torch import nn
from nnschemaparser import NNParser, SchemaInterpreter, dump_schema
""",
    """
class CellModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.gate = nn.Linear(8, 8)

    def forward(self, x, scale: float = 2.0):
        gated = torch.sigmoid(self.gate(x))
        hidden = self.proj(x) * gated
        if hidden.sum() > 0:
            hidden = hidden * scale
        return [h.relu() for h in hidden.unbind(0)]
""",
    """
try:
    inspect.getsource(CellModel)
    class_source_available = True
except (OSError, TypeError):
    class_source_available = False
model = CellModel().eval()
x = torch.randn(3, 8)
schema = NNParser.parse_model(model=model, inputs_tensors_shapes={"x": (3, 8)})
outputs = SchemaInterpreter().call(schema, x=x)
expected = model(x)
exact = len(outputs) == len(expected) and all(torch.equal(a, b) for a, b in zip(outputs, expected))
names = {i.out_var for i in schema.body}
print("RESULT", class_source_available, exact, "gated" in names, "hidden" in names, sorted(schema.skipped))
""",
]


def test_model_defined_in_a_notebook_cell_parses_and_runs_exactly(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = notebook.cells[-1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    errors = [o for c in notebook.cells for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    line = next(l for l in text.splitlines() if l.startswith("RESULT"))
    # The class source is unavailable in a notebook, yet the schema parses its forward, keeps the
    # source names and runs bit-exactly with nothing skipped.
    assert line == "RESULT False True True True []"
