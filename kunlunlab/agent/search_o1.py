"""Search-o1 (Li et al., 2025, "Search-o1: Agentic Search-Enhanced Large Reasoning Models", arXiv 2501.05366):
agentic search whose retrieved documents are condensed by the model itself (Reason-in-Documents) before they
enter the reasoning chain.

Per turn every active sample generates until its search closes, it answers, or it hits a limit; all fresh
queries of all samples go to the search function in one call; then every (sample, query) pair with documents
is condensed in **one** batched generation (:func:`~kunlunlab.agent.backends.generate_once`, so the local model
and an OpenAI-compatible server serve it alike). A condensation prompt holds the sample's previous reasoning,
the current query and the documents; the information the reply states is what the chain receives between the
``<result>`` markers. The raw passages never enter the chain: the trajectory keeps them beside the condensed
text (each ``result`` step: ``text`` the block the model saw, ``documents`` the passages retrieved, ``analyses``
the condensation replies, ``reasoning`` the previous reasoning they were given), and ``doc_ids`` per search as
the rollout engine records them, for retrieval recall and the search floor.

Followed from the authors' code (github.com/sunnynexus/Search-o1: ``scripts/prompts.py``,
``get_webpage_to_reasonchain_instruction``; ``scripts/run_search_o1.py``; ``scripts/evaluate.py``,
``extract_answer(mode="infogen")``):

* the instruction: read the documents given the previous reasoning steps and the current search query, extract
  what helps the query and the reasoning, and state it after a ``**Final Information**`` header, or state
  "No helpful information found."; a user message without a system prompt (the question itself is not in it);
* the previous reasoning: the output so far as numbered steps (a line of model text, or one whole result
  block); beyond ``1 + keep_last_steps`` steps only the first, the last ``keep_last_steps`` (Search-o1: 4) and
  every step holding a search or a result stay, each run of left-out steps shown as ``...``;
* the analysis: the text after the last header, newlines removed (here every run of whitespace becomes one
  space); without a header "No helpful information found." (with ``prefill_header`` off);
* a repeated query and a search past the limit are answered with a notice, not a search.

Departures, each with its reason:

* tags: the project's protocol (``<search><query>…</query></search>``, ``<result>…</result>``,
  ``<short_answer>\\boxed{…}</short_answer>``) instead of ``<|begin_search_query|>`` and its kin: one parser
  for every rollout method, and a checkpoint trained on the protocol is compared on the tags it knows;
* documents: the retrieved passages (``top_k``, each cut at ``rollout.max_result_chars``), labelled
  ``**Document n:**``, instead of fetched web pages cut to 3000 characters around the search snippet: the
  corpora here are closed passage collections;
* budget: the analysis is capped at ``ReasonInDocumentsConfig.max_tokens`` (default 128) instead of the
  chain's whole budget (32k tokens for QwQ): the small models here decode on CPUs, and an analysis longer than
  a turn would crowd the chain's ``max_total_tokens``, which stays the same as the other agents';
* sampling: the chain's (greedy in evaluation) instead of temperature 0.7, top-p 0.8, top-k 20 and
  repetition penalty 1.05: the backend interface has neither top-k nor a repetition penalty, and a
  deterministic table compares methods on equal terms;
* header as prefix (``prefill_header``, default on): the reply starts with ``**Final Information**``, so the
  model states the information at once. Without it the untrained 135M model wrote the header in 2 of 6 world
  condensations, both times inside an echo of the instruction, so Search-o1's rule left no usable information
  in any of the 6. Off: the header must be generated and Search-o1's rule applies as written;
* a search with several queries: one condensation per query, all in the same batched call, each under a
  ``Query n:`` line of one result block (Search-o1 sends one query per search);
* a query with no hits gets "No helpful information found." without a model call (what the instruction
  asks for when the documents hold nothing);
* a repeated query is the same string up to case and spacing (Search-o1: the same string); a search past the
  limit gets one notice and the sample stops when it searches again (the rollout engine's rule; Search-o1
  repeats the notice up to its turn limit).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Sequence

from kunlunlab.agent.backends import Backend, Segment, chat_prompt_ids, generate_once, mean_confidence, text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE, parse_turn
from kunlunlab.configs import non_negative, positive
from kunlunlab.agent.rollout import (AnswerRound, RolloutConfig, RolloutEngine, RolloutStats, SearchFn, Trajectory,
                                     result_block)

HEADER = "**Final Information**"
NO_INFORMATION = "No helpful information found."
SEARCH_LIMIT_NOTICE = "The search limit ({limit}) is reached: no more searches. Answer with what you know."
REPEAT_NOTICE = "You searched this query before: use the earlier result above."
EMPTY_QUERY_NOTICE = "(empty query: nothing was searched)"

# Search-o1's instruction (see the module docstring), shortened; its inputs and output format as in the original.
REASON_IN_DOCUMENTS_TEMPLATE = (
    "**Task Instruction:**\n\n"
    "Read and analyse the searched documents given three inputs: the **Previous Reasoning Steps**, the "
    "**Current Search Query** and the **Searched Documents**. Extract the information in the documents that is "
    "relevant and helpful for the current search query, so that it can be integrated into the previous "
    "reasoning steps and the reasoning on the original question can continue.\n\n"
    "**Guidelines:**\n"
    "1. Review each document and identify the facts relevant to the current search query that can help the "
    "reasoning.\n"
    "2. Keep only accurate information that directly advances the previous reasoning steps.\n"
    "3. Output format: write " + HEADER + " followed by the helpful information. If the documents hold no "
    "helpful information for the current search query, write " + HEADER + " followed by: " + NO_INFORMATION
    + "\n\n**Inputs:**\n"
    "- **Previous Reasoning Steps:**\n{reasoning}\n\n"
    "- **Current Search Query:**\n{query}\n\n"
    "- **Searched Documents:**\n{documents}\n\n"
    "Now analyse each document and find the helpful information for the current search query \"{query}\" and "
    "the previous reasoning steps."
)

_MODEL_KINDS = ("prefix", "model")
_PROTOCOL_TAG = re.compile(r"</?(?:think|search|query|result|short_answer|long_answer|background|question)>")


@dataclass
class ReasonInDocumentsConfig:
    max_tokens: int = positive(128)  # the condensed analysis of one query's documents
    keep_last_steps: int = non_negative(4)  # previous reasoning: the first step, the last N and every search/result step
    prefill_header: bool = True  # the reply starts with the header (a departure: see the module docstring)

    def __post_init__(self):
        if self.max_tokens < 1 or self.keep_last_steps < 0:
            raise ValueError(f"invalid Reason-in-Documents config: {self}")


@dataclass
class ReasonInDocumentsStats(RolloutStats):
    condense_s: float = 0.0      # seconds in the condensation calls
    condense_calls: int = 0      # batched calls (at most one per turn)
    condensed: int = 0           # analyses generated
    condense_tokens: int = 0     # tokens generated for them (not part of any chain)


@dataclass
class Analysis:
    """One query's condensation: the information the chain receives, the raw reply, its generated tokens."""

    information: str
    reply: str | None  # None: no model call (no documents)
    tokens: int = 0


