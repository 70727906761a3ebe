"""STIE on the paper's example (four rounds of "Russia" variants, then "France") and on edge cases."""
from types import SimpleNamespace

from kunlunlab.agent.stie import RoundInput, STIEConfig, STIEController, difference, overlap, replay, words

RUSSIA_THEN_FRANCE = [RoundInput("Russia", 0.40, ["d1"]), RoundInput("Russian Federation", 0.45, ["d2"]),
                      RoundInput("Russia", 0.42, ["d3"]), RoundInput("the Russia", 0.41, ["d4"]),
                      RoundInput("France", 0.35, ["d5"])]


def test_papers_example_blocks_the_loop_and_ends_on_the_new_answer():
    answer, used, decisions = replay(RUSSIA_THEN_FRANCE, STIEConfig(max_rounds=8, repeat_k=3))
    assert [d.redundant_with for d in decisions] == [None, 0, 1, 2, None]
    assert decisions[2].shielded == ["Russia"] and decisions[2].all_blocked  # K=3 repeats: shielded
    assert answer == "France" and used == 5 and decisions[-1].reason == "new_answer"
    # With a larger K nothing is shielded, and the less confident new answer does not replace Russia.
    answer, _, decisions = replay(RUSSIA_THEN_FRANCE, STIEConfig(max_rounds=8, repeat_k=10))
    assert answer == "Russian Federation" and not decisions[-1].shielded


def test_overlap_and_difference_on_stemmed_bags_of_words():
    assert words("The Russian Federation") == {"russi", "feder"}
    assert overlap(words("Russia"), words("Russian Federation")) == 0.5
    assert difference(words("Russian Federation"), words("Russia")) == 0.5
    assert difference(words(""), words("x")) == 0.0 and overlap(frozenset(), frozenset()) == 1.0


def test_empty_history_accepts_the_first_answer_and_a_confident_one_stops():
    answer, used, d = replay([RoundInput("Paris", 0.95, ["a"])], STIEConfig())
    assert answer == "Paris" and used == 1 and d[0].reason == "confident"
    answer, used, d = replay([RoundInput(None, 0.1, [])], STIEConfig(max_rounds=1))
    assert answer is None and d[0].reason == "max_rounds"


def test_ties_keep_the_incumbent_and_a_margin_is_needed_to_replace():
    rounds = [RoundInput("Lyon", 0.5, ["a"]), RoundInput("Marseille city", 0.5, ["b"])]
    assert replay(rounds, STIEConfig(overlap_stop=0.0))[0] == "Lyon"
    rounds = [RoundInput("Lyon", 0.5, ["a"]), RoundInput("Marseille city", 0.53, ["b"])]
    assert replay(rounds, STIEConfig(overlap_stop=0.0, margin=0.05))[0] == "Lyon"
    assert replay(rounds, STIEConfig(overlap_stop=0.0, margin=0.01))[0] == "Marseille city"


def test_everything_blocked_falls_back_to_the_most_confident():
    rounds = [RoundInput("Oslo", 0.3, ["a"]), RoundInput("Bergen", 0.6, ["b"])]
    answer, _, d = replay(rounds, STIEConfig(repeat_k=1, overlap_stop=0.0))
    assert d[-1].all_blocked and answer == "Bergen" and sorted(d[-1].shielded) == ["Bergen", "Oslo"]


def test_no_new_information_terminates():
    rounds = [RoundInput("Oslo", 0.3, ["a", "b"]), RoundInput("Oslo", 0.3, ["a", "b"])]
    _, used, d = replay(rounds, STIEConfig(max_rounds=5))
    assert used == 2 and d[-1].reason == "no_new_info"


def test_online_controller_matches_replay_and_gives_feedback():
    controller = STIEController(STIEConfig(max_rounds=8))
    outcomes = [controller.observe(0, SimpleNamespace(answer=r.answer, confidence=r.confidence, doc_ids=r.doc_ids))
                for r in RUSSIA_THEN_FRANCE]
    assert [stop for stop, _ in outcomes] == [False, False, False, False, True]
    assert "Blocked (repeated too often): Russia" in outcomes[2][1]
    assert controller.final_answer(0) == replay(RUSSIA_THEN_FRANCE, STIEConfig(max_rounds=8))[0] == "France"


def test_rounds_without_an_answer_neither_repeat_nor_get_accepted():
    rounds = [RoundInput("Oslo", 0.3, ["a"]), RoundInput(None, 0.9, ["b"]), RoundInput(None, 0.9, ["c"])]
    answer, _, d = replay(rounds, STIEConfig(max_rounds=3, repeat_k=2))
    assert answer == "Oslo" and [x.redundant_with for x in d] == [None, None, None] and not d[-1].shielded


def test_grid_search_on_simulated_loops_prefers_blocking_repeats():
    from kunlunlab.agent.stie_tuning import grid_search, score, simulated_cases

    cases = simulated_cases([f"gold {i}" for i in range(60)], ["Russia", "Spain", "Peru"], n_rounds=5, seed=1)
    base = STIEConfig(max_rounds=5)
    result = grid_search(cases, base, "repeat_k", [1, 2, 3, 5], "delta1", [0.3, 0.6, 0.9])
    assert len(result["em"]) == 3 and len(result["em"][0]) == 4
    assert result["best"]["em"] == max(max(row) for row in result["em"])
    one_round = score(cases, STIEConfig(max_rounds=1))
    assert result["best"]["em"] > one_round["em"]  # iterating with STIE beats stopping at the first answer
