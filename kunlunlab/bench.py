"""Benchmarks that print their figures, JSON as the last line.

    python -m kunlunlab.bench retrieval [--n 100000] [--mode world|gaussian] [--queries 1000]
    python -m kunlunlab.bench rollout [--batch 8] [--searches 3] [--n 10000]
    python -m kunlunlab.bench answer-block [--batch 8] [--tokens 32] [--repeats 3]
    python -m kunlunlab.bench service [--clients 32] [--duration 60] [--n 20000]
    python -m kunlunlab.bench encode [--n 10000] [--precisions float32,onnx,bfloat16,int8]
    python -m kunlunlab.bench build [--n 10000] [--index-n 1000000] [--engine stream|ray]
    python -m kunlunlab.bench exact-search [--device cuda] [--n 21000000|max] [--dtype float16] [--queries 64]

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

``answer-block``: the cost of STIE's generation block (eq. 13) in the local session. One batch, half of the
rows opened inside an answer box (``<short_answer>\\boxed{``), half before a search; passes interleaved over
three modes: ``none`` (no row blocked: the path of every row without blocked answers), ``answering`` (the
rows inside the box carry the block of an answer repeated K times, from a real STIE controller) and ``all``
(every row carries it). Generated tokens/s per mode (median of ``--repeats`` passes), the ratio to ``none``,
the host time of the block's checks per step and its share of the pass (the load-independent figure), and
whether the rows without a block generated the same tokens as in ``none``. One torch thread by default:
with two on the shared 2-core machine single passes varied 0.8-54 s (OpenMP threads spinning against other
jobs), with one 0.77-1.32 s.

``exact-search``: exact top-k of one batch of queries over N random unit vectors by the flat index on a
device (FAISS on the CPU; on a GPU faiss-gpu or torch's matrix product in float16/bfloat16), the vectors
drawn on the device itself; ``--n max`` sizes N to 80 % of the free memory.

``service``: the retrieval service under ``--clients`` concurrent closed-loop clients, micro-batching
on and then off (one request per search), same index and queries; requests/s, p50/p99 latency,
errors, lost requests and ``batching_speedup`` (requests/s with batching / without).
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
    :func:`~kunlunlab.retrieval.evaluation.pareto_sweep` over the same builds and queries: ``pareto`` (one
    row per family and setting) and ``best_at_095`` (per family, the fastest setting with recall@10 ≥ 0.95,
    or None and the best recall reached)."""
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.evaluation import best_at, compare_indexes, pareto_sweep
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


@dataclass
class AnswerBlockBenchConfig:
    batch: int = 8           # half the rows open an answer box, half a search
    tokens: int = 32         # generated tokens per row and pass (stop strings off)
    repeats: int = 5         # passes per mode, interleaved; the median is reported
    threads: int = 1         # torch threads: on a shared 2-core machine 2 threads spin against other jobs
    model: str | None = None
    seed: int = 0


