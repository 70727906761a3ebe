"""`kunlunlab build-index`: bad corpora end in one line, and a preset's embedder prefixes reach the vectors, the
manifest and the index that serving loads."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kunlunlab.cli import main
from kunlunlab.retrieval import load_preset, load_retriever, read_manifest

PRESET = Path(__file__).resolve().parents[2] / "experiments/configs/presets/search_r1_e5.json"


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("lines,message", [
    ([], "corpus {path} holds no passages"),
    (['{"id": "1", "contents": "\\"A\\"\\nfirst passage"}', '{"id": "2", "title": "B"}'],
     "{path}, line 2: unrecognised corpus layout (keys ['id', 'title'])"),
    (['{"id": "1", "contents": null}'], "{path}, line 1 (field 'contents'): expected str"),
])
def test_an_empty_corpus_or_a_line_without_contents_is_one_line_and_exit_2(tmp_path, capsys, lines, message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    assert main(["build-index", "--corpus", str(corpus), "--kind", "flat", "--out", str(tmp_path / "index")]) == 2
    assert one_error_line(capsys).startswith("kunlunlab build-index: " + message.format(path=corpus))
    assert not (tmp_path / "index").exists()


def test_the_published_preset_names_search_r1s_setting():
    preset = load_preset(PRESET)
    index = preset.index
    assert (index.kind, index.embedder, index.query_prefix, index.passage_prefix, preset.top_k) == \
        ("flat", "intfloat/e5-base-v2", "query: ", "passage: ", 3)
    assert preset.corpus == "wiki-18.jsonl" and preset.corpus_layout == "flashrag"


def test_preset_conflicts_and_a_missing_embedder_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"A\\"\\nfirst passage"}\n')
    out = str(tmp_path / "index")
    assert main(["build-index", "--preset", str(PRESET), "--kind", "flat", "--corpus", str(corpus), "--out", out]) == 2
    assert "--preset sets the index kind and embedder" in one_error_line(capsys)
    assert main(["build-index", "--preset", str(tmp_path / "nope.json"), "--out", out]) == 2
    assert "retrieval preset not found" in one_error_line(capsys)
    # e5-base-v2 is not in this machine's model cache (nothing is downloaded at run time)
    assert main(["build-index", "--preset", str(PRESET), "--corpus", str(corpus), "--device", "cpu", "--out", out]) == 2
    assert "Cannot load embedder 'intfloat/e5-base-v2'" in one_error_line(capsys)


def test_preset_prefixes_are_applied_when_encoding_and_recorded_for_serving(tmp_path, capsys, encoder):
    passages = {"1": '"Paris"\nParis is the capital of France.', "2": '"Lyon"\nLyon lies on the Rhone.',
                "3": '"Nice"\nNice is on the Mediterranean coast.'}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in passages.items()))
    preset = json.loads(PRESET.read_text())
    preset["index"]["embedder"] = None  # the embedded MiniLM, with the preset's E5-style prefixes
    (tmp_path / "preset.json").write_text(json.dumps(preset))
    out = tmp_path / "index"
    assert main(["build-index", "--preset", str(tmp_path / "preset.json"), "--corpus", str(corpus),
                 "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kind"] == "flat"
    manifest = read_manifest(out)
    assert (manifest["query_prefix"], manifest["passage_prefix"]) == ("query: ", "passage: ")
    served = load_retriever(out)  # what serve-retriever loads: the manifest's prefixes, no re-embedding
    assert (served.encoder.query_prefix, served.encoder.passage_prefix) == ("query: ", "passage: ")
    model = encoder.model  # sentence-transformers itself, on the prefixed texts
    stored = served.index.reconstruct(np.arange(3))
    expected = model.encode(["passage: " + c for c in passages.values()], normalize_embeddings=True)
    assert np.allclose(stored, expected, atol=1e-5)
    unprefixed = model.encode(list(passages.values()), normalize_embeddings=True)
    assert not np.allclose(stored, unprefixed, atol=1e-3)  # the prefix changed the vectors
    query = "Which city is the capital of France?"
    hit = served.search([query], 1)[0][0]
    q = model.encode(["query: " + query], normalize_embeddings=True)[0]
    assert hit.id == "1" and hit.score == pytest.approx(float(q @ expected[0]), abs=1e-5)


# ---------------------------------------------------------------------------- --out, --overwrite, atomic builds
def _corpus(tmp_path, n: int, name: str = "corpus.jsonl", bad_line: int | None = None) -> str:
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\npassage {i} about topic {i % 3}'}) for i in range(n)]
    if bad_line is not None:
        lines[bad_line] = "{oops"
    (tmp_path / name).write_text("".join(line + "\n" for line in lines))
    return str(tmp_path / name)


def _old_index(folder: Path) -> Path:
    """A folder as an earlier build leaves it: a manifest beside the index's own files."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"kind": "cluster", "n": 3}))
    for name in ("index.faiss", "vectors.npy", "cluster_state.npz", "corpus.jsonl"):
        (folder / name).write_text("old")
    return folder


