"""A smoke training run the way a researcher runs one at scale: retrieval through a service (``retrieval.url``),
real RL prompts (``data.rl_prompts``: the shared HotpotQA questions in Search-R1's veRL jsonl layout), LoRA
adapters (peft through TRL's ``peft_config``) and TensorBoard tracking (``report_to``).

Checked: every real-data search of every stage reaches the service, the held-out real questions are evaluated
through it, no passage is embedded in the training process (the world is searched with BM25); each stage
leaves a whole model with its adapter merged; the trainers' and the evaluations' numbers are in event files
inside the run folder (read back with TensorBoard's reader); a service that is down stops training, after its
bounded retries, with one line."""
import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kunlunlab.cli import main
from kunlunlab.data.loaders import load_named_corpus
from kunlunlab.models import load_llm
from kunlunlab.retrieval import IndexConfig, build_retriever, passages_embedded
from kunlunlab.retrieval.client import free_port
from kunlunlab.retrieval.service import WARMUP_QUERY, ServiceThread
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
            "data.rl_heldout": 2, "data.rl_prompts_share": 1.0,
            "lora.enabled": True, "lora.r": 4, "lora.alpha": 8, "lora.target_modules": ["q_proj", "v_proj"],
            "sft.learning_rate": 1e-2, "report_to": "tensorboard"}


def _searched(path) -> int:
    return sum(json.loads(line)["searches"] for line in path.read_text().splitlines())


@pytest.fixture(scope="module")
def trained(service, data_dir, module_scratch, tiny_model):
    """The run, stage by stage, with the service's queries counted per stage: on a tiny random model (what a run
    does, not what it learns)."""
    url, counter = service
    tmp_path = module_scratch("service_run")
    cfg = load_config(None, {**_overrides(url, data_dir), "model": tiny_model})
    before = passages_embedded()
    run = TrainingRun(cfg, tmp_path)
    queries = {}
    assert len(run.data.rl_train) == 12 and len(run.data.rl_heldout) == 2
    assert [q.question for q in rl_prompt_pool(cfg, run.data)] == [q.question for q in run.data.rl_train]

    for stage in ("mix", "sft", "dapo", "evaluate"):
        counter.queries.clear()
        getattr(run, stage)(*(("after",) if stage == "evaluate" else ()))
        queries[stage] = len(counter.queries)
    summary = run.finish()
    return {"run": run, "dir": tmp_path, "queries": queries, "summary": summary,
            "embedded": passages_embedded() - before}


def test_every_stage_searches_the_service_and_nothing_is_embedded_here(trained):
    run, tmp_path, queries = trained["run"], trained["dir"], trained["queries"]
    assert len(run.data.rl_train) == 12 and len(run.data.rl_heldout) == 2
    assert [q.question for q in rl_prompt_pool(run.cfg, run.data)] == [q.question for q in run.data.rl_train]
    # the HotpotQA SFT trajectories walk their gold titles through the service
    assert [t for t in run.trajectories if t.source == "hotpotqa"] and queries["mix"] > 0
    # every DAPO prompt is a real question: its RDRA background and its searches go to the service
    rollouts = [json.loads(line) for line in (tmp_path / "dapo_rollouts.jsonl").read_text().splitlines()]
    assert rollouts and queries["dapo"] >= max(1, rollouts[0]["searches"] * rollouts[0]["rollouts"])
    # the world is searched in process (BM25); the two real held-out sets through the service, query for query
    after = run.evaluations["after"]
    assert set(after) >= {"world", "hotpotqa_distractor", "rl_heldout"} and after["rl_heldout"]["n"] == 2
    assert queries["evaluate"] == _searched(tmp_path / "eval_after_hotpot.jsonl") + _searched(
        tmp_path / "eval_after_rl.jsonl")
    assert trained["summary"]["rl_heldout"]["n"] == 2
    assert trained["embedded"] == 0  # the service's corpus was embedded before training, never here


def test_lora_stages_leave_whole_models_with_the_adapter_merged(trained, tiny_model):
    run_dir = trained["dir"]
    base, _ = load_llm(tiny_model)
    base_params = dict(base.named_parameters())
    for stage in ("sft", "dapo"):
        final = run_dir / stage / "final"
        assert not (final / "adapter_config.json").exists(), f"{stage}: an adapter instead of a whole model"
        model, _ = load_llm(str(final))
        assert set(dict(model.named_parameters())) == set(base_params), stage  # no lora_A/B, no base_model prefix
    sft, _ = load_llm(str(run_dir / "sft" / "final"))
    # the adapter was on q_proj and v_proj only: those moved, the MLP and the norms did not
    moved = {n for n, p in sft.named_parameters() if not torch.equal(p, base_params[n])}
    assert moved and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in moved), sorted(moved)[:5]


def _scalars(folder) -> dict[str, list[float]]:
    values = {}
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return values


def test_trainers_and_evaluations_write_tensorboard_events_inside_the_run(trained):
    run_dir = trained["dir"]
    sft, dapo, evals = _scalars(run_dir / "sft"), _scalars(run_dir / "dapo"), _scalars(run_dir / "runs" / "eval")
    assert any(tag.endswith("loss") for tag in sft), sorted(sft)
    assert any("reward" in tag for tag in dapo), sorted(dapo)
    state = json.loads((run_dir / "state.json").read_text())
    assert evals["eval_after/world/em"] == [pytest.approx(state["eval_after"]["world"]["em"])]
    assert evals["eval_after/rl_heldout/em"] == [pytest.approx(state["eval_after"]["rl_heldout"]["em"])]
    # the jsonl logs are written either way
    assert (run_dir / "sft_log.jsonl").is_file() and (run_dir / "dapo_rollouts.jsonl").is_file()


def test_a_service_that_is_down_stops_training_in_one_line(data_dir, tmp_path, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    sets = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in _overrides(dead, data_dir).items()]
    assert main(["train", "--run-dir", str(tmp_path), "--set", *sets]) == 1  # a fault during the work: exit 1
    message = capsys.readouterr().err.strip().splitlines()[-1]  # after the run's log lines
    assert message.startswith("kunlunlab train: ") and dead in message
