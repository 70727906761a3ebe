"""A corpus + encoder + index: text queries in, ranked passages out.

This is what the agent, the service and the notebooks use. ``build_retriever`` makes one from a
config; :mod:`kunlunlab.retrieval.store` saves and reloads it with a manifest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import faiss
import numpy as np

from kunlunlab.data.types import Passage
from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings, corpus_fingerprint
from kunlunlab.retrieval.indexes import (BM25Index, FlatIndex, HNSWConfig, HNSWIndex, IVFPQConfig, IVFPQIndex,
                                        check_search_settings, place_flat, resolve_device)

INDEX_KINDS = ("flat", "ivfpq", "hnsw", "cluster", "bm25")


@dataclass
class Hit:
    id: str
    contents: str
    score: float
    title: str = ""


@dataclass
class IndexConfig:
    """One config for every index kind; the knobs of the other kinds are ignored.

    ``device`` (cpu | cuda | cuda:N | auto: cuda when torch sees a GPU) is where the embedder runs and where
    the exact (``flat``) index searches; the other kinds search on the CPU. ``flat_backend`` picks the exact
    search: ``auto`` (FAISS on the CPU; on a GPU faiss-gpu where FAISS has GPU support, else torch),
    ``faiss`` or ``torch`` (a matrix product on the device, the corpus matrix in ``gpu_dtype``: float16,
    bfloat16 or float32; :class:`~kunlunlab.retrieval.indexes.TorchFlatIndex`). ``query_prefix`` /
    ``passage_prefix`` (None: the embedder's own, "query: " / "passage: " for E5) are prepended when
    encoding and recorded in the index manifest, so that serving encodes queries the same way."""

    kind: str = "cluster"
    embedder: str | None = None  # None: the embedded all-MiniLM-L6-v2
    ivfpq: IVFPQConfig = field(default_factory=IVFPQConfig)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    threads: int = 0  # 0: FAISS default
    query_precision: str = "float32"  # query side of the embedder: float32 | onnx | bfloat16 | int8 | auto (bench encode)
    passage_precision: str = "float32"  # corpus side: float32 | bfloat16 | auto (3.1x faster on AVX512-BF16 CPUs)
    query_prefix: str | None = None     # None: the embedder's default ("query: " for E5 models, else none)
    passage_prefix: str | None = None   # None: the embedder's default ("passage: " for E5 models, else none)
    device: str = "cpu"                 # cpu | cuda | cuda:N | auto
    flat_backend: str = "auto"          # exact search: auto | faiss | torch
    gpu_dtype: str = "float16"          # torch / faiss-gpu exact search: the corpus matrix's dtype

    def __post_init__(self):
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"unknown index kind {self.kind!r}; choose from {INDEX_KINDS}")
        check_search_settings(self.device, self.flat_backend, self.gpu_dtype)


def encoder_for(config: IndexConfig) -> Encoder:
    """The encoder a config asks for: its embedder, prefixes and precisions, on its device."""
    return Encoder(config.embedder, query_prefix=config.query_prefix, passage_prefix=config.passage_prefix,
                   device=resolve_device(config.device), query_precision=config.query_precision,
                   passage_precision=config.passage_precision)


class Retriever:
    def __init__(self, passages: Sequence[Passage], index, encoder: Encoder | None, config: IndexConfig,
                 fingerprint: str | None = None):
        self.passages = list(passages)
        self.index = index
        self.encoder = encoder
        self.config = config
        self.fingerprint = fingerprint or corpus_fingerprint(self.passages)
        self.last_timings: dict[str, float] = {}

    @property
    def kind(self) -> str:
        return self.config.kind

    def search_rows(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, corpus rows) for a batch of text queries; -1 rows mark missing results."""
        t0 = time.perf_counter()
        if isinstance(self.index, BM25Index):
            scores, rows = self.index.search_text(queries, k)
            t1 = t0
        else:
            vectors = self.encoder.encode_queries(list(queries))
            t1 = time.perf_counter()
            scores, rows = self.index.search(vectors, k)
        self.last_timings = {"encode_s": t1 - t0, "search_s": time.perf_counter() - t1}
        return scores, rows

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """Batch search: one ranked hit list per query, all queries in one index call."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not queries:
            return []
        scores, rows = self.search_rows(queries, min(k, len(self.passages)))
        out = []
        for score_row, id_row in zip(scores, rows):
            hits = []
            for score, row in zip(score_row, id_row):
                if row < 0:
                    continue
                p = self.passages[int(row)]
                hits.append(Hit(p.id, p.contents, float(score), p.title))
            out.append(hits)
        return out


def make_index(config: IndexConfig, dim: int):
    if config.kind == "flat":
        return place_flat(FlatIndex(dim), config.device, config.flat_backend, config.gpu_dtype)
    if config.kind == "ivfpq":
        return IVFPQIndex(dim, config.ivfpq)
    if config.kind == "hnsw":
        return HNSWIndex(dim, config.hnsw)
    if config.kind == "cluster":
        return ClusterRetriever(dim, config.cluster)
    raise ValueError(f"{config.kind!r} is not a dense index")


def build_retriever(passages: Sequence[Passage], config: IndexConfig | None = None,
                    encoder: Encoder | None = None, vectors: np.ndarray | None = None,
                    progress: bool = False) -> Retriever:
    """Embeds the corpus (cached) and builds the configured index over it."""
    config = config or IndexConfig()
    if not passages:
        raise ValueError("cannot build a retriever over an empty corpus")
    if config.threads:
        faiss.omp_set_num_threads(config.threads)
    if config.kind == "bm25":
        index = BM25Index()
        index.add_texts([p.contents for p in passages])
        return Retriever(passages, index, None, config)
    encoder = encoder or encoder_for(config)
    if vectors is None:
        vectors = corpus_embeddings(encoder, passages, progress=progress)
    if len(vectors) != len(passages):
        raise ValueError(f"{len(vectors)} vectors for {len(passages)} passages")
    index = make_index(config, vectors.shape[1])
    if isinstance(index, ClusterRetriever):
        index.build(vectors)
    else:
        index.add(vectors)
    return Retriever(passages, index, encoder, config)