def bench_answer_block(cfg: AnswerBlockBenchConfig) -> dict:
    """See the module docstring; torch's thread count is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _bench_answer_block(cfg)
    finally:
        torch.set_num_threads(threads)


def _bench_answer_block(cfg: AnswerBlockBenchConfig) -> dict:
    import torch

    from kunlunlab.agent.backends import TransformersBackend, chat_prompt_ids
    from kunlunlab.agent.protocol import build_messages
    from kunlunlab.agent.stie import RoundInput, STIEController
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World

    torch.manual_seed(cfg.seed)
    backend = TransformersBackend(cfg.model)
    world = World.generate(n_passages=200, seed=cfg.seed)
    questions = [q.question for q in make_questions(world, cfg.batch, seed=cfg.seed + 1)]
    openers = ["<think>I know this.</think>\n<short_answer>\\boxed{", "<think>I need to look this up.</think>\n<search>"]
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), openers[i % 2]) for i, q in enumerate(questions)]
    controller = STIEController()
    for k in range(controller.config.repeat_k):  # one answer K times: eq. (13) blocks it
        controller.step(0, RoundInput(world.passages[0].title, 0.5, [str(k)]))
    block = controller.answer_block(0)
    answering = [i for i in range(cfg.batch) if i % 2 == 0]
    modes = {"none": [], "answering": answering, "all": list(range(cfg.batch))}
    backend.answer_closers()  # the one-time vocabulary scan is not part of a pass

    def one_pass(rows: list[int]) -> tuple[float, float, dict]:
        session = backend.open(prompts)
        session.block_answers({i: block for i in rows})
        start = time.perf_counter()
        out = session.generate(range(cfg.batch), cfg.tokens, stop=())
        return time.perf_counter() - start, session.block_check_s, out

    one_pass([])  # warm-up
    seconds, checks = {m: [] for m in modes}, {m: [] for m in modes}
    outputs = {}
    for _ in range(cfg.repeats):
        for mode, rows in modes.items():
            elapsed, check, out = one_pass(rows)
            seconds[mode].append(elapsed)
            checks[mode].append(check)
            outputs[mode] = out
    tokens = {m: sum(len(seg.token_ids) for seg in outputs[m].values()) for m in modes}
    per_s = {m: tokens[m] / float(np.median(seconds[m])) for m in modes}
    unblocked = [i for i in range(cfg.batch) if i not in answering]
    return {"batch": cfg.batch, "tokens_per_row": cfg.tokens, "repeats": cfg.repeats, "blocked": list(block.answers),
            **{f"tokens_per_s_{m}": round(per_s[m], 2) for m in modes},
            **{f"ratio_{m}": round(per_s[m] / per_s["none"], 3) for m in modes if m != "none"},
            "seconds": {m: [round(x, 3) for x in seconds[m]] for m in modes},
            # the host work of the block itself, per generation step, and its share of the pass: robust to load
            **{f"block_check_ms_per_step_{m}": round(1000 * float(np.median(checks[m])) / cfg.tokens, 3) for m in modes},
            **{f"block_check_share_{m}": round(sum(checks[m]) / sum(seconds[m]), 4) for m in modes},
            "interventions_answering": sum(seg.interventions for seg in outputs["answering"].values()),
            "unblocked_rows_unchanged": all(outputs["answering"][i].token_ids == outputs["none"][i].token_ids
                                            for i in unblocked),
            "threads": torch.get_num_threads()}


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

    The load runs in its own process (:mod:`kunlunlab.retrieval.loadtest`), as real clients do: in this
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
                command = [sys.executable, "-m", "kunlunlab.retrieval.loadtest", url, "--queries-file",
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


@dataclass
class BuildBenchConfig:
    n: int = 10_000              # world passages the streamed build embeds (0: skip); real MiniLM embedding
    index_n: int = 1_000_000     # Gaussian vectors the index steps alone are measured on (0: skip)
    kind: str = "cluster"
    engine: str = "stream"       # stream | ray: the embedding engine of the streamed build
    passage_precision: str = "float32"  # the streamed build's corpus embedding (bfloat16: 3.1x faster here)
    shard_rows: int = 50_000
    part: str = "all"            # all (each part in its own process) | stream | shards | index_sharded | index_inprocess
    work_dir: str = ""           # default: a temporary folder, removed after
    seed: int = 0


def _gaussian_shards(n: int, shard_rows: int, folder, seed: int) -> list:
    """``n`` vectors of :func:`gaussian_mixture` written as shards, drawn one shard at a time (this process
    never holds more than one)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    draw, shards = gaussian_mixture(seed=seed), []
    for i, start in enumerate(range(0, n, shard_rows)):
        shards.append(folder / f"emb-{i:05d}.npy")
        np.save(shards[-1], draw(min(shard_rows, n - start)))
    return shards


