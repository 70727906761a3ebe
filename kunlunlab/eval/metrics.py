"""Answer metrics of the evaluation: EM, F1, cover-EM (``acc``), retrieval recall and its
curve over the searches (with FrugalRAG's optimal stop) and the search floor.

Defined in :mod:`kunlunlab.data.answers` (the bottom layer, since the agent's STIE normalises answers the
same way) and exported here, where evaluation code and notebooks look for them.
"""
from kunlunlab.data.answers import (EXTRA_SEARCHES, cover_em, exact_match, extra_searches, f1, normalize_answer,
                                   optimal_stop, recall_by_search, retrieval_recall, search_floor)

__all__ = ["EXTRA_SEARCHES", "cover_em", "exact_match", "extra_searches", "f1", "normalize_answer", "optimal_stop",
           "recall_by_search", "retrieval_recall", "search_floor"]
