"""The peers' rewards on hand-written completions, against scores worked out by hand from the peers' reward code."""
import pytest

from kunlunlab.training.peer_rewards import (SEARCH_R1_FORMAT, peer_reward_functions, r1_searcher_stage1,
                                             r1_searcher_stage2, research_reward, search_r1_reward)

# --- Search-R1: completions after "<|im_start|>assistant\n"
SR1_GOOD = ("<think> I need the capital. </think>\n<search> capital of France </search>\n\n"
            '<information>Doc 1(Title: "Paris") Paris is the capital of France.</information>\n\n'
            "<think> It is Paris. </think>\n<answer> Paris </answer>")
SR1_NO_THINK = "<answer> The Paris! </answer>"


@pytest.mark.parametrize("text,golds,em,formatted", [
    (SR1_GOOD, ["paris"], 1.0, 1.0),
    (SR1_GOOD.replace("<answer> Paris", "<answer> Lyon"), ["Paris"], 0.0, 0.2),  # valid sequence, wrong answer
    (SR1_NO_THINK, ["Paris"], 1.0, 0.8),  # right answer, invalid sequence: 1 - 0.2 ("the" and "!" normalised away)
    (SR1_NO_THINK, ["Lyon"], 0.0, 0.1),  # wrong answer, invalid sequence: the final format score
    ("<think> hm </think>\n<search> capital", ["Paris"], 0.0, 0.0),  # no answer at all
    ("<answer> Lyon </answer> <answer> Paris </answer>", ["Paris"], 1.0, 0.8),  # the last answer counts
    ("<think>a</think>\n<answer> Paris, France </answer>", ["Paris"], 0.0, 0.2),  # exact match, not F1
])
def test_search_r1_exact_match_and_its_format_variant(text, golds, em, formatted):
    assert search_r1_reward(text, golds) == em
    assert search_r1_reward(text, golds, **SEARCH_R1_FORMAT) == pytest.approx(formatted)


def test_search_r1_retrieval_score_needs_a_gold_answer_in_the_documents():
    wrong = SR1_GOOD.replace("<answer> Paris", "<answer> Lyon")
    assert search_r1_reward(wrong, ["Paris"], 0.2, 0.1, 0.1) == pytest.approx(0.3)  # gold "Paris" was retrieved
    assert search_r1_reward(wrong, ["Marseille"], 0.2, 0.1, 0.1) == pytest.approx(0.2)


# --- ReSearch: completions after "<|im_start|>assistant\n", ending at EOS unless truncated
def _rs(answer: str, think: str = "<think> reasoning </think>") -> str:
    return (f"{think} <search> capital of France </search> <result>\n\"Paris\"\nParis is the capital of France.\n"
            f"</result> <think> so </think> <answer> The final answer is \\[ {answer} \\] </answer>")


@pytest.mark.parametrize("text,golds,truncated,score", [
    (_rs("\\boxed{Paris}"), ["Paris"], False, 1.0),
    (_rs("\\boxed{Paris France}"), ["Paris"], False, pytest.approx(2 / 3)),  # P 1/2, R 1: F1 2/3
    (_rs("\\boxed{Lyon}"), ["Paris"], False, 0.1),  # good format, wrong answer
    (_rs("\\boxed{no}"), ["yes"], False, 0.1),  # yes/no score only when equal
    (_rs("\\boxed{Paris}"), ["Paris"], True, 0.0),  # over length: no EOS
    (_rs("Paris"), ["Paris"], False, 0.0),  # no \boxed{}
    (_rs("\\boxed{Paris}", think="<think> reasoning"), ["Paris"], False, 0.0),  # think tags unpaired: 2 open, 1 closed
    (_rs("\\boxed{Paris}", think="").replace("<think> so </think> ", ""), ["Paris"], False, 0.0),  # no think at all
    (_rs("\\boxed{Paris}").replace("<think> so </think> ", ""), ["Paris"], False, 1.0),  # one think block suffices
    (_rs("\\boxed{Paris}") + " <answer> \\boxed{Paris} </answer>", ["Paris"], False, 0.0),  # two answers
    ("<think> a </think> <search> q </search> <answer> \\boxed{Paris} </answer>", ["Paris"], False, 0.0),  # no result
])
def test_research_f1_with_format_check(text, golds, truncated, score):
    assert research_reward(text, golds, truncated=truncated) == score


# --- R1-Searcher: the solution after the prompt's "<think>"
R1_DOCS = ("<|end_of_query|>\n\n<|begin_of_documents|>\n(1)Title: 2009 Fort Hood shooting Text:  Nidal Hasan, a U.S. "
           "Army major, fatally shot 13 people.\n<|end_of_documents|>\n\n")
R1_SEARCHED = ("I need the perpetrator.\n\n<|begin_of_query|> 2009 Fort Hood shooting perpetrator" + R1_DOCS +
               "The shooter was Nidal Hasan.</think>\n\n <answer> {} </answer>")