def bench_build(cfg: BuildBenchConfig) -> dict:
    """Peak memory and time of an index build that streams (:mod:`kunlunlab.retrieval.sharded`), each part
    in its own process so each peak is its own: ``stream``, the whole streamed build of ``n`` world
    passages (corpus pass, embedding in shards, train, add); ``index_sharded``, the index steps alone
    (concatenate, train, add shard by shard, save) over ``index_n`` Gaussian vectors written as shards;
    ``index_inprocess``, the in-process build over the same vectors held in RAM, for contrast. Gaussian
    vectors stand in for embeddings at ``index_n`` because embedding 1M passages with MiniLM takes about
    2 hours on 2 CPU cores in float32 (145 passages/s; about an hour with ``passage_precision="bfloat16"``);
    the index steps' memory does not depend on what the vectors encode."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from kunlunlab.retrieval.retriever import IndexConfig, make_index
    from kunlunlab.retrieval.sharded import ShardedBuildConfig, build_sharded, index_from_shards, peak_rss_mb

    if cfg.part == "all":
        work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="kl-build-"))
        work.mkdir(parents=True, exist_ok=True)  # a --work-dir that does not exist yet
        out = {"n": cfg.n, "index_n": cfg.index_n, "kind": cfg.kind, "engine": cfg.engine,
               "passage_precision": cfg.passage_precision}
        parts = (["stream"] if cfg.n else []) + (["shards", "index_sharded", "index_inprocess"] if cfg.index_n else [])
        try:
            for part in parts:
                command = [sys.executable, "-m", "kunlunlab.bench", "build", "--part", part, "--work-dir", str(work)]
                for name, value in asdict(cfg).items():
                    if name not in ("part", "work_dir"):
                        command += ["--" + name.replace("_", "-"), str(value)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"bench build --part {part} failed: {done.stderr[-3000:]}")
                out[part] = json.loads(done.stdout.strip().splitlines()[-1])
                print(part, json.dumps(out[part]), file=sys.stderr, flush=True)
        finally:
            if not cfg.work_dir:
                shutil.rmtree(work, ignore_errors=True)
        return out

    work = Path(cfg.work_dir)
    config = IndexConfig(kind=cfg.kind, passage_precision=cfg.passage_precision)
    if cfg.part == "stream":
        from kunlunlab.data.world import World
        from kunlunlab.retrieval.store import corpus_line

        corpus = work / "world.jsonl"
        if not corpus.is_file():  # the corpus file a user would bring (written in a child: the world is in RAM)
            script = ("import sys; from kunlunlab.data.world import World; from kunlunlab.retrieval.store import "
                      "corpus_line; f = open(sys.argv[1], 'w', encoding='utf-8'); "
                      "[f.write(corpus_line(p)) for p in World.generate(n_passages=int(sys.argv[2]), "
                      "seed=int(sys.argv[3])).passages]; f.close()")
            subprocess.run([sys.executable, "-c", script, str(corpus), str(cfg.n), str(cfg.seed)], check=True)
        start = time.perf_counter()
        manifest = build_sharded(corpus, config, work / "stream", ShardedBuildConfig(engine=cfg.engine,
                                 shard_rows=cfg.shard_rows), log=lambda line: print(line, file=sys.stderr, flush=True))
        seconds = time.perf_counter() - start
        build = manifest["build"]
        return {"passages": manifest["n"], "seconds": round(seconds, 1), "seconds_by_step": build["seconds"],
                "passages_per_s": round(manifest["n"] / build["seconds"]["embed"], 1),
                "peak_rss_mb": round(peak_rss_mb(), 1)}
    if cfg.part == "shards":  # in a process of its own: drawing them costs memory the builds should not show
        shards = _gaussian_shards(cfg.index_n, cfg.shard_rows, work / "gauss", cfg.seed)
        return {"shards": len(shards), "vectors": cfg.index_n}
    shards = sorted((work / "gauss").glob("emb-*.npy"))
    if not shards:
        raise FileNotFoundError(f"no shards in {work / 'gauss'}: run --part shards first (or --part all)")
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    if cfg.part == "index_sharded":
        index, steps = index_from_shards(shards, config, 384, work / "index_sharded")
        steps = {k: round(v, 1) for k, v in steps.items()}
    elif cfg.part == "index_inprocess":
        vectors = np.concatenate([np.load(s) for s in shards])  # what build_retriever is handed: every vector
        index = make_index(config, vectors.shape[1])
        if hasattr(index, "build"):  # the clustering retriever
            index.build(vectors)
        else:
            index.add(vectors)
        (work / "index_inprocess").mkdir(exist_ok=True)
        index.save(work / "index_inprocess")
        steps = {}
    else:
        raise ValueError(f"unknown part {cfg.part!r}")
    return {"vectors": int(index.ntotal), "seconds": round(time.perf_counter() - start, 1), "seconds_by_step": steps,
            "peak_rss_mb": round(peak_rss_mb(), 1), "peak_rss_mb_before": round(rss_before, 1),
            "ram_bytes_per_vector": round(index.bytes_per_vector(), 1)}


@dataclass
class ExactSearchBenchConfig:
    device: str = "cpu"          # cpu | cuda | cuda:N | auto
    dim: int = 768
    n: str = "100000"            # corpus vectors, or "max": the most that fit in memory_fraction of free memory
    queries: int = 64            # one batch of queries, searched at once
    dtype: str = "float16"       # the corpus matrix on a GPU / in torch: float32 | float16 | bfloat16
    backend: str = "auto"        # auto | faiss | torch (IndexConfig.flat_backend)
    k: int = 10
    repeats: int = 5             # timed searches of the batch; the median is reported
    memory_fraction: float = 0.8
    seed: int = 0


GEN_ROWS = 1 << 18  # random vectors drawn per step (float32): 0.8 GB of scratch at 768 dimensions


def free_memory_bytes(device: str) -> int:
    """Free memory where the vectors will live: the GPU's (``torch.cuda.mem_get_info``) or the host's
    (``MemAvailable`` of /proc/meminfo)."""
    import torch

    if device != "cpu":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def exact_search_footprint(backend: str, dtype: str, dim: int, queries: int, chunk_rows: int) -> tuple[int, int]:
    """(bytes per corpus vector, fixed bytes besides the vectors) of an exact index being filled and searched:
    the stored vectors, the float32 rows drawn per step and, for torch, one block's score matrix."""
    import torch

    stored = 4 if backend == "faiss" or (backend == "faiss-gpu" and dtype == "float32") else \
        2 if backend == "faiss-gpu" else getattr(torch, dtype).itemsize
    fixed = 3 * GEN_ROWS * dim * 4 + (1 << 29)  # drawn rows, normalised, cast; 0.5 GB of allocator slack
    if backend == "torch":
        fixed += 2 * queries * chunk_rows * stored  # scores of one block and torch.topk's working copy
    if backend == "faiss-gpu":
        fixed += 2 << 30  # StandardGpuResources' scratch memory
    return dim * stored, fixed


