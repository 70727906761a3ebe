"""Answer normalisation and matching with the standard SQuAD / HotpotQA rules (the evaluation's metrics).

They live in the bottom layer because the agent compares answers too (STIE's overlap of remembered
answers, eq. 6, and its tuning read-out use the same normalisation); evaluation code imports them as ``kunlunlab.eval.metrics``.

``exact_match`` and ``f1`` take the max over gold aliases. As in the official HotpotQA script, a
yes/no/noanswer prediction or gold scores F1 only when both match exactly (token overlap between
"yes" and "no, ..." is not partial credit). ``cover_em`` (reported as ``acc``) asks whether a
normalised gold string appears inside the normalised prediction.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

_SPECIAL = ("yes", "no", "noanswer")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse white space (SQuAD v1.1)."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    items = [golds] if isinstance(golds, str) else list(golds)
    if not items:
        raise ValueError("at least one gold answer is needed")
    return [str(g) for g in items]


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _f1_single(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if pred in _SPECIAL or ref in _SPECIAL:
        return float(pred == ref)
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str | None, golds: str | Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    return max(_f1_single(prediction, g) for g in _golds(golds))


def cover_em(prediction: str | None, golds: str | Sequence[str]) -> float:
    """``acc``: some normalised gold answer is contained in the normalised prediction."""
    if prediction is None:
        return 0.0
    pred = f" {normalize_answer(prediction)} "
    return float(any(f" {normalize_answer(g)} " in pred for g in _golds(golds) if normalize_answer(g)))


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
