"""RDRA: RAG-driven Reasoning Alignment (paper §3.1.1, eqs. 1–4): retrieve first, think next, then reason.

* (1) background retrieval  D_1 = R(x; K): top-k passages for the raw question.
* (2) thought-guiding plan   t = T_θ(x, D_1): the model decomposes the task and states its retrieval
  intent, one search query per line.
* (3) second-stage retrieval D_2 = R(t; K): each plan line (and the whole plan) is a query.
* (4) reasoning              y ~ P_φ(y | x, t, D_1 ∪ D_2): the agent starts from the joint context,
  given to it as the ``<background>`` block of its prompt.

Everything is batched: one retrieval call per stage and one generation call for all plans.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kunlunlab.agent.backends import Backend, chat_prompt_ids, generate_once
from kunlunlab.agent.protocol import PLAN_SYSTEM, PLAN_USER_TEMPLATE, numbered_docs
from kunlunlab.agent.rollout import SearchFn
from kunlunlab.retrieval.service import RetrievalServiceError


@dataclass
class RDRAConfig:
    background_k: int = 3   # passages of the first stage
    plan_k: int = 2         # passages per plan query in the second stage
    plan_tokens: int = 64
    max_plan_queries: int = 3
    max_docs: int = 5       # passages in the final background block
    max_doc_chars: int = 400


@dataclass
class RDRAContext:
    plan: str
    plan_queries: list[str]
    doc_ids: list[str] = field(default_factory=list)
    background: str = ""
    error: str | None = None


def plan_queries(plan: str, question: str, limit: int) -> list[str]:
    lines = [ln.strip(" -*•0123456789.)\t") for ln in plan.splitlines()]
    queries = [ln for ln in lines if len(ln.split()) >= 2][:limit]
    return queries or [question]


def rdra_contexts(backend: Backend, search: SearchFn, questions: list[str],
                  config: RDRAConfig | None = None) -> list[RDRAContext]:
    cfg = config or RDRAConfig()
    tok = backend.tokenizer

    def safe_search(queries: list[str], k: int):
        try:
            return search(queries, k), None
        except RetrievalServiceError as err:  # defined fallback: reason without background
            return [[] for _ in queries], str(err)

    def clip(text: str) -> str:
        return text if len(text) <= cfg.max_doc_chars else text[:cfg.max_doc_chars] + "…"

    first, error1 = safe_search(questions, cfg.background_k)                       # eq. (1)
    prompts = [chat_prompt_ids(tok, [{"role": "system", "content": PLAN_SYSTEM},
                                     {"role": "user", "content": PLAN_USER_TEMPLATE.format(
                                         background=f"Background:\n{numbered_docs([clip(h.contents) for h in hits])}\n\n",
                                         question=q)}])
               for q, hits in zip(questions, first)]
    plans = [s.text.replace(tok.eos_token or "", "").strip()
             for s in generate_once(backend, prompts, cfg.plan_tokens, stop=())]   # eq. (2)
    per_question = [plan_queries(p, q, cfg.max_plan_queries) for p, q in zip(plans, questions)]
    flat = [q for qs in per_question for q in qs]
    second, error2 = safe_search(flat, cfg.plan_k) if flat else ([], None)        # eq. (3)
    out, cursor = [], 0
    for q, plan, qs, hits1 in zip(questions, plans, per_question, first):
        hits2 = [h for hits in second[cursor:cursor + len(qs)] for h in hits]
        cursor += len(qs)
        docs, seen = [], set()
        for h in list(hits1) + hits2:  # eq. (4): the joint context, first-stage passages first
            if h.id not in seen:
                seen.add(h.id)
                docs.append(h)
        docs = docs[:cfg.max_docs]
        background = f"Plan:\n{plan}\n\nDocuments:\n{numbered_docs([clip(h.contents) for h in docs])}"
        out.append(RDRAContext(plan, qs, [h.id for h in docs], background, error1 or error2))
    return out
