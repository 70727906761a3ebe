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

from kunlunlab.models import ModelNotAvailableError
from kunlunlab.models import resolve_device as resolve_model_device


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


# ---------------------------------------------------------------------------- exact search on a device
SEARCH_DEVICES = ("cpu", "cuda", "auto")  # and cuda:N
FLAT_BACKENDS = ("auto", "faiss", "torch")
SEARCH_DTYPES = ("float32", "float16", "bfloat16")


def check_search_settings(device: str, backend: str, dtype: str) -> None:
    """ValueError naming the bad value: ``device`` cpu | cuda | cuda:N | auto, ``backend`` auto | faiss | torch,
    ``dtype`` float32 | float16 | bfloat16."""
    if device not in SEARCH_DEVICES and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"unknown device {device!r}; choose from {SEARCH_DEVICES} or cuda:N")
    if backend not in FLAT_BACKENDS:
        raise ValueError(f"unknown flat backend {backend!r}; choose from {FLAT_BACKENDS}")
    if dtype not in SEARCH_DTYPES:
        raise ValueError(f"unknown search dtype {dtype!r}; choose from {SEARCH_DTYPES}")


def resolve_device(device: str) -> str:
    """:func:`kunlunlab.models.resolve_device` (``auto``: this process's CUDA GPU when torch sees one, else ``cpu``)
    for a search device; a device this machine lacks is a ValueError, as every other bad search setting is."""
    check_search_settings(device, "auto", "float32")
    try:
        return resolve_model_device(device)
    except ModelNotAvailableError as err:
        raise ValueError(str(err)) from err


