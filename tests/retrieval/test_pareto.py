"""pareto_sweep and best_at (python -m kunlunlab.bench retrieval --pareto), the nearest-cluster ablation of dynamic
sampling, and the auto candidate budget; checked against values written or computed here (hand-written rows,
brute-force centroid rankings and cluster sizes by numpy, exact search by numpy)."""
import faiss
import numpy as np
import pytest

from conftest import exact_top
from kunlunlab.bench import gaussian_vectors
from kunlunlab.retrieval import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.cluster_sizing import auto_candidate_budget
from kunlunlab.retrieval.pareto import PARETO_FAMILIES, ParetoGrids, best_at, pareto_sweep

DIM, K = 64, 10
SMALL = ParetoGrids(ef_search=(16, 200), ivf_nprobe=(1, 1000), ivfpq_nprobe=(4,), refine_nprobe=(4, 32),
                    refine_k_factor=(2, 8), budget_shares=(0.5, 1.0), nearest_nprobe=(2, 32))


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def data():
    return gaussian_vectors(2000, 40, dim=DIM, n_modes=24, seed=3)


@pytest.fixture(scope="module")
def pareto(data):
    vectors, queries = data
    config = ClusterConfig(nlist=32, pq_m=8, seed=0, candidate_budget=64)
    return pareto_sweep(vectors, queries, k=K, cluster_config=config, grids=SMALL)


def test_pareto_rows_have_the_fields_and_every_family(pareto):
    assert [f for f in dict.fromkeys(r["family"] for r in pareto)] == list(PARETO_FAMILIES)
    for row in pareto:
        assert {"family", "setting", "ms", "recall_at_10", "bytes_per_vector", "disk_bytes_per_vector"} <= set(row)
        assert row["ms"] > 0 and 0.0 <= row["recall_at_10"] <= 1.0
    settings = {(r["family"], r["setting"]) for r in pareto}
    # nprobe 1000 is clipped to the 32 lists; k_factor and nprobe are crossed; budgets are shares of 64
    assert ("ivf_flat", "nlist=32,nprobe=32") in settings
    assert {s for f, s in settings if f == "ivfpq_refine"} == {
        f"nlist=32,nprobe={n},k_factor={kf}" for n in (4, 32) for kf in (2, 8)}
    assert {s for f, s in settings if f == "cluster"} == {"budget=32", "budget=64"}
    assert {s for f, s in settings if f == "cluster_nearest"} == {
        "budget=32,fill", "budget=64,fill", "budget=64,nprobe=2", "budget=64,nprobe=32"}
    assert {s for f, s in settings if f == "hnsw"} == {"M=32,efC=80,efSearch=16", "M=32,efC=80,efSearch=200"}


def test_pareto_recall_and_memory_against_values_known_here(data, pareto):
    vectors, queries = data
    rows = {(r["family"], r["setting"]): r for r in pareto}
    assert rows["flat", "exact"]["recall_at_10"] == 1.0
    # every list probed: IVF-Flat is exhaustive search
    assert rows["ivf_flat", "nlist=32,nprobe=32"]["recall_at_10"] == 1.0
    assert rows["flat", "exact"]["bytes_per_vector"] == pytest.approx(4 * DIM, rel=0.01)
    for family in ("hnsw", "ivf_flat", "ivfpq_refine"):  # these keep the float vectors in RAM
        assert all(r["bytes_per_vector"] > 4 * DIM for r in pareto if r["family"] == family)
    for family in ("cluster", "cluster_nearest"):  # these read them from a memory-mapped file
        assert all(r["disk_bytes_per_vector"] == 4 * DIM and r["bytes_per_vector"] < 4 * DIM
                   for r in pareto if r["family"] == family)
    # the nearest ablation with every cluster probed and 64 candidates re-ranked exactly, by numpy
    cluster = ClusterRetriever(DIM, ClusterConfig(nlist=32, pq_m=8, seed=0, candidate_budget=64,
                                                  selection="nearest", nearest_nprobe=32)).build(vectors)
    found = np.stack([cluster.search(q, K)[1][0] for q in queries])
    truth = exact_top(vectors, queries, K)
    share = np.mean([len(set(f) & set(t)) / K for f, t in zip(found.tolist(), truth.tolist())])
    assert rows["cluster_nearest", "budget=64,nprobe=32"]["recall_at_10"] == pytest.approx(share)


