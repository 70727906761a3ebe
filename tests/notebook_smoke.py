"""The papermill smoke run of one notebook, as tests/notebooks/test_notebooks.py and test_notebook_studies.py
check it."""
import json

from kunlunlab.runner import run_notebook

FIRST_STUDY = "05"  # notebooks from here on run in test_notebook_studies.py
# The notebooks that train or study a trained model: their smoke runs take a tiny random model (tests/tiny_training.py)
# in its place, which generates fast to every budget: the smoke run checks that every cell runs and writes its figures
# and metrics, which needs no model that learns (make run trains the embedded one and studies it). Notebook -> its
# parameters, given the tiny model's folder.
TINY_MODEL_PARAMETERS = {
    "04_training": lambda model: {"overrides": {"model": model}},
    "05_stie_tuning": lambda model: {"model": model},
    "06_evaluation": lambda model: {"model": model, "baseline_model": model},
    "07_process_rewards": lambda model: {"sft_overrides": {"model": model}},
    "08_peers": lambda model: {"base_model": model},
}


def check_smoke_run(path, tmp_path, tiny_model: str | None = None) -> None:
    """``tiny_model``: a tiny model's folder, handed to the notebooks of :data:`TINY_MODEL_PARAMETERS`."""
    parameters = TINY_MODEL_PARAMETERS.get(path.stem)
    extra = parameters(tiny_model) if parameters and tiny_model else None
    record = run_notebook(path, tmp_path, smoke=True, extra=extra)
    assert record["ok"], record.get("error")
    assert path.suffix == ".py", "the runner executes the jupytext source a user edits"
    assert (tmp_path / f"{path.stem}.ipynb").is_file() and "<html" in (tmp_path / f"{path.stem}.html").read_text()
    metrics = json.loads((tmp_path / path.stem / "metrics.json").read_text())
    assert metrics, "a notebook must write its key figures"
    assert list((tmp_path / path.stem).glob("*.html")), "a notebook must write its figures"
