"""Method comparisons as the paper reports them: Table 2 (EM and LJ per dataset and method) and the
ablation table, each difference with a paired-bootstrap 95 % interval over the same questions.

Inputs are the per-question records :func:`kunlunlab.eval.harness.evaluate` writes (one dict per
question with ``id``, ``em``, ``f1``, ``lj``); records of two methods are paired by question id, so a
difference is never taken between different questions.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from kunlunlab.eval.metrics import collapsed, fallback_share
from kunlunlab.eval.stats import paired_bootstrap


def _mean(values: Sequence[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def paired(a: Sequence[dict], b: Sequence[dict], key: str = "em") -> tuple[list[float], list[float]]:
    """The two methods' scores on the questions both answered, in the same order (paired by ``id``)."""
    by_id = {r["id"]: r for r in b}
    common = [r for r in a if r["id"] in by_id and r.get(key) is not None and by_id[r["id"]].get(key) is not None]
    if not common:
        raise ValueError(f"no question with a {key!r} score in both record sets")
    return [float(r[key]) for r in common], [float(by_id[r["id"]][key]) for r in common]


def compare(a: Sequence[dict], b: Sequence[dict], key: str = "em", n_resamples: int = 10_000, seed: int = 0) -> dict:
    """Mean of ``a`` minus mean of ``b`` on ``key`` with the paired-bootstrap interval, in percent points."""
    xs, ys = paired(a, b, key)
    res = paired_bootstrap(xs, ys, n_resamples=n_resamples, seed=seed)
    return {"n": res["n"], "a": 100 * res["mean_a"], "b": 100 * res["mean_b"], "diff": 100 * res["diff"],
            "low": 100 * res["low"], "high": 100 * res["high"]}


# Datasets whose questions are searched in a corpus that lacks most of their evidence (the harness's open-corpus
# default for sets that ship none: the 2Wiki paragraphs and the HotpotQA distractor contexts): their columns say so
OPEN_CORPUS_DATASETS = ("hotpotqa", "musique", "bamboogle")
OPEN_CORPUS_NOTE = " (corpus lacks most evidence)"


def dataset_label(dataset: str) -> str:
    return dataset + (OPEN_CORPUS_NOTE if dataset in OPEN_CORPUS_DATASETS else "")


def tag_share_cell(records: Sequence[dict]):
    """The answer-tag share (percent) of a row's answers, marked ``collapsed`` where most come from fallback
    extraction (:func:`~kunlunlab.eval.metrics.collapsed`); ``–`` where no record says where its answer came from."""
    share = fallback_share(records)
    if share is None:
        return "–"
    tagged = round(100 * (1 - share), 1)
    return f"{tagged} collapsed" if collapsed(records) else tagged


def table2(records: Mapping[str, Mapping[str, Sequence[dict]]], method: str, baselines: Sequence[str],
           n_resamples: int = 10_000, seed: int = 0, peers: Sequence[str] = (),
           models: Mapping[str, str] | None = None) -> tuple[list[str], list[list]]:
    """Table 2's layout: one row per method, EM, LJ and answer-tag share (percent) per dataset; then, per dataset,
    the difference of ``method`` to the best prompt baseline (by EM), and with ``peers`` (trained recipes, each on
    its own checkpoint) to the best peer, with its 95 % interval and the sample size. ``models``: the model each row
    ran on, as a column after the method (the baselines on the untrained backbone, each recipe on its own). A
    collapsed row (most answers by fallback extraction: :func:`tag_share_cell` marks it) is never the best one nor
    compared: its EM measures degenerate text.

    ``records[dataset][method]`` are the per-question records. LJ is ``–`` where no judge ran. A dataset searched
    in a corpus that lacks most of its evidence (:data:`OPEN_CORPUS_DATASETS`) is labelled so in its columns.
    """
    datasets = list(records)
    header = ["method"] + (["model"] if models is not None else []) + \
        [f"{dataset_label(d)} {m}" for d in datasets for m in ("EM", "LJ", "tag %")]

    def cell(value):
        return "–" if value is None else round(100 * value, 1)

    rows = []
    for name in [*baselines, *peers, method]:
        row = [name] + ([models.get(name, "–")] if models is not None else [])
        for d in datasets:
            recs = records[d].get(name)
            row += [cell(_mean([r["em"] for r in recs])) if recs else "–",
                    cell(_mean([r.get("lj") for r in recs])) if recs else "–", tag_share_cell(recs or [])]
        rows.append(row)
    for group, label in ((list(baselines), "best baseline"), (list(peers), "best peer")):
        if not group:
            continue
        diff_row = [f"{method} − {label} (EM, 95% CI, n)"] + (["–"] if models is not None else [])
        for d in datasets:
            present = [b for b in group if records[d].get(b) and not collapsed(records[d][b])]
            if not present or not records[d].get(method):
                diff_row += ["–", "–", "–"]
                continue
            if collapsed(records[d][method]):
                diff_row += [f"{method} collapsed: not compared", "–", "–"]
                continue
            best = max(present, key=lambda b: _mean([r["em"] for r in records[d][b]]) or 0.0)
            c = compare(records[d][method], records[d][best], "em", n_resamples, seed)
            diff_row += [f"{c['diff']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] n={c['n']}", f"vs {best}", "–"]
        rows.append(diff_row)
    return header, rows


