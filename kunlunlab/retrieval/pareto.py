"""The Pareto sweep of notebook 01 and ``python -m kunlunlab.bench retrieval --pareto``: recall@k, latency and
memory of FAISS's strongest CPU configurations and of the clustering retriever (§3.1.1), each family measured
the way :func:`~kunlunlab.retrieval.evaluation.compare_indexes` measures, and the dynamic-sampling ablation read
off the rows."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import faiss
import numpy as np

from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.evaluation import IndexComparison, cluster_allocation, recall_at_k, time_per_query
from kunlunlab.retrieval.indexes import FlatIndex, HNSWConfig, HNSWIndex, IVFPQConfig, IVFPQIndex

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
                 hnsw: HNSWConfig | None = None, comparison: IndexComparison | None = None,
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
    if comparison is not None:
        indexes, truth = {**comparison.indexes, **(indexes or {})}, comparison.truth
    sweep = _Sweep(vectors, np.ascontiguousarray(queries, dtype=np.float32), families, k, threads, repeats, truth,
                   dict(indexes or {}), replace(cluster_config) if cluster_config is not None else ClusterConfig(),
                   warmup, grids or ParetoGrids(), hnsw or HNSWConfig(), comparison, log or (lambda message: None))
    return sweep.run()


class _Sweep:
    """One :func:`pareto_sweep`: the shared state (truth, the cluster retriever, the coarse quantizer) and one
    method per family, in measurement order."""

    def __init__(self, vectors, queries, families, k, threads, repeats, truth, indexes, config, warmup, grids,
                 hnsw, comparison, say):
        self.vectors, self.queries, self.families, self.k = vectors, queries, families, k
        self.threads, self.repeats, self.truth, self.indexes, self.config = threads, repeats, truth, indexes, config
        self.warmup, self.grids, self.hnsw, self.comparison, self.say = warmup, grids, hnsw, comparison, say
        self.dim = int(vectors.shape[1])
        self.build_threads = faiss.omp_get_max_threads()
        self.recall_key = f"recall_at_{k}"
        self.rows: list[dict] = []
        self.nlist = self.coarse = self.sample = None

    def run(self) -> list[dict]:
        try:
            self.reference()
            if any(f.startswith("cluster") or f in ("ivf_flat", "ivfpq_refine", "ivfpq") for f in self.families):
                self.cluster_index()
            if "hnsw" in self.families:
                self.hnsw_family()
            if "ivfpq" in self.families:
                self.ivfpq_family()
            if "ivf_flat" in self.families or "ivfpq_refine" in self.families:
                self.ivf_flat_family()
            if "ivfpq_refine" in self.families:
                self.refine_family()
            if "cluster" in self.families or "cluster_nearest" in self.families:
                self.cluster_families()
        finally:
            faiss.omp_set_num_threads(self.build_threads)
        return self.rows

    # -- measuring -------------------------------------------------------------------------------------------
    def timed(self, search: Callable) -> tuple[float, float]:
        faiss.omp_set_num_threads(self.threads)
        try:
            ms, found = time_per_query(search, self.queries, self.k, self.repeats)
        finally:
            faiss.omp_set_num_threads(self.build_threads)
        return ms, recall_at_k(found, self.truth)

    def add_row(self, family: str, setting: str, search: Callable, ram: float, disk: float = 0.0, **extra) -> None:
        ms, recall = self.timed(search)
        self.rows.append(_pareto_row(family, setting, ms, recall, ram, disk, self.k, **extra))
        self.say(f"{family:16s} {setting:28s} {ms:8.4f} ms  {self.recall_key} {recall:.4f}  RAM {ram:7.1f} B/vector")

    # -- families --------------------------------------------------------------------------------------------
    def reference(self) -> None:
        """Exact top-k (the truth every recall is measured against) and the ``flat`` row."""
        indexes = self.indexes
        if "flat" not in indexes and (self.truth is None or "flat" in self.families):
            flat = FlatIndex(self.dim)
            flat.add(self.vectors)
            indexes["flat"] = flat
        if self.truth is None:
            _, self.truth = indexes["flat"].search(self.queries, self.k)
        if "flat" in self.families and self.comparison is not None:
            flat_row = self.comparison.row("flat")
            self.rows.append(_pareto_row("flat", "exact", flat_row.ms_per_query, flat_row.recall_at_k,
                                         flat_row.bytes_per_vector, 0.0, self.k))
        elif "flat" in self.families:
            self.add_row("flat", "exact", indexes["flat"].search, indexes["flat"].bytes_per_vector())

    def cluster_index(self) -> None:
        """The clustering retriever (built and warmed up here when not given): its ``nlist`` and PQ size set
        the IVF families' so that they are compared at the same partition."""
        if "cluster" not in self.indexes:
            start = time.perf_counter()
            self.indexes["cluster"] = ClusterRetriever(self.dim, self.config).build(self.vectors)
            self.say(f"cluster retriever built in {time.perf_counter() - start:.1f}s")
            served = self.queries if self.warmup is None else np.ascontiguousarray(self.warmup, dtype=np.float32)
            for begin in range(0, len(served), 64):
                self.indexes["cluster"].search(served[begin:begin + 64], self.k)
        self.nlist = self.indexes["cluster"].nlist
        self.config = replace(self.indexes["cluster"].config)  # pq_m and seed of the index actually measured

    def hnsw_family(self) -> None:
        built_here = "hnsw" not in self.indexes
        if built_here:
            start = time.perf_counter()
            index = HNSWIndex(self.dim, self.hnsw)
            index.add(self.vectors)
            self.indexes["hnsw"] = index
            self.say(f"HNSW built in {time.perf_counter() - start:.1f}s")
        graph = self.indexes["hnsw"]
        ram = _serialized_bytes_per_vector(graph.index)
        label = f"M={graph.config.m},efC={graph.config.ef_construction}"
        for ef in self.grids.ef_search:
            params = faiss.SearchParametersHNSW(efSearch=max(int(ef), self.k))
            self.add_row("hnsw", f"{label},efSearch={int(ef)}",
                         lambda q, kk, p=params: graph.index.search(q, kk, params=p), ram)
        if built_here:
            del self.indexes["hnsw"]

    def ivfpq_family(self) -> None:
        built_here = "ivfpq" not in self.indexes
        if built_here:
            index = IVFPQIndex(self.dim, IVFPQConfig(nlist=self.nlist, m=self.config.pq_m))
            index.add(self.vectors)
            self.indexes["ivfpq"] = index
        ivfpq = self.indexes["ivfpq"]
        for nprobe in dict.fromkeys(min(int(v), ivfpq.config.nlist) for v in self.grids.ivfpq_nprobe):
            self.add_row("ivfpq", f"nprobe={nprobe}", lambda q, kk, n=nprobe: ivfpq.search(q, kk, nprobe=n),
                         ivfpq.bytes_per_vector())
        if built_here:
            del self.indexes["ivfpq"]

    def ivf_flat_family(self) -> None:
        """The coarse quantizer FAISS trains with the cluster retriever's ``nlist`` (kept for the refine family)
        and, when asked for, IVF-Flat over it."""
        nlist, dim = self.nlist, self.dim
        start = time.perf_counter()
        quantizer = faiss.IndexFlatIP(dim)
        ivf_flat = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(self.config.seed)
        self.sample = np.ascontiguousarray(
            self.vectors[np.sort(rng.choice(len(self.vectors), size=min(len(self.vectors), 64 * nlist),
                                            replace=False))], dtype=np.float32)
        ivf_flat.train(self.sample)
        self.coarse = quantizer.reconstruct_n(0, nlist)
        self.say(f"IVF coarse quantizer ({nlist} lists) trained in {time.perf_counter() - start:.1f}s")
        if "ivf_flat" in self.families:
            for begin in range(0, len(self.vectors), 200_000):
                ivf_flat.add(np.ascontiguousarray(self.vectors[begin:begin + 200_000], dtype=np.float32))
            ram = _serialized_bytes_per_vector(ivf_flat)
            for nprobe in dict.fromkeys(min(int(v), nlist) for v in self.grids.ivf_nprobe):
                params = faiss.SearchParametersIVF(nprobe=nprobe)
                self.add_row("ivf_flat", f"nlist={nlist},nprobe={nprobe}",
                             lambda q, kk, p=params: ivf_flat.search(q, kk, params=p), ram)

    def refine_family(self) -> None:
        """IVF-PQ fast-scan (4-bit, ``2·pq_m`` sub-quantizers, IVF-Flat's centroids) + float re-rank."""
        nlist, dim = self.nlist, self.dim
        start = time.perf_counter()
        quantizer = faiss.IndexFlatIP(dim)
        quantizer.add(self.coarse)
        base = faiss.IndexIVFPQFastScan(quantizer, dim, nlist, 2 * self.config.pq_m, 4, faiss.METRIC_INNER_PRODUCT)
        base.train(self.sample)  # the quantizer holds nlist centroids already: this trains the PQ codebooks
        refine = faiss.IndexRefineFlat(base)
        for begin in range(0, len(self.vectors), 200_000):
            refine.add(np.ascontiguousarray(self.vectors[begin:begin + 200_000], dtype=np.float32))
        self.say(f"IVF-PQ fast-scan + refine built in {time.perf_counter() - start:.1f}s")
        ram = _serialized_bytes_per_vector(refine)
        for nprobe in dict.fromkeys(min(int(v), nlist) for v in self.grids.refine_nprobe):
            for k_factor in self.grids.refine_k_factor:
                ivf_params = faiss.SearchParametersIVF(nprobe=nprobe)
                params = faiss.IndexRefineSearchParameters(k_factor=float(k_factor), base_index_params=ivf_params)
                self.add_row("ivfpq_refine", f"nlist={nlist},nprobe={nprobe},k_factor={int(k_factor)}",
                             lambda q, kk, p=params, b=ivf_params: refine.search(q, kk, params=p), ram)

    def cluster_families(self) -> None:
        """The clustering retriever over its candidate budgets (``cluster``) and the same index scanning its
        nearest clusters (``cluster_nearest``); the index's settings are restored afterwards."""
        k, cluster, grids = self.k, self.indexes["cluster"], self.grids
        saved = (cluster.config.candidate_budget, cluster.config.selection, cluster.config.nearest_nprobe)
        resolved = cluster.budget(k)
        budgets = sorted({max(k, int(round(resolved * share))) for share in grids.budget_shares})
        ram, disk = cluster.bytes_per_vector(), cluster.disk_bytes_per_vector()

        def scanned_clusters() -> float:
            """Mean clusters scanned per query at the current settings (without serving a query)."""
            if cluster.config.selection == "nearest":
                return float(cluster.nearest_clusters(self.queries, cluster.budget(k))[2].sum(axis=1).mean())
            return float(np.mean([sum(r["scanned"] for r in cluster_allocation(cluster, q, k)) for q in self.queries]))

        try:
            if "cluster" in self.families:
                for b in budgets:
                    cluster.config.candidate_budget = b
                    self.add_row("cluster", f"budget={b}", cluster.search, ram, disk, budget=b,
                                 scanned_clusters=round(scanned_clusters(), 2))
            if "cluster_nearest" in self.families:
                cluster.config.selection = "nearest"
                settings = [(b, 0) for b in budgets] + [(resolved, int(n)) for n in grids.nearest_nprobe
                                                        if int(n) <= self.nlist]
                for b, nprobe in settings:
                    cluster.config.candidate_budget, cluster.config.nearest_nprobe = b, nprobe
                    self.add_row("cluster_nearest", f"budget={b}" + (f",nprobe={nprobe}" if nprobe else ",fill"),
                                 cluster.search, ram, disk, budget=b, scanned_clusters=round(scanned_clusters(), 2))
        finally:
            cluster.config.candidate_budget, cluster.config.selection, cluster.config.nearest_nprobe = saved


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


