"""NLR: Network-Local intelligent Routing (paper §2.4, eqs. 20–23 as the paper numbers them).

Every search can go to the fast local index, to a slower and wider "network" search, or to both.
A small policy network picks the action from the state; it is trained by policy gradient on the
paper's dual objective, recall gained against latency paid. The paper numbers the dual-objective
reward (20), its latency term (21) and its recall term (22), and the policy-gradient update (23); the
state (query, history and context) and the softmax policy are prose without an equation number. It
reports the effect in relative terms (local search "reduces average time by 42 %", network search
"boosts recall by 35 %"). The concrete features, the reference actions of the reward and the weights
below are our reconstruction:

* state (prose)  s = φ(query, history, context, outcomes) (:func:`state_features`, ``N_FEATURES`` values):
  query shape (length, capitalised share, digits, quotes, wh-words, comparison cue); the search
  history and context the rollout engine passes (``searches_so_far``, ``context_tokens``); and the
  retrieval outcomes observed so far: the local tier's answer to this query (top-1 score over the
  policy's ``score_scale``, relative top-1/top-2 margin, empty result) and the network tier's recent
  failures (failed requests in the router's last ``failure_window`` calls).
  Why the local outcome of the *current* query rather than of the trajectory's previous search: the
  rollout engine (``RolloutEngine._retrieve``) passes one context per query with no sample id, so a
  router cannot tell which earlier search belonged to which trajectory. The local tier costs
  milliseconds against the network's 100+ ms, so the router runs it first and the policy decides
  from its outcome whether the network is worth the wait (a cascade). Gold recall of earlier searches
  is not observable at inference time, so it is not a feature.
* policy (prose) π_θ(a | s) = softmax(MLP_θ(s)), a ∈ {local, network, both}.
* (20) reward  r(s, a) = λ_r · G(a) + λ_t · S(a), per query (:func:`routing_reward`), with
* (21) latency S(a) = (T_ref − T(a)) / T_ref,  T_ref = max_a' T(a'): relative latency saving against the
               slowest action for this query (:func:`latency_term`), and
* (22) recall  G(a) = (R(a) − R(local)) / max_a' R(a'): relative recall gain over local-only retrieval,
               0 when no action finds the gold passage (:func:`recall_term`);
  R(a) the recall of the gold passages in the action's top k, T(a) its latency as the router pays it:
  T(local) = t_local, T(network) = T(both) = t_local + t_network (the cascade). The terms lie in
  [0, 1] and [−1, 1] whatever the corpus size or the network's latency, as the paper's relative numbers do.
* (23) update  ∇θ J = E_{a∼π}[(r − b) ∇θ log π_θ(a | s)] + β ∇θ H(π), b a running mean baseline.

The network side is any search function: the retrieval service over a wider corpus with added
latency (:class:`~kunlunlab.retrieval.client.RetrievalClient`; :func:`network_tier` starts one on
loopback for a ``with`` block), or a SearxNG instance (:class:`SearxngClient`). If the network search
fails the router falls back to local results and counts the failure (:meth:`NetworkLocalRouter.summary`);
it never returns nothing silently. Training data and the ``kunlunlab train-router`` command live in
:mod:`kunlunlab.training.router`.
"""
from __future__ import annotations

import logging
import re
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

import httpx
import numpy as np
import torch

from kunlunlab.data.types import Passage
from kunlunlab.retrieval.retriever import Hit, IndexConfig, Retriever, build_retriever
from kunlunlab.retrieval.client import RetrievalServiceError

log = logging.getLogger(__name__)
ACTIONS = ("local", "network", "both")
LOCAL, NETWORK, BOTH = range(3)
SearchFn = Callable[[list[str], int], list[list[Hit]]]
_WH = ("who", "what", "when", "where", "which", "how")
_COMPARISON = re.compile(r"\b(or|both|same|older|younger|first|earlier|later|more|less)\b", re.I)
QUERY_FEATURES = 4 + len(_WH) + 1
HISTORY_FEATURES = 2     # searches so far, context length
OUTCOME_FEATURES = 4     # local top-1 score, local margin, local empty, recent network failures
N_FEATURES = QUERY_FEATURES + HISTORY_FEATURES + OUTCOME_FEATURES
FAILURE_FEATURE = N_FEATURES - 1
MAX_FAILURES = 4         # the failure feature saturates here


