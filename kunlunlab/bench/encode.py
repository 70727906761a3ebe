"""Query encoding per precision (``encode``). Run as ``python -m kunlunlab.bench encode``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class EncodeBenchConfig:
    n: int = 10_000              # world passages in the flat index that the encoded queries search
    queries: int = 512           # distinct world sub-questions timed per batch size
    precisions: str = "float32,onnx,bfloat16,int8"
    embedder: str | None = None
    repeats: int = 3             # timed passes per (precision, batch size); the median is reported
    faiss_threads: int = 1       # FAISS threads of the timed searches (0: its default, one per core)
    seed: int = 0


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def bench_encode(cfg: EncodeBenchConfig) -> dict:
    """Query encoding, the dominant cost of a retrieval call: queries/s at batch 1, 8 and 64 per query
    precision (``Encoder(query_precision=...)``); end-to-end retrieval per call of 8 new queries, encode +
    top-10 search over ``n`` passages by the workbench's default index (the clustering retriever, warmed
    up; ``retrieval_ms_per_call_8``, with ``encode_ms_per_call_8`` its encoding part) and by exact Flat
    search (``flat_retrieval_ms_per_call_8``); the cached call (query cache); and recall@10 of each
    precision's exact top-10 against float32 queries' exact top-10. The top-level figures are those of
    ``auto`` (bfloat16 where the hardware multiplies it natively).

    Each precision is measured in a process of its own: measured one after another in one process, the
    thread pools and allocator state the earlier ones left behind added 4–7 ms to the later ones' calls
    of 8 (bfloat16 measured 17.1 ms there, 9.9 ms alone)."""
    import faiss
    import torch

    precisions = [p.strip() for p in cfg.precisions.split(",") if p.strip()]
    if len(precisions) > 1:
        return _merge_precision_runs(cfg, precisions)
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
    from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings, resolve_query_precision

    world = World.generate(n_passages=cfg.n, seed=cfg.seed)
    encoder = Encoder(cfg.embedder)
    index = faiss.IndexFlatIP(encoder.dim)
    index.add(np.ascontiguousarray(corpus_embeddings(encoder, world.passages, progress=True), dtype=np.float32))
    questions = make_questions(world, max(64, cfg.queries), seed=cfg.seed + 1)
    texts = list(dict.fromkeys(hop.question for q in questions for hop in q.chain))[:cfg.queries]
    _, exact = index.search(encoder.embed_queries(texts), 10)
    cluster = ClusterRetriever(encoder.dim, ClusterConfig(seed=cfg.seed)).build(
        corpus_embeddings(encoder, world.passages, progress=False))
    warm = encoder.embed_queries(texts)
    for _ in range(4):  # past the cold start of the annealing and the EMA weights, as in serving
        cluster.search(warm, 10)
    if cfg.faiss_threads:
        # one FAISS thread for 8-query searches: with one per core FAISS's thread pool and torch's contend
        # on a 2-core machine (bfloat16 call of 8: 13.2 ms with 2 FAISS threads, 10.3 ms with 1; encode
        # 9.1 + search 0.6-0.8 ms either way)
        faiss.omp_set_num_threads(cfg.faiss_threads)
    results = {}
    for precision in precisions:
        encoder.set_query_precision(precision)
        encoder.embed_queries(texts[:64])  # warm-up: allocator, oneDNN kernels for these shapes
        row = {}
        for batch in (1, 8, 64):
            chunks = [texts[i:i + batch] for i in range(0, min(len(texts), 8 * 64 if batch > 1 else 64), batch)]
            seconds = _median_seconds(lambda: [encoder.embed_queries(c) for c in chunks], cfg.repeats)
            row[f"queries_per_s_b{batch}"] = round(sum(map(len, chunks)) / seconds, 1)
        calls = [texts[i:i + 8] for i in range(0, min(len(texts), 256), 8)]
        vectors = [encoder.embed_queries(c) for c in calls]
        for key, run in (("encode_ms_per_call_8", lambda: [encoder.embed_queries(c) for c in calls]),
                         ("search_ms_per_call_8", lambda: [cluster.search(v, 10) for v in vectors]),
                         ("retrieval_ms_per_call_8", lambda: [cluster.search(encoder.embed_queries(c), 10) for c in calls]),
                         ("flat_retrieval_ms_per_call_8", lambda: [index.search(encoder.embed_queries(c), 10) for c in calls])):
            row[key] = round(1000 * _median_seconds(run, cfg.repeats) / len(calls), 2)
        _, found = index.search(encoder.embed_queries(texts), 10)
        row["recall_at_10_vs_float32"] = round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in
                                                              zip(found, exact)])), 4)
        results[precision] = row
        print(precision, json.dumps(row), flush=True)
    encoder.encode_queries(texts)  # the LRU path: the same calls again, every query already embedded
    seconds = _median_seconds(lambda: [index.search(encoder.encode_queries(c), 10) for c in calls], cfg.repeats)
    auto = resolve_query_precision("auto")
    chosen = auto if auto in results else "float32" if "float32" in results else precisions[0]
    best = results[chosen]
    base = results.get("float32", best)
    return {**{k: best[k] for k in ("queries_per_s_b1", "queries_per_s_b8", "queries_per_s_b64",
                                    "retrieval_ms_per_call_8", "encode_ms_per_call_8", "flat_retrieval_ms_per_call_8")},
            "recall_at_10_change": round(best["recall_at_10_vs_float32"] - 1.0, 4),
            "precision": chosen,
            "speedup_b8_vs_float32": round(best["queries_per_s_b8"] / base["queries_per_s_b8"], 2),
            "cached_retrieval_ms_per_call_8": round(1000 * seconds / len(calls), 3),
            "by_precision": results, "n": cfg.n, "queries": len(texts), "threads": torch.get_num_threads(),
            "faiss_threads": faiss.omp_get_max_threads()}


def _merge_precision_runs(cfg: "EncodeBenchConfig", precisions: list[str]) -> dict:
    """``bench encode`` once per precision, each in its own process; the figures merged as one run's."""
    import subprocess

    from kunlunlab.retrieval.encoder import resolve_query_precision

    runs = {}
    for precision in precisions:
        command = [sys.executable, "-m", "kunlunlab.bench", "encode", "--precisions", precision]
        for name, value in asdict(cfg).items():
            if name != "precisions" and value is not None:
                command += ["--" + name.replace("_", "-"), str(value)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"bench encode --precisions {precision} failed: {done.stderr[-3000:]}")
        runs[precision] = json.loads(done.stdout.strip().splitlines()[-1])
        print(precision, json.dumps(runs[precision]["by_precision"][precision]), flush=True)
    results = {p: run["by_precision"][p] for p, run in runs.items()}
    auto = resolve_query_precision("auto")
    chosen = auto if auto in results else "float32" if "float32" in results else precisions[0]
    best, base = results[chosen], results.get("float32", results[chosen])
    return {**{k: best[k] for k in ("queries_per_s_b1", "queries_per_s_b8", "queries_per_s_b64",
                                    "retrieval_ms_per_call_8", "encode_ms_per_call_8", "flat_retrieval_ms_per_call_8")},
            "recall_at_10_change": round(best["recall_at_10_vs_float32"] - 1.0, 4), "precision": chosen,
            "speedup_b8_vs_float32": round(best["queries_per_s_b8"] / base["queries_per_s_b8"], 2),
            "cached_retrieval_ms_per_call_8": runs[chosen]["cached_retrieval_ms_per_call_8"],
            "by_precision": results, "n": cfg.n, "queries": runs[chosen]["queries"], "threads": runs[chosen]["threads"],
            "faiss_threads": runs[chosen]["faiss_threads"]}
