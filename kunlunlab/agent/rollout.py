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
on the row's later answers (:meth:`~kunlunlab.agent.transformers_backend.TransformersSession.block_answers`); a
session that cannot enforce it (the OpenAI-compatible one) is logged once per run, counted in
``RolloutStats.unenforced_blocks``, and a round whose answer the block covers is marked with the issue
``blocked_answer``. The feedback block is appended either way.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

from kunlunlab.agent.backends import (AnswerBlock, Backend, GenerationSession, SamplingConfig, Segment, mean_confidence,
                                      text_ids)
from kunlunlab.agent.protocol import Turn, format_results
from kunlunlab.agent.protocols import AgentProtocol, get_protocol
from kunlunlab.configs import non_negative, positive
from kunlunlab.retrieval.client import RetrievalServiceError

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    max_searches: int = non_negative(8)  # per question (paper: 8)
    max_turn_tokens: int = positive(256)  # generated tokens per turn
    max_total_tokens: int = positive(1024)  # completion budget per sample: generated + appended tokens
    top_k: int = positive(3)      # passages per query
    max_result_chars: int = positive(600)  # per passage, so one result block cannot swallow the budget
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
class NewSample:
    """A sample a :data:`Feed` adds to a running rollout: its prompt, question, prefix (as ``run``'s ``prefixes``)
    and the search its queries go to (None: the engine's)."""

    prompt_ids: list[int]
    question: str
    prefix: str = ""
    search: SearchFn | None = None


# Called after each turn with the run's trajectories so far and the samples that finished in it; returns samples
# to add to the run (DAPO's refills of a group that finished flat, kunlunlab/training/dapo.py).
Feed = Callable[[list["Trajectory"], list[int]], list[NewSample]]


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


@dataclass
class _TurnOutcome:
    """What one turn decided for its samples, collected while their segments are read."""

    pending: dict[int, list[str]] = field(default_factory=dict)  # sample -> its queries, searched this turn
    appends: dict[int, str] = field(default_factory=dict)  # sample -> the result or feedback text it gets next
    new_blocks: dict[int, AnswerBlock] = field(default_factory=dict)  # sample -> the controller's new answer block
    done: list[int] = field(default_factory=list)  # samples that stop after this turn
    segments: list[int] = field(default_factory=list)  # samples whose turn ended in this call


class _Run:
    """The state one :meth:`RolloutEngine.run` call keeps across its turns: the trajectories and, per sample,
    the text its next turn is parsed after, its earlier queries, its current round's searches and its block."""

    def __init__(self, cfg: RolloutConfig, prompts: Sequence[Sequence[int]], questions: Sequence[str],
                 prefixes: Sequence[str] | None, controller: AnswerController | None):
        self.cfg = cfg
        self.start = time.perf_counter()
        self.trajs = [Trajectory(q, list(p)) for q, p in zip(questions, prompts)]
        self.carry = list(prefixes) if prefixes else [""] * len(self.trajs)  # parsed before the next turn's text
        for t, prefix in zip(self.trajs, self.carry):
            if prefix:
                t.steps.append({"kind": "prefix", "text": prefix})
        self.searched: list[list[set[str]]] = [[] for _ in self.trajs]  # word sets of earlier queries (repeat blocking)
        self.round_queries: list[list[str]] = [[] for _ in self.trajs]
        self.reprompts = [0] * len(self.trajs)  # re-prompts after unusable turns, at most max_searches per sample
        self.round_docs: list[list[str]] = [[] for _ in self.trajs]
        self.controller = controller
        self.answer_block = getattr(controller, "answer_block", None)
        self.row_blocks: dict[int, AnswerBlock] = {}  # sample -> the answer block its session row is under
        self.warned = False  # an unenforced block was logged (once per run)
        self.searches: list[SearchFn | None] = [None] * len(self.trajs)  # None: the engine's search
        self.starts = [self.start] * len(self.trajs)  # when each sample entered the run

    def extend(self, sample: NewSample) -> int:
        """A sample added while the run goes on (``run``'s ``feed``); returns its index."""
        self.trajs.append(Trajectory(sample.question, list(sample.prompt_ids)))
        self.carry.append(sample.prefix)
        if sample.prefix:
            self.trajs[-1].steps.append({"kind": "prefix", "text": sample.prefix})
        for per_sample in (self.searched, self.round_queries, self.round_docs):
            per_sample.append([])
        self.reprompts.append(0)
        self.searches.append(sample.search)
        self.starts.append(time.perf_counter())
        return len(self.trajs) - 1

    def add(self, i: int, ids: list[int], text: str, model: bool, logprobs: list[float] | None = None,
            **extra) -> None:
        """Appends tokens to sample ``i``'s completion: the model's (mask 1, their log-probs) or the environment's."""
        t = self.trajs[i]
        t.completion_ids.extend(ids)
        t.mask.extend([1 if model else 0] * len(ids))
        t.logprobs.extend(logprobs if logprobs is not None and len(logprobs) == len(ids) else [0.0] * len(ids))
        t.steps.append({"kind": "model" if model else extra.pop("kind", "result"), "text": text, **extra})

    def budget_left(self, i: int) -> int:
        return self.cfg.max_total_tokens - len(self.trajs[i].completion_ids)

    def finish(self, i: int, why: str) -> None:
        self.trajs[i].finish = why
        self.trajs[i].seconds = time.perf_counter() - self.starts[i]


