"""The clustering retriever of KunLunBaizeRAG (paper §3.1.1).

Build:
  1. k-means++ seeding (scikit-learn) then spherical k-means (FAISS) gives ``nlist`` centroids;
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
     ambiguous the query is), and at most ``⌈q_c⌉`` candidates are kept from each cluster;
  4. the candidates' vectors are reconstructed (read back, or decoded) and re-ranked exactly;
  5. the EMA weights move toward each cluster's share of final hits relative to its size.

If fewer than ``k`` candidates survive (all probed clusters tiny or empty), the query falls back to
a plain IVF scan over its nearest non-empty clusters, so a result list is never short.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np


@dataclass
class ClusterConfig:
    nlist: int = 0  # 0: about 2·sqrt(N), a power of two
    pq_m: int = 48  # bytes of scan code per vector
    pq_by_residual: bool = False
    fast_scan: bool = True  # FAISS IVFPQFastScan (4-bit, SIMD) for the candidate scan
    rerank: str = "exact"  # "exact": float vectors, memory-mapped; "pq": in-RAM residual PQ codes
    refine_m: int = 96  # rerank="pq": bytes of reconstruction code per vector
    max_clusters: int = 48  # clusters considered per query
    candidate_budget: int = 112  # global candidate budget B per query
    temperature_start: float = 0.5
    temperature_end: float = 0.05
    anneal_queries: float = 1000.0  # τ, in queries served
    ema_decay: float = 0.995
    weight_strength: float = 0.25  # γ
    weight_clip: float = 2.0  # w ∈ [1/clip, clip]
    min_share: float = 1.0 / 2048  # cold-start floor on a considered cluster's probability
    adapt: bool = True  # update EMA weights and the annealing clock while serving
    kmeans_iters: int = 20
    train_sample: int = 100_000
    refine_sample: int = 32_768
    seed: int = 0


def default_nlist(n: int) -> int:
    return int(2 ** max(3, round(math.log2(2 * math.sqrt(max(n, 1))))))


class ClusterRetriever:
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
        if self.config.rerank not in ("exact", "pq"):
            raise ValueError(f"rerank must be 'exact' or 'pq', got {self.config.rerank!r}")

    # ------------------------------------------------------------------ build
    @property
    def ntotal(self) -> int:
        return int(self.doc_cluster.shape[0])

    @property
    def nlist(self) -> int:
        return self._nlist if self.ivf is not None else 0

    def _train_centroids(self, sample: np.ndarray, nlist: int) -> np.ndarray:
        from sklearn.cluster import kmeans_plusplus

        rng = np.random.default_rng(self.config.seed)
        seed_rows = sample[rng.choice(len(sample), size=min(len(sample), 8 * nlist), replace=False)]
        init, _ = kmeans_plusplus(seed_rows, n_clusters=nlist, random_state=self.config.seed)
        kmeans = faiss.Kmeans(self.dim, nlist, niter=self.config.kmeans_iters, spherical=True,
                              seed=self.config.seed, verbose=False, min_points_per_centroid=1)
        kmeans.train(sample, init_centroids=np.ascontiguousarray(init, dtype=np.float32))
        return kmeans.centroids

    def build(self, vectors: np.ndarray) -> "ClusterRetriever":
        """``vectors`` may be a read-only memmap: with ``rerank="exact"`` it becomes the vector store as is."""
        n = len(vectors)
        c = self.config
        sub_quantizers = 2 * c.pq_m if c.fast_scan else c.pq_m
        if self.dim % sub_quantizers or (c.rerank == "pq" and self.dim % c.refine_m):
            raise ValueError(f"dimension {self.dim} must be divisible by the {sub_quantizers} scan sub-quantizers "
                             f"(pq_m={c.pq_m}, fast_scan={c.fast_scan})"
                             + (f" and by refine_m={c.refine_m}" if c.rerank == "pq" else "")
                             + ": choose pq_m (and refine_m) to fit the embedder")
        nlist = c.nlist or default_nlist(n)
        nlist = min(nlist, max(1, n // 8))
        rng = np.random.default_rng(c.seed)
        sample = np.ascontiguousarray(
            vectors[np.sort(rng.choice(n, size=min(n, max(c.train_sample, 40 * nlist)), replace=False))], dtype=np.float32)
        t0 = time.perf_counter()
        centroids = self._train_centroids(sample, nlist)
        self.build_seconds = {"kmeans": time.perf_counter() - t0}
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
        self.build_seconds["refine_train"] = time.perf_counter() - t0 - sum(self.build_seconds.values())
        self.add(vectors)
        self.build_seconds["add"] = time.perf_counter() - t0 - sum(self.build_seconds.values())
        return self

    def add(self, vectors: np.ndarray) -> None:
        first_new = self.ntotal
        store = vectors
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.ivf.add(vectors)
        # doc→cluster, read back from the inverted lists so it matches them exactly.
        doc_cluster = np.empty(self.ivf.ntotal, dtype=np.int32)
        for cluster in range(self.nlist):
            doc_cluster[self.cluster_members(cluster)] = cluster
        self.doc_cluster = doc_cluster
        if self.config.rerank == "exact":
            # np.asarray drops the memmap subclass (no copy): gathers then skip memmap's per-call overhead.
            self.vector_store = np.asarray(store) if first_new == 0 else np.concatenate([self.vector_store, vectors])
        else:
            residuals = vectors - self.centroids[self.doc_cluster[first_new:]]
            self.refine_codes = np.concatenate([self.refine_codes, self.refine_pq.compute_codes(residuals)])
        self.cluster_sizes = np.bincount(self.doc_cluster, minlength=self.nlist).astype(np.int64)
        if self.weights.shape[0] != self.nlist:
            self.weights = np.ones(self.nlist, dtype=np.float32)
        self.refresh_tables()

    def cluster_members(self, cluster: int) -> np.ndarray:
        """cluster→docs table, read from the inverted lists."""
        invlists = self.ivf.invlists
        size = invlists.list_size(cluster)
        ids = faiss.rev_swig_ptr(invlists.get_ids(cluster), size).copy() if size else np.zeros(0, np.int64)
        return ids

    # ------------------------------------------------------------------ search
    def temperature(self) -> float:
        c = self.config
        return c.temperature_end + (c.temperature_start - c.temperature_end) * math.exp(-self.step / c.anneal_queries)

    def cluster_probabilities(self, scores: np.ndarray, clusters: np.ndarray) -> np.ndarray:
        """Dynamic cluster sampling distribution over each query's considered clusters:
        ``p_c ∝ max(softmax(s_c/T_t + γ·log w_c), min_share)``, zero for empty or missing clusters."""
        c = self.config
        logits = scores * (1.0 / self.temperature())
        masked = self._has_empty or bool((clusters < 0).any())
        if masked:
            usable = clusters >= 0
            usable[usable] = self.cluster_sizes[clusters[usable]] > 0  # empty clusters get no share
            clusters = np.maximum(clusters, 0)
        logits += c.weight_strength * self._log_weights[clusters]
        if masked:
            logits[~usable] = -np.inf
            top = logits.max(axis=1, keepdims=True)
            top[~np.isfinite(top)] = 0.0  # a query whose considered clusters are all empty: all-zero row
            logits -= top
        else:
            logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= np.maximum(p.sum(axis=1, keepdims=True), 1e-30)
        np.maximum(p, c.min_share, out=p)  # cold-start floor
        if masked:
            p *= usable
        total = p.sum(axis=1, keepdims=True)
        return np.divide(p, total, out=np.zeros_like(p), where=total > 0)

    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Batch search: (scores, row ids), each (nq, k), best first."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if len(q) > 256:  # bounded working memory for very large batches
            parts = [self.search(q[i:i + 256], k) for i in range(0, len(q), 256)]
            return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
        c = self.config
        budget = max(c.candidate_budget, k)
        n_considered = min(c.max_clusters, self.nlist)
        centroid_scores, clusters = self.ivf.quantizer.search(q, n_considered)
        quota = self.cluster_probabilities(centroid_scores, clusters) * budget
        probe = quota >= 1.0
        probe[:, 0] = clusters[:, 0] >= 0  # always scan the nearest cluster
        # Unprobed slots are -1, which the IVF scan skips, so no re-ordering is needed.
        self._set_nprobe(n_considered)
        fetch = budget + budget // 4  # over-fetch, so quotas can trade a dominant cluster's tail for others
        _, cand = self.ivf.search_preassigned(q, fetch, np.where(probe, clusters, -1), centroid_scores)
        cand, slot = self._apply_quotas(cand, clusters, quota, budget)
        scores, rows = self._rerank(q, cand, slot, centroid_scores, k)
        short = rows[:, k - 1] < 0
        if short.any():  # empty-cluster fallback
            scores[short], rows[short] = self._fallback(q[short], k)
        if c.adapt:
            self._record_hits(rows)
            self.step += len(q)
        return scores, rows

    def _set_nprobe(self, nprobe: int) -> None:
        """search_preassigned reads nprobe from the index (it takes no per-call parameters); the value is
        cached here because reading it back through SWIG costs microseconds on every query."""
        if nprobe != self._nprobe:
            self.ivf.nprobe = nprobe
            self._nprobe = nprobe

    def _slots(self, cand: np.ndarray, clusters: np.ndarray) -> np.ndarray:
        """For each candidate, the position of its cluster in the query's considered list (-1: none)."""
        nq, n_considered = clusters.shape
        cand_cluster = self._doc_cluster_ext[cand]  # -1 maps to the "no candidate" column
        if nq == 1:  # the common single-query case reuses one table instead of allocating nq × nlist
            table = self._slot_table
            table[clusters[0]] = self._considered_positions[:n_considered]
            slot = table[cand_cluster]
            table[clusters[0]] = -1
            table[self.nlist] = -1
            return slot
        rows_idx = np.arange(nq)[:, None]
        table = np.full((nq, self.nlist + 1), -1, dtype=np.int32)  # last column: "no candidate"
        table[rows_idx, np.where(clusters >= 0, clusters, self.nlist)] = np.arange(n_considered)
        return table[rows_idx, cand_cluster]

    def _apply_quotas(self, cand: np.ndarray, clusters: np.ndarray, quota: np.ndarray,
                      budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Resource-aware allocation of the budget: candidates inside their cluster's quota ⌈q_c⌉ come
        first, then the budget is filled with the best remaining ones (PQ order), so quota a small
        cluster cannot use flows to the others instead of being wasted."""
        nq, fetched = cand.shape
        n_considered = clusters.shape[1]
        slot = self._slots(cand, clusters)
        valid = slot >= 0
        position = np.arange(fetched)[None, :]
        rows_idx = np.arange(nq)[:, None]
        # Rank of each candidate inside its cluster: one stable sort of (query, slot) keys keeps PQ order
        # within a group, and searchsorted finds where each group starts.
        keys = (slot + 1 + rows_idx * (n_considered + 1)).ravel()
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        rank = np.empty(keys.size, dtype=np.int64)
        rank[order] = np.arange(keys.size) - np.searchsorted(sorted_keys, sorted_keys, side="left")
        rank = rank.reshape(nq, fetched)
        in_quota = valid & (rank < np.ceil(quota)[rows_idx, np.maximum(slot, 0)])
        if in_quota[:, :budget].all():  # the best `budget` by PQ order already respect every quota
            return np.where(valid[:, :budget], cand[:, :budget], -1), slot[:, :budget]
        priority = np.where(in_quota, position, np.where(valid, position + fetched, 4 * fetched))
        keep = np.argsort(priority, axis=1, kind="stable")[:, :budget]
        kept_slot = slot[rows_idx, keep]
        return np.where(kept_slot >= 0, cand[rows_idx, keep], -1), kept_slot

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
        top = np.argpartition(-exact, kk - 1, axis=1)[:, :kk] if kk < width else np.tile(np.arange(width), (nq, 1))
        top = top[rows_idx, np.argsort(-exact[rows_idx, top], axis=1, kind="stable")]
        scores = exact[rows_idx, top].astype(np.float32)
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
        _, cand = self.ivf.search_preassigned(q, max(self.config.candidate_budget, k), clusters, centroid_scores)
        return self._rerank(q, cand, self._slots(cand, clusters), centroid_scores, k)

    def _record_hits(self, rows: np.ndarray) -> None:
        self._pending_hits.append(rows)
        self._pending_queries += len(rows)
        if self._pending_queries >= 64:
            self._update_weights()

    def _update_weights(self) -> None:
        """EMA of each cluster's hit share relative to its size share (1 = as expected), applied once
        per ~64 queries with the decay those queries would have applied one by one."""
        rows = np.concatenate([r.ravel() for r in self._pending_hits]) if self._pending_hits else np.zeros(0, np.int64)
        n_queries, self._pending_hits, self._pending_queries = self._pending_queries, [], 0
        hits = self.doc_cluster[rows[rows >= 0]]
        if hits.size == 0:
            return
        observed = np.bincount(hits, minlength=self.nlist) / hits.size
        expected = self.cluster_sizes / max(1, self.ntotal)
        lo, hi = 1.0 / self.config.weight_clip, self.config.weight_clip
        ratio = np.where(expected > 0, observed / np.maximum(expected, 1e-12), 1.0)
        # Clusters that produced hits move toward their ratio; the rest relax toward neutral 1.
        target = np.where(observed > 0, np.clip(ratio, lo, hi), 1.0)
        d = self.config.ema_decay ** n_queries
        self.weights = np.clip(d * self.weights + (1 - d) * target, lo, hi).astype(np.float32)
        self._log_weights = np.log(self.weights)

    def refresh_tables(self) -> None:
        """Recomputes the lookup tables derived from the index state (after build, load or edits)."""
        m = self.config.refine_m
        self._lut_offsets = (np.arange(m, dtype=np.int32) * 256)[None, None, :]
        # doc→cluster with a sentinel at index -1, so a missing candidate (-1) maps to "no cluster".
        self._doc_cluster_ext = np.append(self.doc_cluster, self.nlist).astype(np.int64)
        self._log_weights = np.log(self.weights)
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
            np.save(folder / "vectors.npy", np.asarray(self.vector_store, dtype=np.float32))
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
        obj.doc_cluster = state["doc_cluster"]
        obj.weights = state["weights"]
        obj.step = int(state["step"][0])
        obj.cluster_sizes = np.bincount(obj.doc_cluster, minlength=obj.nlist).astype(np.int64)
        obj.centroids = obj.ivf.quantizer.reconstruct_n(0, obj.nlist)
        obj.refresh_tables()
        return obj

    def describe(self) -> str:
        return json.dumps({"nlist": self.nlist, "n": self.ntotal, "temperature": round(self.temperature(), 4)})
