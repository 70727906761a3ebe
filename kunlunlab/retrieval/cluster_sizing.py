"""How big the clustering retriever's index is: its number of clusters, its centroids, its candidate budget.

These are chosen before (or apart from) the index itself, so they live apart from
:class:`~kunlunlab.retrieval.clustered.ClusterRetriever`, which calls them while it builds and searches:

* ``nlist``: ``default_nlist`` (about 2·sqrt(N), ``nlist_method="sqrt"``; why this default departs from the
  paper: :mod:`kunlunlab.retrieval.clustered`'s docstring) or, the way §3.1.1 of arXiv 2506.19466 chooses it,
  the elbow of k-means inertia or the best silhouette coefficient on a sample (``select_nlist``, ``nlist_grid``);
* the centroids: k-means++ seeding (scikit-learn) then spherical k-means (FAISS), ``train_centroids``, shared
  by the build and by the elbow/silhouette search;
* the global candidate budget ``B`` for ``candidate_budget=0``: ``auto_candidate_budget`` (measured rule and
  recall in its docstring).
"""
from __future__ import annotations

import math

import faiss
import numpy as np


def default_nlist(n: int) -> int:
    """``nlist_method="sqrt"``: about 2·sqrt(N) clusters (about sqrt(N)/2 members each), a power of two, at least 8."""
    return int(2 ** max(3, round(math.log2(2 * math.sqrt(max(n, 1))))))


AUTO_BUDGET_FLOOR = 12  # B ≥ 12·k: the candidates real embeddings want at any size (see auto_candidate_budget)
AUTO_BUDGET_SCALE = 48.0  # m₀: members per cluster at which the size term reaches k
AUTO_BUDGET_POWER = 1.5


def auto_candidate_budget(n: int, nlist: int, k: int = 10) -> int:
    """The global candidate budget for ``candidate_budget=0``, from ``m = N/nlist`` (mean members per
    cluster): ``B = max(12·k, ⌈k·(m/48)^1.5⌉)``. At the default ``nlist`` ≈ 2·sqrt(N) this grows about as
    N^0.75: 120 at 100k (nlist 512), 325 at 1M (2048), 1283 at 5M (4096), for k = 10.

    Why this shape (measured on the 2-core development machine, 2026-11-23, ``gaussian_vectors`` with 2048
    modes, 300 queries after 3000 warm-up ones, recall@10 against exact search, dynamic selection):

    * On the Gaussian mixture recall is limited by the re-ranked budget, not by the clusters reached: the
      true top-10 sit in one or two clusters, and with 48-byte (non-residual, 4-bit fast-scan) codes their
      PQ ranks among the many near-equidistant members of their mode grow with the density. The budget for
      recall@10 ≥ 0.95 grows faster than ``m``: about 40 at 100k (m = 195; B 32 → 0.917, 48 → 0.987),
      256 at 1M (m = 488; 256 → 0.956, 320 → 0.982), 1024 at 5M (m = 1221; 1024 → 0.950, 1280 → 0.972),
      i.e. a share of a cluster rising from 0.2 to 0.84: no fixed share of ``m`` fits, ``m^1.5`` does
      (``k·(m/48)^1.5`` puts B at 1.3x the measured need at 1M and 5M).
    * On real embeddings (the synthetic world's MiniLM vectors) recall is limited by the clusters reached
      instead, and the budget that reaches them hardly grows with N: 112 gave 0.964 at 100k (README,
      2026-11-22), and at 10k (m = 39) B = 128 gives 0.948, 192 gives 0.959. The floor 12·k covers that.

    Measured with this rule (dynamic selection): 100k B = 120 → recall@10 0.9997; 1M B = 325 → see the
    Pareto sweep of ``python -m kunlunlab.bench retrieval``; 5M B = 1283 → 0.972 (the 1280 point above).
    Limits: at the default nlist, ``m`` does not grow between 5M and 10M (both round to nlist = 4096·2^j
    with the same m), so past 5M pass an explicit budget or nlist; and a nlist far below 2·sqrt(N) (elbow,
    silhouette) makes ``m`` and so B large, which costs time but not recall."""
    m = n / max(nlist, 1)
    return max(AUTO_BUDGET_FLOOR * k, int(math.ceil(k * (m / AUTO_BUDGET_SCALE) ** AUTO_BUDGET_POWER)))


