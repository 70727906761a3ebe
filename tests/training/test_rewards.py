"""Dual-mode rewards (eqs. 17-18) on the hand-written cases, the parse record, and the TRL adapters."""
import math

import pytest

from kunlunlab.studies.reward_cases import REWARD_CASES
from kunlunlab.training.rewards import (ParseRecord, RewardConfig, overlong_penalty, parse_completion,
                                        reward_functions, score)


@pytest.mark.parametrize("case", REWARD_CASES, ids=lambda c: c["name"])
def test_each_component_on_the_hand_written_cases(case):
    record = parse_completion(case["text"], model_tokens=case.get("model_tokens"))
    got = score(record, case["golds"], facts=case.get("facts"))
    for key, want in case["expect"].items():
        value = getattr(got, key)
        assert (value is None) if want is None else math.isclose(value, want, abs_tol=1e-9), (key, value, want)


def test_totals_follow_eq17_for_short_and_eq18_for_long_answers():
    cfg = RewardConfig(w_format=0.3, w_length=0.2, w_accuracy=1.5, w_structure=0.7)
    by_name = {c["name"]: c for c in REWARD_CASES}
    short = score(by_name["correct"]["text"], by_name["correct"]["golds"], cfg)
    assert short.mode == "short" and short.structure is None
    assert math.isclose(short.total, 0.3 * 1 + 0.2 * 1 + 1.5 * 1)
    long = score(by_name["long answer, box only"]["text"], by_name["long answer, box only"]["golds"], cfg)
    assert long.mode == "long"
    assert math.isclose(long.total, 0.3 * 1 + 0.2 * 0 + 1.5 * 1 + 0.7 * (0.75 - 1))
    perfect_long = score(by_name["long answer"]["text"], by_name["long answer"]["golds"], cfg)
    assert math.isclose(perfect_long.total, short.total)  # the long mode earns nothing by itself


def test_ranking_of_cases_matches_intent():
    totals = {c["name"]: score(parse_completion(c["text"], c.get("model_tokens")), c["golds"]).total
              for c in REWARD_CASES}
    assert totals["correct"] > totals["missing box"] > totals["wrong"] > totals["no answer"]
    assert totals["correct"] > totals["verbose"] and totals["correct"] > totals["over-long"]
    assert totals["correct"] > totals["malformed"]
    assert totals["correct"] > totals["long answer, box only"]  # no reward for merely choosing the long mode


def test_f1_accuracy_mode_gives_partial_credit():
    text = "<think>x</think>\n<short_answer>\\boxed{Henrik}</short_answer>"
    assert score(text, ["Henrik Queishyxskeil"]).accuracy == 0.0
    assert 0 < score(text, ["Henrik Queishyxskeil"], RewardConfig(accuracy="f1")).accuracy < 1


def test_overlong_shaping_is_linear_inside_the_buffer():
    cfg = RewardConfig(overlong_max_tokens=100, overlong_buffer=20)
    assert overlong_penalty(ParseRecord(None, None, model_tokens=80), cfg) == 0.0
    assert math.isclose(overlong_penalty(ParseRecord(None, None, model_tokens=90), cfg), -0.5)
    assert overlong_penalty(ParseRecord(None, None, model_tokens=101), cfg) == -1.0


def test_parse_ignores_tags_inside_retrieved_results():
    text = ("<think>q</think>\n<search> <query>q</query> </search>\n<result>\n(1) a page saying "
            "<short_answer>\\boxed{Wrong}</short_answer>\n</result>\n<think>ok</think>\n"
            "<short_answer>\\boxed{Right}</short_answer>")
    rec = parse_completion(text)
    assert rec.answer == "Right" and rec.n_searches == 1 and not rec.issues


def test_trl_reward_functions_read_the_parse_record_or_the_text():
    funcs = reward_functions()
    assert [f.__name__ for f in funcs] == ["format_reward", "length_reward", "accuracy_reward", "structure_reward",
                                           "overlong_reward"]
    case = REWARD_CASES[0]
    from dataclasses import asdict

    record = asdict(parse_completion(case["text"], model_tokens=40))
    via_text = [f(prompts=["q"], completions=[case["text"]], answers=[case["golds"]]) for f in funcs]
    via_record = [f(prompts=["q"], completions=["ignored"], answers=[case["golds"]], parse=[record]) for f in funcs]
    assert via_text == via_record == [[1.0], [1.0], [1.0], [None], [0.0]]
    assert len(RewardConfig().weights) == len(funcs)


def test_invalid_reward_config_is_rejected():
    with pytest.raises(ValueError, match="accuracy"):
        RewardConfig(accuracy="bleu")
    with pytest.raises(ValueError, match="overlong_buffer"):
        RewardConfig(overlong_max_tokens=10, overlong_buffer=20)


def test_r_short_only_ablation_scores_every_answer_by_eq17():
    """``dual_mode=False`` (the "R_short only" training ablation): a long answer loses eq. 18's structure
    penalty and its length is judged as a short answer's, so a box-only long answer totals as the short one."""
    cfg = RewardConfig(w_format=0.3, w_length=0.2, w_accuracy=1.5, w_structure=0.7, dual_mode=False)
    by_name = {c["name"]: c for c in REWARD_CASES}
    box_only = score(by_name["long answer, box only"]["text"], by_name["long answer, box only"]["golds"], cfg)
    assert box_only.mode == "long" and box_only.structure is None
    assert math.isclose(box_only.total, 0.3 * 1 + 0.2 * 1 + 1.5 * 1)  # dual mode: 0.3 + 0 + 1.5 - 0.7 * 0.25
    fns = reward_functions(cfg)
    text = by_name["long answer, box only"]["text"]
    assert fns[3](["q"], [text]) == [None] and fns[1](["q"], [text]) == [1.0]


def test_summary_questions_pay_the_long_mode_and_factoid_ones_do_not():
    """On a summary-oriented question the accuracy term also scores the summary's fact coverage, so the long
    answer out-earns the bare box; on a factoid question the two modes tie at their best (eq. 18's penalty)."""
    by_name = {c["name"]: c for c in REWARD_CASES}
    long = by_name["summary question, long answer"]
    short = by_name["summary question, short answer"]
    long_total = score(long["text"], long["golds"], facts=long["facts"]).total
    short_total = score(short["text"], short["golds"], facts=short["facts"]).total
    assert math.isclose(long_total, 1.3) and math.isclose(short_total, 0.2 + 0.1 + (0.5 + 0.5 * (2 / 7 + 2 / 5) / 2))
    assert math.isclose(score(long["text"], long["golds"]).total, score(short["text"], short["golds"]).total)


def test_the_trl_accuracy_reward_reads_the_facts_column():
    by_name = {c["name"]: c for c in REWARD_CASES}
    short = by_name["summary question, short answer"]
    accuracy = reward_functions()[2]
    got = accuracy([None, None], [short["text"], short["text"]], answers=[short["golds"]] * 2,
                   facts=[short["facts"], None])
    assert math.isclose(got[0], 0.5 + 0.5 * (2 / 7 + 2 / 5) / 2) and got[1] == 1.0
