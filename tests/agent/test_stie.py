"""STIE (paper §2.2, eqs. 5–13 as the paper numbers them) on the paper's example (four rounds of "Russia"
variants, then "France") and on edge cases. Each test names the equations it checks: (6) overlap,
(7) difference, (8) aggregated difference, (9) thresholds, (10) replacement condition, (11) replacement,
(12) windowed frequency -> shielded set, (13) repeat count -> blocked set; termination and the final pick
are the paper's unnumbered prose. Every expected value is worked out by hand in the comments, with
W("Saint Louis") = {saint, louis}, W("Saint Petersburg") = {saint, peter}: O = 1/3, D = 2/3."""
from types import SimpleNamespace

import pytest

from kunlunlab.agent.stie import RoundInput, STIEConfig, STIEController, difference, overlap, replay, words
from kunlunlab.agent.stie import COLLECT_ALL_ROUNDS
from kunlunlab.studies.stie_tuning import cases_from_records, score

RUSSIA_THEN_FRANCE = [RoundInput("Russia", 0.40, ["d1"]), RoundInput("Russian Federation", 0.45, ["d2"]),
                      RoundInput("Russia", 0.42, ["d3"]), RoundInput("the Russia", 0.41, ["d4"]),
                      RoundInput("France", 0.35, ["d5"])]


def test_overlap_and_difference_on_stemmed_sets_of_words():
    """Eqs. (6) and (7)."""
    assert words("The Russian Federation") == {"russi", "feder"}
    # {russi} vs {russi, feder}: Jaccard 1/2; the complement (eq. 7) 1/2, in both directions.
    assert overlap(words("Russia"), words("Russian Federation")) == 0.5
    assert difference(words("Russia"), words("Russian Federation")) == 0.5
    assert difference(words("Russian Federation"), words("Russia")) == 0.5
    assert difference(words("Saint Louis"), words("Saint Petersburg")) == pytest.approx(2 / 3)
    # The earlier "added share" variant: Russia adds no word to Russian Federation (0), the reverse adds 1 of 2.
    assert difference(words("Russia"), words("Russian Federation"), "added_share") == 0.0
    assert difference(words("Russian Federation"), words("Russia"), "added_share") == 0.5
    assert difference(words("Paris"), words("Paris")) == 0.0 and difference(words("Paris"), words("Lyon")) == 1.0
    assert overlap(frozenset(), frozenset()) == 1.0


def test_config_defaults_let_repeat_blocking_act_and_reject_unknown_measures():
    cfg = STIEConfig()
    assert cfg.difference == "complement" and cfg.max_rounds == 5 and cfg.repeat_k == 3
    assert cfg.max_rounds > cfg.repeat_k
    with pytest.raises(ValueError):
        STIEConfig(difference="cosine")
    with pytest.raises(ValueError):
        STIEConfig(max_rounds=0)


def test_papers_example_blocks_the_loop_and_ends_on_the_new_answer():
    """Eqs. (9) validity, (11) replacement, (12) shielding, termination (i)."""
    answer, used, d = replay(RUSSIA_THEN_FRANCE, STIEConfig())  # defaults: K=3, 5 rounds
    # RF vs R: D = 0.5 < δ1 = 0.6; R vs RF: 0.5; the Russia vs Russia: 0; France differs fully from all.
    assert [x.redundant_with for x in d] == [None, 0, 1, 2, None]
    # Round 2 is redundant: replaced by the most confident form of its (unshielded) answer, RF (0.45).
    assert [x.accepted for x in d] == ["Russia", "Russian Federation", "Russian Federation",
                                       "Russian Federation", "France"]
    # Round 3 is the third Russia: shielded with every surface form; nothing else is left (all blocked).
    assert d[1].shielded == [] and d[2].shielded == ["Russia", "Russian Federation"] and d[2].all_blocked
    assert d[2].replaced and not d[1].replaced  # round 2's own form was already the most confident
    # Mean overlap with the answered rounds among the last three: 1/2, (1 + 1/2)/2, (1 + 1/2 + 1)/3, 0.
    assert d[0].mean_overlap is None
    assert [x.mean_overlap for x in d[1:]] == pytest.approx([0.5, 0.75, 5 / 6, 0.0])
    assert [x.stop for x in d] == [False, False, False, False, True]
    assert answer == "France" and used == 5 and d[-1].reason == "new_answer" and not d[-1].all_blocked


