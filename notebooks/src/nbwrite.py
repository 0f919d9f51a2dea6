"""Shared by the make_*.py scripts: write a notebook from a list of cells, run it, store its outputs.

A cell is ``("md", source)``, ``("code", source)`` or ``("code", source, "vary")``: a cell whose
printed numbers change from run to run (timings, which trials the pruner stopped) is compared by
structure only.  ``python notebooks/src/make_01.py`` writes ``notebooks/01_ensembles.ipynb``,
executes it on ``local[2]`` and stores what it printed and drew (Spark's stderr noise dropped,
figures as PNG), under a header cell saying when, where and how.  The suite re-executes each
notebook and :func:`differences` must find nothing between the stored and the new outputs.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import sys
import tempfile

import nbformat as nbf

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = os.path.dirname(HERE)
KEEP_MIME = ("text/plain", "image/png", "text/html")
REL_TOL, ABS_TOL = 0.05, 0.02  # numbers in a stored output vs a new run's (cells not marked "vary")
MAX_NOTEBOOK_BYTES = 400 * 1024  # each stored notebook, outputs and figures included
SETUP = (
    "import matplotlib\nmatplotlib.use('Agg')\n%matplotlib inline\n"
    "%config InlineBackend.figure_formats = ['png']\n"
    "matplotlib.rcParams.update({'figure.dpi': 72, 'figure.figsize': (6, 3.2), 'font.size': 9})"
)


def _cell(spec):
    kind, source = spec[0], spec[1]
    if kind == "md":
        return nbf.v4.new_markdown_cell(source)
    cell = nbf.v4.new_code_cell(source)
    cell.metadata["sparkml_dist"] = {"numbers": spec[2] if len(spec) > 2 else "same"}
    return cell


def sources(cells) -> list:
    """The sources the notebook holds for ``cells`` (the header and plot setup excluded)."""
    return [spec[1] for spec in cells]


def digest(cells) -> str:
    return hashlib.sha256(json.dumps(sources(cells)).encode()).hexdigest()


def _header(filename: str) -> str:
    import pyspark

    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        torch_v = "not installed"
    maker = f"notebooks/src/make_{filename[:2]}.py"
    return (
        f"*Stored outputs of a run on {datetime.date.today().isoformat()}: Spark `local[2]` "
        f"{pyspark.__version__}, torch {torch_v}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores, no GPU unless a cell says so. Re-run and store again: "
        f"`python {maker}` (`make notebooks` for all); the test suite re-executes this notebook and "
        "fails when its outputs no longer match these.*"
    )


def build(cells, filename: str):
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["sparkml_dist"] = {
        "generator": f"notebooks/src/make_{filename[:2]}.py",
        "cells_sha256": digest(cells),
    }
    header = nbf.v4.new_markdown_cell(_header(filename))
    setup = nbf.v4.new_code_cell(SETUP + "\nprint('figures: PNG, 72 dpi')")
    setup.metadata["sparkml_dist"] = {"numbers": "same", "setup": True}
    nb.cells = [header, setup] + [_cell(c) for c in cells]
    return nb


def execute(nb, workdir: str):
    from nbclient import NotebookClient

    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": workdir}}
    ).execute()
    return clean(nb)


def clean(nb):
    """Keep what a reader needs: stdout, results and figures; Spark's stderr noise and run metadata go."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.name == "stderr":
                continue
            if out.output_type in ("display_data", "execute_result"):
                out["data"] = {k: v for k, v in out["data"].items() if k in KEEP_MIME}
                out["metadata"] = {}
            kept.append(out)
        cell.outputs = _merged(kept)
        cell.metadata.pop("execution", None)
    return nb


def write(cells, filename: str, *, run: bool = True) -> str:
    nb = build(cells, filename)
    if run:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        with tempfile.TemporaryDirectory() as tmp:
            nb = execute(nb, tmp)
    out = os.path.join(NOTEBOOKS, filename)
    nbf.write(nb, out)
    print("wrote", out, f"({os.path.getsize(out) / 1024:.0f} KiB)")
    return out


# --------------------------------------------------------------------------- freshness
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# Lines that report how the machine ran, not what the cell computed: the runner names a straggler
# when one rank's steps were slower (on a loaded machine, a rank may be in one run and not the next).
_MACHINE_LINES = re.compile(
    r"^\[sparkml_dist\] rank \d+ on \S+ (?:is slow|is no longer slow|was the slowest): .*\n?", re.MULTILINE
)


def _merged(outputs) -> list:
    """Consecutive stream outputs of one name joined: how a run splits its printing into messages
    depends on timing (a rank's streamed lines arrive as they come), not on what it printed."""
    out = []
    for o in outputs:
        if out and o.output_type == "stream" and out[-1].output_type == "stream" and out[-1].name == o.name:
            out[-1] = nbf.from_dict({**out[-1], "text": out[-1].text + o.text})
        else:
            out.append(o)
    return out


def _results(outputs) -> list:
    """A cell's outputs without the lines about how the machine ran (:data:`_MACHINE_LINES`);
    a stream left empty goes."""
    out = []
    for o in outputs:
        if o.output_type == "stream":
            text = _MACHINE_LINES.sub("", o.text)
            if not text:
                continue
            o = nbf.from_dict({**o, "text": text})
        out.append(o)
    return out


def _shape(out) -> tuple:
    if out.output_type == "stream":
        return ("stream", out.name)
    return (out.output_type, tuple(sorted(out.get("data", {}))))


def _text(out) -> str:
    if out.output_type == "stream":
        return out.text
    return out.get("data", {}).get("text/plain", "") if out.output_type == "execute_result" else ""


def _close(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    return abs(x - y) <= max(ABS_TOL, REL_TOL * max(abs(x), abs(y)))


def differences(stored, new) -> list:
    """What differs between a stored notebook and a fresh run of it: the cells, their sources,
    each cell's output kinds and figure count, and (cells not marked "vary") the numbers printed:
    as many, each within :data:`REL_TOL` relative or :data:`ABS_TOL` absolute.  Empty when the stored outputs are fresh."""
    found = []
    if len(stored.cells) != len(new.cells):
        return [f"{len(stored.cells)} stored cells, {len(new.cells)} now"]
    for i, (a, b) in enumerate(zip(stored.cells, new.cells)):
        where = f"cell {i}"
        if a.cell_type != b.cell_type or (i and a.source != b.source):
            found.append(f"{where}: the source changed since the outputs were stored")
            continue
        if a.cell_type != "code":
            continue
        outs_a, outs_b = _merged(_results(a.outputs)), _merged(_results(b.outputs))
        shapes_a, shapes_b = [_shape(o) for o in outs_a], [_shape(o) for o in outs_b]
        if shapes_a != shapes_b:
            found.append(f"{where}: outputs {shapes_a} stored, {shapes_b} now")
            continue
        if a.metadata.get("sparkml_dist", {}).get("numbers") == "vary":
            continue  # timings, digests, which trials stopped: the output kinds and figures only
        nums_a = _NUMBER.findall("".join(_text(o) for o in outs_a))
        nums_b = _NUMBER.findall("".join(_text(o) for o in outs_b))
        if len(nums_a) != len(nums_b):
            found.append(f"{where}: {len(nums_a)} numbers stored, {len(nums_b)} now")
        else:
            bad = [(x, y) for x, y in zip(nums_a, nums_b) if not _close(x, y)]
            if bad:
                found.append(f"{where}: numbers moved beyond tolerance: {bad[:5]}")
    return found


def figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
