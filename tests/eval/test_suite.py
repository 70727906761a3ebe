"""The evaluation suite's data (kunlunlab.studies.suite.suite_data): held-out questions only."""
from __future__ import annotations

import json

import pytest

from kunlunlab.eval.harness import AGENT_SETTINGS_FILE
from kunlunlab.studies.suite import SuiteConfig, suite_data, suite_eval_config


def test_2wiki_questions_a_checkpoint_trained_on_are_refused(tmp_path, data_dir):
    config = tmp_path / "train.json"
    config.write_text(json.dumps({"world_passages": 600, "train_questions": 20, "twowiki": True,
                                  "twowiki_heldout": 50}))
    ok = suite_data(SuiteConfig(train_config=str(config), datasets=("2wikimultihopqa",), limit=50))
    assert [q.id for q in ok["2wikimultihopqa"][0]][-1] == "2wikimultihopqa-49"
    with pytest.raises(ValueError, match="at most that many"):
        suite_data(SuiteConfig(train_config=str(config), datasets=("2wikimultihopqa",), limit=51))


def test_world_questions_are_the_training_configs_held_out_split(tmp_path):
    from kunlunlab.training.config import load_config
    from kunlunlab.data.splits import load_splits

    config = tmp_path / "train.json"
    config.write_text(json.dumps({"world_passages": 600, "train_questions": 30, "hotpot": False}))
    questions, passages = suite_data(SuiteConfig(train_config=str(config), datasets=("world",),
                                                 world_questions=12))["world"]
    train = {q.question for q in load_splits(load_config(config).splits()).train}
    assert len(questions) == 12 and not train & {q.question for q in questions}
    assert len(passages) == 600


def test_the_suite_runs_with_the_checkpoints_agent_configuration_unless_it_sets_its_own(tmp_path):
    (tmp_path / AGENT_SETTINGS_FILE).write_text(json.dumps({
        "method": "kunlun", "index_kind": "bm25", "embedder": "intfloat/e5-base-v2", "top_k": 1,
        "stie": {"delta1": 0.7}, "rdra": {"use_plan": False}}))
    base = suite_eval_config(SuiteConfig(model=str(tmp_path)))
    assert (base.index_kind, base.embedder, base.rollout.top_k, base.stie.delta1, base.rdra.use_plan) == \
        ("bm25", "intfloat/e5-base-v2", 1, 0.7, False)
    own = suite_eval_config(SuiteConfig(model=str(tmp_path), index_kind="flat", embedder="all-MiniLM-L6-v2"))
    assert (own.index_kind, own.embedder, own.rollout.top_k) == ("flat", "all-MiniLM-L6-v2", 1)
    untrained = suite_eval_config(SuiteConfig())  # no checkpoint: EvalConfig's defaults
    assert (untrained.index_kind, untrained.embedder, untrained.rollout.top_k, untrained.stie.delta1) == \
        ("flat", None, 3, 0.6)
    # budgets the suite sets replace the checkpoint's, one by one; the others stay the checkpoint's
    capped = suite_eval_config(SuiteConfig(model=str(tmp_path), rollout={"max_total_tokens": 160}))
    assert (capped.rollout.max_total_tokens, capped.rollout.top_k, capped.rollout.max_turn_tokens) == (160, 1, 256)
    assert suite_eval_config(SuiteConfig(rollout={"max_turn_tokens": 32})).rollout.max_turn_tokens == 32
    with pytest.raises(ValueError, match=r"rollout: unknown budgets \['top_p'\]"):
        SuiteConfig(rollout={"top_p": 1})


def _records(ems: list[float]) -> list[dict]:
    return [{"id": f"q{i}", "em": em, "f1": em, "lj": None, "searches": 2} for i, em in enumerate(ems)]


