"""Training ablations from run folders: `kunlunlab compare-runs` pairs runs by held-out question."""
import json

import pytest

from kunlunlab.cli import main


def _run(folder, ems, ids=None):
    folder.mkdir()
    ids = ids or [f"q{i}" for i in range(len(ems))]
    rows = [{"id": i, "em": em, "f1": em, "searches": 2} for i, em in zip(ids, ems)]
    (folder / "eval_after_world.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_compare_runs_reports_each_run_against_the_first(tmp_path, capsys):
    ref = _run(tmp_path / "kunlun", [1, 1, 1, 0])
    other = _run(tmp_path / "agent", [1, 0, 0, 0])
    assert main(["compare-runs", f"kunlun={ref}", f"agent={other}"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r[0]: r for r in out["rows"]}
    assert rows["kunlun"][1:4] == [4, 75.0, 75.0] and rows["kunlun"][5] == "–"
    assert rows["agent"][1:4] == [4, 25.0, 25.0] and rows["agent"][5].startswith("-50.0 [")


def test_compare_runs_refuses_other_questions_and_missing_runs(tmp_path, capsys):
    ref = _run(tmp_path / "kunlun", [1, 0])
    other = _run(tmp_path / "other", [1, 0], ids=["x1", "x2"])
    assert main(["compare-runs", f"kunlun={ref}", f"other={other}"]) == 2
    assert "differ from kunlun's: not comparable" in capsys.readouterr().err
    assert main(["compare-runs", f"kunlun={ref}", f"gone={tmp_path / 'gone'}"]) == 2
    assert "is not a finished training run folder" in capsys.readouterr().err
    assert main(["compare-runs", "no-equals-sign"]) == 2


class _FakeRun:
    """Records the stages train_variant calls; ``prl_error`` makes the PRL stage raise."""
    calls: list = []
    prl_error: Exception | None = None

    def __init__(self, cfg, folder, progress=None):
        _FakeRun.calls = ["init"]

    def sft(self):
        _FakeRun.calls.append("sft")

    def prl(self):
        _FakeRun.calls.append("prl")
        if _FakeRun.prl_error:
            raise _FakeRun.prl_error

    def dapo(self):
        _FakeRun.calls.append("dapo")

    def evaluate(self, tag):
        _FakeRun.calls.append(f"evaluate {tag}")

    def finish(self):
        _FakeRun.calls.append("finish")
        return {"em_after": 12.5, "f1_after": 20.0, "seconds": 3.0}


def test_train_variant_runs_the_stages_in_order_and_skips_a_variant_without_pairs(monkeypatch, tmp_path):
    import kunlunlab.studies.training_variants as variants
    from kunlunlab.studies.training_variants import train_variant

    monkeypatch.setattr(variants, "TrainingRun", _FakeRun)
    lines = []
    _FakeRun.prl_error = None
    assert train_variant(object(), tmp_path, progress=lines.append) is None
    assert _FakeRun.calls == ["init", "sft", "prl", "dapo", "evaluate after", "finish"]
    assert lines == ["world EM 12.5 F1 20.0, 3.0 s of training"]

    _FakeRun.prl_error = RuntimeError("PRL: the tree search produced no preference pairs (every sibling ...)")
    reason = train_variant(object(), tmp_path, progress=lines.append)
    assert reason.startswith("not trained: PRL: the tree search produced no preference pairs")
    assert _FakeRun.calls == ["init", "sft", "prl"]  # neither trained further nor evaluated

    _FakeRun.prl_error = RuntimeError("CUDA out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        train_variant(object(), tmp_path, progress=lines.append)


def test_the_kept_gpu_runs_give_the_readme_figures(capsys):
    """experiments/results/gpu_g192 backs the README's paired GPU table: the plain agent 71.0 against the
    whole method's 48.5 on the same 200 held-out world questions, 6.7 against 13.3 on 30 HotpotQA ones."""
    from kunlunlab.paths import PROJECT_ROOT

    kept = PROJECT_ROOT / "experiments" / "results" / "gpu_g192"
    for dataset, agent_em, kunlun_em, n in (("world", 71.0, 48.5, 200), ("hotpotqa_distractor", 6.7, 13.3, 30)):
        assert main(["compare-runs", f"agent={kept / 'agent'}", f"kunlun={kept / 'kunlun'}",
                     f"bgfacts={kept / 'bgfacts'}", "--dataset", dataset]) == 0
        rows = {r[0]: r for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]}
        assert rows["agent"][1:3] == [n, agent_em] and rows["kunlun"][1:3] == [n, kunlun_em]
        assert rows["bgfacts"][2] == kunlun_em
    assert rows["kunlun"][5].startswith("+6.7 [")
