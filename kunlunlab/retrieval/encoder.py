"""Sentence-transformers encoder with a query-embedding cache.

In RAG-RL rollouts the same sub-questions recur across a group of samples and across epochs, so
query encoding, not the index lookup, is the dominant retrieval cost; an LRU cache removes it.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np

from kunlunlab.data.types import Passage
from kunlunlab.models import canonical_embedder_name, load_embedder
from kunlunlab.paths import cache_dir


def _default_prefixes(model_name: str) -> tuple[str, str]:
    """E5 models were trained with ``query:``/``passage:`` prefixes and degrade without them."""
    lowered = model_name.lower()
    if "e5" in lowered.replace("-", "").split("/")[-1] or "/e5" in lowered or lowered.startswith("e5"):
        return "query: ", "passage: "
    return "", ""


class Encoder:
    def __init__(self, model: str | None = None, batch_size: int = 128, query_prefix: str | None = None,
                 passage_prefix: str | None = None, cache_size: int = 100_000, device: str | None = None,
                 max_seq_length: int | None = 256):
        self.name = canonical_embedder_name(model)
        self.model = load_embedder(model, device=device)
        if max_seq_length:
            self.model.max_seq_length = min(self.model.max_seq_length or max_seq_length, max_seq_length)
        q, p = _default_prefixes(self.name)
        self.query_prefix = q if query_prefix is None else query_prefix
        self.passage_prefix = p if passage_prefix is None else passage_prefix
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def _encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=progress)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_passages(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        return self._encode([self.passage_prefix + t for t in texts], progress=progress)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Embeds queries, serving repeats from the LRU cache; misses go to the model in one batch."""
        missing = list(dict.fromkeys(q for q in queries if q not in self._cache))
        self.cache_hits += len(queries) - sum(1 for q in queries if q in missing)
        self.cache_misses += len(missing)
        if missing:
            for q, v in zip(missing, self._encode([self.query_prefix + q for q in missing])):
                self._cache[q] = v
        out = np.empty((len(queries), self.dim), dtype=np.float32)
        for i, q in enumerate(queries):
            out[i] = self._cache[q]
            self._cache.move_to_end(q)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """Content hash of a corpus (ids and contents, in order): what an index was built from."""
    digest = hashlib.sha256()
    for p in passages:
        digest.update(p.id.encode())
        digest.update(b"\0")
        digest.update(p.contents.encode())
        digest.update(b"\1")
    return digest.hexdigest()[:16]


def corpus_embeddings(encoder: Encoder, passages: Sequence[Passage], progress: bool = True,
                      cache: bool = True) -> np.ndarray:
    """Passage embeddings, cached on disk by (embedder, corpus fingerprint): encoding is the slow step."""
    key = hashlib.sha256(f"{encoder.name}|{encoder.passage_prefix}|{corpus_fingerprint(passages)}".encode())
    path = cache_dir() / "embeddings" / f"{key.hexdigest()[:20]}.npy"
    if cache and path.is_file():
        vectors = np.load(path, mmap_mode="r")  # disk-backed: large corpora need not sit in RAM
        if vectors.shape == (len(passages), encoder.dim):
            return vectors
    vectors = encoder.encode_passages([p.contents for p in passages], progress=progress)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial.npy")
        np.save(tmp, vectors)
        tmp.rename(path)
    return vectors

