"""FrugalRAG's search-budget reward: the optimal stop, its plumbing into TRL's reward functions and the
DAPO rollout's extra field."""
import math
from types import SimpleNamespace

import pytest

from kunlunlab.agent.rollout import RolloutConfig, Trajectory
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.training.rewards import RewardConfig, budget_score, reward_functions, score


@pytest.mark.parametrize("searches, background, want", [
    ([["a"], ["b"]], None, 1.0),                 # all evidence at the 2nd search, stopped there
    ([["a"], ["b"], ["c"]], None, 0.75),         # one search past the optimal stop
    ([["a"]], None, -0.5),                       # stopped early: half the evidence missing
    ([["a"], ["c"], ["c"]], None, -1.0),         # missing half and two searches past its best: -0.5 - 0.5
    ([["c"]], ["a", "b"], 0.75),                 # RDRA's background already held both: any search is extra
    ([], ["a", "b"], 1.0),                       # answered from the background
    ([["c"]] * 9, None, -1.0),                   # floored at -1
])
def test_budget_score_rewards_stopping_at_the_first_search_with_all_evidence(searches, background, want):
    assert math.isclose(budget_score(searches, ["a", "b"], background, penalty=0.25), want)


def test_budget_score_is_absent_without_gold_passages():
    assert budget_score([["a"]], []) is None


def test_budget_term_enters_the_weights_and_the_total_only_when_set():
    assert len(RewardConfig().weights) == len(reward_functions(RewardConfig())) == 5  # default unchanged
    cfg = RewardConfig(w_budget=0.5)
    fns = reward_functions(cfg)
    assert len(cfg.weights) == len(fns) == 6 and cfg.weights[-1] == 0.5
    text = "<think>so</think><short_answer>\\boxed{x}</short_answer>"
    assert fns[-1](["q"], [text], budget=[0.75]) == [0.75] and fns[-1](["q"], [text]) == [None]
    plain, with_budget = score(text, ["x"], RewardConfig()), score(text, ["x"], cfg, budget=-1.0)
    assert math.isclose(with_budget.total, plain.total - 0.5) and with_budget.budget == -1.0


def test_rollout_hands_each_trajectory_its_budget_score(backend):
    from kunlunlab.training.dapo import SearchRollout

    answer = "<think>so</think><short_answer>\\boxed{gold}</short_answer>"
    docs = {"q0": [["p1"], ["p2"]], "q1": [["p1"], ["p2"], ["p9"]]}

    class Scripted(SearchRollout):
        def _backend(self, trainer, model):
            return None

        def _roll(self, backend, questions, seed):
            out = []
            for q in questions:
                t = Trajectory(q, [1], [5], [1], [0.0], [{"kind": "model", "text": answer}], finish="answer",
                               answer="gold", doc_ids=docs[q], queries=[["x"]] * len(docs[q]))
                t.final_answer = "gold"
                out.append(t)
            return out

    rollout = Scripted(None, backend.tokenizer, {"q0": ["gold"], "q1": ["gold"]}, RolloutConfig(),
                       DAPOStageConfig(dynamic_sampling=False), RewardConfig(w_budget=1.0),
                       supporting={"q0": ["p1", "p2"], "q1": ["p1", "p2"]})
    model = SimpleNamespace(training=True, eval=lambda: None, train=lambda mode=True: None)
    trainer = SimpleNamespace(num_generations=1, model=model, state=SimpleNamespace(global_step=0),
                              args=SimpleNamespace(seed=0), accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    out = rollout(["q0", "q1"], trainer)
    assert out["budget"] == [1.0, 0.75]
    assert math.isclose(rollout.history[-1]["budget"], 0.875)