def ablation_table(variants: Mapping[str, Sequence[dict]], reference: str, n_resamples: int = 10_000,
                   seed: int = 0, notes: Mapping[str, str] | None = None) -> tuple[list[str], list[list]]:
    """One row per variant: EM, F1, searches per question, the EM difference to ``reference`` with its
    paired-bootstrap interval, and the answer-tag share; a variant whose difference interval contains 0 is marked
    "no measurable effect at this scale" rather than read as helping or hurting, and a collapsed one (most answers
    by fallback extraction), or any variant against a collapsed reference, is marked so instead of read at all."""
    header = ["variant", "n", "EM", "F1", "searches / q", "Δ EM vs " + reference + " [95% CI]", "reading", "tag %"]
    ref = variants[reference]
    rows = []
    for name, recs in variants.items():
        em, f1 = _mean([r["em"] for r in recs]), _mean([r["f1"] for r in recs])
        searches = _mean([r.get("searches") for r in recs])
        if name == reference:
            delta, reading = "–", "reference" + ("; collapsed: not a result" if collapsed(recs) else "")
        elif collapsed(recs) or collapsed(ref):
            delta = "–"
            reading = ("collapsed: most answers by fallback extraction, not a result" if collapsed(recs)
                       else f"not compared: {reference} collapsed")
        else:
            c = compare(recs, ref, "em", n_resamples, seed)
            delta = f"{c['diff']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]"
            if c["low"] > 0:
                reading = f"removing it helps (+{c['diff']:.1f})" if name.startswith("−") else "better"
            elif c["high"] < 0:
                reading = (f"the mechanism helps ({-c['diff']:.1f} EM lost without it)" if name.startswith("−")
                           else "worse")
            else:
                reading = "no measurable effect at this scale"
        if notes and name in notes:
            reading = f"{reading}; {notes[name]}"
        rows.append([name, len(recs), round(100 * em, 1), round(100 * f1, 1),
                     None if searches is None else round(searches, 2), delta, reading, tag_share_cell(recs)])
    return header, rows


def kept_beside_fresh(kept: Sequence[dict], fresh: Sequence[dict], kept_label: str, fresh_label: str,
                      n_resamples: int = 10_000, seed: int = 0) -> tuple[list[str], list[list]]:
    """A kept full-size record of a table beside the run just made at a smaller size (issue 54): each on all its
    own questions (EM, F1, searches, answer-tag share), and the fresh run minus the kept one paired on the questions
    both evaluated, a question counting as shared only where its id *and* its text agree (a world drawn anew under
    the same ids is not paired). No shared question, or a collapsed side, gives no difference rather than one
    read off different questions or degenerate text."""
    header = ["record", "n", "EM", "F1", "searches / q", "tag %", "Δ EM this run − kept [95% CI], shared questions"]

    def row(label, recs, delta):
        searches = _mean([r.get("searches") for r in recs])
        return [label, len(recs), round(100 * (_mean([r["em"] for r in recs]) or 0.0), 1),
                round(100 * (_mean([r["f1"] for r in recs]) or 0.0), 1),
                None if searches is None else round(searches, 2), tag_share_cell(recs), delta]

    kept_by_id = {r["id"]: r for r in kept}
    shared = [r for r in fresh if r["id"] in kept_by_id and r.get("question") == kept_by_id[r["id"]].get("question")]
    if not shared:
        delta = "no shared question: not paired"
    elif collapsed(fresh) or collapsed(kept):
        delta = "a collapsed side: not compared"
    else:
        c = compare(shared, [kept_by_id[r["id"]] for r in shared], "em", n_resamples, seed)
        delta = f"{c['diff']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] n={c['n']}"
    return header, [row(kept_label, list(kept), "–"), row(fresh_label, list(fresh), delta)]
