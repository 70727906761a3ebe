"""Answer metrics of the evaluation: EM, F1, cover-EM (``acc``) and retrieval recall.

Defined in :mod:`kunlunlab.data.answers` (the bottom layer, since the agent's STIE normalises answers the
same way) and exported here, where evaluation code and notebooks look for them.
"""
from kunlunlab.data.answers import cover_em, exact_match, f1, normalize_answer, retrieval_recall

__all__ = ["cover_em", "exact_match", "f1", "normalize_answer", "retrieval_recall"]
