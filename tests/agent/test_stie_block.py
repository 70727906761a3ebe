"""STIE's eq. (13) as a constraint on generation: an answer repeated K times cannot be generated again inside
the answer tags. Checked at each layer with values worked out by hand: where a turn stands inside its answer
(:func:`open_answer`), which answers the controller blocks (:meth:`STIEController.answer_block`), the paper's
example shape (a loop of near-identical answers, then a different one) through the real local session and
the rollout engine, the embedded model, and the OpenAI-compatible session, which cannot constrain and says so.

Words W as in tests/agent/test_stie.py: W("Russia") = {russi}, W("Russian Federation") = {russi, feder}."""
import math
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from kunlunlab.agent.backends import AnswerBlock, chat_prompt_ids, text_ids
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.protocol import build_messages, open_answer, parse_turn
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.agent.stie import STIEConfig, STIEController, words
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.bench import AnswerBlockBenchConfig, bench_answer_block
from kunlunlab.models import resolve_llm
from kunlunlab.retrieval.client import free_port
from scripted import CountingSearch, PolicyModel


# -- where a turn stands inside its answer ---------------------------------------------------------------------
@pytest.mark.parametrize("text, piece, answer", [
    # inside a box: a "}" balancing the box's braces ends the answer on the box's content
    ("<think>x</think><short_answer>\\boxed{Saint", "}", "Saint"),
    ("<think>x</think><short_answer>\\boxed{Saint", " Louis}", "Saint Louis"),
    ("<think>x</think><short_answer>\\boxed{Saint", "{}", None),  # the "}" closes the inner brace only
    ("<long_answer>summary \\boxed{x{y}", "}", "x{y}"),
    # no box closed in the span: a tag ends the answer on the span's text, tags stripped (parse_turn's fallback)
    ("<think>x</think><short_answer>\\boxed{Saint", "</", "\\boxed{Saint"),
    ("<short_answer>Par", "is</", "Paris"),
    ("<short_answer>Par", "}", None),
    # an earlier box of the span is closed: a tag ends the answer on that box, already let through
    ("<short_answer>\\boxed{a} \\boxed{b", "</", None),
    ("<short_answer>\\boxed{a} \\boxed{b", "}", "b"),
])
def test_an_open_answer_ends_as_parse_turn_reads_it(text, piece, answer):
    assert open_answer(text).closed_by(piece) == answer
    if answer is not None:  # the same answer as the parser reads once the turn is complete
        assert parse_turn(text + piece + ("short_answer>" if piece.endswith("</") else "")).answer == answer


@pytest.mark.parametrize("text", ["no action", "<search><query>q</query> <short_answer>\\boxed{x",
                                  "<short_answer>\\boxed{a}", "<short_answer>\\boxed{a}</short_answer>"])
def test_outside_an_answer_there_is_nothing_to_constrain(text):
    assert open_answer(text) is None


# -- which answers the controller blocks -----------------------------------------------------------------------
def _observe(controller, answers):
    for k, a in enumerate(answers):
        controller.observe(0, SimpleNamespace(answer=a, confidence=0.5, doc_ids=[f"d{k}"]))


def test_the_controller_blocks_the_answer_and_what_it_would_count_as_the_answer():
    """Eq. (13) after Russia, Russian Federation, Russia (n(Russia) = 3 = K)."""
    controller = STIEController(STIEConfig())
    _observe(controller, ["Russia", "Russian Federation"])
    assert controller.answer_block(0) is None  # n = 2 < K: nothing blocked, generation untouched
    _observe(controller, ["Russia"])
    block = controller.answer_block(0)
    assert block.answers == ("Russia", "Russian Federation")
    assert block.rejects("the Russia")        # W = {russi}: the same words
    assert block.rejects("Russian Empire")    # {russi, empir} vs round 3's {russi}: D = 1/2 < δ1 = 0.6, redundant
    assert block.rejects("Moscow, Russia")    # {mosco, russi}: D = 1/2 < 0.6, the same
    # {russi, of, tsars}: D = 2/3 >= 0.6 against round 3, 3/4 >= 0.5 against round 2, 2/3 >= 0.4 against round 1
    assert not block.rejects("the Russia of the Tsars")
    assert not block.rejects("France") and not block.rejects("")
    off = STIEController(STIEConfig(block_generation=False))
    _observe(off, ["Russia", "Russian Federation", "Russia"])
    assert off.answer_block(0) is None and off.blocked_answers(0) == ["Russia", "Russian Federation"]


