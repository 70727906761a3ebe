"""Evaluation: answer metrics (EM, F1, cover-EM), retrieval recall and the paired bootstrap.

The runner (:mod:`kunlunlab.eval.harness`) and the LLM judge (:mod:`kunlunlab.eval.judge`) load
models and the agent, so they are imported from their modules, not re-exported here.
"""
from kunlunlab.eval.metrics import cover_em, exact_match, f1, normalize_answer, retrieval_recall
from kunlunlab.eval.stats import paired_bootstrap, paired_records

__all__ = ["cover_em", "exact_match", "f1", "normalize_answer", "paired_bootstrap", "paired_records",
           "retrieval_recall"]
