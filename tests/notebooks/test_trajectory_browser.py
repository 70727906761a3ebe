"""Notebook 06's trajectory browser (``kunlunlab.viz.trajectory_browser``) on hand-written records shaped
like the ones ``kunlunlab.eval.harness.evaluate`` writes: every turn, every retrieved passage and STIE's
decisions appear in the rendered HTML in the order they happened; broken records render a message.

STIE's decisions are replayed with the defaults (δ = 0.6/0.5/0.4, K = 3, overlap_stop 0.2, confidence
ceiling 0.9, min_new_info 0.1, max_rounds 5). W truncates words to 5 characters, so
W("Ostmark") = {ostma}, W("Nordmark Castle") = {nordm, castl}: O = 0, D = 1.
"""
import json

import pytest

from kunlunlab.agent.stie import STIEConfig
from kunlunlab.viz.trajectory_browser import (TrajectoryBrowser, parse_passages, record_html, runs_from_suite,
                                              stie_config_for, trajectories_html, trajectory_browser)

RESULT_1 = ('\n<result>\n(1) "Veldra"\nVeldra is a country. Its capital is Ostmark.\n'
            '(2) "Ostmark"\nOstmark is a port city.\n</result>\n')
RESULT_2 = '\n<result>\n(1) "Veldra history"\nThe old capital was Nordmark Castle.\n</result>\n'
FEEDBACK = ("\n<result>\nAnswer memory: Ostmark. Verify with a new search that differs from earlier ones, "
            "then answer again.\n</result>\n")


def kunlun_record() -> dict:
    """Two answer rounds. Round 1 "Ostmark" (0.5): the first answer, valid, accepted; not confident
    (< 0.9), no earlier round, 1 < 5 rounds: STIE continues with feedback. Round 2 "Nordmark Castle"
    (0.6): D = 1 >= δ1, valid; mean overlap 0 < 0.2: stop, "new_answer"."""
    steps = [{"kind": "prefix", "text": "<think>"},
             {"kind": "model", "text": "I need the capital of Veldra.</think>\n<search> <query>capital of Veldra"
                                       "</query> </search>"},
             {"kind": "result", "text": RESULT_1},
             {"kind": "model", "text": "<think>The capital is Ostmark.</think>\n<short_answer>\\boxed{Ostmark}"
                                       "</short_answer>"},
             {"kind": "feedback", "text": FEEDBACK},
             {"kind": "model", "text": "<think>Check the history.</think>\n<search> <query>Veldra old capital"
                                       "</query> </search>"},
             {"kind": "result", "text": RESULT_2},
             {"kind": "model", "text": "<think>Maybe the castle.</think>\n<short_answer>\\boxed{Nordmark Castle}"
                                       "</short_answer>"}]
    rounds = [{"answer": "Ostmark", "logprob": -0.69, "confidence": 0.5, "queries": ["capital of Veldra"],
               "doc_ids": ["d1", "d2"], "issues": []},
              {"answer": "Nordmark Castle", "logprob": -0.51, "confidence": 0.6, "queries": ["Veldra old capital"],
               "doc_ids": ["d3"], "issues": []}]
    rdra = {"plan": "Find the country Veldra.\nFind its capital.", "plan_queries": ["Find the country Veldra"],
            "doc_ids": ["d1"], "error": None, "searches": 2,
            "background": 'Plan:\nFind the country Veldra.\n\nDocuments:\n(1) "Veldra atlas"\nVeldra lies north.'}
    return {"id": "q1", "question": "What is the capital of Veldra?", "golds": ["Ostmark"],
            "prediction": "Nordmark Castle", "em": 0.0, "f1": 0.0, "lj": None, "answer_source": "answer_tag",
            "searches": 4, "trajectory": {"steps": steps, "rounds": rounds, "rdra": rdra, "finish": "controller",
                                          "issues": [], "stie_answer": "Nordmark Castle"}}


def baseline_record() -> dict:
    return {"id": "q2", "question": "Who founded Ostmark?", "golds": ["Aldo Brenn"], "prediction": "Aldo Brenn",
            "em": 1.0, "f1": 1.0, "lj": None,
            "trajectory": {"steps": [{"kind": "search", "text": "Who founded Ostmark?",
                                      "queries": ["Who founded Ostmark?"]},
                                     {"kind": "result", "text": '(1) "Ostmark"\nOstmark was founded by Aldo Brenn.'},
                                     {"kind": "model", "text": "The answer is \\boxed{Aldo Brenn}."}]}}


def assert_in_order(text: str, *parts: str) -> None:
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found != -1, f"{part!r} missing after position {at}"
        at = found + len(part)


