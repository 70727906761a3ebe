"""Sentence-transformers encoder with a query-embedding cache and a faster query path.

In RAG-RL rollouts the same sub-questions recur across a group of samples and across epochs, so
query encoding, not the index lookup, is the dominant retrieval cost; an LRU cache removes it for
repeats. For new queries, ``query_precision`` runs the query side through ONNX Runtime (``onnx``:
the float32 vectors, from an export of the embedder cached on disk), or on a copy of the embedder in
bfloat16 (AMX / AVX512-BF16 CPUs, GPUs), or through that ONNX export with int8 weights (``int8``, ONNX
Runtime's dynamic quantisation); passages are always embedded by the float32 model, so cached corpus embeddings and
indexes do not depend on it. ``python -m kunlunlab.bench encode`` measures the speed and the recall@10 each
precision costs against float32 queries.

Tried and not kept (2026-11-23, 2-core AMD EPYC with AVX512-BF16, no AMX): ``torch.compile`` of the bfloat16
query model (inductor, dynamic shapes, frozen pre-packed weights) measured 8.35 ms per call of 8 queries
against 8.21 ms eager, interleaved in one process (8 passes of 32 calls each); the eager bfloat16 GEMMs
already run at ~70 % of the cores' bfloat16 peak, and SDPA's math backend was no faster than its flash one
(9.00 vs 8.79 ms).
"""
from __future__ import annotations

import copy
import hashlib
import os
import threading
import warnings
from collections import OrderedDict
from typing import Sequence

import numpy as np

from kunlunlab.data.types import Passage
from kunlunlab.models import canonical_embedder_name, load_embedder, resolve_inference_dtype
from kunlunlab.paths import cache_dir


def _default_prefixes(model_name: str) -> tuple[str, str]:
    """E5 models were trained with ``query:``/``passage:`` prefixes and degrade without them."""
    lowered = model_name.lower()
    if "e5" in lowered.replace("-", "").split("/")[-1] or "/e5" in lowered or lowered.startswith("e5"):
        return "query: ", "passage: "
    return "", ""


QUERY_PRECISIONS = ("float32", "onnx", "bfloat16", "int8", "auto")

_embedded_lock = threading.Lock()
_passages_embedded = 0


def passages_embedded() -> int:
    """How many passages an :class:`Encoder` has embedded in this process so far (every
    :meth:`Encoder.encode_passages` call counts its texts; cached corpus embeddings count nothing). Retrieval
    through a service or a saved index should leave it unchanged: the corpus was embedded elsewhere."""
    return _passages_embedded


def _count_passages(n: int) -> None:
    global _passages_embedded
    with _embedded_lock:
        _passages_embedded += n


def resolve_query_precision(precision: str, device: str | None = None) -> str:
    """``auto``: bfloat16 where the hardware multiplies it natively, else float32 (see ``bench encode``:
    on the 2-core AMX machine ONNX Runtime's float32 is the fastest for one query at a time, 2.2x bfloat16,
    but bfloat16 is faster from batches of 8 up, which is what the service and the agent send)."""

    if precision not in QUERY_PRECISIONS:
        raise ValueError(f"unknown query precision {precision!r}; choose from {QUERY_PRECISIONS}")
    return resolve_inference_dtype("auto", device) if precision == "auto" else precision


