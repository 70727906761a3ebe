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


def test_index_build_notebook_with_a_subset_of_index_kinds(tmp_path):
    from kunlunlab.runner import NOTEBOOK_DIR

    path = NOTEBOOK_DIR / "01_index_build.ipynb"
    record = run_notebook(path, tmp_path, smoke=True, extra={"index_kinds": ["bm25"]})
    assert record["ok"], record.get("error")
    metrics = record["metrics"]
    assert metrics["ivfpq"] == [] and set(metrics["single_points"]) == {"exact Flat"}
    assert set(metrics["gold_recall_at_5"]) == {"Flat", "cluster retriever", "BM25"}
    bad = run_notebook(path, tmp_path / "bad", smoke=True, extra={"index_kinds": ["annoy"]})
    assert not bad["ok"] and "unknown index_kinds ['annoy']" in bad["error"]
