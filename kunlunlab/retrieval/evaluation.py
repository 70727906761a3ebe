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

from kunlunlab.data.types import QAExample
from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.indexes import FlatIndex, HNSWConfig, HNSWIndex, IVFPQConfig, IVFPQIndex


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
    from threadpoolctl import threadpool_limits

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
    dim = int(vectors.shape[1])
    config = replace(cluster_config) if cluster_config is not None else ClusterConfig()
    build_threads = faiss.omp_get_max_threads()
    indexes: dict[str, object] = {}
    seconds: dict[str, float] = {}

    def build(kind: str, make: Callable[[], object]) -> None:
        start = time.perf_counter()
        indexes[kind] = make()
        seconds[kind] = time.perf_counter() - start

    def filled(index):
        index.add(vectors)
        return index

    try:
        build("flat", lambda: filled(FlatIndex(dim)))
        build("cluster", lambda: ClusterRetriever(dim, config).build(vectors))
        nlist = indexes["cluster"].nlist
        if "ivfpq" in kinds:
            build("ivfpq", lambda: filled(IVFPQIndex(dim, IVFPQConfig(nlist=nlist, m=config.pq_m))))
        if "cluster_pq" in kinds:
            build("cluster_pq", lambda: ClusterRetriever(dim, replace(config, rerank="pq")).build(vectors))
        if "hnsw" in kinds:
            build("hnsw", lambda: filled(HNSWIndex(dim)))
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

        served = queries if warmup is None else np.ascontiguousarray(warmup, dtype=np.float32)
        for kind in ("cluster", "cluster_pq"):
            if kind in indexes:
                for start in range(0, len(served), warmup_batch):  # batches: the batch search path is served too
                    indexes[kind].search(served[start:start + warmup_batch], k)

        cluster = indexes["cluster"]
        default_budget = cluster.config.candidate_budget  # 0 (auto) is measured at the budget it resolves to

        def with_budget(budget):
            cluster.config.candidate_budget = int(budget)
            return cluster.search

        try:
            rows += measure("cluster", "budget", list(budget_grid) or [cluster.budget(k)], with_budget)
        finally:
            cluster.config.candidate_budget = default_budget
        if "cluster_pq" in kinds:
            rows += measure("cluster_pq", None, [None], lambda _: indexes["cluster_pq"].search)
    finally:
        faiss.omp_set_num_threads(build_threads)
    return IndexComparison(rows, truth, indexes, seconds, k)



# ---------------------------------------------------------------------------- the Pareto sweep
PARETO_FAMILIES = ("flat", "hnsw", "ivfpq", "ivf_flat", "ivfpq_refine", "cluster", "cluster_nearest")  # in measurement order
PARETO_NAMES = {"flat": "exact Flat (IndexFlatIP)", "hnsw": "HNSW (IndexHNSWFlat)", "ivf_flat": "IVF-Flat (IndexIVFFlat)",
                "ivfpq": "IVF-PQ (IndexIVFPQ, no re-rank)",
                "ivfpq_refine": "IVF-PQ fast-scan + float re-rank (IndexRefineFlat)",
                "cluster": "cluster retriever (dynamic sampling)",
                "cluster_nearest": "cluster retriever, nearest-cluster selection (ablation)"}


