"""Drafts looked up in a row's own text (kunlunlab.agent.draft_lookup) and the session's decode steps that check
them: the same greedy tokens in fewer steps, and sampling from the same distribution."""
import math
from collections import Counter

import pytest
from transformers import AutoTokenizer

from kunlunlab.agent.backends import SamplingConfig
from kunlunlab.agent.draft_lookup import NgramDrafts
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.models import resolve_llm
from tests.scripted import PolicyModel, text_ids


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    drafts = NgramDrafts([5, 6, 7, 8, 9, 5, 6])
    assert drafts.draft(2) == [7, 8]          # (5, 6) ended at 2 before: tokens 2-3
    drafts.extend([1, 5, 6])
    assert drafts.draft(3) == [1, 5, 6]       # the latest earlier (5, 6) is the one that ended at 7
    assert NgramDrafts([1, 2, 3, 9, 3]).draft(2) == [9, 3]  # no (9, 3) before: the 1-gram (3) ended at 3
    assert NgramDrafts([1, 2, 3, 4]).draft(2) == [] and NgramDrafts([4, 4]).draft(0) == []
    assert NgramDrafts([7, 8, 7, 8]).draft(5) == [7, 8]     # clipped at the end of the text


WORDS = "alpha beta gamma delta epsilon zeta eta theta"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_llm(None))


def copying_policy(text: str) -> list[tuple[str, float]]:
    """The turn after the prompt's first line repeats the prompt's words, then closes the search."""
    head = f"{WORDS}\n"
    return [(head + f"<search>{WORDS}</search>", 10.0)] if "Question" in text else []


def test_drafts_give_the_greedy_tokens_of_one_token_steps_in_fewer_steps(tokenizer):
    prompts = [text_ids(tokenizer, f"Question {i}\n{WORDS}\n") for i in range(2)]
    runs = {}
    for k in (0, 2):
        backend = TransformersBackend(model=PolicyModel(tokenizer, copying_policy), tokenizer=tokenizer,
                                      dtype="float32", draft_tokens=k)
        session = backend.open(prompts)
        runs[k] = session.generate(range(2), 40, stop=["</search>"]), session.decode_steps
    (plain, plain_steps), (drafted, drafted_steps) = runs[0], runs[2]
    for row in range(2):
        assert drafted[row].text == plain[row].text == f"<search>{WORDS}</search>"
        assert drafted[row].token_ids == plain[row].token_ids and drafted[row].logprobs == plain[row].logprobs
    assert plain_steps == len(plain[0].token_ids) and drafted_steps < plain_steps


def test_sampling_with_drafts_draws_from_the_models_distribution(tokenizer):
    """After "x" the model writes " A" with probability 0.7 and " B" with 0.3 (scores 20 + ln 0.7, 20 + ln 0.3;
    every other token scores 0, e^-20 of the mass); the prompt's last line holds "x A", so " A" is drafted after the
    sampled "x". A kept draft ends the segment in one step, a rejected one's redraw takes a second: both happen, and
    " A" stays at 0.7 (a redraw that could pick " A" again would give 0.91)."""
    def policy(text: str) -> list[tuple[str, float]]:
        if "Question" not in text:
            return []
        if text.endswith("\nx"):
            return [("x A\nx A", 20 + math.log(0.7)), ("x A\nx B", 20 + math.log(0.3))]
        return [("x A\nx", 30.0)]

    backend = TransformersBackend(model=PolicyModel(tokenizer, policy), tokenizer=tokenizer, dtype="float32",
                                  draft_tokens=2)
    prompt = text_ids(tokenizer, "Question 0\nx A\n")
    counts, steps = Counter(), Counter()
    for seed in range(300):
        session = backend.open([prompt], SamplingConfig(temperature=1.0, seed=seed))
        counts[session.generate([0], 2)[0].text] += 1
        steps[session.decode_steps] += 1
    assert set(counts) <= {"x A", "x B"} and set(steps) == {1, 2}
    assert abs(counts["x A"] / 300 - 0.7) < 0.08  # binomial sd at n = 300: 0.026
