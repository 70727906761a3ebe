"""Peak memory and time of a streamed (sharded) index build (``build``). Run as ``python -m kunlunlab.bench build``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kunlunlab.bench.retrieval import gaussian_mixture


@dataclass
class BuildBenchConfig:
    n: int = 10_000              # world passages the streamed build embeds (0: skip); real MiniLM embedding
    index_n: int = 1_000_000     # Gaussian vectors the index steps alone are measured on (0: skip)
    kind: str = "cluster"
    engine: str = "stream"       # stream | ray: the embedding engine of the streamed build
    passage_precision: str = "float32"  # the streamed build's corpus embedding (bfloat16: 3.1x faster here)
    shard_rows: int = 50_000
    part: str = "all"            # all (each part in its own process) | stream | shards | index_sharded | index_inprocess
    work_dir: str = ""           # default: a temporary folder, removed after
    seed: int = 0


def _gaussian_shards(n: int, shard_rows: int, folder, seed: int) -> list:
    """``n`` vectors of :func:`gaussian_mixture` written as shards, drawn one shard at a time (this process
    never holds more than one)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    draw, shards = gaussian_mixture(seed=seed), []
    for i, start in enumerate(range(0, n, shard_rows)):
        shards.append(folder / f"emb-{i:05d}.npy")
        np.save(shards[-1], draw(min(shard_rows, n - start)))
    return shards


def bench_build(cfg: BuildBenchConfig) -> dict:
    """Peak memory and time of an index build that streams (:mod:`kunlunlab.retrieval.sharded`), each part
    in its own process so each peak is its own: ``stream``, the whole streamed build of ``n`` world
    passages (corpus pass, embedding in shards, train, add); ``index_sharded``, the index steps alone
    (concatenate, train, add shard by shard, save) over ``index_n`` Gaussian vectors written as shards;
    ``index_inprocess``, the in-process build over the same vectors held in RAM, for contrast. Gaussian
    vectors stand in for embeddings at ``index_n`` because embedding 1M passages with MiniLM takes about
    2 hours on 2 CPU cores in float32 (145 passages/s; about an hour with ``passage_precision="bfloat16"``);
    the index steps' memory does not depend on what the vectors encode."""
    from kunlunlab.retrieval.retriever import IndexConfig  # deferred: see the module docstring

    if cfg.part == "all":
        return _run_parts(cfg)
    work = Path(cfg.work_dir)
    config = IndexConfig(kind=cfg.kind, passage_precision=cfg.passage_precision)
    if cfg.part == "stream":
        return _stream_part(cfg, work, config)
    if cfg.part == "shards":  # in a process of its own: drawing them costs memory the builds should not show
        shards = _gaussian_shards(cfg.index_n, cfg.shard_rows, work / "gauss", cfg.seed)
        return {"shards": len(shards), "vectors": cfg.index_n}
    return _index_part(cfg, work, config)


def _run_parts(cfg: BuildBenchConfig) -> dict:
    """``part="all"``: every part in a child process of its own (``python -m kunlunlab.bench build --part …``)
    over one work folder (a temporary one, removed after, unless ``work_dir`` is given)."""
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="kl-build-"))
    work.mkdir(parents=True, exist_ok=True)  # a --work-dir that does not exist yet
    out = {"n": cfg.n, "index_n": cfg.index_n, "kind": cfg.kind, "engine": cfg.engine,
           "passage_precision": cfg.passage_precision}
    parts = (["stream"] if cfg.n else []) + (["shards", "index_sharded", "index_inprocess"] if cfg.index_n else [])
    try:
        for part in parts:
            command = [sys.executable, "-m", "kunlunlab.bench", "build", "--part", part, "--work-dir", str(work)]
            for name, value in asdict(cfg).items():
                if name not in ("part", "work_dir"):
                    command += ["--" + name.replace("_", "-"), str(value)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"bench build --part {part} failed: {done.stderr[-3000:]}")
            out[part] = json.loads(done.stdout.strip().splitlines()[-1])
            print(part, json.dumps(out[part]), file=sys.stderr, flush=True)
    finally:
        if not cfg.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return out


def _stream_part(cfg: BuildBenchConfig, work: Path, config) -> dict:
    """``part="stream"``: the whole streamed build of ``n`` world passages from a corpus file."""
    from kunlunlab.retrieval.sharded import ShardedBuildConfig, build_sharded, peak_rss_mb  # deferred: see above

    corpus = work / "world.jsonl"
    if not corpus.is_file():  # the corpus file a user would bring (written in a child: the world is in RAM)
        script = ("import sys; from kunlunlab.data.world import World; from kunlunlab.retrieval.store import "
                  "corpus_line; f = open(sys.argv[1], 'w', encoding='utf-8'); "
                  "[f.write(corpus_line(p)) for p in World.generate(n_passages=int(sys.argv[2]), "
                  "seed=int(sys.argv[3])).passages]; f.close()")
        subprocess.run([sys.executable, "-c", script, str(corpus), str(cfg.n), str(cfg.seed)], check=True)
    start = time.perf_counter()
    manifest = build_sharded(corpus, config, work / "stream", ShardedBuildConfig(engine=cfg.engine,
                             shard_rows=cfg.shard_rows), log=lambda line: print(line, file=sys.stderr, flush=True))
    seconds = time.perf_counter() - start
    build = manifest["build"]
    return {"passages": manifest["n"], "seconds": round(seconds, 1), "seconds_by_step": build["seconds"],
            "passages_per_s": round(manifest["n"] / build["seconds"]["embed"], 1),
            "peak_rss_mb": round(peak_rss_mb(), 1)}


def _index_part(cfg: BuildBenchConfig, work: Path, config) -> dict:
    """``part="index_sharded"`` / ``"index_inprocess"``: the index steps alone over the Gaussian shards."""
    from kunlunlab.retrieval.retriever import make_index  # deferred: see the module docstring
    from kunlunlab.retrieval.sharded import index_from_shards, peak_rss_mb

    shards = sorted((work / "gauss").glob("emb-*.npy"))
    if not shards:
        raise FileNotFoundError(f"no shards in {work / 'gauss'}: run --part shards first (or --part all)")
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    if cfg.part == "index_sharded":
        index, steps = index_from_shards(shards, config, 384, work / "index_sharded")
        steps = {k: round(v, 1) for k, v in steps.items()}
    elif cfg.part == "index_inprocess":
        vectors = np.concatenate([np.load(s) for s in shards])  # what build_retriever is handed: every vector
        index = make_index(config, vectors.shape[1])
        if hasattr(index, "build"):  # the clustering retriever
            index.build(vectors)
        else:
            index.add(vectors)
        (work / "index_inprocess").mkdir(exist_ok=True)
        index.save(work / "index_inprocess")
        steps = {}
    else:
        raise ValueError(f"unknown part {cfg.part!r}")
    return {"vectors": int(index.ntotal), "seconds": round(time.perf_counter() - start, 1), "seconds_by_step": steps,
            "peak_rss_mb": round(peak_rss_mb(), 1), "peak_rss_mb_before": round(rss_before, 1),
            "ram_bytes_per_vector": round(index.bytes_per_vector(), 1)}
