"""Shared helper of the tools/make_notebook_*.py scripts: cells in, a parameterised notebook out."""
from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parent.parent

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def write_notebook(cells, path, parameters_cell=1):
    nb = nbf.v4.new_notebook()
    nb.cells = cells
    nb.cells[parameters_cell].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbf.write(nb, ROOT / path)  # paths are relative to the repository root
