"""Exact search off FAISS's CPU path: the torch matrix-product index against FAISS IndexFlatIP and numpy, exact in
float16/bfloat16 storage against a brute-force float64 reference (near-ties below float16's resolution included),
the index config that selects it, a saved index reloaded onto it, and the exact-search benchmark's command line."""
import json

import faiss
import numpy as np
import pytest
import torch

from kunlunlab.bench import main as bench_main
from kunlunlab.retrieval import IndexConfig, TorchFlatIndex, build_retriever, load_retriever, save_retriever
from kunlunlab.retrieval import exact_topk
from kunlunlab.retrieval.indexes import FlatIndex, flat_backend, place_flat, resolve_device

from conftest import exact_top


def faiss_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


@pytest.fixture(scope="module")
def gaussian():
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((6000, 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((150, 768)).astype(np.float32)  # more than one query batch of 64
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return vectors, queries


def test_float32_torch_search_is_faiss_flat_exactly_over_random_vectors(gaussian):
    vectors, queries = gaussian
    expected_scores, expected_rows = faiss_top(vectors, queries, 10)
    # several blocks of rows (chunk_rows 2500 over 6000, added in two uneven parts) and three query batches
    index = TorchFlatIndex(768, device="cpu", dtype="float32", query_batch=64, chunk_rows=2500)
    index.add(vectors[:3700])
    index.add(vectors[3700:])
    assert index.ntotal == 6000 and [len(c) for c in index.chunks] == [2500, 2500, 1000]
    scores, rows = index.search(queries, 10)
    assert rows.dtype == np.int64 and scores.dtype == np.float32
    assert np.array_equal(rows, expected_rows)
    assert np.allclose(scores, expected_scores, atol=1e-5)
    assert np.array_equal(rows, exact_top(vectors, queries, 10))  # numpy's own ranking agrees


def flat_with(vectors: np.ndarray) -> FlatIndex:
    flat = FlatIndex(vectors.shape[1])
    flat.add(vectors)
    return flat


def test_float32_torch_search_is_faiss_flat_exactly_over_embedded_passages(vectors, query_vectors):
    _, expected = faiss_top(vectors, query_vectors, 10)
    _, rows = TorchFlatIndex(flat_with(vectors), device="cpu", dtype="float32").search(query_vectors, 10)
    assert np.array_equal(rows, expected)


def stored(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """The vectors as a half-precision index stores them, back in float64 (the brute-force reference's input)."""
    return torch.from_numpy(vectors).to(getattr(torch, dtype)).double().numpy()


def brute_force(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every inner product in float64, sorted: the reference top-k (rows, scores)."""
    scores = queries.astype(np.float64) @ vectors.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return rows, np.take_along_axis(scores, rows, 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_search_is_the_exact_top10_of_the_stored_vectors(gaussian, dtype):
    vectors, queries = gaussian
    expected_rows, expected_scores = brute_force(stored(vectors, dtype), queries, 10)
    index = TorchFlatIndex(flat_with(vectors), device="cpu", dtype=dtype, chunk_rows=2500)
    scores, rows = index.search(queries, 10)
    assert np.array_equal(rows, expected_rows)
    assert np.allclose(scores, expected_scores, atol=1e-5)  # float32 scores, not the rounded ones
    if dtype == "float16":  # random vectors have no near-ties: no query needed the float32 fallback
        assert index.searched_again == 0


@pytest.fixture(scope="module")
def near_ties():
    """Vectors and queries of whole multiples of 1/256 (float16 holds them exactly, and float32 sums them exactly):
    30 near-copies of each query whose scores are 1/65536 apart (copy j lowers the query's component of 1/256 by
    j + 1 steps), 1/64 of float16's spacing at their size (above 1), so float16 scores cannot order them; 4000
    random vectors around them."""
    rng = np.random.default_rng(7)
    queries = rng.integers(-40, 41, (8, 256))
    queries[:, 0] = 1
    vectors = [rng.integers(-40, 41, (4000, 256))]
    for q in queries:
        copies = np.repeat(q[None, :], 30, 0)
        copies[:, 0] -= np.arange(1, 31)
        vectors.append(copies[rng.permutation(30)])
    vectors = np.concatenate(vectors)
    return (vectors / 256).astype(np.float32), (queries / 256).astype(np.float32)


@pytest.mark.parametrize("group_rows,slack", [(256, 48), (16, 2)])
def test_near_ties_below_float16_resolution_are_ordered_exactly(near_ties, group_rows, slack):
    vectors, queries = near_ties
    expected_rows, expected_scores = brute_force(vectors.astype(np.float64), queries, 10)
    gaps = np.diff(-brute_force(vectors.astype(np.float64), queries, 11)[1], axis=1)
    assert gaps.min() > 0 and expected_scores.min() > 1  # the premise: distinct scores where float16 steps by 2^-10
    rounded = torch.from_numpy(queries).half() @ torch.from_numpy(vectors).half().T
    assert not np.array_equal(torch.topk(rounded.float(), 10).indices.numpy(), expected_rows)  # rounded scores fail
    blocks = [torch.from_numpy(vectors[i:i + 4015]).half() for i in range(0, len(vectors), 4015)]  # copies on both sides
    scores, rows, again = exact_topk.exact_top(torch.from_numpy(queries), blocks, 10,
                                               float(np.linalg.norm(vectors, axis=1).max()),
                                               exact_topk.TopKSettings(group_rows=group_rows, slack=slack))
    assert np.array_equal(rows.numpy(), expected_rows)
    assert np.array_equal(scores.numpy(), expected_scores.astype(np.float32))  # exact sums of 1/65536 steps
    assert (again > 0) == (slack == 2)  # 30 near-copies: 2 spare candidates cannot prove them, 48 can


def test_duplicates_beyond_the_spare_candidates_take_the_fallback_and_stay_exact(gaussian):
    vectors, queries = gaussian
    best = vectors[brute_force(vectors, queries[:1], 1)[0][0, 0]]
    corpus = np.concatenate([vectors, np.repeat(best[None, :], 100, 0)])  # 101 equal best scores
    index = TorchFlatIndex(flat_with(corpus), device="cpu", dtype="float16")
    scores, rows = index.search(queries[:1], 10)
    reference = stored(corpus, "float16") @ queries[0].astype(np.float64)
    assert index.searched_again == 1
    assert np.allclose(scores[0], np.sort(reference)[::-1][:10], atol=1e-6)
    assert np.allclose(reference[rows[0]], scores[0], atol=1e-6)  # each row scores what it is reported to


def test_fewer_vectors_than_k_pads_with_minus_one_as_faiss_does(gaussian):
    vectors, queries = gaussian
    expected_scores, expected_rows = faiss_top(vectors[:3], queries[:4], 5)
    index = TorchFlatIndex(768, dtype="float32")
    index.add(vectors[:3])
    scores, rows = index.search(queries[:4], 5)
    assert np.array_equal(rows, expected_rows) and (rows[:, 3:] == -1).all()
    assert np.allclose(scores[:, :3], expected_scores[:, :3], atol=1e-5)


def test_the_config_selects_the_torch_path_and_the_saved_index_is_faiss_flat(tmp_path, world, encoder, vectors,
                                                                             questions):
    texts = list(dict.fromkeys(h.question for q in questions for h in q.chain))[:40]
    reference = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    torch_config = IndexConfig(kind="flat", flat_backend="torch", gpu_dtype="float32")
    on_torch = build_retriever(world.passages, torch_config, encoder=encoder, vectors=vectors)
    assert isinstance(on_torch.index, TorchFlatIndex) and not isinstance(reference.index, TorchFlatIndex)
    ids = [[h.id for h in row] for row in reference.search(texts, 10)]
    assert [[h.id for h in row] for row in on_torch.search(texts, 10)] == ids
    # saved as the FAISS flat file: loads as FAISS by default, and onto torch when the serving config says so
    folder = save_retriever(on_torch, tmp_path / "flat")
    assert isinstance(faiss.read_index(str(folder / "index.faiss")), faiss.IndexFlatIP)
    plain = load_retriever(folder, encoder=encoder)
    assert type(plain.index) is FlatIndex
    loaded = load_retriever(folder, encoder=encoder, index_config=torch_config)
    assert isinstance(loaded.index, TorchFlatIndex) and loaded.index.index is None  # serving: no host copy
    assert [[h.id for h in row] for row in loaded.search(texts, 10)] == ids
    with pytest.raises(RuntimeError, match="device only"):
        save_retriever(loaded, tmp_path / "again")


def test_device_and_backend_choices():
    assert resolve_device("cpu") == "cpu" and flat_backend("auto", "cpu", "float16") == "faiss"
    assert flat_backend("torch", "cpu", "bfloat16") == "torch"
    has_faiss_gpu = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    assert flat_backend("auto", "cuda", "bfloat16") == "torch"  # FAISS's GPU index stores no bfloat16
    assert flat_backend("auto", "cuda", "float16") == ("faiss-gpu" if has_faiss_gpu else "torch")
    flat = FlatIndex(8)
    assert place_flat(flat, "cpu", "faiss") is flat
    for bad, message in [({"device": "gpu"}, "unknown device 'gpu'"), ({"flat_backend": "cupy"}, "unknown flat backend"),
                         ({"gpu_dtype": "int8"}, "unknown search dtype 'int8'")]:
        with pytest.raises(ValueError, match=message):
            IndexConfig(kind="flat", **bad)


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, world, encoder, vectors):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        build_retriever(world.passages[:50], IndexConfig(kind="flat", device="cuda"), encoder=encoder,
                        vectors=vectors[:50])
    folder = save_retriever(build_retriever(world.passages[:50], IndexConfig(kind="flat"), encoder=encoder,
                                            vectors=vectors[:50]), tmp_path / "flat")
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        load_retriever(folder, encoder=encoder, index_config=IndexConfig(kind="flat", device="cuda"))


def test_exact_search_bench_prints_json_last_and_refuses_what_does_not_fit(capsys):
    assert bench_main(["exact-search", "--device", "cpu", "--dim", "64", "--n", "3000", "--queries", "16",
                       "--dtype", "float32", "--backend", "torch", "--repeats", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["n"], result["dim"], result["queries"], result["backend"], result["dtype"]) == \
        (3000, 64, 16, "torch", "float32")
    assert result["search_ms_per_batch"] > 0 and result["n_max"] > 3000
    # unit vectors: every best inner product is a cosine, below 1 and, over 3000 random ones in 64-d, above 0
    assert 0 < result["top1_score_mean"] < 1
    assert bench_main(["exact-search", "--n", "1e13", "--dim", "768"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --n max or a smaller --n" in err[0]
