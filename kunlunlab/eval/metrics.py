"""Every metric of an evaluation in one place: the answer metrics (EM, F1, cover-EM as ``acc``; defined in
:mod:`kunlunlab.data.answers` because STIE compares answers with the same normalisation), retrieval recall and
its curve over the searches with FrugalRAG's optimal stop (arXiv 2507.07634) and the search floor, and the
per-record counters and means that :func:`kunlunlab.eval.harness.evaluate` writes into its summary."""
from __future__ import annotations

from typing import Iterable, Sequence

from kunlunlab.agent.grounding import quote_grounding
from kunlunlab.data.answers import cover_em, exact_match, f1, fact_coverage, normalize_answer
from kunlunlab.data.types import QAExample

TAGGED, FALLBACK = "answer_tag", "fallback"   # where a record's answer came from (answer_source)
COLLAPSE_SHARE = 0.5  # a row with more of its answers from fallback extraction is collapsed (issue 51)


def retrieval_recall(retrieved_titles: Iterable[str], gold_titles: Sequence[str]) -> float | None:
    """Share of gold supporting titles that were retrieved at some point (None when there is no gold)."""
    if not gold_titles:
        return None
    seen = {normalize_answer(t) for t in retrieved_titles}
    return sum(normalize_answer(t) in seen for t in gold_titles) / len(gold_titles)


def recall_by_search(searches: Sequence[Iterable[str]], gold: Iterable[str],
                     background: Iterable[str] = ()) -> list[float] | None:
    """The recall of the gold evidence after each search: ``[R_0, R_1, …, R_n]`` where ``R_0`` counts the
    ``background`` alone (RDRA's documents, retrieved before the agent's first turn; empty without RDRA)
    and ``R_k`` everything retrieved up to the agent's k-th search. Items are compared as given (passage
    ids, or titles after :func:`normalize_answer`); None when there is no gold."""
    gold = set(gold)
    if not gold:
        return None
    seen = set(background)
    curve = [len(seen & gold) / len(gold)]
    for found in searches:
        seen |= set(found)
        curve.append(len(seen & gold) / len(gold))
    return curve


def optimal_stop(curve: Sequence[float]) -> int:
    """FrugalRAG's optimal stop (arXiv 2507.07634) of one trajectory: the first search ``k*`` after which
    the recall curve (:func:`recall_by_search`) is at its maximum; ``len(curve) - 1 - k*`` searches came
    after it and retrieved no further evidence."""
    return list(curve).index(max(curve))


def search_floor(stages: Sequence[Iterable[str]], background: Iterable[str] = ()) -> int | None:
    """The fewest searches of the agent's own that complete the gold evidence of one question: one for every
    dependency stage (:meth:`~kunlunlab.data.types.QAExample.evidence_stages`; the items of a stage go into one
    multi-query search) that holds an item the ``background`` (RDRA's documents) does not show. What a
    search-budget reward can bring the agent down to without answering from unread evidence; items are
    compared as given (ids, or normalised titles). None without stages."""
    stages = [set(stage) for stage in stages if stage]
    if not stages:
        return None
    shown = set(background)
    return sum(1 for stage in stages if stage - shown)


EXTRA_SEARCHES = ("past_stop", "redundant")


def extra_searches(curve: Sequence[float], kind: str = "past_stop") -> int:
    """The searches of one recall curve (:func:`recall_by_search`) that a search budget counts as extra:
    ``"past_stop"``, those after the :func:`optimal_stop` (FrugalRAG's n − k*), or ``"redundant"``, every
    search that raised the recall of no gold passage (before the stop too)."""
    if kind == "past_stop":
        return len(curve) - 1 - optimal_stop(curve)
    if kind == "redundant":
        return sum(1 for before, after in zip(curve, curve[1:]) if after <= before)
    raise ValueError(f"kind must be one of {EXTRA_SEARCHES}, got {kind!r}")


