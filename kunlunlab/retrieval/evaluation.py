"""Measuring indexes: recall against exact search, per-query latency, gold-passage recall.

Used by notebook 01 and the tests; the benchmark (``python -m kunlunlab.bench retrieval``) uses the
same timing rule: one query at a time, the same FAISS thread count for every index.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import faiss
import numpy as np

from kunlunlab.data.types import QAExample


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k that the index returned."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[f >= 0].tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


def time_per_query(search: Callable, queries: np.ndarray, k: int, repeats: int = 1) -> tuple[float, np.ndarray]:
    """(milliseconds per query, result rows), issuing queries one at a time; with ``repeats`` > 1 the
    median pass is reported (a shared 2-core machine is noisy)."""
    rows = np.empty((len(queries), k), dtype=np.int64)
    passes = []
    for _ in range(max(1, repeats)):
        gc.collect()
        start = time.perf_counter()
        for i in range(len(queries)):
            rows[i] = search(queries[i:i + 1], k)[1][0]
        passes.append((time.perf_counter() - start) * 1000 / max(1, len(queries)))
    return float(np.median(passes)), rows


@dataclass
class SweepPoint:
    index: str
    knob: str
    value: float
    ms_per_query: float
    recall_at_k: float
    bytes_per_vector: float


def sweep(name: str, knob: str, values: Sequence, search_with: Callable[[object], Callable],
          queries: np.ndarray, truth: np.ndarray, bytes_per_vector: float, threads: int = 1) -> list[SweepPoint]:
    """Recall–latency curve: ``search_with(value)`` returns a search function for one knob setting."""
    faiss.omp_set_num_threads(threads)
    k = truth.shape[1]
    points = []
    for value in values:
        ms, rows = time_per_query(search_with(value), queries, k)
        points.append(SweepPoint(name, knob, float(value), ms, recall_at_k(rows, truth), bytes_per_vector))
    return points


def gold_passage_recall(search: Callable[[list[str], int], list[list]], examples: Sequence[QAExample],
                        k: int = 5) -> float:
    """Fraction of gold hops whose passage is in the top-k for the hop's sub-question (synthetic world)."""
    hops = [hop for ex in examples for hop in ex.chain if hop.passage_id]
    if not hops:
        raise ValueError("these examples have no gold chains with passage ids")
    results = search([hop.question for hop in hops], k)
    return float(np.mean([any(h.id == hop.passage_id for h in hits) for hop, hits in zip(hops, results)]))


def supporting_title_recall(search: Callable[[list[str], int], list[list]], examples: Sequence[QAExample],
                            k: int = 5) -> float:
    """Fraction of gold supporting titles retrieved in the top-k for the full question (HotpotQA)."""
    usable = [ex for ex in examples if ex.supporting_titles]
    if not usable:
        raise ValueError("these examples carry no supporting titles")
    results = search([ex.question for ex in usable], k)
    scores = []
    for ex, hits in zip(usable, results):
        titles = {h.title for h in hits}
        scores.append(np.mean([t in titles for t in ex.supporting_titles]))
    return float(np.mean(scores))


def single_shot_support_recall(search: Callable[[list[str], int], list[list]], examples: Sequence[QAExample],
                               k: int = 5) -> dict[str, float]:
    """Retrieval from the raw multi-hop question: mean share of gold passages in the top-k, and the share of
    questions with *all* of them there. Low values are what make iterative search necessary."""
    usable = [ex for ex in examples if ex.supporting_ids]
    if not usable:
        raise ValueError("these examples carry no supporting passage ids")
    results = search([ex.question for ex in usable], k)
    shares = [np.mean([pid in {h.id for h in hits} for pid in ex.supporting_ids]) for ex, hits in zip(usable, results)]
    return {"support_recall": float(np.mean(shares)), "all_supports": float(np.mean([s == 1.0 for s in shares]))}
