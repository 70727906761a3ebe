"""The batched multi-turn rollout engine shared by evaluation and RL training.

Per turn: every active sample generates until ``</search>``, an answer's closing tag, EOS or its
token limit; all pending queries of all samples go to the search function in **one** call; each
``<result>`` block is appended as tokens. The model's own tokens are never decoded and re-encoded:
``completion_ids`` are exactly the sampled ids plus the appended ids, and ``mask`` marks which is
which (1 model token, 0 environment token: retrieved results and controller feedback). That mask is
what keeps retrieved tokens out of the RL loss (paper eq. 19).

An optional answer controller (STIE, :mod:`kunlunlab.agent.stie`) sees every answer round and
decides whether the sample stops or continues with a feedback block. A controller that blocks answers
(STIE's eq. 13, ``answer_block``) has its block handed to the session after each round, as a constraint
on the row's later answers (:meth:`~kunlunlab.agent.backends.TransformersSession.block_answers`); a
session that cannot enforce it (the OpenAI-compatible one) is logged once per run, counted in
``RolloutStats.unenforced_blocks``, and a round whose answer the block covers is marked with the issue
``blocked_answer``. The feedback block is appended either way.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

from kunlunlab.agent.backends import AnswerBlock, Backend, SamplingConfig, mean_confidence, text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE, format_results, parse_turn
from kunlunlab.retrieval.service import RetrievalServiceError

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    max_searches: int = 8         # per question (paper: 8)
    max_turn_tokens: int = 256    # generated tokens per turn
    max_total_tokens: int = 1024  # completion budget per sample: generated + appended tokens
    top_k: int = 3                # passages per query
    max_result_chars: int = 600   # per passage, so one result block cannot swallow the budget
    block_repeated_queries: bool = True  # STIE's repeat blocking, applied to queries
    result_suffix: str = ""       # environment text after each result block that opens the next turn
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self):
        if self.max_searches < 0 or self.max_turn_tokens < 1 or self.max_total_tokens < 1 or self.top_k < 1:
            raise ValueError(f"invalid rollout limits: {self}")


@dataclass
class AnswerRound:
    """One answer the model gave (a STIE round), with what it searched for and found on the way."""

    answer: str | None
    logprob: float          # mean token log-prob of the answering turn
    confidence: float       # exp(logprob), in [0, 1]
    queries: list[str]
    doc_ids: list[str]
    issues: list[str]


@dataclass
class Trajectory:
    question: str
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampled tokens' log-probs; 0.0 for environment tokens
    steps: list[dict] = field(default_factory=list)  # {"kind": "model"|"result"|"feedback", "text", ...}
    queries: list[list[str]] = field(default_factory=list)
    doc_ids: list[list[str]] = field(default_factory=list)
    rounds: list[AnswerRound] = field(default_factory=list)
    answer: str | None = None
    answer_mode: str | None = None
    final_answer: str | None = None  # set by the caller: STIE's accepted answer (or the last round's)
    finish: str = ""  # "answer", "controller", "no_action", "budget", "search_limit", "incomplete"
    issues: list[str] = field(default_factory=list)
    search_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    retrieval_seconds: float = 0.0

    @property
    def n_searches(self) -> int:
        return len(self.queries)

    @property
    def text(self) -> str:
        return "".join(step["text"] for step in self.steps)

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(text=self.text, n_searches=self.n_searches)
        return d


def result_block(hits_per_query: list[list], queries: list[str], max_chars: int) -> str:
    """The ``<result>`` text for a search's hits (or plain strings), each passage capped at ``max_chars``.
    Training data (:mod:`kunlunlab.training.mixing`) uses it too, so SFT sees exactly what rollouts append."""
    docs = [hits if isinstance(hits, list) and hits and isinstance(hits[0], str) else
            [h.contents if len(h.contents) <= max_chars else h.contents[:max_chars] + "…" for h in hits]
            for hits in hits_per_query]
    return format_results(docs, queries)


class AnswerController(Protocol):
    """``observe`` is required. A controller may also define ``answer_block(sample) -> AnswerBlock | None``
    (STIE does): the engine asks it after each round of a continuing sample and constrains that sample's
    later answers with it."""

    def observe(self, sample: int, round_: AnswerRound) -> tuple[bool, str | None]:
        """(stop, feedback) after an answer round; ``feedback`` is appended when the sample continues."""


SearchFn = Callable[[list[str], int], list[list]]


@dataclass
class RolloutStats:
    generate_s: float = 0.0
    retrieve_s: float = 0.0
    controller_s: float = 0.0
    retrieval_calls: int = 0
    controller_rounds: int = 0
    model_tokens: int = 0
    appended_tokens: int = 0
    seconds: float = 0.0
    blocked_rounds: int = 0        # answer rounds generated under an answer block (STIE's eq. 13)
    answer_interventions: int = 0  # generation steps where a block banned the model's highest-logit token
    blocked_answer_repeats: int = 0  # rounds whose answer the block covered (0 where the session enforces it)
    unenforced_blocks: int = 0     # blocks handed to a session that cannot enforce them


class RolloutEngine:
    def __init__(self, backend: Backend, search: SearchFn | None, config: RolloutConfig | None = None):
        self.backend, self.search, self.config = backend, search, config or RolloutConfig()
        self.tokenizer = backend.tokenizer
        self.stats = RolloutStats()

    def _result_block(self, hits_per_query: list[list], queries: list[str]) -> str:
        return result_block(hits_per_query, queries, self.config.max_result_chars)

    def _retrieve(self, queries: list[str], contexts: dict[str, dict]) -> tuple[dict[str, list], str | None]:
        """One call for all distinct queries of the turn; on a dead service a defined fallback."""
        unique = list(dict.fromkeys(queries))
        if not unique or self.search is None:
            return {q: [] for q in unique}, ("no retriever configured" if unique and self.search is None else None)
        t0 = time.perf_counter()
        try:
            if getattr(self.search, "wants_context", False):  # the NLR router reads history and context
                results = self.search(unique, self.config.top_k, contexts=[contexts[q] for q in unique])
            else:
                results = self.search(unique, self.config.top_k)
            error = None
        except RetrievalServiceError as err:
            log.warning("search failed, answering this turn without results: %s", err)
            results, error = [[] for _ in unique], str(err)
        self.stats.retrieve_s += time.perf_counter() - t0
        self.stats.retrieval_calls += 1
        return dict(zip(unique, results)), error

    def run(self, prompts: Sequence[Sequence[int]], questions: Sequence[str],
            controller: AnswerController | None = None, prefixes: Sequence[str] | None = None) -> list[Trajectory]:
        """``prefixes``: text at the end of each prompt that opens the assistant's reply (e.g. ``<think>``);
        it is part of the prompt tokens, and the first turn is parsed as prefix + generated text."""
        cfg = self.config
        start = time.perf_counter()
        trajs = [Trajectory(q, list(p)) for q, p in zip(questions, prompts)]
        carry = list(prefixes) if prefixes else [""] * len(trajs)
        for t, prefix in zip(trajs, carry):
            if prefix:
                t.steps.append({"kind": "prefix", "text": prefix})
        session = self.backend.open(prompts, cfg.sampling)
        active = list(range(len(trajs)))
        searched: list[list[set[str]]] = [[] for _ in trajs]  # word sets of earlier queries (repeat blocking)
        round_queries: list[list[str]] = [[] for _ in trajs]
        round_docs: list[list[str]] = [[] for _ in trajs]
        answer_block = getattr(controller, "answer_block", None)
        row_blocks: dict[int, AnswerBlock] = {}  # sample -> the answer block its session row is under
        warned = False

        def add(i: int, ids: list[int], text: str, model: bool, logprobs: list[float] | None = None, **extra) -> None:
            t = trajs[i]
            t.completion_ids.extend(ids)
            t.mask.extend([1 if model else 0] * len(ids))
            t.logprobs.extend(logprobs if logprobs is not None and len(logprobs) == len(ids) else [0.0] * len(ids))
            t.steps.append({"kind": "model" if model else extra.pop("kind", "result"), "text": text, **extra})

        def budget_left(i: int) -> int:
            return cfg.max_total_tokens - len(trajs[i].completion_ids)

        def finish(i: int, why: str) -> None:
            trajs[i].finish = why
            trajs[i].seconds = time.perf_counter() - start

        while active:
            t0 = time.perf_counter()
            limits = {i: min(cfg.max_turn_tokens, budget_left(i)) for i in active}
            segments = session.generate(active, limits)
            self.stats.generate_s += time.perf_counter() - t0
            pending: dict[int, list[str]] = {}
            appends: dict[int, str] = {}
            new_blocks: dict[int, AnswerBlock] = {}
            done: list[int] = []
            for i in active:
                seg, t = segments[i], trajs[i]
                extra = {"interventions": seg.interventions} if seg.interventions else {}
                add(i, seg.token_ids, seg.text, model=True, logprobs=seg.logprobs, **extra)
                self.stats.model_tokens += len(seg.token_ids)
                self.stats.answer_interventions += seg.interventions
                turn = parse_turn(carry[i] + seg.text)
                carry[i] = ""
                t.issues.extend(turn.issues)
                if turn.kind == "search":
                    if t.n_searches + len(pending.get(i, [])) >= cfg.max_searches:
                        appends[i] = RESULT_TEMPLATE.format(
                            results=f"Search limit ({cfg.max_searches}) reached. Answer now with what you know.")
                        t.issues.append("search_limit")
                        if "search_limit" in t.issues[:-1]:  # ignored the first notice
                            done.append(i)
                            finish(i, "search_limit")
                        continue
                    pending[i] = turn.queries
                elif turn.kind == "invalid":
                    appends[i] = RESULT_TEMPLATE.format(results="(empty query: nothing was searched)")
                elif turn.kind == "answer":
                    t.answer, t.answer_mode = turn.answer, turn.answer_mode
                    round_ = AnswerRound(turn.answer, seg.mean_logprob, mean_confidence(seg.logprobs),
                                         round_queries[i], round_docs[i], list(turn.issues))
                    t.rounds.append(round_)
                    round_queries[i], round_docs[i] = [], []
                    if i in row_blocks:
                        self.stats.blocked_rounds += 1
                        if turn.answer is not None and row_blocks[i].rejects(turn.answer):  # the block did not hold
                            t.issues.append("blocked_answer")
                            self.stats.blocked_answer_repeats += 1
                    stop, feedback = True, None
                    if controller is not None:
                        c0 = time.perf_counter()
                        stop, feedback = controller.observe(i, round_)
                        block = answer_block(i) if answer_block is not None and not stop else None
                        if block is not None:
                            new_blocks[i] = block
                        self.stats.controller_s += time.perf_counter() - c0
                        self.stats.controller_rounds += 1
                    if stop or budget_left(i) < 32:
                        done.append(i)
                        finish(i, "answer" if controller is None else "controller")
                    else:
                        appends[i] = RESULT_TEMPLATE.format(results=feedback or "Check your answer.")
                else:  # incomplete (token limit inside an action) or no action at all
                    done.append(i)
                    finish(i, "budget" if seg.finish == "length" else ("no_action" if turn.kind == "none"
                                                                        else "incomplete"))
            # One retrieval call for every pending query of every sample; a sample's exact repeat of an
            # earlier query (same bag of words) is blocked and answered from memory instead.
            repeats = {i: [cfg.block_repeated_queries and set(q.lower().split()) in searched[i] for q in qs]
                       for i, qs in pending.items()}
            fresh = [q for i, qs in pending.items() for q, rep in zip(qs, repeats[i]) if not rep]
            contexts = {q: {"searches_so_far": trajs[i].n_searches,
                            "context_tokens": len(trajs[i].prompt_ids) + len(trajs[i].completion_ids)}
                        for i, qs in pending.items() for q in qs}
            t0 = time.perf_counter()
            results, error = self._retrieve(fresh, contexts)
            elapsed = time.perf_counter() - t0
            for i, qs in pending.items():
                t = trajs[i]
                t.retrieval_seconds += elapsed
                blocks, ids = [], []
                for q, rep in zip(qs, repeats[i]):
                    if rep:
                        blocks.append(["(repeated query: see the earlier results above)"])
                        t.issues.append("repeated_query")
                    else:
                        blocks.append(results.get(q, []))
                        ids.extend(h.id for h in blocks[-1])
                    searched[i].append(set(q.lower().split()))
                t.queries.append(qs)
                t.doc_ids.append(ids)
                round_queries[i].extend(qs)
                round_docs[i].extend(ids)
                if error:
                    t.search_errors.append(error)
                    appends[i] = RESULT_TEMPLATE.format(results=f"(search unavailable: {error[:200]})")
                else:
                    appends[i] = self._result_block(blocks, qs)
            # Append result/feedback tokens; samples without room for them stop here.
            token_appends = {}
            for i, text in appends.items():
                ids = text_ids(self.tokenizer, text)
                if len(ids) + 16 > budget_left(i):
                    done.append(i)
                    finish(i, "budget")
                    continue
                if cfg.result_suffix:
                    text += cfg.result_suffix
                    carry[i] = cfg.result_suffix  # the next turn is parsed as suffix + generated text
                    ids = text_ids(self.tokenizer, text)
                add(i, ids, text, model=False, kind="result" if i in pending else "feedback")
                self.stats.appended_tokens += len(ids)
                token_appends[i] = ids
            for i in active:
                if i not in done and i not in token_appends:  # cannot happen by construction; never spin
                    done.append(i)
                    finish(i, "incomplete")
            session.release(done)
            session.append({i: ids for i, ids in token_appends.items() if i not in done})
            new_blocks = {i: b for i, b in new_blocks.items() if i not in done}
            if new_blocks:
                row_blocks.update(new_blocks)
                enforce = getattr(session, "block_answers", None)
                if enforce is None or not enforce(new_blocks):
                    self.stats.unenforced_blocks += len(new_blocks)
                    if not warned:
                        log.warning("the %s backend cannot constrain generation: STIE's answer block (eq. 13) "
                                    "stays a feedback note; rounds that repeat a blocked answer are marked "
                                    "'blocked_answer'", getattr(self.backend, "name", "generation"))
                        warned = True
            active = [i for i in active if i not in done]
        self.stats.seconds += time.perf_counter() - start
        return trajs
