"""NLR (paper §2.4, equations as the paper numbers them): eq. 20's dual-objective reward with eq. 21's latency
and eq. 22's recall terms, the state's outcome features (unnumbered), eq. 23's policy gradient moves the policy
to the better tier; routing merges, falls back and counts a dead tier; train-router end to end."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi import FastAPI

from kunlunlab.agent.nlr import (ACTIONS, FAILURE_FEATURE, N_FEATURES, NLRConfig, NetworkLocalRouter, RoutingPolicy,
                                 SearxngClient, latency_term, merge_hits, network_tier, recall_term, routing_reward,
                                 state_features)
from kunlunlab.retrieval import IndexConfig, build_retriever
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread
from kunlunlab.retrieval.client import RetrievalClient, RetrievalServiceError


def test_reward_is_relative_recall_gain_plus_relative_latency_saving():
    # Eq. 20: r = λ_r G(a) + λ_t S(a); eq. 21: S(a) = (T_ref − T(a)) / T_ref, T_ref = max T; eq. 22:
    # G(a) = (R(a) − R(local)) / max R. Values by hand.
    recall = np.array([[0, 1, 1], [1, 1, 0.5], [0, 0, 0], [0.5, 1, 1]], dtype=np.float32)
    latency = np.array([[5, 155, 155], [10, 110, 110], [4, 104, 104], [2, 202, 202]], dtype=np.float32)
    # eq. 21: the slowest action saves nothing, local saves (T_ref - t_local) / T_ref
    assert np.allclose(latency_term(latency), [[150 / 155, 0, 0], [100 / 110, 0, 0], [100 / 104, 0, 0],
                                               [200 / 202, 0, 0]])
    # eq. 22: gain over local-only, over the best recall of the row; a row where nothing finds the gold is 0
    assert np.allclose(recall_term(recall), [[0, 1, 1], [0, 0, -0.5], [0, 0, 0], [0, 0.5, 0.5]])
    expected = np.array([[0.5 * 150 / 155, 1.0, 1.0],
                         [0.5 * 100 / 110, 0.0, -0.5],
                         [0.5 * 100 / 104, 0.0, 0.0],
                         [0.5 * 200 / 202, 0.5, 0.5]])
    config = NLRConfig(recall_weight=1.0, latency_weight=0.5)
    assert np.allclose(routing_reward(recall, latency, config), expected, atol=1e-6)
    # relative terms: a 10x slower network tier or a doubled recall scale leaves the reward unchanged
    assert np.allclose(routing_reward(recall, latency * 10, config), expected, atol=1e-6)
    assert np.allclose(routing_reward(recall * 2, latency, config), expected, atol=1e-6)
    with pytest.raises(ValueError, match="must both be"):
        routing_reward(recall[:, :2], latency[:, :2], config)


def test_state_features_include_the_retrieval_outcomes():
    # the state (§2.4's prose, no equation number)
    f = state_features("Who directed The Silent River?", searches_so_far=2, context_tokens=512,
                       local_scores=[6.0, 3.0, 1.0], network_failures=2, score_scale=4.0)
    assert f.shape == (N_FEATURES,)
    # history/context, then local top-1 / scale, relative margin (6-3)/6, empty flag, failures / 4
    assert np.allclose(f[-6:], [2 / 8, 512 / 1024, 1.5, 0.5, 0.0, 0.5])
    assert np.allclose(state_features("Who is X?")[-4:], [0.0, 0.0, 1.0, 0.0])  # nothing found locally, no failures
    assert state_features("x", network_failures=10)[FAILURE_FEATURE] == 1.0     # saturates
    assert state_features("x", local_scores=[100.0], score_scale=1.0)[-4] == 2.0  # clipped


def test_policy_gradient_learns_local_for_covered_queries_and_network_for_the_rest():
    # Eq. 23 (REINFORCE with a baseline) on eq. 20's reward.
    # Constructed case: queries about entities with a year (digits) are only in the wide network corpus;
    # the rest are in the local index, where the network adds only latency.
    rng = np.random.default_rng(0)
    local_queries = [f"who directed the film {w}" for w in ("Amber", "Basalt", "Cobalt", "Dune", "Ember", "Flint")]
    net_queries = [f"what happened in {1900 + int(y)} in Oslo" for y in rng.integers(0, 99, 6)]
    states = np.stack([state_features(q) for q in local_queries + net_queries])
    recall = np.array([[1, 1, 1]] * 6 + [[0, 1, 1]] * 6, dtype=np.float32)
    latency = np.array([[5, 155, 155]] * 12, dtype=np.float32)
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


def always(action: str) -> RoutingPolicy:
    """A policy that picks ``action`` whatever the state."""
    import torch

    policy = RoutingPolicy(NLRConfig())
    with torch.no_grad():
        policy.net[-1].weight.zero_()
        policy.net[-1].bias.copy_(torch.tensor([10.0 if a == action else -10.0 for a in ACTIONS]))
    return policy


def test_router_over_a_real_network_service_and_its_fallback(world):
    local = build_retriever(world.passages[:700], IndexConfig(kind="bm25"))
    gold = world.passages[1200]
    with network_tier(world.passages, added_latency_ms=30) as url:
        client = RetrievalClient(url)
        router = NetworkLocalRouter(local.search, client.search, fixed_action="both")
        hits = router([gold.title], 3)[0]
        assert gold.id in {h.id for h in hits}
        table = NetworkLocalRouter(local.search, client.search).collect(
            [gold.title, world.passages[3].title], [{gold.id}, {world.passages[3].id}], k=3)
        assert table.recall[0].tolist() == [0.0, 1.0, 1.0] and table.recall[1, 0] == 1.0
        assert (table.network_ms >= 30).all() and (table.local_ms < table.network_ms).all()
        assert np.allclose(table.latency_ms[:, 1], table.local_ms + table.network_ms)  # the cascade pays both
        assert table.network_ok.all() and table.states().shape == (2, N_FEATURES)
        policy_router = NetworkLocalRouter(local.search, client.search, always("network"))
        hits = policy_router([gold.title, world.passages[3].title], 3)
        assert gold.id in {h.id for h in hits[0]}
        s = policy_router.summary()
        assert s["mode"] == "policy" and s["decisions"] == {"local": 0, "network": 2, "both": 0}
        assert s["network_calls"] == 1 and s["network_errors"] == 0 and s["latency_ms_per_query"] >= 15
    client.close()
    with pytest.raises(RetrievalServiceError, match="unavailable"):  # shut down with the block
        RetrievalClient(url, timeout=1, retries=0).health()


def test_a_dead_network_tier_shows_as_errors_and_local_results_still_come_back(world):
    local = build_retriever(world.passages[:700], IndexConfig(kind="bm25"))
    dead = RetrievalClient(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0, backoff=0)
    queries = [world.passages[3].title, world.passages[5].title]
    expected = [[h.id for h in hits] for hits in local.search(queries, 3)]
    fixed = NetworkLocalRouter(local.search, dead.search, fixed_action="network")
    assert [[h.id for h in hits] for hits in fixed(queries, 3)] == expected
    assert fixed.stats.network_errors == 1 and "unavailable" in fixed.stats.last_error

    router = NetworkLocalRouter(local.search, dead.search, always("both"), failure_window=2)
    assert router.states(queries, [{}, {}], local.search(queries, 3))[:, FAILURE_FEATURE].tolist() == [0.0, 0.0]
    assert [[h.id for h in hits] for hits in router(queries, 3)] == expected
    s = router.summary()
    assert s["network_errors"] == 1 and s["network_failed_queries"] == 2 and s["network_calls"] == 1
    assert s["decisions"]["both"] == 2 and "unavailable" in s["last_error"]
    # the failure enters the next states (the state's failure feature) and leaves them after failure_window quiet calls
    assert router.states(queries, [{}, {}], local.search(queries, 3))[0, FAILURE_FEATURE] == 0.25
    router.fixed_action = "local"
    router(queries, 3)
    router(queries, 3)
    assert router.recent_failures() == 0


def test_searxng_client_reads_the_json_api():
    app = FastAPI()

    @app.get("/search")
    def search(q: str, format: str):
        return {"results": [{"url": f"https://e.org/{q}/{i}", "title": f"T{i}", "content": f"about {q}"}
                            for i in range(5)]}

    with ServerThread(app) as url:
        hits = SearxngClient(url)(["alpha", "beta"], 2)
    assert [[h.id for h in hs] for hs in hits] == [["https://e.org/alpha/0", "https://e.org/alpha/1"],
                                                 ["https://e.org/beta/0", "https://e.org/beta/1"]]
    assert hits[0][0].contents == '"T0"\nabout alpha'


def test_policy_save_load_roundtrip_and_old_layouts_are_refused(tmp_path):
    import torch

    policy = RoutingPolicy(NLRConfig(seed=3, score_scale=2.5), meta={"index_kind": "bm25"})
    policy.save(tmp_path / "p.pt")
    states = np.stack([state_features("who is x"), state_features("when was 1999", local_scores=[3.0, 1.0])])
    loaded = RoutingPolicy.load(tmp_path / "p.pt")
    assert np.allclose(loaded.probabilities(states), policy.probabilities(states))
    assert loaded.config.score_scale == 2.5 and loaded.meta == {"index_kind": "bm25"}
    old = torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    torch.save({"state_dict": old.state_dict(), "config": {"latency_ref_ms": 100.0}}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="13 state features.*train-router"):
        RoutingPolicy.load(tmp_path / "old.pt")


def test_train_router_end_to_end_against_a_loopback_tier(tmp_path, capsys):
    from kunlunlab.cli import main
    from kunlunlab.data import World, make_questions
    from kunlunlab.data.loaders import load_corpus
    from kunlunlab.eval.harness import EvalConfig, build_pipeline

    out, corpus = tmp_path / "router.pt", tmp_path / "local.jsonl"
    assert main(["train-router", "--world-passages", "300", "--questions", "30", "--added-latency-ms", "20",
                 "--epochs", "150", "--out", str(out), "--local-corpus-out", str(corpus)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["network_errors"] == 0 and summary["network_passages"] == 300 and summary["local_passages"] == 150
    assert summary["questions"]["train"] > 10 and summary["queries"]["train"] > 20
    train = summary["train"]
    assert abs(sum(train["actions"].values()) - 1.0) < 1e-3
    assert train["policy"]["recall"] >= train["always_local"]["recall"]
    assert train["always_network"]["recall"] > train["always_local"]["recall"]  # the wider corpus covers more
    assert train["always_network"]["latency_ms"] >= 20 > train["always_local"]["latency_ms"]
    assert train["policy"]["reward"] >= max(train[f"always_{a}"]["reward"] for a in ACTIONS) - 0.05
    assert summary["reward"]["last_epoch"] >= summary["reward"]["first_epoch"]

    # the saved policy is what the eval harness loads, over the same local corpus and a network tier
    world = World.generate(n_passages=300, seed=0)
    local_passages = load_corpus(corpus)
    assert len(local_passages) == 150 and {p.id for p in local_passages} <= {p.id for p in world.passages}
    with network_tier(world.passages, added_latency_ms=20) as url:
        config = EvalConfig(method="naive_rag", index_kind="bm25", network_url=url, router=str(out), judge="none")
        method, _, _ = build_pipeline(config, local_passages, backend=SimpleNamespace(tokenizer=None, name="stub"))
        router = method.search
        hops = [h for ex in make_questions(world, 5, seed=1) for h in ex.chain]
        hits = router([h.question for h in hops], 3, contexts=[{"searches_so_far": 0, "context_tokens": 300}] * len(hops))
        assert len(hits) == len(hops) and all(hits)
        s = router.summary()
        assert s["mode"] == "policy" and s["queries"] == len(hops) and s["network_errors"] == 0
        assert sum(s["decisions"].values()) == len(hops)
