"""Flat vs IVF-PQ vs the clustering retriever (``retrieval``), and the vector sets it draws. Run as ``python -m kunlunlab.bench retrieval``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class RetrievalBenchConfig:
    n: int = 100_000
    mode: str = "world"  # world | gaussian
    queries: int = 1000
    warmup_queries: int = 3000  # served before timing, so annealing and EMA weights reach steady state
    threads: int = 1
    repeats: int = 3  # timed passes per index; the median is reported
    k: int = 10
    ivfpq_nprobe: int = 16
    budget: int = 0  # the cluster retriever's candidate budget; 0: auto (auto_candidate_budget of N and nlist)
    pareto: bool = True  # also sweep FAISS's strongest configurations and the clustering retriever (pareto_sweep)
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    embedder: str | None = None
    # world mode: the embedder's precision for the corpus (bfloat16: 3.1x faster, for 300k+ passages on a CPU)
    passage_precision: str = "float32"
    seed: int = 0
    figure: str = ""  # with pareto: write the Pareto figure here (.html; .png/.svg need kaleido and a Chromium)


def world_vectors(n: int, n_queries: int, embedder: str | None, seed: int,
                  passage_precision: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings

    world = World.generate(n_passages=n, seed=seed)
    encoder = Encoder(embedder, passage_precision=passage_precision)
    vectors = corpus_embeddings(encoder, world.passages, progress=True)
    questions = make_questions(world, max(50, n_queries // 2), seed=seed + 1)
    texts = list(dict.fromkeys([hop.question for q in questions for hop in q.chain] + [q.question for q in questions]))
    rng = np.random.default_rng(seed)
    texts = [texts[i] for i in rng.permutation(len(texts))]
    return vectors, encoder.encode_queries(texts)


def gaussian_mixture(dim: int = 384, n_modes: int = 2048, seed: int = 0):
    """A sampler ``draw(m) -> (m, dim)`` of a mixture of Gaussians on the unit sphere with per-mode
    anisotropic spread (like real embeddings); successive draws continue one random stream."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_modes, dim)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    spread = rng.uniform(0.02, 0.06, size=n_modes).astype(np.float32)

    def draw(m: int) -> np.ndarray:
        out = np.empty((m, dim), dtype=np.float32)
        for start in range(0, m, 200_000):
            stop = min(m, start + 200_000)
            modes = rng.integers(0, n_modes, stop - start)
            x = centers[modes] + spread[modes, None] * rng.normal(size=(stop - start, dim)).astype(np.float32)
            out[start:stop] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out

    return draw


