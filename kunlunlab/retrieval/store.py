"""Save and load a retriever with a manifest; refuse to load against another embedder or corpus."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import faiss

from kunlunlab.data.loaders import load_corpus
from kunlunlab.data.types import Passage
from kunlunlab.models import canonical_embedder_name
from kunlunlab.retrieval.clustered import ClusterRetriever
from kunlunlab.retrieval.encoder import Encoder, corpus_fingerprint
from kunlunlab.retrieval.indexes import BM25Index, FlatIndex, HNSWIndex, IVFPQIndex, place_flat, resolve_device
from kunlunlab.retrieval.retriever import IndexConfig, Retriever

MANIFEST = "manifest.json"
CORPUS = "corpus.jsonl"
MANIFEST_KEYS = ["kind", "embedder", "dim", "corpus_fingerprint", "n", "params"]
_LOADERS = {"flat": FlatIndex, "ivfpq": IVFPQIndex, "hnsw": HNSWIndex, "cluster": ClusterRetriever, "bm25": BM25Index}


class IndexMismatchError(ValueError):
    """The saved index was built with another embedder or over another corpus."""


class CorruptIndexError(ValueError):
    """A file of the saved index is missing, truncated or not what the manifest describes."""


class OutFolderError(ValueError):
    """A build's output folder holds something the build must not mix with or silently replace."""


def check_out_folder(out: str | Path, overwrite: bool = False) -> None:
    """Refuses an ``out`` the build would clobber: a file, a folder holding another index (unless
    ``overwrite``), or a non-empty folder that holds no index (never emptied: its files are not the build's)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutFolderError(f"--out {out} is a file, not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MANIFEST).is_file():
        raise OutFolderError(f"--out {out} is a folder that is not empty and holds no index: choose a new or empty "
                             "folder (nothing there is overwritten)")
    if not overwrite:
        try:
            manifest = read_manifest(out)
            what = f"a {manifest.get('kind')} index of {manifest.get('n')} passages"
        except ValueError:  # a damaged manifest: still an index folder, described without its contents
            what = "an index"
        raise OutFolderError(f"--out {out} holds {what}: pass --overwrite to replace it, or choose another --out")


@contextmanager
def building_into(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """A new folder beside ``out`` to build an index in, renamed to ``out`` when the block ends: a failed or
    interrupted build leaves nothing behind (its folder is removed) and ``out`` is never half-written. With
    ``overwrite`` an index already in ``out`` is replaced whole, its files removed once the new one is in
    place; without it, or for a folder that holds no index, :func:`check_out_folder` refuses first."""
    out = Path(out)
    check_out_folder(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.building-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:  # an error or Ctrl-C: the half-built folder goes, then the exception goes on
        shutil.rmtree(tmp)
        raise
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists():
        old = out.with_name(f".{out.name}.replaced-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


def _describe(err: BaseException) -> str:
    """One line from a loader's error (FAISS puts its C++ location before the reason)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
    text = re.sub(r"^Error in .*? at \S+:\d+: (Error: )?", "", lines[-1])
    return text if len(text) <= 300 else text[:297] + "..."


