"""kunlunlab: a Jupyter-first workbench for RL-trained, retrieval-augmented multi-hop reasoning.

Modules: ``data`` (records, synthetic world, loaders), ``retrieval`` (encoder, indexes, clustering
retriever, store, service), ``agent`` (search-think protocol), ``eval`` (metrics), ``viz`` (figures),
``models`` (embedded defaults), ``runner`` (papermill), ``bench`` (benchmarks), ``cli``.
"""
__version__ = "0.1.0"
