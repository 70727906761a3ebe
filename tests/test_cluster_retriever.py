import numpy as np
import pytest

from conftest import exact_top
from kunlunlab.retrieval import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.evaluation import recall_at_k


@pytest.fixture(scope="module", params=["exact", "pq"])
def built(request, vectors):
    config = ClusterConfig(nlist=32, adapt=False, seed=0, rerank=request.param)
    return ClusterRetriever(vectors.shape[1], config).build(vectors)


def test_recall_against_exact_search(built, vectors, query_vectors):
    truth = exact_top(vectors, query_vectors, 10)
    _, rows = built.search(query_vectors, 10)
    # exact re-ranking must match exact search; in-RAM PQ reconstruction on a 1.5k corpus is coarser
    assert recall_at_k(rows, truth) >= (0.97 if built.config.rerank == "exact" else 0.85)


def test_exact_rerank_keeps_vectors_out_of_ram_accounting(built):
    if built.config.rerank == "exact":
        assert built.disk_bytes_per_vector() == 4 * built.dim
    else:
        assert built.disk_bytes_per_vector() == 0 and built.refine_codes.shape == (built.ntotal, built.config.refine_m)


def test_dimension_that_does_not_fit_the_codes_is_a_clear_error():
    x = np.random.default_rng(0).normal(size=(500, 100)).astype(np.float32)
    with pytest.raises(ValueError, match="dimension 100 must be divisible by the 96 scan sub-quantizers"):
        ClusterRetriever(100, ClusterConfig(nlist=8)).build(x)


def test_unknown_rerank_mode_is_refused():
    with pytest.raises(ValueError, match="rerank must be"):
        ClusterRetriever(8, ClusterConfig(rerank="magic"))


def test_tables_are_consistent(built, vectors):
    assert built.ntotal == len(vectors)
    assert built.cluster_sizes.sum() == len(vectors)
    for cluster in range(built.nlist):
        members = built.cluster_members(cluster)
        assert (built.doc_cluster[members] == cluster).all()


def test_rerank_scores_equal_dot_products_of_reconstructed_vectors(built, query_vectors):
    scores, rows = built.search(query_vectors[:5], 10)
    for q, s, r in zip(query_vectors[:5], scores, rows):
        np.testing.assert_allclose(built.reconstruct(r) @ q, s, atol=1e-4)
        assert (np.diff(s) <= 1e-6).all()  # best first


def test_batch_search_equals_one_at_a_time(built, query_vectors):
    _, batch = built.search(query_vectors[:20], 10)
    single = np.stack([built.search(q, 10)[1][0] for q in query_vectors[:20]])
    np.testing.assert_array_equal(batch, single)


def test_temperature_anneals_and_floor_holds(vectors, query_vectors):
    cr = ClusterRetriever(vectors.shape[1], ClusterConfig(nlist=32, anneal_queries=50)).build(vectors)
    t0 = cr.temperature()
    cr.search(query_vectors, 10)
    assert cr.temperature() < t0
    scores, clusters = cr.ivf.quantizer.search(query_vectors[:3], 16)
    p = cr.cluster_probabilities(scores, clusters)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-6)
    assert (p >= cr.config.min_share / (1 + 16 * cr.config.min_share) - 1e-9).all()


def test_ema_weights_move_toward_hit_clusters(vectors, query_vectors):
    cr = ClusterRetriever(vectors.shape[1], ClusterConfig(nlist=32, ema_decay=0.9)).build(vectors)
    assert np.allclose(cr.weights, 1.0)
    for _ in range(4):
        _, rows = cr.search(np.repeat(query_vectors[:1], 32, axis=0), 10)
    hit_clusters = np.unique(cr.doc_cluster[rows[0]])
    assert (cr.weights[hit_clusters] > 1.0).all()
    assert cr.weights.min() >= 1 / cr.config.weight_clip and cr.weights.max() <= cr.config.weight_clip


def test_empty_clusters_get_no_share_and_results_never_short(vectors, query_vectors):
    cr = ClusterRetriever(vectors.shape[1], ClusterConfig(nlist=32, adapt=False)).build(vectors)
    scores, clusters = cr.ivf.quantizer.search(query_vectors[:1], 8)
    cr.cluster_sizes = cr.cluster_sizes.copy()
    cr.cluster_sizes[clusters[0, 0]] = 0  # pretend the nearest cluster is empty
    cr.refresh_tables()
    p = cr.cluster_probabilities(scores, clusters)
    assert p[0, 0] == 0 and p[0, 1:].sum() == pytest.approx(1.0)
    # A budget smaller than k and tiny clusters: the fallback still fills k results.
    cr.config.candidate_budget, cr.config.max_clusters = 4, 1
    _, rows = cr.search(query_vectors[:4], 20)
    assert (rows >= 0).all() and all(len(set(r)) == 20 for r in rows)
    _, single = cr.search(query_vectors[0], 20)  # the single-query path takes the fallback too
    np.testing.assert_array_equal(single[0], rows[0])


@pytest.mark.parametrize("rerank", ["exact", "pq"])
def test_ram_is_an_eighth_of_flat_at_scale(rerank):
    from kunlunlab.bench import gaussian_vectors

    x, _ = gaussian_vectors(30_000, 10, seed=1)
    cr = ClusterRetriever(x.shape[1], ClusterConfig(nlist=256, kmeans_iters=4, rerank=rerank)).build(x)
    assert cr.bytes_per_vector() <= 1536 / 8


def test_single_query_fallback_may_consider_more_clusters_than_max_clusters(vectors, query_vectors):
    # 8 considered clusters of ~23 vectors cannot fill k=200, so the fallback widens to 32 clusters.
    cr = ClusterRetriever(vectors.shape[1], ClusterConfig(nlist=64, max_clusters=8, adapt=False)).build(vectors)
    _, rows = cr.search(query_vectors[0], 200)
    assert (rows >= 0).all() and len(set(rows[0])) == 200
