"""Tuning STIE on cached rounds (notebook 05): collect rounds once, re-score any setting without generating."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from kunlunlab.agent.stie import RoundInput, STIEConfig, replay
from kunlunlab.eval.metrics import exact_match

Case = tuple[list[str], list[RoundInput]]  # (gold answers, rounds)

# Collection: every round is generated (no early stop), so replays can stop wherever a setting says.
COLLECT_ALL_ROUNDS = dict(confidence_ceiling=1.1, overlap_stop=-1.0, min_new_info=-1.0)


def cases_from_records(records: Sequence[dict]) -> list[Case]:
    """Cached rounds from evaluation records (``kunlunlab eval`` / :func:`~kunlunlab.eval.harness.evaluate`)."""
    cases = []
    for r in records:
        rounds = [RoundInput(x["answer"], float(x["confidence"]), list(x["doc_ids"]))
                  for x in r.get("trajectory", {}).get("rounds", [])]
        cases.append((list(r["golds"]), rounds))
    return cases


def simulated_cases(golds: Sequence[str], distractors: Sequence[str], n_rounds: int = 5, p_correct: float = 0.35,
                    loop_prob: float = 0.6, seed: int = 0) -> list[Case]:
    """A labelled simulation of an answerer that falls into loops: each round it repeats its last wrong
    answer (with surface variants) with ``loop_prob``, else answers correctly with ``p_correct``, else
    tries another distractor. Correct answers come with higher confidence on average."""
    rng = np.random.default_rng(seed)
    variants = ("{}", "the {}", "{} ({})", "{}.")
    cases = []
    for gold in golds:
        rounds, last_wrong = [], None
        for t in range(n_rounds):
            if last_wrong is not None and rng.random() < loop_prob:
                answer, conf = rng.choice(variants).format(last_wrong, "again"), rng.uniform(0.3, 0.7)
            elif rng.random() < p_correct:
                answer, conf, last_wrong = gold, rng.uniform(0.5, 0.95), None
            else:
                last_wrong = str(rng.choice(distractors))
                answer, conf = last_wrong, rng.uniform(0.3, 0.75)
            rounds.append(RoundInput(answer, float(conf), [f"d{t}-{rng.integers(0, 4)}"]))
        cases.append(([gold], rounds))
    return cases


def score(cases: Sequence[Case], config: STIEConfig) -> dict:
    """EM of STIE's final answers and the mean number of rounds it used."""
    if not cases:
        return {"em": 0.0, "rounds": 0.0, "n": 0}
    ems, used = [], []
    for golds, rounds in cases:
        answer, n, _ = replay(rounds, config)
        ems.append(exact_match(answer, golds))
        used.append(n)
    return {"em": float(np.mean(ems)), "rounds": float(np.mean(used)), "n": len(cases)}


def grid_search(cases: Sequence[Case], base: STIEConfig, x_name: str, x_values: Sequence,
                y_name: str, y_values: Sequence) -> dict:
    """EM and rounds-used grids over two STIEConfig fields (rows: y, columns: x), and the best setting."""
    em = np.zeros((len(y_values), len(x_values)))
    rounds = np.zeros_like(em)
    for i, y in enumerate(y_values):
        for j, x in enumerate(x_values):
            s = score(cases, replace(base, **{x_name: x, y_name: y}))
            em[i, j], rounds[i, j] = s["em"], s["rounds"]
    i, j = np.unravel_index(np.lexsort((rounds.ravel(), -em.ravel()))[0], em.shape)  # best EM, then fewest rounds
    return {"em": em.tolist(), "rounds": rounds.tolist(), "best": {x_name: x_values[j], y_name: y_values[i],
                                                                   "em": float(em[i, j]), "rounds": float(rounds[i, j])}}