# -- the paper's example shape through the real session and the rollout engine -----------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_llm(None))  # the embedded SmolLM2's tokenizer


# What the policy model would answer in each round, ranked: the first scores 10, the second 5. Row 0 is the
# paper's loop (Russia, Russian Federation, Russia, …) that would echo Russia in round 4; row 1 would give
# another spelling of it, "the Russia"; row 2 never repeats an answer.
ANSWERS = {0: [["Russia"], ["Russian Federation"], ["Russia"], ["Russia", "France"], ["France"]],
           1: [["Russia"], ["Russian Federation"], ["Russia"], ["the Russia", "the Russia of the Tsars"], ["France"]],
           2: [["Oslo"], ["Bergen"]]}


def policy(text: str) -> list[tuple[str, float]]:
    """Each round is a search, then an answer; the row is read from the prompt ("Question <row>"). A text without
    one is an idle slot's (a decode step runs every slot; what it computes there is never kept): no preference."""
    if "Question " not in text:
        return []
    row = int(text.split("Question ", 1)[1][0])
    before = text.rpartition("</result>\n")[0]
    answered, searched = before.count("</short_answer>"), before.count("</search>")
    if searched > answered:
        return [(f"<short_answer>\\boxed{{{a}}}</short_answer>", 10.0 - 5 * k)
                for k, a in enumerate(ANSWERS[row][answered])]
    return [(f"<search><query>q{row} round {answered}</query></search>", 10.0)]


@pytest.fixture(scope="module")
def loops(tokenizer):
    backend = TransformersBackend(model=PolicyModel(tokenizer, policy), tokenizer=tokenizer, dtype="float32")
    runs = {}
    for block in (True, False):
        engine = RolloutEngine(backend, CountingSearch(), RolloutConfig(top_k=1, max_total_tokens=4096))
        controller = STIEController(STIEConfig(block_generation=block))  # K = 3, max_rounds = 5
        prompts = [text_ids(tokenizer, f"Question {i}\n") for i in range(3)]
        runs[block] = engine, controller, engine.run(prompts, ["q0", "q1", "q2"], controller=controller)
    return runs


def test_a_blocked_answer_is_never_generated_again(loops):
    """After round 3, n(Russia) = 3 = K: Russia and every answer STIE would count as it are blocked."""
    engine, controller, trajs = loops[True]
    # Row 0: round 4's Russia is turned away at its first token; the second choice, France, is valid with mean
    # overlap 0 < 0.2 against the last three rounds: the loop ends at round 4 (not 5) on France.
    assert [r.answer for r in trajs[0].rounds] == ["Russia", "Russian Federation", "Russia", "France"]
    # Row 1: "the Russia" cannot close its box (same words as Russia); the model continues it into the valid
    # "the Russia of the Tsars" (mean overlap (1/3 + 1/4 + 1/3)/3 = 11/36 >= 0.2: no stop), then France.
    assert [r.answer for r in trajs[1].rounds] == ["Russia", "Russian Federation", "Russia",
                                                   "the Russia of the Tsars", "France"]
    assert [r.answer for r in trajs[2].rounds] == ["Oslo", "Bergen"]  # never blocked
    assert [controller.final_answer(i) for i in range(3)] == ["France", "France", "Bergen"]
    # How often STIE intervened: 3 answer rounds ran under a block (row 0: round 4; row 1: rounds 4 and 5), and
    # in 2 of them it banned the token the model wanted (row 0: "Russia" after "{"; row 1: "}" after "the Russia").
    s = engine.stats
    assert (s.blocked_rounds, s.answer_interventions, s.blocked_answer_repeats, s.unenforced_blocks) == (3, 2, 0, 0)
    assert [[st.get("interventions", 0) for st in t.steps if st["kind"] == "model"] for t in trajs[:2]] == \
        [[0] * 7 + [1], [0] * 7 + [1, 0, 0]]
    assert not any("blocked_answer" in t.issues for t in trajs)


