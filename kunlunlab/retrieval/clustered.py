"""The clustering retriever of KunLunBaizeRAG (§3.1.1 of arXiv 2506.19466): the index, its build, search and storage.

This docstring describes the whole retriever. The module holds the FAISS index and everything that touches it
(build, the candidate scan, re-ranking, persistence); two neighbours hold what is chosen apart from the index:
:mod:`kunlunlab.retrieval.cluster_sizing` (the number of clusters, the centroids, the candidate budget) and
:mod:`kunlunlab.retrieval.cluster_sampling` (steps 2, 3 and 5 of search, inherited by ``ClusterRetriever``).

Build:
  1. k-means++ seeding (scikit-learn) then spherical k-means (FAISS) gives ``nlist`` centroids.
     ``nlist_method="sqrt"`` (the default) takes about 2·sqrt(N); ``"elbow"`` and ``"silhouette"``
     choose it the paper's way, by k-means on a sample over a grid of candidates (see
     ``cluster_sizing.select_nlist``). Departure: the paper picks the count by elbow/silhouette; the
     default here is 2·sqrt(N) because for an index the count sets the cost of a probe and of the centroid scan
     (about sqrt(N) members per cluster balances the two), which elbow and silhouette do not weigh;
  2. an IVF-PQ index over those centroids holds compact codes for fast candidate scans (FAISS's
     SIMD fast-scan layout by default: ``pq_m`` bytes per vector as 2·pq_m 4-bit codes);
  3. the re-ranking source: ``rerank="exact"`` keeps the float vectors in a memory-mapped file
     (only the compact codes live in RAM; the few candidates' rows are read per query, as DiskANN
     and FAISS's refine-from-disk do), ``rerank="pq"`` keeps finer residual PQ codes in RAM and
     reconstructs ``centroid + residual`` (smaller on disk, less precise);
  4. a doc→cluster table (and the IVF lists as cluster→docs).

Search, for every query in a batch at once:
  1. score the ``max_clusters`` nearest centroids;
  2. dynamic cluster sampling: ``p_c = softmax(s_c / T_t + γ·log w_c)`` with an annealed
     temperature ``T_t = T_end + (T_start − T_end)·exp(−t/τ)`` and EMA cluster weights ``w_c``;
     every considered cluster keeps at least ``min_share`` of the probability (cold-start floor),
     empty clusters get none (their share goes to the others);
  3. resource-aware allocation: the global candidate budget ``B`` is split as quotas
     ``q_c = p_c·B``; clusters with ``q_c ≥ 1`` are scanned (so the probe count adapts to how
     ambiguous the query is) with a priority quota of ``⌈q_c⌉`` candidates, and each cluster with
     ``q_c < 1`` is scanned for ``m = explore_slots`` slots with probability ``q_c/m`` (stochastic
     rounding, one systematic draw per query), so its expected slot count is its quota. Without
     that draw a floored cluster (``q_c = B·min_share ≈ 0.05`` at the defaults) would never be
     scanned, its documents could never become hits, and its EMA weight could never rise: the floor
     would be inert. The re-ranked candidates stay exactly ``B`` (see ``allocate``);
  4. the candidates' vectors are reconstructed (read back, or decoded) and re-ranked exactly;
  5. the EMA weights move toward each cluster's share of final hits relative to its size (a ratio
     to the mean hit rate per document: 1 = hit as often as its size predicts), clipped so that the
     weight term ``w_c^γ`` lies in ``[1/F, F]`` with ``F = weight_factor`` (4 by default): a
     cluster's share can rise or fall by the paper's 3–5x against neutral rivals (once above the
     floor) and never by more than ``F·(1 + n·min_share)`` (``n`` considered clusters; the floor's
     normaliser adds that little), nor more than ``F²·(1 + n·min_share)`` when every rival sits at
     the opposite bound (see ``weight_bounds``).

The default cluster count (above), the rounding of quotas, the random source of the draws (``draws``),
``γ = 1`` and the bound on the weights are this workbench's choices, each explained where it is made
(the last four in :mod:`kunlunlab.retrieval.cluster_sampling`).

If fewer than ``k`` candidates survive (all probed clusters tiny or empty), the query falls back to
a plain IVF scan over its nearest non-empty clusters, so a result list is never short.

``candidate_budget=0`` derives ``B`` from the index's size (``cluster_sizing.auto_candidate_budget``: measured
rule and recall there). ``selection="nearest"`` is the ablation of steps 2–3: no sampling, no weights, no quotas;
the nearest clusters by centroid score (``nearest_nprobe`` of them, or until their members fill ``B``)
are scanned and their best ``B`` candidates by PQ score re-ranked (``search_nearest``).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from kunlunlab.retrieval.cluster_sampling import DynamicClusterSampling
from kunlunlab.retrieval.cluster_sizing import auto_candidate_budget, default_nlist, select_nlist, train_centroids

NLIST_METHODS = ("sqrt", "elbow", "silhouette")
SELECTIONS = ("dynamic", "nearest")


@dataclass
class ClusterConfig:
    nlist: int = 0  # 0: chosen by nlist_method
    nlist_method: str = "sqrt"  # "sqrt": about 2·sqrt(N), a power of two; "elbow" | "silhouette": see select_nlist
    nlist_sample: int = 10_000  # vectors the elbow/silhouette search clusters (silhouette scores ≤ 4000 of them)
    pq_m: int = 48  # bytes of scan code per vector
    pq_by_residual: bool = False
    fast_scan: bool = True  # FAISS IVFPQFastScan (4-bit, SIMD) for the candidate scan
    rerank: str = "exact"  # "exact": float vectors, memory-mapped; "pq": in-RAM residual PQ codes
    refine_m: int = 96  # rerank="pq": bytes of reconstruction code per vector
    max_clusters: int = 48  # clusters considered per query
    candidate_budget: int = 112  # global candidate budget B per query; 0: auto_candidate_budget(N, nlist)
    selection: str = "dynamic"  # "dynamic": §3.1.1 sampling and quotas; "nearest": the ablation (see search_nearest)
    nearest_nprobe: int = 0  # selection="nearest": clusters scanned; 0: the nearest until their members fill B
    temperature_start: float = 0.5
    temperature_end: float = 0.05
    anneal_queries: float = 1000.0  # τ, in queries served
    ema_decay: float = 0.995
    weight_strength: float = 1.0  # γ: w_c is a hit-rate ratio, so γ = 1 makes the weight term that ratio
    weight_factor: float = 4.0  # F: w_c^γ ∈ [1/F, F], the paper's 3–5x range of share shifts
    min_share: float = 1.0 / 2048  # cold-start floor on a considered cluster's probability
    explore_slots: int = 16  # m: a cluster with quota q_c < 1 is scanned for m slots with probability q_c/m (0: never)
    adapt: bool = True  # update EMA weights and the annealing clock while serving
    kmeans_iters: int = 20
    train_sample: int = 100_000
    refine_sample: int = 32_768
    seed: int = 0


class ClusterRetriever(DynamicClusterSampling):
    """The §3.1.1 clustering retriever: an IVF-PQ index searched by dynamic cluster sampling (module docstring)."""

    kind = "cluster"

    def __init__(self, dim: int, config: ClusterConfig | None = None):
        self.dim = dim
        self.config = config or ClusterConfig()
        self.step = 0  # queries served: the annealing clock
        self.ivf: faiss.IndexIVF | None = None  # IVFPQFastScan by default, IVFPQ with fast_scan=False
        self._nprobe = -1  # last nprobe written to the index (see _set_nprobe)
        self.refine_pq: faiss.ProductQuantizer | None = None
        self.refine_codes = np.zeros((0, self.config.refine_m), dtype=np.uint8)
        self.doc_cluster = np.zeros(0, dtype=np.int32)
        self.cluster_sizes = np.zeros(0, dtype=np.int64)
        self.weights = np.zeros(0, dtype=np.float32)
        self.centroids = np.zeros((0, dim), dtype=np.float32)
        self.vector_store: np.ndarray = np.zeros((0, dim), dtype=np.float32)  # rerank="exact" (may be a memmap)
        self.vector_file: Path | None = None  # the .npy the store is memory-mapped from (load, add_shards)
        if self.config.rerank not in ("exact", "pq"):
            raise ValueError(f"rerank must be 'exact' or 'pq', got {self.config.rerank!r}")
        if self.config.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.config.selection!r}")
        if self.config.candidate_budget < 0 or self.config.nearest_nprobe < 0:
            raise ValueError("candidate_budget (0: auto) and nearest_nprobe (0: fill the budget) must be ≥ 0")
        if self.config.nlist_method not in NLIST_METHODS:
            raise ValueError(f"nlist_method must be one of {NLIST_METHODS}, got {self.config.nlist_method!r}")
        if self.config.explore_slots < 0:
            raise ValueError(f"explore_slots must be ≥ 0 (0: no exploration), got {self.config.explore_slots}")
        if self.config.weight_factor < 1.0 or self.config.weight_strength < 0.0:
            raise ValueError("weight_factor must be ≥ 1 and weight_strength (γ) ≥ 0")
        self.nlist_scores: dict[int, float] = {}  # elbow/silhouette: each candidate's criterion

    # ------------------------------------------------------------------ build
    @property
    def ntotal(self) -> int:
        return int(self.doc_cluster.shape[0])

    @property
    def nlist(self) -> int:
        return self._nlist if self.ivf is not None else 0

    def _train_centroids(self, sample: np.ndarray, nlist: int) -> np.ndarray:
        return train_centroids(sample, nlist, self.config.kmeans_iters, self.config.seed)[0]

    def choose_nlist(self, vectors: np.ndarray) -> int:
        """``config.nlist`` if set, else by ``config.nlist_method`` (capped at N/8 by the build)."""
        c = self.config
        n = len(vectors)
        if c.nlist or c.nlist_method == "sqrt":
            return c.nlist or default_nlist(n)
        rng = np.random.default_rng(c.seed + 1)
        rows = np.sort(rng.choice(n, size=min(n, c.nlist_sample), replace=False))
        nlist, self.nlist_scores = select_nlist(vectors[rows], c.nlist_method, c.kmeans_iters, c.seed, n_total=n)
        return nlist

    def build(self, vectors: np.ndarray) -> "ClusterRetriever":
        """``vectors`` may be a read-only memmap: with ``rerank="exact"`` it becomes the vector store as is."""
        self.train(vectors)
        t0 = time.perf_counter()
        self.add(vectors)
        self.build_seconds["add"] = time.perf_counter() - t0
        return self

    def train(self, vectors: np.ndarray) -> None:
        """The clusters and codebooks, from a sample of ``vectors`` (rows drawn by the config's seed, so a
        memmap over the same rows trains the same index: :mod:`kunlunlab.retrieval.sharded`)."""
        n = len(vectors)
        c = self.config
        sub_quantizers = 2 * c.pq_m if c.fast_scan else c.pq_m
        if self.dim % sub_quantizers or (c.rerank == "pq" and self.dim % c.refine_m):
            raise ValueError(f"dimension {self.dim} must be divisible by the {sub_quantizers} scan sub-quantizers "
                             f"(pq_m={c.pq_m}, fast_scan={c.fast_scan})"
                             + (f" and by refine_m={c.refine_m}" if c.rerank == "pq" else "")
                             + ": choose pq_m (and refine_m) to fit the embedder")
        t0 = time.perf_counter()
        nlist = min(self.choose_nlist(vectors), max(1, n // 8))
        select_s = time.perf_counter() - t0
        rng = np.random.default_rng(c.seed)
        sample = np.ascontiguousarray(
            vectors[np.sort(rng.choice(n, size=min(n, max(c.train_sample, 40 * nlist)), replace=False))], dtype=np.float32)
        t0 = time.perf_counter()
        centroids = self._train_centroids(sample, nlist)
        self.build_seconds = {"kmeans": time.perf_counter() - t0}
        if select_s > 0.01:
            self.build_seconds["nlist_select"] = select_s
        quantizer = faiss.IndexFlatIP(self.dim)
        quantizer.add(centroids)
        if c.fast_scan:  # 4-bit codes scanned with SIMD: same bytes (2·pq_m sub-quantizers), ~1.5x faster scan
            self.ivf = faiss.IndexIVFPQFastScan(quantizer, self.dim, nlist, 2 * c.pq_m, 4, faiss.METRIC_INNER_PRODUCT)
        else:
            self.ivf = faiss.IndexIVFPQ(quantizer, self.dim, nlist, c.pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        self.ivf.pq.cp.min_points_per_centroid = 1  # small corpora: train anyway, without warnings
        # Codes of the vectors themselves, not of residuals: with inner product FAISS would otherwise rebuild
        # a look-up table for every probed list; this way one table per query serves all of them, and the
        # exact re-ranking absorbs the coarser candidate order.
        self.ivf.by_residual = c.pq_by_residual
        self._own_quantizer = quantizer  # keep the Python object alive alongside the IVF
        self._nlist = nlist  # cached: reading it through SWIG costs microseconds on the hot path
        self.ivf.train(sample)  # the quantizer already holds the centroids, so this trains the PQ codebooks only
        self.build_seconds["ivfpq_train"] = time.perf_counter() - t0 - self.build_seconds["kmeans"]
        self.centroids = centroids
        if c.rerank == "pq":
            self.refine_pq = faiss.ProductQuantizer(self.dim, c.refine_m, 8)
            self.refine_pq.cp.niter = 12  # 4-d sub-spaces converge fast; training time matters at build
            self.refine_pq.cp.min_points_per_centroid = 1
            refine_sample = sample[: c.refine_sample]
            _, sample_assign = quantizer.search(refine_sample, 1)
            self.refine_pq.train(refine_sample - centroids[sample_assign.ravel()])
        self.build_seconds["refine_train"] = (time.perf_counter() - t0 - self.build_seconds["kmeans"]
                                              - self.build_seconds["ivfpq_train"])

    def add(self, vectors: np.ndarray, store_vectors: bool = True) -> None:
        """Adds the codes of ``vectors`` (and, with ``rerank="exact"``, the vectors to the store unless
        ``store_vectors`` is False: :meth:`add_shards` attaches a store of every row at the end)."""
        first_new = self.ntotal
        store = vectors
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.ivf.add(vectors)
        # doc→cluster, read back from the inverted lists so it matches them exactly.
        doc_cluster = np.empty(self.ivf.ntotal, dtype=np.int32)
        for cluster in range(self.nlist):
            doc_cluster[self.cluster_members(cluster)] = cluster
        self.doc_cluster = doc_cluster
        if self.config.rerank == "exact" and store_vectors:
            # np.asarray drops the memmap subclass (no copy): gathers then skip memmap's per-call overhead.
            self.vector_store = np.asarray(store) if first_new == 0 else np.concatenate([self.vector_store, vectors])
            self.vector_file = None
        elif self.config.rerank == "pq":
            residuals = vectors - self.centroids[self.doc_cluster[first_new:]]
            self.refine_codes = np.concatenate([self.refine_codes, self.refine_pq.compute_codes(residuals)])
        self.cluster_sizes = np.bincount(self.doc_cluster, minlength=self.nlist).astype(np.int64)
        if self.weights.shape[0] != self.nlist:
            self.weights = np.ones(self.nlist, dtype=np.float32)
        self.refresh_tables()

    def add_shards(self, shards, vector_file: Path | None = None) -> None:
        """Adds the codes shard by shard (an iterable of arrays: a corpus whose vectors never sit in RAM
        at once). With ``rerank="exact"`` the store is ``vector_file``, an ``.npy`` of every row's vector in
        order (memory-mapped; :meth:`save` into its own folder keeps it instead of rewriting it)."""
        for shard in shards:
            self.add(shard, store_vectors=False)
        if self.config.rerank == "exact":
            if vector_file is None:
                raise ValueError('rerank="exact" needs the vector file of every row (vector_file)')
            store = np.load(vector_file, mmap_mode="r")
            if store.shape != (self.ntotal, self.dim):
                raise ValueError(f"{vector_file} holds {store.shape} vectors for an index of {self.ntotal} × {self.dim}")
            self.vector_store, self.vector_file = np.asarray(store), Path(vector_file)

    def cluster_members(self, cluster: int) -> np.ndarray:
        """cluster→docs table, read from the inverted lists."""
        invlists = self.ivf.invlists
        size = invlists.list_size(cluster)
        ids = faiss.rev_swig_ptr(invlists.get_ids(cluster), size).copy() if size else np.zeros(0, np.int64)
        return ids

    # ------------------------------------------------------------------ search
    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Batch search: (scores, row ids), each (nq, k), best first."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if len(q) > 256:  # bounded working memory for very large batches
            parts = [self.search(q[i:i + 256], k) for i in range(0, len(q), 256)]
            return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
        c = self.config
        budget = self.budget(k)
        if c.selection == "nearest":
            return self.search_nearest(q, k, budget)
        n_considered = min(c.max_clusters, self.nlist)
        centroid_scores, clusters = self.ivf.quantizer.search(q, n_considered)
        quota = self.cluster_probabilities(centroid_scores, clusters) * budget
        probe, cap = self.allocate(quota, self.draws(q) if c.explore_slots else None, c.explore_slots)
        probe[:, 0] = clusters[:, 0] >= 0  # always scan the nearest cluster
        # Unprobed slots are -1, which the IVF scan skips, so no re-ordering is needed.
        self._set_nprobe(n_considered)
        fetch = budget + budget // 4  # over-fetch, so quotas can trade a dominant cluster's tail for others
        _, cand = self.ivf.search_preassigned(q, fetch, np.where(probe, clusters, -1), centroid_scores)
        cand, slot = self._apply_quotas(cand, clusters, cap, budget)
        scores, rows = self._rerank(q, cand, slot, centroid_scores, k)
        short = rows[:, k - 1] < 0
        if short.any():  # empty-cluster fallback
            scores[short], rows[short] = self._fallback(q[short], k)
        if c.adapt:
            self._record_hits(rows)
            self.step += len(q)
        return scores, rows

    def budget(self, k: int = 10) -> int:
        """The candidate budget ``B`` a search for the top ``k`` re-ranks: ``config.candidate_budget``, or
        :func:`auto_candidate_budget` of this index's size and cluster count when it is 0; at least ``k``."""
        b = self.config.candidate_budget
        return max(k, b if b > 0 else auto_candidate_budget(self.ntotal, self.nlist, k))

    def nearest_clusters(self, q: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``selection="nearest"`` (the ablation of dynamic sampling): (centroid scores, clusters, scanned),
        each (nq, considered), nearest centroid first. No sampling, no EMA weights, no quotas: with
        ``nearest_nprobe`` = n > 0 the n nearest clusters are scanned (plain IVF nprobe); with 0 the nearest
        ``max_clusters`` are taken by centroid score until their members fill the budget ``B`` (a cluster is
        scanned when the nearer ones hold fewer than ``B`` documents; the nearest is always scanned)."""
        c = self.config
        n_considered = min(c.nearest_nprobe or c.max_clusters, self.nlist)
        centroid_scores, clusters = self.ivf.quantizer.search(q, n_considered)
        valid = clusters >= 0
        if c.nearest_nprobe:
            return centroid_scores, clusters, valid
        sizes = np.where(valid, self.cluster_sizes[np.maximum(clusters, 0)], 0)
        nearer = np.cumsum(sizes, axis=1) - sizes  # members of the clusters ranked before each one
        return centroid_scores, clusters, valid & (nearer < budget)

    def search_nearest(self, q: np.ndarray, k: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """The scan and re-rank of :meth:`search` over :meth:`nearest_clusters`: the best ``B`` candidates by
        PQ score among the scanned clusters' members are re-ranked exactly. Neither the annealing clock nor
        the EMA weights move (nothing here reads them)."""
        centroid_scores, clusters, probe = self.nearest_clusters(q, budget)
        self._set_nprobe(clusters.shape[1])
        _, cand = self.ivf.search_preassigned(q, budget, np.where(probe, clusters, -1), centroid_scores)
        scores, rows = self._rerank(q, cand, self._slots(cand, clusters), centroid_scores, k)
        short = rows[:, k - 1] < 0
        if short.any():
            scores[short], rows[short] = self._fallback(q[short], k)
        return scores, rows

    def _set_nprobe(self, nprobe: int) -> None:
        """search_preassigned reads nprobe from the index (it takes no per-call parameters); the value is
        cached here because reading it back through SWIG costs microseconds on every query."""
        if nprobe != self._nprobe:
            self.ivf.nprobe = nprobe
            self._nprobe = nprobe

    def reconstruct(self, rows: np.ndarray) -> np.ndarray:
        """Candidate vectors: read from the vector store, or rebuilt as centroid + decoded residual."""
        rows = np.asarray(rows)
        if self.config.rerank == "exact":
            # np.take gathers rows faster than fancy indexing on a (memory-mapped) 2-D array
            return np.take(self.vector_store, rows.ravel(), axis=0).reshape(*rows.shape, self.dim)
        return self.centroids[self.doc_cluster[rows]] + self.refine_pq.decode(self.refine_codes[rows])

    def _candidate_scores(self, q: np.ndarray, cand: np.ndarray, slot: np.ndarray,
                          centroid_scores: np.ndarray) -> np.ndarray:
        nq, width = cand.shape
        safe = np.maximum(cand, 0)
        if self.config.rerank == "exact":
            return np.matmul(self.reconstruct(safe), q[:, :, None])[:, :, 0]
        # q·(c + r) = q·c + Σ_m q_m·r_m with per-query look-up tables: the same scores as the dot products
        # with reconstruct()'s vectors, without materialising them.
        m = self.config.refine_m
        lut = np.empty((nq, m * 256), dtype=np.float32)
        self.refine_pq.compute_inner_prod_tables(nq, faiss.swig_ptr(q), faiss.swig_ptr(lut))
        codes = self.refine_codes[safe].astype(np.int32)  # (nq, width, m)
        codes += self._lut_offsets + (np.arange(nq, dtype=np.int32) * (m * 256))[:, None, None]
        return centroid_scores[np.arange(nq)[:, None], np.maximum(slot, 0)] + np.take(lut, codes).sum(axis=2)

    def _rerank(self, q: np.ndarray, cand: np.ndarray, slot: np.ndarray, centroid_scores: np.ndarray,
                k: int) -> tuple[np.ndarray, np.ndarray]:
        nq, width = cand.shape
        rows_idx = np.arange(nq)[:, None]
        exact = self._candidate_scores(q, cand, slot, centroid_scores)
        exact[cand < 0] = -np.inf
        kk = min(k, width)
        negated = np.negative(exact)
        top = np.argpartition(negated, kk - 1, axis=1)[:, :kk] if kk < width else np.tile(np.arange(width), (nq, 1))
        top = top[rows_idx, np.argsort(negated[rows_idx, top], axis=1, kind="stable")]
        scores = exact[rows_idx, top].astype(np.float32, copy=False)
        rows = np.where(np.isfinite(scores), cand[rows_idx, top], -1)
        if kk < k:
            scores = np.pad(scores, ((0, 0), (0, k - kk)), constant_values=-np.inf)
            rows = np.pad(rows, ((0, 0), (0, k - kk)), constant_values=-1)
        return scores, rows

    def _fallback(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        nonempty = int((self.cluster_sizes > 0).sum())
        nprobe = min(self.nlist, max(self.config.max_clusters, 1) * 4, max(nonempty, 1))
        centroid_scores, clusters = self.ivf.quantizer.search(q, nprobe)
        self._set_nprobe(nprobe)
        _, cand = self.ivf.search_preassigned(q, self.budget(k), clusters, centroid_scores)
        return self._rerank(q, cand, self._slots(cand, clusters), centroid_scores, k)

    def refresh_tables(self) -> None:
        """Recomputes the lookup tables derived from the index state (after build, load or edits)."""
        m = self.config.refine_m
        self._lut_offsets = (np.arange(m, dtype=np.int32) * 256)[None, None, :]
        # doc→cluster with a sentinel at index -1, so a missing candidate (-1) maps to "no cluster".
        self._doc_cluster_ext = np.append(self.doc_cluster, self.nlist).astype(np.int64)
        self._weight_logits = (self.config.weight_strength * np.log(self.weights)).astype(np.float32)  # γ log w
        # draws(): a fixed random direction; scale 1e3 makes frac(q·r) uniform for unit-norm queries. Float64, so
        # that a batch's matrix product and a single query's dot product agree far below any draw's resolution.
        self._draw_direction = np.random.default_rng(self.config.seed).normal(scale=1e3, size=self.dim)
        self._has_empty = bool((self.cluster_sizes == 0).any())
        self._slot_table = np.full(self.nlist + 1, -1, dtype=np.int32)
        self._considered_positions = np.arange(max(self.nlist, 1), dtype=np.int32)  # the fallback may consider all
        self._pending_hits: list[np.ndarray] = []
        self._pending_queries = 0

    # ------------------------------------------------------------------ accounting and persistence
    def bytes_per_vector(self) -> float:
        """RAM-resident bytes per vector: IVF codes, ids and centroids, doc→cluster, weights, PQ refine codes."""
        total = faiss.serialize_index(self.ivf).nbytes + self.doc_cluster.nbytes + self.weights.nbytes
        if self.config.rerank == "pq":
            total += self.refine_codes.nbytes + faiss.vector_to_array(self.refine_pq.centroids).nbytes
        return total / max(1, self.ntotal)

    def disk_bytes_per_vector(self) -> float:
        """Bytes per vector read on demand from the memory-mapped store (rerank="exact"), not held in RAM."""
        return float(self.dim * 4) if self.config.rerank == "exact" else 0.0

    def params(self) -> dict:
        return {"dim": self.dim, **asdict(self.config), "nlist_built": self.nlist}

    def save(self, folder: Path) -> None:
        faiss.write_index(self.ivf, str(folder / "index.faiss"))
        state = {"doc_cluster": self.doc_cluster, "weights": self.weights, "step": np.array([self.step])}
        if self.config.rerank == "pq":
            state.update(refine_codes=self.refine_codes, refine_centroids=faiss.vector_to_array(self.refine_pq.centroids))
        else:
            target = folder / "vectors.npy"
            source = self.vector_file  # the store is memory-mapped from this file
            if source is not None and target.exists() and source.resolve() == target.resolve():
                pass  # saved into the folder it was loaded from: the file is already there (rewriting it
                # while it is mapped would truncate what is being read)
            elif source is not None:
                shutil.copyfile(source, target)  # file to file: a large store never passes through RAM
            else:
                np.save(target, np.asarray(self.vector_store, dtype=np.float32))
        np.savez(folder / "cluster_state.npz", **state)

    @classmethod
    def load(cls, folder: Path, params: dict) -> "ClusterRetriever":
        config = ClusterConfig(**{k: v for k, v in params.items() if k in ClusterConfig.__dataclass_fields__})
        obj = cls(params["dim"], config)
        obj.ivf = faiss.read_index(str(folder / "index.faiss"))
        obj._nlist = int(obj.ivf.nlist)
        state = np.load(folder / "cluster_state.npz")
        if config.rerank == "pq":
            obj.refine_pq = faiss.ProductQuantizer(obj.dim, config.refine_m, 8)
            faiss.copy_array_to_vector(state["refine_centroids"], obj.refine_pq.centroids)
            obj.refine_codes = state["refine_codes"]
        else:
            obj.vector_store = np.asarray(np.load(folder / "vectors.npy", mmap_mode="r"))
            obj.vector_file = folder / "vectors.npy"
        obj.doc_cluster = state["doc_cluster"]
        obj.weights = state["weights"]
        obj.step = int(state["step"][0])
        obj.cluster_sizes = np.bincount(obj.doc_cluster, minlength=obj.nlist).astype(np.int64)
        obj.centroids = obj.ivf.quantizer.reconstruct_n(0, obj.nlist)
        obj.refresh_tables()
        return obj

    def describe(self) -> str:
        return json.dumps({"nlist": self.nlist, "n": self.ntotal, "temperature": round(self.temperature(), 4)})