def test_a_new_answer_is_accepted_even_when_less_confident():
    """Eq. (11) with final_pick="latest" (the default): a valid a_t is accepted as it is."""
    # Without shielding (K=10), France (0.35) is still valid and replaces the more confident RF (0.45).
    answer, _, d = replay(RUSSIA_THEN_FRANCE, STIEConfig(repeat_k=10))
    assert answer == "France" and not d[-1].shielded and not d[-1].replaced
    # Saint Petersburg (0.5) after Saint Louis (0.8): D = 2/3 >= 0.6, valid, so it becomes the answer.
    _, _, d = replay([RoundInput("Saint Louis", 0.8, ["a"]), RoundInput("Saint Petersburg", 0.5, ["b"])],
                     STIEConfig())
    assert d[1].redundant_with is None and d[1].accepted == "Saint Petersburg" and not d[1].stop


def test_a_redundant_answer_is_replaced_by_the_most_confident_unshielded_candidate():
    """Eqs. (10) (the condition, with its margin) and (11) (the replacement)."""
    rounds = [RoundInput("Saint Louis", 0.8, ["a"]), RoundInput("Saint Petersburg", 0.5, ["b"]),
              RoundInput("Saint Petersburg", 0.3, ["c"])]
    answer, used, d = replay(rounds, STIEConfig())
    # Round 3 repeats round 2 (D = 0): candidates Saint Louis (0.8) and Saint Petersburg (0.5) -> Saint Louis.
    assert d[2].redundant_with == 1 and d[2].replaced and answer == "Saint Louis"
    assert used == 3 and not d[2].stop  # 3 < max_rounds, new documents, low confidence
    # A margin protects the redundant answer's own cluster: 0.8 <= 0.5 + 0.4, so it stays.
    assert replay(rounds, STIEConfig(margin=0.4))[0] == "Saint Petersburg"


def test_an_answer_repeated_k_times_is_shielded_and_blocked_even_when_confident():
    """Eqs. (12)-(13) over the whole memory (history_window None), and (10)-(11) with a shielded a_t."""
    rounds = [RoundInput("Saint Louis", 0.4, ["a"]), RoundInput("Saint Petersburg", 0.7, ["b"]),
              RoundInput("Saint Petersburg", 0.7, ["c"]), RoundInput("Saint Petersburg", 0.7, ["d"]),
              RoundInput("Saint Petersburg", 0.95, ["e"])]
    answer, used, d = replay(rounds, STIEConfig())
    # Round 3: redundant but the most confident candidate (0.7 > 0.4): kept. Round 4: n = 3 = K, shielded,
    # replaced by the only unshielded candidate, Saint Louis. Round 5: 0.95 is no "confident" stop when shielded.
    assert [x.accepted for x in d] == ["Saint Louis", "Saint Petersburg", "Saint Petersburg", "Saint Louis",
                                       "Saint Louis"]
    assert d[2].shielded == [] and d[3].shielded == ["Saint Petersburg"] and not d[3].all_blocked
    assert [x.stop for x in d] == [False, False, False, False, True] and d[-1].reason == "max_rounds"
    assert answer == "Saint Louis" and used == 5


