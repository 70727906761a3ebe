"""Papermill smoke run of every notebook, with the tiny `smoke` parameters: 01-04 here, the studies of the trained
agent (05 on) in test_notebook_studies.py, so that pytest-xdist's workers (a file each) share the ~7 minutes."""
import pytest

from kunlunlab.runner import notebooks, run_notebook
from notebook_smoke import FIRST_STUDY, check_smoke_run


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in notebooks() if p.stem < FIRST_STUDY], ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path, tiny_model):
    check_smoke_run(path, tmp_path, tiny_model)


@pytest.mark.slow
def test_index_build_notebook_with_a_subset_of_index_kinds(tmp_path):
    from kunlunlab.runner import NOTEBOOK_DIR

    path = NOTEBOOK_DIR / "01_index_build.py"
    record = run_notebook(path, tmp_path, smoke=True, extra={"index_kinds": ["bm25"]})
    assert record["ok"], record.get("error")
    metrics = record["metrics"]
    assert metrics["ivfpq"] == [] and set(metrics["single_points"]) == {"exact Flat"}
    assert set(metrics["gold_recall_at_5"]) == {"Flat", "cluster retriever", "BM25"}
    bad = run_notebook(path, tmp_path / "bad", smoke=True, extra={"index_kinds": ["annoy"]})
    assert not bad["ok"] and "unknown index_kinds ['annoy']" in bad["error"]


def test_notebook_pairs_are_in_sync_and_committed_without_outputs():
    """Each ``.py`` source and its ``.ipynb`` hold the same cells (jupytext pairing), no committed notebook
    carries outputs, and each has one parameters cell with ``run_dir`` and ``smoke``."""
    import jupytext

    from kunlunlab.runner import NOTEBOOK_DIR, pairing_problems

    assert pairing_problems() == []
    sources = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
    assert len(sources) >= 6
    for source in sources:
        code = [c for c in jupytext.read(source).cells if c.cell_type == "code"]
        tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "run_dir" in tagged[0].source and "smoke" in tagged[0].source, source.name


def test_papermill_reads_every_parameter_of_every_notebook():
    """papermill's own reading of a parameters cell (``papermill --help-notebook``, ``inspect_notebook``) drops a
    line it cannot parse, e.g. a comment holding " = " (05's ``rounds`` was missing so, with a log line in every
    run); every name the cell assigns must be among the parameters papermill reports."""
    import ast

    import jupytext
    import papermill

    from kunlunlab.runner import NOTEBOOK_DIR

    for notebook in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        cell = next(c for c in jupytext.read(notebook).cells if "parameters" in c.metadata.get("tags", []))
        assigned = {target.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                    for target in node.targets if isinstance(target, ast.Name)}
        assert len(assigned) >= 3, notebook.name
        assert assigned - set(papermill.inspect_notebook(str(notebook))) == set(), notebook.name


def test_pairing_check_catches_a_one_sided_edit_outputs_and_a_missing_pair(tmp_path):
    import shutil

    import nbformat

    from kunlunlab.runner import NOTEBOOK_DIR, pairing_problems

    for suffix in (".py", ".ipynb"):
        shutil.copy(NOTEBOOK_DIR / f"03_reward_design{suffix}", tmp_path)
    assert pairing_problems(tmp_path) == []
    source = tmp_path / "03_reward_design.py"
    source.write_text(source.read_text() + "\n# %%\nprint('edited outside Jupyter')\n")
    assert pairing_problems(tmp_path) == ["03_reward_design.ipynb is out of step with 03_reward_design.py "
                                          f"(run `jupytext --sync {source}`)"]
    shutil.copy(NOTEBOOK_DIR / "03_reward_design.py", tmp_path)
    nb = nbformat.read(tmp_path / "03_reward_design.ipynb", as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hi")]
    nbformat.write(nb, tmp_path / "03_reward_design.ipynb")
    assert [p.split(" carries")[0] for p in pairing_problems(tmp_path)] == ["03_reward_design.ipynb"]
    (tmp_path / "03_reward_design.ipynb").unlink()
    assert "no paired 03_reward_design.ipynb" in pairing_problems(tmp_path)[0]