class OnnxQueryModel:
    """float32 query vectors through ONNX Runtime: the embedder's transformer, its pooling and the
    normalisation exported once to ONNX (cached under ``<cache>/onnx``) and run by ORT's CPU kernels.
    For 8 short queries eager PyTorch spends most of its time outside the arithmetic; ORT's fused graph
    does not (``bench encode``). Same vectors as the float32 model up to ~2e-7.

    ``int8``: that export with its weights quantised to int8 per output channel and its activations per
    call (ONNX Runtime's dynamic quantisation, cached beside it), the int8 query path since torch's
    ``torch.ao.quantization.quantize_dynamic`` was deprecated for torchao."""

    def __init__(self, model, name: str, threads: int | None = None, int8: bool = False):
        import onnxruntime as ort  # deferred: optional, only the onnx query path needs it
        import torch  # deferred: the BM25, FAISS and service paths of retrieval run without torch

        self.tokenizer = model.tokenizer
        self.max_length = int(model.max_seq_length or 256)
        exported = self._export(model, name)
        self.path = path = self._quantised(exported) if int8 else exported
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # ORT's idle threads spin by default; beside FAISS's and numpy's thread pools on a small machine that
        # spinning took the cores the search needed (a call of 8: encode 11.5 ms + search 0.65 ms measured
        # 16.7 ms end to end with spinning on)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    @staticmethod
    def _pooling(model) -> str:
        modes = [m for m in model if type(m).__name__ == "Pooling"]
        config = modes[0].get_config_dict() if modes else {}
        mode = config.get("pooling_mode")  # sentence-transformers ≥ 5; older ones set one flag per mode
        if mode == "mean" or config.get("pooling_mode_mean_tokens"):
            return "mean"
        if mode == "cls" or config.get("pooling_mode_cls_token"):
            return "cls"
        raise ValueError(f"the ONNX query path supports mean or CLS pooling, not {config or 'no pooling module'}")

    def _export(self, model, name: str):
        import torch  # deferred: the BM25, FAISS and service paths of retrieval run without torch

        pooling = self._pooling(model)
        transformer = model[0].auto_model
        sample = self.tokenizer(["a query", "another query here"], padding=True, return_tensors="pt")
        names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in sample]
        key = hashlib.sha256(f"{name}|{pooling}|{names}|{torch.__version__}".encode()).hexdigest()[:16]
        path = cache_dir() / "onnx" / f"{key}.onnx"
        if path.is_file():
            return path

        class Embed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.transformer = transformer

            def forward(self, *tensors):
                features = dict(zip(names, tensors))
                hidden = self.transformer(**features).last_hidden_state
                if pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, dim=-1)

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".partial-{os.getpid()}.onnx")  # a process of its own: workers may race

        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's notes on indexing and masks
            torch.onnx.export(Embed().eval(), tuple(sample[k] for k in names), str(tmp), input_names=names,
                              output_names=["embedding"], opset_version=17, dynamo=False,
                              dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in names},
                                            "embedding": {0: "batch"}})
        tmp.replace(path)
        return path

    @staticmethod
    def _quantised(path):
        """The int8 model of a float32 export, written once beside it, named by what made it: another
        ONNX Runtime or another scheme writes a file of its own."""
        import onnxruntime  # deferred: as in __init__
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quantised = path.with_suffix(f".int8-per-channel-ort{onnxruntime.__version__}.onnx")
        if quantised.is_file():
            return quantised
        prepared = path.with_suffix(f".prepared.partial-{os.getpid()}.onnx")  # a process of its own: workers may race
        tmp = path.with_suffix(f".int8.partial-{os.getpid()}.onnx")
        # ORT's pre-processing (graph optimisation, ONNX shape inference; its symbolic shape inference cannot follow
        # the exported attention mask) is what its quantiser asks for, and warns without
        quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
        # per channel: recall@10 against float32 queries 0.931, per tensor 0.848 (bench encode, 2026-12-05)
        quantize_dynamic(str(prepared), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
        prepared.unlink()
        tmp.replace(quantised)
        return quantised

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        features = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                  return_tensors="np")
        feeds = {k: features[k].astype(np.int64) for k in self.inputs}
        return np.ascontiguousarray(self.session.run(None, feeds)[0], dtype=np.float32)


def query_model(model, precision: str, name: str = ""):
    """The model that embeds queries: ``model`` itself (float32), its ONNX Runtime export (onnx), that export
    with int8 weights and activations quantised per call (int8), or a copy in bfloat16."""
    if precision == "float32":
        return model
    if precision in ("onnx", "int8"):
        return OnnxQueryModel(model, name or type(model).__name__, int8=precision == "int8")
    if precision == "bfloat16":
        import torch  # deferred: the BM25, FAISS and service paths of retrieval run without torch

        return copy.deepcopy(model).to(torch.bfloat16)
    raise ValueError(f"unknown query precision {precision!r}; choose from {QUERY_PRECISIONS}")