def test_termination_uses_the_mean_overlap_over_the_recent_rounds():
    """Termination (i), unnumbered in the paper."""
    # Paris -> Lyon: valid, mean overlap 0 < 0.2: a new answer ends the loop at round 2.
    answer, used, d = replay([RoundInput("Paris", 0.5, ["a"]), RoundInput("Lyon", 0.4, ["b"])], STIEConfig())
    assert answer == "Lyon" and used == 2 and d[-1].reason == "new_answer"
    # Saint Louis Missouri, Saint Louis (redundant: D = 1/3), Saint Petersburg (valid: D = 2/3 and 3/4):
    # overlaps 1/3 and 1/4, mean 7/24 = 0.2917. The mean is below 0.3 although one overlap (1/3) is not.
    rounds = [RoundInput("Saint Louis Missouri", 0.5, ["a"]), RoundInput("Saint Louis", 0.5, ["b"]),
              RoundInput("Saint Petersburg", 0.5, ["c"])]
    _, used, d = replay(rounds, STIEConfig(overlap_stop=0.3))
    assert [x.redundant_with for x in d] == [None, 0, None]
    assert d[-1].mean_overlap == pytest.approx(7 / 24) and used == 3 and d[-1].reason == "new_answer"
    _, used, d = replay(rounds, STIEConfig(overlap_stop=0.29))  # 0.2917 >= 0.29: keep going
    assert used == 3 and not d[-1].stop


def test_a_low_mean_overlap_does_not_end_the_loop_on_a_redundant_answer():
    """Termination (i) needs a valid answer (eq. 9)."""
    # Marseille city vs Marseille: O = 1/2, D = 1/2 < δ1 = 0.6, redundant; its mean overlap with Paris, Lyon and
    # Marseille is 1/6 < 0.2, but only a valid answer ends the loop (criterion i). The first three rounds
    # run with rule (i) off (Lyon after Paris would end the loop at once), the fourth with the default 0.2.
    controller = STIEController(STIEConfig(overlap_stop=-1.0, max_rounds=8))
    for r in [RoundInput("Paris", 0.5, ["a"]), RoundInput("Lyon", 0.5, ["b"]), RoundInput("Marseille", 0.5, ["c"])]:
        assert not controller.step(0, r).stop
    controller.config = STIEConfig(overlap_stop=0.2, max_rounds=8)
    d = controller.step(0, RoundInput("Marseille city", 0.5, ["d"]))
    assert d.redundant_with == 2 and d.mean_overlap == pytest.approx(1 / 6) and not d.stop
    assert d.accepted == "Marseille"  # redundant: replaced by its cluster's first (equally confident) form


def test_the_added_share_measure_remains_selectable():
    """Eq. (7)'s earlier variant, through (9)."""
    # Russia after Russian Federation with δ1 = 0.4: complement D = 0.5 >= 0.4 (valid, a new answer);
    # the added share is 0 (redundant).
    rounds = [RoundInput("Russian Federation", 0.5, ["a"]), RoundInput("Russia", 0.5, ["b"])]
    _, _, d = replay(rounds, STIEConfig(delta1=0.4, overlap_stop=0.0))
    assert d[1].redundant_with is None and d[1].accepted == "Russia"
    _, _, d = replay(rounds, STIEConfig(delta1=0.4, overlap_stop=0.0, difference="added_share"))
    assert d[1].redundant_with == 0 and d[1].accepted == "Russian Federation"


def test_empty_history_accepts_the_first_answer_and_a_confident_one_stops():
    """Eq. (8) with no answered round (D̄ undefined, valid); termination (ii)."""
    answer, used, d = replay([RoundInput("Paris", 0.95, ["a"])], STIEConfig())
    assert answer == "Paris" and used == 1 and d[0].reason == "confident" and d[0].min_difference is None
    answer, used, d = replay([RoundInput(None, 0.1, [])], STIEConfig(max_rounds=1))
    assert answer is None and d[0].reason == "max_rounds"


def test_everything_blocked_falls_back_to_the_most_confident():
    """Eq. (11)'s fallback when C_t is empty (K = 1 shields every answer at once, eq. 12)."""
    rounds = [RoundInput("Oslo", 0.3, ["a"]), RoundInput("Bergen", 0.6, ["b"])]
    answer, _, d = replay(rounds, STIEConfig(repeat_k=1))  # K=1: every answer is shielded at once
    assert d[0].all_blocked and d[0].accepted == "Oslo"
    assert d[-1].all_blocked and answer == "Bergen" and d[-1].shielded == ["Bergen", "Oslo"]
    assert not d[-1].stop  # a shielded answer is never "new" nor "confident"


