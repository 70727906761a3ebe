"""Dynamic cluster sampling, resource-aware allocation and the EMA cluster weights (§3.1.1 of arXiv 2506.19466).

Steps 2, 3 and 5 of :meth:`ClusterRetriever.search <kunlunlab.retrieval.clustered.ClusterRetriever.search>`
(the algorithm as a whole is in :mod:`kunlunlab.retrieval.clustered`'s docstring): the sampling distribution
``p_c = softmax(s_c / T_t + γ·log w_c)`` over each query's considered clusters, its split of the candidate
budget into quotas ``q_c = p_c·B`` with stochastic rounding (``allocate``, ``draws``), the quotas applied to
the scanned candidates, and the EMA weights ``w_c`` learned from the hits.

This is per-query array arithmetic over the considered clusters, apart from FAISS and the index's storage,
so it lives apart from them as :class:`DynamicClusterSampling`, which ``ClusterRetriever`` inherits: the
methods keep their names on the retriever, and read the index's state and the tables its
``refresh_tables`` builds (``_weight_logits``, ``_draw_direction``, ``_doc_cluster_ext``, ``_slot_table``, ...).
The rounding of quotas, the random source of the draws, ``γ = 1`` and the bound on the weights are explained
where each is made.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # Weyl-sequence step for draws(): evenly spread fractions


class DynamicClusterSampling:
    """The sampling, allocation and weight part of ``ClusterRetriever`` (see the module docstring)."""

    def temperature(self) -> float:
        """The annealed ``T_t = T_end + (T_start − T_end)·exp(−t/τ)``, ``t`` the queries served (``step``)."""
        c = self.config
        return c.temperature_end + (c.temperature_start - c.temperature_end) * math.exp(-self.step / c.anneal_queries)

    def cluster_probabilities(self, scores: np.ndarray, clusters: np.ndarray) -> np.ndarray:
        """Dynamic cluster sampling distribution over each query's considered clusters:
        ``p_c ∝ max(softmax(s_c/T_t + γ·log w_c), min_share)``, zero for empty or missing clusters."""
        c = self.config
        logits = scores * (1.0 / self.temperature())
        masked = self._has_empty or clusters.min() < 0
        if masked:
            usable = clusters >= 0
            usable[usable] = self.cluster_sizes[clusters[usable]] > 0  # empty clusters get no share
            clusters = np.maximum(clusters, 0)
        logits += self._weight_logits[clusters]
        if masked:
            logits[~usable] = -np.inf
            top = logits.max(axis=1, keepdims=True)
            top[~np.isfinite(top)] = 0.0  # a query whose considered clusters are all empty: all-zero row
            logits -= top
        else:
            logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits, out=logits)
        # Cold-start floor on the softmax p/S without normalising twice: max(p/S, m) = max(p, m·S)/S.
        floor = p.sum(axis=1, keepdims=True)
        floor *= c.min_share
        np.maximum(p, floor, out=p)
        if masked:
            p *= usable
            total = p.sum(axis=1, keepdims=True)
            return np.divide(p, total, out=np.zeros_like(p), where=total > 0)
        p /= p.sum(axis=1, keepdims=True)  # ≥ 1: the top logit is 0
        return p

    def draws(self, q: np.ndarray) -> np.ndarray:
        """One uniform in [0, 1) per query for the stochastic rounding in ``allocate``.

        A hash rather than a random generator, so that a batch gives the same results as its queries
        one at a time: ``frac(q·r + t·φ)`` with a fixed random direction ``r`` (scaled so the
        fractional part of ``q·r`` is uniform over queries) and a Weyl step ``t·φ`` (φ the golden
        ratio) on the query's position ``t`` on the serving clock. While adapting, a repeated query
        therefore gets a fresh, evenly spread draw each time; with ``adapt=False`` the clock stands
        still and search is a pure function of the query (reproducible evaluation)."""
        if len(q) == 1:  # plain floats: a few microseconds less on the single-query hot path
            return np.array([math.fmod(float(self._draw_direction @ q[0]) % 1.0 + math.fmod(self.step * _GOLDEN, 1.0),
                                       1.0)])
        if self.config.adapt:
            phase = np.mod((self.step + np.arange(len(q), dtype=np.float64)) * _GOLDEN, 1.0)
        else:
            phase = math.fmod(self.step * _GOLDEN, 1.0)  # float64: exact enough for any clock
        return np.mod(q @ self._draw_direction + phase, 1.0)

    @staticmethod
    def allocate(quota: np.ndarray, u: np.ndarray | None, explore_slots: int) -> tuple[np.ndarray, np.ndarray]:
        """Which considered clusters to scan, and each scanned cluster's priority cap, from the quotas
        ``q_c = p_c·B``; ``u``: one uniform in [0, 1) per query (``draws``).

        ``q_c ≥ 1``: scanned, cap ``⌈q_c⌉`` (the cap is a priority in ``_apply_quotas``; the budget
        ``B`` of re-ranked candidates stays a hard limit). ``q_c < 1`` (stochastic rounding): scanned
        for ``m = explore_slots`` slots with probability ``q_c/m``, else not at all, so the expected
        slots equal the quota (the expected budget is unchanged) and a floored cluster is scanned with
        probability about ``B·min_share/m`` per query that considers it. Deterministic rounding
        (``explore_slots=0``: scan only when ``q_c ≥ 1``, the behaviour before) never scans a floored
        cluster, whose quota is ``B·min_share ≈ 0.05`` at the defaults: its documents could never
        become hits, its EMA weight could never rise, and the floor would be inert.

        The draw is systematic: with ``U_c`` the running sum of ``q_c/m`` over the sub-unit clusters,
        cluster ``c`` is drawn when an integer lies in ``(U_{c−1} + u, U_c + u]``, i.e. when
        ``frac(U_c + u) < q_c/m`` (computed scaled by ``m``). The number drawn per query is then
        ``Σ_{q_c<1} q_c/m`` rounded down or up, where independent coins would add variance.

        Why ``m`` (a departure from plain stochastic rounding, ``m = 1``): on the 100k Gaussian
        benchmark the quotas below one slot add up to about 13 per query, so ``m = 1`` scans about 13
        clusters per query beyond the ~18 of deterministic rounding (+15–35% latency, measured), while
        ``m = 16`` keeps the same expectation with about 0.8 extra scans per query, each with up to 16
        priority slots (measured against deterministic rounding: a few percent latency, recall@10
        unchanged). A floored cluster is then scanned with probability about 0.0034 per query that
        considers it."""
        probe = quota >= 1.0
        cap = np.ceil(quota)
        if not explore_slots:
            return probe, cap
        sub = np.where(probe, 0.0, quota)
        reached = np.add.accumulate(sub, axis=1, dtype=np.float64)  # U_c
        if len(quota) == 1:  # one query, the hot path: walk the (one or two) crossings in plain Python
            running = reached[0].tolist()
            crossing = explore_slots * (1.0 - float(u[0]))  # the first multiple of m, less the offset u·m
            while crossing <= running[-1]:
                cluster = bisect.bisect_left(running, crossing)  # U_{c−1} < crossing ≤ U_c
                probe[0, cluster] = True
                cap[0, cluster] = explore_slots
                crossing += explore_slots
            return probe, cap
        reached += (u * explore_slots)[:, None]
        drawn = np.fmod(reached, explore_slots, out=reached) < sub
        np.putmask(cap, drawn, explore_slots)
        return probe | drawn, cap

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

    def _apply_quotas(self, cand: np.ndarray, clusters: np.ndarray, cap: np.ndarray,
                      budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Resource-aware allocation of the budget: candidates inside their cluster's cap (``⌈q_c⌉``,
        or ``explore_slots`` for a cluster drawn by ``allocate``) come first, then the budget is filled
        with the best remaining ones (PQ order), so quota a small cluster cannot use flows to the
        others instead of being wasted."""
        nq, fetched = cand.shape
        n_considered = clusters.shape[1]
        slot = self._slots(cand, clusters)
        valid = slot >= 0
        rows_idx = np.arange(nq)[:, None]
        # Rank of each candidate inside its cluster: one stable sort of (query, slot) keys keeps PQ order
        # within a group, and searchsorted finds where each group starts.
        keys = slot.ravel() if nq == 1 else (slot + rows_idx * (n_considered + 1)).ravel()  # -1 sorts first
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        rank = np.empty(keys.size, dtype=np.int64)
        rank[order] = np.arange(keys.size) - np.searchsorted(sorted_keys, sorted_keys, side="left")
        rank = rank.reshape(nq, fetched)
        in_quota = valid & (rank < cap[rows_idx, np.maximum(slot, 0)])
        if in_quota[:, :budget].all():  # the best `budget` by PQ order already respect every quota
            return np.where(valid[:, :budget], cand[:, :budget], -1), slot[:, :budget]
        # Order: in-quota, then other valid, then missing candidates, each group in PQ order (a stable
        # radix sort of the group code).
        group = 2 - valid.view(np.uint8) - in_quota.view(np.uint8)
        keep = np.argsort(group, axis=1, kind="stable")[:, :budget]
        kept_slot = slot[rows_idx, keep]
        return np.where(kept_slot >= 0, cand[rows_idx, keep], -1), kept_slot

    def _record_hits(self, rows: np.ndarray) -> None:
        self._pending_hits.append(rows)
        self._pending_queries += len(rows)
        if self._pending_queries >= 64:
            self._update_weights()

    def weight_bounds(self) -> tuple[float, float]:
        """``w ∈ [1/ρ, ρ]`` with ``ρ = F^(1/γ)``, so the weight term ``w^γ`` lies in ``[1/F, F]``.

        §3.1.1 of arXiv 2506.19466 has the EMA weights move a cluster's share by 3–5x; γ = 0.25 with
        w ∈ [1/2, 2] allowed at most 1.19x. The bound is therefore set on the factor itself,
        ``F = weight_factor`` = 4 by default, and γ = 1 (``w`` is already a hit-rate ratio), so a
        cluster hit 4x as often as its size predicts reaches it. Against neutral rivals a share then
        rises by at most ``F·(1 + n·min_share)``: the softmax weight grows by at most F and the
        floor's normaliser, between 1 and ``1 + n·min_share``, can shrink by no more than that."""
        c = self.config
        rho = c.weight_factor ** (1.0 / c.weight_strength) if c.weight_strength > 0 else 1.0
        return 1.0 / rho, rho

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
        lo, hi = self.weight_bounds()
        ratio = np.where(expected > 0, observed / np.maximum(expected, 1e-12), 1.0)
        # Clusters that produced hits move toward their ratio; the rest relax toward neutral 1.
        target = np.where(observed > 0, np.clip(ratio, lo, hi), 1.0)
        d = self.config.ema_decay ** n_queries
        self.weights = np.clip(d * self.weights + (1 - d) * target, lo, hi).astype(np.float32)
        self._weight_logits = (self.config.weight_strength * np.log(self.weights)).astype(np.float32)  # γ log w
