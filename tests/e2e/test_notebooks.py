"""Every notebook in notebooks/ runs top to bottom (each starts its own local Spark)."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT, only_local

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    assert any(p.endswith("01_ensembles.ipynb") for p in NOTEBOOKS)


@only_local
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "Error" not in outputs