def state_features(query: str, searches_so_far: int = 0, context_tokens: int = 0,
                   local_scores: Sequence[float] = (), network_failures: int = 0,
                   score_scale: float = 1.0) -> np.ndarray:
    """NLR's state (§2.4, no equation number): a fixed-length vector from the query, the history/context
    and the retrieval outcomes.

    ``local_scores``: the ranked scores of the local tier's hits for this query (the cascade's probe;
    empty when the local tier found nothing). ``score_scale``: the typical top-1 local score of the
    training data (:attr:`NLRConfig.score_scale`), so the score feature is about 1 for an ordinary hit
    whatever the index's score range (BM25 scores run to tens, cosine scores stay below 1).
    ``network_failures``: failed network requests in the router's recent calls.
    """
    tokens = query.split()
    lower = query.lower()
    capitals = sum(1 for t in tokens if t[:1].isupper()) / max(1, len(tokens))
    features = [min(len(tokens), 32) / 16.0, capitals, float(bool(re.search(r"\d", query))),
                float('"' in query or "'" in query)]
    features += [float(lower.startswith(w) or f" {w} " in f" {lower} ") for w in _WH]
    features += [float(bool(_COMPARISON.search(query)))]
    features += [min(searches_so_far, 8) / 8.0, min(context_tokens, 4096) / 1024.0]
    scores = [float(s) for s in local_scores]
    top = float(np.clip(scores[0] / score_scale, -2.0, 2.0)) if scores else 0.0
    margin = float(np.clip((scores[0] - scores[1]) / max(abs(scores[0]), 1e-6), 0.0, 1.0)) if len(scores) > 1 else 0.0
    features += [top, margin, float(not scores), min(network_failures, MAX_FAILURES) / MAX_FAILURES]
    return np.asarray(features, dtype=np.float32)


@dataclass
class NLRConfig:
    recall_weight: float = 1.0      # λ_r, eq. (20), on the recall term of eq. (22)
    latency_weight: float = 0.25    # λ_t, eq. (20), on the latency term of eq. (21): a full latency saving is
    #                                 worth a quarter of finding the gold
    score_scale: float = 1.0        # typical top-1 local score (a state feature); set from the training data
    hidden: int = 32
    lr: float = 0.03
    epochs: int = 200
    entropy: float = 0.01           # β, eq. (23)
    seed: int = 0

    def __post_init__(self):
        if self.recall_weight < 0 or self.latency_weight < 0 or self.score_scale <= 0:
            raise ValueError(f"NLR weights must be non-negative and score_scale positive: {self}")


def latency_term(latency_ms: np.ndarray) -> np.ndarray:
    """Eq. (21) over a (queries x actions) table: S(a) = (T_ref − T(a)) / T_ref, T_ref = max_a' T(a')."""
    latency = np.asarray(latency_ms, dtype=np.float64)
    ref = np.broadcast_to(latency.max(1, keepdims=True), latency.shape)
    return np.divide(ref - latency, ref, out=np.zeros_like(latency), where=ref > 0)


def recall_term(recall: np.ndarray) -> np.ndarray:
    """Eq. (22) over a (queries x actions) table: G(a) = (R(a) − R(local)) / max_a' R(a'), 0 where no action
    finds the gold."""
    recall = np.asarray(recall, dtype=np.float64)
    best = np.broadcast_to(recall.max(1, keepdims=True), recall.shape)
    return np.divide(recall - recall[:, LOCAL:LOCAL + 1], best, out=np.zeros_like(recall), where=best > 0)


def routing_reward(recall: np.ndarray, latency_ms: np.ndarray, config: NLRConfig) -> np.ndarray:
    """Eq. (20), the dual-objective reward, over a (queries x actions) table, columns in :data:`ACTIONS` order:
    r = λ_r · G(a) (eq. 22)  +  λ_t · S(a) (eq. 21)."""
    recall, latency = np.asarray(recall), np.asarray(latency_ms)
    if recall.shape != latency.shape or recall.ndim != 2 or recall.shape[1] != len(ACTIONS):
        raise ValueError(f"recall {recall.shape} and latency {latency.shape} must both be (queries, {len(ACTIONS)})")
    return (config.recall_weight * recall_term(recall) + config.latency_weight * latency_term(latency)
            ).astype(np.float32)


