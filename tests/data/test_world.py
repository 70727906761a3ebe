import re

import pytest

from kunlunlab.data import QUESTION_TYPES, World, make_questions


def test_same_seed_same_world_and_questions():
    a, b = World.generate(800, seed=3), World.generate(800, seed=3)
    assert [(p.id, p.title, p.text) for p in a.passages] == [(p.id, p.title, p.text) for p in b.passages]
    qa, qb = make_questions(a, 30, seed=2), make_questions(b, 30, seed=2)
    assert [(q.question, q.answers, q.chain) for q in qa] == [(q.question, q.answers, q.chain) for q in qb]


def test_different_seed_different_world():
    a, b = World.generate(800, seed=3), World.generate(800, seed=4)
    assert [p.text for p in a.passages] != [p.text for p in b.passages]


@pytest.mark.parametrize("n", [200, 1000, 5000])
def test_size_is_exact(n):
    assert len(World.generate(n, seed=0).passages) == n


def test_too_small_is_refused():
    with pytest.raises(ValueError, match="at least 200"):
        World.generate(50)


def test_every_type_is_drawn_evenly(world):
    qs = make_questions(world, 50, seed=5)
    counts = {t: sum(q.type == t for q in qs) for t in QUESTION_TYPES}
    assert set(counts.values()) == {10}
    assert len({q.question for q in qs}) == 50


def test_answerable_every_hop_is_stated_in_its_gold_passage(world, questions):
    by_id = {p.id: p for p in world.passages}
    for q in questions:
        assert q.supporting_ids and set(q.supporting_ids) <= set(by_id)
        assert len(q.chain) >= 2
        for hop in q.chain:
            passage = by_id[hop.passage_id]
            assert hop.answer in passage.text, (q.question, hop, passage.text)
        if q.answers[0] not in ("yes", "no") and q.type not in ("comparison", "bridge_comparison"):
            assert q.answers[0] == q.chain[-1].answer  # the last hop yields the final answer


def test_comparison_answers_are_consistent(world):
    for q in make_questions(world, 60, seed=9, types=("comparison", "bridge_comparison")):
        if q.answers[0] in ("yes", "no"):
            same = q.chain[0].answer == q.chain[1].answer
            assert q.answers[0] == ("yes" if same else "no")
        elif "first" in q.question or "earlier" in q.question:
            years = [int(h.answer) for h in q.chain if re.fullmatch(r"\d{4}", h.answer)]
            assert len(years) == 2 and years[0] != years[1]
            options = re.search(r", (.+) or (.+)\?$", q.question).groups()
            winner = options[0] if years[0] < years[1] else options[1]
            assert winner in q.answers


def test_distractors_share_surface_forms():
    w = World.generate(5000, seed=1)
    names = [p.name for p in w.people]
    assert len(set(names)) < len(names), "some people must share a full name"
    assert any("(disambiguation)" in p.title for p in w.passages)
    film_titles = [f.title for f in w.films]
    assert len(set(film_titles)) < len(film_titles), "some films must share a title"
    # Titles stay unique even where names collide, so gold passages are well defined.
    person_titles = [p.title for p in w.people]
    assert len(set(person_titles)) == len(person_titles)


def test_unknown_question_type_is_refused(world):
    with pytest.raises(ValueError, match="unknown question types"):
        make_questions(world, 5, types=("riddle",))
