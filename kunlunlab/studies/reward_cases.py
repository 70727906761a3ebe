"""Hand-written responses that pin down what each reward component does (notebook 03 and the tests).

Every case is a full trajectory text as the rollout produces it (the prefix ``<think>`` included,
``<result>`` blocks from the environment), the gold answers (and a summary-oriented question's gold
``facts``), and the component values it must get under the default
:class:`~kunlunlab.training.rewards.RewardConfig`.
"""
from __future__ import annotations

from kunlunlab.training.rewards import RewardConfig, parse_completion, score, structure_term

_RESULT = ("\n<result>\n(1) \"Draillam Motors\"\nDraillam Motors is a company founded in 1912 by Henrik Queishyxskeil."
           "\n</result>\n")
_SEARCH = "<think>I need: Who founded Draillam Motors?</think>\n<search> <query>Who founded Draillam Motors?</query> </search>"
GOLD = ["Henrik Queishyxskeil"]
# "Describe how Draillam Motors is connected to Vrelsia.": a summary-oriented question's gold facts
SUMMARY_FACTS = ["Draillam Motors was founded by Henrik Queishyxskeil.", "Henrik Queishyxskeil is from Vrelsia."]

REWARD_CASES: list[dict] = [
    {"name": "correct",
     "text": _SEARCH + _RESULT + "<think>Who founded Draillam Motors? Henrik Queishyxskeil.</think>\n"
             "<short_answer>\\boxed{Henrik Queishyxskeil}</short_answer>",
     "golds": GOLD, "expect": {"format": 1.0, "length": 1.0, "accuracy": 1.0, "structure": None}},
    {"name": "verbose",
     "text": _SEARCH + _RESULT + "<think>Found it.</think>\n<short_answer>\\boxed{The company Draillam Motors was "
             "founded in the year 1912 by the businessman Henrik Queishyxskeil}</short_answer>",
     "golds": GOLD, "expect": {"format": 1.0, "length": 0.0, "accuracy": 0.0, "structure": None}},
    {"name": "wrong",
     "text": _SEARCH + _RESULT + "<think>It was Dorian.</think>\n<short_answer>\\boxed{Dorian Traemtyr}</short_answer>",
     "golds": GOLD, "expect": {"format": 1.0, "length": 1.0, "accuracy": 0.0, "structure": None}},
    {"name": "malformed",
     "text": "<think>I need: Who founded Draillam Motors?</think>\n<search> <query>Who founded Draillam Motors?"
             "</search>" + _RESULT + "<think>Henrik.<short_answer>\\boxed{Henrik Queishyxskeil}</short_answer>",
     "golds": GOLD, "expect": {"format": 0.4, "length": 1.0, "accuracy": 1.0, "structure": None}},
    {"name": "missing box",
     "text": _SEARCH + _RESULT + "<think>Found it.</think>\n<short_answer>Henrik Queishyxskeil</short_answer>",
     "golds": GOLD, "expect": {"format": 0.5, "length": 1.0, "accuracy": 1.0, "structure": None}},
    {"name": "no answer",
     "text": _SEARCH + _RESULT + "<think>Draillam Motors is a company that was founded a long time ago and",
     "golds": GOLD, "expect": {"format": 0.0, "length": 0.0, "accuracy": 0.0, "structure": None}},
    {"name": "over-long",
     "text": _SEARCH + _RESULT + "<think>" + "Let me think about this again. " * 110 + "</think>\n"
             "<short_answer>\\boxed{Henrik Queishyxskeil}</short_answer>",
     "golds": GOLD, "model_tokens": 700,
     "expect": {"format": 1.0, "length": 1.0, "accuracy": 1.0, "structure": None, "overlong": -1.0}},
    {"name": "long answer",
     "text": _SEARCH + _RESULT + "<think>The result names the founder.</think>\n<long_answer>Draillam Motors is a "
             "company founded in 1912; the search result names its founder, who is therefore the answer to the "
             "question: \\boxed{Henrik Queishyxskeil}</long_answer>",
     "golds": GOLD, "expect": {"format": 1.0, "length": 1.0, "accuracy": 1.0, "structure": 1.0}},
    {"name": "summary question, long answer",
     "text": _SEARCH + _RESULT + "<think>Who founded Draillam Motors? Henrik Queishyxskeil. Which country is he from? "
             "Vrelsia.</think>\n<long_answer>Draillam Motors was founded by Henrik Queishyxskeil. Henrik Queishyxskeil "
             "is from Vrelsia. So Draillam Motors is connected to Vrelsia through Henrik Queishyxskeil. "
             "\\boxed{Henrik Queishyxskeil}</long_answer>",
     "golds": GOLD, "facts": SUMMARY_FACTS,
     "expect": {"format": 1.0, "length": 1.0, "accuracy": 1.0, "structure": 1.0}},
    {"name": "summary question, short answer",
     "text": _SEARCH + _RESULT + "<think>Who founded Draillam Motors? Henrik Queishyxskeil.</think>\n"
             "<short_answer>\\boxed{Henrik Queishyxskeil}</short_answer>",
     "golds": GOLD, "facts": SUMMARY_FACTS,  # the box alone covers 2 of fact 1's 7 words and 2 of fact 2's 5
     "expect": {"format": 1.0, "length": 1.0, "accuracy": 0.5 + 0.5 * (2 / 7 + 2 / 5) / 2, "structure": None}},
    {"name": "long answer, box only",
     "text": _SEARCH + _RESULT + "<long_answer>\\boxed{Henrik Queishyxskeil}</long_answer>",
     "golds": GOLD, "expect": {"format": 1.0, "length": 0.0, "accuracy": 1.0, "structure": 0.75}},
]


def case_rows(cases: list[dict] | None = None, cfg=None) -> list[dict]:
    """Every case scored: its components, their weighted values (``w_<component>``) and the total."""
    cfg = cfg or RewardConfig()
    rows = []
    for case in cases or REWARD_CASES:
        b = score(parse_completion(case["text"], model_tokens=case.get("model_tokens")), case["golds"], cfg,
                  facts=case.get("facts"))
        row = {"name": case["name"], "mode": b.mode, "format": b.format, "length": b.length, "accuracy": b.accuracy,
               "structure": b.structure, "overlong": b.overlong, "total": round(b.total, 4)}
        for key, w in zip(("format", "length", "accuracy", "structure", "overlong"), cfg.weights):
            value = structure_term(row[key]) if key == "structure" else row[key]  # eq. 18 penalty
            row[f"w_{key}"] = 0.0 if value is None else w * value
        rows.append(row)
    return rows
