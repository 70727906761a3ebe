"""Index builds for a corpus one process should not hold: stream it from disk, embed it in shards (in
this process, or on Ray Data's actor pool across a cluster), train on a sample, add the codes shard by
shard. The output folder is the one :func:`~kunlunlab.retrieval.retriever.build_retriever` +
:func:`~kunlunlab.retrieval.store.save_retriever` write (same index files, ``corpus.jsonl`` and manifest
keys, plus a ``build`` entry), so ``load_retriever`` and ``serve-retriever`` read it unchanged.

The paper encodes its corpus with Spark on 16 nodes (§3.1.1); the workbench's path to that scale is Ray
Data (``engine="ray"``): ``read_json`` of the corpus, ``map_batches`` with a fixed pool of actors that each
hold one embedder (one GPU per actor where the cluster has GPUs), batches consumed in corpus order.

Steps (each holds at most one block or shard of passages/vectors in the driver's memory):

1. corpus pass: the corpus streams through :func:`~kunlunlab.data.loaders.iter_corpus` (FlashRAG jsonl line
   by line) into ``<out>/corpus.jsonl`` (FlashRAG ``{id, contents}``) and the corpus fingerprint;
2. embedding into ``<out>/shards/emb-NNNNN.npy`` of ``shard_rows`` rows: ``stream`` encodes blocks of
   ``block_rows`` passages here; ``ray`` reads ``corpus.jsonl`` with Ray Data and embeds on the actors,
   the driver writes the shards and checks every id against the corpus order;
3. the shards are copied into one ``.npy`` (a memory map, never in RAM): the exact re-rank store of the
   clustering retriever (``<out>/vectors.npy``), or the training source of the other kinds (removed after);
4. training on it as the in-process build trains (the clustering retriever's sample rows come from its
   seed; IVF-PQ trains on every row, FAISS subsampling as it does in process);
5. the codes are added shard by shard, the index saved, the manifest written.

Same corpus, same embedder: the same index as the in-process build, up to the last float bits of the
embeddings (sentence-transformers pads each encoding batch to its longest passage, and the batches
differ); ``tests/retrieval/test_sharded_build.py`` checks the top-10 of both builds.
"""
from __future__ import annotations

import resource
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from kunlunlab.data.loaders import flashrag_passage, iter_corpus
from kunlunlab.data.types import Passage
from kunlunlab.retrieval.clustered import ClusterRetriever
from kunlunlab.retrieval.encoder import CorpusFingerprint, Encoder
from kunlunlab.retrieval.indexes import IVFPQIndex
from kunlunlab.retrieval.retriever import IndexConfig, encoder_for, make_index
from kunlunlab.retrieval.store import CORPUS, corpus_line, write_manifest

ENGINES = ("inprocess", "stream", "ray")
SHARDS = "shards"


@dataclass
class ShardedBuildConfig:
    engine: str = "stream"  # "stream": embed here, block by block; "ray": Ray Data actor pool
    shard_rows: int = 50_000  # vectors per embedding shard file (and per add call)
    block_rows: int = 1024  # passages per embedding call (one Ray Data batch)
    address: str | None = None  # ray: a running cluster ("auto", "ray://host:10001"); None: a local Ray
    num_cpus: int | None = None  # ray, local: CPUs of the local Ray (None: the machine's)
    actors: int = 0  # ray: embedder actors (0: one per GPU, else one per CPU less one for reading)
    keep_shards: bool = False  # keep <out>/shards after the build

    def __post_init__(self):
        if self.engine not in ENGINES[1:]:
            raise ValueError(f"a sharded build's engine is 'stream' or 'ray', got {self.engine!r}")
        if self.shard_rows < 1 or self.block_rows < 1 or self.actors < 0:
            raise ValueError("shard_rows and block_rows must be ≥ 1, actors ≥ 0")


class CorpusTooSmall(ValueError):
    """The corpus has fewer passages than the index kind needs to train."""


