"""UR2 as one more recipe (issue 52): its protocol (kunlunlab/agent/protocols/ur2.py), its difficulty-aware retrieval
curriculum run inside the RL rollouts (kunlunlab/training/curriculum.py), its two-stage rewards and its recipe
(experiments/configs/training/peers/ur2.json).

The curriculum tests use an oracle backend whose closed-book skill is set per question, so each question's level is
known in advance: a question the model already answers is rolled out under the closed prompt (no retrieval offered)
and a hard one under UR2's search prompt, by the recipe's rule, and the stage advances with the staged reward."""
import json
from types import SimpleNamespace

import pytest
import torch

from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.agent.methods import MethodConfig, make_method
from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.protocols.ur2 import (UR2_CLOSED_SYSTEM, UR2_CURRICULUM, UR2_SYSTEM, ur2_extract, ur2_stage1,
                                          ur2_stage2)
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.cli import main
from kunlunlab.models import load_llm
from kunlunlab.paths import PROJECT_ROOT, read_jsonl
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.training.config import DAPOStageConfig, load_config
from kunlunlab.training.curriculum import Curriculum, offer_shares
from kunlunlab.training.dapo import SearchRollout
from kunlunlab.training.rewards import RewardConfig, reward_functions
from scripted import CountingSearch, PassiveSession, ScriptedBackend

GOLD = "Ann Vale"
# question -> how many of its 4 closed-book answers are right: easy, medium, hard, very hard by the recipe's rule
SKILL = {"Who founded Shylcel?": 4, "Who founded Brovik?": 2, "Who founded Tarnel?": 1, "Who founded Orvik?": 0}
EASY, MEDIUM, HARD, VERY_HARD = SKILL


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


class OracleBackend:
    """Answers by the prompt it continues: under the closed prompt the first ``skill`` of every 4 answers to a question
    are right and the rest wrong; under UR2's search prompt it searches once, then answers right from the documents. It records
    every prompt it was given and every closed-book answer."""

    name = "oracle"

    def __init__(self, tokenizer, skill: dict[str, int]):
        self.tokenizer, self.skill = tokenizer, skill
        self.closed_answers: dict[str, int] = {}
        self.prompts: list[str] = []

    def open(self, prompts, sampling=None):
        outer, texts = self, [self.tokenizer.decode(p) for p in prompts]
        outer.prompts += texts
        turns = {r: 0 for r in range(len(prompts))}

        class Session(PassiveSession):
            def generate(self, rows, max_new_tokens, stop=()):
                out = {}
                for r in rows:
                    question = next(q for q in outer.skill if q in texts[r])
                    if "search query" not in texts[r]:  # the closed prompt
                        k = outer.closed_answers.get(question, 0)
                        outer.closed_answers[question] = k + 1
                        right = k % 4 < outer.skill[question]  # of every 4 answers, the first ``skill`` are right
                        text = f"I recall it. \\boxed{{{GOLD if right else 'Nobody'}}}"
                    elif turns[r] == 0:
                        text = f"I should check. <|begin_of_query|> founder of {question[12:-1]} <|end_of_query|>"
                    else:
                        text = f"The documents say so. \\boxed{{{GOLD}}}"
                    turns[r] += 1
                    ids = text_ids(outer.tokenizer, text)
                    out[r] = Segment(ids, [-0.5] * len(ids), outer.tokenizer.decode(ids), "stop")
                return out

        return Session()


def _passages(queries, k):
    return [[Hit("p1", f'"Founders"\nThe company was founded by {GOLD}.', 1.0)] for _ in queries]


def _rollout(tokenizer, backend, questions=SKILL):
    rollout = SearchRollout(_passages, tokenizer, {q: [GOLD] for q in questions},
                            RolloutConfig(top_k=1, max_searches=4, max_turn_tokens=64, max_total_tokens=256),
                            DAPOStageConfig(num_generations=2, dynamic_sampling=False),
                            RewardConfig(kind="ur2", overlong_shaping=False, stage1_share=0.5), protocol="ur2")
    rollout._backend = lambda trainer, model: backend
    return rollout


