"""Shared by the make_*.py scripts: write a list of ("md" | "code", source) cells as a notebook."""

import os

import nbformat as nbf


def write(cells, filename: str) -> str:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbf.v4.new_markdown_cell(s) if k == "md" else nbf.v4.new_code_cell(s) for k, s in cells]
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), filename)
    nbf.write(nb, out)
    print("wrote", out)
    return out