def save_retriever(retriever: Retriever, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    retriever.index.save(folder)
    with open(folder / CORPUS, "w", encoding="utf-8") as fh:
        for p in retriever.passages:
            fh.write(corpus_line(p))
    write_manifest(folder, retriever.kind, retriever.encoder, retriever.fingerprint, len(retriever.passages),
                   retriever.index.params())
    return folder


def corpus_line(passage: Passage) -> str:
    """One line of the saved ``corpus.jsonl`` (FlashRAG's ``{id, contents}``)."""
    return json.dumps({"id": passage.id, "contents": passage.contents}, ensure_ascii=False) + "\n"


def write_manifest(folder: Path, kind: str, encoder: Encoder | None, fingerprint: str, n: int, params: dict,
                   **extra) -> dict:
    """The manifest :func:`load_retriever` checks an index folder against (``extra``: how it was built)."""
    manifest = {
        "kind": kind,
        "embedder": encoder.name if encoder else None,
        "dim": encoder.dim if encoder else None,
        "query_prefix": encoder.query_prefix if encoder else None,
        "passage_prefix": encoder.passage_prefix if encoder else None,
        "passage_precision": encoder.passage_precision if encoder else None,
        "corpus_fingerprint": fingerprint,
        "n": n,
        "params": params,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no index at {folder} (missing {MANIFEST}); build one with "
                                f"`kunlunlab build-index --out {folder}` or notebook 01")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise IndexMismatchError(f"{path} is not valid JSON: {getattr(err, 'msg', err)}") from err
    if not isinstance(manifest, dict):
        raise CorruptIndexError(f"{path} is not an index manifest (a JSON {type(manifest).__name__}, not an object)")
    return manifest


def load_retriever(folder: str | Path, embedder: str | None = None, passages: Sequence[Passage] | None = None,
                   encoder: Encoder | None = None, index_config: IndexConfig | None = None) -> Retriever:
    """Loads a saved retriever; the corpus is not embedded again. ``embedder``/``passages``, when given, must
    match what it was built with. ``index_config`` brings the settings that belong to serving, not to the
    build: ``device``, ``flat_backend`` and ``gpu_dtype`` (where a flat index searches), ``query_precision``
    and ``threads``; its ``embedder`` and prefixes, when set, must match the manifest (the queries must be
    encoded as the passages were), and its ``kind`` is not used (the manifest's is)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    runtime = index_config or IndexConfig(kind="flat")
    embedder = embedder or runtime.embedder
    for key in ("query_prefix", "passage_prefix"):
        wanted_prefix = getattr(runtime, key)
        if wanted_prefix is not None and key in manifest and manifest[key] != wanted_prefix:
            raise IndexMismatchError(f"{folder} was built with {key} {manifest[key]!r}, not {wanted_prefix!r}: "
                                     "rebuild the index or use the prefixes it was built with")
    kind = manifest.get("kind")
    if kind not in _LOADERS:
        raise IndexMismatchError(f"{folder}: unknown index kind {kind!r} in manifest")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise CorruptIndexError(f"{folder / MANIFEST} is incomplete (missing {', '.join(missing)}): rebuild the index")
    wanted = encoder.name if encoder else (canonical_embedder_name(embedder) if embedder else None)
    if wanted is not None and manifest["embedder"] is not None and wanted != manifest["embedder"]:
        raise IndexMismatchError(f"{folder} was built with embedder {manifest['embedder']!r}, not {wanted!r}: "
                                 "rebuild the index or use the embedder it was built with")
    if passages is not None:
        fingerprint = corpus_fingerprint(passages)
        if fingerprint != manifest["corpus_fingerprint"]:
            raise IndexMismatchError(f"{folder} was built over another corpus (fingerprint "
                                     f"{manifest['corpus_fingerprint']}, yours {fingerprint}): rebuild the index")
    try:  # everything read from the folder: a missing or damaged file is named here, not deep in a search
        if passages is None:
            passages = load_corpus(folder / CORPUS)
            if corpus_fingerprint(passages) != manifest["corpus_fingerprint"]:
                raise CorruptIndexError(f"{CORPUS} does not match the manifest ({len(passages)} passages, "
                                        f"manifest n={manifest['n']})")
        params = dict(manifest["params"], n=manifest["n"])
        index = _LOADERS[kind].load(folder, params)
        ntotal = int(getattr(index, "ntotal", manifest["n"]))
        if ntotal != manifest["n"]:
            raise CorruptIndexError(f"the index holds {ntotal} vectors, the manifest says {manifest['n']}")
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise CorruptIndexError(f"{folder}: the saved index is incomplete or corrupt ({_describe(err)}); "
                                f"rebuild it with `kunlunlab build-index --out {folder}`") from err
    device = resolve_device(runtime.device)
    if kind == "flat":  # a loaded index only serves: the device copy is enough, the host's float32 copy goes
        index = place_flat(index, device, runtime.flat_backend, runtime.gpu_dtype, keep_host=False)
    if kind != "bm25":
        encoder = encoder or Encoder(manifest["embedder"], query_prefix=manifest.get("query_prefix"),
                                     passage_prefix=manifest.get("passage_prefix"), device=device,
                                     query_precision=runtime.query_precision)
        if encoder.dim != manifest["dim"]:
            raise IndexMismatchError(f"{folder}: index dimension {manifest['dim']} != embedder dimension {encoder.dim}")
    config = IndexConfig(kind=kind, embedder=manifest["embedder"], query_prefix=manifest.get("query_prefix"),
                         passage_prefix=manifest.get("passage_prefix"), device=runtime.device,
                         flat_backend=runtime.flat_backend, gpu_dtype=runtime.gpu_dtype,
                         query_precision=runtime.query_precision, threads=runtime.threads)
    if runtime.threads:
        faiss.omp_set_num_threads(runtime.threads)
    if kind in ("ivfpq", "hnsw", "cluster"):
        setattr(config, kind, index.config)  # the knobs the index was saved with
    return Retriever(passages, index, encoder if kind != "bm25" else None, config,
                     fingerprint=manifest["corpus_fingerprint"])
