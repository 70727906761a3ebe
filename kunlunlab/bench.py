"""Benchmarks that print their figures, JSON as the last line.

    python -m kunlunlab.bench retrieval [--n 100000] [--mode world|gaussian] [--queries 1000]
    python -m kunlunlab.bench rollout [--batch 8] [--searches 3] [--n 10000]

``retrieval``: exact Flat vs IVF-PQ vs the clustering retriever, one query at a time, the same
FAISS thread count for every index, recall@10 against exact top-10, measured by
:func:`kunlunlab.retrieval.evaluation.compare_indexes` (the comparison notebook 01 draws). ``world``
mode embeds synthetic-world passages with the embedder (cached after the first run) and queries with the
sub-questions of the world's gold chains (the queries an agent actually issues); ``gaussian``
mode draws a mixture of Gaussians, for 1M+ vectors without the embedding cost.

``rollout``: token throughput of the multi-turn rollout (generation, one batched retrieval call
per turn, result blocks prefilled into the KV cache) against plain batched generation of the same
number of tokens per row on the same model and prompts; plus retrieval time per call and STIE time
per round. The embedded model does not search on its own before training, so the benchmark opens
each turn with a scripted ``<search>`` (``RolloutConfig.result_suffix``): the tokens the model
writes, the retrieval calls and the appended results are all real.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

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
    embedder: str | None = None
    seed: int = 0


def world_vectors(n: int, n_queries: int, embedder: str | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings

    world = World.generate(n_passages=n, seed=seed)
    encoder = Encoder(embedder)
    vectors = corpus_embeddings(encoder, world.passages, progress=True)
    questions = make_questions(world, max(50, n_queries // 2), seed=seed + 1)
    texts = list(dict.fromkeys([hop.question for q in questions for hop in q.chain] + [q.question for q in questions]))
    rng = np.random.default_rng(seed)
    texts = [texts[i] for i in rng.permutation(len(texts))]
    return vectors, encoder.encode_queries(texts)


def gaussian_vectors(n: int, n_queries: int, dim: int = 384, n_modes: int = 2048,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mixture of Gaussians on the unit sphere with per-mode anisotropic spread (like real embeddings)."""
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

    return draw(n), draw(n_queries)


def bench_retrieval(cfg: RetrievalBenchConfig) -> dict:
    """Exact Flat, IVF-PQ at ``ivfpq_nprobe`` and the clustering retriever (both re-ranking sources) at
    their default settings, measured by :func:`~kunlunlab.retrieval.evaluation.compare_indexes` (the
    comparison notebook 01 draws), after ``warmup_queries`` served queries distinct from the timed ones."""
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.evaluation import compare_indexes

    total_queries = cfg.queries + cfg.warmup_queries
    if cfg.mode == "world":
        vectors, queries = world_vectors(cfg.n, total_queries, cfg.embedder, cfg.seed)
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
                             cluster_config=ClusterConfig(seed=cfg.seed), warmup=warmup)
    cluster = result.indexes["cluster"]
    print(f"[bench] cluster retriever built in {result.build_seconds['cluster']:.1f}s: {cluster.build_seconds}",
          file=sys.stderr)
    flat, ivfpq = result.row("flat"), result.row("ivfpq")
    clustered, clustered_pq = result.row("cluster"), result.row("cluster_pq")
    return {
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
    }


@dataclass
class RolloutBenchConfig:
    batch: int = 8
    searches: int = 3        # scripted search turns per question, then the model answers
    turn_tokens: int = 48
    n: int = 10_000          # synthetic-world passages behind the cluster retriever
    model: str | None = None
    stie_rounds: int = 20_000
    seed: int = 0


def bench_rollout(cfg: RolloutBenchConfig) -> dict:
    import torch

    from kunlunlab.agent.backends import TransformersBackend, chat_prompt_ids
    from kunlunlab.agent.protocol import build_messages
    from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
    from kunlunlab.agent.stie import RoundInput, replay, STIEConfig
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever

    torch.manual_seed(cfg.seed)
    world = World.generate(n_passages=cfg.n, seed=cfg.seed)
    retriever = build_retriever(world.passages, IndexConfig(kind="cluster"), progress=True)
    backend = TransformersBackend(cfg.model)
    questions = [q.question for q in make_questions(world, cfg.batch, seed=cfg.seed + 1)]
    opener = "<think>I need to look this up.</think>\n<search>"
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), opener) for q in questions]
    engine = RolloutEngine(backend, retriever.search,
                           RolloutConfig(max_searches=cfg.searches, max_turn_tokens=cfg.turn_tokens,
                                         max_total_tokens=4096, result_suffix=opener))
    engine.run(prompts[:2], questions[:2], prefixes=[opener] * 2)  # warm-up (allocator, kernels)
    engine.stats = type(engine.stats)()
    start = time.perf_counter()
    trajs = engine.run(prompts, questions, prefixes=[opener] * len(prompts))
    rollout_s = time.perf_counter() - start
    model_tokens = {i: t.model_tokens for i, t in enumerate(trajs)}

    start = time.perf_counter()  # plain: the same rows, the same token counts, one generation call
    session = backend.open(prompts)
    plain = session.generate(range(len(prompts)), model_tokens, stop=())
    plain_s = time.perf_counter() - start
    plain_tokens = sum(len(s.token_ids) for s in plain.values())

    rng = np.random.default_rng(cfg.seed)
    names = [p.title for p in world.passages[:200]]
    rounds = [RoundInput(names[int(rng.integers(0, 40))], float(rng.uniform(0.1, 0.99)),
                         [str(x) for x in rng.integers(0, 50, 3)]) for _ in range(cfg.stie_rounds)]
    start = time.perf_counter()
    used = 0
    stie = STIEConfig(max_rounds=8, confidence_ceiling=1.1, min_new_info=-1.0, overlap_stop=-1.0)
    for i in range(0, len(rounds), 8):
        used += replay(rounds[i:i + 8], stie)[1]
    stie_ms = (time.perf_counter() - start) * 1000 / used
    tokens = sum(model_tokens.values())
    return {"batch": cfg.batch, "model_tokens": tokens, "appended_tokens": engine.stats.appended_tokens,
            "searches_per_question": round(sum(t.n_searches for t in trajs) / len(trajs), 2),
            "tokens_per_s_plain": round(plain_tokens / plain_s, 1),
            "tokens_per_s_rollout": round(tokens / rollout_s, 1),
            "ratio": round((tokens / rollout_s) / (plain_tokens / plain_s), 3),
            "retrieval_ms_per_call": round(1000 * engine.stats.retrieve_s / max(1, engine.stats.retrieval_calls), 2),
            "retrieval_calls": engine.stats.retrieval_calls,
            "stie_ms_per_round": round(stie_ms, 4), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kunlunlab.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="which", required=True)
    r = sub.add_parser("retrieval", help="Flat vs IVF-PQ vs clustering retriever")
    defaults = RetrievalBenchConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        r.add_argument(flag, type=type(value) if value is not None else str, default=value)
    o = sub.add_parser("rollout", help="multi-turn rollout vs plain batched generation; STIE cost")
    rollout_defaults = RolloutBenchConfig()
    for name, value in asdict(rollout_defaults).items():
        o.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    args = parser.parse_args(argv)
    if args.which == "retrieval":
        cfg = RetrievalBenchConfig(**{k: getattr(args, k) for k in asdict(defaults)})
        print(json.dumps(bench_retrieval(cfg)))
    else:
        cfg = RolloutBenchConfig(**{k: getattr(args, k) for k in asdict(rollout_defaults)})
        print(json.dumps(bench_rollout(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