def bench_exact_search(cfg: ExactSearchBenchConfig) -> dict:
    """Exact top-k of one batch of ``queries`` random unit queries over ``n`` random unit vectors: the flat
    index on ``device`` as the retriever runs it (:func:`kunlunlab.retrieval.indexes.place_flat`: FAISS on the
    CPU; on a GPU faiss-gpu or torch's matrix product in ``dtype``). The vectors are drawn where they are
    stored (on the GPU for torch), so 21M x 768 needs no host copy; ``n="max"`` is the most that fit in
    ``memory_fraction`` of the free memory, and a given ``n`` that does not fit is refused before anything is
    allocated."""
    import torch

    from kunlunlab.retrieval.indexes import (FlatIndex, GpuFaissFlatIndex, TorchFlatIndex, flat_backend,
                                             resolve_device)

    device = resolve_device(cfg.device)
    backend = flat_backend(cfg.backend, device, cfg.dtype)
    if cfg.queries < 1 or cfg.k < 1 or cfg.repeats < 1 or cfg.dim < 1 or not 0 < cfg.memory_fraction <= 1:
        raise ValueError("queries, k, repeats and dim must be at least 1 and memory_fraction in (0, 1]")
    chunk_rows = 1 << 22
    per_vector, fixed = exact_search_footprint(backend, cfg.dtype, cfg.dim, cfg.queries, chunk_rows)
    free = free_memory_bytes(device)
    n_max = max(0, int((cfg.memory_fraction * free - fixed) // per_vector))
    if cfg.n == "max":
        n = n_max
    else:
        try:
            n = int(float(cfg.n))
        except ValueError:
            raise ValueError(f"n must be a number of vectors or 'max', not {cfg.n!r}") from None
        if n > n_max:
            raise ValueError(f"{n} vectors of {cfg.dim} dimensions need {(n * per_vector + fixed) / 2**30:.1f} GiB "
                             f"on {device} ({backend}); {cfg.memory_fraction:.0%} of the {free / 2**30:.1f} GiB free "
                             f"holds {n_max}: use --n max or a smaller --n")
    if n < cfg.k:
        raise ValueError(f"{n} vectors cannot give a top-{cfg.k} (free memory: {free / 2**30:.1f} GiB)")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    def draw(rows: int) -> "torch.Tensor":
        x = torch.randn(rows, cfg.dim, generator=generator, device=device)
        return torch.nn.functional.normalize(x, dim=1)

    start = time.perf_counter()
    if backend == "torch":
        index = TorchFlatIndex(cfg.dim, device, cfg.dtype, query_batch=cfg.queries, chunk_rows=chunk_rows,
                               keep_host=False)
        dtype = getattr(torch, cfg.dtype)
        for first in range(0, n, chunk_rows):
            block = torch.empty((min(chunk_rows, n - first), cfg.dim), dtype=dtype, device=device)
            for i in range(0, len(block), GEN_ROWS):
                block[i:i + GEN_ROWS] = draw(min(GEN_ROWS, len(block) - i)).to(dtype)
            index.add_tensor(block)
            del block
    else:
        index = FlatIndex(cfg.dim) if backend == "faiss" else \
            GpuFaissFlatIndex(cfg.dim, device, cfg.dtype, keep_host=False)
        for first in range(0, n, GEN_ROWS):
            index.add(draw(min(GEN_ROWS, n - first)).cpu().numpy())
    if device != "cpu":
        torch.cuda.synchronize(device)
    fill_seconds = time.perf_counter() - start
    queries = draw(cfg.queries).cpu().numpy()
    index.search(queries, cfg.k)  # warm-up: kernels, allocator
    times = []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        scores, rows = index.search(queries, cfg.k)  # numpy out: the device has finished
        times.append(time.perf_counter() - t0)
    if not ((rows >= 0) & (rows < n)).all():
        raise RuntimeError("the search returned rows outside the corpus")
    median = float(np.median(times))
    stored = "float32" if backend == "faiss" or (backend == "faiss-gpu" and cfg.dtype == "float32") else \
        ("float16" if backend == "faiss-gpu" else cfg.dtype)
    out = {"device": device, "device_name": torch.cuda.get_device_name(device) if device != "cpu" else "cpu",
           "backend": backend, "dtype": stored, "dim": cfg.dim, "n": n, "n_max": n_max, "queries": cfg.queries,
           "k": cfg.k, "fill_seconds": round(fill_seconds, 2), "search_ms_per_batch": round(1000 * median, 3),
           "search_ms_per_batch_min": round(1000 * min(times), 3),
           "ms_per_query": round(1000 * median / cfg.queries, 4), "queries_per_s": round(cfg.queries / median, 1),
           "index_gib": round(n * per_vector / 2**30, 2), "free_gib_before": round(free / 2**30, 2),
           "top1_score_mean": round(float(scores[:, 0].mean()), 4), "repeats": cfg.repeats}
    if device != "cpu":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kunlunlab.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="which", required=True)
    r = sub.add_parser("retrieval", help="Flat vs IVF-PQ vs clustering retriever")
    defaults = RetrievalBenchConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # --pareto / --no-pareto
            r.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            r.add_argument(flag, type=type(value) if value is not None else str, default=value)
    o = sub.add_parser("rollout", help="multi-turn rollout vs plain batched generation; STIE cost")
    rollout_defaults = RolloutBenchConfig()
    for name, value in asdict(rollout_defaults).items():
        o.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    a = sub.add_parser("answer-block", help="cost of STIE's generation block (eq. 13) in the local session")
    block_defaults = AnswerBlockBenchConfig()
    for name, value in asdict(block_defaults).items():
        a.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    e = sub.add_parser("encode", help="query encoding: queries/s at batch 1/8/64 per precision, recall@10 change")
    encode_defaults = EncodeBenchConfig()
    for name, value in asdict(encode_defaults).items():
        e.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    v = sub.add_parser("service", help="retrieval service under concurrent clients, micro-batching on vs off")
    service_defaults = ServiceBenchConfig()
    for name, value in asdict(service_defaults).items():
        v.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    d = sub.add_parser("build", help="peak memory and time of a streamed (sharded) index build")
    build_defaults = BuildBenchConfig()
    for name, value in asdict(build_defaults).items():
        d.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    x = sub.add_parser("exact-search", help="exact top-k of a batch of queries over N random vectors on a device "
                                            "(--n max: the most that fit in 80%% of free memory)")
    exact_defaults = ExactSearchBenchConfig()
    for name, value in asdict(exact_defaults).items():
        x.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.which == "exact-search":
        try:
            result = bench_exact_search(ExactSearchBenchConfig(**{k: getattr(args, k) for k in asdict(exact_defaults)}))
        except ValueError as err:  # a device without a GPU, an N that does not fit, a bad dtype: one line
            print(f"python -m kunlunlab.bench exact-search: {err}", file=sys.stderr)
            return 2
        print(json.dumps(result))
        return 0
    if args.which == "answer-block":
        cfg = AnswerBlockBenchConfig(**{k: getattr(args, k) for k in asdict(block_defaults)})
        print(json.dumps(bench_answer_block(cfg)))
        return 0
    if args.which == "build":
        print(json.dumps(bench_build(BuildBenchConfig(**{k: getattr(args, k) for k in asdict(build_defaults)}))))
        return 0
    if args.which == "service":
        print(json.dumps(bench_service(ServiceBenchConfig(**{k: getattr(args, k) for k in asdict(service_defaults)}))))
        return 0
    if args.which == "encode":
        print(json.dumps(bench_encode(EncodeBenchConfig(**{k: getattr(args, k) for k in asdict(encode_defaults)}))))
        return 0
    if args.which == "retrieval":
        cfg = RetrievalBenchConfig(**{k: getattr(args, k) for k in asdict(defaults)})
        print(json.dumps(bench_retrieval(cfg)))
    else:
        cfg = RolloutBenchConfig(**{k: getattr(args, k) for k in asdict(rollout_defaults)})
        print(json.dumps(bench_rollout(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