def min_corpus_size(config: IndexConfig) -> int:
    """The fewest passages an index of ``config`` trains on. FAISS's k-means needs at least as many training
    vectors as centroids: IVF-PQ its ``nlist`` coarse clusters and the 2^nbits codes of each sub-quantizer; the
    clustering retriever the 16 codes of its 4-bit fast scan (256 with 8-bit codes or ``rerank="pq"``; its own
    cluster count shrinks to the corpus). Flat, HNSW and BM25 index a corpus of any size."""
    if config.kind == "ivfpq":
        return max(config.ivfpq.nlist, 2 ** config.ivfpq.nbits)
    if config.kind == "cluster":
        return 256 if (not config.cluster.fast_scan or config.cluster.rerank == "pq") else 16
    return 1


def check_corpus_size(config: IndexConfig, n: int) -> None:
    """A :class:`CorpusTooSmall` line when ``n`` passages are too few for ``config``: the smallest size its
    kind needs and what would index them (checked before anything is embedded)."""
    need = min_corpus_size(config)
    if n >= need:
        return
    works = ["--kind flat (exact search, any size)"]
    if config.kind == "ivfpq" and n >= 2 ** config.ivfpq.nbits:
        works.insert(0, f"--nlist {2 ** int(np.log2(n))} or fewer")
    if config.kind != "cluster" and n >= min_corpus_size(IndexConfig(kind="cluster")):
        works.append("--kind cluster")
    raise CorpusTooSmall(f"a corpus of {n} passages is too small for --kind {config.kind}, which needs at least "
                         f"{need} to train: use {' or '.join(works)}")


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux: ru_maxrss in KiB). Counts memory-mapped pages that were
    resident too, so for a build over a memory map it overstates what the build needs."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_corpus(passages: Iterable[Passage], out: Path) -> tuple[int, str]:
    """Step 1: ``<out>/corpus.jsonl`` from a stream of passages; (passages, fingerprint)."""
    fingerprint, n = CorpusFingerprint(), 0
    tmp = out / (CORPUS + ".partial")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for passage in passages:
                fh.write(corpus_line(passage))
                fingerprint.update(passage)
                n += 1
    except BaseException:  # a malformed line, a read error, Ctrl-C: no half-written corpus stays behind
        tmp.unlink()
        raise
    if n == 0:
        tmp.unlink()
        raise ValueError("cannot build an index over an empty corpus")
    tmp.replace(out / CORPUS)
    return n, fingerprint.hexdigest()


def _corpus_blocks(path: Path, rows: int) -> Iterator[list[Passage]]:
    block: list[Passage] = []
    for passage in iter_corpus(path):
        block.append(passage)
        if len(block) == rows:
            yield block
            block = []
    if block:
        yield block


def _stream_vectors(cfg: ShardedBuildConfig, corpus: Path, encoder: Encoder) -> Iterator[tuple[list[str], np.ndarray]]:
    for block in _corpus_blocks(corpus, cfg.block_rows):
        yield [p.id for p in block], encoder.encode_passages([p.contents for p in block])


class PassageEmbedder:
    """A Ray Data actor: one embedder, loaded once, encoding batches of ``corpus.jsonl`` rows."""

    def __init__(self, embedder: str | None, passage_prefix: str, device: str | None, threads: int,
                 passage_precision: str = "float32"):
        import torch  # deferred: only the Ray actor needs torch, inside the worker

        if device != "cuda":
            torch.set_num_threads(max(1, threads))  # the actor's CPU share, not every core of the node
        self.encoder = Encoder(embedder, passage_prefix=passage_prefix, device=device,
                               passage_precision=passage_precision)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # the contents as the in-process build encodes them (Passage.contents of the parsed line)
        texts = [flashrag_passage("", str(c)).contents for c in batch["contents"]]
        return {"id": np.asarray([str(i) for i in batch["id"]]), "vector": self.encoder.encode_passages(texts)}


