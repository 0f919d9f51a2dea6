"""Every notebook in notebooks/ runs top to bottom (each starts its own local Spark) and prints and
draws what it stores: the stored outputs are fresh (nbwrite.differences finds nothing).  A pass of
its own (``make test-notebooks``): each notebook starts its own Spark."""

import copy
import glob
import os
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    assert any(p.endswith("01_ensembles.ipynb") for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_and_its_stored_outputs_are_fresh(path, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "notebooks", "src"))
    import nbwrite

    stored = nbformat.read(path, as_version=4)
    nb = copy.deepcopy(stored)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "Error" not in outputs
    stale = nbwrite.differences(stored, nbwrite.clean(nb))
    assert not stale, f"{os.path.basename(path)}: stored outputs are stale, run `make notebooks`: {stale}"