def test_the_logprobs_stay_the_models_own_under_a_block(loops, tokenizer):
    """Row 0, round 4: France scores 5 against the banned Russia's 10 and 49 150 tokens at 0. Its recorded
    log-prob is the model's, ln(e^5 / (e^10 + e^5 + 49150)) = -6.1750, not the masked ln(e^5 / (e^5 + 49150))
    = -5.8056, so STIE's confidence sees how little the model believed the answer it was turned to."""
    _, _, trajs = loops[True]
    turn = [st for st in trajs[0].steps if st["kind"] == "model"][-1]
    assert turn["text"] == "<short_answer>\\boxed{France}</short_answer>"
    france = text_ids(tokenizer, "France")[0]
    ids, lps, mask = trajs[0].completion_ids, trajs[0].logprobs, trajs[0].mask
    at = max(i for i, t in enumerate(ids) if t == france and mask[i])
    assert lps[at] == pytest.approx(math.log(math.exp(5) / (math.exp(10) + math.exp(5) + 49150)), abs=1e-3)
    assert lps[at] == pytest.approx(-6.1750, abs=1e-3)


def test_without_the_block_the_loop_repeats_and_nothing_else_changes(loops):
    """block_generation=False: only the feedback note; round 4 repeats the blocked answer (row 0 verbatim, row 1
    as "the Russia"), and both end on France at round 5. Up to the first blocked round the tokens are identical."""
    engine, _, trajs = loops[False]
    assert [r.answer for r in trajs[0].rounds] == ["Russia", "Russian Federation", "Russia", "Russia", "France"]
    assert [r.answer for r in trajs[1].rounds] == ["Russia", "Russian Federation", "Russia", "the Russia", "France"]
    assert engine.stats.blocked_rounds == engine.stats.answer_interventions == 0
    blocked = loops[True][2]
    assert trajs[2].completion_ids == blocked[2].completion_ids  # never repeats K times: the same trajectory
    for i in (0, 1):
        turns = [st["text"] for st in trajs[i].steps]
        assert turns[:14] == [st["text"] for st in blocked[i].steps][:14]  # rounds 1-3 and round 4's search


# -- the embedded model -----------------------------------------------------------------------------------------
QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "What is the capital of Japan?"]


def test_the_embedded_model_cannot_close_a_blocked_answer_and_other_rows_are_untouched(backend, monkeypatch):
    """Rows 0-1 open the box in the prompt and are blocked on the answer they give without a block; row 2 is
    blocked too but writes a search, never an answer; row 3 has no block. Rows 2-3 generate the same tokens (one
    token a decode step: a blocked row checks no drafts, so with drafts the two sessions' steps had other widths,
    and bf16 sums of other shapes round differently)."""
    monkeypatch.setattr(backend, "draft_tokens", 0)
    opener = "<think>I know this.</think>\n<short_answer>\\boxed{"
    prefixes = [opener, opener, "<think>I need to look this up.</think>\n<search>", opener]
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), p)
               for q, p in zip(QUESTIONS + QUESTIONS[:1], prefixes)]
    free = backend.open(prompts).generate(range(4), 40)
    firsts = [parse_turn(p + free[i].text).answer for i, p in enumerate(prefixes)]
    assert all(firsts[i] for i in (0, 1, 3)) and "_answer>" not in free[2].text
    session = backend.open(prompts)
    assert session.block_answers({i: AnswerBlock((firsts[i],), lambda a, w=words(firsts[i]): words(a) == w)
                                  for i in (0, 1)} | {2: AnswerBlock(("Paris",), lambda a: "paris" in a.lower())})
    blocked = session.generate(range(4), 40)
    for i in (0, 1):
        again = parse_turn(prefixes[i] + blocked[i].text).answer
        assert words(again) != words(firsts[i]) and blocked[i].interventions >= 1
    for i in (2, 3):
        assert blocked[i].token_ids == free[i].token_ids and blocked[i].interventions == 0


def test_the_openai_compatible_session_says_it_cannot_block(backend):
    remote = OpenAIBackend(f"http://127.0.0.1:{free_port()}", backend.name, retries=0, timeout=2)
    session = remote.open([[1, 2, 3]])
    assert session.block_answers({0: AnswerBlock(("Paris",), lambda a: a == "Paris")}) is False


def test_the_answer_block_benchmark_runs_and_leaves_unblocked_rows_alone():
    """``python -m kunlunlab.bench answer-block`` at a tiny size: rows without a block do no block work at all and
    generate what they generate with no block in the batch."""
    out = bench_answer_block(AnswerBlockBenchConfig(batch=4, tokens=4, repeats=1))
    assert out["block_check_ms_per_step_none"] == 0.0 and out["block_check_ms_per_step_all"] > 0
    assert out["unblocked_rows_unchanged"] and out["threads"] == 1
