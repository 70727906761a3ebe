"""Exact top-k over N vectors on a device (``exact-search``). Run as ``python -m kunlunlab.bench exact-search``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class ExactSearchBenchConfig:
    device: str = "cpu"          # cpu | cuda | cuda:N | auto
    dim: int = 768
    n: str = "100000"            # corpus vectors, or "max": the most that fit in memory_fraction of free memory
    queries: int = 64            # one batch of queries, searched at once
    dtype: str = "float16"       # the corpus matrix on a GPU / in torch: float32 | float16 | bfloat16
    backend: str = "auto"        # auto | faiss | torch (IndexConfig.flat_backend)
    k: int = 10
    repeats: int = 5             # timed searches of the batch; the median is reported
    memory_fraction: float = 0.8
    seed: int = 0


GEN_ROWS = 1 << 18  # random vectors drawn per step (float32): 0.8 GB of scratch at 768 dimensions


def free_memory_bytes(device: str) -> int:
    """Free memory where the vectors will live: the GPU's (``torch.cuda.mem_get_info``) or the host's
    (``MemAvailable`` of /proc/meminfo)."""
    import torch

    if device != "cpu":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def exact_search_footprint(backend: str, dtype: str, dim: int, queries: int, chunk_rows: int) -> tuple[int, int]:
    """(bytes per corpus vector, fixed bytes besides the vectors) of an exact index being filled and searched:
    the stored vectors, the float32 rows drawn per step and, for torch, one block's score matrix."""
    import torch

    stored = 4 if backend == "faiss" or (backend == "faiss-gpu" and dtype == "float32") else \
        2 if backend == "faiss-gpu" else getattr(torch, dtype).itemsize
    fixed = 3 * GEN_ROWS * dim * 4 + (1 << 29)  # drawn rows, normalised, cast; 0.5 GB of allocator slack
    if backend == "torch":
        fixed += 2 * queries * chunk_rows * stored  # scores of one block and torch.topk's working copy
    if backend == "faiss-gpu":
        fixed += 2 << 30  # StandardGpuResources' scratch memory
    return dim * stored, fixed


def bench_exact_search(cfg: ExactSearchBenchConfig) -> dict:
    """Exact top-k of one batch of ``queries`` random unit queries over ``n`` random unit vectors: the flat
    index on ``device`` as the retriever runs it (:func:`kunlunlab.retrieval.indexes.place_flat`: FAISS on the
    CPU; on a GPU faiss-gpu or torch's matrix product in ``dtype``). The vectors are drawn where they are
    stored (on the GPU for torch), so 21M x 768 needs no host copy; ``n="max"`` is the most that fit in
    ``memory_fraction`` of the free memory, and a given ``n`` that does not fit is refused before anything is
    allocated."""
    import torch

    from kunlunlab.retrieval.indexes import (FlatIndex, GpuFaissFlatIndex, TorchFlatIndex, flat_backend,
                                             resolve_device)

    device = resolve_device(cfg.device)
    backend = flat_backend(cfg.backend, device, cfg.dtype)
    if cfg.queries < 1 or cfg.k < 1 or cfg.repeats < 1 or cfg.dim < 1 or not 0 < cfg.memory_fraction <= 1:
        raise ValueError("queries, k, repeats and dim must be at least 1 and memory_fraction in (0, 1]")
    chunk_rows = 1 << 22
    per_vector, fixed = exact_search_footprint(backend, cfg.dtype, cfg.dim, cfg.queries, chunk_rows)
    free = free_memory_bytes(device)
    n_max = max(0, int((cfg.memory_fraction * free - fixed) // per_vector))
    if cfg.n == "max":
        n = n_max
    else:
        try:
            n = int(float(cfg.n))
        except ValueError:
            raise ValueError(f"n must be a number of vectors or 'max', not {cfg.n!r}") from None
        if n > n_max:
            raise ValueError(f"{n} vectors of {cfg.dim} dimensions need {(n * per_vector + fixed) / 2**30:.1f} GiB "
                             f"on {device} ({backend}); {cfg.memory_fraction:.0%} of the {free / 2**30:.1f} GiB free "
                             f"holds {n_max}: use --n max or a smaller --n")
    if n < cfg.k:
        raise ValueError(f"{n} vectors cannot give a top-{cfg.k} (free memory: {free / 2**30:.1f} GiB)")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    def draw(rows: int) -> "torch.Tensor":
        x = torch.randn(rows, cfg.dim, generator=generator, device=device)
        return torch.nn.functional.normalize(x, dim=1)

    start = time.perf_counter()
    if backend == "torch":
        index = TorchFlatIndex(cfg.dim, device, cfg.dtype, query_batch=cfg.queries, chunk_rows=chunk_rows,
                               keep_host=False)
        dtype = getattr(torch, cfg.dtype)
        for first in range(0, n, chunk_rows):
            block = torch.empty((min(chunk_rows, n - first), cfg.dim), dtype=dtype, device=device)
            for i in range(0, len(block), GEN_ROWS):
                block[i:i + GEN_ROWS] = draw(min(GEN_ROWS, len(block) - i)).to(dtype)
            index.add_tensor(block)
            del block
    else:
        index = FlatIndex(cfg.dim) if backend == "faiss" else \
            GpuFaissFlatIndex(cfg.dim, device, cfg.dtype, keep_host=False)
        for first in range(0, n, GEN_ROWS):
            index.add(draw(min(GEN_ROWS, n - first)).cpu().numpy())
    if device != "cpu":
        torch.cuda.synchronize(device)
    fill_seconds = time.perf_counter() - start
    queries = draw(cfg.queries).cpu().numpy()
    index.search(queries, cfg.k)  # warm-up: kernels, allocator
    times = []
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        scores, rows = index.search(queries, cfg.k)  # numpy out: the device has finished
        times.append(time.perf_counter() - t0)
    if not ((rows >= 0) & (rows < n)).all():
        raise RuntimeError("the search returned rows outside the corpus")
    median = float(np.median(times))
    stored = "float32" if backend == "faiss" or (backend == "faiss-gpu" and cfg.dtype == "float32") else \
        ("float16" if backend == "faiss-gpu" else cfg.dtype)
    out = {"device": device, "device_name": torch.cuda.get_device_name(device) if device != "cpu" else "cpu",
           "backend": backend, "dtype": stored, "dim": cfg.dim, "n": n, "n_max": n_max, "queries": cfg.queries,
           "k": cfg.k, "fill_seconds": round(fill_seconds, 2), "search_ms_per_batch": round(1000 * median, 3),
           "search_ms_per_batch_min": round(1000 * min(times), 3),
           "ms_per_query": round(1000 * median / cfg.queries, 4), "queries_per_s": round(cfg.queries / median, 1),
           "index_gib": round(n * per_vector / 2**30, 2), "free_gib_before": round(free / 2**30, 2),
           "top1_score_mean": round(float(scores[:, 0].mean()), 4), "repeats": cfg.repeats}
    if device != "cpu":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out