# ---------------------------------------------------------------- per-record counters and the summary
def answer_source(record: dict) -> str:
    """``"answer_tag"`` or ``"fallback"`` for one record (records written before the top-level field
    existed carry it in the trajectory; single-shot baselines carry none and count as fallback)."""
    source = record.get("answer_source")
    if source is None and isinstance(record.get("trajectory"), dict):
        source = record["trajectory"].get("answer_source")
    source = source or FALLBACK
    if source not in (TAGGED, FALLBACK):
        raise ValueError(f"record {record.get('id')!r}: unknown answer_source {source!r}")
    return source


def fallback_share(records: Sequence[dict]) -> float | None:
    """The share of answers taken by fallback extraction, over the records that say where their answer came from;
    None where none does (a single-shot baseline has no answer tag it could have missed)."""
    said = [r for r in records if r.get("answer_source") is not None
            or (isinstance(r.get("trajectory"), dict) and r["trajectory"].get("answer_source") is not None)]
    return sum(answer_source(r) == FALLBACK for r in said) / len(said) if said else None


def collapsed(records: Sequence[dict]) -> bool:
    """Whether most answers (more than :data:`COLLAPSE_SHARE`) come from fallback extraction of text that closed no
    answer tag: such a row measures degenerate text, not its method, and is never read as a result or a tie."""
    share = fallback_share(records)
    return share is not None and share > COLLAPSE_SHARE


def title_recall_curve(trajectory: dict, titles: dict[str, str], gold_titles) -> list[float] | None:
    """The recall of the gold supporting titles after RDRA's background (R_0) and after each of the agent's
    searches (``trajectory["doc_ids"]``, one list per search): :func:`recall_by_search`
    on normalised titles. None without gold titles or a per-search record (the baselines keep none)."""
    searches = _per_search_ids(trajectory)
    if not gold_titles or searches is None:
        return None
    background = (trajectory.get("rdra") or {}).get("doc_ids") or []

    def names(ids):
        return [normalize_answer(titles.get(d, "")) for d in ids]

    return recall_by_search([names(ids) for ids in searches], {normalize_answer(t) for t in gold_titles},
                            names(background))


def _per_search_ids(trajectory) -> list[list[str]] | None:
    """The passage ids of each of the agent's searches (``trajectory["doc_ids"]``); None where a method keeps
    no per-search record (the single-shot baselines)."""
    searches = trajectory.get("doc_ids") if isinstance(trajectory, dict) else None
    if not isinstance(searches, list) or not all(isinstance(ids, list) for ids in searches):
        return None
    return searches


def evidence_search_floor(trajectory: dict, titles: dict[str, str], example: QAExample) -> int | None:
    """The fewest searches with which this trajectory could have completed its gold evidence: RDRA's queries
    before the first turn (``trajectory.rdra.searches``, fixed by its config) plus one of the agent's own for
    every dependency stage of the gold chain whose pages the background did not show
    (:func:`search_floor`; the parallel hops of a comparison share one multi-query
    search). ``searches`` minus this is what a search-budget reward can cut without the agent answering
    from evidence it never read. None where :func:`title_recall_curve` is None (no gold titles, or a baseline
    that keeps no per-search record)."""
    stages = example.evidence_stages()
    if _per_search_ids(trajectory) is None or not stages:  # no stages: no gold titles
        return None
    rdra = trajectory.get("rdra") or {}
    background = [normalize_answer(titles.get(d, "")) for d in rdra.get("doc_ids") or []]
    own = search_floor([[normalize_answer(t) for t in stage] for stage in stages], background)
    return int(rdra.get("searches") or 0) + own


def _extra_searches(record: dict, kind: str) -> int | None:
    curve = record.get("recall_by_search")
    return extra_searches(curve, kind) if curve else None


def searches_past_stop(record: dict) -> int | None:
    """The agent's searches after FrugalRAG's optimal stop (:func:`optimal_stop`):
    searches that retrieved no gold evidence the trajectory did not already have, and that a perfect
    search-budget policy would not have made. None for a record without a recall curve."""
    return _extra_searches(record, "past_stop")


