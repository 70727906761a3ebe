"""Silver evidence chains (kunlunlab.data.evidence): 2Wiki-style questions linked to corpus paragraphs by title."""
from __future__ import annotations

from kunlunlab.data import Passage, QAExample
from kunlunlab.data.evidence import link_chain, link_evidence, TitleIndex

CORPUS = [
    Passage("0", "Blue Harbour (film)", "Blue Harbour is a 1961 drama film directed by Ansel Korrin."),
    Passage("1", "Ansel Korrin", "Ansel Korrin (1910 - 1980) was a film director. He was born in Tarvo."),
    Passage("2", "Mila Dross", "Mila Dross (born 1950) was a singer."),
    Passage("3", "Pell Varn", "Pell Varn (born 1941) was a painter."),
    Passage("4", "Quiet Orchard", "Quiet Orchard is a 1975 film directed by Ansel Korrin."),
    Passage("5", "Ansel", "Ansel is a given name."),
]


def ex(question, answers):
    return QAExample(id="q", question=question, answers=answers, source="2wikimultihopqa")


def test_a_bridge_question_links_the_entity_page_then_the_page_it_names_that_states_the_answer():
    linked = link_chain(ex("Where was the director of film Blue Harbour (Film) born?", ["Tarvo"]), TitleIndex(CORPUS))
    assert linked.type == "bridge"
    assert linked.supporting_titles == ["Blue Harbour (film)", "Ansel Korrin"]
    assert linked.supporting_ids == ["0", "1"]


def test_a_comparison_of_the_two_named_entities_links_both_pages():
    linked = link_chain(ex("Who was born first, Mila Dross or Pell Varn?", ["Pell Varn"]), TitleIndex(CORPUS))
    assert linked.type == "comparison" and linked.supporting_titles == ["Mila Dross", "Pell Varn"]
    yes_no = link_chain(ex("Are Mila Dross and Pell Varn from the same country?", ["no"]), TitleIndex(CORPUS))
    assert yes_no.supporting_ids == ["2", "3"]


def test_questions_the_linked_pages_cannot_decide_are_dropped():
    index = TitleIndex(CORPUS)
    # comparing the films' directors needs the directors' pages too: two film pages do not decide it
    assert link_chain(ex("Which film has the director born earlier, Blue Harbour or Quiet Orchard?",
                         ["Quiet Orchard"]), index) is None
    # a choice between two entities of which the corpus holds one
    assert link_chain(ex("Which film came out first, Quiet Orchard or Red Lantern?", ["Quiet Orchard"]), index) is None
    # no linked page states the answer
    assert link_chain(ex("Where was the director of film Blue Harbour (Film) born?", ["Oslo"]), index) is None
    # no corpus title in the question
    assert link_chain(ex("Who founded Nowhere Industries?", ["Ansel Korrin"]), index) is None


def test_only_maximal_title_mentions_count():
    assert TitleIndex(CORPUS).mentions("Ansel Korrin directed it") == ["ansel korrin"]  # not "ansel" as well


def test_every_linked_2wiki_chain_ends_at_a_page_that_states_its_answer(data_dir):
    from kunlunlab.data.answers import normalize_answer
    from kunlunlab.data.loaders import load_benchmark, load_named_corpus

    questions = load_benchmark("2wikimultihopqa")
    corpus = load_named_corpus("2wiki")
    by_id = {p.id: p for p in corpus}
    linked = link_evidence(questions, corpus)
    assert 30 <= len(linked) < len(questions)
    for q in linked:
        golds = [normalize_answer(a) for a in q.answers]
        last = by_id[q.supporting_ids[-1]]
        if q.type == "bridge":
            assert any(g in normalize_answer(last.text) for g in golds), q
        else:
            named = {normalize_answer(by_id[i].title.split(" (")[0]) for i in q.supporting_ids}
            assert any(g in ("yes", "no") or g in named for g in golds), q
