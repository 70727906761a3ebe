"""Tuning STIE on cached rounds (notebook 05): collect rounds once, re-score any setting without generating.

:func:`score` and :func:`grid_search` re-score settings; :func:`readout` says what STIE did under one
setting (the notebook's sliders, :data:`CONTROLS`); :func:`tune` / :func:`validate` pick thresholds on
one half of the questions and compare them with the defaults on the other half.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from kunlunlab.agent.stie import RoundInput, STIEConfig, replay
from kunlunlab.data.answers import exact_match

Case = tuple[list[str], list[RoundInput]]  # (gold answers, rounds)

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
    tries another distractor. Correct answers come with higher confidence on average.

    Each round retrieves two documents; a looping round re-reads one of the previous round's (a share of
    new documents of 1/2), the others read two new ones, so termination (iii)'s ``min_new_info`` has something
    to act on in the simulation too."""
    rng = np.random.default_rng(seed)
    variants = ("{}", "the {}", "{} ({})", "{}.")
    cases = []
    for gold in golds:
        rounds, last_wrong = [], None
        for t in range(n_rounds):
            docs = [f"d{t}-a", f"d{t}-b"]
            if last_wrong is not None and rng.random() < loop_prob:
                answer, conf = rng.choice(variants).format(last_wrong, "again"), rng.uniform(0.3, 0.7)
                docs[0] = rounds[-1].doc_ids[0]
            elif rng.random() < p_correct:
                answer, conf, last_wrong = gold, rng.uniform(0.5, 0.95), None
            else:
                last_wrong = str(rng.choice(distractors))
                answer, conf = last_wrong, rng.uniform(0.3, 0.75)
            rounds.append(RoundInput(answer, float(conf), docs))
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


# --- Widget read-out (notebook 05) -----------------------------------------------------------------

# The knobs notebook 05 shows as sliders, as (min, max, step): the notebook builds its sliders from this
# table, and tests/notebooks/test_stie_widgets.py checks that moving each one changes :func:`readout`. A knob that
# cannot change what the read-out shows does not belong here. ``difference`` (eq. 7's variant) is left
# out: it only reproduces earlier runs. 0 switches a termination criterion off (no mean overlap, share
# of new documents is below 0); a confidence ceiling of 1 is reached only by a certain answer.
CONTROLS: dict[str, tuple[float, float, float]] = {
    "delta1": (0.0, 1.0, 0.05), "delta2": (0.0, 1.0, 0.05), "delta3": (0.0, 1.0, 0.05),  # eq. (9)
    "repeat_k": (1, 6, 1),                                                                 # eqs. (12)-(13)
    "margin": (0.0, 1.0, 0.05),                                                            # eq. (10)
    "overlap_stop": (0.0, 1.0, 0.05), "confidence_ceiling": (0.0, 1.0, 0.05),             # termination (i, ii)
    "min_new_info": (0.0, 1.0, 0.05),                                                      # termination (iii)
    "max_rounds": (1, STIEConfig().max_rounds, 1),                                         # termination
}

# Why a replay ended: the termination reasons, or "end_of_cache" when the cached rounds ran out first
# (a question collected with fewer rounds than the setting's max_rounds).
STOP_REASONS = ("new_answer", "confident", "no_new_info", "max_rounds", "end_of_cache")


def readout(cases: Sequence[Case], config: STIEConfig) -> dict:
    """What STIE did over the cases under ``config``: EM, mean rounds used, and the counts that each
    knob moves, so a slider's effect is visible even when EM does not change.

    ``stops``: replays per termination reason; ``redundant``: rounds that failed the validity test
    (eq. 9, the δ's); ``replaced``: rounds whose answer STIE replaced (eqs. 10-11, K and the margin);
    ``blocked``: rounds with a non-empty shielded set (eq. 12, K); ``all_blocked``: rounds where every
    candidate was shielded (eq. 11's fallback)."""
    stops = dict.fromkeys(STOP_REASONS, 0)
    ems, used, redundant, replaced, blocked, all_blocked = [], [], 0, 0, 0, 0
    for golds, rounds in cases:
        answer, n, decisions = replay(rounds, config)
        ems.append(exact_match(answer, golds))
        used.append(n)
        stops[decisions[-1].reason if decisions and decisions[-1].stop else "end_of_cache"] += 1
        redundant += sum(d.redundant_with is not None for d in decisions)
        replaced += sum(d.replaced for d in decisions)
        blocked += sum(bool(d.shielded) for d in decisions)
        all_blocked += sum(d.all_blocked for d in decisions)
    return {"em": float(np.mean(ems)) if ems else 0.0, "rounds": float(np.mean(used)) if used else 0.0,
            "n": len(cases), "stops": stops, "redundant": redundant, "replaced": replaced, "blocked": blocked,
            "all_blocked": all_blocked}


