"""Training NLR's routing policy (paper §2.4, eqs. 20–23) against a real network tier: ``kunlunlab train-router``.

The setting: the local tier is an index over part of the synthetic world (``local_fraction`` of its
passages, drawn at random), the network tier is the retrieval service over the whole, wider world,
started on loopback with ``added_latency_ms`` per request (or an already running one at
``network_url``). Every hop of the training questions is one query with one gold passage; the
router measures recall and latency of local, network and both on each (:meth:`NetworkLocalRouter.collect`),
the policy is trained on that table by policy gradient (eq. 23 on eq. 20's reward) and saved where
``EvalConfig(router=...)`` loads it.

Training questions are drawn with their own seed (``seed + 1000``) and exclude the questions the eval
harness draws for the same world (``seed + 1``), so a router is not trained on evaluation questions.
The engine's ``context_tokens`` cannot be measured without an LLM; it is approximated per hop as
``context_tokens_base + hop · context_tokens_per_hop``. A healthy training tier never fails, so the
failure feature of the state would never be seen; ``outage_fraction`` of the training rows are copied
as outage states (failure feature set, network recall 0, "both" = local) so the policy learns to stay
local while the tier is down.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from kunlunlab.agent.nlr import (ACTIONS, BOTH, FAILURE_FEATURE, LOCAL, MAX_FAILURES, NETWORK, NLRConfig,
                                 NetworkLocalRouter, RoutingPolicy, RoutingTable, network_tier, routing_reward)
from kunlunlab.data import World, make_questions
from kunlunlab.retrieval import Encoder, IndexConfig, build_retriever, corpus_embeddings
from kunlunlab.retrieval.client import RetrievalClient, RetrievalServiceError

log = logging.getLogger(__name__)


@dataclass
class RouterTrainConfig:
    world_passages: int = 2000          # the world of EvalConfig(dataset="world") at its default size
    questions: int = 200
    seed: int = 0                       # world seed, as EvalConfig.seed
    local_fraction: float = 0.5         # share of the world in the local index
    added_latency_ms: float = 150.0     # the network tier's extra latency per request
    index_kind: str = "bm25"            # both tiers; use the eval's --index-kind (the score feature depends on it)
    embedder: str | None = None         # for the dense kinds
    top_k: int = 3                      # as EvalConfig.rollout.top_k
    heldout_fraction: float = 0.2       # questions kept out of training, reported separately
    outage_fraction: float = 0.25       # training rows copied as outage states (module docstring)
    exclude_eval_questions: int = 200   # drop training questions among the eval harness's first N
    context_tokens_base: int = 256
    context_tokens_per_hop: int = 160
    network_url: str | None = None      # an already running service over the same world
    nlr: NLRConfig = field(default_factory=NLRConfig)

    def __post_init__(self):
        if not 0.0 < self.local_fraction < 1.0:
            raise ValueError(f"local_fraction must be in (0, 1), got {self.local_fraction}")
        if not 0.0 <= self.heldout_fraction < 1.0 or not 0.0 <= self.outage_fraction <= 1.0:
            raise ValueError("heldout_fraction must be in [0, 1) and outage_fraction in [0, 1]")
        if self.questions < 2 or self.top_k < 1 or self.added_latency_ms < 0:
            raise ValueError(f"invalid sizes: questions={self.questions}, top_k={self.top_k}, "
                             f"added_latency_ms={self.added_latency_ms}")


def hop_queries(examples, config: RouterTrainConfig) -> tuple[list[str], list[set[str]], list[dict]]:
    """One query per distinct hop question with its gold passage; the hop index stands for the searches so far."""
    queries, golds, contexts, seen = [], [], [], set()
    for ex in examples:
        for j, hop in enumerate(ex.chain):
            if hop.passage_id is None or hop.question in seen:
                continue
            seen.add(hop.question)
            queries.append(hop.question)
            golds.append({hop.passage_id})
            contexts.append({"searches_so_far": j,
                             "context_tokens": config.context_tokens_base + j * config.context_tokens_per_hop})
    return queries, golds, contexts


def outage_rows(states: np.ndarray, recall: np.ndarray, latency: np.ndarray, fraction: float,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copies of ``fraction`` of the rows as if the network tier were failing (see the module docstring)."""
    n = int(round(fraction * len(states)))
    if n == 0:
        return states[:0], recall[:0], latency[:0]
    idx = rng.choice(len(states), size=n, replace=False)
    s, r = states[idx].copy(), recall[idx].copy()
    s[:, FAILURE_FEATURE] = rng.integers(1, MAX_FAILURES + 1, size=n) / MAX_FAILURES
    r[:, NETWORK] = 0.0
    r[:, BOTH] = r[:, LOCAL]
    return s, r, latency[idx].copy()