def _trainer(step: int, max_steps: int = 4):
    return SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=torch.nn.Linear(1, 1),
                           num_generations=2, state=SimpleNamespace(global_step=step, max_steps=max_steps),
                           args=SimpleNamespace(seed=0))


def _pairs(questions):
    return [q for q in questions for _ in range(2)]


def test_the_protocol_speaks_ur2s_prompt_tags_and_boxed_answer(tokenizer):
    protocol = get_protocol("ur2")
    assert protocol.messages("Q?") == [{"role": "system", "content": UR2_SYSTEM}, {"role": "user", "content": "Q?"}]
    assert "<|begin_of_query|> your concise query (less than 20 words) <|end_of_query|>" in UR2_SYSTEM
    assert UR2_SYSTEM.endswith("give your final answer in the following format:  \n\\boxed{YOUR_ANSWER}")
    # the closed prompt is the same prompt without its search block
    assert "query" not in UR2_CLOSED_SYSTEM and UR2_CLOSED_SYSTEM.endswith("\\boxed{YOUR_ANSWER}")
    assert UR2_SYSTEM.startswith(UR2_CLOSED_SYSTEM.split("At the end")[0])
    turn = protocol.parse_turn('Hmm. <|begin_of_query|> "founder"  of   Shylcel <|end_of_query|>')
    assert turn.kind == "search" and turn.queries == ["founder of Shylcel"]
    assert protocol.parse_turn("So \\boxed{Ann Vale}").answer == "Ann Vale"
    assert protocol.parse_turn("I do not know.").kind == "none"
    block = protocol.result_block([["12 The first.", "The second."]], ["q"])
    assert block == "\n\n<|begin_of_documents|>\nThe first.\nThe second.\n<|end_of_documents|>\n\n"
    assert protocol.result_block([[]], ["q"]) == "\n\n<|begin_of_documents|>\nNone<|end_of_documents|>\n\n"
    assert ur2_extract("\\boxed{a} then <answer> b </answer>") == "b"  # extract_answer_math's order, the last match
    # the method runs it end to end: search, documents, boxed answer
    script = ["I should check. <|begin_of_query|> founder of Shylcel <|end_of_query|>", "So \\boxed{Qxzzyv}"]
    searches = CountingSearch()
    method = make_method("ur2", ScriptedBackend(tokenizer, {0: script}), searches,
                         MethodConfig(rollout=RolloutConfig(top_k=1)))
    (out,) = method.run(["Who founded Shylcel?"])
    assert searches.calls == [["founder of Shylcel"]] and out.prediction == "Qxzzyv" and out.searches == 1


def test_ur2s_rewards_follow_its_reward_servers():
    searched = ("I should check. <|begin_of_query|> founder of Shylcel <|end_of_query|>\n\n<|begin_of_documents|>\n"
                "Shylcel was founded by Ann Vale.\n<|end_of_documents|>\n\nSo the answer is \\boxed{Ann Vale}")
    closed = "I recall it. \\boxed{Ann Vale}"
    # stage 1 (retrieval behaviour, no answer term): +1 clean format, +3 for one search where offered
    assert ur2_stage1(searched, [GOLD]) == 4.0
    assert ur2_stage1(closed, [GOLD]) == -1.0  # offered and did not search: one violation
    assert ur2_stage1(closed, [GOLD], offered=False) == 1.0
    assert ur2_stage1(searched, [GOLD], offered=False) == 0.0  # searched where it was not offered
    two = searched.replace("\n\nSo", "\n\nAnd <|begin_of_query|> x <|end_of_query|>\n\n<|begin_of_documents|>\n"
                                     "y\n<|end_of_documents|>\n\nSo")
    assert ur2_stage1(two, [GOLD]) == 5.0
    # stage 2: 2 x F1 + 1 for a clean format
    assert ur2_stage2(searched, [GOLD]) == 3.0 and ur2_stage2(closed, [GOLD], offered=False) == 3.0
    assert ur2_stage2(searched, [GOLD], offered=False) == 2.0  # right, but it searched where not offered
    assert ur2_stage2(closed.replace(GOLD, "Ann"), [GOLD]) == pytest.approx(2 * 2 / 3 + 1)
    assert ur2_stage2("I do not know.", [GOLD]) == 0.0  # no answer: no answer term and a format violation
    # TRL's reward function reads the rollout's retrieval_offered column
    (stage2,) = reward_functions(RewardConfig(kind="ur2_stage2", overlong_shaping=False))
    assert stage2([None, None], [searched, searched], answers=[[GOLD], [GOLD]],
                  retrieval_offered=[True, False]) == [3.0, 2.0]


