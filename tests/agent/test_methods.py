"""Every method end to end on a few questions, the LLM judge's cache, and `kunlunlab eval`."""
import json
import subprocess
import sys

import pytest

from kunlunlab.agent.methods import METHODS, PEER_METHODS
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.agent.stie import STIEConfig
from kunlunlab.eval.harness import EvalConfig, evaluate
from kunlunlab.eval.judge import LLMJudge

SUMMARY_KEYS = {"n", "em", "f1", "acc", "lj", "searches_per_question", "seconds_per_question"}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_end_to_end_on_world_questions(method, backend, world, questions, tmp_path):
    config = EvalConfig(dataset="world", method=method, limit=2, index_kind="bm25",
                        rollout=RolloutConfig(max_total_tokens=160), stie=STIEConfig(max_rounds=2), judge="same")
    summary = evaluate(config, tmp_path / "out.jsonl", backend=backend, examples=questions[:2],
                       passages=world.passages)
    assert SUMMARY_KEYS <= set(summary) and summary["n"] == 2 and summary["method"] == method
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["question"] for r in records] == [q.question for q in questions[:2]]
    for r in records:
        assert set(r) >= {"prediction", "golds", "em", "f1", "acc", "lj", "searches", "trajectory"}
        assert r["lj"] in (0.0, 1.0) and 0 <= r["f1"] <= 1
    agents = ("search_o1", "agent", "kunlun", *PEER_METHODS)  # rollout methods: an untrained agent may not search
    if method != "naive_gen":
        assert summary["searches_per_question"] >= 1 or method in agents
    if method == "kunlun":
        assert records[0]["trajectory"]["rdra"]["plan_queries"] and records[0]["trajectory"]["rdra"]["doc_ids"]
    if method in agents:
        t = records[0]["trajectory"]
        assert len(t["mask"]) == len(t["completion_ids"]) and t["answer_source"] in ("answer_tag", "fallback")
        for r in records:  # the recall curve: R_0 (RDRA's background, or nothing) and one point per search
            assert len(r["recall_by_search"]) == 1 + len(r["trajectory"]["doc_ids"])
            assert r["recall_by_search"][-1] == r["retrieval_recall"]  # everything retrieved, counted twice
        for r, q in zip(records, questions[:2]):  # the fewest searches that complete the gold evidence
            stages = len(q.stage_groups())
            if method == "kunlun":  # RDRA's queries always, then at most one per dependency stage
                fixed = r["trajectory"]["rdra"]["searches"]
                assert fixed <= r["search_floor"] <= fixed + stages
            else:  # no background: every stage needs a search of its own
                assert r["search_floor"] == stages
    else:
        assert all(r["recall_by_search"] is None for r in records)  # baselines keep no per-search ids
        assert all(r["search_floor"] is None for r in records)


def test_judge_rules_cache_and_model_verdicts(backend, tmp_path):
    judge = LLMJudge(backend, cache_path=tmp_path / "judge.jsonl")
    items = [("Capital of France?", ["Paris"], "paris"), ("Capital of France?", ["Paris"], None),
             ("Capital of France?", ["Paris"], "the city of Paris, France")]
    first = judge.judge(items)
    assert first[:2] == [1.0, 0.0] and first[2] in (0.0, 1.0) and judge.stats["judged"] == 1
    again = LLMJudge(backend, cache_path=tmp_path / "judge.jsonl")
    assert again.judge(items) == first and again.stats["cached"] == 1 and again.stats["judged"] == 0


@pytest.mark.slow
def test_eval_cli_prints_a_json_summary_last(data_dir, tmp_path):
    out = tmp_path / "hotpot.jsonl"
    proc = subprocess.run([sys.executable, "-m", "kunlunlab.cli", "eval", "--dataset",
                           str(data_dir / "hotpotqa/hotpot_dev_distractor_sample.json"), "--method", "naive_rag",
                           "--limit", "2", "--judge", "none", "--index-kind", "bm25", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert SUMMARY_KEYS <= set(summary) and summary["n"] == 2 and summary["lj"] is None
    assert summary["retrieval_recall"] is not None  # HotpotQA carries gold supporting titles
    assert len(out.read_text().splitlines()) == 2


def test_eval_rejects_unknown_methods_and_missing_datasets(backend, world):
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        evaluate(EvalConfig(method="magic", index_kind="bm25"), backend=backend, examples=[], passages=world.passages)
    with pytest.raises(FileNotFoundError, match="neither 'world'"):
        evaluate(EvalConfig(dataset="/no/such/file.jsonl"), backend=backend)
