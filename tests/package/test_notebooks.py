"""Every notebook in notebooks/ runs clean, top to bottom, in a fresh kernel (nbclient)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def test_the_four_guides_are_there():
    names = {path.name for path in NOTEBOOKS}
    assert {"quickstart.ipynb", "stepping_and_editing.ipynb", "comparing_runs.ipynb",
            "transformers_moe.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_clean(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    assert book.metadata.get("kernelspec") == KERNELSPEC
    client = nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and the traceback, on any error
    for index, cell in enumerate(book.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", f"cell {index} of {path.name} failed"
            if output.get("name") == "stderr":
                text = output.get("text", "")
                assert "Traceback" not in text and "Warning" not in text, f"cell {index} of {path.name}: {text}"
