"""kunlunlab: a Jupyter-first workbench for RL-trained, retrieval-augmented multi-hop reasoning.

Modules: ``data`` (records, synthetic world, loaders), ``retrieval`` (encoder, indexes, clustering
retriever, store, service), ``agent`` (search-think protocol), ``eval`` (metrics), ``viz`` (figures),
``models`` (embedded defaults), ``runner`` (papermill), ``bench`` (benchmarks), ``cli``.

JAX is kept off the GPU here, before anything can import it: ``bm25s`` (the BM25 index) switches to JAX when it is
importable, and JAX preallocates 75 % of a GPU's memory at first use, which a 7B training run with a BM25 index
needs (issue 53; the GPU image has JAX). bm25s only needs JAX's top-k on the CPU; a user's own setting is kept.
This module runs first in every process that reaches bm25s through kunlunlab (training, evaluation, the GPU check):
tests/project/test_jax_settings.py checks it.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# if a user points JAX at the GPU anyway: allocate on demand, never the 75 % block up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"