def test_the_difficulty_estimate_sorts_questions_by_their_closed_book_answers(tokenizer):
    backend = OracleBackend(tokenizer, SKILL)
    protocol = get_protocol("ur2")
    curriculum = Curriculum(protocol.curriculum, protocol, tokenizer, {q: [GOLD] for q in SKILL},
                            RolloutConfig(max_turn_tokens=64, max_total_tokens=256))
    searches = CountingSearch()
    levels = curriculum.estimate(backend, searches, list(SKILL))
    assert levels == {EASY: "easy", MEDIUM: "medium", HARD: "hard", VERY_HARD: "very_hard"}
    assert curriculum.shares == {EASY: 1.0, MEDIUM: 0.5, HARD: 0.25, VERY_HARD: 0.0}
    assert backend.closed_answers == {q: 4 for q in SKILL} and curriculum.generated == 16
    assert searches.calls == [] and all("search query" not in p for p in backend.prompts)  # closed book
    assert UR2_CURRICULUM.samples == 4 and [lv for lv, _ in UR2_CURRICULUM.levels] == list(
        ("easy", "medium", "hard", "very_hard"))


def test_questions_the_model_answers_train_without_retrieval_and_hard_ones_with_it(tokenizer):
    backend = OracleBackend(tokenizer, SKILL)
    rollout = _rollout(tokenizer, backend)
    questions = _pairs(SKILL)
    out = rollout(questions, _trainer(step=2))  # stage 2: from half the RL steps on
    stats = rollout.history[-1]
    draw = rollout.curriculum.draw(HARD)
    expected = {EASY: False, MEDIUM: False, HARD: draw < 5 / 7, VERY_HARD: True}
    assert out["retrieval_offered"] == [expected[q] for q in questions]
    prompts = [tokenizer.decode(ids) for ids in out["prompt_ids"]]
    for q, prompt in zip(questions, prompts):
        assert (UR2_SYSTEM in prompt) == expected[q] and (UR2_CLOSED_SYSTEM in prompt) == (not expected[q])
    searched = [c.count("<|begin_of_documents|>") for c in (tokenizer.decode(ids) for ids in out["completion_ids"])]
    assert searched == [1 if expected[q] else 0 for q in questions]
    # judged once each, 4 closed-book answers per question, recorded beside the rollouts (not charged to them)
    assert stats["difficulty_generated"] == 16 and stats["generated"] == len(questions)
    assert stats["curriculum_stage"] == 2 and stats["retrieval_offered"] == pytest.approx(
        sum(expected[q] for q in questions) / len(questions))
    # the stage-2 reward reads the offer: 2 x F1 + 1 for every answer here but the hard question's second closed-book
    # one, which is wrong (its first of the next 4: 1 right of every 4); a search where not offered would lose the 1
    rewards = [3.0] * 6 + ([3.0, 3.0] if expected[HARD] else [3.0, 1.0])
    assert stats["reward"] == pytest.approx(sum(rewards) / len(rewards))


