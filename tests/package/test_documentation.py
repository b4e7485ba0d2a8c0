"""docs/DOCUMENTATION.md: its Python recipes run in order, and its instruction reference is complete."""

from __future__ import annotations

import dataclasses
import re
import runpy
from pathlib import Path

import nnschemaparser.schema.model as model_module

DOC = Path(__file__).resolve().parents[2] / "docs" / "DOCUMENTATION.md"


def test_documentation_recipes_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 6
    script = tmp_path / "documentation_recipes.py"  # a real file: the parser reads forward sources from files
    script.write_text("\n\n".join(blocks))
    namespace = runpy.run_path(str(script))
    assert namespace["spec"].config_type.endswith("Config")


def test_instruction_reference_lists_every_instruction_and_its_fields():
    text = DOC.read_text(encoding="utf-8")
    table = {row.split("|")[1].strip(): row for row in text.splitlines() if row.startswith("| `")}
    instructions = [cls for cls in vars(model_module).values()
                    if isinstance(cls, type) and issubclass(cls, model_module.Instruction)
                    and cls is not model_module.Instruction]
    for cls in instructions:
        row = next((r for key, r in table.items() if f"`{cls.__name__}`" in key), None)
        assert row is not None, f"{cls.__name__} is missing from the instruction reference"
        shared = {f.name for f in dataclasses.fields(model_module.Instruction)}
        for field in dataclasses.fields(cls):
            if field.name not in shared:
                assert f"`{field.name}`" in row, f"{cls.__name__}.{field.name} is missing from its row"
