"""One way to get a retriever, wherever its index lives, and the published retrieval presets.

:func:`open_retriever` is what evaluation and training call: a retrieval service (``kunlunlab
serve-retriever`` or any Search-R1 ``POST /retrieve`` server), else a saved index folder (what ``kunlunlab
build-index`` writes), else an index built here over the given passages. Only the last embeds the corpus
in this process.

A preset (``experiments/configs/presets/*.json``, :func:`load_preset`) names a published setting: the corpus
layout, the :class:`~kunlunlab.retrieval.retriever.IndexConfig` the index is built with (embedder, its
prefixes, the index kind) and the passages per search; ``kunlunlab build-index --preset`` builds with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kunlunlab.configs import build_dataclass, read_config_file
from kunlunlab.data.types import Passage
from kunlunlab.retrieval.retriever import IndexConfig, Retriever, build_retriever
from kunlunlab.retrieval.client import RemoteRetriever
from kunlunlab.retrieval.store import load_retriever


def open_retriever(url: str | None = None, index_dir: str | Path | None = None,
                   passages: Sequence[Passage] | None = None, index_config: IndexConfig | None = None, *,
                   attempts: int = 3, backoff: float = 0.25, timeout: float = 30.0) -> Retriever | RemoteRetriever:
    """A retriever with ``search(queries, k) -> list[list[Hit]]``, from the first source given:

    1. ``url``: the retrieval service there (:class:`~kunlunlab.retrieval.client.RemoteRetriever`), checked
       before it is returned (``GET /health``: up and ready, and, if ``index_config.embedder`` is set, built
       with that embedder). Requests are tried ``attempts`` times with exponential ``backoff`` seconds and a
       ``timeout`` each; a service that stays down raises ``RetrievalServiceError`` naming the URL and the
       cause. ``passages`` and ``index_dir`` are not used.
    2. ``index_dir``: the saved index folder, loaded without embedding its corpus
       (:func:`~kunlunlab.retrieval.store.load_retriever`); ``passages``, when given, must be the corpus it
       was built over (``IndexMismatchError`` otherwise), ``index_config`` brings where it searches
       (``device``, ``flat_backend``, ``gpu_dtype``, ``query_precision``) and, when set, the embedder and
       prefixes it must have been built with; its ``kind`` is the manifest's.
    3. ``passages``: an index built here over them with ``index_config`` (default ``IndexConfig()``); the
       corpus is embedded (or read from the embedding cache).

    Neither given: ``ValueError``. Service, saved index and in-process build give the same hit lists for the
    same index (``tests/retrieval/test_retrieval_service_eval.py``)."""
    if url:
        remote = RemoteRetriever(url, attempts=attempts, backoff=backoff, timeout=timeout)
        remote.check(embedder=index_config.embedder if index_config else None)
        return remote
    if index_dir:
        return load_retriever(index_dir, passages=passages, index_config=index_config)
    if passages is None:
        raise ValueError("open_retriever needs a service url, a saved index folder or the passages to index")
    return build_retriever(passages, index_config)


@dataclass
class RetrievalPreset:
    """A published retrieval setting: which corpus, how it is indexed, how many passages a search returns."""

    name: str = ""
    description: str = ""
    corpus: str = ""            # the corpus file the setting uses (a FlashRAG {"id", "contents"} jsonl)
    corpus_layout: str = "flashrag"  # {"id", "contents"} with contents = '"Title"\ntext' (wiki-18)
    index: IndexConfig = field(default_factory=IndexConfig)
    top_k: int = 3              # passages per search (the agent's rollout.top_k)

    def __post_init__(self):
        if self.corpus_layout != "flashrag":
            raise ValueError(f"corpus_layout {self.corpus_layout!r}: presets describe FlashRAG {{id, contents}} "
                             "corpora ('flashrag')")
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")


def load_preset(path: str | Path) -> RetrievalPreset:
    """A preset file (JSON of :class:`RetrievalPreset` fields, ``index`` an
    :class:`~kunlunlab.retrieval.retriever.IndexConfig`); a missing file, bad JSON or an unknown key is a
    ``FileNotFoundError`` / ``ValueError`` naming it."""
    return build_dataclass(RetrievalPreset, read_config_file(path, "retrieval preset"), f"preset {path}")
