"""NLR: policy-gradient training moves the policy to the better tier; routing merges, falls back, talks HTTP."""
import numpy as np
from fastapi import FastAPI

from kunlunlab.agent.nlr import (ACTIONS, NLRConfig, NetworkLocalRouter, RoutingPolicy, SearxngClient, merge_hits,
                                 state_features)
from kunlunlab.retrieval import IndexConfig, build_retriever
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.retrieval.service import RetrievalClient, ServiceThread, free_port


def test_policy_gradient_learns_local_for_covered_queries_and_network_for_the_rest():
    # Constructed case: queries about entities with a year (digits) are only in the wide network corpus;
    # the rest are in the local index, where the network adds only latency.
    rng = np.random.default_rng(0)
    local_queries = [f"who directed the film {w}" for w in ("Amber", "Basalt", "Cobalt", "Dune", "Ember", "Flint")]
    net_queries = [f"what happened in {1900 + int(y)} in Oslo" for y in rng.integers(0, 99, 6)]
    states = np.stack([state_features(q) for q in local_queries + net_queries])
    recall = np.array([[1, 1, 1]] * 6 + [[0, 1, 1]] * 6, dtype=np.float32)
    latency = np.array([[5, 150, 150]] * 12, dtype=np.float32)
    policy = RoutingPolicy(NLRConfig(epochs=300, seed=0))
    before = policy.probabilities(states)
    history = policy.train(states, recall, latency)
    after = policy.probabilities(states)
    local, network = ACTIONS.index("local"), ACTIONS.index("network")
    assert after[:6, local].mean() > 0.8 > before[:6, local].mean()
    assert after[6:, [network, ACTIONS.index("both")]].sum(1).mean() > 0.8
    assert history[-1]["greedy_reward"] > history[0]["greedy_reward"]
    assert abs(history[-1]["greedy_reward"] - history[-1]["oracle_reward"]) < 0.05


def test_merge_deduplicates_by_id_and_text():
    a = [Hit("1", "x", 1.0), Hit("2", "y", 0.9)]
    b = [Hit("n1", "x", 0.8), Hit("3", "z", 0.7)]
    assert [h.id for h in merge_hits([a, b], 5)] == ["1", "2", "3"]


def test_router_over_a_real_network_service_and_its_fallback(world):
    local = build_retriever(world.passages[:700], IndexConfig(kind="bm25"))
    wide = build_retriever(world.passages, IndexConfig(kind="bm25"))
    gold = world.passages[1200]
    with ServiceThread(wide, added_latency_ms=30) as url:
        client = RetrievalClient(url)
        router = NetworkLocalRouter(local.search, client.search, fixed_action="both")
        hits = router([gold.title], 3)[0]
        assert gold.id in {h.id for h in hits}
        states, recall, latency = NetworkLocalRouter(local.search, client.search).collect(
            [gold.title, world.passages[3].title], [{gold.id}, {world.passages[3].id}], k=3)
        assert recall[0].tolist() == [0.0, 1.0, 1.0] and recall[1, 0] == 1.0
        assert (latency[:, 1] >= 30).all() and (latency[:, 0] < latency[:, 1]).all()
    dead = RetrievalClient(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0, backoff=0)
    router = NetworkLocalRouter(local.search, dead.search, fixed_action="network")
    hits = router([world.passages[3].title], 3)[0]
    assert hits and router.stats.network_errors == 1 and "unavailable" in router.stats.last_error


def test_searxng_client_reads_the_json_api():
    app = FastAPI()

    @app.get("/search")
    def search(q: str, format: str):
        return {"results": [{"url": f"https://e.org/{q}/{i}", "title": f"T{i}", "content": f"about {q}"}
                            for i in range(5)]}

    with ServiceThread(app=app) as url:
        hits = SearxngClient(url)(["alpha", "beta"], 2)
    assert [[h.id for h in hs] for hs in hits] == [["https://e.org/alpha/0", "https://e.org/alpha/1"],
                                                 ["https://e.org/beta/0", "https://e.org/beta/1"]]
    assert hits[0][0].contents == '"T0"\nabout alpha'


def test_policy_save_load_roundtrip(tmp_path):
    policy = RoutingPolicy(NLRConfig(seed=3))
    policy.save(tmp_path / "p.pt")
    states = np.stack([state_features("who is x"), state_features("when was 1999")])
    assert np.allclose(RoutingPolicy.load(tmp_path / "p.pt").probabilities(states), policy.probabilities(states))
