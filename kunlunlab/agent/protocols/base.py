"""What every agent protocol is (:class:`AgentProtocol`) and the helpers the protocols share.

A peer's checkpoint behaves as in its own repository only with the prompt, document block and turn boundaries its
training saw; its recipe retrains here only with its own parsing and answer extraction. So each
:class:`AgentProtocol` carries, as the peer's code does it: chat messages (and a base-model prompt), the assistant
prefix, stop strings, the document block appended after a search (tags included), a turn parser that never raises
(returning :class:`~kunlunlab.agent.protocol.Turn`), the answer the peer's evaluation extracts and its format check;
and what the rest of the package needs of it: its SFT rendering, its rewards, its retrieval budget and whether it is
a peer. What ``result_block``, ``notice_block`` and ``invalid_block`` return is environment text (mask 0), as every
peer masks its documents out of the loss (Search-R1 ``info_mask``, ReSearch ``result_mask``, R1-Searcher
``retrieve_mask``). One module of this package per protocol defines it as ``PROTOCOL`` (docs/contributing.md,
"Adding an agent").
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kunlunlab.agent.protocol import BACKGROUND_TEMPLATE, Turn

SEARCH_LIMIT_BEHAVIOURS = ("notice", "end")  # AgentProtocol.at_search_limit


@dataclass(frozen=True)
class ExplorationSpec:
    """A recipe's exploration of dead ends during RL, as data (REX-RAG's mixed sampling with policy correction;
    the mechanism is ``kunlunlab.training.exploration``). After a rollout call is scored, a group whose every
    sample is wrong is a dead end; each of its samples that ended in an answer is probed with probability
    ``probe_share``: its last turn is cut where ``cut_pattern`` first matches (the match removed), one of
    ``prompts`` (uniformly drawn) is appended as model text and the rollout continues with the same backend. The
    probes kept per call are a share of the batch, an exponential moving average of the probes' accuracy
    (``keep_ratio_start``, smoothing ``keep_ratio_smoothing``), the ones whose prompt the policy finds likeliest
    first. A kept probe replaces the sample it was cut from, and every token's old log-prob in the loss becomes
    the mixture's, log((1 - a) pi_old + a mu) (a: the probes' share of the batch, mu: the probe policy)."""

    prompts: tuple[str, ...]
    cut_pattern: str
    probe_share: float
    keep_ratio_start: float
    keep_ratio_smoothing: float
    source: str = ""

    def __post_init__(self):
        if not self.prompts or any(not p for p in self.prompts):
            raise ValueError("an exploration spec needs its prompts (none empty)")
        re.compile(self.cut_pattern)
        for name in ("probe_share", "keep_ratio_start", "keep_ratio_smoothing"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"exploration {name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class RetrievalCurriculum:
    """A recipe's difficulty-aware retrieval curriculum, as data (UR2's; the mechanism is
    ``kunlunlab.training.curriculum``). Before a training question is first rolled out, the policy answers it
    ``samples`` times under ``closed_messages`` (the prompt of a question not offered retrieval) with no search
    allowed; its share of exact-match answers gives its level: the first of ``levels`` (name, least share, from the
    easiest down; the last's least share is 0) whose least share it reaches. ``stages``: (name, level -> the
    probability that a question of that level is offered retrieval), in order; a second stage starts at
    ``rewards.stage1_share`` of the RL steps, with the staged reward's second reward. Each question draws one
    uniform number once (seeded by the run seed and the question): it is offered retrieval in a stage where the
    number is below its level's probability, and then gets the protocol's own prompt, else ``closed_messages``.
    ``scope``: ``"drawn"`` (each question when TRL first draws it, by the policy of that call) or ``"pool"`` (every
    training question at the first rollout call, by the SFT model)."""

    closed_messages: Callable[[str, str | None], list[dict]] = field(compare=False)
    samples: int
    levels: tuple[tuple[str, float], ...]
    stages: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
    scope: str = "drawn"
    source: str = ""

    def __post_init__(self):
        if self.samples < 1:
            raise ValueError(f"a curriculum needs at least one sample per question, got {self.samples}")
        shares = [share for _, share in self.levels]
        if not self.levels or shares != sorted(shares, reverse=True) or shares[-1] != 0.0 or shares[0] > 1.0:
            raise ValueError(f"curriculum levels go from the easiest down to a least share of 0: {self.levels}")
        if not 1 <= len(self.stages) <= 2:
            raise ValueError(f"a curriculum has one or two stages (the staged reward's), got {len(self.stages)}")
        names = {name for name, _ in self.levels}
        for stage, offer in self.stages:
            if {level for level, _ in offer} != names or any(not 0.0 <= p <= 1.0 for _, p in offer):
                raise ValueError(f"curriculum stage {stage!r} must give every level {sorted(names)} a probability "
                                 f"in [0, 1], got {offer}")
        if self.scope not in ("drawn", "pool"):
            raise ValueError(f"curriculum scope must be 'drawn' or 'pool', got {self.scope!r}")

    def level(self, correct_share: float) -> str:
        """The level of a question answered right in ``correct_share`` of its samples."""
        return next(name for name, least in self.levels if correct_share >= least)

    def offer(self, stage: int, level: str) -> float:
        """The probability that a question of ``level`` is offered retrieval in stage ``stage`` (0-based)."""
        return dict(self.stages[stage][1])[level]


@dataclass(frozen=True)
class AgentProtocol:
    """``parse_turn(text)`` reads one turn (the first after ``assistant_prefix``); ``final_answer`` and ``format_ok``
    a whole completion (after the prompt, prefix excluded, documents included: the peers' reward "response").
    ``invalid_block``: what the peer appends after a turn of a ``reprompt`` kind (None: it ends the trajectory).
    ``top_k``, ``max_searches``: the peer's training settings (None: no limit but the token budget), what a rollout
    runs unless a comparison states its own budget (:meth:`passages_per_search`, :meth:`search_limit`).
    ``blocks_repeats``: STIE's repeat blocking of an earlier query (this project's; no peer has it).
    ``at_search_limit``: a search past ``max_searches``: ``"notice"`` (this project's notice, the sample ends at the
    second) or ``"end"`` (the search is not run and the trajectory ends, as the peers' loops end).

    What the protocol is to the rest of the package (every registry reads it, none lists protocols by name):
    ``peer``: a peer's protocol, run as its repository runs it: its own method (``kunlunlab eval --method <name>``,
    ``agent.method``) named after it, its prompt and prefix fixed; False: this project's, spoken by the methods
    ``agent`` and ``kunlun`` with a run's own system prompt and prefix. ``answer_modes``: this project's short/long
    answers, read by the dual-mode reward's parse record (``training.rewards.parse_completion``: accuracy, format
    compliance and rewards.kind ``kunlun``); False: ``final_answer`` and ``format_ok`` read a completion.
    ``render_search(think, query)``, ``render_answer(think, answer)``: one SFT turn written in the protocol
    (``training.peer_data``: the search-think trajectories rewritten; None, both: the trajectories are used as they
    are). ``rewards``: reward kind -> ``f(completion, golds, **options) -> float``, the protocol's own rewards
    (``rewards.kind``); ``staged_rewards``: kind -> (first, second), the first for the first ``rewards.stage1_share``
    of the RL steps, then the second; ``rewards_read_truncation``: its rewards take ``truncated`` (the response ran
    out of tokens: no EOS). ``exploration``: how the recipe probes dead-end groups during RL
    (:class:`ExplorationSpec`); None: no exploration, every rollout is the policy's own."""

    name: str
    source: str
    assistant_prefix: str
    stop_strings: tuple[str, ...]
    build_messages: Callable[[str, str | None], list[dict]]
    build_base_prompt: Callable[[str, str | None], str] | None  # None: the protocol has no base-model prompt
    format_docs: Callable[[list, list[str]], str]  # passage texts (capped) and the queries -> the appended block
    wrap_notice: Callable[[str], str]
    parse_turn: Callable[[str], Turn]
    final_answer: Callable[[str], str | None]
    format_ok: Callable[[str], bool]
    env_pattern: str  # matches every environment block in a completion
    invalid_block: str | None
    reprompt: tuple[str, ...]
    top_k: int
    max_searches: int | None
    blocks_repeats: bool = False
    at_search_limit: str = "end"
    peer: bool = True
    answer_modes: bool = False
    render_search: Callable[[str, str], str] | None = None
    render_answer: Callable[[str, str], str] | None = None
    rewards: Mapping[str, Callable[..., float]] = field(default_factory=dict, hash=False)
    staged_rewards: Mapping[str, tuple[str, str]] = field(default_factory=dict, hash=False)
    rewards_read_truncation: bool = False
    # which training questions are offered retrieval, by their difficulty (RetrievalCurriculum; the protocol's
    # rewards then take ``offered``); None: every question gets the protocol's own prompt
    curriculum: RetrievalCurriculum | None = None
    exploration: ExplorationSpec | None = None  # how RL probes dead-end groups (REX-RAG's); None: no exploration

    def __post_init__(self):
        if self.at_search_limit not in SEARCH_LIMIT_BEHAVIOURS:
            raise ValueError(f"at_search_limit must be one of {SEARCH_LIMIT_BEHAVIOURS}, got {self.at_search_limit!r}")
        if (self.render_search is None) != (self.render_answer is None):
            raise ValueError(f"{self.name}: render_search and render_answer go together (both or neither)")
        unknown = [s for stages in self.staged_rewards.values() for s in stages if s not in self.rewards]
        if unknown:
            raise ValueError(f"{self.name}: staged_rewards name rewards it does not define: {unknown}")

    @property
    def reward_kinds(self) -> tuple[str, ...]:
        """Every ``rewards.kind`` that reads this protocol: its staged kinds, then its rewards."""
        return (*self.staged_rewards, *self.rewards)

    def passages_per_search(self, override: int | None = None) -> int:
        """The top-k a rollout runs: a comparison's ``override`` (the same for every arm), else the protocol's own."""
        return self.top_k if override is None else override

    def search_limit(self, override: int | None, token_budget: int) -> int:
        """The searches per question a rollout allows: a comparison's ``override``, else the protocol's own; a
        protocol without a limit (ReSearch: only the response length bounds it) gets ``token_budget``, which no
        rollout reaches (every search costs generated tokens)."""
        if override is not None:
            return override
        return token_budget if self.max_searches is None else self.max_searches

    def messages(self, question: str, background: str | None = None) -> list[dict]:
        """Chat messages as the peer builds them for an instruct model (the chat template adds the rest)."""
        return self.build_messages(question, background)

    def base_prompt(self, question: str, background: str | None = None) -> str:
        """The raw prompt for a base model, without ``assistant_prefix``; ValueError where there is none."""
        if self.build_base_prompt is None:
            raise ValueError(f"the {self.name} protocol has no base-model prompt; use messages() with a chat template")
        return self.build_base_prompt(question, background)

    def result_block(self, hits_per_query: list[list], queries: list[str], max_chars: int | None = None) -> str:
        """The environment text after a search: ``Hit`` objects (or plain strings), each capped at ``max_chars`` as
        ``rollout.result_block`` caps them (None or 0: uncapped; the peers cap none but by token budget)."""
        docs = [[h if isinstance(h, str) else _cap(h.contents, max_chars) for h in hits] for hits in hits_per_query]
        return self.format_docs(docs, list(queries))

    def notice_block(self, text: str) -> str:
        """An environment notice (search limit, service unavailable) inside the peer's document tags."""
        return self.wrap_notice(text)

    def spans(self, text: str) -> list[tuple[str, bool]]:
        """A completion cut into (text, is_environment) spans by ``env_pattern``; joined they give ``text`` back."""
        parts = re.split(f"({self.env_pattern})", text, flags=re.S)
        return [(part, k % 2 == 1) for k, part in enumerate(parts) if part]


def _cap(contents: str, max_chars: int | None) -> str:
    return contents if not max_chars or len(contents) <= max_chars else contents[:max_chars] + "…"


def _with_background(question: str, background: str | None) -> str:
    return (BACKGROUND_TEMPLATE.format(background=background.strip()) if background else "") + question


def _think(text: str) -> tuple[str, list[str]]:
    """Closed ``<think>`` blocks joined, and ``unclosed:think`` when an opening tag has no closing one."""
    blocks = re.findall(r"<think>(.*?)</think>", text, re.S)
    issues = ["unclosed:think"] if text.count("<think>") > text.count("</think>") else []
    return "\n".join(b.strip() for b in blocks), issues


def _answer_turn(answer: str | None, think: str, issues: list[str]) -> Turn:
    if answer is not None and not answer.strip():
        return Turn("answer", answer=None, answer_mode="short", think=think, issues=issues + ["empty_answer"])
    return Turn("answer", answer=answer.strip() if answer else None, answer_mode="short", think=think, issues=issues)
