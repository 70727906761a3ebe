"""Paired bootstrap over questions: is method A's score on a question set really above method B's?

Two methods evaluated on the *same* questions give paired per-question scores (EM, F1, LJ). A gap
of a few EM points on a few hundred questions is often within noise, and the noise is mostly in
which questions happen to be in the set, not in the methods. The paired bootstrap resamples
question indices with replacement, using the same indices for both methods, and recomputes the
mean difference on each resample; the spread of those differences is the uncertainty of the gap.

``share_diff_le_0`` is the share of resamples where A does not beat B (mean difference ≤ 0). It
behaves like a one-sided p-value for "A > B" (small is good for A) but is a bootstrap share, not
an exact test, so it is named for what it is.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

_CHUNK = 1000  # resamples drawn at once: bounds memory at _CHUNK * n indices


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_resamples: int = 10_000, seed: int = 0,
                     confidence: float = 0.95) -> dict:
    """Percentile interval of mean(a) - mean(b) over resampled question indices (the same for both).

    Returns ``n``, ``mean_a``, ``mean_b``, ``diff`` (mean a - mean b on the full set), ``low`` and
    ``high`` (the percentile interval at ``confidence``), ``share_diff_le_0`` (share of resamples with
    difference ≤ 0), ``n_resamples`` and ``confidence``.
    """
    x = _scores(a, "a")
    y = _scores(b, "b")
    if len(x) != len(y):
        raise ValueError(f"paired bootstrap needs one score per question for both methods; got {len(x)} and "
                         f"{len(y)} scores")
    if len(x) == 0:
        raise ValueError("paired bootstrap needs at least one question; got empty score lists")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    d = x - y
    n = len(d)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, _CHUNK):
        size = min(_CHUNK, n_resamples - start)
        means[start:start + size] = d[rng.integers(0, n, size=(size, n))].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return {"n": n, "mean_a": float(x.mean()), "mean_b": float(y.mean()), "diff": float(d.mean()),
            "low": float(low), "high": float(high), "share_diff_le_0": float(np.mean(means <= 0.0)),
            "n_resamples": n_resamples, "confidence": confidence}


def paired_records(records_a: Sequence[dict], records_b: Sequence[dict], metric: str = "em"
                   ) -> tuple[list[float], list[float]]:
    """Per-question ``metric`` from two evaluation record lists, paired by question ``id``.

    Both runs must cover the same question ids (order may differ) and carry a value for every
    question: a mismatch means the runs are not paired and is an error, not something to paper over.
    """
    by_id_a = _by_id(records_a, "a")
    by_id_b = _by_id(records_b, "b")
    if set(by_id_a) != set(by_id_b):
        only_a, only_b = sorted(set(by_id_a) - set(by_id_b)), sorted(set(by_id_b) - set(by_id_a))
        raise ValueError(f"the runs cover different questions: {len(only_a)} only in a (e.g. {only_a[:3]}), "
                         f"{len(only_b)} only in b (e.g. {only_b[:3]})")
    ids = [str(r["id"]) for r in records_a]
    missing = [i for i in ids if by_id_a[i].get(metric) is None or by_id_b[i].get(metric) is None]
    if missing:
        raise ValueError(f"{len(missing)} questions have no {metric!r} value in one of the runs (e.g. {missing[:3]})")
    return [float(by_id_a[i][metric]) for i in ids], [float(by_id_b[i][metric]) for i in ids]


def _by_id(records: Sequence[dict], label: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in records:
        key = str(r["id"])
        if key in out:
            raise ValueError(f"run {label} has question id {key!r} twice")
        out[key] = r
    return out


def _scores(values: Sequence[float], label: str) -> np.ndarray:
    array = np.asarray(list(values), dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{label} must be a flat sequence of per-question scores")
    if not all(math.isfinite(v) for v in array):
        raise ValueError(f"{label} contains a non-finite score (NaN or inf)")
    return array