def format_readout(r: dict) -> str:
    """One line of :func:`readout` for the notebook's live output."""
    stops = ", ".join(f"{k} {v}" for k, v in r["stops"].items() if v) or "none"
    return (f"EM {r['em']:.3f} · rounds {r['rounds']:.2f} · n {r['n']} | stops: {stops} | redundant rounds "
            f"{r['redundant']}, replaced {r['replaced']}, with a blocklist {r['blocked']}, all blocked {r['all_blocked']}")


# --- Tuning with a held-out half -------------------------------------------------------------------

# Small per-knob grids for :func:`tune` (the defaults of STIEConfig are among them, so the search can stay put).
TUNING_GRID: dict[str, tuple] = {
    "delta1": (0.2, 0.4, 0.6, 0.8), "delta2": (0.2, 0.35, 0.5, 0.65), "delta3": (0.1, 0.25, 0.4, 0.55),
    "repeat_k": (1, 2, 3, 4, 5), "margin": (0.0, 0.1, 0.2),
    "overlap_stop": (0.0, 0.1, 0.2, 0.3), "confidence_ceiling": (0.7, 0.8, 0.9, 1.0),
    "min_new_info": (0.0, 0.1, 0.3, 0.5),
}


def _better(a: dict, b: dict) -> bool:
    """Best EM, then fewest rounds (strictly better: on a tie the current setting stays)."""
    return a["em"] > b["em"] or (a["em"] == b["em"] and a["rounds"] < b["rounds"])


def _ordered(config: STIEConfig) -> bool:
    """The paper's asymmetry δ1 ≥ δ2 ≥ δ3: repeating the last round is judged most strictly."""
    return config.delta1 >= config.delta2 >= config.delta3


def tune(cases: Sequence[Case], base: STIEConfig, grid: dict[str, Sequence] | None = None, passes: int = 2) -> dict:
    """Coordinate search from ``base``: for each knob in turn, try its grid values with the others fixed
    and keep a value that scores better (:func:`_better`); repeat for ``passes`` passes (stopping early
    when a pass changes nothing). Settings that break δ1 ≥ δ2 ≥ δ3 are skipped. A cheap search, not a
    global optimum: with few cases the choice can fit noise, which is why :func:`validate` scores it on
    other cases. Returns the config, the chosen values, its score on ``cases`` and the work done."""
    grid = TUNING_GRID if grid is None else grid
    config, best = base, score(cases, base)
    evaluations, done = 1, 0
    for done in range(1, passes + 1):
        changed = False
        for name, values in grid.items():
            for value in values:
                candidate = replace(config, **{name: value})
                if candidate == config or not _ordered(candidate):
                    continue
                s = score(cases, candidate)
                evaluations += 1
                if _better(s, best):
                    config, best, changed = candidate, s, True
        if not changed:
            break
    return {"config": config, "chosen": {name: getattr(config, name) for name in grid}, "score": best,
            "passes": done, "evaluations": evaluations}


def split_halves(cases: Sequence[Case]) -> tuple[list[Case], list[Case]]:
    """(tuning half, held-out half) by alternating index: even-indexed cases tune, odd-indexed ones
    validate. Alternating rather than first/second half, so an ordering of the questions (by kind or
    difficulty) does not put one kind in one half."""
    return list(cases[0::2]), list(cases[1::2])


def validate(cases: Sequence[Case], base: STIEConfig, grid: dict[str, Sequence] | None = None,
             passes: int = 2) -> dict:
    """Tunes on the even-indexed half (:func:`tune`) and reports default (``base``) vs tuned EM and rounds
    on both halves; the odd-indexed, held-out half is the honest comparison. JSON-serialisable."""
    tuning, heldout = split_halves(cases)
    result = tune(tuning, base, grid, passes)
    tuned = result["config"]
    return {"split": "alternating index: even-indexed questions tune, odd-indexed ones validate",
            "chosen": result["chosen"], "passes": result["passes"], "evaluations": result["evaluations"],
            "tuning_half": {"default": score(tuning, base), "tuned": result["score"]},
            "heldout_half": {"default": score(heldout, base), "tuned": score(heldout, tuned)},
            "n_tune": len(tuning), "n_heldout": len(heldout)}