def train_centroids(sample: np.ndarray, nlist: int, iters: int, seed: int) -> tuple[np.ndarray, faiss.Kmeans]:
    """k-means++ seeding (scikit-learn, on at most 8·nlist rows: seeding is O(rows·nlist)) refined by
    spherical k-means (FAISS). Returns the centroids and the trained k-means (its index assigns)."""
    from sklearn.cluster import kmeans_plusplus  # deferred: scikit-learn takes a second to import, only builds need it

    rng = np.random.default_rng(seed)
    seed_rows = sample[rng.choice(len(sample), size=min(len(sample), 8 * nlist), replace=False)]
    init, _ = kmeans_plusplus(seed_rows, n_clusters=nlist, random_state=seed)
    kmeans = faiss.Kmeans(sample.shape[1], nlist, niter=iters, spherical=True, seed=seed, verbose=False,
                          min_points_per_centroid=1)
    kmeans.train(sample, init_centroids=np.ascontiguousarray(init, dtype=np.float32))
    return kmeans.centroids, kmeans


def nlist_grid(n: int) -> list[int]:
    """Coarse candidates for elbow/silhouette: a geometric grid (ratio sqrt 2) from 2·sqrt(N)/16 to
    2·sqrt(N)·2, at least 2 and at most N/8 (the build's cap). The range is wide because a corpus
    with real topical structure can have far fewer clusters than sqrt(N)."""
    centre = 2 * math.sqrt(max(n, 1))
    grid = {int(round(centre * 2 ** (k / 2))) for k in range(-8, 3)}
    return sorted(c for c in grid if 2 <= c <= max(2, n // 8))


def _knee(ks: np.ndarray, inertia: np.ndarray) -> int:
    """Elbow: the candidate farthest below the chord from the first to the last point, both axes
    scaled to [0, 1] with k on a log axis (the "Kneedle" rule; log k because the grid is geometric)."""
    x = np.log(ks)
    x = (x - x[0]) / max(x[-1] - x[0], 1e-12)
    y = (inertia - inertia[-1]) / max(inertia[0] - inertia[-1], 1e-12)
    below_chord = (1.0 - x) - y  # the chord runs from (0, 1) to (1, 0)
    return int(ks[int(np.argmax(below_chord))])


def select_nlist(sample: np.ndarray, method: str, iters: int = 20, seed: int = 0,
                 n_total: int | None = None) -> tuple[int, dict[int, float]]:
    """Number of clusters by the elbow of k-means inertia or by the best silhouette coefficient, the
    way §3.1.1 of arXiv 2506.19466 chooses it. Candidates: ``nlist_grid(n_total)``, then up to 9
    values evenly spread between the coarse winner's neighbours (so the answer is not limited to the
    coarse grid).
    k-means runs on ``sample`` (the same k-means++ + spherical k-means as the build); the silhouette
    is scored on at most 4000 of its rows (it costs O(rows²)). Returns the choice and each
    candidate's criterion (inertia per vector, or silhouette)."""
    from sklearn.metrics import silhouette_score  # deferred: as in train_centroids

    if method not in ("elbow", "silhouette"):
        raise ValueError(f"select_nlist: method must be 'elbow' or 'silhouette', got {method!r}")
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    n = len(sample)
    rng = np.random.default_rng(seed)
    scored_rows = rng.choice(n, size=min(n, 4000), replace=False)
    scores: dict[int, float] = {}

    def evaluate(k: int) -> None:
        if k in scores or not 2 <= k < n:
            return
        centroids, kmeans = train_centroids(sample, k, iters, seed)
        _, assign = kmeans.index.search(sample, 1)
        labels = assign.ravel()
        if method == "elbow":
            scores[k] = float(((sample - centroids[labels]) ** 2).sum(axis=1).mean())
        elif len(np.unique(labels[scored_rows])) < 2:
            scores[k] = -1.0  # silhouette is undefined for one cluster: the worst value
        else:
            scores[k] = float(silhouette_score(sample[scored_rows], labels[scored_rows]))

    def choose() -> int:
        ks = np.array(sorted(scores))
        values = np.array([scores[k] for k in ks])
        return _knee(ks, values) if method == "elbow" else int(ks[int(np.argmax(values))])

    coarse = [k for k in nlist_grid(n_total or n) if k < n]
    if not coarse:
        raise ValueError(f"select_nlist: {n} sample vectors are too few to compare cluster counts")
    for k in coarse:
        evaluate(k)
    best = choose()
    i = coarse.index(best) if best in coarse else 0
    lo, hi = coarse[max(0, i - 1)], coarse[min(len(coarse) - 1, i + 1)]
    for k in np.unique(np.linspace(lo, hi, 9).round().astype(int)):
        evaluate(int(k))
    return choose(), scores