def compare(table: RoutingTable, actions: np.ndarray, config: NLRConfig) -> dict:
    """Mean recall and latency of the policy's choices against the fixed strategies and the per-query oracle."""
    n = len(actions)
    if n == 0:
        return {"queries": 0}
    rows = np.arange(n)
    fixed = table.fixed_latency_ms()
    rewards = routing_reward(table.recall, table.latency_ms, config)
    out = {"queries": n,
           "actions": {a: round(float((actions == i).mean()), 4) for i, a in enumerate(ACTIONS)},
           "policy": {"recall": float(table.recall[rows, actions].mean()),
                      "latency_ms": float(table.latency_ms[rows, actions].mean()),
                      "reward": float(rewards[rows, actions].mean())}}
    for i, a in enumerate(ACTIONS):
        out[f"always_{a}"] = {"recall": float(table.recall[:, i].mean()), "latency_ms": float(fixed[:, i].mean()),
                              "reward": float(rewards[:, i].mean())}
    best = rewards.argmax(1)
    out["oracle"] = {"recall": float(table.recall[rows, best].mean()),
                     "latency_ms": float(table.latency_ms[rows, best].mean()), "reward": float(rewards.max(1).mean())}
    return {k: ({kk: round(vv, 4) for kk, vv in v.items()} if isinstance(v, dict) and k != "actions" else v)
            for k, v in out.items()}


def _subset(table: RoutingTable, idx: np.ndarray) -> RoutingTable:
    return RoutingTable([table.queries[i] for i in idx], [table.contexts[i] for i in idx],
                        [table.local_scores[i] for i in idx], [table.network_failures[i] for i in idx],
                        table.recall[idx], table.latency_ms[idx], table.local_ms[idx], table.network_ms[idx],
                        table.network_ok[idx])


def split_questions(world, config: RouterTrainConfig) -> tuple[list, list, int]:
    """The router's own questions (seed ``seed + 1000``) without the eval harness's first
    ``exclude_eval_questions`` (seed ``seed + 1``), split into training and held-out; (train, held-out, dropped)."""
    examples = make_questions(world, config.questions, seed=config.seed + 1000, id_prefix="nlr")
    eval_questions = ({ex.question for ex in make_questions(world, config.exclude_eval_questions, seed=config.seed + 1)}
                      if config.exclude_eval_questions else set())
    dropped = sum(ex.question in eval_questions for ex in examples)
    examples = [ex for ex in examples if ex.question not in eval_questions]
    n_heldout = int(round(config.heldout_fraction * len(examples)))
    train_ex, heldout_ex = examples[:len(examples) - n_heldout], examples[len(examples) - n_heldout:]
    if not train_ex:
        raise ValueError(f"no training questions left ({len(examples)} after dropping {dropped} eval questions)")
    return train_ex, heldout_ex, dropped


def build_tiers(world, config: RouterTrainConfig) -> tuple:
    """(wide, local, local passages): an index over the whole world (what the network tier serves) and one over
    ``local_fraction`` of its passages, drawn with ``seed``; a dense kind embeds the world once."""
    rng = np.random.default_rng(config.seed)
    n_local = max(1, int(round(config.local_fraction * len(world.passages))))
    local_rows = np.sort(rng.choice(len(world.passages), size=n_local, replace=False))
    local_passages = [world.passages[i] for i in local_rows]
    index = IndexConfig(kind=config.index_kind, embedder=config.embedder)
    if config.index_kind == "bm25":
        wide = build_retriever(world.passages, index)
        local = build_retriever(local_passages, index)
    else:  # embed the world once; the local index reuses its rows
        encoder = Encoder(config.embedder)
        vectors = corpus_embeddings(encoder, world.passages, progress=False)
        wide = build_retriever(world.passages, index, encoder=encoder, vectors=vectors)
        local = build_retriever(local_passages, index, encoder=encoder, vectors=vectors[local_rows])
    return wide, local, local_passages


