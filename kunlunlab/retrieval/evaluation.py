"""Measuring indexes: recall against exact search, per-query latency, gold-passage recall.

:func:`compare_indexes` is the one index comparison: notebook 01 and ``python -m kunlunlab.bench
retrieval`` both call it, so the notebook's figure and the benchmark's JSON come from the same
builds and the same timing rule: one query at a time, the same FAISS thread count for every index,
recall@k against the exact top-k of a Flat index over the same vectors.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import faiss
import numpy as np
from threadpoolctl import threadpool_limits

from kunlunlab.data.types import QAExample
from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.indexes import FlatIndex, HNSWIndex, IVFPQConfig, IVFPQIndex


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k that the index returned."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[f >= 0].tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


def time_per_query(search: Callable, queries: np.ndarray, k: int, repeats: int = 1) -> tuple[float, np.ndarray]:
    """(milliseconds per query, result rows), issuing queries one at a time; with ``repeats`` > 1 the
    median pass is reported (a shared 2-core machine is noisy).

    numpy's BLAS (the cluster retriever's exact re-rank) runs with as many threads as FAISS has when the
    call starts (callers set that to the thread count being compared): OpenBLAS otherwise splits a
    single query's re-rank over every core once the candidate matrix passes its threading threshold
    (about 680 candidates of dimension 384), which on the shared 2-core machine measured 2–8 ms per query
    instead of 0.8 at 2000 candidates, and would time the retriever with more threads than the others."""
    rows = np.empty((len(queries), k), dtype=np.int64)
    passes = []
    with threadpool_limits(limits=faiss.omp_get_max_threads(), user_api="blas"):
        for _ in range(max(1, repeats)):
            gc.collect()
            start = time.perf_counter()
            for i in range(len(queries)):
                rows[i] = search(queries[i:i + 1], k)[1][0]
            passes.append((time.perf_counter() - start) * 1000 / max(1, len(queries)))
    return float(np.median(passes)), rows


@dataclass
class IndexRow:
    """One measured setting of one index: a point of a recall–latency curve (``knob`` set) or a single
    point (``knob`` None: the index at its fixed setting)."""

    index: str                  # display name (INDEX_NAMES)
    knob: str | None            # "nprobe" | "budget" | None
    value: float | None         # the knob's value
    ms_per_query: float
    recall_at_k: float
    bytes_per_vector: float     # held in RAM
    disk_bytes_per_vector: float = 0.0  # read on demand from a memory-mapped file (cluster retriever, rerank="exact")
    kind: str = ""              # flat | ivfpq | cluster | cluster_pq | hnsw


def sweep(name: str, knob: str | None, values: Sequence, search_with: Callable[[object], Callable],
          queries: np.ndarray, truth: np.ndarray, bytes_per_vector: float, threads: int = 1, *, repeats: int = 1,
          kind: str = "", disk_bytes_per_vector: float = 0.0) -> list[IndexRow]:
    """Recall–latency curve: ``search_with(value)`` returns a search function for one knob setting
    (``knob=None, values=[None]``: one row for an index without a knob)."""
    faiss.omp_set_num_threads(threads)
    k = truth.shape[1]
    points = []
    for value in values:
        ms, rows = time_per_query(search_with(value), queries, k, repeats)
        points.append(IndexRow(name, knob, None if value is None else float(value), ms, recall_at_k(rows, truth),
                               bytes_per_vector, disk_bytes_per_vector, kind))
    return points


# ---------------------------------------------------------------------------- the index comparison
INDEX_NAMES = {"flat": "exact Flat", "ivfpq": "IVF-PQ", "cluster": "cluster retriever",
               "cluster_pq": "cluster retriever, rerank=pq", "hnsw": "HNSW"}
COMPARED_KINDS = ("ivfpq", "cluster_pq", "hnsw")  # optional; exact Flat and the cluster retriever always run


def _knob_value(value: float | None):
    return int(value) if value is not None and float(value).is_integer() else value


@dataclass
class IndexComparison:
    """What :func:`compare_indexes` measured: one :class:`IndexRow` per index setting, the exact top-k it
    was measured against, the built indexes (``indexes[kind]``) and their build times in seconds."""

    rows: list[IndexRow]
    truth: np.ndarray
    indexes: dict[str, object] = field(repr=False)
    build_seconds: dict[str, float]
    k: int = 10

    def rows_of(self, kind: str) -> list[IndexRow]:
        return [r for r in self.rows if r.kind == kind]

    def row(self, kind: str, value: float | None = None) -> IndexRow:
        """The row of ``kind`` whose knob value is nearest ``value`` (the first row when ``value`` is None)."""
        rows = self.rows_of(kind)
        if not rows:
            raise KeyError(f"no {kind!r} rows in this comparison (measured: {sorted({r.kind for r in self.rows})})")
        if value is None:
            return rows[0]
        return min(rows, key=lambda r: abs((r.value if r.value is not None else 0.0) - value))

    def curves(self) -> list[IndexRow]:
        """Rows with a knob: the lines of the recall–latency figure."""
        return [r for r in self.rows if r.knob]

    def single_points(self) -> dict[str, tuple[float, float]]:
        """Indexes at a fixed setting: name -> (ms per query, recall@k)."""
        return {r.index: (r.ms_per_query, r.recall_at_k) for r in self.rows if not r.knob}

    def memory(self) -> dict[str, float]:
        """RAM bytes per vector, one entry per index (in measurement order)."""
        out: dict[str, float] = {}
        for r in self.rows:
            out.setdefault(r.index, r.bytes_per_vector)
        return out

    def metrics(self) -> dict:
        """The key figures as JSON-ready values (notebook 01 writes them to ``metrics.json``)."""
        recall = f"recall_at_{self.k}"

        def curve(kind: str) -> list[dict]:
            return [{r.knob: _knob_value(r.value), "ms": round(r.ms_per_query, 4), recall: round(r.recall_at_k, 4)}
                    for r in self.rows_of(kind) if r.knob]

        flat_ms = self.row("flat").ms_per_query
        cluster = self.indexes["cluster"]
        default = self.row("cluster", cluster.budget(self.k))
        return {
            "n_vectors": int(self.indexes["flat"].ntotal), "nlist": int(cluster.nlist), "flat_ms": round(flat_ms, 4),
            "single_points": {name: {"ms": round(ms, 4), recall: round(r, 4)}
                              for name, (ms, r) in self.single_points().items()},
            "ivfpq": curve("ivfpq"), "cluster": curve("cluster"),
            "cluster_speedup_vs_flat": round(flat_ms / default.ms_per_query, 2),
            "cluster_disk_bytes_per_vector": self.row("cluster").disk_bytes_per_vector,
            "bytes_per_vector": {name: round(b, 1) for name, b in self.memory().items()},
            "build_seconds": {kind: round(s, 2) for kind, s in self.build_seconds.items()},
        }


def compare_indexes(vectors: np.ndarray, queries: np.ndarray, kinds: Sequence[str] = COMPARED_KINDS, *, k: int = 10,
                    threads: int = 1, repeats: int = 1, nprobe_grid: Sequence[int] = (16,),
                    budget_grid: Sequence[int] = (), cluster_config: ClusterConfig | None = None,
                    warmup: np.ndarray | None = None, warmup_batch: int = 64) -> IndexComparison:
    """Builds exact Flat, the clustering retriever and the ``kinds`` asked for (``ivfpq``, ``cluster_pq``,
    ``hnsw``) over ``vectors`` and measures each the same way.

    * Builds use every FAISS thread there is when the call starts; timing uses ``threads`` for every
      index (restored afterwards). Queries are issued one at a time; with ``repeats`` > 1 the median of
      that many timed passes is reported.
    * Recall@k is measured against the exact top-k of the Flat index: an approximate index is judged on
      what it loses relative to exhaustive search, not on whether the embedder finds the right passage.
    * IVF-PQ (``nlist`` of the cluster retriever's, ``pq_m`` bytes per code) is swept over ``nprobe_grid``
      (values above ``nlist`` are clipped to it: every list scanned); the cluster retriever over
      ``budget_grid`` (empty: its configured candidate budget). Both cluster retrievers first serve
      ``warmup`` (default: the timed queries) in batches of ``warmup_batch``, so the annealed temperature
      and the EMA weights are past their cold start when timed; they keep adapting while timed, as in service.
    * The rerank="pq" variant (``cluster_pq``) and HNSW are single points at their configured settings.

    ``cluster_config`` is copied, never changed; ``cluster_pq`` uses the same settings with ``rerank="pq"``.
    """
    unknown = set(kinds) - set(COMPARED_KINDS)
    if unknown:
        raise ValueError(f"unknown index kinds {sorted(unknown)}; compare_indexes measures {', '.join(COMPARED_KINDS)} "
                         "besides exact Flat and the cluster retriever")
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    config = replace(cluster_config) if cluster_config is not None else ClusterConfig()
    build_threads = faiss.omp_get_max_threads()
    try:
        indexes, seconds = _build_compared(vectors, kinds, config)
        nlist = indexes["cluster"].nlist
        _, truth = indexes["flat"].search(queries, k)

        def measure(kind: str, knob: str | None, values: Sequence, search_with: Callable) -> list[IndexRow]:
            index = indexes[kind]
            disk = index.disk_bytes_per_vector() if hasattr(index, "disk_bytes_per_vector") else 0.0
            return sweep(INDEX_NAMES[kind], knob, values, search_with, queries, truth, index.bytes_per_vector(),
                         threads, repeats=repeats, kind=kind, disk_bytes_per_vector=disk)

        rows = measure("flat", None, [None], lambda _: indexes["flat"].search)
        if "ivfpq" in kinds:
            ivfpq = indexes["ivfpq"]
            nprobes = list(dict.fromkeys(min(int(v), nlist) for v in nprobe_grid))
            rows += measure("ivfpq", "nprobe", nprobes, lambda v: (lambda q, kk: ivfpq.search(q, kk, nprobe=v)))
        if "hnsw" in kinds:
            rows += measure("hnsw", None, [None], lambda _: indexes["hnsw"].search)
        _warm_up_clusters(indexes, queries if warmup is None else np.ascontiguousarray(warmup, dtype=np.float32),
                          k, warmup_batch)
        cluster = indexes["cluster"]
        rows += _budget_sweep(cluster, list(budget_grid) or [cluster.budget(k)], measure)
        if "cluster_pq" in kinds:
            rows += measure("cluster_pq", None, [None], lambda _: indexes["cluster_pq"].search)
    finally:
        faiss.omp_set_num_threads(build_threads)
    return IndexComparison(rows, truth, indexes, seconds, k)


def _build_compared(vectors: np.ndarray, kinds: Sequence[str], config: ClusterConfig
                    ) -> tuple[dict[str, object], dict[str, float]]:
    """Exact Flat, the cluster retriever and the ``kinds`` asked for over ``vectors`` (IVF-PQ with the cluster
    retriever's ``nlist``), with each build's seconds."""
    dim = int(vectors.shape[1])
    indexes: dict[str, object] = {}
    seconds: dict[str, float] = {}

    def build(kind: str, make: Callable[[], object]) -> None:
        start = time.perf_counter()
        indexes[kind] = make()
        seconds[kind] = time.perf_counter() - start

    def filled(index):
        index.add(vectors)
        return index

    build("flat", lambda: filled(FlatIndex(dim)))
    build("cluster", lambda: ClusterRetriever(dim, config).build(vectors))
    nlist = indexes["cluster"].nlist
    if "ivfpq" in kinds:
        build("ivfpq", lambda: filled(IVFPQIndex(dim, IVFPQConfig(nlist=nlist, m=config.pq_m))))
    if "cluster_pq" in kinds:
        build("cluster_pq", lambda: ClusterRetriever(dim, replace(config, rerank="pq")).build(vectors))
    if "hnsw" in kinds:
        build("hnsw", lambda: filled(HNSWIndex(dim)))
    return indexes, seconds


def _warm_up_clusters(indexes: dict[str, object], served: np.ndarray, k: int, batch: int) -> None:
    """Both cluster retrievers serve ``served`` in batches of ``batch`` (the batch search path is served too), so
    the annealed temperature and the EMA weights are past their cold start when timed."""
    for kind in ("cluster", "cluster_pq"):
        if kind in indexes:
            for start in range(0, len(served), batch):
                indexes[kind].search(served[start:start + batch], k)


def _budget_sweep(cluster: ClusterRetriever, budgets: list, measure: Callable[..., list[IndexRow]]
                  ) -> list[IndexRow]:
    """The cluster retriever measured at each candidate budget; its configured budget is restored after."""
    default_budget = cluster.config.candidate_budget  # 0 (auto) is measured at the budget it resolves to

    def with_budget(budget):
        cluster.config.candidate_budget = int(budget)
        return cluster.search

    try:
        return measure("cluster", "budget", budgets, with_budget)
    finally:
        cluster.config.candidate_budget = default_budget


def cluster_allocation(cluster: ClusterRetriever, query: np.ndarray, k: int = 10) -> list[dict]:
    """One query's dynamic cluster sampling and quotas, computed the way :meth:`ClusterRetriever.search`
    does (steps 1–3 of its search), without serving the query: the annealing clock and the EMA weights do
    not move. One row per considered cluster, nearest centroid first: ``cluster``, ``size``, centroid
    ``score`` s_c, EMA ``weight`` w_c, ``probability`` p_c, ``quota`` q_c = p_c·B, whether it is
    ``scanned`` and its priority ``cap`` (0 when not scanned)."""
    q = np.ascontiguousarray(np.atleast_2d(query)[:1], dtype=np.float32)
    c = cluster.config
    if c.selection != "dynamic":
        raise ValueError("cluster_allocation shows dynamic cluster sampling; selection='nearest' scans "
                         "ClusterRetriever.nearest_clusters")
    budget = cluster.budget(k)
    n_considered = min(c.max_clusters, cluster.nlist)
    scores, clusters = cluster.ivf.quantizer.search(q, n_considered)
    p = cluster.cluster_probabilities(scores, clusters)
    quota = p * budget
    probe, cap = cluster.allocate(quota, cluster.draws(q) if c.explore_slots else None, c.explore_slots)
    probe[:, 0] = clusters[:, 0] >= 0  # the nearest cluster is always scanned
    return [{"rank": i, "cluster": int(cl), "size": int(cluster.cluster_sizes[cl]), "score": float(scores[0, i]),
             "weight": float(cluster.weights[cl]), "probability": float(p[0, i]), "quota": float(quota[0, i]),
             "scanned": bool(probe[0, i]), "cap": int(cap[0, i]) if probe[0, i] else 0}
            for i, cl in enumerate(clusters[0]) if cl >= 0]


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


def evidence_recall(searches: dict[str, Callable[[list[str], int], list[list]]], examples: Sequence[QAExample],
                    k: int = 5) -> dict[str, dict]:
    """Does each retriever find the evidence? ``searches``: name -> batch search (``Retriever.search``).

    With gold chains (the synthetic world): ``gold_recall`` is :func:`gold_passage_recall` (each hop's
    sub-question) and ``single_shot`` :func:`single_shot_support_recall` (the raw multi-hop question, once).
    With supporting titles only (HotpotQA): ``gold_recall`` is :func:`supporting_title_recall`, no
    ``single_shot``. Without either, both are empty."""
    chains = any(hop.passage_id for ex in examples for hop in ex.chain)
    titles = any(ex.supporting_titles for ex in examples)
    gold: dict[str, float] = {}
    single_shot: dict[str, dict[str, float]] = {}
    for name, search in searches.items():
        if chains:
            gold[name] = gold_passage_recall(search, examples, k)
            single_shot[name] = single_shot_support_recall(search, examples, k)
        elif titles:
            gold[name] = supporting_title_recall(search, examples, k)
    return {"gold_recall": gold, "single_shot": single_shot}
