"""Vector indexes (FAISS) and BM25 (bm25s) behind one small interface.

All dense indexes use inner product on L2-normalised embeddings (cosine similarity). Every index
knows how to describe itself (``params``) and its memory cost (``bytes_per_vector``), which the
manifest and the benchmark report.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import faiss
import numpy as np


def _as_matrix(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return np.ascontiguousarray(x[None, :] if x.ndim == 1 else x)


def _serialized_bytes(index: faiss.Index) -> int:
    return int(faiss.serialize_index(index).nbytes)


class DenseIndex:
    """Base class: ``search(vectors, k) -> (scores, row_ids)`` with -1 ids for missing results."""

    kind: ClassVar[str] = ""
    config_class: ClassVar[type | None] = None  # the dataclass of the index's knobs, if it has any
    index: faiss.Index
    dim: int
    config: object = None

    def add(self, vectors: np.ndarray) -> None:
        self.index.add(_as_matrix(vectors))

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(_as_matrix(queries), k)

    def bytes_per_vector(self) -> float:
        return _serialized_bytes(self.index) / max(1, self.ntotal)

    def params(self) -> dict:
        return {"dim": self.dim, **(asdict(self.config) if self.config is not None else {})}

    def save(self, folder: Path) -> None:
        faiss.write_index(self.index, str(folder / "index.faiss"))

    @classmethod
    def load(cls, folder: Path, params: dict) -> "DenseIndex":
        obj = cls.__new__(cls)
        obj.dim = params["dim"]
        if cls.config_class is not None:
            names = cls.config_class.__dataclass_fields__
            obj.config = cls.config_class(**{k: params[k] for k in names})
        obj.index = faiss.read_index(str(folder / "index.faiss"))
        return obj


class FlatIndex(DenseIndex):
    """Exact search: the recall reference for every other index."""

    kind = "flat"

    def __init__(self, dim: int):
        self.dim = dim
        self.index = faiss.IndexFlatIP(dim)

    def reconstruct(self, rows: np.ndarray) -> np.ndarray:
        return self.index.reconstruct_batch(np.asarray(rows, dtype=np.int64))


@dataclass
class IVFPQConfig:
    nlist: int = 1024
    m: int = 32  # sub-quantizers (bytes per code at 8 bits)
    nbits: int = 8
    nprobe: int = 16  # always set explicitly on every search


class IVFPQIndex(DenseIndex):
    """Inverted file with product-quantised residuals; ``nprobe`` is set explicitly on every search."""

    kind = "ivfpq"
    config_class = IVFPQConfig

    def __init__(self, dim: int, config: IVFPQConfig | None = None):
        self.dim = dim
        self.config = config or IVFPQConfig()
        c = self.config
        self.quantizer = faiss.IndexFlatIP(dim)
        self.index = faiss.IndexIVFPQ(self.quantizer, dim, c.nlist, c.m, c.nbits, faiss.METRIC_INNER_PRODUCT)

    def train(self, vectors: np.ndarray) -> None:
        self.index.train(_as_matrix(vectors))

    def add(self, vectors: np.ndarray) -> None:
        if not self.index.is_trained:
            self.train(vectors)
        super().add(vectors)

    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        params = faiss.SearchParametersIVF(nprobe=int(nprobe or self.config.nprobe))
        return self.index.search(_as_matrix(queries), k, params=params)


@dataclass
class HNSWConfig:
    m: int = 32
    ef_construction: int = 80
    ef_search: int = 64


class HNSWIndex(DenseIndex):
    """Graph index: fast and accurate, but keeps full vectors (no memory saving)."""

    kind = "hnsw"
    config_class = HNSWConfig

    def __init__(self, dim: int, config: HNSWConfig | None = None):
        self.dim = dim
        self.config = config or HNSWConfig()
        self.index = faiss.IndexHNSWFlat(dim, self.config.m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = self.config.ef_construction

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        params = faiss.SearchParametersHNSW(efSearch=max(k, self.config.ef_search))
        return self.index.search(_as_matrix(queries), k, params=params)


class BM25Index:
    """Lexical retrieval through bm25s; searches text, not vectors."""

    kind = "bm25"

    def __init__(self, k1: float = 1.5, b: float = 0.75):
        import bm25s

        self.k1, self.b = k1, b
        self.model = bm25s.BM25(k1=k1, b=b)
        self.ntotal = 0

    def add_texts(self, texts: Sequence[str]) -> None:
        import bm25s

        self.model.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)
        self.ntotal = len(texts)

    def search_text(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        import bm25s

        k_eff = min(k, self.ntotal)
        tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        rows, scores = self.model.retrieve(tokens, k=k_eff, show_progress=False, n_threads=1)
        rows = np.asarray(rows, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float32)
        rows[scores <= 0] = -1  # no term overlap: not a result
        if k_eff < k:
            pad = k - k_eff
            rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        return scores, rows

    def bytes_per_vector(self) -> float:
        return float("nan")

    def params(self) -> dict:
        return {"k1": self.k1, "b": self.b}

    def save(self, folder: Path) -> None:
        self.model.save(str(folder / "bm25"))

    @classmethod
    def load(cls, folder: Path, params: dict) -> "BM25Index":
        import bm25s

        obj = cls.__new__(cls)
        obj.k1, obj.b = params["k1"], params["b"]
        obj.model = bm25s.BM25.load(str(folder / "bm25"))
        obj.ntotal = int(params["n"])
        return obj