def _ray_vectors(cfg: ShardedBuildConfig, corpus: Path, encoder: Encoder, log) -> Iterator[tuple[list[str], np.ndarray]]:
    import ray  # deferred: optional: only Ray Data builds need it

    started = not ray.is_initialized()
    if started:
        if cfg.address:
            ray.init(address=cfg.address, log_to_driver=False)
        else:
            ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
        actors = cfg.actors or (gpus if gpus else max(1, cpus - 1))
        threads = 1 if gpus else max(1, (cpus - 1) // actors)
        log(f"ray: {cpus} CPUs, {gpus} GPUs: {actors} embedder actor(s) "
            f"({'1 GPU' if gpus else f'{threads} CPU thread(s)'} each)")
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # batches come back in corpus order
        dataset = ray.data.read_json(str(corpus), lines=True).map_batches(
            PassageEmbedder, batch_size=cfg.block_rows, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=actors), num_gpus=1 if gpus else 0, num_cpus=0 if gpus else threads,
            fn_constructor_kwargs={"embedder": encoder.name, "passage_prefix": encoder.passage_prefix,
                                   "device": "cuda" if gpus else "cpu", "threads": threads,
                                   "passage_precision": encoder.passage_precision})
        for batch in dataset.iter_batches(batch_size=cfg.block_rows, batch_format="numpy"):
            yield [str(i) for i in batch["id"]], np.asarray(batch["vector"], dtype=np.float32)
    finally:
        if started:
            ray.shutdown()


def embed_shards(cfg: ShardedBuildConfig, corpus: Path, encoder: Encoder, out: Path, n: int, log=print) -> list[Path]:
    """Step 2: shards of ``shard_rows`` vectors in corpus order; every id checked against ``corpus.jsonl``."""
    folder = out / SHARDS
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    source = _ray_vectors(cfg, corpus, encoder, log) if cfg.engine == "ray" else _stream_vectors(cfg, corpus, encoder)
    expected = (p.id for p in iter_corpus(corpus))
    shards: list[Path] = []
    pending: list[np.ndarray] = []
    held = done = 0
    t0 = time.perf_counter()

    def flush() -> None:
        nonlocal held
        path = folder / f"emb-{len(shards):05d}.npy"
        np.save(path, np.concatenate(pending))
        shards.append(path)
        pending.clear()
        held = 0

    for ids, vectors in source:
        for i, got in enumerate(ids):
            want = next(expected, None)
            if got != want:
                raise RuntimeError(f"embedding out of corpus order at row {done + i}: got id {got!r}, expected {want!r}")
        if vectors.shape != (len(ids), encoder.dim):
            raise RuntimeError(f"the embedder returned {vectors.shape} vectors for {len(ids)} passages")
        while len(vectors):
            take = cfg.shard_rows - held
            pending.append(vectors[:take])
            held += len(vectors[:take])
            vectors = vectors[take:]
            if held == cfg.shard_rows:
                flush()
        done += len(ids)
        if done % (10 * cfg.block_rows) < len(ids):
            rate = done / max(time.perf_counter() - t0, 1e-9)
            log(f"embedded {done}/{n} passages ({rate:.0f}/s)")
    if held:
        flush()
    if done != n or next(expected, None) is not None:
        raise RuntimeError(f"embedded {done} passages of the corpus's {n}")
    return shards


def concatenate_shards(shards: list[Path], path: Path, dim: int) -> np.ndarray:
    """Step 3: one ``.npy`` of every row, appended shard by shard with plain writes (a memory map written
    through would keep every page resident in this process); returned read-only memory-mapped."""
    n = sum(np.load(s, mmap_mode="r").shape[0] for s in shards)
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
                                                  "fortran_order": False, "shape": (n, dim)})
        for shard in shards:
            block = np.load(shard)
            if block.ndim != 2 or block.shape[1] != dim:
                raise ValueError(f"{shard} holds vectors of shape {block.shape}, expected (rows, {dim})")
            fh.write(np.ascontiguousarray(block, dtype="<f4").tobytes())
    return np.load(path, mmap_mode="r")