@dataclass
class ParetoGrids:
    """Settings each family is swept over (values above ``nlist`` are clipped to it). ``budget_shares``
    multiply the cluster retriever's resolved budget (its configured one, or the auto budget); the nearest
    ablation runs at each of those budgets (clusters filled to the budget) and at the resolved budget for
    each of ``nearest_nprobe``."""

    ef_search: Sequence[int] = (10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    ivf_nprobe: Sequence[int] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    ivfpq_nprobe: Sequence[int] = (8, 16, 32, 64, 128)
    refine_nprobe: Sequence[int] = (4, 8, 16, 24, 32, 48, 64, 96)
    refine_k_factor: Sequence[int] = (2, 4, 8, 16, 32)
    budget_shares: Sequence[float] = (0.25, 0.375, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
    nearest_nprobe: Sequence[int] = (2, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _pareto_row(family: str, setting: str, ms: float, recall: float, ram: float, disk: float, k: int,
                **extra) -> dict:
    return {"family": family, "setting": setting, "ms": round(ms, 4), f"recall_at_{k}": round(recall, 4),
            "bytes_per_vector": round(ram, 1), "disk_bytes_per_vector": round(disk, 1), **extra}


def pareto_sweep(vectors: np.ndarray, queries: np.ndarray, families: Sequence[str] = PARETO_FAMILIES, *,
                 k: int = 10, threads: int = 1, repeats: int = 1, truth: np.ndarray | None = None,
                 indexes: dict | None = None, cluster_config: ClusterConfig | None = None,
                 warmup: np.ndarray | None = None, grids: ParetoGrids | None = None,
                 hnsw: HNSWConfig | None = None, comparison: "IndexComparison | None" = None,
                 log: Callable[[str], None] | None = None) -> list[dict]:
    """Recall@k–latency–memory points of FAISS's strongest CPU configurations and of the clustering
    retriever, measured the way :func:`compare_indexes` measures (one query at a time, ``threads`` FAISS
    threads for every index, median of ``repeats`` passes, recall against the exact top-k, RAM bytes per
    vector from the serialized index). One dict per setting: ``family`` (a key of ``PARETO_NAMES``),
    ``setting`` ("efSearch=64", "nprobe=16,k_factor=8", "budget=448", ...), ``ms``, ``recall_at_{k}``,
    ``bytes_per_vector`` (RAM), ``disk_bytes_per_vector`` (read on demand from a memory-mapped file: the
    cluster retriever's float vectors), and for the cluster families ``budget`` and ``scanned_clusters`` (mean
    clusters scanned per query).

    Families: ``flat`` (the reference); ``hnsw`` (``IndexHNSWFlat``, ``hnsw`` M/efConstruction, efSearch
    swept); ``ivf_flat`` (``IndexIVFFlat`` trained by FAISS with the cluster retriever's ``nlist``, nprobe
    swept); ``ivfpq`` (``IndexIVFPQ``, ``pq_m`` bytes, no re-rank); ``ivfpq_refine`` (``IndexRefineFlat``
    over a 4-bit fast-scan IVF-PQ of the same ``2·pq_m`` sub-quantizers as the cluster retriever's scan,
    by residual, sharing IVF-Flat's coarse centroids: nprobe × k_factor swept; the float vectors are held in
    RAM); ``cluster`` (the clustering retriever, candidate budget swept); ``cluster_nearest`` (the same
    built index with ``selection="nearest"``: the nearest clusters instead of dynamic sampling, at the
    same budgets and, at the resolved budget, a plain nprobe sweep).

    ``indexes`` may hold already-built ``flat``, ``hnsw``, ``ivfpq`` and ``cluster`` indexes (what
    :func:`compare_indexes` returns, used as they are, already warmed up) and ``truth`` their exact top-k;
    anything missing is built here (the cluster retriever then serves ``warmup``, default the queries, in
    batches of 64 before timing). ``comparison``, a :func:`compare_indexes` result over the same vectors and
    queries, supplies both, and its Flat row (not timed again). Indexes built here for one family only are freed after it. Builds use every
    FAISS thread there is when the call starts, restored afterwards."""
    unknown = set(families) - set(PARETO_FAMILIES)
    if unknown:
        raise ValueError(f"unknown Pareto families {sorted(unknown)}; choose from {', '.join(PARETO_FAMILIES)}")
    say = log or (lambda message: None)
    grids = grids or ParetoGrids()
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    dim = int(vectors.shape[1])
    if comparison is not None:
        indexes, truth = {**comparison.indexes, **(indexes or {})}, comparison.truth
    indexes = dict(indexes or {})
    config = replace(cluster_config) if cluster_config is not None else ClusterConfig()
    build_threads = faiss.omp_get_max_threads()
    recall_key = f"recall_at_{k}"
    rows: list[dict] = []

    def timed(search: Callable) -> tuple[float, float]:
        faiss.omp_set_num_threads(threads)
        try:
            ms, found = time_per_query(search, queries, k, repeats)
        finally:
            faiss.omp_set_num_threads(build_threads)
        return ms, recall_at_k(found, truth)

    def add_row(family: str, setting: str, search: Callable, ram: float, disk: float = 0.0, **extra) -> None:
        ms, recall = timed(search)
        rows.append(_pareto_row(family, setting, ms, recall, ram, disk, k, **extra))
        say(f"{family:16s} {setting:28s} {ms:8.4f} ms  {recall_key} {recall:.4f}  RAM {ram:7.1f} B/vector")

    def ram_of(index: faiss.Index) -> float:
        return _serialized_bytes_per_vector(index)

    try:
        if "flat" not in indexes and (truth is None or "flat" in families):
            flat = FlatIndex(dim)
            flat.add(vectors)
            indexes["flat"] = flat
        if truth is None:
            _, truth = indexes["flat"].search(queries, k)
        if "flat" in families and comparison is not None:
            flat_row = comparison.row("flat")
            rows.append(_pareto_row("flat", "exact", flat_row.ms_per_query, flat_row.recall_at_k,
                                    flat_row.bytes_per_vector, 0.0, k))
        elif "flat" in families:
            add_row("flat", "exact", indexes["flat"].search, indexes["flat"].bytes_per_vector())
        if any(f.startswith("cluster") for f in families) or "ivf_flat" in families or "ivfpq_refine" in families \
                or "ivfpq" in families:
            if "cluster" not in indexes:
                start = time.perf_counter()
                indexes["cluster"] = ClusterRetriever(dim, config).build(vectors)
                say(f"cluster retriever built in {time.perf_counter() - start:.1f}s")
                served = queries if warmup is None else np.ascontiguousarray(warmup, dtype=np.float32)
                for begin in range(0, len(served), 64):
                    indexes["cluster"].search(served[begin:begin + 64], k)
            nlist = indexes["cluster"].nlist
            config = replace(indexes["cluster"].config)  # pq_m and seed of the index actually measured
        if "hnsw" in families:
            built_here = "hnsw" not in indexes
            if built_here:
                start = time.perf_counter()
                index = HNSWIndex(dim, hnsw or HNSWConfig())
                index.add(vectors)
                indexes["hnsw"] = index
                say(f"HNSW built in {time.perf_counter() - start:.1f}s")
            graph = indexes["hnsw"]
            ram = ram_of(graph.index)
            label = f"M={graph.config.m},efC={graph.config.ef_construction}"
            for ef in grids.ef_search:
                params = faiss.SearchParametersHNSW(efSearch=max(int(ef), k))
                add_row("hnsw", f"{label},efSearch={int(ef)}",
                        lambda q, kk, p=params: graph.index.search(q, kk, params=p), ram)
            if built_here:
                del indexes["hnsw"], graph
        if "ivfpq" in families:
            built_here = "ivfpq" not in indexes
            if built_here:
                index = IVFPQIndex(dim, IVFPQConfig(nlist=nlist, m=config.pq_m))
                index.add(vectors)
                indexes["ivfpq"] = index
            ivfpq = indexes["ivfpq"]
            for nprobe in dict.fromkeys(min(int(v), ivfpq.config.nlist) for v in grids.ivfpq_nprobe):
                add_row("ivfpq", f"nprobe={nprobe}", lambda q, kk, n=nprobe: ivfpq.search(q, kk, nprobe=n),
                        ivfpq.bytes_per_vector())
            if built_here:
                del indexes["ivfpq"]
        coarse = None
        if "ivf_flat" in families or "ivfpq_refine" in families:
            start = time.perf_counter()
            quantizer = faiss.IndexFlatIP(dim)
            ivf_flat = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(config.seed)
            sample = np.ascontiguousarray(
                vectors[np.sort(rng.choice(len(vectors), size=min(len(vectors), 64 * nlist), replace=False))],
                dtype=np.float32)
            ivf_flat.train(sample)
            coarse = quantizer.reconstruct_n(0, nlist)
            say(f"IVF coarse quantizer ({nlist} lists) trained in {time.perf_counter() - start:.1f}s")
            if "ivf_flat" in families:
                for begin in range(0, len(vectors), 200_000):
                    ivf_flat.add(np.ascontiguousarray(vectors[begin:begin + 200_000], dtype=np.float32))
                ram = ram_of(ivf_flat)
                for nprobe in dict.fromkeys(min(int(v), nlist) for v in grids.ivf_nprobe):
                    params = faiss.SearchParametersIVF(nprobe=nprobe)
                    add_row("ivf_flat", f"nlist={nlist},nprobe={nprobe}",
                            lambda q, kk, p=params: ivf_flat.search(q, kk, params=p), ram)
            del ivf_flat, quantizer
        if "ivfpq_refine" in families:
            start = time.perf_counter()
            quantizer = faiss.IndexFlatIP(dim)
            quantizer.add(coarse)
            base = faiss.IndexIVFPQFastScan(quantizer, dim, nlist, 2 * config.pq_m, 4, faiss.METRIC_INNER_PRODUCT)
            base.train(sample)  # the quantizer holds nlist centroids already: this trains the PQ codebooks
            refine = faiss.IndexRefineFlat(base)
            for begin in range(0, len(vectors), 200_000):
                refine.add(np.ascontiguousarray(vectors[begin:begin + 200_000], dtype=np.float32))
            say(f"IVF-PQ fast-scan + refine built in {time.perf_counter() - start:.1f}s")
            ram = ram_of(refine)
            for nprobe in dict.fromkeys(min(int(v), nlist) for v in grids.refine_nprobe):
                for k_factor in grids.refine_k_factor:
                    ivf_params = faiss.SearchParametersIVF(nprobe=nprobe)
                    params = faiss.IndexRefineSearchParameters(k_factor=float(k_factor), base_index_params=ivf_params)
                    add_row("ivfpq_refine", f"nlist={nlist},nprobe={nprobe},k_factor={int(k_factor)}",
                            lambda q, kk, p=params, b=ivf_params: refine.search(q, kk, params=p), ram)
            del refine, base, quantizer
        if "cluster" in families or "cluster_nearest" in families:
            cluster = indexes["cluster"]
            saved = (cluster.config.candidate_budget, cluster.config.selection, cluster.config.nearest_nprobe)
            resolved = cluster.budget(k)
            budgets = sorted({max(k, int(round(resolved * share))) for share in grids.budget_shares})
            ram, disk = cluster.bytes_per_vector(), cluster.disk_bytes_per_vector()

            def scanned_clusters() -> float:
                """Mean clusters scanned per query at the current settings (without serving a query)."""
                if cluster.config.selection == "nearest":
                    return float(cluster.nearest_clusters(queries, cluster.budget(k))[2].sum(axis=1).mean())
                return float(np.mean([sum(r["scanned"] for r in cluster_allocation(cluster, q, k)) for q in queries]))

            try:
                if "cluster" in families:
                    for b in budgets:
                        cluster.config.candidate_budget = b
                        add_row("cluster", f"budget={b}", cluster.search, ram, disk, budget=b,
                                scanned_clusters=round(scanned_clusters(), 2))
                if "cluster_nearest" in families:
                    cluster.config.selection = "nearest"
                    settings = [(b, 0) for b in budgets] + [(resolved, int(n)) for n in grids.nearest_nprobe
                                                            if int(n) <= nlist]
                    for b, nprobe in settings:
                        cluster.config.candidate_budget, cluster.config.nearest_nprobe = b, nprobe
                        add_row("cluster_nearest", f"budget={b}" + (f",nprobe={nprobe}" if nprobe else ",fill"),
                                cluster.search, ram, disk, budget=b, scanned_clusters=round(scanned_clusters(), 2))
            finally:
                cluster.config.candidate_budget, cluster.config.selection, cluster.config.nearest_nprobe = saved
    finally:
        faiss.omp_set_num_threads(build_threads)
    return rows


def _serialized_bytes_per_vector(index: faiss.Index) -> float:
    return float(faiss.serialize_index(index).nbytes) / max(1, index.ntotal)


def best_at(rows: Sequence[dict], recall: float = 0.95, k: int = 10) -> dict[str, dict]:
    """Per family (in order of first appearance): ``best``, the fastest row whose ``recall_at_{k}`` is at
    least ``recall`` (None when no setting reaches it), and ``max_recall_at_{k}``, the best recall any of
    the family's settings reached."""
    key = f"recall_at_{k}"
    out: dict[str, dict] = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        above = [r for r in mine if r[key] >= recall]
        out[family] = {"best": dict(min(above, key=lambda r: r["ms"])) if above else None,
                       f"max_{key}": max(r[key] for r in mine)}
    return out


def dynamic_vs_nearest(rows: Sequence[dict], k: int = 10) -> dict:
    """The §3.1.1 ablation read off a :func:`pareto_sweep`: at each candidate budget swept for both, the
    clustering retriever with dynamic sampling (``cluster``, ``budget=B``) against the same index scanning
    its nearest clusters until their members fill ``B`` (``cluster_nearest``, ``budget=B,fill``).
    ``pairs``: one dict per budget (recall and ms of each, ``recall_gain`` = dynamic − nearest);
    ``mean_recall_gain``, ``wins``/``ties``/``losses`` (recall differences within 0.002 are ties);
    ``nprobe_match``, at the budget the sweep ran plain nprobe at, the fastest nprobe setting whose recall
    reaches dynamic sampling's there (within 0.002; None if none does); and ``verdict``, the sentences
    stating both comparisons with their numbers."""
    key = f"recall_at_{k}"
    dynamic = {r["budget"]: r for r in rows if r["family"] == "cluster"}
    nearest = {r["budget"]: r for r in rows if r["family"] == "cluster_nearest" and r["setting"].endswith(",fill")}
    pairs = [{"budget": b, "dynamic_recall": dynamic[b][key], "nearest_recall": nearest[b][key],
              "recall_gain": round(dynamic[b][key] - nearest[b][key], 4),
              "dynamic_ms": dynamic[b]["ms"], "nearest_ms": nearest[b]["ms"]}
             for b in sorted(set(dynamic) & set(nearest))]
    if not pairs:
        raise ValueError("no budget was swept for both cluster and cluster_nearest")
    gains = [p["recall_gain"] for p in pairs]
    wins, losses = sum(g > 0.002 for g in gains), sum(g < -0.002 for g in gains)
    mean = round(float(np.mean(gains)), 4)
    helps = mean > 0.002 and wins > losses
    verdict = (f"Dynamic sampling {'beats' if helps else 'does not beat'} nearest clusters filled to the same "
               f"candidate budget: recall@{k} {mean:+.4f} on average over {len(pairs)} budgets ({wins} higher, "
               f"{len(pairs) - wins - losses} within 0.002, {losses} lower); ms per query "
               f"{np.mean([p['dynamic_ms'] for p in pairs]):.3f} vs {np.mean([p['nearest_ms'] for p in pairs]):.3f}.")
    # plain nprobe at the resolved budget: the fastest nprobe whose recall reaches dynamic sampling's there
    probed = [r for r in rows if r["family"] == "cluster_nearest" and ",nprobe=" in r["setting"]]
    nprobe_match = None
    if probed and probed[0]["budget"] in dynamic:
        b, reference = probed[0]["budget"], dynamic[probed[0]["budget"]]
        reached = [r for r in probed if r["budget"] == b and r[key] >= reference[key] - 0.002]
        nprobe_match = dict(min(reached, key=lambda r: r["ms"])) if reached else None
        verdict += (f" At B = {b}, dynamic sampling reaches recall@{k} {reference[key]:.4f} in {reference['ms']:.3f} "
                    "ms; plain nearest-nprobe " + (
                        f"reaches {nprobe_match[key]:.4f} with {nprobe_match['setting'].split(',')[-1]} in "
                        f"{nprobe_match['ms']:.3f} ms." if nprobe_match else
                        f"does not reach it at any nprobe swept (best {max(r[key] for r in probed):.4f})."))
    return {"pairs": pairs, "mean_recall_gain": mean, "wins": wins, "ties": len(pairs) - wins - losses,
            "losses": losses, "nprobe_match": nprobe_match, "verdict": verdict}


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
