"""The widgets behind the Voilà apps (``kunlunlab/viz/apps.py``), driven from Python: set a control, read
the read-out. The browser run of the same apps is ``tests/notebooks/test_apps_browser.py``.

Reward totals are worked out by hand from eqs. 17-18 (``R = w_f format + w_l length + w_a accuracy
[+ w_s (structure - 1)] + overlong``) and the components each hand-written case is built to get
(``kunlunlab/studies/reward_cases.py``); default weights w_f 0.2, w_l 0.1, w_a 1.0, w_s 0.2.
"""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kunlunlab.agent.stie import STIEConfig
from kunlunlab.studies.stie_tuning import CONTROLS, cases_from_records, format_readout, readout
from kunlunlab.studies.reward_cases import REWARD_CASES
from kunlunlab.viz.apps import (REWARD_WEIGHTS, load_rounds, reward_explorer, rounds_file, simulation_cases,
                                stie_tuner, stie_tuner_app)

APPS = Path(__file__).resolve().parents[2] / "apps"


def table(html: str) -> dict:
    """The reward read-out's one table row, as {column: cell text}."""
    heads = re.findall(r"<th>(.*?)</th>", html)
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    return dict(zip(heads, re.findall(r"<td>(.*?)</td>", rows[1])))


def test_reward_explorer_starts_on_the_first_case_with_the_default_weights():
    ex = reward_explorer()
    assert list(ex.picker.options) == [c["name"] for c in REWARD_CASES] and ex.picker.value == "correct"
    assert set(ex.sliders) == set(REWARD_WEIGHTS) and ex.sliders["w_format"].value == 0.2
    assert ex.readout in ex.children and ex.picker in ex.children  # the container is the app
    # correct: format 1, length 1, accuracy 1: 0.2 + 0.1 + 1.0 = 1.30
    assert table(ex.readout.value)["total"] == "1.30" and table(ex.readout.value)["mode"] == "short"


def test_reward_explorer_picks_cases_and_follows_the_weights():
    ex = reward_explorer()
    ex.picker.value = "malformed"  # unclosed <query> and <think>: format 0.5 - 0.1 = 0.4; length 1, accuracy 1
    assert ex.text.value == next(c["text"] for c in REWARD_CASES if c["name"] == "malformed")
    row = table(ex.readout.value)
    assert (row["format"], row["length"], row["accuracy"], row["total"]) == ("0.40", "1.00", "1.00", "1.18")
    assert "unclosed:query" in ex.readout.value
    ex.sliders["w_format"].value = 1.5                   # 1.5 * 0.4 + 0.1 + 1.0 = 1.70
    assert table(ex.readout.value)["total"] == "1.70"
    ex.sliders["w_accuracy"].value = 0.5                 # 0.6 + 0.1 + 0.5 = 1.20
    assert table(ex.readout.value)["total"] == "1.20"
    assert ex.config.w_format == 1.5 and ex.config.w_accuracy == 0.5


def test_reward_explorer_model_tokens_and_the_structure_penalty():
    ex = reward_explorer()
    ex.picker.value = "over-long"                        # 700 model tokens > 512: overlong -1
    assert ex.tokens.value == 700
    assert table(ex.readout.value)["overlong"] == "-1.00" and table(ex.readout.value)["total"] == "0.30"
    ex.tokens.value = 0                                  # not counted: 0.2 + 0.1 + 1.0 = 1.30
    assert table(ex.readout.value)["total"] == "1.30"
    ex.picker.value = "long answer, box only"            # structure 0.75, summary of 0 words: length 0
    assert ex.tokens.value == 0
    assert table(ex.readout.value)["total"] == "1.15"    # 0.2 + 0 + 1.0 + 0.2 * (0.75 - 1)
    ex.sliders["w_structure"].value = 2.0                # 0.2 + 1.0 + 2.0 * (0.75 - 1) = 0.70
    assert table(ex.readout.value)["total"] == "0.70"


def test_reward_explorer_scores_edited_text_and_gold():
    ex = reward_explorer()
    ex.text.value = "<think>Easy.</think>\n<short_answer>\\boxed{Paris}</short_answer>"
    ex.gold.value = "Lyon"                               # wrong: 0.2 + 0.1 + 0 = 0.30
    assert table(ex.readout.value)["total"] == "0.30"
    ex.gold.value = "Lyon | Paris"                       # an alias matches: 1.30
    assert table(ex.readout.value)["total"] == "1.30"


