"""Papermill smoke run of the notebooks that study the trained agent (05 on; test_notebooks.py runs 01-04)."""
import pytest

from kunlunlab.runner import notebooks
from notebook_smoke import FIRST_STUDY, check_smoke_run


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in notebooks() if p.stem >= FIRST_STUDY], ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path, tiny_model):
    check_smoke_run(path, tmp_path, tiny_model)