def test_no_new_information_terminates():
    """Termination (iii)."""
    rounds = [RoundInput("Oslo", 0.3, ["a", "b"]), RoundInput("Oslo", 0.3, ["a", "b"])]
    _, used, d = replay(rounds, STIEConfig())
    assert used == 2 and d[-1].reason == "no_new_info"


def test_online_controller_matches_replay_and_gives_feedback():
    controller = STIEController(STIEConfig())
    outcomes = [controller.observe(0, SimpleNamespace(answer=r.answer, confidence=r.confidence, doc_ids=r.doc_ids))
                for r in RUSSIA_THEN_FRANCE]
    assert [stop for stop, _ in outcomes] == [False, False, False, False, True]
    assert outcomes[0][1].startswith("Answer memory: Russia.") and "Blocked" not in outcomes[1][1]
    assert "Blocked (repeated too often): Russia, Russian Federation." in outcomes[2][1]
    assert outcomes[-1][1] is None
    assert controller.final_answer(0) == "France" and controller.final_answer(7) is None


def test_rounds_without_an_answer_neither_repeat_nor_get_accepted():
    """Eqs. (8)-(9) leave rounds without an answer out; (12)-(13) do not count them."""
    rounds = [RoundInput("Oslo", 0.3, ["a"]), RoundInput(None, 0.9, ["b"]), RoundInput(None, 0.9, ["c"])]
    answer, _, d = replay(rounds, STIEConfig(max_rounds=3, repeat_k=2))
    assert answer == "Oslo" and [x.redundant_with for x in d] == [None, None, None] and not d[-1].shielded
    assert [x.reason for x in d] == [None, None, "max_rounds"]


def test_aggregated_difference_is_the_minimum_over_the_answered_recent_rounds():
    """Eq. (8): D̄_t = min_k D(a_t, a_{t-k}) over the answered lags k = 1..3; rounds without an answer are left out."""
    rounds = [RoundInput("Saint Louis Missouri", 0.5, ["a"]), RoundInput("Saint Louis", 0.5, ["b"]),
              RoundInput("Saint Petersburg", 0.5, ["c"])]
    _, _, d = replay(rounds, STIEConfig(overlap_stop=-1.0))
    # Round 2: D({saint, louis}, {saint, louis, misso}) = 1 - 2/3 = 1/3. Round 3: D = 2/3 against Saint Louis,
    # 1 - 1/4 = 3/4 against Saint Louis Missouri: the minimum is 2/3.
    assert d[0].min_difference is None
    assert [x.min_difference for x in d[1:]] == pytest.approx([1 / 3, 2 / 3])
    # Paris, no answer, Lyon: lag 1 has no answer and is left out; lag 2 gives D(Lyon, Paris) = 1.
    _, _, d = replay([RoundInput("Paris", 0.5, ["a"]), RoundInput(None, 0.1, ["b"]), RoundInput("Lyon", 0.5, ["c"])],
                     STIEConfig(overlap_stop=-1.0))
    assert d[1].min_difference is None and d[2].min_difference == 1.0


def test_the_shielded_set_counts_within_the_history_window():
    """Eq. (12) with H = history_window, against eq. (13)'s count over the whole memory."""
    rounds = [RoundInput("Oslo", 0.6, ["a"]), RoundInput("Bergen", 0.5, ["b"]), RoundInput("Tromso", 0.3, ["c"]),
              RoundInput("Oslo", 0.45, ["d"])]
    # Round 4's Oslo differs fully from Tromso (lag 1) and Bergen (lag 2) but is Oslo three rounds back
    # (D = 0 < δ3): redundant with round 1, so Oslo has rounds {1, 4}: n = 2 = K.
    whole = replay(rounds, STIEConfig(repeat_k=2, overlap_stop=-1.0, max_rounds=8))[2][-1]
    assert whole.redundant_with == 0 and whole.shielded == ["Oslo"] and whole.blocked == ["Oslo"]
    # Whole memory: Oslo is shielded, the most confident candidate left is Bergen (0.5 > 0.3).
    assert whole.accepted == "Bergen" and whole.replaced
    # H = 2 (rounds 3 and 4): f(Oslo) = 1 < K, not shielded; it keeps its own best confidence 0.6 >= 0.5,
    # so round 4 keeps Oslo. Eq. (13) still blocks it: n(Oslo) = 2 = K.
    windowed = replay(rounds, STIEConfig(repeat_k=2, overlap_stop=-1.0, max_rounds=8, history_window=2))[2][-1]
    assert windowed.shielded == [] and windowed.blocked == ["Oslo"]
    assert windowed.accepted == "Oslo" and not windowed.replaced
    with pytest.raises(ValueError, match="history_window"):
        STIEConfig(repeat_k=3, history_window=2)


