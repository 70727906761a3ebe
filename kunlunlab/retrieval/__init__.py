"""Retrieval: encoder with query cache, FAISS/BM25 indexes, the clustering retriever, persistence, service."""
from kunlunlab.retrieval.clustered import ClusterConfig, ClusterRetriever
from kunlunlab.retrieval.encoder import Encoder, corpus_embeddings, corpus_fingerprint
from kunlunlab.retrieval.indexes import BM25Index, FlatIndex, HNSWConfig, HNSWIndex, IVFPQConfig, IVFPQIndex
from kunlunlab.retrieval.retriever import INDEX_KINDS, Hit, IndexConfig, Retriever, build_retriever
from kunlunlab.retrieval.store import IndexMismatchError, load_retriever, read_manifest, save_retriever

__all__ = ["BM25Index", "ClusterConfig", "ClusterRetriever", "Encoder", "FlatIndex", "HNSWConfig", "HNSWIndex",
           "Hit", "INDEX_KINDS", "IVFPQConfig", "IVFPQIndex", "IndexConfig", "IndexMismatchError", "Retriever",
           "build_retriever", "corpus_embeddings", "corpus_fingerprint", "load_retriever", "read_manifest",
           "save_retriever"]
