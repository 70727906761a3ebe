import json

import nbformat
import pytest

from kunlunlab import runner


def _run_one_notebook(tmp_path, monkeypatch, name: str, code: str) -> dict:
    """The runner's summary of a series made of one notebook: a parameters cell, then ``code``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("run_dir = None\nsmoke = False"), nbformat.v4.new_code_cell(code)]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (tmp_path / "nbs").mkdir()
    nbformat.write(nb, tmp_path / "nbs" / f"{name}.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "nbs")
    return runner.run_notebooks(out_dir=tmp_path / "run", smoke=True)


def test_failed_notebook_is_reported_not_raised(tmp_path, monkeypatch):
    summary = _run_one_notebook(tmp_path, monkeypatch, "99_broken", "1 / 0")
    assert summary["ok"] is False
    record = summary["notebooks"][0]
    assert record["ok"] is False and "ZeroDivisionError" in record["error"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["ok"] is False
    assert "FAILED" in (tmp_path / "run" / "summary.md").read_text()


def test_experiment_configs_name_real_notebooks_and_bad_files_are_clear(tmp_path):
    import pytest

    from kunlunlab.paths import PROJECT_ROOT

    for config in (PROJECT_ROOT / "experiments" / "configs").glob("*.json"):
        assert runner.load_params(config)  # every shipped config loads and names known notebooks
    bad = tmp_path / "bad.json"
    bad.write_text('{"99_nope": {}}')
    with pytest.raises(ValueError, match="unknown notebooks"):
        runner.load_params(bad)
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="cannot read notebook parameters"):
        runner.load_params(bad)


def test_training_notebook_hands_its_model_and_run_folder_to_the_later_notebooks(tmp_path, monkeypatch):
    """After 04 trains, 05/06 get its final model as ``model`` and 07 its run folder as ``ref_run``."""
    def write(name, body, params="run_dir = None\nsmoke = False\nmodel = None\nref_run = None"):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(params), nbformat.v4.new_code_cell(body)]
        nb.cells[0].metadata["tags"] = ["parameters"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / "nbs" / f"{name}.ipynb")

    (tmp_path / "nbs").mkdir()
    write("04_training", "from pathlib import Path\nfinal = Path(run_dir) / 'dapo' / 'final'\n"
                         "final.mkdir(parents=True)\n(final / 'config.json').write_text('{}')")
    report = "import json\nfrom pathlib import Path\n" \
             "(Path(run_dir) / 'metrics.json').write_text(json.dumps({'model': model, 'ref_run': ref_run}))"
    for name in ("05_stie_tuning", "07_process_rewards"):
        write(name, report)
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "nbs")
    summary = runner.run_notebooks(out_dir=tmp_path / "run", smoke=True)
    assert summary["ok"], summary
    got = {r["notebook"]: r["metrics"] for r in summary["notebooks"] if r["metrics"]}
    assert got["05_stie_tuning"] == {"model": str(tmp_path / "run" / "04_training" / "dapo" / "final"), "ref_run": None}
    assert got["07_process_rewards"]["ref_run"] == str(tmp_path / "run" / "04_training")


def test_a_relative_run_folder_is_the_callers_not_the_notebooks(tmp_path, monkeypatch):
    """The notebooks execute in notebooks/; a relative ``--out`` is resolved where the command was given."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("run_dir = None\nsmoke = False"),
                nbformat.v4.new_code_cell("import json\nfrom pathlib import Path\n"
                                          "(Path(run_dir) / 'metrics.json').write_text(json.dumps({'run_dir': run_dir}))")]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (tmp_path / "nbs").mkdir()
    nbformat.write(nb, tmp_path / "nbs" / "99_where.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "nbs")
    monkeypatch.chdir(tmp_path)
    summary = runner.run_notebooks(out_dir="rel/run", smoke=True)
    assert summary["ok"], summary
    assert (tmp_path / "rel" / "run" / "99_where" / "metrics.json").is_file()
    assert summary["notebooks"][0]["metrics"] == {"run_dir": str(tmp_path / "rel" / "run" / "99_where")}


def test_static_pages_carry_their_equations_as_mathml_and_leave_code_alone(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "The overlap:\n\n$$O(a, b) = \\frac{|W(a) \\cap W(b)|}{|W(a) \\cup W(b)|} \\tag{6}$$\n\n"
        "with $a_t$ the answer of round $t$; a shell variable stays code: `echo $HOME $PATH`."),
        nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, tmp_path / "lesson.ipynb")
    page = runner.render_html(tmp_path / "lesson.ipynb").read_text()
    body = page[page.index("The overlap"):]
    assert body.count('<math display="block"') == 1
    assert body.count('display="inline"') == 2
    assert "<mfrac>" in body and "(6)" in body  # the fraction and the equation's number, rendered
    assert "$$" not in body and "$a_t$" not in body
    assert "echo $HOME $PATH" in body  # code spans are not math


def test_a_formula_that_cannot_be_converted_stays_as_written():
    # "a^" has no superscript: latex2mathml raises, and the page shows the source as MathJax-less pages do
    assert runner.markdown_math_to_mathml("broken $a^$ and fine $b$").startswith("broken $a^$ and fine <math")
    assert runner.markdown_math_to_mathml("no math, 5 dollars") == "no math, 5 dollars"


@pytest.mark.slow
def test_each_notebook_reports_its_peak_resident_memory(tmp_path, monkeypatch):
    summary = _run_one_notebook(tmp_path, monkeypatch, "98_memory", "import time\nimport numpy as np\n"
                                "held = np.ones(400_000_000 // 8)  # 400 MB, touched\ntime.sleep(2)")
    record = summary["notebooks"][0]
    assert record["ok"] and 0.4 * 1e9 / 2**30 <= record["peak_rss_gb"] < 4  # the array and a kernel, not more
    assert f"peak {record['peak_rss_gb']} GB resident" in (tmp_path / "run" / "summary.md").read_text()