def test_a_shield_lapses_when_its_rounds_leave_the_window_and_the_block_stays():
    """Eqs. (12)-(13): Oslo, Oslo, Bergen with K = 2 and H = 2."""
    rounds = [RoundInput("Oslo", 0.6, ["a"]), RoundInput("Oslo", 0.7, ["b"]), RoundInput("Bergen", 0.5, ["c"])]
    controller = STIEController(STIEConfig(repeat_k=2, history_window=2, overlap_stop=-1.0, max_rounds=8))
    d = [controller.step(0, r) for r in rounds]
    # Round 2: Oslo twice in the window (rounds 1-2): shielded, and the only answer (all blocked).
    assert d[1].shielded == ["Oslo"] and d[1].all_blocked and d[1].accepted == "Oslo"
    # Round 3: the window holds rounds 2-3, f(Oslo) = 1: the shield lapsed; n(Oslo) = 2: still blocked.
    assert d[2].shielded == [] and d[2].blocked == ["Oslo"] and d[2].accepted == "Bergen"
    assert controller.blocked_answers(0) == ["Oslo"] and controller.blocked_answers(5) == []
    # With the lapsed shield the paper's pick sees Oslo (0.7) as a candidate again; without a window only Bergen.
    pick = dict(repeat_k=2, overlap_stop=-1.0, max_rounds=8, final_pick="confidence")
    assert replay(rounds, STIEConfig(history_window=2, **pick))[0] == "Oslo"
    assert replay(rounds, STIEConfig(**pick))[0] == "Bergen"


def test_the_blocked_set_is_available_from_the_controller_and_named_in_the_feedback():
    """Eq. (13): B_t = {a : n(a) >= K}, for a generation constraint on the answer span."""
    controller = STIEController(STIEConfig())
    assert controller.blocked_answers(0) == []
    for i, r in enumerate(RUSSIA_THEN_FRANCE[:3]):
        stop, feedback = controller.observe(0, SimpleNamespace(answer=r.answer, confidence=r.confidence,
                                                               doc_ids=r.doc_ids))
        # n(Russia) = 1, 2, 3 over the first three rounds: blocked from the third on (K = 3)
        assert controller.blocked_answers(0) == ([] if i < 2 else ["Russia", "Russian Federation"])
    assert "Blocked (repeated too often): Russia, Russian Federation. Do not give these again." in feedback