def previous_reasoning(steps: Sequence[dict], keep_last: int = 4) -> str:
    """The output so far as Search-o1 hands it to Reason-in-Documents: numbered steps (each line of model text,
    each environment block as one step), truncated beyond ``1 + keep_last`` steps to the first, the last
    ``keep_last`` and those with a search or a result, with ``...`` for every run left out."""
    chunks: list[str] = []
    model = ""

    def flush() -> None:
        chunks.extend(line.strip() for line in model.splitlines() if line.strip())

    for step in steps:
        if step.get("kind") in _MODEL_KINDS:
            model += step.get("text", "")
            continue
        flush()
        model = ""
        block = " ".join(str(step.get("text", "")).split())
        if block:
            chunks.append(block)
    flush()
    numbered = [f"Step {i + 1}: {c}" for i, c in enumerate(chunks)]
    if len(numbered) <= keep_last + 1:
        return "\n\n".join(numbered)
    kept: list[str] = []
    for i, (chunk, line) in enumerate(zip(chunks, numbered)):
        if i == 0 or i >= len(chunks) - keep_last or any(tag in chunk for tag in ("<search>", "<query>", "<result>")):
            kept.append(line)
        elif kept[-1] != "...":
            kept.append("...")
    return "\n\n".join(kept)


def _key(query: str) -> str:
    return " ".join(query.lower().split())


def format_documents(hits: Sequence, max_chars: int) -> str:
    return "\n".join(f"**Document {j + 1}:**\n{_cut(h.contents, max_chars).strip()}" for j, h in enumerate(hits))


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def extract_information(reply: str, header_given: bool, eos: str = "") -> str:
    """The analysis the chain receives: the text after the reply's last header (all of it when the header was
    given as the reply's start), protocol tags and newlines removed; "No helpful information found." without a
    header or when nothing is left."""
    text = reply.replace(eos, " ") if eos else reply
    if HEADER in text:
        text = text.rsplit(HEADER, 1)[1]
    elif not header_given:
        return NO_INFORMATION
    text = " ".join(_PROTOCOL_TAG.sub(" ", text).split()).strip("`*: ")
    return text or NO_INFORMATION


