"""The papermill smoke run of one notebook, as tests/notebooks/test_notebooks.py and test_notebook_studies.py
check it."""
import json

from kunlunlab.runner import run_notebook

FIRST_STUDY = "05"  # notebooks from here on run in test_notebook_studies.py


def check_smoke_run(path, tmp_path) -> None:
    record = run_notebook(path, tmp_path, smoke=True)
    assert record["ok"], record.get("error")
    assert path.suffix == ".py", "the runner executes the jupytext source a user edits"
    assert (tmp_path / f"{path.stem}.ipynb").is_file() and "<html" in (tmp_path / f"{path.stem}.html").read_text()
    metrics = json.loads((tmp_path / path.stem / "metrics.json").read_text())
    assert metrics, "a notebook must write its key figures"
    assert list((tmp_path / path.stem).glob("*.html")), "a notebook must write its figures"
