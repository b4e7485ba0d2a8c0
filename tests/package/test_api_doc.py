"""docs/API.md is generated from the docstrings (docs/apidoc.py) and must match the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nnschemaparser
import nnschemaparser.widget

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _apidoc():
    spec = importlib.util.spec_from_file_location("apidoc", DOCS / "apidoc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_doc_is_what_the_docstrings_say_now():
    rendered = _apidoc().render()
    assert (DOCS / "API.md").read_text(encoding="utf-8") == rendered, \
        "docs/API.md is out of date: run python docs/apidoc.py"


def test_every_public_name_has_an_entry():
    text = (DOCS / "API.md").read_text(encoding="utf-8")
    for name in list(nnschemaparser.__all__) + list(nnschemaparser.widget.__all__):
        assert f"#### `{name}`" in text, name


def test_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch):
    apidoc = _apidoc()
    stale = tmp_path / "API.md"
    stale.write_text("# API reference\n", encoding="utf-8")
    monkeypatch.setattr(apidoc, "OUT", stale)
    assert apidoc.main(["--check"]) == 1
    assert apidoc.main([]) == 0 and apidoc.main(["--check"]) == 0
