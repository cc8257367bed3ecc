"""The exploration notebook runs headless, so it never rots."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (a Jupyter kernel runs the notebook)

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "explore_audit.ipynb"


def test_notebook_executes() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    printed = [output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.get("outputs", [])]
    assert any("included: ['code_heavy_tail@2', 'gsm8k@2', 'math@2']" in text
               for text in printed)
