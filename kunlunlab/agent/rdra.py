"""RDRA: RAG-driven Reasoning Alignment (paper §2.1, eqs. 1–4): retrieve first, think next, then reason.

* (1) background retrieval  D_1 = R(x; K): top-k passages for the raw question.
* (2) thought-guiding plan   t = T_θ(x, D_1): the model decomposes the task and states its retrieval
  intent, one search query per line.
* (3) second-stage retrieval D_2 = R(t; K): the whole plan is one query (eq. 3 retrieves with t itself)
  and each plan line is another (the lines are the sub-questions the plan names; on the synthetic world
  the per-line queries find the hop passages that the whole-plan query dilutes).
* (4) reasoning              y ~ P_φ(y | x, t, D_1 ∪ D_2): the agent starts from the joint context,
  given to it as the ``<background>`` block of its prompt.

The joint context holds ``max_docs`` passages; ``background_share`` of them come from D_1 and the rest
from D_2 (either side fills the other's unused slots). The paper gives no split; the default 0.4 keeps
2 of 5 slots for the question's own neighbours and 3 for the plan's, which are the ones that reach
beyond the first hop.

Plan-free RDRA (``use_plan=False``, a departure from the paper; the paper's plan stays this class's
default, make run's training config is plan-free): eqs. (2)-(3) are skipped, the background is D_1 alone
(``background_k`` passages, no plan line) and RDRA costs one search. Why it exists: on one H100 (G192,
200 held-out world questions, records in ``experiments/results/gpu_g192``) the kunlun-trained 135M model
copied its own plan's questions into its searches, and its plans are often wrong ("Who founded X? Who
married X?" for a nationality comparison), so the trained whole method scored 48.5 EM against the plain
agent's 71.0. Trained and evaluated plan-free (CPU G192, 3 background passages;
experiments/results/planfree_192_2wiki) it scored 70.0 on 100 held-out world questions against 47.0 with
the plan and 77.0 for the plain agent (paired Δ −7.0 [−15, +1]), and 25.0 on 20 held-out HotpotQA
questions against 20.0 and 15.0 (README, Training). At make run's smaller size the two forms do not
differ measurably (paired, same machine: planned 32.5 vs plan-free 27.5 on 40 held-out world questions, Δ
+5.0 [−12.5, +25.0]; HotpotQA 15.0 vs 20.0, n = 20).

Everything is batched: one retrieval call per stage and one generation call for all plans. Training
data (:mod:`kunlunlab.training.mixing`) composes its backgrounds with :func:`joint_context` and
:func:`background_text`, so supervised fine-tuning sees exactly what inference will put in the prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from kunlunlab.agent.backends import Backend, chat_prompt_ids, generate_once
from kunlunlab.agent.protocol import PLAN_SYSTEM, PLAN_USER_TEMPLATE, numbered_docs
from kunlunlab.agent.rollout import SearchFn
from kunlunlab.configs import non_negative, positive, probability
from kunlunlab.retrieval.client import RetrievalServiceError


@dataclass
class RDRAConfig:
    background_k: int = positive(3)      # passages of the first stage, eq. (1)
    plan_k: int = positive(2)            # passages per plan query in the second stage, eq. (3)
    plan_tokens: int = positive(64)
    max_plan_queries: int = non_negative(3)  # plan lines used as queries (the whole plan is queried besides them)
    query_whole_plan: bool = True
    max_docs: int = positive(5)          # passages in the final background block, eq. (4)
    background_share: float = probability(0.4)  # share of max_docs reserved for D_1 (the rest for D_2)
    max_doc_chars: int = positive(400)
    use_plan: bool = True      # False: plan-free RDRA, D_1 only (eqs. 2-3 skipped; see the module docstring)

    def __post_init__(self):
        if not 0.0 <= self.background_share <= 1.0:
            raise ValueError(f"background_share must lie in [0, 1], got {self.background_share}")
        if min(self.background_k, self.plan_k, self.max_docs, self.plan_tokens) < 1 or self.max_plan_queries < 0:
            raise ValueError(f"invalid RDRA sizes: {self}")


@dataclass
class RDRAContext:
    plan: str
    plan_queries: list[str]
    doc_ids: list[str] = field(default_factory=list)
    background: str = ""
    error: str | None = None
    searches: int = 0          # retrieval queries actually sent for this question (stage 1 + stage 2)


def plan_queries(plan: str, question: str, limit: int, whole_plan: bool = True) -> list[str]:
    """Eq. (3)'s queries: the whole plan (as one line of text) and up to ``limit`` of its lines; the
    question itself when the plan names nothing searchable."""
    lines = [ln.strip(" -*•0123456789.)\t") for ln in plan.splitlines()]
    lines = [ln for ln in lines if len(ln.split()) >= 2]
    queries = lines[:limit]
    whole = " ".join(lines)
    if whole_plan and whole and whole not in queries:
        queries = [whole] + queries
    return list(dict.fromkeys(queries)) or [question]


def joint_context(first: Sequence, second: Sequence, cfg: RDRAConfig) -> list:
    """Eq. (4)'s D_1 ∪ D_2, de-duplicated by id: ``round(background_share · max_docs)`` slots for D_1,
    the rest for D_2; unused slots of one side go to the other."""
    def dedup(hits, seen):
        out = []
        for h in hits:
            if h.id not in seen:
                seen.add(h.id)
                out.append(h)
        return out

    seen: set[str] = set()
    d1 = dedup(first, seen)
    d2 = dedup(second, seen)
    n1 = round(cfg.background_share * cfg.max_docs)
    take1 = min(len(d1), max(n1, cfg.max_docs - len(d2)))
    take2 = min(len(d2), cfg.max_docs - take1)
    return d1[:take1] + d2[:take2]


def clip_doc(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def background_text(plan: str, docs: Sequence, cfg: RDRAConfig) -> str:
    """The ``<background>`` block's content: the plan (none in plan-free RDRA), then the joint context's
    passages."""
    documents = f"Documents:\n{numbered_docs([clip_doc(h.contents, cfg.max_doc_chars) for h in docs])}"
    return f"Plan:\n{plan.strip()}\n\n{documents}" if plan.strip() else documents


def plan_prompt_messages(question: str, first_hits: Sequence, cfg: RDRAConfig) -> list[dict]:
    """Eq. (2)'s input: the question and D_1, under the planning instruction."""
    docs = numbered_docs([clip_doc(h.contents, cfg.max_doc_chars) for h in first_hits])
    return [{"role": "system", "content": PLAN_SYSTEM},
            {"role": "user", "content": PLAN_USER_TEMPLATE.format(background=f"Background:\n{docs}\n\n",
                                                                  question=question)}]


