import json

import numpy as np
import pytest

from conftest import exact_top
from kunlunlab.data import World
from kunlunlab.retrieval import (ClusterConfig, IndexConfig, IndexMismatchError, IVFPQConfig, build_retriever,
                                 load_retriever, read_manifest, save_retriever)
from kunlunlab.retrieval.evaluation import gold_passage_recall, recall_at_k


@pytest.mark.parametrize("kind", ["flat", "ivfpq", "hnsw", "cluster", "cluster-pq", "bm25"])
def test_round_trip_gives_identical_results(tmp_path, world, encoder, vectors, kind):
    rerank = "pq" if kind == "cluster-pq" else "exact"
    kind = kind.split("-")[0]
    config = IndexConfig(kind=kind, ivfpq=IVFPQConfig(nlist=32, m=16, nprobe=8),
                         cluster=ClusterConfig(nlist=32, pq_m=16, adapt=False, rerank=rerank))
    retriever = build_retriever(world.passages, config, encoder=encoder, vectors=vectors)
    queries = ["Who directed The Silent River?", "What is the capital of Valdoria?"]
    before = retriever.search(queries, k=5)
    save_retriever(retriever, tmp_path / kind)
    manifest = read_manifest(tmp_path / kind)
    assert manifest["kind"] == kind and manifest["n"] == len(world.passages)
    loaded = load_retriever(tmp_path / kind, passages=world.passages, encoder=encoder if kind != "bm25" else None)
    after = loaded.search(queries, k=5)
    assert [[h.id for h in hits] for hits in after] == [[h.id for h in hits] for hits in before]
    assert all(len(hits) == 5 for hits in after)
    np.testing.assert_allclose([h.score for h in after[0]], [h.score for h in before[0]], rtol=1e-5)


def test_manifest_refuses_other_embedder_and_other_corpus(tmp_path, world, encoder, vectors):
    retriever = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    save_retriever(retriever, tmp_path / "idx")
    with pytest.raises(IndexMismatchError, match="built with embedder 'all-MiniLM-L6-v2', not 'intfloat/e5-base-v2'"):
        load_retriever(tmp_path / "idx", embedder="intfloat/e5-base-v2")
    other = World.generate(len(world.passages), seed=world.seed + 1).passages
    with pytest.raises(IndexMismatchError, match="another corpus"):
        load_retriever(tmp_path / "idx", passages=other)
    # the default embedder's aliases are the same model
    assert load_retriever(tmp_path / "idx", embedder="sentence-transformers/all-MiniLM-L6-v2", encoder=None).kind == "flat"


def test_missing_and_corrupt_index_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no index at .*build-index"):
        load_retriever(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    with pytest.raises(IndexMismatchError, match="not valid JSON"):
        load_retriever(tmp_path / "bad")
    (tmp_path / "bad" / "manifest.json").write_text(json.dumps({"kind": "annoy"}))
    with pytest.raises(IndexMismatchError, match="unknown index kind 'annoy'"):
        load_retriever(tmp_path / "bad")


def test_dense_retrieval_finds_gold_passages(world, questions, encoder, vectors):
    retriever = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    assert gold_passage_recall(retriever.search, questions, k=5) > 0.6
    bm25 = build_retriever(world.passages, IndexConfig(kind="bm25"))
    assert gold_passage_recall(bm25.search, questions, k=5) > 0.6


def test_ivfpq_nprobe_is_explicit_and_matters(vectors, query_vectors):
    from kunlunlab.retrieval import IVFPQIndex

    index = IVFPQIndex(vectors.shape[1], IVFPQConfig(nlist=32, m=16, nprobe=1))
    index.add(vectors)
    truth = exact_top(vectors, query_vectors, 10)
    low = recall_at_k(index.search(query_vectors, 10, nprobe=1)[1], truth)
    high = recall_at_k(index.search(query_vectors, 10, nprobe=32)[1], truth)
    assert high > low


def test_query_cache_serves_repeats(encoder):
    encoder.encode_queries(["cache me", "and me"])
    hits = encoder.cache_hits
    again = encoder.encode_queries(["cache me", "and me", "cache me"])
    assert encoder.cache_hits == hits + 3
    np.testing.assert_array_equal(again[0], again[2])


def test_e5_prefixes_are_automatic():
    from kunlunlab.retrieval.encoder import _default_prefixes

    assert _default_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert _default_prefixes("all-MiniLM-L6-v2") == ("", "")


def test_empty_inputs(world, encoder, vectors):
    retriever = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    assert retriever.search([], k=3) == []
    with pytest.raises(ValueError, match="k must be at least 1"):
        retriever.search(["x"], k=0)
    with pytest.raises(ValueError, match="empty corpus"):
        build_retriever([], IndexConfig(kind="flat"))
    with pytest.raises(ValueError, match="unknown index kind"):
        IndexConfig(kind="annoy")


def test_world_needs_iterative_search(world, questions, encoder, vectors):
    """Per-hop retrieval finds the evidence, retrieval from the raw multi-hop question mostly does not."""
    from kunlunlab.retrieval.evaluation import single_shot_support_recall

    for config in (IndexConfig(kind="flat"), IndexConfig(kind="bm25")):
        retriever = build_retriever(world.passages, config, encoder=encoder, vectors=vectors)
        per_hop = gold_passage_recall(retriever.search, questions, k=5)
        single = single_shot_support_recall(retriever.search, questions, k=5)
        assert per_hop > 0.9
        assert single["all_supports"] < 0.6 and single["support_recall"] < per_hop - 0.2
