"""Multi-turn rollout throughput against plain batched generation (``rollout``). Run as ``python -m kunlunlab.bench rollout``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


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

    from kunlunlab.agent.backends import chat_prompt_ids
    from kunlunlab.agent.protocol import build_messages
    from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
    from kunlunlab.agent.stie import RoundInput, replay, STIEConfig
    from kunlunlab.agent.transformers_backend import TransformersBackend
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
    tokens = sum(model_tokens.values())

    # plain: the same rows, one generation call decoding each row's token count; EOS must not end a row early (the
    # embedded model ends its turn after ``</search>``: stopping there, plain decoded about a quarter of the tokens
    # and its tokens/s was mostly its prompt's prefill)
    start = time.perf_counter()
    session = backend.open(prompts)
    plain = session.generate(range(len(prompts)), model_tokens, stop=(), stop_at_eos=False)
    plain_s = time.perf_counter() - start
    plain_tokens = sum(len(s.token_ids) for s in plain.values())
    if plain_tokens != tokens:
        raise RuntimeError(f"plain generation decoded {plain_tokens} tokens, the rollout {tokens}: the comparison "
                           "needs the same count")

    # what the appended blocks cost alone: each row's environment tokens prefilled after its prompt in one forward
    # of that row (no turns, no decoding, no retrieval, no padding). A loop whose only cost beyond plain decoding
    # were these prefills would reach ``ratio_plain_plus_prefill`` (docs/reference.md, "How fast the agent loop runs")
    appended = [[tok for tok, own in zip(t.completion_ids, t.mask) if not own] for t in trajs]
    session = backend.open(prompts)
    before = session.tokens_processed
    start = time.perf_counter()
    for row, ids in enumerate(appended):
        session.append({row: ids})
    if backend.device.type == "cuda":  # an append reads nothing back: wait for its kernels before the clock stops
        torch.cuda.synchronize(backend.device)
    prefill_s = time.perf_counter() - start
    if session.tokens_processed - before != engine.stats.appended_tokens:
        raise RuntimeError(f"the prefill side fed {session.tokens_processed - before} tokens, the engine appended "
                           f"{engine.stats.appended_tokens}: the comparison needs the same tokens")

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
    return {"batch": cfg.batch, "model_tokens": tokens, "plain_tokens": plain_tokens,
            "appended_tokens": engine.stats.appended_tokens,
            "searches_per_question": round(sum(t.n_searches for t in trajs) / len(trajs), 2),
            "tokens_per_s_plain": round(plain_tokens / plain_s, 1),
            "tokens_per_s_rollout": round(tokens / rollout_s, 1),
            "ratio": round((tokens / rollout_s) / (plain_tokens / plain_s), 3),
            "appends_prefill_s": round(prefill_s, 2),
            "ratio_plain_plus_prefill": round(plain_s / (plain_s + prefill_s), 3),
            "retrieval_ms_per_call": round(1000 * engine.stats.retrieve_s / max(1, engine.stats.retrieval_calls), 2),
            "retrieval_calls": engine.stats.retrieval_calls,
            "stie_ms_per_round": round(stie_ms, 4), "threads": torch.get_num_threads()}
