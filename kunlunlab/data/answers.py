"""Answer normalisation and matching with the standard SQuAD / HotpotQA rules (the evaluation's metrics).

They live in the bottom layer because the agent compares answers too (STIE's overlap of remembered
answers, eq. 6, and its tuning read-out use the same normalisation); evaluation code imports them as ``kunlunlab.eval.metrics``.

``exact_match`` and ``f1`` take the max over gold aliases. As in the official HotpotQA script, a
yes/no/noanswer prediction or gold scores F1 only when both match exactly (token overlap between
"yes" and "no, ..." is not partial credit). ``cover_em`` (reported as ``acc``) asks whether a
normalised gold string appears inside the normalised prediction. ``fact_coverage`` scores a summary (the
long-answer mode) against the gold facts it should state.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

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


def fact_coverage(text: str | None, facts: Sequence[str]) -> float | None:
    """How much of the gold ``facts`` a summary states: per fact, the share of its normalised tokens (counted
    with multiplicity) that the normalised ``text`` contains (a ``\\boxed{}`` read as its content), averaged over
    the facts; None without facts.
    A unigram recall per fact (ROUGE-1 recall), so a fact restated in other word order still counts and a
    bare name covers only the name's share of each fact. The paper scores long answers with its LLM judge
    (§3.2) and names no overlap metric; this one needs no judge and is the same on every machine."""
    if not facts:
        return None
    text = re.sub(r"\\boxed\{(.*?)\}", r" \1 ", text or "", flags=re.S)  # a box counts as its content
    have = Counter(normalize_answer(text).split())
    shares = []
    for fact in facts:
        tokens = Counter(normalize_answer(fact).split())
        total = sum(tokens.values())
        shares.append(sum((tokens & have).values()) / total if total else 1.0)
    return sum(shares) / len(shares)
