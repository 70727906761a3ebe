"""The fairness defects of issue 51, each as a user of a comparison relies on it:

* the budgets an arm declares are the ones its rollouts run (its protocol's top-k and searches; a comparison's
  own budget, where it states one, for every arm alike), in training and in ``kunlunlab eval --method <peer>``;
* a peer's SFT prompt carries no ``<background>`` block (RDRA's or the mixing's noise kind), which its own prompt
  never has;
* R1-Searcher's logged format compliance reads the completion after its ``<think>`` prefix.
"""
from types import SimpleNamespace

import pytest
import torch

from kunlunlab.agent.backends import chat_prompt_ids
from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.eval.harness import EvalConfig, with_checkpoint_settings
from kunlunlab.models import load_llm
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.training.config import DAPOStageConfig, load_config
from kunlunlab.training.dapo import SearchRollout
from kunlunlab.training.evaluation import agent_settings
from kunlunlab.training.mixing import TrajectoryExample
from kunlunlab.training.peer_data import render
from kunlunlab.training.pipeline import rollout_config
from kunlunlab.training.rewards import RewardConfig
from scripted import ScriptedBackend

# (top-k, searches per question) each protocol declares: Search-R1 train_grpo.sh (retriever.topk=3, max_turns=4),
# ReSearch vllm_rollout.py (batch_search top_n=5; no limit but the response length: the run's 1024 tokens),
# R1-Searcher experience_maker.py (topk = 3; the generation at t == 8 ends), this project (paper: 3 and 8)
DECLARED = {"search_r1": (3, 4), "research": (5, 1024), "r1_searcher": (3, 8), "kunlun": (3, 8)}


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


def _arm(method: str, **overrides):
    return load_config(None, {"agent.method": method, "eval.method": method, "rewards.kind": method, **overrides})


@pytest.mark.parametrize("method", sorted(DECLARED))
def test_an_arm_runs_its_protocols_declared_budget_unless_the_comparison_states_one(method):
    declared = _arm(method, top_k=None)
    assert (rollout_config(declared).top_k, rollout_config(declared).max_searches) == DECLARED[method]
    settings = agent_settings(declared)  # what the checkpoint carries to its evaluation
    assert (settings["top_k"], settings["max_searches"]) == DECLARED[method]
    stated = _arm(method, top_k=1, max_searches=6)  # a comparison's budget: the same for every arm
    assert (rollout_config(stated).top_k, rollout_config(stated).max_searches) == (1, 6)
    assert (agent_settings(stated)["top_k"], agent_settings(stated)["max_searches"]) == (1, 6)


def test_a_search_r1_rollout_searches_its_declared_top_k_and_stops_at_its_declared_searches(tokenizer):
    calls = []

    def search(queries, k):
        calls.append(k)
        return [[Hit(f"{q}-{j}", f'"T{j}"\npassage {j}', 1.0) for j in range(k)] for q in queries]

    turns = [f"<think>Next.</think>\n<search> query {n} </search>" for n in range(6)]
    protocol = get_protocol("search_r1")
    prompt = chat_prompt_ids(tokenizer, protocol.messages("Q?"))
    engine = RolloutEngine(ScriptedBackend(tokenizer, {0: turns}), search, rollout_config(_arm("search_r1", top_k=None)),
                           "search_r1")
    (t,) = engine.run([prompt], ["Q?"])
    assert calls == [3, 3, 3, 3] and t.n_searches == 4 and t.finish == "search_limit"


def test_kunlunlab_eval_gives_a_peer_its_declared_budget_unless_told_or_trained_otherwise(tmp_path):
    released = with_checkpoint_settings(EvalConfig(dataset="world", method="research"), explicit={"method"})
    assert (released.rollout.top_k, released.rollout.max_searches) == (5, released.rollout.max_total_tokens)
    told = with_checkpoint_settings(EvalConfig(dataset="world", method="search_r1", rollout=RolloutConfig(top_k=2)),
                                    explicit={"method", "rollout.top_k"})
    assert (told.rollout.top_k, told.rollout.max_searches) == (2, 4)
    # a checkpoint trained here carries its run's budget (the comparison's), which its evaluation keeps
    (tmp_path / "kunlunlab_agent.json").write_text('{"method": "search_r1", "top_k": 1, "max_searches": 8}')
    trained = with_checkpoint_settings(EvalConfig(dataset="world", model=str(tmp_path)))
    assert (trained.method, trained.rollout.top_k, trained.rollout.max_searches) == ("search_r1", 1, 8)
    own = with_checkpoint_settings(EvalConfig(dataset="world", method="kunlun"), explicit={"method"})
    assert (own.rollout.top_k, own.rollout.max_searches) == (3, 8)


def _noisy_sample() -> TrajectoryExample:
    """A search-think SFT sample of the mixing's ``background`` noise kind: irrelevant passages in its prompt."""
    return TrajectoryExample(
        "Who founded Shylcel Holdings?", ["Ann Vale"],
        [{"role": "model", "train": True,
          "text": "<think>I need the founder.</think>\n<search><query>founder of Shylcel Holdings</query></search>"},
         {"role": "env", "train": False, "text": "\n<result>\n(1) Shylcel Holdings was founded by Ann Vale.\n</result>\n",
          "docs": [['"Shylcel Holdings"\nShylcel Holdings was founded by Ann Vale.']],
          "queries": ["founder of Shylcel Holdings"]},
         {"role": "model", "train": True, "text": "<think>Found.</think>\n<answer>\\boxed{Ann Vale}</answer>"}],
        background="(1) Orvik Lake is the deepest lake of Tarn.", quality="noisy", noise=["background"])


@pytest.mark.parametrize("name", ["search_r1", "research", "r1_searcher"])
def test_a_peers_sft_prompt_carries_no_background_block(name):
    rendered = render(_noisy_sample(), get_protocol(name), 300)
    prompt = "".join(m["content"] for m in rendered.prompt_messages)
    assert "<background>" not in prompt and "Orvik Lake" not in prompt
    assert rendered.prompt_messages == get_protocol(name).messages("Who founded Shylcel Holdings?")
    assert rendered.background is None and rendered.noise == []
    assert "Ann Vale" in rendered.text  # the sample itself is kept, in the peer's tags


def test_r1_searchers_logged_format_compliance_reads_the_completion_after_its_think_prefix(tokenizer):
    question = "Who founded Shylcel Holdings?"
    search = "I need the founder. <|begin_of_query|> founder of Shylcel Holdings <|end_of_query|>"
    answer = "The documents name her.</think>\n\n<answer> Ann Vale </answer>"

    def passages(queries, k):
        return [[Hit("p1", '"Shylcel Holdings"\nShylcel Holdings was founded by Ann Vale.', 1.0)] for _ in queries]

    rollout = SearchRollout(passages, tokenizer, {question: ["Ann Vale"]}, RolloutConfig(top_k=1, max_searches=8),
                            DAPOStageConfig(num_generations=2, dynamic_sampling=False),
                            RewardConfig(kind="r1_searcher_stage2"), protocol="r1_searcher")
    rollout._backend = lambda trainer, model: ScriptedBackend(tokenizer, {0: [search, answer], 1: [search, answer]})
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=torch.nn.Linear(1, 1),
                              num_generations=2, state=SimpleNamespace(global_step=0), args=SimpleNamespace(seed=0))
    rollout([question, question], trainer)
    stats = rollout.history[-1]
    assert stats["format_compliance"] == 1.0 and stats["accuracy"] == 1.0
