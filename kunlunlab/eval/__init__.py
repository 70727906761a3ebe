"""Evaluation: answer metrics (EM, F1, cover-EM) and retrieval recall."""
from kunlunlab.eval.metrics import cover_em, exact_match, f1, normalize_answer, retrieval_recall

__all__ = ["cover_em", "exact_match", "f1", "normalize_answer", "retrieval_recall"]