def redundant_searches(record: dict) -> int | None:
    """The agent's searches that raised the recall of no gold passage (before or after the optimal stop:
    a search repeating what RDRA's background already showed, or one that found nothing of the evidence).
    None for a record without a recall curve."""
    return _extra_searches(record, "redundant")


def ungrounded_quotes(record: dict) -> int | None:
    """How many of the evidence sentences the agent quoted in its think turns it had never been shown
    (:func:`kunlunlab.agent.grounding.quote_grounding`): 0 for an agent that quotes nothing; None for a record
    without a trajectory."""
    trajectory = record.get("trajectory")
    if not isinstance(trajectory, dict) or "steps" not in trajectory:
        return None
    background = (trajectory.get("rdra") or {}).get("background")
    return len(quote_grounding(trajectory["steps"], background).ungrounded)


def agent_searches(record: dict) -> int | None:
    """The searches the agent chose itself: ``searches`` less the queries RDRA sent before the first turn
    (``trajectory.rdra.searches``; the whole agent counts both in ``searches``). A search-budget reward
    (FrugalRAG) can only cut these; RDRA's background searches are fixed by its config. None when the
    record has no search count."""
    searches = record.get("searches")
    if searches is None:
        return None
    trajectory = record.get("trajectory")
    rdra = trajectory.get("rdra") if isinstance(trajectory, dict) else None
    return searches - int((rdra or {}).get("searches") or 0)


def summarize(records: list[dict]) -> dict:
    """Means over records; EM also split by answer source (``em_tagged`` / ``em_fallback``). ``long_share``:
    the share of records answered in ``<long_answer>`` (the dual-mode answers, §2.3; records without
    ``answer_mode`` left out); ``fact_coverage``: the mean over summary-oriented questions (None without them).

    A mean over no values is None, so ``lj`` is None when no judge ran and ``em_tagged`` is None
    when no answer came from a tag.
    """
    n = len(records)

    def mean(key, subset=records):
        values = [r[key] for r in subset if r[key] is not None]
        return round(sum(values) / len(values), 4) if values else None

    tagged = [r for r in records if answer_source(r) == TAGGED]
    fallback = [r for r in records if answer_source(r) == FALLBACK]
    return {"n": n, "em": mean("em"), "f1": mean("f1"), "acc": mean("acc"), "lj": mean("lj"),
            "em_tagged": mean("em", tagged), "em_fallback": mean("em", fallback),
            "n_tagged": len(tagged), "n_fallback": len(fallback),
            "tagged_share": round(len(tagged) / n, 4) if n else None,
            "searches_per_question": mean("searches"), "agent_searches_per_question": _mean_of(
                [agent_searches(r) for r in records]),
            "past_stop_per_question": _mean_of([searches_past_stop(r) for r in records]),
            "redundant_per_question": _mean_of([redundant_searches(r) for r in records]),
            "ungrounded_quotes_per_question": _mean_of([ungrounded_quotes(r) for r in records]),
            "search_floor_per_question": _mean_of([r.get("search_floor") for r in records]),
            "long_share": _mean_of([None if "answer_mode" not in r else float(r["answer_mode"] == "long")
                                    for r in records]),
            "fact_coverage": _mean_of([r.get("fact_coverage") for r in records]),
            "seconds_per_question": mean("seconds")}


def _mean_of(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


__all__ = ["COLLAPSE_SHARE", "EXTRA_SEARCHES", "FALLBACK", "TAGGED", "agent_searches", "answer_source", "collapsed",
           "cover_em", "fallback_share",
           "evidence_search_floor", "exact_match", "extra_searches", "f1", "fact_coverage", "normalize_answer", "optimal_stop",
           "recall_by_search", "redundant_searches", "retrieval_recall", "search_floor", "searches_past_stop",
           "summarize", "title_recall_curve", "ungrounded_quotes"]