def _leftovers(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))


def test_an_out_holding_another_index_is_refused_unless_overwrite_which_removes_its_files(tmp_path, capsys):
    out = _old_index(tmp_path / "index")
    corpus = _corpus(tmp_path, 6)
    assert main(["build-index", "--corpus", corpus, "--kind", "bm25", "--out", str(out)]) == 2
    assert one_error_line(capsys) == (f"kunlunlab build-index: --out {out} holds a cluster index of 3 passages: "
                                      "pass --overwrite to replace it, or choose another --out")
    assert (out / "index.faiss").read_text() == "old"
    assert main(["build-index", "--corpus", corpus, "--kind", "bm25", "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bm25", "corpus.jsonl", "manifest.json"]  # the old files went
    assert read_manifest(out)["n"] == 6 and _leftovers(tmp_path) == []
    assert len(load_retriever(out).search(["passage 4"], 3)[0]) == 3


def test_a_folder_that_holds_no_index_is_never_emptied(tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        assert main(["build-index", "--corpus", _corpus(tmp_path, 6), "--kind", "bm25", "--out", str(folder),
                     *extra]) == 2
        assert "is a folder that is not empty and holds no index" in one_error_line(capsys)
    assert [p.name for p in folder.iterdir()] == ["mine.txt"]


def test_a_build_that_fails_leaves_the_old_index_and_no_partial_folder(tmp_path, monkeypatch, capsys):
    import kunlunlab.retrieval.store as store

    def fails_halfway(retriever, folder):
        (Path(folder) / "corpus.jsonl").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_retriever", fails_halfway)
    out = _old_index(tmp_path / "index")
    assert main(["build-index", "--corpus", _corpus(tmp_path, 6), "--kind", "bm25", "--out", str(out),
                 "--overwrite"]) == 1
    assert one_error_line(capsys).startswith(f"kunlunlab build-index: the build failed, nothing was written to {out}")
    assert (out / "corpus.jsonl").read_text() == "old" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind, need, works", [("cluster", 16, "--kind flat"), ("ivfpq", 1024, "--kind cluster")])
def test_a_corpus_too_small_for_the_kind_is_one_line_with_the_size_it_needs(tmp_path, capsys, kind, need, works):
    corpus = _corpus(tmp_path, 20 if kind == "ivfpq" else 5)
    assert main(["build-index", "--corpus", corpus, "--kind", kind, "--out", str(tmp_path / "index")]) == 2
    line = one_error_line(capsys)
    assert f"too small for --kind {kind}, which needs at least {need} to train" in line and works in line
    assert not (tmp_path / "index").exists() and _leftovers(tmp_path) == []


def test_the_smallest_corpus_each_kind_needs_is_what_faiss_trains_on(tmp_path):
    """min_corpus_size against the indexes themselves: one passage fewer fails in FAISS, the minimum trains."""
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.indexes import IVFPQConfig
    from kunlunlab.retrieval.retriever import IndexConfig, make_index
    from kunlunlab.retrieval.sharded import min_corpus_size

    rng = np.random.default_rng(0)
    for config in (IndexConfig(kind="cluster"), IndexConfig(kind="cluster", cluster=ClusterConfig(rerank="pq")),
                   IndexConfig(kind="ivfpq", ivfpq=IVFPQConfig(nlist=16, m=8)),
                   IndexConfig(kind="ivfpq", ivfpq=IVFPQConfig(nlist=512, m=8))):
        need = min_corpus_size(config)
        for n, trains in ((need - 1, False), (need, True)):
            vectors = rng.standard_normal((n, 384)).astype("float32")
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            index = make_index(config, 384)
            if trains:
                index.train(vectors)
                index.add(vectors)
            else:
                with pytest.raises(RuntimeError, match="should be at least as large as number of clusters"):
                    index.train(vectors)


def test_a_stream_build_that_fails_leaves_no_partial_corpus(tmp_path, capsys):
    corpus = _corpus(tmp_path, 40, bad_line=30)
    out = tmp_path / "index"
    assert main(["build-index", "--corpus", corpus, "--kind", "flat", "--engine", "stream", "--out", str(out)]) == 2
    assert "line 31" in one_error_line(capsys)
    assert not out.exists() and _leftovers(tmp_path) == []  # no corpus.jsonl.partial, no shards


def test_ctrl_c_during_a_build_is_one_line_and_leaves_nothing(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "index"
    # its own embedding cache (a cached corpus would be built before the signal arrives) and SIGINT at its default
    # (a suite started in the background, e.g. `make test &`, hands its children SIGINT ignored)
    env = {**os.environ, "KUNLUNLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "kunlunlab.cli", "build-index", "--n", "20000", "--kind", "flat",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not _leftovers(tmp_path) and time.time() < deadline:  # the build folder exists: embedding has started
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"kunlunlab build-index: interrupted; nothing was written to {out} (the "
                                            "partial build was removed); run the command again to build the index")
    assert not out.exists() and _leftovers(tmp_path) == []