def test_the_final_pick_by_confidence_is_the_papers_ranking_and_latest_stays_the_default():
    """The ranking step (unnumbered): highest confidence, then lowest redundancy n(a), then the earlier answer."""
    assert STIEConfig().final_pick == "latest"
    two = [RoundInput("Saint Louis", 0.8, ["a"]), RoundInput("Saint Petersburg", 0.5, ["b"])]
    # Saint Petersburg is valid (D = 2/3 >= 0.6): "latest" answers with it, "confidence" with Saint Louis (0.8).
    assert replay(two, STIEConfig())[0] == "Saint Petersburg"
    answer, _, d = replay(two, STIEConfig(final_pick="confidence"))
    assert answer == "Saint Louis" and d[1].replaced and d[1].redundant_with is None
    # The paper's example without shielding (K = 10): France (0.35) ends the loop either way, but the most
    # confident candidate is the Russia answer in its best form, Russian Federation (0.45).
    assert replay(RUSSIA_THEN_FRANCE, STIEConfig(repeat_k=10))[0] == "France"
    assert replay(RUSSIA_THEN_FRANCE, STIEConfig(repeat_k=10, final_pick="confidence"))[0] == "Russian Federation"
    # With K = 3 Russia is shielded by round 3: France is the only candidate under both picks.
    assert replay(RUSSIA_THEN_FRANCE, STIEConfig(final_pick="confidence"))[0] == "France"
    # Lowest redundancy breaks a tie in confidence: Paris (n = 1) over Lyon (n = 2, round 3 repeats round 2).
    tie = [RoundInput("Paris", 0.5, ["a"]), RoundInput("Lyon", 0.5, ["b"]), RoundInput("Lyon", 0.5, ["c"])]
    assert replay(tie, STIEConfig(overlap_stop=-1.0))[0] == "Lyon"  # "latest": eq. (10) fails (0.5 <= 0.5)
    assert replay(tie, STIEConfig(overlap_stop=-1.0, final_pick="confidence"))[0] == "Paris"
    # Equal confidence and redundancy: the earlier answer.
    assert replay(tie[:2], STIEConfig(overlap_stop=-1.0, final_pick="confidence"))[0] == "Paris"
    with pytest.raises(ValueError, match="final_pick"):
        STIEConfig(final_pick="best")


def test_collect_all_rounds_disables_early_stopping():
    confident = [RoundInput("Paris", 0.95, ["a"])] * 5  # would stop at once (confident), then on no new info
    assert replay(confident, STIEConfig())[1] == 1
    answer, used, d = replay(confident, STIEConfig(**COLLECT_ALL_ROUNDS))
    assert used == 5 and [x.reason for x in d] == [None] * 4 + ["max_rounds"] and answer == "Paris"
    # France ends the paper's example early ("new_answer"); in collection mode all cached rounds are kept.
    assert replay(RUSSIA_THEN_FRANCE, STIEConfig(max_rounds=8))[2][-1].reason == "new_answer"
    _, used, d = replay(RUSSIA_THEN_FRANCE, STIEConfig(max_rounds=8, **COLLECT_ALL_ROUNDS))
    assert used == 5 and not any(x.stop for x in d)


def test_cases_from_records_and_score():
    records = [{"golds": ["France"], "trajectory": {"rounds": [
        {"answer": r.answer, "confidence": r.confidence, "doc_ids": list(r.doc_ids)} for r in RUSSIA_THEN_FRANCE]}},
        {"golds": ["Oslo"], "trajectory": {"rounds": [{"answer": "Oslo", "confidence": 0.95, "doc_ids": ["x"]}]}}]
    cases = cases_from_records(records)
    assert [len(rounds) for _, rounds in cases] == [5, 1]
    # France after 5 rounds (EM 1) and Oslo at once (EM 1): mean rounds 3; capped at 4 rounds: RF, EM 0.
    assert score(cases, STIEConfig()) == {"em": 1.0, "rounds": 3.0, "n": 2}
    assert score(cases, STIEConfig(max_rounds=4)) == {"em": 0.5, "rounds": 2.5, "n": 2}


def test_grid_search_on_simulated_loops_prefers_blocking_repeats():
    from kunlunlab.studies.stie_tuning import grid_search, simulated_cases

    cases = simulated_cases([f"gold {i}" for i in range(60)], ["Russia", "Spain", "Peru"], n_rounds=5, seed=1)
    base = STIEConfig(max_rounds=5)
    result = grid_search(cases, base, "repeat_k", [1, 2, 3, 5], "delta1", [0.3, 0.6, 0.9])
    assert len(result["em"]) == 3 and len(result["em"][0]) == 4
    assert result["best"]["em"] == max(max(row) for row in result["em"])
    one_round = score(cases, STIEConfig(max_rounds=1))
    assert result["best"]["em"] > one_round["em"]  # iterating with STIE beats stopping at the first answer
