"""The sharded index build (``kunlunlab build-index --engine stream|ray``): the same index, corpus file and
manifest as the in-process build over the same corpus, with the corpus streamed from disk and embedded in
shards, here or by a Ray Data actor pool on a local Ray (``num_cpus=2``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kunlunlab.data.loaders import iter_corpus, load_corpus
from kunlunlab.data.types import DataFormatError
from kunlunlab.retrieval.clustered import ClusterConfig
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.retrieval.sharded import ShardedBuildConfig, build_sharded
from kunlunlab.retrieval.store import CORPUS, MANIFEST_KEYS, load_retriever, read_manifest, save_retriever

ROOT = Path(__file__).resolve().parents[2]
PASSAGES = 900    # the world's first 900 passages (each sharded build encodes its corpus again)
SHARD_ROWS = 250  # shards of 250, 250, 250, 150 (the last one short)
RAY_PASSAGES = 300  # the Ray build's corpus: its first 300
CLUSTER = IndexConfig(kind="cluster", cluster=ClusterConfig(seed=3))


def _write_corpus(passages, path: Path) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for p in passages:  # FlashRAG layout, as a user's corpus arrives
            fh.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus_file(world, tmp_path_factory) -> Path:
    return _write_corpus(world.passages[:PASSAGES], tmp_path_factory.mktemp("corpus") / "world.jsonl")


def _build_in_process(passages, vectors, encoder, folder: Path) -> Path:
    """The reference: the same corpus built in one process from its precomputed vectors."""
    save_retriever(build_retriever(passages, CLUSTER, encoder=encoder, vectors=vectors), folder)
    return folder


@pytest.fixture(scope="module")
def in_process(world, encoder, vectors, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inprocess")
    return _build_in_process(world.passages[:PASSAGES], vectors[:PASSAGES], encoder, folder)


def _queries(questions) -> list[str]:
    return list(dict.fromkeys(h.question for q in questions for h in q.chain))[:60]


def _same_build(built: Path, reference: Path, questions, encoder) -> None:
    got, want = read_manifest(built), read_manifest(reference)
    for key in MANIFEST_KEYS:
        assert got[key] == want[key], key
    assert (built / CORPUS).read_bytes() == (reference / CORPUS).read_bytes()
    assert not (built / "shards").exists(), "the shards are removed after the build"
    a, b = load_retriever(built, encoder=encoder), load_retriever(reference, encoder=encoder)
    # the embeddings agree to float rounding (other encoding batches, other padding)
    np.testing.assert_allclose(a.index.vector_store, b.index.vector_store, atol=2e-5)
    assert np.array_equal(a.index.doc_cluster, b.index.doc_cluster), "every passage in the same cluster"
    queries = _queries(questions)
    top_a = [[h.id for h in hits] for hits in a.search(queries, k=10)]
    top_b = [[h.id for h in hits] for hits in b.search(queries, k=10)]
    assert top_a == top_b


@pytest.mark.slow
def test_stream_build_equals_the_in_process_build(corpus_file, in_process, questions, encoder, tmp_path):
    out = tmp_path / "stream"
    manifest = build_sharded(corpus_file, CLUSTER, out, ShardedBuildConfig(engine="stream", shard_rows=SHARD_ROWS,
                                                                          block_rows=128), encoder=encoder)
    assert manifest["build"]["shards"] == 4 and manifest["build"]["engine"] == "stream"
    assert manifest["build"]["peak_rss_mb"] > 0
    _same_build(out, in_process, questions, encoder)


@pytest.mark.slow
def test_ray_build_equals_the_in_process_build(world, vectors, questions, encoder, tmp_path):
    """Over the first 300 passages (shards of 80, 80, 80, 60): Ray's start and its actor's imports are fixed costs,
    the encoding on one actor thread is what the corpus size adds (900 passages: 48 s of build, 300: 31 s)."""
    pytest.importorskip("ray", reason="the Ray build needs ray[data] (pip install -e .)")
    corpus = _write_corpus(world.passages[:RAY_PASSAGES], tmp_path / "corpus.jsonl")
    reference = _build_in_process(world.passages[:RAY_PASSAGES], vectors[:RAY_PASSAGES], encoder,
                                  tmp_path / "inprocess")
    out = tmp_path / "ray"
    cfg = ShardedBuildConfig(engine="ray", shard_rows=80, block_rows=128, num_cpus=2)
    manifest = build_sharded(corpus, CLUSTER, out, cfg, encoder=encoder, log=lambda line: None)
    assert manifest["build"]["shards"] == 4 and manifest["build"]["engine"] == "ray"
    _same_build(out, reference, questions, encoder)


@pytest.mark.slow
def test_stream_build_of_other_kinds_searches_as_in_process(world, encoder, vectors, questions, tmp_path):
    """Over the first 600 passages (shards of 200): each sharded build encodes its corpus again."""
    passages, n = world.passages[:600], 600
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages))
    queries = _queries(questions)
    for kind in ("flat", "ivfpq"):
        config = IndexConfig(kind=kind)
        config.ivfpq.nlist, config.ivfpq.m = 16, 16
        reference = build_retriever(passages, config, encoder=encoder, vectors=vectors[:n])
        build_sharded(corpus, config, tmp_path / kind, ShardedBuildConfig(shard_rows=200),
                      encoder=encoder, log=lambda line: None)
        built = load_retriever(tmp_path / kind, encoder=encoder)
        assert not (tmp_path / kind / "vectors.npy").exists()  # only the cluster retriever keeps float vectors
        assert built.index.ntotal == n
        same = [[h.id for h in x] == [h.id for h in y]
                for x, y in zip(built.search(queries, k=10), reference.search(queries, k=10))]
        assert all(same), f"{kind}: {same.count(False)} of {len(same)} top-10 lists differ"


def test_a_jsonl_corpus_streams_line_by_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"id": i, "contents": f'"Title {i}"\ntext {i}'}) for i in range(4)] + ["{broken", ""]
    path.write_text("\n".join(lines))
    passages = iter_corpus(path)
    # the first passages arrive before the broken line is read; the error names the line
    assert [next(passages).id for _ in range(4)] == ["0", "1", "2", "3"]
    with pytest.raises(DataFormatError, match="line 5"):
        next(passages)
    assert load_corpus(path, limit=2)[1].title == "Title 1"


@pytest.mark.slow
def test_build_index_cli_refuses_bad_corpora_in_one_line(tmp_path):
    def build(corpus: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kunlunlab.cli", "build-index", "--engine", "stream", "--corpus",
                               str(corpus), "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)

    missing = build(tmp_path / "nowhere.jsonl")
    assert missing.returncode != 0 and "no corpus file" in missing.stderr and "Traceback" not in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "contents": "one"}) + "\n" + json.dumps({"id": "b"}) + "\n")
    malformed = build(bad)
    assert malformed.returncode != 0 and "Traceback" not in malformed.stderr
    assert "line 2" in malformed.stderr and "contents" in malformed.stderr


def test_a_loaded_index_saved_into_its_own_folder_keeps_its_vectors(in_process, encoder, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(in_process, folder)
    before = np.load(folder / "vectors.npy")
    retriever = load_retriever(folder, encoder=encoder)
    save_retriever(retriever, folder)  # the store is memory-mapped from folder/vectors.npy
    np.testing.assert_array_equal(np.load(folder / "vectors.npy"), before)
    save_retriever(retriever, tmp_path / "elsewhere")
    np.testing.assert_array_equal(np.load(tmp_path / "elsewhere" / "vectors.npy"), before)


@pytest.mark.slow
def test_build_benchmark_builds_the_same_index_from_shards_as_in_memory(tmp_path):
    """``bench build``'s index parts: shard by shard from disk and in memory from the same Gaussian vectors
    give byte-identical FAISS files and cluster assignments; the figures come as the last JSON line."""
    done = subprocess.run([sys.executable, "-m", "kunlunlab.bench", "build", "--n", "0", "--index-n", "12000",
                           "--shard-rows", "5000", "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for part in ("index_sharded", "index_inprocess"):
        assert figures[part]["vectors"] == 12000 and figures[part]["peak_rss_mb"] > 0
    assert sorted(figures["index_sharded"]["seconds_by_step"]) == ["add", "concatenate", "train"]
    assert len(list((tmp_path / "gauss").glob("emb-*.npy"))) == 3  # 5000 + 5000 + 2000
    sharded, in_memory = tmp_path / "index_sharded", tmp_path / "index_inprocess"
    assert (sharded / "index.faiss").read_bytes() == (in_memory / "index.faiss").read_bytes()
    np.testing.assert_array_equal(np.load(sharded / "vectors.npy"), np.load(in_memory / "vectors.npy"))
    a, b = np.load(sharded / "cluster_state.npz"), np.load(in_memory / "cluster_state.npz")
    np.testing.assert_array_equal(a["doc_cluster"], b["doc_cluster"])
