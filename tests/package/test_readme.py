"""The README's Python examples run as written, in order, and the quick start prints what it shows."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run_in_order(tmp_path, monkeypatch):
    import runpy

    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 3
    script = tmp_path / "readme_examples.py"  # a real file: the parser reads forward sources from files
    script.write_text("\n\n".join(blocks))
    namespace = runpy.run_path(str(script))
    dump = (tmp_path / "schema.txt").read_text()
    shown = re.search(r"`schema.txt` starts with:\n\n```\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert dump.startswith(shown)
    assert namespace["widget"].step_index == 3
    diffs = namespace["diffs"]
    assert namespace["first_divergence"](diffs) is not None
    assert torch.equal(namespace["outputs"][0], namespace["model"](namespace["x"]))
