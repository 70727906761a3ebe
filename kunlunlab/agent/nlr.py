"""NLR: Network-Local intelligent Routing (paper §3.1.3, eqs. 20–23).

Every search can go to the fast local index, to a slower and wider "network" search, or to both.
A small policy network picks the action from the state; it is trained by policy gradient on the
paper's dual objective, recall gained against latency paid:

* (20) state      s = φ(query, history, context): query-shape features, the searches made so far
  and the context length (:func:`state_features`).
* (21) policy     π_θ(a | s) = softmax(MLP_θ(s)), a ∈ {local, network, both}.
* (22) reward     r(s, a) = λ_r · recall(a) − λ_t · latency(a) / latency_ref.
* (23) update     ∇θ J = E_{a∼π}[(r − b) ∇θ log π_θ(a | s)] + β ∇θ H(π), b a running mean baseline.

The network side is any search function: the retrieval service over a wider corpus with added
latency (:class:`~kunlunlab.retrieval.service.RetrievalClient`), or a SearxNG instance
(:class:`SearxngClient`). If the network search fails the router falls back to local results and
counts the failure; it never returns nothing silently.
"""
from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kunlunlab.retrieval.retriever import Hit
from kunlunlab.retrieval.service import RetrievalServiceError

log = logging.getLogger(__name__)
ACTIONS = ("local", "network", "both")
SearchFn = Callable[[list[str], int], list[list[Hit]]]
_WH = ("who", "what", "when", "where", "which", "how")
_COMPARISON = re.compile(r"\b(or|both|same|older|younger|first|earlier|later|more|less)\b", re.I)
N_FEATURES = 4 + len(_WH) + 3


def state_features(query: str, searches_so_far: int = 0, context_tokens: int = 0) -> np.ndarray:
    """Eq. (20): a fixed-length state vector from the query, the retrieval history and the context."""
    tokens = query.split()
    lower = query.lower()
    capitals = sum(1 for t in tokens if t[:1].isupper()) / max(1, len(tokens))
    features = [min(len(tokens), 32) / 16.0, capitals, float(bool(re.search(r"\d", query))),
                float('"' in query or "'" in query)]
    features += [float(lower.startswith(w) or f" {w} " in f" {lower} ") for w in _WH]
    features += [float(bool(_COMPARISON.search(query))), min(searches_so_far, 8) / 8.0,
                 min(context_tokens, 4096) / 1024.0]
    return np.asarray(features, dtype=np.float32)


@dataclass
class NLRConfig:
    recall_weight: float = 1.0      # λ_r
    latency_weight: float = 0.5     # λ_t
    latency_ref_ms: float = 100.0   # latency that costs λ_t
    hidden: int = 32
    lr: float = 0.03
    epochs: int = 200
    entropy: float = 0.01           # β
    seed: int = 0


def routing_reward(recall: np.ndarray, latency_ms: np.ndarray, config: NLRConfig) -> np.ndarray:
    """Eq. (22), element-wise over (queries x actions)."""
    return config.recall_weight * recall - config.latency_weight * latency_ms / config.latency_ref_ms


