"""STIE inside the rollout engine: scripted rows (search, answer, search, answer, …) run through
``RolloutEngine.run`` with an ``STIEController``; checks the feedback blocks appended as environment
tokens, where each row stops, the final answers, and eq. (13)'s block handed to a session that cannot enforce
it (the scripted replay, like the OpenAI-compatible session). Expected values are worked out by hand below,
with W("Saint Louis") = {saint, louis}, W("Saint Petersburg") = {saint, peter}: O = 1/3, D = 2/3."""
import logging

import pytest

from kunlunlab.agent.backends import text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.agent.stie import STIEConfig, STIEController
from scripted import CountingSearch, ScriptedBackend, interleaved


def search(query: str) -> tuple[str, float]:
    return f"<search><query>{query}</query></search>", 0.9


def answer(text: str, confidence: float) -> tuple[str, float]:
    return f"<short_answer>\\boxed{{{text}}}</short_answer>", confidence


PREFIX = "<think>"
FIRST = ("plan</think>", 0.9)  # closes the prefix's <think>; the first turn is parsed as prefix + this

SCRIPTS = [
    # Row 0, K = 3: Saint Louis (0.8), then Saint Petersburg (0.5) four times.
    #  r1 accepted; r2 valid (D = 2/3 >= 0.6, mean overlap 1/3 >= 0.2): accepted although less confident;
    #  r3 redundant: replaced by the most confident candidate, Saint Louis (0.8 > 0.5);
    #  r4 redundant, n = 3 = K: Saint Petersburg is shielded, Saint Louis stays;
    #  r5 is round max_rounds = 5: stop. Final answer Saint Louis.
    [(FIRST[0] + search("louis film")[0], 0.9), answer("Saint Louis", 0.8),
     search("petersburg film"), answer("Saint Petersburg", 0.5),
     search("petersburg director"), answer("Saint Petersburg", 0.5),
     search("petersburg year"), answer("Saint Petersburg", 0.5),
     search("petersburg actor"), answer("Saint Petersburg", 0.5)],
    # Row 1: Russia, Russia (redundant), then France: valid, mean overlap with the last rounds 0 < 0.2,
    # so the loop ends on the new answer at round 3 although France is less confident.
    [(FIRST[0] + search("capital")[0], 0.9), answer("Russia", 0.5),
     search("country"), answer("Russia", 0.5),
     search("other country"), answer("France", 0.4)],
    # Row 2: confident at once (0.95 >= 0.9): one round, no feedback.
    [(FIRST[0] + search("paris")[0], 0.9), answer("Paris", 0.95)],
    # Row 3: the second answer comes without a search: no new documents (0 < 0.1), stop at round 2.
    [(FIRST[0] + search("oslo")[0], 0.9), answer("Oslo", 0.5), answer("Oslo", 0.5)],
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from kunlunlab.models import resolve_llm

    return AutoTokenizer.from_pretrained(resolve_llm(None))  # the embedded SmolLM2's tokenizer, no model


@pytest.fixture(scope="module")
def run(tokenizer):
    backend = ScriptedBackend(tokenizer, SCRIPTS)
    search_fn = CountingSearch()
    controller = STIEController(STIEConfig())  # defaults: K = 3, max_rounds = 5, δ = 0.6/0.5/0.4
    engine = RolloutEngine(backend, search_fn, RolloutConfig(top_k=1, max_total_tokens=4096))
    trajs = engine.run([[1], [2], [3], [4]], ["q0", "q1", "q2", "q3"], controller=controller,
                       prefixes=[PREFIX] * len(SCRIPTS))
    return backend, controller, trajs


def test_feedback_is_appended_as_environment_tokens(run, tokenizer):
    backend, _, trajs = run
    t = trajs[0]
    kinds = [s["kind"] for s in t.steps]
    assert kinds == ["prefix"] + ["model", "result", "model", "feedback"] * 4 + ["model", "result", "model"]
    feedback = [s["text"] for s in t.steps if s["kind"] == "feedback"]
    assert feedback[0] == RESULT_TEMPLATE.format(results=(
        "Answer memory: Saint Louis. Verify with a new search that differs from earlier ones, then answer again."))
    assert "Answer memory: Saint Louis, Saint Petersburg, Saint Petersburg." in feedback[2]
    assert "Blocked" not in feedback[2]
    assert "Blocked (repeated too often): Saint Petersburg. Do not give these again." in feedback[3]
    # Token level: model turns (mask 1) alternate with what the engine appended (mask 0); the appended
    # blocks after answer turns are exactly the feedback texts' tokens.
    model_ids = [text_ids(tokenizer, text) for text, _ in SCRIPTS[0]]
    env_ids = backend.appended[0]
    assert len(env_ids) == len(model_ids) - 1
    assert (t.completion_ids, t.mask) == interleaved(model_ids, env_ids)
    assert [env_ids[k] for k in (1, 3, 5, 7)] == [text_ids(tokenizer, f) for f in feedback]
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if m == 0)


