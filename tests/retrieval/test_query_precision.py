"""The query side of the embedder in bfloat16 / int8 (``Encoder(query_precision=...)``) and
``python -m kunlunlab.bench encode``: faster query vectors that find the same passages."""
import json
import logging
import warnings

import numpy as np
import onnx
import pytest

from kunlunlab.retrieval.encoder import Encoder, resolve_query_precision

QUERIES = ["Who founded Greinzond Studios?", "Which country is Tamsin Tomquovstael from?",
           "In which year was the Velmora bridge opened?", "What is the capital of Skarfoust?"]


@pytest.fixture(scope="module")
def float32_vectors(encoder):
    return encoder.embed_queries(QUERIES)


@pytest.mark.parametrize("precision, min_cosine", [("onnx", 0.99999), ("bfloat16", 0.99), ("int8", 0.95)])
def test_low_precision_query_vectors_point_where_float32_ones_do(precision, min_cosine, float32_vectors):
    enc = Encoder(query_precision=precision)
    vectors = enc.embed_queries(QUERIES)
    assert vectors.dtype == np.float32 and vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    cosines = (vectors * float32_vectors).sum(1)
    assert (cosines >= min_cosine).all(), cosines
    # passages stay float32 whatever the query precision: cached corpus embeddings remain valid
    assert np.array_equal(enc.encode_passages(QUERIES[:2]), Encoder().encode_passages(QUERIES[:2]))


def test_query_precision_names_are_checked():
    with pytest.raises(ValueError, match="unknown query precision 'fp8'"):
        resolve_query_precision("fp8")
    assert resolve_query_precision("auto") in ("float32", "bfloat16")
    assert resolve_query_precision("onnx") == "onnx"
    assert resolve_query_precision("int8") == "int8"


def test_onnx_queries_equal_float32_ones_and_the_export_is_cached(float32_vectors):
    from kunlunlab.retrieval.encoder import OnnxQueryModel

    enc = Encoder(query_precision="onnx")
    assert isinstance(enc.query_model, OnnxQueryModel)
    np.testing.assert_allclose(enc.embed_queries(QUERIES), float32_vectors, atol=1e-5)
    exported = sorted(p.stat().st_mtime_ns for p in (enc.query_model.path.parent).glob("*.onnx"))
    again = Encoder(query_precision="onnx")  # a second encoder reads the cached export
    assert sorted(p.stat().st_mtime_ns for p in (again.query_model.path.parent).glob("*.onnx")) == exported
    # padding inside a batch changes nothing: each query alone gives its batched vector
    np.testing.assert_allclose(np.concatenate([again.embed_queries([q]) for q in QUERIES]), float32_vectors, atol=1e-5)


def test_int8_queries_multiply_in_int8_through_onnx_runtime_and_are_quantised_once(tmp_path, monkeypatch, caplog,
                                                                                     float32_vectors):
    from kunlunlab.retrieval import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "cache_dir", lambda: tmp_path)
    enc = Encoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # torch.ao's quantize_dynamic, deprecated, is not used
        with caplog.at_level(logging.WARNING):
            enc.set_query_precision("int8")
        vectors = enc.embed_queries(QUERIES)
    assert not caplog.records  # ORT's quantiser warns when the graph was not pre-processed; it is
    assert (vectors * float32_vectors).sum(1).min() >= 0.95
    graph = onnx.load(str(enc.query_model.path)).graph
    # MiniLM-L6: 6 layers x (query, key, value, output, two feed-forward) linear layers, every one in int8
    assert sum(node.op_type == "MatMulInteger" for node in graph.node) == 36
    quantised = {p.name: p.stat().st_mtime_ns for p in tmp_path.joinpath("onnx").iterdir()}
    assert len(quantised) == 2  # the float32 export and its int8 model, no partial file left
    again = Encoder(query_precision="int8")
    np.testing.assert_array_equal(again.embed_queries(QUERIES), vectors)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.joinpath("onnx").iterdir()} == quantised


@pytest.mark.slow
def test_encode_benchmark_prints_its_figures_as_the_last_json_line(capsys):
    from kunlunlab.bench import main

    assert main(["encode", "--n", "300", "--queries", "64", "--repeats", "1", "--precisions", "float32,int8"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("queries_per_s_b1", "queries_per_s_b8", "queries_per_s_b64", "retrieval_ms_per_call_8",
                "recall_at_10_change"):
        assert key in out
    assert out["by_precision"]["float32"]["recall_at_10_vs_float32"] == 1.0  # float32 against itself
    assert 0.5 <= out["by_precision"]["int8"]["recall_at_10_vs_float32"] <= 1.0
    # speeds are the benchmark's to report, not this test's to compare (it failed once on a loaded machine)
    assert out["queries_per_s_b64"] > 0 and out["cached_retrieval_ms_per_call_8"] > 0


def test_bfloat16_passages_point_where_float32_ones_do_and_are_cached_apart(tmp_path, monkeypatch):
    from kunlunlab.data.types import Passage
    from kunlunlab.retrieval import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "cache_dir", lambda: tmp_path)
    passages = [Passage(id=str(i), title="", text=q) for i, q in enumerate(QUERIES)]
    exact = Encoder()
    fast = Encoder(passage_precision="bfloat16")
    assert fast.query_model is fast.model  # queries stay float32 unless asked
    a = encoder_module.corpus_embeddings(exact, passages, progress=False)
    b = encoder_module.corpus_embeddings(fast, passages, progress=False)
    assert b.dtype == np.float32 and np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert ((a * b).sum(1) >= 0.99).all() and not np.array_equal(a, b)
    assert len(list((tmp_path / "embeddings").glob("*.npy"))) == 2  # one cache file per precision
    np.testing.assert_array_equal(encoder_module.corpus_embeddings(fast, passages, progress=False), b)
    with pytest.raises(ValueError, match="passages are embedded in float32 or bfloat16"):
        Encoder(passage_precision="int8")
