"""The retrieval service under concurrent closed-loop clients (``service``). Run as ``python -m kunlunlab.bench service``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np


@dataclass
class ServiceBenchConfig:
    clients: int = 32
    duration: float = 60.0       # measured seconds per mode
    warmup: float = 3.0          # seconds of load before each measured run
    n: int = 20_000              # synthetic-world passages
    kind: str = "flat"
    queries_per_request: int = 1
    topk: int = 3
    batch_window_ms: float = 3.0
    max_batch_queries: int = 64
    threads: int = 0             # torch/FAISS threads in the service; 0: their defaults
    query_precision: str = "auto"  # the service's query encoder (serve-retriever --query-precision)
    embedder: str | None = None
    seed: int = 0


def bench_service(cfg: ServiceBenchConfig) -> dict:
    """The retrieval service (:class:`~kunlunlab.retrieval.service.ServiceThread` on loopback) under
    ``clients`` closed-loop clients, micro-batching on, then off, over the same retriever and queries.

    The load runs in its own process (:mod:`kunlunlab.bench.loadtest`), as real clients do: in this
    one it would compete with the server for the GIL. The query cache is off, so every query is embedded
    and the comparison is of encoding and search work, not of cache hits."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    import httpx

    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.retrieval.service import ServiceThread

    world = World.generate(n_passages=cfg.n, seed=cfg.seed)
    retriever = build_retriever(world.passages, IndexConfig(kind=cfg.kind, embedder=cfg.embedder,
                                                            query_precision=cfg.query_precision), progress=True)
    if retriever.encoder is not None:
        retriever.encoder.cache_size = 0
    if cfg.threads:
        import faiss
        import torch

        torch.set_num_threads(cfg.threads)
        faiss.omp_set_num_threads(cfg.threads)
    questions = make_questions(world, 2000, seed=cfg.seed + 1)
    texts = list(dict.fromkeys([hop.question for q in questions for hop in q.chain] + [q.question for q in questions]))
    texts = [texts[i] for i in np.random.default_rng(cfg.seed).permutation(len(texts))]
    print(f"service bench: {cfg.kind} index over {cfg.n} world passages, {len(texts)} distinct queries, "
          f"{cfg.clients} clients x {cfg.queries_per_request} query/request, topk {cfg.topk}, {cfg.duration:g} s "
          f"per mode after {cfg.warmup:g} s warm-up, query cache off, {os.cpu_count()} CPUs", flush=True)
    keys = ("clients", "requests", "requests_per_s", "p50_ms", "p99_ms", "errors", "lost")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        queries_file = Path(tmp) / "queries.txt"
        queries_file.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n", encoding="utf-8")
        for label, batching in (("batched", True), ("unbatched", False)):
            with ServiceThread(retriever, micro_batching=batching, batch_window_ms=cfg.batch_window_ms,
                               max_batch_queries=cfg.max_batch_queries) as url:
                command = [sys.executable, "-m", "kunlunlab.bench.loadtest", url, "--queries-file",
                           str(queries_file), "--clients", str(cfg.clients), "--duration", str(cfg.duration),
                           "--warmup", str(cfg.warmup), "--queries-per-request", str(cfg.queries_per_request),
                           "--topk", str(cfg.topk)]
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=cfg.duration + cfg.warmup + 600)
                if done.returncode:
                    raise RuntimeError(f"the load test failed: {done.stderr[-2000:]}")
                stats = json.loads(done.stdout.strip().splitlines()[-1])
                stats["mean_batch_queries"] = httpx.get(url + "/health").json()["mean_batch_queries"]
            runs[label] = stats
            print(f"{label:>9}: {stats['requests_per_s']} requests/s, p50 {stats['p50_ms']} ms, p99 "
                  f"{stats['p99_ms']} ms, {stats['requests']} requests, {stats['errors']} errors, {stats['lost']} "
                  f"lost, {stats['mean_batch_queries']} queries per search", flush=True)
    batched, unbatched = runs["batched"], runs["unbatched"]
    speedup = round(batched["requests_per_s"] / max(unbatched["requests_per_s"], 1e-9), 2)
    print(f"micro-batching speedup at {cfg.clients} clients: {speedup}x", flush=True)
    return {**{k: batched[k] for k in keys}, "batching_speedup": speedup,
            "mean_batch_queries": batched["mean_batch_queries"],
            "unbatched": {k: unbatched[k] for k in keys + ("mean_batch_queries",)},
            "n": cfg.n, "kind": cfg.kind, "duration_s": cfg.duration, "queries_per_request": cfg.queries_per_request,
            "topk": cfg.topk, "batch_window_ms": cfg.batch_window_ms, "threads": cfg.threads,
            "query_precision": cfg.query_precision, "cpus": os.cpu_count()}