def rdra_contexts(backend: Backend, search: SearchFn, questions: list[str],
                  config: RDRAConfig | None = None) -> list[RDRAContext]:
    cfg = config or RDRAConfig()
    tok = backend.tokenizer

    def safe_search(queries: list[str], k: int):
        try:
            return search(queries, k), None
        except RetrievalServiceError as err:  # defined fallback: reason without background
            return [[] for _ in queries], str(err)

    first, error1 = safe_search(questions, cfg.background_k)                       # eq. (1)
    if not cfg.use_plan:  # plan-free RDRA: the background is D_1 alone, one search per question
        return [RDRAContext("", [], [h.id for h in docs], background_text("", docs, cfg), error1, searches=1)
                for docs in (joint_context(hits, [], cfg) for hits in first)]
    prompts = [chat_prompt_ids(tok, plan_prompt_messages(q, hits, cfg)) for q, hits in zip(questions, first)]
    plans = [s.text.replace(tok.eos_token or "", "").strip()
             for s in generate_once(backend, prompts, cfg.plan_tokens, stop=())]   # eq. (2)
    per_question = [plan_queries(p, q, cfg.max_plan_queries, cfg.query_whole_plan) for p, q in zip(plans, questions)]
    flat = [q for qs in per_question for q in qs]
    second, error2 = safe_search(flat, cfg.plan_k) if flat else ([], None)        # eq. (3)
    out, cursor = [], 0
    for q, plan, qs, hits1 in zip(questions, plans, per_question, first):
        hits2 = [h for hits in second[cursor:cursor + len(qs)] for h in hits]
        cursor += len(qs)
        docs = joint_context(hits1, hits2, cfg)                                    # eq. (4)
        out.append(RDRAContext(plan, qs, [h.id for h in docs], background_text(plan, docs, cfg),
                               error1 or error2, searches=1 + len(qs)))
    return out