class RoutingPolicy:
    """NLR's policy (§2.4, no equation number): a two-layer MLP over the state, softmax over the three actions."""

    def __init__(self, config: NLRConfig | None = None, meta: dict | None = None):
        self.config = config or NLRConfig()
        self.meta = dict(meta or {})  # what it was trained on (index kind, corpus, latency), saved with it
        torch.manual_seed(self.config.seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, self.config.hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(self.config.hidden, len(ACTIONS)))
        self.history: list[dict] = []

    def probabilities(self, states: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.softmax(self.net(torch.as_tensor(states, dtype=torch.float32)), -1).numpy()

    def act(self, states: np.ndarray, greedy: bool = True, rng: np.random.Generator | None = None) -> np.ndarray:
        probs = self.probabilities(states)
        if greedy:
            return probs.argmax(1)
        rng = rng or np.random.default_rng(self.config.seed)
        return np.array([rng.choice(len(ACTIONS), p=p / p.sum()) for p in probs])

    def train(self, states: np.ndarray, recall: np.ndarray, latency_ms: np.ndarray) -> list[dict]:
        """Eq. (23): REINFORCE with a running baseline over logged outcomes of every action.

        ``recall`` and ``latency_ms`` are (queries x 3) tables measured by :meth:`NetworkLocalRouter.collect`;
        each epoch samples one action per state from the current policy and is rewarded by the table (eq. 20).
        """
        cfg = self.config
        rewards = torch.as_tensor(routing_reward(recall, latency_ms, cfg), dtype=torch.float32)
        x = torch.as_tensor(states, dtype=torch.float32)
        optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        generator = torch.Generator().manual_seed(cfg.seed)
        baseline = float(rewards.mean())
        for epoch in range(cfg.epochs):
            logits = self.net(x)
            dist = torch.distributions.Categorical(logits=logits)
            actions = torch.multinomial(dist.probs.detach(), 1, generator=generator).squeeze(-1)
            r = rewards[torch.arange(len(x)), actions]
            loss = -((r - baseline) * dist.log_prob(actions)).mean() - cfg.entropy * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            baseline = 0.9 * baseline + 0.1 * float(r.mean())
            greedy = logits.argmax(-1)
            self.history.append({"epoch": epoch, "mean_reward": float(r.mean()),
                                 "greedy_reward": float(rewards[torch.arange(len(x)), greedy].mean()),
                                 "oracle_reward": float(rewards.max(1).values.mean()),
                                 **{f"share_{a}": float((greedy == i).float().mean()) for i, a in enumerate(ACTIONS)}})
        return self.history

    def save(self, path) -> None:
        torch.save({"state_dict": self.net.state_dict(), "config": asdict(self.config), "meta": self.meta,
                    "n_features": N_FEATURES, "actions": list(ACTIONS)}, path)

    @classmethod
    def load(cls, path) -> "RoutingPolicy":
        """Loads what :meth:`save` wrote; a file from an older state layout is refused by name."""
        blob = torch.load(path, weights_only=True)
        n_features = blob.get("n_features", blob["state_dict"]["0.weight"].shape[1])
        if n_features != N_FEATURES or list(blob.get("actions", ACTIONS)) != list(ACTIONS):
            raise ValueError(f"routing policy {path} was saved for {n_features} state features and actions "
                             f"{blob.get('actions', ACTIONS)}; this version uses {N_FEATURES} and {ACTIONS} "
                             f"(the state features changed): retrain it with `kunlunlab train-router`")
        policy = cls(NLRConfig(**blob["config"]), meta=blob.get("meta"))
        policy.net.load_state_dict(blob["state_dict"])
        return policy


def merge_hits(lists: Sequence[list[Hit]], k: int) -> list[Hit]:
    """Round-robin merge by rank, de-duplicated by passage id and by text (the two tiers may id one passage differently)."""
    out, seen = [], set()
    for rank in range(max((len(x) for x in lists), default=0)):
        for hits in lists:
            if rank < len(hits):
                h = hits[rank]
                key_id, key_text = ("id", h.id), ("text", h.contents.strip().lower())
                if key_id in seen or key_text in seen:
                    continue
                seen.update((key_id, key_text))
                out.append(h)
    return out[:k] if k else out


@dataclass
class RouterStats:
    decisions: dict = field(default_factory=lambda: {a: 0 for a in ACTIONS})  # queries per action
    router_calls: int = 0
    queries: int = 0
    total_ms: float = 0.0          # wall time of the router's calls, both tiers included
    local_ms: float = 0.0
    network_ms: float = 0.0
    network_calls: int = 0         # (batched) requests to the network tier
    network_errors: int = 0        # of those, failed ones
    network_failed_queries: int = 0  # queries whose network results were lost and fell back to local
    last_error: str | None = None


@dataclass
class RoutingTable:
    """Every action measured on each query (:meth:`NetworkLocalRouter.collect`): the training data of eq. (23).

    ``recall`` and ``latency_ms`` are (queries x 3) in :data:`ACTIONS` order; the latency is what the
    policy router pays (eq. 21's T(a)): t_local for local, t_local + t_network for network and both.
    ``local_ms`` / ``network_ms`` are the tiers alone, for the fixed-action baselines (which overlap the tiers).
    """

    queries: list[str]
    contexts: list[dict]
    local_scores: list[list[float]]
    network_failures: list[int]
    recall: np.ndarray
    latency_ms: np.ndarray
    local_ms: np.ndarray
    network_ms: np.ndarray
    network_ok: np.ndarray

    def states(self, score_scale: float = 1.0) -> np.ndarray:
        """The states of the measured queries, with the local outcomes scaled by ``score_scale``."""
        return np.stack([state_features(q, c.get("searches_so_far", 0), c.get("context_tokens", 0), s, f,
                                        score_scale)
                         for q, c, s, f in zip(self.queries, self.contexts, self.local_scores, self.network_failures)]
                        ).reshape(len(self.queries), N_FEATURES)

    def fixed_latency_ms(self) -> np.ndarray:
        """(queries x 3) latency of the fixed actions, which run the tiers concurrently: local, network, max of both."""
        return np.stack([self.local_ms, self.network_ms, np.maximum(self.local_ms, self.network_ms)], 1)


def recall_of(hits: Sequence[Hit], gold: set[str]) -> float:
    return len(gold & {h.id for h in hits}) / len(gold) if gold else 0.0


class NetworkLocalRouter:
    """A search function that routes each query by the policy and merges the tiers' results.

    With a policy (the state and policy of §2.4) the local tier runs first for every query and its outcome enters the
    state; the policy then sends the query to the network too ("both"), instead ("network": the
    network's hits replace the local ones) or not at all ("local"). With ``fixed_action`` (or no
    policy: "local") the tiers run concurrently as the action says. A failed network request falls
    back to local results and is counted; :meth:`summary` reports decisions, latency and errors.
    """

    wants_context = True

    def __init__(self, local: SearchFn, network: SearchFn, policy: RoutingPolicy | None = None,
                 fixed_action: str | None = None, failure_window: int = 16):
        if fixed_action is not None and fixed_action not in ACTIONS:
            raise ValueError(f"unknown action {fixed_action!r}; choose from {ACTIONS}")
        if failure_window < 1:
            raise ValueError("failure_window must be at least 1")
        self.local, self.network, self.policy, self.fixed_action = local, network, policy, fixed_action
        self.failure_window = failure_window
        self.stats = RouterStats()
        self._failed_at: deque[int] = deque()  # router call numbers of failed network requests

    @property
    def mode(self) -> str:
        return "policy" if self.policy is not None and self.fixed_action is None else f"fixed:{self.fixed_action or 'local'}"

    def recent_failures(self) -> int:
        """Failed network requests in the last ``failure_window`` router calls (the state's failure feature).
        A window rather than a running total, so that a tier that comes back is tried again."""
        while self._failed_at and self._failed_at[0] <= self.stats.router_calls - self.failure_window:
            self._failed_at.popleft()
        return len(self._failed_at)

    def states(self, queries: Sequence[str], contexts: Sequence[dict], local_hits: Sequence[list[Hit]]) -> np.ndarray:
        scale = self.policy.config.score_scale if self.policy is not None else 1.0
        failures = self.recent_failures()
        return np.stack([state_features(q, c.get("searches_so_far", 0), c.get("context_tokens", 0),
                                        [h.score for h in hits], failures, scale)
                         for q, c, hits in zip(queries, contexts, local_hits)])

    def _local(self, queries: list[str], k: int) -> list[list[Hit]]:
        t0 = time.perf_counter()
        try:
            return self.local(queries, k)
        finally:
            self.stats.local_ms += (time.perf_counter() - t0) * 1000

    def _network(self, queries: list[str], k: int) -> list[list[Hit]] | None:
        """The network tier's hits, or None after a counted failure (the caller falls back to local)."""
        t0 = time.perf_counter()
        self.stats.network_calls += 1
        try:
            hits = self.network(queries, k)
            if len(hits) != len(queries):
                raise RetrievalServiceError(f"network tier answered {len(hits)} result lists for {len(queries)} queries")
            return hits
        except RetrievalServiceError as err:
            self.stats.network_errors += 1
            self.stats.network_failed_queries += len(queries)
            self.stats.last_error = str(err)
            self._failed_at.append(self.stats.router_calls)
            log.warning("network search failed; falling back to the local index: %s", err)
            return None
        finally:
            self.stats.network_ms += (time.perf_counter() - t0) * 1000

    def __call__(self, queries: list[str], k: int, contexts: Sequence[dict] | None = None) -> list[list[Hit]]:
        t_start = time.perf_counter()
        queries = list(queries)
        contexts = list(contexts) if contexts is not None else [{}] * len(queries)
        if len(contexts) != len(queries):
            raise ValueError(f"{len(contexts)} contexts for {len(queries)} queries")
        if not queries:
            return []
        if self.mode == "policy":
            local_all = self._local(queries, k)
            actions = [ACTIONS[i] for i in self.policy.act(self.states(queries, contexts, local_all))]
            self.stats.router_calls += 1
            need_net = [i for i, a in enumerate(actions) if a != "local"]
            net = self._network([queries[i] for i in need_net], k) if need_net else None
            local_hits = {i: local_all[i] for i, a in enumerate(actions) if a != "network" or net is None}
        else:
            actions = [self.fixed_action or "local"] * len(queries)
            self.stats.router_calls += 1
            local_hits, net = {}, None
            need_local = [i for i, a in enumerate(actions) if a in ("local", "both")]
            need_net = [i for i, a in enumerate(actions) if a in ("network", "both")]
            with ThreadPoolExecutor(max_workers=1) as pool:  # the network call overlaps the local search
                future = pool.submit(self._network, [queries[i] for i in need_net], k) if need_net else None
                if need_local:
                    local_hits = dict(zip(need_local, self._local([queries[i] for i in need_local], k)))
                net = future.result() if future else None
            if need_net and net is None:  # defined fallback: local results for queries that asked for the network
                missing = [i for i in need_net if i not in local_hits]
                if missing:
                    local_hits.update(zip(missing, self._local([queries[i] for i in missing], k)))
        net_hits = dict(zip(need_net, net)) if net is not None else {}
        for a in actions:
            self.stats.decisions[a] += 1
        self.stats.queries += len(queries)
        self.stats.total_ms += (time.perf_counter() - t_start) * 1000
        return [merge_hits([local_hits.get(i, []), net_hits.get(i, [])], k) for i in range(len(queries))]

    search = __call__

    def summary(self) -> dict:
        """Decisions per action, latency and the network tier's errors, for evaluation summaries.

        A dead network tier shows as ``network_errors`` > 0 (and ``network_failed_queries``); a tier the
        policy never asked shows as ``network_calls`` == 0.
        """
        s = self.stats
        return {"mode": self.mode, "queries": s.queries, "router_calls": s.router_calls,
                "decisions": dict(s.decisions),
                "decision_share": {a: round(n / s.queries, 4) if s.queries else None for a, n in s.decisions.items()},
                "latency_ms_total": round(s.total_ms, 1),
                "latency_ms_per_query": round(s.total_ms / s.queries, 2) if s.queries else None,
                "latency_ms_per_call": round(s.total_ms / s.router_calls, 2) if s.router_calls else None,
                "local_ms": round(s.local_ms, 1), "network_ms": round(s.network_ms, 1),
                "network_calls": s.network_calls, "network_errors": s.network_errors,
                "network_failed_queries": s.network_failed_queries, "last_error": s.last_error}

    def collect(self, queries: Sequence[str], gold_ids: Sequence[set[str]], k: int = 5,
                contexts: Sequence[dict] | None = None) -> RoutingTable:
        """Measures every action on each query, one query at a time (the training data of eq. 23).

        Each query is one router call (so network failures enter later states as they would live);
        decisions are not counted. A failed network request counts as recall 0 for the network.
        """
        contexts = list(contexts) if contexts is not None else [{}] * len(queries)
        rows: dict[str, list] = {key: [] for key in ("scores", "failures", "recall", "t_local", "t_net", "ok")}
        for q, gold, c in zip(queries, gold_ids, contexts):
            rows["failures"].append(self.recent_failures())
            self.stats.router_calls += 1
            t0 = time.perf_counter()
            local = self._local([q], k)[0]
            t_local = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            net = self._network([q], k)
            t_net = (time.perf_counter() - t0) * 1000
            rows["ok"].append(net is not None)
            net = net[0] if net else []
            both = merge_hits([local, net], k)
            rows["scores"].append([h.score for h in local])
            rows["recall"].append([recall_of(hits, set(gold)) for hits in (local, net, both)])
            rows["t_local"].append(t_local)
            rows["t_net"].append(t_net)
        t_local, t_net = np.asarray(rows["t_local"], np.float32), np.asarray(rows["t_net"], np.float32)
        return RoutingTable(list(queries), contexts, rows["scores"], rows["failures"],
                            np.asarray(rows["recall"], np.float32).reshape(len(t_local), len(ACTIONS)),
                            np.stack([t_local, t_local + t_net, t_local + t_net], 1).reshape(len(t_local), len(ACTIONS)),
                            t_local, t_net, np.asarray(rows["ok"], bool))


@contextmanager
def network_tier(passages: Sequence[Passage] | None = None, added_latency_ms: float = 150.0,
                 embedder: str | None = None, kind: str = "bm25", retriever: Retriever | None = None,
                 port: int | None = None) -> Iterator[str]:
    """``with network_tier(world.passages, 150) as url:`` NLR's network tier for the block's duration.

    Serves ``retriever`` (or one built over ``passages`` with index ``kind``; ``embedder`` for the dense
    kinds) with the retrieval service on 127.0.0.1 (a free port unless ``port``), each request delayed
    by ``added_latency_ms`` to stand for a slower web search; yields the URL for
    :class:`~kunlunlab.retrieval.client.RetrievalClient`; stops the server when the block ends.
    """
    from kunlunlab.retrieval.service import ServiceThread  # deferred: only serving needs the web stack

    if (passages is None) == (retriever is None):
        raise ValueError("give either passages or a retriever")
    if retriever is None:
        retriever = build_retriever(passages, IndexConfig(kind=kind, embedder=embedder))
    service = ServiceThread(retriever, port=port, added_latency_ms=added_latency_ms)
    url = service.start()
    try:
        yield url
    finally:
        service.stop()
        if service.thread.is_alive():
            log.warning("network tier at %s did not stop within the timeout", url)


class SearxngClient:
    """SearxNG-style JSON web search (``GET /search?q=…&format=json``) as a network tier."""

    def __init__(self, url: str, timeout: float = 10.0, max_workers: int = 4):
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout)
        self.max_workers = max_workers

    def _one(self, query: str, k: int) -> list[Hit]:
        try:
            response = self.http.get(self.url + "/search", params={"q": query, "format": "json"})
            response.raise_for_status()
            results = response.json().get("results", [])
        except (httpx.HTTPError, ValueError) as err:
            raise RetrievalServiceError(f"SearxNG at {self.url} failed for {query!r}: {err}") from err
        hits = []
        for rank, item in enumerate(results[:k]):
            title, content = item.get("title", ""), item.get("content", "")
            hits.append(Hit(item.get("url") or f"searx:{rank}:{title}", f'"{title}"\n{content}',
                            float(item.get("score", 1.0 / (rank + 1))), title))
        return hits

    def __call__(self, queries: list[str], k: int) -> list[list[Hit]]:
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return list(pool.map(lambda q: self._one(q, k), queries))

    search = __call__