def test_suite_tables_hold_table2_and_one_ablation_table_per_ablated_dataset():
    """The tables notebook 06 shows and `kunlunlab suite` writes (one function behind both): values are
    the hand-computed means of the records."""
    from kunlunlab.studies.suite import TABLE2_TITLE, SuiteConfig, SuiteResult, ablation_title, suite_tables

    result = SuiteResult()
    result.records = {"world": {"naive_rag": _records([0, 0, 1, 0]), "ircot": _records([1, 0, 1, 0]),
                                "kunlun": _records([1, 1, 1, 0])},
                      "bamboogle": {"naive_rag": _records([0, 0]), "ircot": _records([0, 0]),
                                    "kunlun": _records([1, 0])}}
    result.ablations = {"world": {"kunlun": result.records["world"]["kunlun"], "−STIE": _records([0, 1, 1, 0])}}
    cfg = SuiteConfig(baselines=("naive_rag", "ircot"), n_resamples=300)
    tables = suite_tables(result, cfg)
    assert list(tables) == [TABLE2_TITLE, ablation_title("world")] == ["Table 2 (EM / LJ %)", "Ablations on world"]
    header, rows = tables[TABLE2_TITLE]
    # every row names its model; bamboogle is searched in a corpus that lacks most of its evidence and says so
    lacks = "bamboogle (corpus lacks most evidence)"
    assert header == ["method", "model", "world EM", "world LJ", "world tag %", f"{lacks} EM", f"{lacks} LJ",
                      f"{lacks} tag %"]
    embedded = "SmolLM2-135M-Instruct (embedded)"  # no checkpoint: every row on the embedded model
    assert rows[:3] == [["naive_rag", embedded, 25.0, "–", "–", 0.0, "–", "–"],
                        ["ircot", embedded, 50.0, "–", "–", 0.0, "–", "–"],
                        ["kunlun", embedded, 75.0, "–", "–", 50.0, "–", "–"]]
    assert rows[3][2].startswith("+25.0 [") and rows[3][2].endswith("n=4") and rows[3][3] == "vs ircot"
    _, ablation_rows = tables[ablation_title("world")]
    assert [row[0] for row in ablation_rows] == ["kunlun", "−STIE"]
    assert ablation_rows[1][:5] == ["−STIE", 4, 50.0, 50.0, 2.0]
    # only question 0 differs (1 -> 0): Δ = -25 points, and no resample can rise above 0
    assert ablation_rows[1][5].startswith("-25.0 [") and ablation_rows[1][5].endswith(", +0.0]")
    assert ablation_rows[1][6] == "no measurable effect at this scale"


def _sourced(ems: list[float], sources: str) -> list[dict]:
    """Records whose answers came from the answer tag (``t``) or fallback extraction (``f``), one letter each."""
    kinds = {"t": "answer_tag", "f": "fallback"}
    return [{**r, "answer_source": kinds[s]} for r, s in zip(_records(ems), sources)]


def test_a_row_answered_mostly_by_fallback_is_marked_collapsed_never_read_as_a_tie():
    """Issue 51: kunlun_grpo_u4 closed no answer tag on any question; its EM came from fallback extraction of
    degenerate text and was read as "no measurable difference". Such a row is marked collapsed (> 50 % fallback),
    is never the best row nor compared; a row at exactly half stays a result."""
    from kunlunlab.studies.suite import TABLE2_TITLE, SuiteConfig, SuiteResult, ablation_title, suite_tables

    result = SuiteResult()
    dapo, grpo = _sourced([1, 0, 1, 0], "tttt"), _sourced([1, 0, 1, 0], "fftf")  # 3 of 4 by fallback: collapsed
    result.records = {"world": {"naive_rag": _records([0, 0, 0, 0]), "ircot": _sourced([1, 1, 1, 1], "ffff"),
                                "search_r1": _sourced([1, 0, 0, 0], "tftf"), "kunlun": dapo}}
    result.ablations = {"world": {"kunlun": dapo, "GRPO": grpo}}
    cfg = SuiteConfig(baselines=("naive_rag", "ircot"), models={"search_r1": "runs/sr1"}, n_resamples=300)
    tables = suite_tables(result, cfg)
    header, rows = tables[TABLE2_TITLE]
    tag = header.index("world tag %")
    by = {r[0]: r for r in rows}
    assert [by[m][tag] for m in ("naive_rag", "ircot", "search_r1", "kunlun")] == ["–", "0.0 collapsed", 50.0, 100.0]
    # the collapsed baseline's 100 EM is not the best baseline: naive_rag's 0 is
    vs_baseline = next(r for r in rows if r[0].startswith("kunlun − best baseline"))
    assert vs_baseline[3] == "vs naive_rag" and vs_baseline[2].startswith("+50.0 [")
    _, ablation_rows = tables[ablation_title("world")]
    grpo_row = {r[0]: r for r in ablation_rows}["GRPO"]
    assert grpo_row[5] == "–" and grpo_row[6] == "collapsed: most answers by fallback extraction, not a result"
    assert grpo_row[7] == "25.0 collapsed"
    # a collapsed reference: nothing is read against it
    result.records["world"]["kunlun"] = grpo
    _, rows = suite_tables(result, cfg)[TABLE2_TITLE]
    assert [r[2] for r in rows if r[0].startswith("kunlun − best")] == ["kunlun collapsed: not compared"] * 2


