import pytest

from kunlunlab.agent.protocol import build_messages, extract_boxed, format_results, parse_turn


def test_clean_search_and_multi_query():
    t = parse_turn("<think>need the director</think>\n<search>Who directed The Silent River?</search>")
    assert (t.kind, t.queries, t.think, t.issues) == ("search", ["Who directed The Silent River?"], "need the director", [])
    t = parse_turn("<search><query>a</query> <query> b </query></search>")
    assert t.queries == ["a", "b"] and t.well_formed


def test_clean_answers():
    t = parse_turn("<think>done</think><short_answer>\\boxed{Paris}</short_answer>")
    assert (t.kind, t.answer, t.answer_mode, t.issues) == ("answer", "Paris", "short", [])
    t = parse_turn("<long_answer>It is Paris, since ... \\boxed{Paris}</long_answer>")
    assert (t.answer, t.answer_mode) == ("Paris", "long")


@pytest.mark.parametrize("text,kind,issue", [
    ("<think>hmm</think><search>who is", "incomplete", "unclosed:search"),
    ("<search> </search>", "invalid", "empty_query"),
    ("<search><query></query></search>", "invalid", "empty_query"),
    ("<think>unclosed think <search>x</search>", "search", "unclosed:think"),
    ("<search>outer <search>inner</search>", "search", "nested:search"),
    ("<short_answer>Paris</short_answer>", "answer", "missing_boxed"),
    ("<short_answer>\\boxed{Paris}</short_answer> and then more text", "answer", "text_after_answer"),
    ("<short_answer>\\boxed{Paris}", "answer", "unclosed:short_answer"),
    ("The answer is \\boxed{Paris}.", "answer", "missing_answer_tag"),
    ("I do not know.", "none", "no_action"),
    ("", "none", "no_action"),
    ("<short_answer>\\boxed{}</short_answer>", "answer", "empty_answer"),
])
def test_malformed_outputs_have_defined_outcomes(text, kind, issue):
    t = parse_turn(text)
    assert t.kind == kind and issue in t.issues, t


def test_defined_values_for_malformed_answers():
    assert parse_turn("<short_answer>Paris</short_answer>").answer == "Paris"
    assert parse_turn("<search>outer <search>inner</search>").queries == ["inner"]
    assert parse_turn("<short_answer>\\boxed{}</short_answer>").answer is None


def test_first_action_wins():
    t = parse_turn("<search>q1</search><short_answer>\\boxed{x}</short_answer>")
    assert t.kind == "search" and t.queries == ["q1"]
    t = parse_turn("<short_answer>\\boxed{x}</short_answer><search>q1</search>")
    assert t.kind == "answer" and "text_after_answer" in t.issues


def test_boxed_with_nested_braces_and_unclosed():
    assert extract_boxed("\\boxed{a {b} c}") == "a {b} c"
    assert extract_boxed("\\boxed{first} \\boxed{second}") == "second"
    assert extract_boxed("\\boxed{ok} \\boxed{broken") == "ok"
    assert extract_boxed("no box") is None


def test_prompt_and_results_blocks():
    msgs = build_messages("Who?", background="Doc A")
    assert msgs[0]["role"] == "system" and "<search>" in msgs[0]["content"] and "\\boxed" in msgs[0]["content"]
    assert msgs[1]["content"] == "<background>\nDoc A\n</background>\n<question>Who?</question>"
    assert build_messages("Who?")[1]["content"] == "<question>Who?</question>"
    block = format_results([["d1", "d2"], ["d3"]], ["q1", "q2"])
    assert block.startswith("\n<result>\nQuery 1: q1\n(1) d1\n(2) d2\nQuery 2: q2\n(1) d3") and block.endswith("</result>\n")
    assert "(no results)" in format_results([])