def test_turns_passages_and_stie_decisions_appear_in_order():
    page = record_html(kunlun_record(), label="world · kunlun")
    assert_in_order(page, "world · kunlun", "What is the capital of Veldra?", "Ostmark", "Nordmark Castle", "EM 0.0",
                    "RDRA background", "Find its capital.", "Find the country Veldra", "Veldra lies north.",
                    "turn 1 · search", "I need the capital of Veldra.", "capital of Veldra",
                    "2 passages", "Its capital is Ostmark.", "Ostmark is a port city.",
                    "turn 2 · answer", "The capital is Ostmark.",
                    "STIE decision · round 1", "valid: no earlier answered round", "accepted: the current answer is",
                    "continue: feedback to the model",
                    "STIE feedback to the model", "Answer memory: Ostmark.",
                    "turn 3 · search", "Veldra old capital", "The old capital was Nordmark Castle.",
                    "turn 4 · answer", "Maybe the castle.",
                    "STIE decision · round 2", "valid: differs enough", "mean overlap", "0.00",
                    "stop (new_answer)", "a new answer broke the loop",
                    "answer rounds and STIE", "STIE&#x27;s final answer: &#x27;Nordmark Castle&#x27;",
                    "finish: controller")
    assert "could not" not in page and "differs from the recorded" not in page


def test_replacement_and_blocking_are_named():
    """Rounds "red blue" (0.8), "red green" (0.5), "red green" (0.3): round 3 is redundant with round 2
    (D = 0 < δ1) and the rival "red blue" (0.8 > 0.5 + 0) replaces it. Round 2 "red green" after
    "red blue": O = 1/3, D = 2/3 >= 0.6, valid, mean overlap 1/3 >= 0.2: no stop."""
    answers = [("red blue", 0.8), ("red green", 0.5), ("red green", 0.3)]
    steps, rounds = [], []
    for i, (a, c) in enumerate(answers):
        steps.append({"kind": "model", "text": f"<think>try {i}</think><short_answer>\\boxed{{{a}}}</short_answer>"})
        if i < len(answers) - 1:
            steps.append({"kind": "feedback", "text": f"\n<result>\nAnswer memory: {a}.\n</result>\n"})
        rounds.append({"answer": a, "confidence": c, "doc_ids": [f"d{i}"]})
    record = {"id": "q", "question": "colours?", "golds": ["red blue"], "prediction": "red blue", "em": 1.0,
              "trajectory": {"steps": steps, "rounds": rounds, "finish": "controller", "stie_answer": "red blue"}}
    page = record_html(record)
    assert_in_order(page, "STIE decision · round 1", "STIE decision · round 2", "valid: differs enough",
                    "STIE decision · round 3", "redundant with round 2", "δ1",
                    "replaced: the current answer is &#x27;red blue&#x27;")
    # K = 2: "red green" is now repeated twice: shielded (eq. 12) and blocked from generation (eq. 13) at round 3.
    page_k2 = record_html(record, stie=STIEConfig(repeat_k=2))
    assert "shielded (given K times or more within the history window, eq. 12): red green" in page_k2
    assert "blocked from generation (given K times or more, eq. 13): red green" in page_k2


def test_baseline_record_shows_query_passages_and_output_without_stie():
    page = record_html(baseline_record(), label="world · naive_rag")
    assert_in_order(page, "Who founded Ostmark?", "EM 1.0", "retrieval query", "Who founded Ostmark?",
                    "1 passage", "Ostmark was founded by Aldo Brenn.", "turn 1 · model output",
                    "The answer is \\boxed{Aldo Brenn}.")
    assert "STIE" not in page


def test_a_rollout_without_stie_says_so():
    record = kunlun_record()
    t = record["trajectory"]
    t["steps"], t["rounds"], t["finish"] = t["steps"][:4], t["rounds"][:1], "answer"
    page = record_html(record)
    assert "no sign of STIE" in page and "STIE decision ·" not in page
    assert "Its capital is Ostmark." in page


def test_other_stie_settings_are_flagged():
    """Replayed with max_rounds = 1 the first round stops ("max_rounds") though two were recorded."""
    page = record_html(kunlun_record(), stie=STIEConfig(max_rounds=1))
    assert "stop (max_rounds)" in page and "the replay stops after round 1 but 2 rounds were recorded" in page
    assert "differs from the recorded" in page


@pytest.mark.parametrize("record, message", [
    (None, "not an evaluation record"),
    ("a line of text", "not an evaluation record"),
    ({"question": "No trajectory?", "golds": ["x"], "prediction": "y", "em": 0.0}, "no trajectory recorded"),
    ({"question": "Empty?", "golds": ["x"], "prediction": None, "em": 0.0, "trajectory": {}}, "no trajectory recorded"),
    ({"question": "Steps?", "golds": ["x"], "em": 0.0, "trajectory": {"steps": "oops", "rounds": []}},
     "the trajectory has no steps"),
    ({"question": "Rounds?", "golds": ["x"], "em": 0.0,
      "trajectory": {"steps": [{"kind": "model", "text": "<short_answer>\\boxed{x}</short_answer>"}],
                     "rounds": [{"answer": "x", "confidence": "high"}], "finish": "controller"}}, "malformed"),
    ({"question": "Odd step?", "golds": ["x"], "em": 0.0, "trajectory": {"steps": [42]}}, "not an object was skipped"),
])
def test_broken_records_render_a_message(record, message):
    page = record_html(record)
    assert message in page and "could not be rendered" not in page


