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


def _write_notebook(folder, name: str, body: str, params: str) -> None:
    """A two-cell notebook: a tagged parameters cell, then ``body``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(params), nbformat.v4.new_code_cell(body)]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")


def test_training_notebook_hands_its_model_and_run_folder_to_the_later_notebooks(tmp_path, monkeypatch):
    """After 04 trains, 05/06 get its final model as ``model`` and 07 its run folder as ``ref_run``."""
    def write(name, body, params="run_dir = None\nsmoke = False\nmodel = None\nref_run = None"):
        _write_notebook(tmp_path / "nbs", name, body, params)

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


def test_the_evaluation_notebook_hands_its_baseline_records_to_the_peers_notebook(tmp_path, monkeypatch):
    """06's records folder (the prompt baselines on the base model) reaches 08 as ``baseline_records``, which 08 reuses
    where they answered its arms' held-out questions instead of evaluating the baselines again."""
    def write(name, body, params):
        _write_notebook(tmp_path / "nbs", name, body, params)

    (tmp_path / "nbs").mkdir()
    write("06_evaluation", "from pathlib import Path\n(Path(run_dir) / 'records').mkdir(parents=True)",
          "run_dir = None\nsmoke = False")
    write("08_peers", "import json\nfrom pathlib import Path\n"
                      "(Path(run_dir) / 'metrics.json').write_text(json.dumps({'baseline_records': baseline_records}))",
          "run_dir = None\nsmoke = False\nbaseline_records = None")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "nbs")
    summary = runner.run_notebooks(out_dir=tmp_path / "run", smoke=True)
    assert summary["ok"], summary
    got = {r["notebook"]: r["metrics"] for r in summary["notebooks"] if r["metrics"]}
    assert got["08_peers"] == {"baseline_records": str(tmp_path / "run" / "06_evaluation" / "records")}


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
    assert f"peak {record['peak_rss_gb']} GiB resident" in (tmp_path / "run" / "summary.md").read_text()


