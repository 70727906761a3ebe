"""FrugalRAG's search-budget reward: the optimal stop, its plumbing into TRL's reward functions and the
DAPO rollout's extra field."""
import math
from types import SimpleNamespace

import pytest

from kunlunlab.agent.rollout import RolloutConfig, Trajectory
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.eval.metrics import optimal_stop, recall_by_search
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


def test_recall_curve_and_optimal_stop():
    # background holds "a"; the 1st search repeats it, the 2nd finds "b", the 3rd finds nothing new
    curve = recall_by_search([["a"], ["b", "x"], ["c"]], {"a", "b"}, ["a", "y"])
    assert curve == [0.5, 0.5, 1.0, 1.0] and optimal_stop(curve) == 2  # one search past the stop
    assert optimal_stop(recall_by_search([["c"], ["d"]], {"a", "b"}, ["a", "b"])) == 0  # background had all
    assert optimal_stop([0.0, 0.5, 0.5]) == 1 and recall_by_search([["a"]], []) is None
    assert recall_by_search([], {"a"}) == [0.0]


@pytest.mark.parametrize("searches, background, past_stop, redundant", [
    ([["a"], ["b"]], ["a"], 1.0, 0.75),          # re-searched the background's "a", then found "b"
    ([["b"]], ["a"], 1.0, 1.0),                  # read "a" from the background, searched only "b"
    ([["c"], ["a"], ["b"]], None, 1.0, 0.75),    # one search found nothing, before the optimal stop
    ([["a"], ["b"], ["b"]], None, 0.75, 0.75),   # past the stop: extra under both readings
    ([["a"], ["a"]], None, -0.75, -0.75),        # incomplete: -0.5 missing, one extra search
])
def test_redundant_reading_also_charges_searches_before_the_optimal_stop(searches, background, past_stop,
                                                                          redundant):
    assert math.isclose(budget_score(searches, ["a", "b"], background, 0.25, "past_stop"), past_stop)
    assert math.isclose(budget_score(searches, ["a", "b"], background, 0.25, "redundant"), redundant)
    with pytest.raises(ValueError, match="budget_extra must be one of"):
        RewardConfig(budget_extra="all")


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


TRAINER = SimpleNamespace(num_generations=1, state=SimpleNamespace(global_step=0), args=SimpleNamespace(seed=0),
                          model=SimpleNamespace(training=True, eval=lambda: None, train=lambda mode=True: None),
                          accelerator=SimpleNamespace(unwrap_model=lambda m: m))


def scripted_rollout(tokenizer, trajectories: dict, gold: str, rewards: RewardConfig):
    """A SearchRollout (no model, no RDRA) whose rollout of question q is ``trajectories[q]`` = (steps, doc
    ids per search), answered ``gold``; every question's gold passages are p1 and p2."""
    from kunlunlab.training.dapo import SearchRollout

    class Scripted(SearchRollout):
        def _backend(self, trainer, model):
            return None

        def _roll(self, backend, questions, seed):
            out = []
            for q in questions:
                steps, docs = trajectories[q]
                t = Trajectory(q, [1], [5], [1], [0.0], steps, finish="answer", answer=gold, doc_ids=docs,
                               queries=[["x"]] * len(docs))
                t.final_answer = gold
                out.append(t)
            return out

    return Scripted(None, tokenizer, {q: [gold] for q in trajectories}, RolloutConfig(),
                    DAPOStageConfig(dynamic_sampling=False), rewards,
                    supporting={q: ["p1", "p2"] for q in trajectories})


def test_rollout_hands_each_trajectory_its_budget_score(backend):
    steps = [{"kind": "model", "text": "<think>so</think><short_answer>\\boxed{gold}</short_answer>"}]
    docs = {"q0": [["p1"], ["p2"]], "q1": [["p1"], ["p2"], ["p9"]], "q2": [["p1"], ["p1"], ["p2"]]}
    trajectories = {q: (steps, d) for q, d in docs.items()}
    rollout = scripted_rollout(backend.tokenizer, trajectories, "gold", RewardConfig(w_budget=1.0))
    out = rollout(["q0", "q1"], TRAINER)
    assert out["budget"] == [1.0, 0.75]
    assert math.isclose(rollout.history[-1]["budget"], 0.875)
    # the rewards' budget_extra reaches the rollout: q2's 2nd search repeats p1, before the optimal stop
    for extra, want in (("past_stop", [0.75, 1.0]), ("redundant", [0.75, 0.75])):
        r = scripted_rollout(backend.tokenizer, trajectories, "gold", RewardConfig(w_budget=1.0, budget_extra=extra))
        assert r(["q1", "q2"], TRAINER)["budget"] == want


@pytest.mark.parametrize("searches, share, want", [
    ([["a"], ["b"]], 0.0, 1.0),           # all evidence, every quote seen: the full completion bonus
    ([["a"], ["b"]], 0.5, -0.5),          # all evidence retrieved, but half its quotes never shown
    ([["a"]], 0.5, -1.0),                 # half the evidence missing and half the quotes unseen
    ([], 1.0, -1.0),                      # no search, every quote invented: no saving paid
])
def test_grounded_budget_counts_unseen_quotes_as_missing_evidence(searches, share, want):
    assert math.isclose(budget_score(searches, ["a", "b"], None, 0.25, "past_stop", share), want)
    with pytest.raises(ValueError, match="ungrounded_share"):
        budget_score(searches, ["a", "b"], ungrounded_share=1.5)


def test_rollout_pays_the_budget_only_for_quotes_it_was_shown(backend):
    result = '\n<result>\n(1) "B"\nBea was born in Oslo.\n</result>\n'
    seen = [{"kind": "model", "text": "<think>Where?</think><search>x</search>"}, {"kind": "result", "text": result},
            {"kind": "model", "text": '<think>"She was born in Oslo." So: Oslo.</think>'
                                      '<short_answer>\\boxed{Oslo}</short_answer>'}]
    unseen = [{"kind": "model", "text": '<think>"She was born in Oslo in 1900." So: Oslo.</think>'
                                        '<short_answer>\\boxed{Oslo}</short_answer>'}]
    trajectories = {"seen": (seen, [["p1", "p2"]]), "unseen": (unseen, [["p1", "p2"]])}
    for grounded, want in ((False, [1.0, 1.0]), (True, [1.0, -1.0])):
        rewards = RewardConfig(w_budget=1.0, budget_grounded=grounded)
        r = scripted_rollout(backend.tokenizer, trajectories, "Oslo", rewards)
        assert r(["seen", "unseen"], TRAINER)["budget"] == want