def gaussian_vectors(n: int, n_queries: int, dim: int = 384, n_modes: int = 2048,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` corpus vectors and ``n_queries`` queries from one :func:`gaussian_mixture`."""
    draw = gaussian_mixture(dim, n_modes, seed)
    return draw(n), draw(n_queries)


def bench_retrieval(cfg: RetrievalBenchConfig) -> dict:
    """Exact Flat, IVF-PQ at ``ivfpq_nprobe`` and the clustering retriever (both re-ranking sources) at
    their default settings (candidate budget ``budget``, 0: auto), measured by
    :func:`~kunlunlab.retrieval.evaluation.compare_indexes` (the comparison notebook 01 draws), after
    ``warmup_queries`` served queries distinct from the timed ones. With ``pareto``, also
    :func:`~kunlunlab.retrieval.pareto.pareto_sweep` over the same builds and queries: ``pareto`` (one
    row per family and setting) and ``best_at_095`` (per family, the fastest setting with recall@10 ≥ 0.95,
    or None and the best recall reached)."""
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.evaluation import compare_indexes
    from kunlunlab.retrieval.pareto import best_at, pareto_sweep
    from kunlunlab.retrieval.indexes import HNSWConfig

    total_queries = cfg.queries + cfg.warmup_queries
    if cfg.mode == "world":
        vectors, queries = world_vectors(cfg.n, total_queries, cfg.embedder, cfg.seed, cfg.passage_precision)
    elif cfg.mode == "gaussian":
        vectors, queries = gaussian_vectors(cfg.n, total_queries, seed=cfg.seed)
    else:
        raise ValueError(f"unknown mode {cfg.mode!r}; choose world or gaussian")
    if len(queries) < cfg.queries + 10:
        raise ValueError(f"only {len(queries)} distinct queries; lower --queries")
    warmup, queries = queries[cfg.queries:total_queries], queries[:cfg.queries]
    n, dim = vectors.shape
    print(f"[bench] {n} vectors of dim {dim}, {len(queries)} timed queries, {len(warmup)} warm-up", file=sys.stderr)

    result = compare_indexes(vectors, queries, ("ivfpq", "cluster_pq"), k=cfg.k, threads=cfg.threads,
                             repeats=cfg.repeats, nprobe_grid=(cfg.ivfpq_nprobe,),
                             cluster_config=ClusterConfig(seed=cfg.seed, candidate_budget=cfg.budget), warmup=warmup)
    cluster = result.indexes["cluster"]
    print(f"[bench] cluster retriever built in {result.build_seconds['cluster']:.1f}s: {cluster.build_seconds}",
          file=sys.stderr)
    flat, ivfpq = result.row("flat"), result.row("ivfpq")
    clustered, clustered_pq = result.row("cluster"), result.row("cluster_pq")
    out = {
        "n_vectors": int(n), "dim": int(dim), "mode": cfg.mode, "threads": cfg.threads, "queries": len(queries), "repeats": cfg.repeats,
        "flat_ms": round(flat.ms_per_query, 4), "ivfpq_ms": round(ivfpq.ms_per_query, 4),
        "cluster_ms": round(clustered.ms_per_query, 4),
        "ivfpq_recall_at_10": round(ivfpq.recall_at_k, 4),
        "cluster_recall_at_10": round(clustered.recall_at_k, 4),
        "speedup_vs_flat": round(flat.ms_per_query / clustered.ms_per_query, 2),
        "bytes_per_vector": round(clustered.bytes_per_vector, 1),
        "disk_bytes_per_vector": round(clustered.disk_bytes_per_vector, 1),
        "cluster_pq_ms": round(clustered_pq.ms_per_query, 4),
        "cluster_pq_recall_at_10": round(clustered_pq.recall_at_k, 4),
        "cluster_pq_speedup_vs_flat": round(flat.ms_per_query / clustered_pq.ms_per_query, 2),
        "cluster_pq_bytes_per_vector": round(clustered_pq.bytes_per_vector, 1),
        "flat_bytes_per_vector": round(flat.bytes_per_vector, 1),
        "ivfpq_bytes_per_vector": round(ivfpq.bytes_per_vector, 1),
        "ivfpq_nprobe": int(ivfpq.value), "nlist": cluster.nlist,
        "cluster_temperature": round(cluster.temperature(), 4),
        "cluster_build_s": round(result.build_seconds["cluster"], 1),
        "cluster_budget": cluster.budget(cfg.k),
    }
    if cfg.pareto:
        start = time.perf_counter()
        rows = pareto_sweep(vectors, queries, k=cfg.k, threads=cfg.threads, repeats=cfg.repeats, comparison=result,
                            hnsw=HNSWConfig(m=cfg.hnsw_m, ef_construction=cfg.hnsw_ef_construction),
                            log=lambda line: print(f"[pareto] {line}", file=sys.stderr, flush=True))
        out["pareto"] = rows
        if cfg.figure:
            from kunlunlab.viz.figures import export_figure, pareto_figure

            title = f"{cfg.mode} vectors, N = {cfg.n:,}"
            export_figure(pareto_figure(rows, k=cfg.k, subtitle=title), cfg.figure)
            print(f"[pareto] figure written to {cfg.figure}", file=sys.stderr, flush=True)
        out["best_at_095"] = best_at(rows, 0.95, cfg.k)
        out["pareto_s"] = round(time.perf_counter() - start, 1)
    if cfg.mode == "world":  # appended: the keys before it keep their order for existing readers
        out["passage_precision"] = cfg.passage_precision
    return out
