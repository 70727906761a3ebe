"""Summary-oriented questions (the long-answer mode of §2.3): their gold, their metric and their splits."""
import pytest

from kunlunlab.data.answers import fact_coverage
from kunlunlab.data.questions import QUESTION_TYPES, SUMMARY_TYPE, make_questions, summary_questions
from kunlunlab.data.splits import Splits, load_splits, world_questions


def test_a_summary_question_names_both_ends_and_its_facts_are_in_the_gold_passages(world):
    by_id = {p.id: p for p in world.passages}
    questions = summary_questions(world, 24, seed=3)
    assert len({q.question for q in questions}) == 24 and SUMMARY_TYPE not in QUESTION_TYPES
    for q in questions:
        assert q.summary and q.type == SUMMARY_TYPE and len(q.facts) == 2 == len(q.chain)
        assert q.question.startswith("Describe how ") and " is connected to " in q.question
        assert q.answers == [q.chain[0].answer]       # the box holds the link between the two ends
        assert q.chain[-1].answer in q.question       # ... the far end is named in the question
        for hop, fact in zip(q.chain, q.facts):
            assert hop.answer in by_id[hop.passage_id].text and hop.answer in fact
    assert not any(q.summary for q in make_questions(world, 10, seed=3))


@pytest.mark.parametrize("text, want", [
    ("Ara was produced by Bel. Bel is headquartered in Cim.", 1.0),
    ("Bel is headquartered in Cim. Ara was produced by Bel.", 1.0),  # order does not matter
    ("\\boxed{Bel}", (1 / 5 + 1 / 5) / 2),                         # the box counts as its content
    ("Ara, produced by Bel", (4 / 5 + 1 / 5) / 2),                   # punctuation and case do not matter
    ("", 0.0),
    (None, 0.0),
])
def test_fact_coverage_is_the_mean_share_of_each_facts_words(text, want):
    facts = ["Ara was produced by Bel.", "Bel is headquartered in Cim."]  # five words each
    assert fact_coverage(text, facts) == pytest.approx(want)
    assert fact_coverage(text, []) is None


def test_summary_share_adds_its_questions_and_leaves_the_factoid_split_as_it_was():
    """A run trained before summary questions existed is evaluated on the same factoid held-out questions."""
    plain = world_questions(Splits(train_questions=60))
    mixed = world_questions(Splits(train_questions=60, summary_share=0.25))
    assert sum(q.summary for q in mixed[1]) == 20 and len(mixed[1]) == 80   # 20 of 80: a quarter
    assert [q.question for q in mixed[1] if not q.summary] == [q.question for q in plain[1]]
    assert [q.question for q in mixed[2]] == [q.question for q in plain[2]]  # held-out factoid set unchanged
    with pytest.raises(ValueError, match="summary_share"):
        world_questions(Splits(summary_share=1.0))


def test_held_out_summary_questions_are_never_training_questions():
    data = load_splits(Splits(train_questions=80, summary_share=0.5, summary_heldout=12, world_heldout=4,
                              hotpot=False))
    train = {q.question for q in data.train}
    assert len(data.heldout_summary) == 12 and all(q.summary for q in data.heldout_summary)
    assert not train & {q.question for q in data.heldout_summary}
