"""Stored notebooks and documented figures cannot silently rot: each notebook holds the outputs of the
cells its make script defines (every code cell, at least one figure, small), a changed cell is
caught, and each figure of the docs is what its benchmark command draws from the series stored beside it."""

import copy
import glob
import json
import os
import re
import runpy
import sys

import nbformat
import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "notebooks", "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import nbwrite  # noqa: E402

MAKERS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "src", "make_*.py")))
TOTAL_BYTES = 3 * 2**20  # every stored notebook together


def _stored(maker):
    cells = runpy.run_path(maker)["cells"]  # not run as __main__: defines the cells only
    name = next(
        p for p in glob.glob(os.path.join(ROOT, "notebooks", os.path.basename(maker)[5:7] + "_*.ipynb"))
    )
    return cells, name, nbformat.read(name, as_version=4)


@pytest.mark.parametrize("maker", MAKERS, ids=os.path.basename)
def test_each_notebook_holds_the_outputs_of_its_cells(maker):
    cells, name, nb = _stored(maker)
    assert nb.metadata["sparkml_dist"]["cells_sha256"] == nbwrite.digest(cells), (
        f"{os.path.basename(maker)} changed since {os.path.basename(name)} was run: `make notebooks`"
    )
    assert [c.source for c in nb.cells[2:]] == nbwrite.sources(cells), f"{name} was edited by hand"
    empty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.outputs]
    assert not empty, f"{name}: code cells {empty} have no stored output"
    assert nbwrite.figures(nb) >= 1, f"{name} draws no figure"
    assert os.path.getsize(name) <= nbwrite.MAX_NOTEBOOK_BYTES
    assert "Stored outputs of a run on" in nb.cells[0].source


def test_notebooks_stay_small_together():
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    assert total <= TOTAL_BYTES, f"{total / 2**20:.1f} MiB of notebooks"


def test_a_changed_cell_or_output_is_caught():
    _, _, nb = _stored(MAKERS[0])
    assert nbwrite.differences(nb, copy.deepcopy(nb)) == []
    split = copy.deepcopy(nb)  # the same printing, split into messages differently: not a change
    cell = next(
        c for c in split.cells if c.cell_type == "code" and c.outputs and c.outputs[0].output_type == "stream"
    )
    first = cell.outputs[0]
    cell.outputs[:1] = [nbformat.from_dict({**first, "text": t}) for t in (first.text[:5], first.text[5:])]
    assert nbwrite.differences(nb, split) == []
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 1]
    edited = copy.deepcopy(nb)
    edited.cells[code[1]].source += "\nprint('one more line')"
    assert any(f"cell {code[1]}: the source changed" in d for d in nbwrite.differences(nb, edited))
    figure = next(
        i
        for i, c in enumerate(nb.cells)
        if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
    )
    no_figure = copy.deepcopy(nb)
    no_figure.cells[figure].outputs = [
        o for o in no_figure.cells[figure].outputs if "image/png" not in o.get("data", {})
    ]
    assert any(f"cell {figure}: outputs" in d for d in nbwrite.differences(nb, no_figure))
    printed = next(
        i
        for i in code
        if any(o.output_type == "stream" and re.search(r"\d\.\d", o.text) for o in nb.cells[i].outputs)
    )
    for scale, caught in ((1.5, True), (1.001, False)):
        moved = copy.deepcopy(nb)
        for o in moved.cells[printed].outputs:
            if o.output_type == "stream":
                o.text = re.sub(
                    r"\d+\.\d+", lambda m, k=scale: f"{float(m.group()) * k + 0.5 * (k > 1.2):.4f}", o.text
                )
        found = [d for d in nbwrite.differences(nb, moved) if "beyond tolerance" in d]
        assert bool(found) == caught, (scale, found)


def test_a_straggler_named_in_one_run_only_is_not_a_change():
    """On a loaded machine a run names a slow rank (timing, not the cell's result): the freshness check
    passes over the runner's own straggler lines, and only those."""
    from sparkml_dist.runner.timing.report import Board

    said = []
    board = Board(2, said.append, {0: "10.0.0.11", 1: "10.0.0.12"})
    for i in range(1, 6):
        board.add(0, {"steps": 10 * i, "step_s": 1.0 * i, "data_s": 0.0, "comm_s": 0.4 * i})
        board.add(1, {"steps": 10 * i, "step_s": 2.0 * i, "data_s": 0.0, "comm_s": 0.0})
    lines = said + [board.report().line]
    assert len(lines) == 2 and all(lines)
    _, _, nb = _stored(MAKERS[0])
    printed = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 1 and c.outputs)
    for extra, caught in (("".join(lines), False), ("[sparkml_dist] rank 1 lost 3 rows\n", True)):
        noisy = copy.deepcopy(nb)
        noisy.cells[printed].outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=extra))
        assert bool(nbwrite.differences(nb, noisy)) == caught, extra


DOC_FIGURE = re.compile(r"!\[[^\]]*\]\((?:docs/)?(figures/[\w.-]+\.png)\)")


def _pages() -> str:
    """The README and every page of the documentation site, one text."""
    import glob

    paths = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    return "\n".join(open(p).read() for p in paths)


def test_each_documented_figure_is_what_its_command_draws():
    import figures
    from PIL import Image

    readme = _pages()
    found = DOC_FIGURE.findall(readme)
    assert len(found) >= 2, "the docs show the ensemble frontier and the runner overhead figures"
    for short in found:
        rel = f"docs/{short}"
        png = os.path.join(ROOT, rel)
        stored = json.load(open(os.path.splitext(png)[0] + ".json"))
        assert stored["command"] in readme and f"--figure {rel}" in stored["command"], rel
        redrawn = figures.signature(figures.draw(stored["kind"], stored["data"]))
        assert json.loads(Image.open(png).text["Description"]) == json.loads(json.dumps(redrawn)), rel


README_SEEN = re.compile(r"<!-- seen in (notebooks/[\w.-]+\.ipynb) -->\n```text\n(.*?)\n```", re.S)


def test_the_docs_what_you_will_see_blocks_are_in_the_stored_notebooks():
    readme = _pages()
    blocks = README_SEEN.findall(readme)
    assert len(blocks) >= 8, "one block per feature"
    for rel, text in blocks:
        nb = nbformat.read(os.path.join(ROOT, rel), as_version=4)
        printed = {
            line
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            if o.output_type == "stream"
            for line in o.text.splitlines()
        }
        missing = [line for line in text.splitlines() if line not in printed]
        assert not missing, f"documented lines not printed by {rel}: {missing}"
