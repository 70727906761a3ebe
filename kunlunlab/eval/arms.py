"""The table of a comparison's trained arms (Table 2's trained rows): each arm after SFT and after RL over seeds.

Input: ``{arm: {seed: {"sft": records, "rl": records}}}``, each a list of evaluation records of the same held-out
questions (paired by ``id``). Per arm: EM after SFT and after RL as the mean over seeds with the seeds' range; RL's
own effect (after RL − after SFT) with a paired-bootstrap interval over every (seed, question) pair; the arm
against the reference arm after RL, paired the same way (the same seeds and questions); the answer-tag share after
RL, where a row answered mostly by fallback extraction is "collapsed" and its comparisons are left out (never a
tie); and what each answer cost: searches, retrieved passages, generated (model) tokens and seconds per question.
:func:`pairwise_table` sets every arm against every other after RL, paired the same way (issue 52: intervals
against kunlun and each peer).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from kunlunlab.eval.compare import tag_share_cell
from kunlunlab.eval.metrics import collapsed
from kunlunlab.eval.stats import paired_bootstrap, paired_records

STAGES = ("sft", "rl")
HEADER = ["arm", "seeds", "n", "EM after SFT", "EM after RL", "RL's Δ EM [95 % CI]", "Δ vs {ref} after RL [95 % CI]",
          "tag % after RL", "searches/q", "passages/q", "tokens/q", "s/q"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _interval(result: dict) -> str:
    return f"{100 * result['diff']:+.1f} [{100 * result['low']:+.1f}, {100 * result['high']:+.1f}]"


def _mean_range(values: Sequence[float]) -> str:
    mean = sum(values) / len(values)
    return _pct(mean) if len(values) == 1 else f"{_pct(mean)} ({_pct(min(values))}–{_pct(max(values))})"


def _em(records: Sequence[dict]) -> float:
    return sum(float(r["em"]) for r in records) / len(records)


def _pairs(a: Mapping[int, Sequence[dict]], b: Mapping[int, Sequence[dict]]) -> tuple[list[float], list[float]]:
    """EM of every (seed, question) both sides answered, paired: each seed's records by question id."""
    xs, ys = [], []
    for seed in sorted(set(a) & set(b)):
        x, y = paired_records(a[seed], b[seed])
        xs += x
        ys += y
    return xs, ys


def costs(records: Sequence[dict]) -> dict[str, float | None]:
    """Per question: searches, retrieved passages, generated model tokens (the trajectory's mask) and seconds."""
    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    trajectories = [r.get("trajectory") if isinstance(r.get("trajectory"), dict) else {} for r in records]
    return {"searches": mean(r.get("searches") for r in records),
            "passages": mean(sum(len(ids) for ids in t["doc_ids"]) if "doc_ids" in t else None for t in trajectories),
            "tokens": mean(sum(t["mask"]) if "mask" in t else None for t in trajectories),
            "seconds": mean(r.get("seconds") for r in records)}


def arm_table(records: Mapping[str, Mapping[int, Mapping[str, Sequence[dict]]]], reference: str,
              n_resamples: int = 10_000, seed: int = 0) -> tuple[list[str], list[list], dict]:
    """The rows of :data:`HEADER` (the reference arm first) and the numbers behind them by arm."""
    header = [h.format(ref=reference) for h in HEADER]
    rows, numbers = [], {}
    ref_rl = {s: stages["rl"] for s, stages in records.get(reference, {}).items() if "rl" in stages}
    ref_collapsed = collapsed([r for recs in ref_rl.values() for r in recs])
    for arm in sorted(records, key=lambda a: (a != reference, a)):
        by_seed = records[arm]
        seeds = sorted(s for s, stages in by_seed.items() if "rl" in stages)
        if not seeds:
            continue
        rl = {s: by_seed[s]["rl"] for s in seeds}
        sft = {s: by_seed[s]["sft"] for s in seeds if "sft" in by_seed[s]}
        all_rl = [r for s in seeds for r in rl[s]]
        is_collapsed = collapsed(all_rl)  # the pooled row; a seed that collapsed on its own is listed too
        row_numbers = {"seeds": seeds, "n": len(all_rl), "em_rl": [_em(rl[s]) for s in seeds],
                       "em_sft": [_em(sft[s]) for s in sorted(sft)], "collapsed": is_collapsed,
                       "collapsed_seeds": [s for s in seeds if collapsed(rl[s])], **costs(all_rl)}
        rl_effect = "–"
        if sft:
            row_numbers["rl_effect"] = paired_bootstrap(*_pairs(rl, sft), n_resamples=n_resamples, seed=seed)
            rl_effect = _interval(row_numbers["rl_effect"])
        versus = "–" if arm == reference else "collapsed, not compared"
        if arm != reference and not is_collapsed and not ref_collapsed and set(seeds) & set(ref_rl):
            row_numbers["vs_reference"] = paired_bootstrap(*_pairs(rl, ref_rl), n_resamples=n_resamples, seed=seed)
            versus = _interval(row_numbers["vs_reference"])
        elif arm != reference and ref_collapsed:
            versus = f"{reference} collapsed, not compared"
        c = row_numbers
        rows.append([arm, len(seeds), c["n"], _mean_range(c["em_sft"]) if sft else "–", _mean_range(c["em_rl"]),
                     rl_effect, versus, tag_share_cell(all_rl),
                     *("–" if c[k] is None else round(c[k], 1 if k != "seconds" else 2)
                       for k in ("searches", "passages", "tokens", "seconds"))])
        numbers[arm] = row_numbers
    return header, rows, numbers


def pairwise_table(records: Mapping[str, Mapping[int, Mapping[str, Sequence[dict]]]], reference: str,
                   n_resamples: int = 10_000, seed: int = 0) -> tuple[list[str], list[list], dict]:
    """Every arm against every other after RL: the cell of row a, column b is EM(a) − EM(b) with a
    paired-bootstrap interval over the (seed, question) pairs both answered. A collapsed arm's cells say so (never
    a tie), as do two arms without a seed in common. Rows and columns in :func:`arm_table`'s order."""
    rl = {arm: {s: stages["rl"] for s, stages in by_seed.items() if "rl" in stages} for arm, by_seed in records.items()}
    arms = sorted((a for a in rl if rl[a]), key=lambda a: (a != reference, a))
    is_collapsed = {a: collapsed([r for recs in rl[a].values() for r in recs]) for a in arms}
    rows, numbers = [], {}
    for a in arms:
        row = [a]
        for b in arms:
            if a == b:
                row.append("–")
            elif is_collapsed[a] or is_collapsed[b]:
                row.append("collapsed, not compared")
            elif not set(rl[a]) & set(rl[b]):
                row.append("no seed in common")
            else:
                numbers[f"{a} − {b}"] = paired_bootstrap(*_pairs(rl[a], rl[b]), n_resamples=n_resamples, seed=seed)
                row.append(_interval(numbers[f"{a} − {b}"]))
        rows.append(row)
    return ["arm − arm →", *arms], rows, numbers


__all__ = ["HEADER", "STAGES", "arm_table", "costs", "pairwise_table"]