# ---------------------------------------------------------------------------- parameters checked before the run
def _series(tmp_path, monkeypatch, notebooks: dict[str, tuple[str, str]]):
    """A series of notebooks: name -> (parameters cell, body), in NOTEBOOK_DIR for the runner."""
    (tmp_path / "nbs").mkdir()
    for name, (params, body) in notebooks.items():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(params), nbformat.v4.new_code_cell(body)]
        nb.cells[0].metadata["tags"] = ["parameters"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / "nbs" / f"{name}.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "nbs")


PARAMS_CELL = ("run_dir = None\nsmoke = False\nn_items = 3   # items, e.g. k = 3\nscale = 0.5\nlabel = 'x'\n"
               "names = ['a', 'b']\nlimit: int | None = None\nmodel = None\nrate = None\n")


def test_the_parameters_cell_gives_each_parameter_its_type(tmp_path, monkeypatch):
    _series(tmp_path, monkeypatch, {"01_a": (PARAMS_CELL, "pass")})
    cell = runner.parameter_cell(runner.notebooks()[0])
    assert cell["n_items"] == (int, 3) and cell["scale"] == (float, 0.5) and cell["label"] == (str, "x")
    assert cell["names"] == (list[str], ["a", "b"]) and cell["limit"] == (int | None, None)
    assert cell["model"] == (str | None, None)  # a None default: a string (a path, a model), unless declared


@pytest.mark.parametrize("given, message", [
    ({"n_itemz": 4}, "notebook 01_a: unknown keys ['n_itemz']"),
    ({"n_items": "4"}, "notebook 01_a: n_items='4': expected an integer"),
    ({"n_items": 4.5}, "notebook 01_a: n_items=4.5: expected an integer"),
    ({"smoke": 1}, "notebook 01_a: smoke=1: expected true or false"),
    ({"names": ["a", 2]}, "notebook 01_a: names[1]=2: expected a string"),
    ({"limit": "all"}, "notebook 01_a: limit='all': expected an integer or null"),
])
def test_a_bad_parameter_stops_the_series_before_anything_runs(tmp_path, monkeypatch, given, message):
    _series(tmp_path, monkeypatch, {"01_a": (PARAMS_CELL, "pass"), "02_b": ("run_dir = None", "pass")})
    with pytest.raises(runner.ConfigError) as refused:
        runner.run_notebooks(out_dir=tmp_path / "run", params={"01_a": given})
    assert str(refused.value).startswith(message)
    assert not (tmp_path / "run").exists()  # nothing ran, no run folder
    runner.check_params(runner.notebooks(), {"01_a": {"n_items": 4, "scale": 2, "limit": None, "rate": "x"}})


def test_only_must_match_a_notebook(tmp_path, monkeypatch):
    _series(tmp_path, monkeypatch, {"01_a": ("run_dir = None", "pass"), "02_b": ("run_dir = None", "pass")})
    assert [p.stem for p in runner.select_notebooks(["02"])] == ["02_b"]
    with pytest.raises(runner.ConfigError, match="no notebook matches --only 99_nope; the notebooks: 01_a, 02_b"):
        runner.select_notebooks(["01", "99_nope"])


def test_training_overrides_are_checked_as_a_train_config():
    path = next(p for p in runner.notebooks() if p.stem == "04_training")
    runner.check_params([path], {"04_training": {"overrides": {"sft.learning_rate": 1e-4}}})
    with pytest.raises(runner.ConfigError, match=r"notebook 04_training: overrides: .*unknown keys \['learning_rat'\] in sft"):
        runner.check_params([path], {"04_training": {"overrides": {"sft.learning_rat": 1e-4}}})
    with pytest.raises(runner.ConfigError, match=r"notebook 04_training: overrides: .*dapo.steps='8': expected an int"):
        runner.check_params([path], {"04_training": {"overrides": {"dapo.steps": "8"}}})


def test_a_failed_notebook_is_one_line_and_exit_1_from_the_command(tmp_path, monkeypatch, capsys):
    from kunlunlab.cli import main

    _series(tmp_path, monkeypatch, {"01_ok": ("run_dir = None\nsmoke = False", "pass"),
                                    "02_broken": ("run_dir = None\nsmoke = False", "1 / 0")})
    assert main(["run-notebooks", "--out", str(tmp_path / "run"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == ("kunlunlab run-notebooks: 1 notebook(s) failed, first 02_broken "
                                        "(ZeroDivisionError: division by zero; cell 3 of its executed copy); executed "
                                        f"copies and summary.json in {tmp_path / 'run'}")


def test_ctrl_c_keeps_the_finished_notebooks_and_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    from kunlunlab.cli import main

    cell = "run_dir = None\nsmoke = False"
    _series(tmp_path, monkeypatch, {"01_a": (cell, "pass"), "02_b": (cell, "pass"), "03_c": (cell, "pass")})
    real = runner.run_notebook

    def interrupt_02(path, *args, **kwargs):
        if path.stem == "02_b":
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(runner, "run_notebook", interrupt_02)
    run = tmp_path / "run"
    assert main(["run-notebooks", "--out", str(run), "--smoke", "--no-progress"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kunlunlab run-notebooks: interrupted; stopped in 02_b; the notebooks finished before it are in "
                   f"{run} (summary.json): go on with `kunlunlab run-notebooks --out {run} --only 02_b 03_c --smoke`"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] == "02_b" and summary["ok"] is False
    assert [r["notebook"] for r in summary["notebooks"]] == ["01_a"]


def test_a_series_continued_in_the_same_folder_hands_on_the_model_trained_there(tmp_path, monkeypatch):
    report = "import json\nfrom pathlib import Path\n(Path(run_dir) / 'metrics.json').write_text(json.dumps({'model': model}))"
    _series(tmp_path, monkeypatch, {"04_training": ("run_dir = None\nsmoke = False", "pass"),
                                    "05_stie_tuning": ("run_dir = None\nsmoke = False\nmodel = None", report)})
    final = tmp_path / "run" / "04_training" / "dapo" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    summary = runner.run_notebooks(out_dir=tmp_path / "run", smoke=True, only=["05"])
    assert summary["ok"] and summary["notebooks"][0]["metrics"] == {"model": str(final)}