def reason_in_documents(backend: Backend, jobs: Sequence[tuple[str, str, Sequence]], config: ReasonInDocumentsConfig,
                        max_doc_chars: int, sampling=None) -> tuple[list[Analysis], int]:
    """Condenses each job ``(previous reasoning, query, hits)`` in one batched generation call; a job without
    hits gets "No helpful information found." and no prompt. Returns the analyses and the number of calls (0/1)."""
    tok = backend.tokenizer
    prefix = HEADER + "\n\n" if config.prefill_header else ""
    asked = [i for i, (_, _, hits) in enumerate(jobs) if hits]
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": REASON_IN_DOCUMENTS_TEMPLATE.format(
        reasoning=jobs[i][0] or "(none yet)", query=jobs[i][1],
        documents=format_documents(jobs[i][2], max_doc_chars))}], prefix) for i in asked]
    replies: list[Segment] = generate_once(backend, prompts, config.max_tokens, stop=(), sampling=sampling)
    out = [Analysis(NO_INFORMATION, None) for _ in jobs]
    eos = getattr(tok, "eos_token", None) or ""
    for i, seg in zip(asked, replies):
        out[i] = Analysis(extract_information(seg.text, config.prefill_header, eos), seg.text, len(seg.token_ids))
    return out, int(bool(prompts))


