"""Papermill smoke run of every notebook, with the tiny `smoke` parameters."""
import json

import pytest

from kunlunlab.runner import notebooks, run_notebook


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path):
    record = run_notebook(path, tmp_path, smoke=True)
    assert record["ok"], record.get("error")
    metrics = json.loads((tmp_path / path.stem / "metrics.json").read_text())
    assert metrics, "a notebook must write its key figures"
    assert list((tmp_path / path.stem).glob("*.html")), "a notebook must write its figures"
