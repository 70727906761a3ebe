"""Retrieval: encoder with query cache, FAISS/BM25 indexes, the clustering retriever, persistence, service."""
from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings, corpus_fingerprint, passages_embedded
from kunlunlab.retrieval.factory import RetrievalPreset, load_preset, open_retriever
from kunlunlab.retrieval.indexes import (BM25Index, FlatIndex, HNSWConfig, HNSWIndex, IVFPQConfig, IVFPQIndex,
                                        TorchFlatIndex)
from kunlunlab.retrieval.retriever import INDEX_KINDS, Hit, IndexConfig, Retriever, build_retriever
from kunlunlab.retrieval.client import RemoteRetriever, RetrievalServiceError
from kunlunlab.retrieval.store import IndexMismatchError, load_retriever, read_manifest, save_retriever

__all__ = ["BM25Index", "ClusterConfig", "ClusterRetriever", "Encoder", "FlatIndex", "HNSWConfig", "HNSWIndex",
           "Hit", "INDEX_KINDS", "IVFPQConfig", "IVFPQIndex", "IndexConfig", "IndexMismatchError", "RemoteRetriever",
           "RetrievalPreset", "RetrievalServiceError", "Retriever", "TorchFlatIndex", "build_retriever",
           "corpus_embeddings", "corpus_fingerprint", "load_preset", "load_retriever", "open_retriever",
           "passages_embedded", "read_manifest", "save_retriever"]
