"""Kept training results rerun by name: every record has its config, parents run first, finished runs are reused."""
import json
from pathlib import Path

import pytest

from kunlunlab.cli import main
from kunlunlab.configs import apply_overrides
from kunlunlab.training import reruns
from kunlunlab.training.config import drop_moved_keys

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"


def test_every_kept_training_record_has_a_run_config_with_its_own_settings():
    records = {p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("train_config.json")}
    configs = {reruns.read_run_config(n)["record"].removeprefix("experiments/results/"): n for n in reruns.run_names()}
    assert records == set(configs)
    for record, name in configs.items():
        kept, _ = drop_moved_keys(json.loads((RESULTS / record / "train_config.json").read_text()))
        kept = apply_overrides(kept, {k: v for k, v in reruns.ADDED_SINCE_RECORDS.items()
                                      if _get(kept, k) is None})  # fields the record predates, as it ran
        mine = reruns.read_run_config(name)["config"]
        assert {k: v for k, v in mine.items() if k != "model"} == {k: v for k, v in kept.items() if k != "model"}, name
        assert (mine["model"] is None) == (kept["model"] is None), name  # a checkpoint start stays one


def _get(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config.get(key) if isinstance(config, dict) else None
    return config


def test_a_budget_run_starts_from_the_sft_checkpoint_of_its_parent(tmp_path):
    plan = reruns.rerun_plan("budget_192.flat_w05", tmp_path)
    assert [step.name for step in plan] == ["bgfacts_192_2wiki", "budget_192.flat_w05"]
    assert plan[0].config.model is None and plan[0].config.sft.enabled
    assert plan[1].config.model == str(tmp_path / "bgfacts_192_2wiki" / "sft" / "final")
    assert not plan[1].config.sft.enabled and plan[1].config.rewards.w_budget == 0.5
    assert plan[1].run_dir == tmp_path / "budget_192.flat_w05" and not any(step.done for step in plan)


def _write(directory: Path, name: str, model=None):
    (directory / f"{name}.json").write_text(json.dumps(
        {"record": f"experiments/results/{name}", "note": name, "config": {"model": model, "dapo": {"steps": 1}}}))


def test_rerun_trains_parents_first_and_reuses_a_finished_one(tmp_path, monkeypatch):
    configs, runs = tmp_path / "configs", tmp_path / "runs"
    configs.mkdir()
    _write(configs, "base")
    _write(configs, "child", "run:base/sft/final")
    _write(configs, "grandchild", "run:child/dapo/final")
    trained = []

    def fake_train(cfg, run_dir, progress=None):
        trained.append((Path(run_dir).name, cfg.model))
        Path(run_dir).mkdir(parents=True)
        summary = {"em_after": len(trained)}
        (Path(run_dir) / "training_summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(reruns, "train", fake_train)
    reruns.rerun("child", runs, directory=configs)
    assert trained == [("base", None), ("child", str(runs / "base" / "sft" / "final"))]
    summaries = reruns.rerun("grandchild", runs, directory=configs)  # base and child are finished: reused
    assert trained[2:] == [("grandchild", str(runs / "child" / "dapo" / "final"))]
    assert [s["em_after"] for s in summaries] == [1, 2, 3]


def test_a_run_that_refers_back_to_itself_is_refused(tmp_path):
    _write(tmp_path, "a", "run:b/sft/final")
    _write(tmp_path, "b", "run:a/sft/final")
    with pytest.raises(ValueError, match="refers back to itself"):
        reruns.rerun_plan("a", tmp_path / "runs", directory=tmp_path)


def test_the_cli_plans_by_name_and_refuses_an_unknown_one_in_one_line(capsys):
    """``kunlunlab rerun`` in this process (``main``; a subprocess spends ~9 s importing on 2 cores)."""
    assert main(["rerun", "dapo8_makerun_sft", "--dry-run", "--runs-dir", "/tmp/nowhere"]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["plan"]
    assert [step["name"] for step in plan] == ["planfree_makerun", "dapo8_makerun_sft"]
    assert plan[1]["model"] == "/tmp/nowhere/planfree_makerun/sft/final"
    assert main(["rerun", "no_such_run"]) == 2
    bad = capsys.readouterr()
    assert "Traceback" not in bad.err
    assert bad.err.count("\n") == 1 and "known runs: agent8_192_2wiki" in bad.err