R1_DIRECT = "I know this one.</think>\n\n <answer> {} </answer>"


@pytest.mark.parametrize("text,gold,score", [
    (R1_SEARCHED.format("Nidal Hasan"), "Nidal Hasan", 2.0),  # right (+1), searched (+0.5), format (+0.5)
    (R1_DIRECT.format("Nidal Hasan"), "Nidal Hasan", 1.5),  # no retrieval: no retrieval bonus
    (R1_SEARCHED.format("Ivan Lopez"), "Nidal Hasan", 0.0),  # wrong (-1) + 0.5 + 0.5
    (R1_SEARCHED.format("Major Nidal Malik Hasan"), "Nidal Hasan", 2.0),  # cover EM: every gold word, any order
    (R1_SEARCHED.format("Nidal Hasan").replace("</answer>", ""), "Nidal Hasan", -0.5),  # unfinished: -1 + 0.5
    ("<think>" + R1_SEARCHED.format("Nidal Hasan"), "Nidal Hasan", 1.5),  # a second <think>: no format bonus
])
def test_r1_searcher_stage1_rewards_retrieval_and_format(text, gold, score):
    assert r1_searcher_stage1(text, [gold]) == score


def test_r1_searcher_stage1_without_the_answer_term_is_the_papers_reading():
    assert r1_searcher_stage1(R1_SEARCHED.format("Ivan Lopez"), ["Nidal Hasan"], with_answer=False) == 1.0
    assert r1_searcher_stage1(R1_DIRECT.format("Nidal Hasan"), ["Nidal Hasan"], with_answer=False) == 0.5


@pytest.mark.parametrize("text,gold,qwen,llama", [
    (R1_SEARCHED.format("Nidal Hasan"), "Nidal Hasan", 1.0, 1.0),
    (R1_DIRECT.format("Nidal Hasan"), "Nidal Hasan", 1.0, 1.0),  # stage 2 does not require a search
    (R1_SEARCHED.format("Nidal Malik Hasan"), "Nidal Hasan", pytest.approx(0.8), pytest.approx(0.8)),  # P 2/3, R 1
    (R1_SEARCHED.format("Nidal-Hasan"), "Nidal Hasan", 1.0, 1.0),  # punctuation becomes a space (not SQuAD's removal)
    (R1_DIRECT.format("True"), "yes", 1.0, 1.0),  # True/False read as yes/no
    (R1_DIRECT.format("a U.S. Army major named Nidal Hasan who shot 13 people at the base"), "Nidal Hasan",
     pytest.approx(2 * (2 / 13) / (2 / 13 + 1) - 2), pytest.approx(2 * (2 / 13) / (2 / 13 + 1))),  # > 10 words
    (R1_DIRECT.format("Nidal Hasan 尼达尔"), "Nidal Hasan", pytest.approx(0.8 - 2), pytest.approx(0.8 - 1)),
    (R1_SEARCHED.format("Nidal Hasan").replace("Army major", "Army major, 军医"), "Nidal Hasan", 1.0, 1.0),  # in docs
    (R1_SEARCHED.format("Nidal Hasan").replace("Army major", "Army assistant"), "Nidal Hasan", -1.0, 1.0),
    ("no answer here</think>", "Nidal Hasan", -2.0, -1.0),
])
def test_r1_searcher_stage2_f1_minus_format_penalty(text, gold, qwen, llama):
    assert r1_searcher_stage2(text, [gold]) == qwen
    assert r1_searcher_stage2(text, [gold], variant="llama") == llama


def test_r1_searcher_takes_the_best_alias():
    assert r1_searcher_stage2(R1_DIRECT.format("Hasan"), ["Nidal Hasan", "Hasan"]) == 1.0
    assert r1_searcher_stage1(R1_DIRECT.format("Hasan"), ["Nidal Hasan", "Hasan"]) == 1.5


def test_trl_reward_functions_read_answers_and_truncation():
    (research,) = peer_reward_functions("research")
    completions = [_rs("\\boxed{Paris}") + "<|im_end|>", _rs("\\boxed{Paris}")]
    assert research(["p", "p"], completions, answers=[["Paris"], ["Paris"]], finish=["answer", "budget"]) == [1.0, 0.0]
    assert research(["p"], completions[:1], answers=[["Paris"]]) == [1.0]
    (sr1,) = peer_reward_functions("search_r1", **SEARCH_R1_FORMAT)
    assert sr1(["p"], [[{"role": "assistant", "content": SR1_NO_THINK}]], answers=[["Lyon"]]) == [pytest.approx(0.1)]
    (stage2,) = peer_reward_functions("r1_searcher_stage2", variant="llama")
    assert stage2.__name__ == "r1_searcher_stage2_reward"
    assert stage2(["p"], [R1_DIRECT.format("Nidal Hasan 尼达尔")], answers=[["Nidal Hasan"]]) == [pytest.approx(-0.2)]
    with pytest.raises(ValueError, match="r1_searcher_stage1"):
        peer_reward_functions("search_r2")