class RoutingPolicy:
    """Eq. (21): a two-layer MLP over the state, softmax over the three actions."""

    def __init__(self, config: NLRConfig | None = None):
        import torch

        self.config = config or NLRConfig()
        torch.manual_seed(self.config.seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, self.config.hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(self.config.hidden, len(ACTIONS)))
        self.history: list[dict] = []

    def probabilities(self, states: np.ndarray) -> np.ndarray:
        import torch

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
        each epoch samples one action per state from the current policy and is rewarded by the table.
        """
        import torch

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
        import torch

        torch.save({"state_dict": self.net.state_dict(), "config": self.config.__dict__}, path)

    @classmethod
    def load(cls, path) -> "RoutingPolicy":
        import torch

        blob = torch.load(path, weights_only=True)
        policy = cls(NLRConfig(**blob["config"]))
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
    calls: dict = field(default_factory=lambda: {a: 0 for a in ACTIONS})
    local_ms: float = 0.0
    network_ms: float = 0.0
    network_errors: int = 0
    last_error: str | None = None


class NetworkLocalRouter:
    """A search function that routes each query by the policy and merges the tiers' results."""

    wants_context = True

    def __init__(self, local: SearchFn, network: SearchFn, policy: RoutingPolicy | None = None,
                 fixed_action: str | None = None):
        if fixed_action is not None and fixed_action not in ACTIONS:
            raise ValueError(f"unknown action {fixed_action!r}; choose from {ACTIONS}")
        self.local, self.network, self.policy, self.fixed_action = local, network, policy, fixed_action
        self.stats = RouterStats()

    def choose(self, queries: Sequence[str], contexts: Sequence[dict] | None = None) -> list[str]:
        if self.fixed_action or self.policy is None:
            return [self.fixed_action or "local"] * len(queries)
        contexts = contexts or [{}] * len(queries)
        states = np.stack([state_features(q, c.get("searches_so_far", 0), c.get("context_tokens", 0))
                           for q, c in zip(queries, contexts)])
        return [ACTIONS[i] for i in self.policy.act(states)]

    def _network(self, queries: list[str], k: int) -> list[list[Hit]] | None:
        t0 = time.perf_counter()
        try:
            return self.network(queries, k)
        except RetrievalServiceError as err:
            self.stats.network_errors += 1
            self.stats.last_error = str(err)
            log.warning("network search failed; falling back to the local index: %s", err)
            return None
        finally:
            self.stats.network_ms += (time.perf_counter() - t0) * 1000

    def __call__(self, queries: list[str], k: int, contexts: Sequence[dict] | None = None) -> list[list[Hit]]:
        actions = self.choose(queries, contexts)
        for a in actions:
            self.stats.calls[a] += 1
        need_local = [i for i, a in enumerate(actions) if a in ("local", "both")]
        need_net = [i for i, a in enumerate(actions) if a in ("network", "both")]
        local_hits: dict[int, list[Hit]] = {}
        net_hits: dict[int, list[Hit]] = {}
        with ThreadPoolExecutor(max_workers=1) as pool:  # the network call overlaps the local search
            future = pool.submit(self._network, [queries[i] for i in need_net], k) if need_net else None
            if need_local:
                t0 = time.perf_counter()
                local_hits = dict(zip(need_local, self.local([queries[i] for i in need_local], k)))
                self.stats.local_ms += (time.perf_counter() - t0) * 1000
            net = future.result() if future else None
        if need_net and net is None:  # defined fallback: local results for queries that asked for the network
            missing = [i for i in need_net if i not in local_hits]
            if missing:
                local_hits.update(zip(missing, self.local([queries[i] for i in missing], k)))
        elif need_net:
            net_hits = dict(zip(need_net, net))
        return [merge_hits([local_hits.get(i, []), net_hits.get(i, [])], k) for i in range(len(queries))]

    search = __call__

    def collect(self, queries: Sequence[str], gold_ids: Sequence[set[str]], k: int = 5,
                contexts: Sequence[dict] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Measures every action on each query (states, recall, latency_ms), the training data of eq. (23).

        "both" runs the tiers concurrently, so its latency is the slower of the two plus merging.
        """
        contexts = contexts or [{}] * len(queries)
        states, recall, latency = [], [], []
        for q, gold, c in zip(queries, gold_ids, contexts):
            t0 = time.perf_counter()
            local = self.local([q], k)[0]
            t_local = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            net = self._network([q], k)
            t_net = (time.perf_counter() - t0) * 1000
            net = net[0] if net else []
            both = merge_hits([local, net], k)
            hit = [float(bool(gold & {h.id for h in hits})) for hits in (local, net, both)]
            states.append(state_features(q, c.get("searches_so_far", 0), c.get("context_tokens", 0)))
            recall.append(hit)
            latency.append([t_local, t_net, max(t_local, t_net)])
        return np.stack(states), np.asarray(recall, np.float32), np.asarray(latency, np.float32)


class SearxngClient:
    """SearxNG-style JSON web search (``GET /search?q=…&format=json``) as a network tier."""

    def __init__(self, url: str, timeout: float = 10.0, max_workers: int = 4):
        import httpx

        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout)
        self.max_workers = max_workers

    def _one(self, query: str, k: int) -> list[Hit]:
        import httpx

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