def test_a_loop_is_blocked_and_the_run_ends_at_max_rounds(run):
    _, controller, trajs = run
    t = trajs[0]
    assert [r.answer for r in t.rounds] == ["Saint Louis"] + ["Saint Petersburg"] * 4
    assert [r.confidence for r in t.rounds] == pytest.approx([0.8, 0.5, 0.5, 0.5, 0.5])
    assert t.finish == "controller" and t.n_searches == 5
    assert t.answer == "Saint Petersburg"  # the model's last word …
    assert controller.final_answer(0) == "Saint Louis"  # … STIE's: the most confident unshielded answer


def test_a_new_answer_after_a_loop_ends_the_run(run):
    _, controller, trajs = run
    t = trajs[1]
    assert [r.answer for r in t.rounds] == ["Russia", "Russia", "France"]
    assert t.finish == "controller" and len([s for s in t.steps if s["kind"] == "feedback"]) == 2
    assert "Answer memory: Russia, Russia." in [s["text"] for s in t.steps if s["kind"] == "feedback"][1]
    assert controller.final_answer(1) == "France"


def test_confident_and_no_new_information_stops(run):
    _, controller, trajs = run
    assert len(trajs[2].rounds) == 1 and trajs[2].finish == "controller" and controller.final_answer(2) == "Paris"
    assert not any(s["kind"] == "feedback" for s in trajs[2].steps)
    t = trajs[3]
    assert len(t.rounds) == 2 and t.rounds[1].doc_ids == [] and t.finish == "controller"
    assert controller.final_answer(3) == "Oslo"


def test_a_block_the_session_cannot_enforce_is_reported_and_its_repeat_marked(tokenizer, caplog):
    """Row 0 alone: n(Saint Petersburg) = 3 = K after round 4 (rounds 2-4), so eq. (13)'s block is handed to the
    session after turn 8 (round 4's answer); the replay cannot enforce it, round 5 repeats the answer."""
    backend = ScriptedBackend(tokenizer, SCRIPTS[:1])
    engine = RolloutEngine(backend, CountingSearch(), RolloutConfig(top_k=1, max_total_tokens=4096))
    with caplog.at_level(logging.WARNING):
        trajs = engine.run([[1]], ["q0"], controller=STIEController(STIEConfig()), prefixes=[PREFIX])
    assert [(turn, block.answers) for turn, block in backend.blocks[0]] == [(8, ("Saint Petersburg",))]
    assert [r.answer for r in trajs[0].rounds][-1] == "Saint Petersburg" and trajs[0].issues == ["blocked_answer"]
    s = engine.stats
    assert (s.blocked_rounds, s.blocked_answer_repeats, s.unenforced_blocks, s.answer_interventions) == (1, 1, 1, 0)
    assert sum("cannot constrain generation" in r.message for r in caplog.records) == 1
