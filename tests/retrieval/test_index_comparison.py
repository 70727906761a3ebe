"""compare_indexes (notebook 01 and `python -m kunlunlab.bench retrieval`) and cluster_allocation, checked against
values computed here: exact top-k by numpy, recall by counting overlaps, the sampling distribution from its formula."""
import json
import math

import faiss
import numpy as np
import pytest

from conftest import exact_top
from kunlunlab.bench import gaussian_vectors, main
from kunlunlab.retrieval import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.evaluation import (COMPARED_KINDS, INDEX_NAMES, cluster_allocation, compare_indexes,
                                           evidence_recall)

DIM, K = 64, 10
# adapt=False: the clock and the weights stand still, so a search can be repeated exactly
CONFIG = ClusterConfig(nlist=32, pq_m=8, refine_m=16, seed=0, adapt=False)


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    """Builds use the FAISS threads there are when compare_indexes starts: one here, which on a shared 2-core
    machine is several times faster than two threads contending with other work."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def data():
    return gaussian_vectors(2000, 50, dim=DIM, n_modes=24, seed=3)


@pytest.fixture(scope="module")
def comparison(data):
    vectors, queries = data
    return compare_indexes(vectors, queries, COMPARED_KINDS, k=K, nprobe_grid=(1, 4, 1000), budget_grid=(16, 64),
                           cluster_config=CONFIG)


def overlap(search, queries, truth) -> float:
    """Recall@k, one query at a time, counted here rather than with recall_at_k."""
    shares = []
    for q, t in zip(queries, truth):
        found = search(q[None, :], K)[1][0]
        shares.append(len(set(found.tolist()) & set(t.tolist())) / K)
    return sum(shares) / len(shares)


def test_truth_is_the_exact_top_k(data, comparison):
    vectors, queries = data
    expected = exact_top(vectors, queries, K)
    assert [set(r) for r in comparison.truth.tolist()] == [set(r) for r in expected.tolist()]


def test_rows_cover_every_index_and_setting(comparison):
    got = [(r.kind, r.index, r.knob, r.value) for r in comparison.rows]
    assert got == [("flat", "exact Flat", None, None),
                   ("ivfpq", "IVF-PQ", "nprobe", 1.0), ("ivfpq", "IVF-PQ", "nprobe", 4.0),
                   ("ivfpq", "IVF-PQ", "nprobe", 32.0),  # 1000 is clipped to nlist = 32: every list scanned
                   ("hnsw", "HNSW", None, None),
                   ("cluster", "cluster retriever", "budget", 16.0), ("cluster", "cluster retriever", "budget", 64.0),
                   ("cluster_pq", "cluster retriever, rerank=pq", None, None)]
    assert all(r.ms_per_query > 0 for r in comparison.rows)
    assert {r.index for r in comparison.curves()} == {"IVF-PQ", "cluster retriever"}
    assert set(comparison.single_points()) == {"exact Flat", "HNSW", "cluster retriever, rerank=pq"}
    assert list(comparison.memory()) == [INDEX_NAMES[k] for k in ("flat", "ivfpq", "hnsw", "cluster", "cluster_pq")]


def test_each_recall_is_the_overlap_with_exact_search(data, comparison):
    _, queries = data
    truth = exact_top(data[0], queries, K)
    assert comparison.row("flat").recall_at_k == 1.0
    ivfpq = comparison.indexes["ivfpq"]
    for row in comparison.rows_of("ivfpq"):
        nprobe = int(row.value)
        assert row.recall_at_k == pytest.approx(overlap(lambda q, k: ivfpq.search(q, k, nprobe=nprobe), queries, truth))
    cluster = comparison.indexes["cluster"]
    for row in comparison.rows_of("cluster"):
        cluster.config.candidate_budget = int(row.value)
        try:
            assert row.recall_at_k == pytest.approx(overlap(cluster.search, queries, truth))
        finally:
            cluster.config.candidate_budget = CONFIG.candidate_budget
    hnsw = comparison.indexes["hnsw"]
    assert comparison.row("hnsw").recall_at_k == pytest.approx(overlap(hnsw.search, queries, truth))


def test_memory_per_vector(comparison):
    # Flat stores the float32 vectors: 4 bytes per dimension (plus a header shared by 2000 vectors)
    assert comparison.row("flat").bytes_per_vector == pytest.approx(4 * DIM, rel=0.01)
    assert comparison.row("flat").disk_bytes_per_vector == 0.0
    # the exact-rerank cluster retriever reads float32 rows from a memory-mapped file; rerank="pq" reads nothing
    assert comparison.row("cluster").disk_bytes_per_vector == 4 * DIM
    assert comparison.row("cluster_pq").disk_bytes_per_vector == 0.0
    assert comparison.row("cluster").bytes_per_vector < comparison.row("flat").bytes_per_vector


def test_metrics_summarise_the_rows(comparison):
    m = comparison.metrics()
    flat_ms = comparison.row("flat").ms_per_query
    rows = {r.value: r for r in comparison.rows_of("cluster")}
    assert [p["nprobe"] for p in m["ivfpq"]] == [1, 4, 32]
    assert [p["budget"] for p in m["cluster"]] == [16, 64]
    assert m["cluster"][1]["recall_at_10"] == round(rows[64.0].recall_at_k, 4)
    # the default budget (112) is nearest the 64 point of this grid
    assert m["cluster_speedup_vs_flat"] == round(flat_ms / rows[64.0].ms_per_query, 2)
    assert set(m["single_points"]) == {"exact Flat", "HNSW", "cluster retriever, rerank=pq"}
    assert m["nlist"] == 32 and m["n_vectors"] == 2000 and m["cluster_disk_bytes_per_vector"] == 4 * DIM
    json.dumps(m)  # JSON-ready


def test_settings_are_restored_and_the_config_is_not_changed(data):
    vectors, queries = data
    config = ClusterConfig(nlist=16, pq_m=8, seed=1)
    result = compare_indexes(vectors[:800], queries[:10], (), k=K, threads=2, cluster_config=config)
    assert faiss.omp_get_max_threads() == 1  # the build setting is back after timing with 2 threads
    assert config.candidate_budget == ClusterConfig().candidate_budget and config.rerank == "exact"
    assert result.indexes["cluster"].config is not config
    # only the two that always run; the cluster retriever at its configured budget
    assert [(r.kind, r.value) for r in result.rows] == [("flat", None), ("cluster", float(config.candidate_budget))]
    with pytest.raises(ValueError, match=r"unknown index kinds \['annoy'\]"):
        compare_indexes(vectors[:800], queries[:10], ("annoy",))


def test_cluster_allocation_follows_the_sampling_formula_and_matches_search(data):
    vectors, queries = data
    config = ClusterConfig(nlist=32, pq_m=8, seed=0, adapt=False, max_clusters=12)
    cluster = ClusterRetriever(DIM, config).build(vectors)
    rng = np.random.default_rng(0)
    cluster.weights = rng.uniform(0.25, 4.0, cluster.nlist).astype(np.float32)
    cluster.step = 500
    cluster.refresh_tables()
    c = cluster.config
    temperature = c.temperature_end + (c.temperature_start - c.temperature_end) * math.exp(-500 / c.anneal_queries)
    assert cluster.temperature() == pytest.approx(temperature)
    for q in queries[:8]:
        rows = cluster_allocation(cluster, q, k=K)
        assert len(rows) == 12 and rows[0]["scanned"]
        s = np.array([r["score"] for r in rows])
        np.testing.assert_allclose(s, np.sort(cluster.centroids @ q)[::-1][:12], rtol=1e-5, atol=1e-6)
        logits = s / temperature + c.weight_strength * np.log([r["weight"] for r in rows])
        soft = np.exp(logits - logits.max())
        soft /= soft.sum()
        floored = np.maximum(soft, c.min_share)
        np.testing.assert_allclose([r["probability"] for r in rows], floored / floored.sum(), rtol=1e-4, atol=1e-7)
        quotas = np.array([r["quota"] for r in rows])
        assert quotas.sum() == pytest.approx(c.candidate_budget, rel=1e-5)
        for r in rows:
            if r["quota"] >= 1:
                assert r["scanned"] and r["cap"] == math.ceil(r["quota"])
            elif r["scanned"] and r["rank"] > 0:
                assert r["cap"] == c.explore_slots
        sub_unit = quotas[quotas < 1].sum() / c.explore_slots
        drawn = sum(r["scanned"] for r in rows[1:] if r["quota"] < 1)
        assert math.floor(sub_unit) <= drawn <= math.ceil(sub_unit)
        # the hits of the real search come from the clusters this allocation scans
        hits = cluster.search(q[None, :], K)[1][0]
        assert set(cluster.doc_cluster[hits].tolist()) <= {r["cluster"] for r in rows if r["scanned"]}
    assert cluster.step == 500  # neither the allocation nor the adapt=False search moved the clock


@pytest.mark.slow
def test_bench_prints_the_same_json_keys(capsys, monkeypatch):
    import kunlunlab.retrieval.pareto as pareto

    # one or two settings per family: the JSON's shape is under test here, the grids in tests/retrieval/test_pareto.py
    small = pareto.ParetoGrids(ef_search=(16,), ivf_nprobe=(4,), ivfpq_nprobe=(8,), refine_nprobe=(4,),
                               refine_k_factor=(4,), budget_shares=(1.0, 2.0), nearest_nprobe=(4,))
    monkeypatch.setattr(pareto, "ParetoGrids", lambda: small)
    assert main(["retrieval", "--mode", "gaussian", "--n", "1200", "--queries", "30", "--warmup-queries", "32",
                 "--repeats", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(result) == [
        "n_vectors", "dim", "mode", "threads", "queries", "repeats", "flat_ms", "ivfpq_ms", "cluster_ms",
        "ivfpq_recall_at_10", "cluster_recall_at_10", "speedup_vs_flat", "bytes_per_vector", "disk_bytes_per_vector",
        "cluster_pq_ms", "cluster_pq_recall_at_10", "cluster_pq_speedup_vs_flat", "cluster_pq_bytes_per_vector",
        "flat_bytes_per_vector", "ivfpq_bytes_per_vector", "ivfpq_nprobe", "nlist", "cluster_temperature",
        "cluster_build_s", "cluster_budget", "pareto", "best_at_095", "pareto_s"]
    assert result["n_vectors"] == 1200 and result["dim"] == 384 and result["queries"] == 30
    assert result["disk_bytes_per_vector"] == 4 * 384 and result["flat_bytes_per_vector"] == pytest.approx(4 * 384, rel=0.01)
    # printed to 2 decimals: at this size the cluster retriever is ~20x slower than Flat, a speedup of ~0.05
    assert result["speedup_vs_flat"] == pytest.approx(result["flat_ms"] / result["cluster_ms"], rel=0.05, abs=0.005)
    assert result["ivfpq_nprobe"] == 16 and result["nlist"] == 64
    # 32 warm-up queries served by each cluster retriever, then 30 timed ones: the annealing clock at 62
    assert result["cluster_temperature"] == pytest.approx(0.05 + 0.45 * math.exp(-62 / 1000), abs=1e-4)
    # the Pareto sweep (on by default): every family, Flat's row is the comparison's, best_at per family
    families = ["flat", "hnsw", "ivfpq", "ivf_flat", "ivfpq_refine", "cluster", "cluster_nearest"]
    assert list(dict.fromkeys(r["family"] for r in result["pareto"])) == families
    assert list(result["best_at_095"]) == families
    assert result["pareto"][0] == {"family": "flat", "setting": "exact", "ms": result["flat_ms"], "recall_at_10": 1.0,
                                   "bytes_per_vector": result["flat_bytes_per_vector"], "disk_bytes_per_vector": 0.0}
    assert f"budget={result['cluster_budget']}" in {r["setting"] for r in result["pareto"] if r["family"] == "cluster"}
    assert main(["retrieval", "--mode", "gaussian", "--n", "1200", "--queries", "30", "--warmup-queries", "32",
                 "--repeats", "1", "--no-pareto", "--budget", "40"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "pareto" not in result and result["cluster_budget"] == 40


def test_evidence_recall_per_hop_single_shot_and_titles():
    from types import SimpleNamespace

    from kunlunlab.data.types import Hop, QAExample

    chained = [QAExample("q1", "Who directed the film of A?", ["B"], "world", supporting_ids=["p1", "p2"],
                         chain=[Hop("What film is A in?", "F", "p1"), Hop("Who directed F?", "B", "p2")]),
               QAExample("q2", "Where was C born?", ["D"], "world", supporting_ids=["p3"],
                         chain=[Hop("Where was C born?", "D", "p3")])]
    found = {"What film is A in?": ["p1", "x"], "Who directed F?": ["y", "z"], "Where was C born?": ["p3"],
             "Who directed the film of A?": ["p2", "p9"]}

    def search(texts, k):
        return [[SimpleNamespace(id=i, title=i.upper()) for i in found.get(t, [])[:k]] for t in texts]

    result = evidence_recall({"fake": search}, chained, k=2)
    assert result["gold_recall"] == {"fake": pytest.approx(2 / 3)}  # hops: p1 found, p2 missed, p3 found
    # raw questions: q1 finds 1 of its 2 supports, q2 all of its one
    assert result["single_shot"] == {"fake": {"support_recall": pytest.approx(0.75), "all_supports": 0.5}}
    titled = [QAExample("h1", "Who directed the film of A?", ["B"], "hotpotqa", supporting_titles=["P2", "P7"])]
    assert evidence_recall({"fake": search}, titled, k=2) == {"gold_recall": {"fake": 0.5}, "single_shot": {}}
    assert evidence_recall({"fake": search}, [QAExample("n", "q", ["a"], "x")]) == {"gold_recall": {}, "single_shot": {}}