def test_best_at_picks_the_fastest_row_above_the_threshold():
    rows = [{"family": "a", "setting": "x1", "ms": 1.0, "recall_at_10": 0.90},
            {"family": "a", "setting": "x2", "ms": 2.0, "recall_at_10": 0.96},
            {"family": "b", "setting": "y1", "ms": 0.5, "recall_at_10": 0.80},
            {"family": "a", "setting": "x3", "ms": 3.0, "recall_at_10": 0.99},
            {"family": "a", "setting": "x4", "ms": 1.5, "recall_at_10": 0.95},  # exactly at the threshold counts
            {"family": "b", "setting": "y2", "ms": 0.7, "recall_at_10": 0.93}]
    best = best_at(rows, 0.95)
    assert list(best) == ["a", "b"]
    assert best["a"] == {"best": rows[4], "max_recall_at_10": 0.99}
    assert best["b"] == {"best": None, "max_recall_at_10": 0.93}
    assert best_at(rows, 0.97)["a"]["best"]["setting"] == "x3"
    assert best_at(rows, 0.5)["b"]["best"]["setting"] == "y1"
    assert best_at([{"family": "c", "setting": "z", "ms": 1.0, "recall_at_5": 0.9}], 0.95, k=5) == {
        "c": {"best": None, "max_recall_at_5": 0.9}}


def scans_of(cluster: ClusterRetriever, query: np.ndarray) -> set[int]:
    """The clusters the IVF scan is asked to probe for one query (a spy on search_preassigned)."""
    seen: list[int] = []
    scan = cluster.ivf.search_preassigned

    def spy(x, k, assign, *args, **kwargs):
        seen.extend(assign[assign >= 0].tolist())
        return scan(x, k, assign, *args, **kwargs)

    cluster.ivf.search_preassigned = spy
    try:
        cluster.search(query[None, :], K)
    finally:
        cluster.ivf.search_preassigned = scan
    return set(seen)


def test_nearest_selection_scans_exactly_the_nearest_clusters(data):
    vectors, queries = data
    cluster = ClusterRetriever(DIM, ClusterConfig(nlist=32, pq_m=8, seed=0, selection="nearest",
                                                  nearest_nprobe=5)).build(vectors)
    weights, step = cluster.weights.copy(), cluster.step
    # brute force: centroid ranking and cluster sizes by numpy (every vector to its best centroid)
    ranking = np.argsort(-(queries @ cluster.centroids.T), axis=1)
    sizes = np.bincount(np.argmax(vectors @ cluster.centroids.T, axis=1), minlength=32)
    for q, order in zip(queries[:10], ranking):
        assert scans_of(cluster, q) == set(order[:5].tolist())
    # fill mode: the nearest clusters until their members reach the budget
    cluster.config.nearest_nprobe, cluster.config.candidate_budget = 0, 150
    for q, order in zip(queries[:10], ranking):
        filled = np.cumsum(sizes[order])
        taken = int(np.searchsorted(filled, 150)) + 1  # the first prefix holding ≥ 150 members
        assert scans_of(cluster, q) == set(order[:taken].tolist())
        hits = cluster.search(q, K)[1][0]
        assert set(np.argmax(vectors[hits] @ cluster.centroids.T, axis=1).tolist()) <= set(order[:taken].tolist())
    # no sampling, no weights: serving queries moves neither the EMA weights nor the annealing clock
    cluster.search(queries, K)
    np.testing.assert_array_equal(cluster.weights, weights)
    assert cluster.step == step