class RolloutEngine:
    """``protocol`` (:mod:`kunlunlab.agent.protocols`, default this project's search-think protocol) sets what a turn
    stops at, how it is read, how documents and notices are appended, and which unusable turns are answered with
    the protocol's re-prompt instead of ending the sample (Search-R1 re-prompts; the others end)."""

    def __init__(self, backend: Backend, search: SearchFn | None, config: RolloutConfig | None = None,
                 protocol: AgentProtocol | str | None = None):
        self.backend, self.search, self.config = backend, search, config or RolloutConfig()
        self.protocol = get_protocol(protocol or "search_think") if not isinstance(protocol, AgentProtocol) \
            else protocol
        self.tokenizer = backend.tokenizer
        self.stats = RolloutStats()

    def _result_block(self, hits_per_query: list[list], queries: list[str]) -> str:
        return self.protocol.result_block(hits_per_query, queries, self.config.max_result_chars)

    def _retrieve(self, queries: list[str], contexts: dict[str, dict], search: SearchFn | None = None
                  ) -> tuple[dict[str, list], str | None]:
        """One call for all distinct queries of the turn (to ``search``, default the engine's); on a dead service a
        defined fallback."""
        search = search or self.search
        unique = list(dict.fromkeys(queries))
        if not unique or search is None:
            return {q: [] for q in unique}, ("no retriever configured" if unique and search is None else None)
        t0 = time.perf_counter()
        try:
            if getattr(search, "wants_context", False):  # the NLR router reads history and context
                results = search(unique, self.config.top_k, contexts=[contexts[q] for q in unique])
            else:
                results = search(unique, self.config.top_k)
            error = None
        except RetrievalServiceError as err:
            log.warning("search failed, answering this turn without results: %s", err)
            results, error = [[] for _ in unique], str(err)
        self.stats.retrieve_s += time.perf_counter() - t0
        self.stats.retrieval_calls += 1
        return dict(zip(unique, results)), error

    def run(self, prompts: Sequence[Sequence[int]], questions: Sequence[str],
            controller: AnswerController | None = None, prefixes: Sequence[str] | None = None,
            max_batch: int | None = None, searches: Sequence[SearchFn | None] | None = None,
            feed: Feed | None = None) -> list[Trajectory]:
        """``prefixes``: text at the end of each prompt that opens the assistant's reply (e.g. ``<think>``);
        it is part of the prompt tokens, and the first turn is parsed as prefix + generated text.

        ``max_batch`` (None: every prompt at once): rows generating at a time. On a session that can continue rows
        one by one (``backend.sessions_continue``, the local one), a sample whose turn ends is searched and continues at
        once instead of waiting for the batch's slowest turn, and a finished sample's slot takes the next prompt,
        so the batch stays full; the samples' texts are the same as in lock-step turns (a row's tokens depend
        only on its own columns).

        ``searches``: per prompt, the search its queries go to (None: the engine's ``search``); each turn makes one
        call per distinct search. ``feed`` (sessions that continue rows only): asked after every turn that finished
        samples, its :class:`NewSample` join the run (at the end of the returned list) and take free rows as they
        come, up to ``max_batch`` (None: as many rows as ``prompts``)."""
        state = _Run(self.config, prompts, questions, prefixes, controller)
        if searches is not None:
            if len(searches) != len(prompts):
                raise ValueError(f"{len(searches)} searches for {len(prompts)} prompts")
            state.searches = list(searches)
        continues = getattr(self.backend, "sessions_continue", False)  # else lock-step turns, every prompt at once
        if feed is not None and not continues:
            raise ValueError(f"the {getattr(self.backend, 'name', 'generation')} backend's sessions cannot take "
                             "rows while a rollout runs: no feed")
        width = min(max_batch, len(prompts)) if max_batch and continues else len(prompts)
        session = self.backend.open(prompts[:width], self.config.sampling)
        waiting = list(range(width, len(prompts)))
        active = list(range(width))
        while active:
            turn = self._generate_turn(state, session, active, "any" if continues else "all")
            self._search_pending(state, turn)
            token_appends = self._append_texts(state, turn)
            for i in turn.segments:
                if i not in turn.done and i not in token_appends:  # cannot happen by construction; never spin
                    turn.done.append(i)
                    state.finish(i, "incomplete")
            session.release(turn.done)
            session.append({i: ids for i, ids in token_appends.items() if i not in turn.done})
            self._hand_blocks(state, session, turn)
            active = [i for i in active if i not in turn.done]
            if feed is not None and turn.done:
                waiting += [state.extend(sample) for sample in feed(state.trajs, list(turn.done))]
            admit, waiting = waiting[:width - len(active)], waiting[width - len(active):]
            if admit:
                session.add([state.trajs[i].prompt_ids for i in admit], admit)
                active += admit
        self.stats.seconds += time.perf_counter() - state.start
        return state.trajs

    def _generate_turn(self, state: _Run, session: GenerationSession, active: list[int],
                       until: str = "all") -> _TurnOutcome:
        """One turn of generation for the active samples (``until="any"``: until at least one ends its turn),
        each finished segment then read by :meth:`_read_segment`."""
        t0 = time.perf_counter()
        limits = {i: min(self.config.max_turn_tokens, state.budget_left(i)) for i in active}
        segments = session.generate(active, limits, self.protocol.stop_strings, **({"until": until}
                                                                                 if until != "all" else {}))
        self.stats.generate_s += time.perf_counter() - t0
        turn = _TurnOutcome(segments=list(segments))
        for i in segments:
            self._read_segment(state, turn, i, segments[i])
        return turn

    def _read_segment(self, state: _Run, turn: _TurnOutcome, i: int, seg: Segment) -> None:
        """Records sample ``i``'s generated segment and decides what follows it: its queries are searched, a
        notice is appended, an answer round is taken (:meth:`_answer_round`), or the sample ends."""
        cfg, t = self.config, state.trajs[i]
        extra = {"interventions": seg.interventions} if seg.interventions else {}
        state.add(i, seg.token_ids, seg.text, model=True, logprobs=seg.logprobs, **extra)
        self.stats.model_tokens += len(seg.token_ids)
        self.stats.answer_interventions += seg.interventions
        protocol = self.protocol
        parsed = protocol.parse_turn(state.carry[i] + seg.text)
        state.carry[i] = ""
        t.issues.extend(parsed.issues)
        if parsed.kind == "search":
            if t.n_searches + len(turn.pending.get(i, [])) >= cfg.max_searches:
                t.issues.append("search_limit")
                # a peer's loop ends there (AgentProtocol.at_search_limit); this project's notice, once ignored, too
                if protocol.at_search_limit == "end" or "search_limit" in t.issues[:-1]:
                    turn.done.append(i)
                    state.finish(i, "search_limit")
                else:
                    turn.appends[i] = protocol.notice_block(
                        f"Search limit ({cfg.max_searches}) reached. Answer now with what you know.")
                return
            turn.pending[i] = parsed.queries
        elif parsed.kind == "answer":
            self._answer_round(state, turn, i, parsed, seg)
        elif parsed.kind in protocol.reprompt and protocol.invalid_block and seg.finish != "length" \
                and state.reprompts[i] < max(1, cfg.max_searches):
            state.reprompts[i] += 1  # an empty query, or (Search-R1) a turn without a closed action
            turn.appends[i] = protocol.invalid_block
        else:  # incomplete (token limit inside an action), no action at all, or an unusable turn not re-prompted
            turn.done.append(i)
            state.finish(i, "budget" if seg.finish == "length" else ("no_action" if parsed.kind == "none"
                                                                     else "incomplete"))

    def _answer_round(self, state: _Run, turn: _TurnOutcome, i: int, parsed: Turn, seg: Segment) -> None:
        """An answer becomes a round (STIE's unit), is checked against the sample's answer block, and goes to the
        controller, which stops the sample or has it continue after a feedback block (and may block answers)."""
        t = state.trajs[i]
        t.answer, t.answer_mode = parsed.answer, parsed.answer_mode
        round_ = AnswerRound(parsed.answer, seg.mean_logprob, mean_confidence(seg.logprobs),
                             state.round_queries[i], state.round_docs[i], list(parsed.issues))
        t.rounds.append(round_)
        state.round_queries[i], state.round_docs[i] = [], []
        if i in state.row_blocks:
            self.stats.blocked_rounds += 1
            if parsed.answer is not None and state.row_blocks[i].rejects(parsed.answer):  # the block did not hold
                t.issues.append("blocked_answer")
                self.stats.blocked_answer_repeats += 1
        stop, feedback = True, None
        if state.controller is not None:
            c0 = time.perf_counter()
            stop, feedback = state.controller.observe(i, round_)
            block = state.answer_block(i) if state.answer_block is not None and not stop else None
            if block is not None:
                turn.new_blocks[i] = block
            self.stats.controller_s += time.perf_counter() - c0
            self.stats.controller_rounds += 1
        if stop or state.budget_left(i) < 32:
            turn.done.append(i)
            state.finish(i, "answer" if state.controller is None else "controller")
        else:
            turn.appends[i] = self.protocol.notice_block(feedback or "Check your answer.")

    def _search_pending(self, state: _Run, turn: _TurnOutcome) -> None:
        """One retrieval call (per distinct search) for every pending query of every sample; where the protocol
        blocks repeats, a sample's exact repeat of an earlier query (same bag of words) is blocked and answered
        from memory instead. Each searching sample's result block (or the notice of an unavailable service) goes
        to ``turn.appends``."""
        cfg, trajs = self.config, state.trajs
        block = cfg.block_repeated_queries and self.protocol.blocks_repeats  # STIE's, this project's protocol only
        repeats = {i: [block and set(q.lower().split()) in state.searched[i] for q in qs]
                   for i, qs in turn.pending.items()}
        contexts = {q: {"searches_so_far": trajs[i].n_searches,
                        "context_tokens": len(trajs[i].prompt_ids) + len(trajs[i].completion_ids)}
                    for i, qs in turn.pending.items() for q in qs}
        by_search: dict[int, tuple[SearchFn | None, list[int]]] = {}
        for i in turn.pending:
            by_search.setdefault(id(state.searches[i]), (state.searches[i], []))[1].append(i)
        answers: dict[int, tuple[dict[str, list], str | None, float]] = {}  # sample -> its search's results
        for search, samples in by_search.values():
            t0 = time.perf_counter()
            asked = [q for i in samples for q, rep in zip(turn.pending[i], repeats[i]) if not rep]
            results, error = self._retrieve(asked, contexts, search)
            elapsed = time.perf_counter() - t0
            answers.update({i: (results, error, elapsed) for i in samples})
        for i, qs in turn.pending.items():
            t = trajs[i]
            results, error, elapsed = answers[i]
            t.retrieval_seconds += elapsed
            blocks, ids = [], []
            for q, rep in zip(qs, repeats[i]):
                if rep:
                    blocks.append(["(repeated query: see the earlier results above)"])
                    t.issues.append("repeated_query")
                else:
                    blocks.append(results.get(q, []))
                    ids.extend(h.id for h in blocks[-1])
                state.searched[i].append(set(q.lower().split()))
            t.queries.append(qs)
            t.doc_ids.append(ids)
            state.round_queries[i].extend(qs)
            state.round_docs[i].extend(ids)
            if error:
                t.search_errors.append(error)
                turn.appends[i] = self.protocol.notice_block(f"(search unavailable: {error[:200]})")
            else:
                turn.appends[i] = self._result_block(blocks, qs)

    def _append_texts(self, state: _Run, turn: _TurnOutcome) -> dict[int, list[int]]:
        """Records each sample's result or feedback text as environment tokens; samples without room for it stop
        here. Returns the token ids to append to the session, by sample."""
        cfg = self.config
        token_appends = {}
        for i, text in turn.appends.items():
            ids = text_ids(self.tokenizer, text)
            if len(ids) + 16 > state.budget_left(i):
                turn.done.append(i)
                state.finish(i, "budget")
                continue
            if cfg.result_suffix:
                text += cfg.result_suffix
                state.carry[i] = cfg.result_suffix  # the next turn is parsed as suffix + generated text
                ids = text_ids(self.tokenizer, text)
            state.add(i, ids, text, model=False, kind="result" if i in turn.pending else "feedback")
            self.stats.appended_tokens += len(ids)
            token_appends[i] = ids
        return token_appends

    def _hand_blocks(self, state: _Run, session: GenerationSession, turn: _TurnOutcome) -> None:
        """The controller's new answer blocks (STIE's eq. 13) of the samples that continue go to the session; a
        session that cannot enforce them has them counted, and logged once per run."""
        new_blocks = {i: b for i, b in turn.new_blocks.items() if i not in turn.done}
        if not new_blocks:
            return
        state.row_blocks.update(new_blocks)
        enforce = getattr(session, "block_answers", None)
        if enforce is None or not enforce(new_blocks):
            self.stats.unenforced_blocks += len(new_blocks)
            if not state.warned:
                log.warning("the %s backend cannot constrain generation: STIE's answer block (eq. 13) "
                            "stays a feedback note; rounds that repeat a blocked answer are marked "
                            "'blocked_answer'", getattr(self.backend, "name", "generation"))
                state.warned = True