# --- the STIE tuner ---------------------------------------------------------------------------------

# notebook 05's confidence_ceiling case (tests/notebooks/test_stie_widgets.py works it out): "red blue" at 0.85 is
# below the ceiling 0.9, so the valid "red green" takes over (EM 0); at 0.8 round 1 stops "confident".
CEILING_CASE = (["red blue"], [("red blue", 0.85, ["a"]), ("red green", 0.7, ["b"])])


def record(golds, rounds) -> dict:
    return {"golds": golds, "trajectory": {"rounds": [{"answer": a, "confidence": c, "doc_ids": d}
                                                      for a, c, d in rounds]}}


def test_stie_tuner_sliders_drive_the_readout_and_the_cap():
    cases = cases_from_records([record(*CEILING_CASE)])
    tuner = stie_tuner({"fixture": cases}, max_rounds={"fixture": 2})
    assert set(tuner.sliders) == set(CONTROLS) and tuner.config == STIEConfig()
    # capped at 2 rounds, round 2 ends the replay as "max_rounds" (without the cap: the cache runs out)
    before = tuner.readouts()["fixture"]
    assert (before["em"], before["rounds"], before["stops"]["max_rounds"]) == (0.0, 2.0, 1)
    assert format_readout(before) in tuner.readout.value and "fixture" in tuner.readout.value
    tuner.sliders["confidence_ceiling"].value = 0.8
    after = tuner.readouts()["fixture"]
    assert (after["em"], after["rounds"], after["stops"]["confident"]) == (1.0, 1.0, 1)
    assert tuner.readout.value.count("EM 1.000 · rounds 1.00 · n 1 | stops: confident 1") == 1
    assert tuner.config_for("fixture").max_rounds == 2 and tuner.config.max_rounds == STIEConfig().max_rounds


def test_rounds_are_found_from_the_file_the_notebook_folder_or_the_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "05_stie_tuning").mkdir(parents=True)
    path = run / "05_stie_tuning" / "rounds.jsonl"
    records = [record(*CEILING_CASE), record(["x"], [("x", 0.5, ["a"])])]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    for given in (path, path.parent, run):
        assert rounds_file(given) == path.resolve()
    cases = load_rounds(run)
    assert len(cases) == 2 and cases[0][0] == ["red blue"] and cases[0][1][0].confidence == 0.85
    with pytest.raises(FileNotFoundError, match="no rounds.jsonl"):
        rounds_file(tmp_path / "nowhere")
    # a model row, capped at the most rounds a question has (2)
    tuner = stie_tuner({"fixture": cases[:1]}, rounds=run)
    assert set(tuner.cases) == {"fixture", "model"} and tuner.max_rounds == {"model": 2}
    assert str(path.resolve()) in tuner.header.value


def test_stie_tuner_app_defaults_to_the_simulation_and_reports_unreadable_rounds(tmp_path, monkeypatch):
    sim = simulation_cases()
    assert len(sim) == 200
    monkeypatch.setenv("KUNLUNLAB_ROUNDS", str(tmp_path / "missing"))
    app = stie_tuner_app()
    assert list(app.cases) == ["simulation"] and "showing the simulation only" in app.children[0].value
    assert app.report() == "simulation: " + format_readout(readout(sim, STIEConfig()))
    app.sliders["repeat_k"].value = 1
    assert format_readout(readout(sim, replace(STIEConfig(), repeat_k=1))) in app.readout.value


def test_apps_are_jupytext_pairs_without_outputs():
    import jupytext
    import nbformat

    sources = sorted(APPS.glob("*.py"))
    assert [p.stem for p in sources] == ["reward_explorer", "stie_tuner"]
    for source in sources:
        nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
        assert [(c.cell_type, c.source) for c in nb.cells] == \
            [(c.cell_type, c.source) for c in jupytext.read(source).cells], f"run `jupytext --sync {source}`"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") is not None for c in code)
        assert nb.metadata["kernelspec"]["name"] == "python3"