def test_broken_tags_are_shown_not_raised():
    """An unclosed search and an answer without \\boxed are parsed as the protocol defines; the rounds
    that cannot be matched to answer turns are still listed."""
    steps = [{"kind": "model", "text": "<think>look up</think><search> <query>Veldra capital"},
             {"kind": "result", "text": "no tags here, no numbered passages"},
             {"kind": "model", "text": "<think>so</think><short_answer>Ostmark"}]
    record = {"question": "Broken?", "golds": ["Ostmark"], "prediction": "Ostmark", "em": 1.0,
              "trajectory": {"steps": steps, "finish": "controller",
                             "rounds": [{"answer": "Ostmark", "confidence": 0.5, "doc_ids": []},
                                        {"answer": "Ostmark", "confidence": 0.5, "doc_ids": []}]}}
    page = record_html(record)
    assert_in_order(page, "turn 1 · incomplete", "unclosed:search", "0 passages", "no tags here",
                    "turn 2 · answer", "unclosed:short_answer", "could not be matched")


def test_html_is_escaped():
    record = baseline_record()
    record["question"] = "<script>alert(1)</script>"
    page = record_html(record)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_parse_passages_groups_by_query_and_keeps_notices():
    text = ("\n<result>\nQuery 1: a b\n(1) first\nsecond line\n(2) two\nQuery 2: c d\n"
            "(1) (repeated query: see the earlier results above)\n</result>\n")
    groups, notes = parse_passages(text)
    assert groups == [("a b", ["first\nsecond line", "two"])]
    assert notes == ["(repeated query: see the earlier results above)"]
    assert parse_passages("\n<result>\n(no results)\n</result>\n") == ([], ["(no results)"])


def test_widget_follows_the_picked_run_and_question():
    runs = {"world · kunlun": [kunlun_record(), baseline_record()], "world · naive_rag": [baseline_record()]}
    browser = trajectory_browser(runs)
    assert isinstance(browser, TrajectoryBrowser)
    assert browser.run.options == ("world · kunlun", "world · naive_rag")
    assert [label for label, _ in browser.question.options] == ["1. ✗ What is the capital of Veldra?",
                                                                "2. ✓ Who founded Ostmark?"]
    assert "What is the capital of Veldra?" in browser.view.value and "STIE decision · round 2" in browser.view.value
    browser.question.value = 1
    assert "Who founded Ostmark?" in browser.view.value and "Veldra" not in browser.view.value
    browser.run.value = "world · naive_rag"
    assert browser.question.value == 0 and len(browser.question.options) == 1
    assert "world · naive_rag" in browser.view.value and "Ostmark was founded by Aldo Brenn." in browser.view.value
    assert browser.widget.children == (browser.run, browser.question, browser.view)


def test_widget_with_one_list_hides_the_run_picker_and_handles_no_records():
    browser = trajectory_browser([baseline_record()])
    assert browser.run.layout.display == "none" and "Who founded Ostmark?" in browser.view.value
    empty = trajectory_browser({"world · kunlun": []})
    assert "no evaluated questions" in empty.view.value


def test_runs_from_suite_puts_the_method_first_and_adds_ablations_once():
    k, b = [kunlun_record()], [baseline_record()]
    runs = runs_from_suite({"world": {"naive_rag": b, "kunlun": k}, "bamboogle": {"naive_rag": b, "kunlun": k}},
                           {"world": {"kunlun": k, "−STIE": k}}, first="kunlun")
    assert list(runs) == ["world · kunlun", "world · naive_rag", "bamboogle · kunlun", "bamboogle · naive_rag",
                          "world · −STIE"]


def test_static_page_holds_every_question():
    page = trajectories_html({"world · kunlun": [kunlun_record()], "world · naive_rag": [baseline_record()]})
    assert_in_order(page, "world · kunlun", "What is the capital of Veldra?", "world · naive_rag",
                    "Who founded Ostmark?")


def test_stie_config_follows_the_checkpoint_settings(tmp_path):
    assert stie_config_for(None) == STIEConfig()
    (tmp_path / "kunlunlab_agent.json").write_text(json.dumps({"stie_rounds": 3}))  # written before "stie"
    assert stie_config_for(str(tmp_path)).max_rounds == 3
    (tmp_path / "kunlunlab_agent.json").write_text(json.dumps({"stie": {"max_rounds": 4, "delta1": 0.7}}))
    assert stie_config_for(str(tmp_path)) == STIEConfig(max_rounds=4, delta1=0.7)