class ShardRows:
    """The rows of a list of shard files as one array-like for sampling (``len``, ``shape``, ``rows[sorted
    indices]``): each shard is memory-mapped only while its rows are read, so sampling 100k of 1M rows
    keeps at most one shard's pages resident (a memory map of all rows fills with read-ahead pages)."""

    def __init__(self, shards: list[Path]):
        self.shards = list(shards)
        sizes = [np.load(s, mmap_mode="r").shape for s in self.shards]
        self.starts = np.cumsum([0] + [size[0] for size in sizes])
        self.shape = (int(self.starts[-1]), int(sizes[0][1]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for i, shard in enumerate(self.shards):
            mine = np.flatnonzero(shard_of == i)
            if len(mine):
                block = np.load(shard, mmap_mode="r")
                out[mine] = block[rows[mine] - self.starts[i]]
                del block
        return out


def _shard_arrays(shards: list[Path]) -> Iterator[np.ndarray]:
    for shard in shards:
        yield np.load(shard)


def index_from_shards(shards: list[Path], index_config: IndexConfig, dim: int, out: Path):
    """Steps 3–5: the index over the vectors of ``shards`` (in order), saved into ``out``; (index, seconds
    per step). Holds one shard and the training sample in RAM, never every vector."""
    seconds: dict[str, float] = {}
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index = make_index(index_config, dim)
    exact_store = isinstance(index, ClusterRetriever) and index.config.rerank == "exact"
    vector_path = out / "vectors.npy" if exact_store else shards[0].parent / "all.npy"
    vectors = concatenate_shards(shards, vector_path, dim)
    seconds["concatenate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if isinstance(index, ClusterRetriever):
        index.train(ShardRows(shards))  # draws its sample rows (the in-process build's rows: same seed)
    elif isinstance(index, IVFPQIndex):
        index.train(vectors)  # reads every row, as in process (FAISS subsamples for k-means)
    seconds["train"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if isinstance(index, ClusterRetriever):
        index.add_shards(_shard_arrays(shards), vector_file=vector_path if exact_store else None)
    else:
        for shard in _shard_arrays(shards):
            index.add(shard)
    seconds["add"] = time.perf_counter() - t0
    del vectors
    if not exact_store:
        vector_path.unlink()
    index.save(out)
    return index, seconds


def build_sharded(source: Path | Iterable[Passage], index_config: IndexConfig, out: str | Path,
                  cfg: ShardedBuildConfig | None = None, encoder: Encoder | None = None, log=print) -> dict:
    """Builds and saves an index over ``source`` (a corpus file, streamed, or an iterable of passages) into
    ``out``; returns the manifest (its ``build`` entry: engine, shards, seconds per step, peak memory)."""
    cfg = cfg or ShardedBuildConfig()
    if index_config.kind == "bm25":
        raise ValueError("bm25 indexes text, not vectors: build it in process (engine 'inprocess')")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    passages = iter_corpus(source) if isinstance(source, (str, Path)) else iter(source)
    n, fingerprint = write_corpus(passages, out)
    seconds["corpus"] = time.perf_counter() - t0
    check_corpus_size(index_config, n)
    log(f"corpus: {n} passages")

    encoder = encoder or encoder_for(index_config)
    t0 = time.perf_counter()
    shards = embed_shards(cfg, out / CORPUS, encoder, out, n, log)
    seconds["embed"] = time.perf_counter() - t0

    index, steps = index_from_shards(shards, index_config, encoder.dim, out)
    seconds.update(steps)
    if not cfg.keep_shards:
        shutil.rmtree(out / SHARDS)
    build = {**{k: v for k, v in asdict(cfg).items() if k != "keep_shards"}, "shards": len(shards),
             "seconds": {k: round(v, 2) for k, v in seconds.items()}, "peak_rss_mb": round(peak_rss_mb(), 1)}
    return write_manifest(out, index_config.kind, encoder, fingerprint, n, index.params(), build=build)
