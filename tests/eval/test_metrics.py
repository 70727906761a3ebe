import pytest

from kunlunlab.eval.metrics import cover_em, exact_match, f1, normalize_answer, retrieval_recall


@pytest.mark.parametrize("raw,norm", [("The  Eiffel Tower!", "eiffel tower"), ("A cat, an owl", "cat owl"),
                                      ("Théâtre", "théâtre"), ("U.S.A.", "usa"), ("  ", "")])
def test_normalisation(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_over_aliases():
    assert exact_match("the Mask of Fu Manchu", ["Mask of Fu Manchu", "The Mask of Fu Manchu"]) == 1.0
    assert exact_match("Fu Manchu", ["Mask of Fu Manchu"]) == 0.0
    assert exact_match(None, "x") == 0.0
    assert exact_match("12 June 1516", "12 June 1516.") == 1.0


def test_f1_partial_and_max_over_golds():
    assert f1("Chief of Protocol", "Chief of Protocol") == 1.0
    assert f1("the chief", "Chief of Protocol") == pytest.approx(0.5)  # precision 1, recall 1/3
    assert f1("Paris France", ["London", "Paris"]) == pytest.approx(2 / 3)


def test_yes_no_must_match_exactly():
    assert f1("yes", "yes") == 1.0
    assert f1("no it is not", "no") == 0.0
    assert f1("yes", "no") == 0.0
    assert f1("noanswer", "noanswer") == 1.0


def test_cover_em_is_token_aligned():
    assert cover_em("The answer is James Madison.", "james madison") == 1.0
    assert cover_em("Madisonville", "madison") == 0.0
    assert cover_em("", "x") == 0.0


def test_empty_golds_and_recall():
    with pytest.raises(ValueError):
        exact_match("x", [])
    assert retrieval_recall(["Ed Wood", "Other"], ["Ed Wood", "Scott Derrickson"]) == 0.5
    assert retrieval_recall(["x"], []) is None