class SearchO1Engine(RolloutEngine):
    """The rollout engine's batched turns, search call and token accounting (``completion_ids``, ``mask``,
    ``logprobs``), with each result block replaced by the Reason-in-Documents analyses. No answer controller:
    the sample stops at its first answer."""

    def __init__(self, backend: Backend, search: SearchFn | None, config: RolloutConfig | None = None,
                 reason: ReasonInDocumentsConfig | None = None):
        super().__init__(backend, search, config)
        self.reason = reason or ReasonInDocumentsConfig()
        self.stats = ReasonInDocumentsStats()

    def run(self, prompts: Sequence[Sequence[int]], questions: Sequence[str], controller=None,
            prefixes: Sequence[str] | None = None) -> list[Trajectory]:
        if controller is not None:
            raise ValueError("Search-o1 has no answer controller")
        cfg = self.config
        start = time.perf_counter()
        carry = list(prefixes or [""] * len(prompts))  # text the next turn is parsed after (the prefix, a suffix)
        trajs = [Trajectory(q, list(p), steps=[{"kind": "prefix", "text": c}] if c else [])
                 for q, p, c in zip(questions, prompts, carry)]
        executed: list[set[str]] = [set() for _ in trajs]  # each sample's queries sent so far
        session = self.backend.open(prompts, cfg.sampling)
        active = list(range(len(trajs)))
        while active:
            t0 = time.perf_counter()
            segments = session.generate(active, {i: min(cfg.max_turn_tokens, self._left(trajs[i])) for i in active})
            self.stats.generate_s += time.perf_counter() - t0
            searches: dict[int, list[str]] = {}
            blocks: dict[int, tuple[str, dict]] = {}  # sample -> (environment text, step record)
            done: dict[int, str] = {}
            for i in active:
                seg, t = segments[i], trajs[i]
                self._record(t, seg.token_ids, seg.text, 1, seg.logprobs, {"kind": "model"})
                self.stats.model_tokens += len(seg.token_ids)
                turn = parse_turn(carry[i] + seg.text)
                carry[i] = ""
                t.issues.extend(turn.issues)
                if turn.kind == "search" and t.n_searches >= cfg.max_searches:
                    t.issues.append("search_limit")
                    if t.issues.count("search_limit") > 1:  # ignored the first notice
                        done[i] = "search_limit"
                    else:
                        blocks[i] = (SEARCH_LIMIT_NOTICE.format(limit=cfg.max_searches), {"kind": "feedback"})
                elif turn.kind == "search":
                    searches[i] = turn.queries
                elif turn.kind == "invalid":
                    blocks[i] = (EMPTY_QUERY_NOTICE, {"kind": "feedback"})
                elif turn.kind == "answer":
                    t.answer, t.answer_mode = turn.answer, turn.answer_mode
                    t.rounds.append(AnswerRound(turn.answer, seg.mean_logprob, mean_confidence(seg.logprobs),
                                                [q for qs in t.queries for q in qs],
                                                [d for ids in t.doc_ids for d in ids], list(turn.issues)))
                    done[i] = "answer"
                else:  # incomplete (token limit inside an action) or no action at all
                    done[i] = "budget" if seg.finish == "length" else ("no_action" if turn.kind == "none"
                                                                        else "incomplete")
            blocks.update(self._search_and_condense(trajs, searches, executed))
            appended = {}
            for i, (results, step) in blocks.items():
                text = RESULT_TEMPLATE.format(results=results) + cfg.result_suffix
                ids = text_ids(self.tokenizer, text)
                if len(ids) + 16 > self._left(trajs[i]):
                    done[i] = "budget"
                    continue
                carry[i] = cfg.result_suffix  # the next turn is parsed as suffix + generated text
                self._record(trajs[i], ids, text, 0, None, step)
                self.stats.appended_tokens += len(ids)
                appended[i] = ids
            for i in active:
                if i not in done and i not in appended:  # cannot happen by construction; never spin
                    done[i] = "incomplete"
            for i, why in done.items():
                trajs[i].finish, trajs[i].seconds = why, time.perf_counter() - start
            session.release(list(done))
            session.append({i: ids for i, ids in appended.items() if i not in done})
            active = [i for i in active if i not in done]
        self.stats.seconds += time.perf_counter() - start
        return trajs

    def _left(self, t: Trajectory) -> int:
        return self.config.max_total_tokens - len(t.completion_ids)

    @staticmethod
    def _record(t: Trajectory, ids: list[int], text: str, mask: int, logprobs: list[float] | None, step: dict) -> None:
        t.completion_ids.extend(ids)
        t.mask.extend([mask] * len(ids))
        t.logprobs.extend(logprobs if logprobs is not None and len(logprobs) == len(ids) else [0.0] * len(ids))
        t.steps.append({**step, "text": text})

    def _search_and_condense(self, trajs: list[Trajectory], searches: dict[int, list[str]],
                             executed: list[set[str]]) -> dict[int, tuple[str, dict]]:
        """One search call for every fresh query of the turn, then one condensation call for every (sample,
        query) with documents; each sample's result block holds its analyses, its step the raw passages too."""
        cfg = self.config
        # Search-o1's repeat rule: a query this sample already sent (the same words, case aside) is not sent again
        repeats = {i: [cfg.block_repeated_queries and _key(q) in executed[i] for q in qs] for i, qs in searches.items()}
        wanted = {q: i for i, qs in searches.items() for q, rep in zip(qs, repeats[i]) if not rep}
        t0 = time.perf_counter()
        results, error = self._retrieve(list(wanted), {q: {  # what the NLR router reads, for every query sent
            "searches_so_far": trajs[i].n_searches,
            "context_tokens": len(trajs[i].prompt_ids) + len(trajs[i].completion_ids)} for q, i in wanted.items()})
        elapsed = time.perf_counter() - t0
        jobs, owners = [], []  # (reasoning, query, hits) and (sample, position of the query)
        hits_of: dict[int, list[list]] = {}
        reasoning_of: dict[int, str] = {}
        for i, qs in searches.items():
            t = trajs[i]
            reasoning_of[i] = previous_reasoning(t.steps, self.reason.keep_last_steps)
            hits_of[i] = [[] if rep else results.get(q, []) for q, rep in zip(qs, repeats[i])]
            t.retrieval_seconds += elapsed
            t.queries.append(qs)
            t.doc_ids.append([h.id for hits in hits_of[i] for h in hits])
            executed[i].update(_key(q) for q in qs)
            if error:
                t.search_errors.append(error)
                continue
            for k, (q, rep) in enumerate(zip(qs, repeats[i])):
                if rep:
                    t.issues.append("repeated_query")
                else:
                    jobs.append((reasoning_of[i], q, hits_of[i][k]))
                    owners.append((i, k))
        t0 = time.perf_counter()
        analyses, calls = reason_in_documents(self.backend, jobs, self.reason, cfg.max_result_chars, cfg.sampling)
        self.stats.condense_s += time.perf_counter() - t0
        self.stats.condense_calls += calls
        self.stats.condensed += sum(a.reply is not None for a in analyses)
        self.stats.condense_tokens += sum(a.tokens for a in analyses)
        by_query: dict[tuple[int, int], Analysis] = dict(zip(owners, analyses))
        out = {}
        for i, qs in searches.items():
            if error:
                out[i] = (f"(search unavailable: {error[:200]})", {"kind": "result", "queries": qs})
                continue
            found = [by_query.get((i, k)) for k in range(len(qs))]  # None: a repeated query
            lines = []
            for k, (q, analysis) in enumerate(zip(qs, found)):
                if len(qs) > 1:
                    lines.append(f"Query {k + 1}: {q}")
                lines.append(analysis.information if analysis else REPEAT_NOTICE)
            out[i] = ("\n".join(lines), {"kind": "result", "queries": qs,
                                         "documents": result_block(hits_of[i], qs, cfg.max_result_chars),
                                         "analyses": [a.reply if a else None for a in found],
                                         "analysis_tokens": [a.tokens if a else 0 for a in found],
                                         "reasoning": reasoning_of[i]})
        return out
