"""Save and load a retriever with a manifest; refuse to load against another embedder or corpus."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from kunlunlab.data.loaders import load_corpus
from kunlunlab.data.types import Passage
from kunlunlab.models import canonical_embedder_name
from kunlunlab.retrieval.clustered import ClusterRetriever
from kunlunlab.retrieval.encoder import Encoder, corpus_fingerprint
from kunlunlab.retrieval.indexes import BM25Index, FlatIndex, HNSWIndex, IVFPQIndex
from kunlunlab.retrieval.retriever import IndexConfig, Retriever

MANIFEST = "manifest.json"
CORPUS = "corpus.jsonl"
_LOADERS = {"flat": FlatIndex, "ivfpq": IVFPQIndex, "hnsw": HNSWIndex, "cluster": ClusterRetriever, "bm25": BM25Index}


class IndexMismatchError(ValueError):
    """The saved index was built with another embedder or over another corpus."""


def save_retriever(retriever: Retriever, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    retriever.index.save(folder)
    with open(folder / CORPUS, "w", encoding="utf-8") as fh:
        for p in retriever.passages:
            fh.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")
    manifest = {
        "kind": retriever.kind,
        "embedder": retriever.encoder.name if retriever.encoder else None,
        "dim": retriever.encoder.dim if retriever.encoder else None,
        "query_prefix": retriever.encoder.query_prefix if retriever.encoder else None,
        "passage_prefix": retriever.encoder.passage_prefix if retriever.encoder else None,
        "corpus_fingerprint": retriever.fingerprint,
        "n": len(retriever.passages),
        "params": retriever.index.params(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return folder


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no index at {folder} (missing {MANIFEST}); build one with "
                                "`kunlunlab build-index --out {folder}` or notebook 01")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise IndexMismatchError(f"{path} is not valid JSON: {err.msg}") from err


def load_retriever(folder: str | Path, embedder: str | None = None, passages: Sequence[Passage] | None = None,
                   encoder: Encoder | None = None) -> Retriever:
    """Loads a saved retriever. ``embedder``/``passages``, when given, must match what it was built with."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    kind = manifest.get("kind")
    if kind not in _LOADERS:
        raise IndexMismatchError(f"{folder}: unknown index kind {kind!r} in manifest")
    wanted = encoder.name if encoder else (canonical_embedder_name(embedder) if embedder else None)
    if wanted is not None and manifest["embedder"] is not None and wanted != manifest["embedder"]:
        raise IndexMismatchError(f"{folder} was built with embedder {manifest['embedder']!r}, not {wanted!r}: "
                                 "rebuild the index or use the embedder it was built with")
    if passages is not None:
        fingerprint = corpus_fingerprint(passages)
        if fingerprint != manifest["corpus_fingerprint"]:
            raise IndexMismatchError(f"{folder} was built over another corpus (fingerprint "
                                     f"{manifest['corpus_fingerprint']}, yours {fingerprint}): rebuild the index")
    else:
        passages = load_corpus(folder / CORPUS)
    params = dict(manifest["params"], n=manifest["n"])
    index = _LOADERS[kind].load(folder, params)
    if kind != "bm25":
        encoder = encoder or Encoder(manifest["embedder"], query_prefix=manifest.get("query_prefix"),
                                     passage_prefix=manifest.get("passage_prefix"))
        if encoder.dim != manifest["dim"]:
            raise IndexMismatchError(f"{folder}: index dimension {manifest['dim']} != embedder dimension {encoder.dim}")
    config = IndexConfig(kind=kind, embedder=manifest["embedder"])
    if kind in ("ivfpq", "hnsw", "cluster"):
        setattr(config, kind, index.config)  # the knobs the index was saved with
    return Retriever(passages, index, encoder if kind != "bm25" else None, config,
                     fingerprint=manifest["corpus_fingerprint"])