class Encoder:
    def __init__(self, model: str | None = None, batch_size: int = 128, query_prefix: str | None = None,
                 passage_prefix: str | None = None, cache_size: int = 100_000, device: str | None = None,
                 max_seq_length: int | None = 256, query_precision: str = "float32",
                 passage_precision: str = "float32"):
        self.name = canonical_embedder_name(model)
        self.model = load_embedder(model, device=device)
        if max_seq_length:
            self.model.max_seq_length = min(self.model.max_seq_length or max_seq_length, max_seq_length)
        self.query_precision = resolve_query_precision(query_precision, device)
        self.query_model = query_model(self.model, self.query_precision, self.name)
        self.passage_precision = resolve_query_precision(passage_precision, device)
        if self.passage_precision not in ("float32", "bfloat16"):
            raise ValueError(f"passages are embedded in float32 or bfloat16 (or auto), not {passage_precision!r}")
        # bfloat16 passages: 3.1x float32's 145 passages/s on the 2-core AVX512-BF16 machine, cosine ≥ 0.998 to
        # the float32 vectors; for corpora of hundreds of thousands of passages on a CPU (bench retrieval
        # --passage-precision, build-index --passage-precision). Cached embeddings are keyed by it.
        self.passage_model = (self.model if self.passage_precision == "float32"
                              else query_model(self.model, self.passage_precision, self.name))
        q, p = _default_prefixes(self.name)
        self.query_prefix = q if query_prefix is None else query_prefix
        self.passage_prefix = p if passage_prefix is None else passage_prefix
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    def set_query_precision(self, precision: str) -> None:
        """Switches the query side (float32 | onnx | bfloat16 | int8 | auto); the query cache is emptied (its
        vectors came from the other precision). Passage vectors are unaffected."""
        self.query_precision = resolve_query_precision(precision, next(self.model.parameters()).device.type)
        self.query_model = query_model(self.model, self.query_precision, self.name)
        self._cache.clear()

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def _encode(self, texts: Sequence[str], progress: bool = False, model=None) -> np.ndarray:
        import torch  # deferred: the BM25, FAISS and service paths of retrieval run without torch

        model = model or self.model
        vectors = model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                               convert_to_tensor=True, show_progress_bar=progress)
        return np.ascontiguousarray(vectors.to(torch.float32).cpu().numpy())

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """New queries through the query model, no cache (what ``bench encode`` times), normalised in
        float32 (a bfloat16 model's own normalisation leaves norms up to ~0.2 % off 1)."""
        import torch  # deferred: the BM25, FAISS and service paths of retrieval run without torch

        if not queries:
            return np.empty((0, self.dim), dtype=np.float32)
        if self.query_precision == "float32":  # the path every figure before 2026-11-23 was measured with
            return self._encode([self.query_prefix + q for q in queries])
        if isinstance(self.query_model, OnnxQueryModel):  # onnx and int8
            return self.query_model.embed([self.query_prefix + q for q in queries])
        model = self.query_model
        # One forward pass through the model's modules instead of SentenceTransformer.encode: for a few short
        # queries encode()'s bookkeeping (length sorting, batching, progress, conversions) costs more than the
        # model itself (batch 8 in bfloat16: 8.2 ms per call this way, 12+ ms through encode()).
        preprocess = getattr(model, "preprocess", None) or model.tokenize
        features = preprocess([self.query_prefix + q for q in queries])
        device = next(model.parameters()).device
        features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
        with torch.inference_mode():
            vectors = model(features)["sentence_embedding"].to(torch.float32)
        return np.ascontiguousarray(torch.nn.functional.normalize(vectors, dim=-1).cpu().numpy())

    def encode_passages(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        _count_passages(len(texts))
        vectors = self._encode([self.passage_prefix + t for t in texts], progress=progress, model=self.passage_model)
        if self.passage_precision != "float32":  # normalised in float32: bfloat16's own norms are ~0.2 % off 1
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Embeds queries, serving repeats from the LRU cache; misses go to the model in one batch."""
        missing = list(dict.fromkeys(q for q in queries if q not in self._cache))
        self.cache_hits += len(queries) - sum(1 for q in queries if q in missing)
        self.cache_misses += len(missing)
        if missing:
            for q, v in zip(missing, self.embed_queries(missing)):
                self._cache[q] = v
        out = np.empty((len(queries), self.dim), dtype=np.float32)
        for i, q in enumerate(queries):
            out[i] = self._cache[q]
            self._cache.move_to_end(q)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out


class CorpusFingerprint:
    """The corpus hash built one passage at a time (a streamed corpus: :mod:`kunlunlab.retrieval.sharded`)."""

    def __init__(self):
        self._digest = hashlib.sha256()

    def update(self, passage: Passage) -> None:
        self._digest.update(passage.id.encode())
        self._digest.update(b"\0")
        self._digest.update(passage.contents.encode())
        self._digest.update(b"\1")

    def hexdigest(self) -> str:
        return self._digest.hexdigest()[:16]


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """Content hash of a corpus (ids and contents, in order): what an index was built from."""
    fingerprint = CorpusFingerprint()
    for p in passages:
        fingerprint.update(p)
    return fingerprint.hexdigest()


def corpus_embeddings(encoder: Encoder, passages: Sequence[Passage], progress: bool = True,
                      cache: bool = True) -> np.ndarray:
    """Passage embeddings, cached on disk by (embedder, corpus fingerprint, passage precision): encoding is
    the slow step."""
    tag = "" if encoder.passage_precision == "float32" else f"|{encoder.passage_precision}"  # float32: old keys
    key = hashlib.sha256(f"{encoder.name}|{encoder.passage_prefix}|{corpus_fingerprint(passages)}{tag}".encode())
    path = cache_dir() / "embeddings" / f"{key.hexdigest()[:20]}.npy"
    if cache and path.is_file():
        vectors = np.load(path, mmap_mode="r")  # disk-backed: large corpora need not sit in RAM
        if vectors.shape == (len(passages), encoder.dim):
            return vectors
    vectors = encoder.encode_passages([p.contents for p in passages], progress=progress)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a scratch file per process: runs started together on a fresh cache embed the same corpus at once,
        # and a shared scratch name let one rename the other's half-written file
        tmp = path.with_suffix(f".partial-{os.getpid()}.npy")
        np.save(tmp, vectors)
        tmp.replace(path)  # the same vectors either way: the last writer wins, whole
    return vectors