def faiss_gpu_available() -> bool:
    """Whether this FAISS build has GPU support (faiss-gpu) and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def flat_backend(backend: str, device: str, dtype: str) -> str:
    """The exact search that serves a flat index on a resolved ``device``: ``faiss`` (FAISS on the CPU),
    ``faiss-gpu`` (FAISS's GPU flat index: float32, or float16 storage) or ``torch`` (a matrix product on the
    device). ``auto``: FAISS on the CPU; on a GPU, faiss-gpu where FAISS has GPU support and the dtype is one
    it stores, else torch."""
    check_search_settings(device, backend, dtype)
    on_gpu = device != "cpu"
    if backend == "torch":
        return "torch"
    if not on_gpu:
        return "faiss"
    if backend == "auto":
        return "faiss-gpu" if faiss_gpu_available() and dtype != "bfloat16" else "torch"
    if not faiss_gpu_available():
        raise ValueError(f"flat backend 'faiss' on {device} needs FAISS with GPU support (faiss-gpu); this FAISS "
                         f"{faiss.__version__} has none: use backend 'torch' or 'auto'")
    if dtype == "bfloat16":
        raise ValueError("FAISS's GPU flat index stores float32 or float16, not bfloat16: use backend 'torch'")
    return "faiss-gpu"


def flat_vectors(index: faiss.IndexFlat) -> np.ndarray:
    """The float32 vectors of a FAISS flat index as a view, not a copy (21M x 768 is 64 GB); valid until the
    index changes."""
    n, d = int(index.ntotal), int(index.d)
    if n == 0:
        return np.empty((0, d), dtype=np.float32)
    return faiss.rev_swig_ptr(index.get_xb(), n * d).reshape(n, d)


class DeviceFlatIndex(FlatIndex):
    """A flat index searched somewhere other than FAISS's CPU code, saved as the same ``index.faiss``.

    The host FAISS index keeps the float32 vectors for saving (``keep_host``, what a build needs); a loaded
    index that only serves drops it once the device holds the vectors (64 GB of host memory for 21M x 768)."""

    backend: ClassVar[str] = ""

    def __init__(self, source: FlatIndex | int, keep_host: bool = True):
        flat = source if isinstance(source, FlatIndex) else FlatIndex(int(source))
        self.dim, self.index = flat.dim, flat.index
        self._n = 0
        if self.index.ntotal:
            self._add_device(flat_vectors(self.index))
        if not keep_host:
            self.index = None

    def _add_device(self, vectors: np.ndarray) -> None:
        raise NotImplementedError

    def add(self, vectors: np.ndarray) -> None:
        x = _as_matrix(vectors)
        if x.shape[1] != self.dim:
            raise ValueError(f"vectors of dimension {x.shape[1]} for a flat index of dimension {self.dim}")
        if self.index is not None:
            self.index.add(x)
        self._add_device(x)

    @property
    def ntotal(self) -> int:
        return self._n

    def _host(self) -> faiss.Index:
        if self.index is None:
            raise RuntimeError("this flat index was loaded to serve: its vectors live on the device only "
                               "(keep_host=False); save or reconstruct from the index that was built")
        return self.index

    def reconstruct(self, rows: np.ndarray) -> np.ndarray:
        return self._host().reconstruct_batch(np.asarray(rows, dtype=np.int64))

    def save(self, folder: Path) -> None:
        faiss.write_index(self._host(), str(folder / "index.faiss"))


class TorchFlatIndex(DeviceFlatIndex):
    """Exact inner-product search as a matrix product in torch: the corpus matrix on ``device`` in ``dtype``
    (float16 or bfloat16 halve it: 21M x 768 is 32 GB) in blocks of at most ``chunk_rows`` rows, queries in
    batches of ``query_batch``, each batch's top-k in one pass over the blocks
    (:func:`kunlunlab.retrieval.exact_topk.exact_top`); the (scores, rows) of :class:`FlatIndex`, -1 rows where
    the corpus has fewer than k vectors. The top-k is exact for the vectors as stored: float32 scores of the
    float32 queries with the stored vectors (in float32 on the CPU, FAISS's top-k); ``searched_again`` counts the
    queries whose near-ties took the slower float32 fallback."""

    backend = "torch"

    def __init__(self, source: FlatIndex | int, device: str = "cpu", dtype: str = "float16", query_batch: int = 64,
                 chunk_rows: int = 1 << 22, keep_host: bool = True):
        import torch  # deferred: the FAISS-only paths need no torch

        check_search_settings(device, "torch", dtype)
        if query_batch < 1 or chunk_rows < 1:
            raise ValueError("query_batch and chunk_rows must be at least 1")
        self.device, self.dtype_name = torch.device(device), dtype
        self.dtype = getattr(torch, dtype)
        self.query_batch, self.chunk_rows = query_batch, chunk_rows
        self.chunks: list = []
        self.max_norm = 0.0  # of a stored vector: the scale of exact_top's rounding bound
        self.searched_again = 0
        super().__init__(source, keep_host)

    def _stored(self, chunk) -> None:
        import torch  # deferred: the FAISS-only paths need no torch

        self.max_norm = max(self.max_norm, float(torch.linalg.vector_norm(chunk, dim=1, dtype=torch.float32).max()))

    def _add_device(self, vectors: np.ndarray) -> None:
        import torch  # deferred: the FAISS-only paths need no torch

        start = 0
        while start < len(vectors):
            last = self.chunks[-1] if self.chunks else None
            room = self.chunk_rows - last.shape[0] if last is not None else 0
            take = min(room if room > 0 else self.chunk_rows, len(vectors) - start)
            chunk = torch.empty((take, self.dim), dtype=self.dtype, device=self.device)
            step = 1 << 16  # float32 rows staged per copy: the transient device memory stays at 200 MB (768-d)
            for i in range(0, take, step):
                # a copy: the vectors may be a read-only memory map (cached embeddings), which torch will not wrap
                block = torch.from_numpy(np.array(vectors[start + i:start + min(take, i + step)], dtype=np.float32))
                chunk[i:i + len(block)] = block.to(self.device).to(self.dtype)
            if room > 0:
                self.chunks[-1] = torch.cat([last, chunk])
            else:
                self.chunks.append(chunk)
            if take:
                self._stored(chunk)
            start += take
            self._n += take

    def add_tensor(self, vectors) -> None:
        """Appends a 2-D torch tensor of vectors (say, embedded on the GPU) without a trip through the host: cast
        to the index's device and dtype (no copy where it already is), as blocks of at most ``chunk_rows``. The
        host copy, if kept, gets the float32 vectors."""
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors of shape {tuple(vectors.shape)} for a flat index of dimension {self.dim}")
        if self.index is not None:
            self.index.add(np.ascontiguousarray(vectors.float().cpu().numpy()))
        for start in range(0, len(vectors), self.chunk_rows):
            self.chunks.append(vectors[start:start + self.chunk_rows].to(self.device, self.dtype))
            self._stored(self.chunks[-1])
            self._n += len(self.chunks[-1])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch  # deferred: the FAISS-only paths need no torch

        from kunlunlab.retrieval.exact_topk import exact_top  # deferred with torch

        q = _as_matrix(queries)
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        rows = np.full((len(q), k), -1, dtype=np.int64)
        if not self.chunks or not len(q):
            return scores, rows
        for s in range(0, len(q), self.query_batch):
            batch = torch.from_numpy(np.array(q[s:s + self.query_batch])).to(self.device)
            v, i, again = exact_top(batch, self.chunks, k, self.max_norm)
            self.searched_again += again
            scores[s:s + len(batch), :v.shape[1]] = v.cpu().numpy()
            rows[s:s + len(batch), :v.shape[1]] = i.cpu().numpy()
        return scores, rows

    def bytes_per_vector(self) -> float:
        return float(self.dim * self.dtype.itemsize)  # device memory; the host copy, if kept, is 4 * dim more


class GpuFaissFlatIndex(DeviceFlatIndex):
    """FAISS's own GPU flat index (faiss-gpu): ``index_cpu_to_gpu`` of the host IndexFlatIP, vectors stored in
    float16 with ``dtype`` float16 (``GpuClonerOptions.useFloat16``), else float32."""

    backend = "faiss-gpu"

    def __init__(self, source: FlatIndex | int, device: str = "cuda", dtype: str = "float16",
                 keep_host: bool = True):
        check_search_settings(device, "faiss", dtype)
        if dtype == "bfloat16":
            raise ValueError("FAISS's GPU flat index stores float32 or float16, not bfloat16")
        dim = source.dim if isinstance(source, FlatIndex) else int(source)
        self.resources = faiss.StandardGpuResources()
        options = faiss.GpuClonerOptions()
        options.useFloat16 = dtype == "float16"
        self.dtype_name = dtype
        # an empty clone; the host's vectors go in through _add_device, as later additions do
        self.gpu = faiss.index_cpu_to_gpu(self.resources, int(device.partition(":")[2] or 0),
                                          faiss.IndexFlatIP(dim), options)
        super().__init__(source, keep_host)

    def _add_device(self, vectors: np.ndarray) -> None:
        step = 1 << 20  # rows per call: FAISS stages each call's float32 rows on the GPU
        for i in range(0, len(vectors), step):
            self.gpu.add(np.ascontiguousarray(vectors[i:i + step], dtype=np.float32))
        self._n = int(self.gpu.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.gpu.search(_as_matrix(queries), k)

    def bytes_per_vector(self) -> float:
        return float(self.dim * (2 if self.dtype_name == "float16" else 4))


def place_flat(flat: FlatIndex, device: str = "cpu", backend: str = "auto", dtype: str = "float16",
               keep_host: bool = True) -> FlatIndex:
    """``flat`` (a CPU FAISS flat index, empty or filled) made ready to search on ``device`` (cpu | cuda |
    cuda:N | auto) by ``backend`` (:func:`flat_backend`): itself for FAISS on the CPU, else a
    :class:`GpuFaissFlatIndex` or :class:`TorchFlatIndex` holding its vectors in ``dtype``."""
    device = resolve_device(device)
    chosen = flat_backend(backend, device, dtype)
    if chosen == "faiss":
        return flat
    if chosen == "faiss-gpu":
        return GpuFaissFlatIndex(flat, device, dtype, keep_host=keep_host)
    return TorchFlatIndex(flat, device, dtype, keep_host=keep_host)


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
        import bm25s  # deferred: only BM25 indexes need it

        self.k1, self.b = k1, b
        self.model = bm25s.BM25(k1=k1, b=b)
        self.ntotal = 0

    def add_texts(self, texts: Sequence[str]) -> None:
        import bm25s  # deferred: only BM25 indexes need it

        self.model.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)
        self.ntotal = len(texts)

    def search_text(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        import bm25s  # deferred: only BM25 indexes need it

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
        import bm25s  # deferred: only BM25 indexes need it

        obj = cls.__new__(cls)
        obj.k1, obj.b = params["k1"], params["b"]
        obj.model = bm25s.BM25.load(str(folder / "bm25"))
        obj.ntotal = int(params["n"])
        return obj