def test_auto_budget_follows_the_rule_and_grows_with_n(data):
    # B = max(12·k, ceil(k·(m/48)^1.5)) with m = N/nlist, worked by hand at the default nlist of each size:
    # 100k/512: m = 195.3, 10·4.069^1.5 = 82.1 → the floor 120; 1M/2048: m = 488.3, 10·10.17^1.5 = 324.4 → 325;
    # 5M/4096: m = 1220.7, 10·25.43^1.5 = 1282.5 → 1283
    assert [auto_candidate_budget(n, nlist) for n, nlist in ((100_000, 512), (1_000_000, 2048), (5_000_000, 4096))] \
        == [120, 325, 1283]
    assert auto_candidate_budget(100_000, 512, k=5) == 60 and auto_candidate_budget(1_000_000, 2048, k=5) == 163
    # a built index resolves candidate_budget=0 from its own size: 4000 vectors in 4 lists, m = 1000,
    # 10·20.83^1.5 = 950.9 → 951; half the vectors, m = 500, 10·10.42^1.5 = 336.2 → 337
    vectors, _ = data
    big = np.concatenate([vectors, vectors + 1e-3])
    budgets = [ClusterRetriever(DIM, ClusterConfig(nlist=4, pq_m=8, candidate_budget=0)).build(x).budget(10)
               for x in (vectors, big)]
    assert budgets == [337, 951]
    # an explicit budget is used as it is (at least k)
    explicit = ClusterRetriever(DIM, ClusterConfig(nlist=4, pq_m=8, candidate_budget=50)).build(vectors)
    assert explicit.budget(10) == 50 and explicit.budget(64) == 64
    with pytest.raises(ValueError, match="candidate_budget"):
        ClusterRetriever(DIM, ClusterConfig(candidate_budget=-1))
    with pytest.raises(ValueError, match="selection must be"):
        ClusterRetriever(DIM, ClusterConfig(selection="random"))


def test_dynamic_vs_nearest_pairs_equal_budgets_and_states_the_verdict():
    from kunlunlab.retrieval.pareto import dynamic_vs_nearest

    def row(family, setting, budget, recall, ms):
        return {"family": family, "setting": setting, "budget": budget, "recall_at_10": recall, "ms": ms}

    rows = [row("cluster", "budget=64", 64, 0.90, 0.20), row("cluster", "budget=128", 128, 0.95, 0.30),
            row("cluster", "budget=256", 256, 0.97, 0.40),
            row("cluster_nearest", "budget=64,fill", 64, 0.88, 0.10),
            row("cluster_nearest", "budget=128,fill", 128, 0.951, 0.20),
            row("cluster_nearest", "budget=128,nprobe=4", 128, 0.99, 0.50),  # not a fill row: not paired
            row("cluster_nearest", "budget=512,fill", 512, 0.99, 0.60)]      # no dynamic row at 512
    result = dynamic_vs_nearest(rows)
    assert [p["budget"] for p in result["pairs"]] == [64, 128]
    assert [p["recall_gain"] for p in result["pairs"]] == [0.02, -0.001]
    assert (result["wins"], result["ties"], result["losses"]) == (1, 1, 0)
    assert result["mean_recall_gain"] == pytest.approx(0.0095)
    assert result["verdict"].startswith("Dynamic sampling beats") and "over 2 budgets" in result["verdict"]
    # plain nprobe at the budget it was swept at (128): nprobe=4 reaches dynamic's 0.95 (0.99), in 0.50 ms
    assert result["nprobe_match"]["setting"] == "budget=128,nprobe=4"
    assert "nprobe=4 in 0.500 ms" in result["verdict"]
    rows[0]["recall_at_10"] = 0.87  # now 0.87 vs 0.88 and 0.95 vs 0.951: no gain
    rows[5]["recall_at_10"] = 0.90  # and the nprobe row below dynamic's 0.95 at budget 128
    result = dynamic_vs_nearest(rows)
    assert result["verdict"].startswith("Dynamic sampling does not beat") and result["nprobe_match"] is None
    assert "does not reach it at any nprobe swept (best 0.9000)" in result["verdict"]
    with pytest.raises(ValueError, match="no budget"):
        dynamic_vs_nearest([r for r in rows if r["family"] == "cluster"])


def test_pareto_figure_exports_one_trace_per_family_and_a_clear_error_without_kaleido(pareto, tmp_path,
                                                                                       monkeypatch):
    import builtins

    from kunlunlab.viz.figures import export_figure, pareto_figure

    fig = pareto_figure(pareto, k=K, subtitle="gaussian vectors, N = 2,000")
    assert [t.name for t in fig.data] == list(PARETO_FAMILIES)
    assert "N = 2,000" in fig.layout.title.text
    html = export_figure(fig, tmp_path / "figs" / "pareto.html")
    assert html.exists() and "plotly" in html.read_text()[:5000].lower()

    real_import = builtins.__import__

    def no_kaleido(name, *args, **kwargs):
        if name == "kaleido":
            raise ImportError("no kaleido here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kaleido)
    with pytest.raises(RuntimeError, match="needs kaleido"):
        export_figure(fig, tmp_path / "pareto.png")
    assert not (tmp_path / "pareto.png").exists()
