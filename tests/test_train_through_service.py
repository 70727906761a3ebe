"""Training and evaluation through a retrieval service (``retrieval.url``) with real RL prompts
(``data.rl_prompts``: the shared HotpotQA questions in Search-R1's veRL jsonl layout): every real-data search of
every stage reaches the service, the held-out real questions are evaluated through it, no passage is embedded
in the training process (the world is searched with BM25), and a service that is down stops training, after
its bounded retries, with one line."""
import json

import pytest

from kunlunlab.cli import main
from kunlunlab.data.loaders import load_named_corpus
from kunlunlab.retrieval import IndexConfig, build_retriever, passages_embedded
from kunlunlab.retrieval.service import WARMUP_QUERY, ServiceThread, free_port
from kunlunlab.training.config import load_config
from kunlunlab.training.pipeline import SMOKE_OVERRIDES, TrainingRun, rl_prompt_pool

pytestmark = pytest.mark.slow


class CountedSearch:
    """The served retriever's search, recording every query that reaches it (the warm-up search excluded)."""

    def __init__(self, retriever):
        self.queries: list[str] = []
        self._search = retriever.search
        retriever.search = self

    def __call__(self, queries, k=5):
        self.queries += [q for q in queries if q != WARMUP_QUERY]
        return self._search(queries, k)


@pytest.fixture(scope="module")
def service(data_dir, encoder):
    """A service over the HotpotQA distractor paragraphs, built with the embedded MiniLM before training starts
    (the corpus of the evaluation and SFT questions)."""
    served = build_retriever(load_named_corpus("hotpotqa_distractor"), IndexConfig(kind="flat"), encoder=encoder)
    counter = CountedSearch(served)
    with ServiceThread(served) as url:
        yield url, counter


def _overrides(url: str, data_dir) -> dict:
    return {**SMOKE_OVERRIDES, "index_kind": "bm25", "eval.before": False, "eval.hotpot_questions": 1,
            "retrieval.url": url, "retrieval.attempts": 2, "retrieval.backoff": 0.05,
            "data.rl_prompts": str(data_dir / "hotpotqa" / "test.jsonl"), "data.rl_prompts_limit": 14,
            "data.rl_heldout": 2, "data.rl_prompts_share": 1.0}


def _searched(path) -> int:
    return sum(json.loads(line)["searches"] for line in path.read_text().splitlines())


def test_every_stage_searches_the_service_and_nothing_is_embedded_here(service, data_dir, tmp_path):
    url, counter = service
    cfg = load_config(None, _overrides(url, data_dir))
    before = passages_embedded()
    run = TrainingRun(cfg, tmp_path)
    assert len(run.data.rl_train) == 12 and len(run.data.rl_heldout) == 2
    assert [q.question for q in rl_prompt_pool(cfg, run.data)] == [q.question for q in run.data.rl_train]

    counter.queries.clear()
    run.mix()  # the HotpotQA SFT trajectories walk their gold titles through the service
    hotpot_sft = [t for t in run.trajectories if t.source == "hotpotqa"]
    assert hotpot_sft and len(counter.queries) > 0
    run.sft()

    counter.queries.clear()
    run.dapo()  # every DAPO prompt is a real question: its RDRA background and its searches go to the service
    rollouts = [json.loads(line) for line in (tmp_path / "dapo_rollouts.jsonl").read_text().splitlines()]
    assert rollouts and len(counter.queries) >= max(1, rollouts[0]["searches"] * rollouts[0]["rollouts"])

    counter.queries.clear()
    after = run.evaluate("after")
    # the world is searched in process (BM25); the two real held-out sets through the service, query for query
    assert set(after) >= {"world", "hotpotqa_distractor", "rl_heldout"} and after["rl_heldout"]["n"] == 2
    assert len(counter.queries) == _searched(tmp_path / "eval_after_hotpot.jsonl") + _searched(
        tmp_path / "eval_after_rl.jsonl")
    summary = run.finish()
    assert summary["rl_heldout"]["n"] == 2
    assert passages_embedded() == before  # the service's corpus was embedded before training, never here


def test_a_service_that_is_down_stops_training_in_one_line(data_dir, tmp_path, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    sets = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in _overrides(dead, data_dir).items()]
    with pytest.raises(SystemExit) as stop:
        main(["train", "--run-dir", str(tmp_path), "--set", *sets])
    message = str(stop.value)
    assert message.startswith("kunlunlab train: ") and dead in message and "\n" not in message