def test_each_row_runs_on_its_own_model(tmp_path):
    """Table 2 as the paper builds it: the prompt baselines on the backbone the checkpoint was trained from (the
    embedded instruct model unless the training config names one), a peer's recipe on its own checkpoint, the
    method on its checkpoint; "checkpoint" puts the baselines back on the trained model."""
    from kunlunlab.studies.suite import SuiteConfig, peer_rows, row_models

    cfg = SuiteConfig(model="runs/k/dapo/final", baselines=("naive_rag", "ircot"),
                      models={"search_r1": "runs/sr1/dapo/final", "ircot": "Qwen/Qwen2.5-7B-Instruct"})
    assert row_models(cfg) == {"naive_rag": None, "ircot": "Qwen/Qwen2.5-7B-Instruct",
                               "search_r1": "runs/sr1/dapo/final", "kunlun": "runs/k/dapo/final"}
    assert peer_rows(cfg) == ["search_r1"]
    config = tmp_path / "train.json"
    config.write_text('{"model": "/models/base"}')
    assert row_models(SuiteConfig(model="m", train_config=str(config), baselines=("naive_gen",)))["naive_gen"] == \
        "/models/base"
    assert row_models(SuiteConfig(model="m", baseline_model="checkpoint", baselines=("naive_gen",)))["naive_gen"] == "m"
    with pytest.raises(ValueError, match="unknown methods"):
        SuiteConfig(models={"nope": "x"})


def test_the_benchmarks_search_the_service_and_the_world_its_own_index(tmp_path, data_dir, backend):
    """``retriever_url``: every search of a benchmark row reaches the service; the synthetic world, whose
    passages no service holds, keeps its in-process index."""
    from kunlunlab.data.loaders import load_named_corpus
    from kunlunlab.retrieval import IndexConfig, build_retriever
    from kunlunlab.retrieval.service import WARMUP_QUERY, ServiceThread
    from kunlunlab.studies.suite import run_suite
    from scripted import ScriptedBackend

    served = build_retriever(load_named_corpus("hotpotqa_distractor"), IndexConfig(kind="bm25"))
    received: list[str] = []
    search = served.search

    def counted(queries, k=5):
        received.extend(q for q in queries if q != WARMUP_QUERY)
        return search(queries, k)

    served.search = counted
    scripted = ScriptedBackend(backend.tokenizer, {r: ["<answer>x</answer>"] * 8 for r in range(4)})
    with ServiceThread(served) as url:
        cfg = SuiteConfig(method="naive_rag", baselines=(), datasets=("world", "hotpotqa_distractor"),
                          world_questions=2, hotpot_questions=2, ablations=(), nlr=False, index_kind="bm25",
                          retriever_url=url)
        result = run_suite(cfg, tmp_path, backend=scripted, progress=lambda line: None)
    hotpot = result.records["hotpotqa_distractor"]["naive_rag"]
    world = result.records["world"]["naive_rag"]
    assert len(hotpot) == len(world) == 2
    assert sorted(received) == sorted(r["question"] for r in hotpot)  # naive RAG: one search, the question
    assert not {r["question"] for r in world} & set(received)


def test_the_answer_modes_table_says_which_mode_each_method_chose():
    """Notebook 06's long-answer columns: long-answer share on factoid and summary-oriented questions, the
    summaries' fact coverage and the boxed link's EM, from the records (hand-computed)."""
    from kunlunlab.studies.suite import MODES_TITLE, SuiteResult, suite_tables

    def recs(modes, coverage=None, ems=None):
        return [{"id": f"q{i}", "em": (ems or [0] * len(modes))[i], "f1": 0, "lj": None, "searches": 1,
                 "answer_mode": m, "fact_coverage": None if coverage is None else coverage[i]}
                for i, m in enumerate(modes)]

    result = SuiteResult()
    result.records = {"world": {"naive_rag": recs([None, None]), "kunlun": recs(["short", "long"])},
                      "world_summary": {"naive_rag": recs([None, None], [0.2, 0.4]),
                                        "kunlun": recs(["long", "long"], [1.0, 0.5], [1, 0])}}
    header, rows = suite_tables(result, SuiteConfig(baselines=("naive_rag",), n_resamples=100))[MODES_TITLE]
    assert header[1:5] == ["long % (factoid)", "long % (summary)", "fact coverage % (summary)", "EM link (summary)"]
    assert rows == [["naive_rag", 0.0, 0.0, 30.0, 0.0, "2 / 2"], ["kunlun", 50.0, 100.0, 75.0, 50.0, "2 / 2"]]


def test_world_summary_questions_are_held_out_summary_questions(tmp_path):
    from kunlunlab.data.splits import load_splits
    from kunlunlab.training.config import load_config

    config = tmp_path / "train.json"
    config.write_text(json.dumps({"world_passages": 600, "train_questions": 40, "summary_share": 0.25,
                                  "hotpot": False}))
    questions, passages = suite_data(SuiteConfig(train_config=str(config), datasets=("world_summary",),
                                                 summary_questions=6))["world_summary"]
    train = {q.question for q in load_splits(load_config(config).splits()).train}
    assert len(questions) == 6 and all(q.summary for q in questions) and not train & {q.question for q in questions}
    assert len(passages) == 600