def _write_corpus(path: str | Path, passages) -> None:
    """FlashRAG jsonl (``id, contents``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")


def measure_tiers(url: str, local, splits, config: RouterTrainConfig, say: Callable[[str], None]
                  ) -> tuple[list[RoutingTable], NetworkLocalRouter, dict]:
    """Routing outcomes of local / network / both on the hop queries of each (name, questions) split, against
    the retrieval service at ``url``; (a table per split, the router, the service's health)."""
    client = RetrievalClient(url)
    try:
        health = client.health()
        client.search(["warm up the connection"], config.top_k)  # the first request pays connection setup
        local.search(["warm up the index"], config.top_k)
        router = NetworkLocalRouter(local.search, client.search)
        tables = []
        for name, exs in splits:
            queries, golds, contexts = hop_queries(exs, config)
            say(f"measuring local / network / both on {len(queries)} {name} hop queries")
            tables.append(router.collect(queries, golds, config.top_k, contexts))
        return tables, router, health
    finally:
        client.close()


def _check_network(health: dict, router: NetworkLocalRouter, n_passages: int) -> None:
    """Warns about a network tier over another corpus; refuses one whose every request failed."""
    if health.get("n") != n_passages:
        log.warning("the network tier serves %s passages, the world has %d: is it the same corpus?",
                    health.get("n"), n_passages)
    if router.stats.network_calls and router.stats.network_errors == router.stats.network_calls:
        raise RetrievalServiceError(f"every network request failed ({router.stats.network_errors}); "
                                    f"last error: {router.stats.last_error}")


def fit_policy(config: RouterTrainConfig, table: RoutingTable, say: Callable[[str], None]
               ) -> tuple[RoutingPolicy, np.ndarray, int, list[dict]]:
    """The policy trained by policy gradient on ``table`` plus its outage copies, its states scaled by the
    median top local score (``policy.config.score_scale``); (policy, training states, outage rows, history)."""
    tops = [s[0] for s in table.local_scores if s]
    score_scale = float(np.median(tops)) if tops and np.median(tops) > 0 else 1.0
    nlr = replace(config.nlr, score_scale=score_scale)
    states = table.states(score_scale)
    extra = outage_rows(states, table.recall, table.latency_ms, config.outage_fraction,
                        np.random.default_rng(config.seed + 1))
    meta = {"index_kind": config.index_kind, "embedder": config.embedder, "world_passages": config.world_passages,
            "seed": config.seed, "local_fraction": config.local_fraction,
            "added_latency_ms": config.added_latency_ms, "top_k": config.top_k}
    policy = RoutingPolicy(nlr, meta=meta)
    say(f"training the policy on {len(states)} rows + {len(extra[0])} outage rows for {nlr.epochs} epochs")
    history = policy.train(np.concatenate([states, extra[0]]), np.concatenate([table.recall, extra[1]]),
                           np.concatenate([table.latency_ms, extra[2]]))
    return policy, states, len(extra[0]), history


def train_router(config: RouterTrainConfig | None = None, out: str | Path | None = None,
                 progress: Callable[[str], None] | None = None,
                 local_corpus_out: str | Path | None = None) -> tuple[RoutingPolicy, dict]:
    """Collects routing outcomes on training questions, trains the policy, saves it to ``out``; (policy, summary).

    ``local_corpus_out``: also write the local tier's passages as FlashRAG jsonl (``id, contents``), so an
    evaluation can use the same local corpus against a network tier over the whole world.
    """
    config = config or RouterTrainConfig()
    say = progress or (lambda msg: log.info(msg))
    start = time.perf_counter()
    world = World.generate(n_passages=config.world_passages, seed=config.seed)
    train_ex, heldout_ex, dropped = split_questions(world, config)
    wide, local, local_passages = build_tiers(world, config)
    if local_corpus_out is not None:
        _write_corpus(local_corpus_out, local_passages)
    say(f"world {len(world.passages)} passages, local tier {len(local_passages)}; "
        f"{len(train_ex)} training + {len(heldout_ex)} held-out questions ({dropped} eval questions dropped)")

    splits = (("training", train_ex), ("held-out", heldout_ex))
    if config.network_url:
        (train_table, heldout_table), router, health = measure_tiers(config.network_url, local, splits, config, say)
    else:
        with network_tier(retriever=wide, added_latency_ms=config.added_latency_ms) as url:
            (train_table, heldout_table), router, health = measure_tiers(url, local, splits, config, say)
    _check_network(health, router, len(world.passages))

    policy, states, n_outage, history = fit_policy(config, train_table, say)
    nlr, score_scale = policy.config, policy.config.score_scale
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        policy.save(out)
    train_actions = policy.act(states)
    heldout_actions = policy.act(heldout_table.states(score_scale)) if heldout_table.queries else np.zeros(0, int)
    summary = {"out": str(out) if out is not None else None, "local_corpus": str(local_corpus_out) if local_corpus_out else None,
               "questions": {"train": len(train_ex), "heldout": len(heldout_ex), "dropped_eval_overlap": dropped},
               "queries": {"train": len(train_table.queries), "heldout": len(heldout_table.queries),
                           "outage_rows": n_outage},
               "local_passages": len(local_passages), "network_passages": health.get("n"),
               "added_latency_ms": config.added_latency_ms, "network_url": config.network_url,
               "network_calls": router.stats.network_calls, "network_errors": router.stats.network_errors,
               "score_scale": round(score_scale, 4),
               "reward": {"first_epoch": round(history[0]["greedy_reward"], 4),
                          "last_epoch": round(history[-1]["greedy_reward"], 4),
                          "oracle": round(history[-1]["oracle_reward"], 4)},
               "train": compare(train_table, train_actions, nlr),
               "heldout": compare(heldout_table, heldout_actions, nlr),
               "config": {**asdict(config), "nlr": asdict(nlr)},
               "seconds": round(time.perf_counter() - start, 1)}
    return policy, summary
