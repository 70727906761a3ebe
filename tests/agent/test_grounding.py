"""Grounding of quoted evidence: a quote counts as seen only when one passage shown before the turn holds
every content word of it."""
import pytest

from kunlunlab.agent.grounding import content_words, quote_grounding
from kunlunlab.eval.metrics import summarize, ungrounded_quotes

BACKGROUND = ('Documents:\n(1) "The Last Tide"\nThe Last Tide is a 1918 film directed by Beata Dryndcus.\n'
              '(2) "Adela Gourkcian"\nAdela Gourkcian (born 1950) is a singer. Her father was Florian Zandbrai.')
RESULT = ('\n<result>\n(1) "Beata Dryndcus"\nBeata Dryndcus (1886 - 1948) was a director. '
          'She was born in Reithdegrevheim.\n</result>\n')


def steps(*parts):
    """("model" text | "result" text) pairs after the assistant prefix, as the rollout engine records them."""
    return [{"kind": "prefix", "text": "<think>"}] + [{"kind": k, "text": t} for k, t in parts]


def test_a_rephrased_sentence_of_a_shown_passage_is_grounded():
    g = quote_grounding(steps(("model", 'Who directed The Last Tide? "It was directed by Beata Dryndcus." So: '
                                        'Beata Dryndcus.</think>\n<search>x</search>')), BACKGROUND)
    assert (g.quotes, g.ungrounded, g.ungrounded_share) == (1, [], 0.0)


def test_a_relation_the_passage_does_not_state_is_not_grounded():
    # the passage names Florian Zandbrai as the father; the quote makes him the spouse
    g = quote_grounding(steps(("model", 'Who is her spouse? "Her spouse is Florian Zandbrai." So: Florian '
                                        'Zandbrai.</think><short_answer>\\boxed{x}</short_answer>')), BACKGROUND)
    assert (g.quotes, g.ungrounded, g.ungrounded_share) == (1, ["Her spouse is Florian Zandbrai."], 1.0)


def test_words_from_two_passages_do_not_ground_one_quote():
    # quoted after the result: "1918" is only in background passage 1, "Reithdegrevheim" only in the result;
    # both were shown, but no single passage holds both
    g = quote_grounding(steps(("model", "Where was Beata Dryndcus born?</think><search>x</search>"),
                              ("result", RESULT),
                              ("model", '<think>"Beata Dryndcus was born in Reithdegrevheim in 1918."</think>')),
                        BACKGROUND)
    assert g.ungrounded == ["Beata Dryndcus was born in Reithdegrevheim in 1918."]


def test_a_quote_is_checked_against_what_was_shown_before_its_turn():
    quote = '"She was born in Reithdegrevheim."'
    before = quote_grounding(steps(("model", f"Where was she born? {quote}</think><search>x</search>"),
                                   ("result", RESULT)), BACKGROUND)
    after = quote_grounding(steps(("model", "Where was Beata Dryndcus born?</think><search>x</search>"),
                                  ("result", RESULT), ("model", f"<think>{quote} So: Reithdegrevheim.</think>")),
                            BACKGROUND)
    assert (before.quotes, len(before.ungrounded)) == (1, 1)
    assert (after.quotes, len(after.ungrounded)) == (1, 0)


def test_only_think_quotes_with_content_words_count():
    g = quote_grounding(steps(("model", '"so" fine</think><search><query>"Beata Dryndcus" born</query></search>'),
                              ("result", RESULT)), None)
    assert g.quotes == 0 and content_words("It was by the") == frozenset()


def test_harness_counts_ungrounded_quotes_per_question():
    def record(text):
        return {"em": 1.0, "f1": 1.0, "acc": 1.0, "lj": None, "searches": 0, "seconds": 1.0,
                "trajectory": {"steps": steps(("model", text)), "rdra": {"background": BACKGROUND}}}

    seen = record('"It was directed by Beata Dryndcus." So: Beata Dryndcus.</think>')
    unseen = record('"Her spouse is Florian Zandbrai." "It was released in 1920." So: x.</think>')
    assert [ungrounded_quotes(r) for r in (seen, unseen)] == [0, 2]
    assert ungrounded_quotes({"em": 0.0}) is None
    assert summarize([seen, unseen])["ungrounded_quotes_per_question"] == pytest.approx(1.0)