def test_the_curriculum_advances_as_the_recipe_says(tokenizer, tmp_path):
    backend = OracleBackend(tokenizer, SKILL)
    rollout = _rollout(tokenizer, backend)
    rollout.log_path = tmp_path / "dapo_rollouts.jsonl"
    questions = _pairs([EASY, VERY_HARD])
    first = rollout(questions, _trainer(step=0))  # stage 1: every question offered retrieval (UR2's stage-1 data)
    assert first["retrieval_offered"] == [True] * 4 and rollout.history[-1]["curriculum_stage"] == 1
    assert rollout.history[-1]["difficulty_generated"] == 8
    second = rollout(questions, _trainer(step=1))  # still before half the steps
    assert second["retrieval_offered"] == [True] * 4 and rollout.history[-1]["difficulty_generated"] == 0
    third = rollout(questions, _trainer(step=2))  # stage 2: the easy question is no longer offered retrieval
    assert third["retrieval_offered"] == [False, False, True, True]
    assert rollout.history[-1]["curriculum_stage"] == 2 and rollout.history[-1]["difficulty_generated"] == 0
    assert rollout.curriculum.levels == {EASY: "easy", VERY_HARD: "very_hard"}  # judged once, at the first draw
    assert offer_shares(read_jsonl(rollout.log_path)) == {1: 1.0, 2: 0.5}
    # the staged reward switches at the same step: stage 1 scores a closed-book answer offered retrieval -1
    (reward,) = reward_functions(RewardConfig(kind="ur2", overlong_shaping=False, stage1_share=0.5))
    closed = ["I recall it. \\boxed{Ann Vale}"]
    for step, value in ((1, -1.0), (2, 3.0)):
        state = SimpleNamespace(global_step=step, max_steps=4)
        assert reward([None], closed, answers=[[GOLD]], trainer_state=state, retrieval_offered=[True]) == [value]
    assert rollout.curriculum.stage_of(1, 4) == 0 and rollout.curriculum.stage_of(2, 4) == 1


def test_the_recipe_is_ur2s_and_a_comparison_ledger_lists_the_estimate(tmp_path):
    cfg = load_config(PROJECT_ROOT / "experiments/configs/training/peers/ur2.json")
    assert (cfg.agent.method, cfg.rewards.kind, cfg.eval.method) == ("ur2", "ur2", "ur2")
    assert (cfg.dapo.loss_type, cfg.dapo.scale_rewards, cfg.dapo.beta, cfg.dapo.temperature, cfg.dapo.top_p) == \
        ("grpo", "batch", 0.0, 1.0, 0.9)
    from kunlunlab.training.comparison import budget_ledger

    log = tmp_path / "dapo_rollouts.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "rollouts": 4, "generated": 4, "prompts": ["q"],
                                         "difficulty_generated": d}) for s, d in ((0, 8), (2, 4))) + "\n")
    ledger = budget_ledger(cfg, [], log)
    assert ledger["rl_generated"] == 8 and ledger["rl_difficulty_generated"] == 12
    assert [c["difficulty_generated"] for c in ledger["rl_calls"]] == [8, 4]


@pytest.mark.slow
def test_the_ur2_recipe_trains_at_smoke_size_and_is_evaluated_by_kunlunlab_eval(tmp_path, tiny_model):
    config = PROJECT_ROOT / "experiments/configs/training/peers/ur2.json"
    run = tmp_path / "run"
    assert main(["train", "--smoke", "--config", str(config), "--run-dir", str(run), "--set", "eval.before=false",
                 "hotpot=false", "eval.summary_questions=0", f"model={tiny_model}"]) == 0
    state = json.loads((run / "state.json").read_text())
    assert state["steps"]["sft"] > 0 and state["steps"]["dapo"] == 1
    texts = ["".join(s["text"] for s in t["segments"]) for t in read_jsonl(run / "trajectories.jsonl")]
    assert any("<|begin_of_query|>" in t for t in texts) and any("\\boxed{" in t for t in texts)
    assert not any("<answer>" in t or "<search>" in t or "<think>" in t for t in texts)  # UR2's turns alone
    (row,) = read_jsonl(run / "dapo_rollouts.jsonl")
    assert row["curriculum_stage"] == 1 and row["retrieval_offered"] == 1.0  # one step: stage 1 offers every one
    assert row["difficulty_generated"] == 4 * len(set(row["prompts"]))  # each drawn question judged 4 times
    ledger = json.loads((run / "budget_ledger.json").read_text())
    assert ledger["rl_difficulty_generated"] == row["difficulty_generated"]
    log = read_jsonl(run / "dapo_log.jsonl")
    assert any(k.startswith("rewards/ur2_reward") for r in log for k in r), log
    out = tmp_path / "eval.jsonl"
    assert main(["eval", "--dataset", "world", "--method", "ur2", "--model", str(run / "dapo" / "final"),
                 "--limit", "2", "--index-kind", "bm25", "--out", str(out), "--max-total-tokens", "96"]) == 0
    records = read_jsonl(out)
    assert len(records) == 2 and all(r["trajectory"]["protocol"] == "ur2" for r in records)
