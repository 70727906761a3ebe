"""STIE: Search-Think Iterative Enhancement, a controller over the agent's answer rounds.

Source: arXiv 2506.19466 (KunLunBaizeRAG), §2.2, equations (5)–(13): a three-tier "memory – filter –
confidence" framework. What we could read of the paper (its abstract, and secondary summaries of §2.2
that kept the prose but dropped the typeset mathematics) fixes the structure and the numbering: (5) a
memory of earlier answers; (6) a lexical overlap O and (7) a difference D between a new answer and
that history; (8) the difference aggregated as a minimum over the recent rounds and (9) compared with
asymmetric thresholds δ1..δ3; (10) a replacement condition against the candidate with the
second-highest confidence outside the shielded set and (11) the replacement itself; (12) the frequency
of an answer within a historical window, which puts it into the shielded set; (13) the repeat count with
an indicator function that blocks the answer's future generation. Termination (low overlap with earlier
answers, confidence plateaus, information changes little between rounds) is unnumbered prose, as is the
final ranking "highest confidence, lowest redundancy". **The exact formulas below are our
reconstruction of that prose**; the equation numbers are the paper's.

* (5)  memory        M_t = [(a_1, c_1), …, (a_{t-1}, c_{t-1})], c = exp(mean token log-prob).
* (6)  overlap       O(a, b) = |W(a) ∩ W(b)| / |W(a) ∪ W(b)|, W = set of normalised, stemmed words.
* (7)  difference    D(a, b) = 1 − O(a, b).
* (8)  aggregated    D̄_t = min_k D(a_t, a_{t-k}) over the lags k = 1..3 whose round gave an answer
       difference    (rounds without an answer are left out; no answered round: D̄_t undefined, a_t valid).
* (9)  thresholds    a_t is *valid* (new) iff D(a_t, a_{t-k}) ≥ δ_k for each of those lags, asymmetric
                     δ1 ≥ δ2 ≥ δ3: repeating the last round is judged most strictly. An answer that fails
                     is *redundant* with the first lag it fails against.
* (10) condition     C_t = the answers of the memory outside the shielded set S_t (12), each with its best
                     confidence (and the surface form that had it). A redundant a_t is replaced iff its
                     rival a' = argmax_{a ∈ C_t, a ≠ a_t} c(a) (the second-highest confidence when a_t
                     leads) beats it: c(a') > c(a_t) + ``margin``. A shielded a_t is not in C_t: the
                     condition holds for the most confident candidate.
* (11) replacement   â_t = a' if (10) holds, else a_t (in its most confident surface form). A valid,
                     unshielded a_t is accepted as â_t as it is. If C_t is empty the most confident answer
                     is kept and ``all_blocked`` is set. Equal confidences go to the earlier answer.
* (12) frequency     f_t(a) = |{τ ∈ (t − H, t] : round τ's answer is a or redundant with it}|, H =
                     ``history_window`` (None: the whole memory); S_t = {a : f_t(a) ≥ K}.
* (13) repeat count  n_t(a) = the same count over the whole memory; 𝟙[n_t(a) ≥ K] blocks a's future
                     generation: B_t = {a : n_t(a) ≥ K} (:meth:`STIEController.blocked_answers`). Since
                     f_t ≤ n_t, S_t ⊆ B_t; with H = None they are equal. With ``block_generation`` the
                     block is a constraint on generation (:meth:`STIEController.answer_block`): in later
                     rounds the model cannot end an answer (close its ``\\boxed{}`` or answer tag) on an
                     answer that STIE would count for a blocked one, i.e. one with the same words W as a
                     blocked surface form or redundant (9) with a round counted for it.

Termination (prose, no equation number): stop after round t when (i) a_t is valid and its *mean* overlap
with the up-to-3 answered rounds of (8) is below ``overlap_stop``: a genuinely new answer broke the loop;
(ii) c_t ≥ ``confidence_ceiling`` and a_t is not shielded; (iii) the round retrieved a share of new
documents below ``min_new_info`` (searching no longer brings information); and always at ``max_rounds``.

Final pick (the ranking step, prose): ``final_pick="confidence"`` answers with the candidate of C_t
that has the highest confidence, ties going to the lowest redundancy n_t(a), then to the earlier answer
(the paper's "highest confidence, lowest redundancy"); ``final_pick="latest"`` answers with â_t of
(11), the latest accepted answer, even when an earlier candidate was more confident (it carries what
the latest search found). The pick is applied after every round, so the online controller and
:func:`replay` answer the same whenever they stop.

Departures, each with its reason:

* ``final_pick`` defaults to ``"latest"``, not the paper's ``"confidence"``: the trained checkpoints
  and the measured ``make run`` numbers were produced with it, and changing the default would change
  those numbers without a measurement of which pick is better (pending: EM with each pick on the
  trained checkpoint, paired, held-out world questions).
* ``history_window`` defaults to None (the whole memory): the paper's text that we could read names a
  historical window but no size, and None keeps the behaviour the measured numbers were made with.
* (8)–(9): the paper compares the minimum difference with three thresholds; we apply δ_k to lag k
  (the minimum of (8) taken lag by lag against its own threshold), which is how three thresholds can
  act on one minimum. ``min_difference`` reports D̄_t itself.
* (13)'s block acts on generation through the rollout engine and the local session
  (:class:`~kunlunlab.agent.transformers_backend.TransformersSession`) as a bad-words constraint on the answer span:
  inside the box, the last token of each blocked spelling's token path (the path the model's own repeats
  took) is masked, and for any other spelling the token that would close the answer on it. So no answer
  STIE would count for a blocked one can be completed; a model that has already written one inside the
  box must continue it into another answer. The feedback turn still names the blocked set ("Do not give
  these again"). The OpenAI-compatible backend cannot constrain (:meth:`~kunlunlab.agent.openai_backend.
  OpenAISession.block_answers`): there the block stays the feedback note, the engine logs it as
  unenforced and marks a round that repeats a blocked answer (issue ``blocked_answer``). Measured on the
  paper's example shape through the real session (tests/agent/test_stie_block.py: two rows looping on Russia,
  one that never repeats; K = 3, 5 rounds): 3 answer rounds ran under a block, in 2 of them the block
  turned away the token the model wanted, and the blocked answer was generated 0 times (2 without the
  block, both in round 4); the verbatim loop ended one round earlier, on France at round 4.
* ``block_generation`` defaults to True (the paper's). It provably cannot change a trajectory in which no
  answer reaches K rounds: until n_t(a) ≥ K for some a the controller gives no block and the session's
  sampling path is the one without blocks (no mask, no decode). Every stored evaluation record of this
  project (experiments/results, ``make run``'s included, 2026-11-26) has at most 2 answer rounds per
  question, below K = 3, so none of those numbers can change. A trajectory that does repeat an answer K
  times changes from round K + 1 on: that is the block.
* W truncates words to 5 characters (so "Russia"/"Russian" match); the mean of termination (i) runs over
  the same three lags as (8); criterion (i) requires a_t to be valid (a low mean can hide a high overlap
  with the last round); "confidence plateaus" is read as a ceiling (ii); "information changes little" as
  the share of newly retrieved documents (iii); ``margin`` exists as a knob (0 reproduces the paper's
  "higher confidence"); c(a_t) in (10) is the best confidence of a_t's answer so far.

The controller is a pure function of the rounds, so :func:`replay` re-scores cached rounds with
other thresholds without regenerating (notebook 05).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal, Sequence

from kunlunlab.agent.backends import AnswerBlock
from kunlunlab.configs import non_negative, positive, probability
from kunlunlab.data.answers import normalize_answer

Difference = Literal["complement", "added_share"]
FinalPick = Literal["latest", "confidence"]
LAGS = 3  # eqs. (8)-(9): δ1..δ3; termination (i) averages over the same lags


# Collection: every round is generated (no early stop), so replays can stop wherever a setting says.
# Each value switches one termination criterion (§2.2's prose) off: a mean overlap is never below -1 (i),
# a confidence never reaches 1.1 (ii), a share of new documents is never below -1 (iii); only
# max_rounds ends the loop. Replacement and shielding (eqs. 10-12) still act on the collected rounds.
COLLECT_ALL_ROUNDS = dict(confidence_ceiling=1.1, overlap_stop=-1.0, min_new_info=-1.0)


@dataclass
class STIEConfig:
    delta1: float = probability(0.6)   # minimum difference against the previous round, eq. (9)
    delta2: float = probability(0.5)   # … against two rounds back
    delta3: float = probability(0.4)   # … against three rounds back
    repeat_k: int = positive(3)     # K: rounds of one answer before it is shielded (eq. 12) and blocked (eq. 13)
    margin: float = non_negative(0.0)   # confidence a rival needs over a redundant answer's own, eq. (10)
    overlap_stop: float = probability(0.2)  # termination (i): mean overlap with recent rounds below this ends the loop
    confidence_ceiling: float = probability(0.9)  # termination (ii)
    min_new_info: float = probability(0.1)  # termination (iii): share of new documents in the round
    # K + 2: after the K-th repeat is shielded, the model gets the blocked-answer feedback for two more
    # rounds (one may still echo the loop, as in the paper's Russia/France example of five rounds).
    # With max_rounds <= K blocking could never change an answer.
    max_rounds: int = positive(5)
    difference: Difference = "complement"  # eq. (7); "added_share" is the earlier variant, see difference()
    history_window: int | None = positive(None)  # H of eq. (12), in rounds; None: the whole memory (see the module docstring)
    final_pick: FinalPick = "latest"   # the ranking step; "confidence" is the paper's (see the module docstring)
    block_generation: bool = True      # eq. (13)'s block as a generation constraint, not only feedback (docstring)

    def __post_init__(self):
        if self.repeat_k < 1 or self.max_rounds < 1:
            raise ValueError("repeat_k and max_rounds must be at least 1")
        if self.difference not in ("complement", "added_share"):
            raise ValueError(f"unknown difference measure {self.difference!r}")
        if self.final_pick not in ("latest", "confidence"):
            raise ValueError(f"unknown final_pick {self.final_pick!r}; choose 'latest' or 'confidence'")
        if self.history_window is not None and self.history_window < self.repeat_k:
            raise ValueError(f"history_window ({self.history_window}) must be at least repeat_k ({self.repeat_k}) "
                             "or None: a shorter window could never shield an answer (eq. 12)")

    @property
    def deltas(self) -> tuple[float, float, float]:
        return (self.delta1, self.delta2, self.delta3)


@dataclass
class RoundInput:
    """What STIE needs from a round: the answer, its confidence and the documents it retrieved."""

    answer: str | None
    confidence: float
    doc_ids: Sequence[str] = ()


@dataclass
class STIEDecision:
    round: int
    accepted: str | None
    redundant_with: int | None  # index of the earlier round it repeats, if any (eq. 9)
    shielded: list[str]         # surface forms of every shielded answer, S_t (eq. 12)
    stop: bool
    reason: str | None  # "new_answer", "confident", "no_new_info", "max_rounds"
    all_blocked: bool = False
    replaced: bool = False      # eqs. (10)-(11), or the final pick, put another answer in place of a_t
    mean_overlap: float | None = None  # termination (i), over the answered rounds among the last 3
    min_difference: float | None = None  # D̄_t, eq. (8)
    blocked: list[str] = field(default_factory=list)  # surface forms blocked from generation, B_t (eq. 13)


STEM_CHARS = 5


def words(answer: str | None) -> frozenset[str]:
    """W(a): normalised words truncated to 5 characters (truncation stemming), so that surface
    variants such as "Russia" / "Russian" count as the same word."""
    return frozenset(w[:STEM_CHARS] for w in normalize_answer(answer).split()) if answer else frozenset()


def overlap(a: frozenset, b: frozenset) -> float:
    """Eq. (6): Jaccard overlap of two sets of words (two empty answers overlap fully)."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def difference(a: frozenset, b: frozenset, kind: Difference = "complement") -> float:
    """Eq. (7): D(a, b) = 1 − O(a, b), symmetric.

    ``kind="added_share"`` is the measure this project used before (|W(a) \\ W(b)| / |W(a)|, the share
    of a's words that b lacks). It is kept only to reproduce earlier tuning runs and to compare: it
    calls an answer that merely drops words from an earlier one ("Russia" after "Russian Federation")
    a full repeat (0), where the paper's complement gives 0.5."""
    if kind == "added_share":
        return len(a - b) / len(a) if a else 0.0
    return 1.0 - overlap(a, b)


@dataclass
class _Answer:
    """One distinct answer of the memory (a cluster of rounds redundant with each other)."""

    words: frozenset
    surfaces: list[str]
    rounds: list[int] = field(default_factory=list)  # the rounds that count for it: n(a) = len(rounds), eq. (13)
    best_conf: float = float("-inf")
    best_surface: str = ""


class _State:
    def __init__(self):
        self.memory: list[tuple[frozenset, str | None, float]] = []  # eq. (5)
        self.answer_of: list[int | None] = []  # round -> index into answers (None: no answer)
        self.answers: list[_Answer] = []  # in order of first appearance (ties go to the earlier)
        self.seen_docs: set[str] = set()
        self.accepted_idx: int | None = None
        self.blocked_words: dict[frozenset, bool] = {}  # is_blocked's verdicts since the last round

    @property
    def accepted(self) -> str | None:
        return self.answers[self.accepted_idx].best_surface if self.accepted_idx is not None else None

    def frequency(self, i: int, window: int | None) -> int:
        """Eq. (12): f_t(a), the rounds of answer ``i`` among the last ``window`` rounds (None: all)."""
        rounds = self.answers[i].rounds
        return len(rounds) if window is None else sum(r >= len(self.memory) - window for r in rounds)

    def shielded(self, cfg: STIEConfig) -> set[int]:
        return {i for i in range(len(self.answers)) if self.frequency(i, cfg.history_window) >= cfg.repeat_k}

    def blocked(self, k: int) -> set[int]:
        return {i for i, a in enumerate(self.answers) if len(a.rounds) >= k}  # eq. (13): 𝟙[n(a) ≥ K]

    def surfaces(self, indices: set[int]) -> list[str]:
        return sorted(s for i in indices for s in self.answers[i].surfaces)

    def _recent_differences(self, w: frozenset, cfg: STIEConfig) -> list[tuple[int, float]]:
        """(round, D(a_t, a_round)) for the lags k = 1..3 whose round gave an answer, lag 1 first."""
        t = len(self.memory)
        return [(t - lag, difference(w, self.memory[t - lag][0], cfg.difference))
                for lag in range(1, LAGS + 1) if t - lag >= 0 and self.memory[t - lag][0]]

    def _mean_recent_overlap(self, w: frozenset) -> float | None:
        """Termination (i): mean O(a_t, a_{t-k}) over the answered rounds among the last three."""
        recent = [m[0] for m in self.memory[-LAGS:] if m[0]]
        return sum(overlap(w, m) for m in recent) / len(recent) if recent else None

    def _counted_for(self, w: frozenset, cfg: STIEConfig) -> tuple[int | None, int | None, list[tuple[int, float]]]:
        """Eqs. (8)-(9), (12)-(13): for a next answer with words ``w`` (non-empty), the answer of the memory its
        round would count for (None: a new one), the round it is redundant with (None: valid) and the
        differences D(a_t, a_{t-k}) of (8). A redundant round counts for the answer it repeats; a valid one
        for the identical answer further back if there is one (the same words)."""
        diffs = self._recent_differences(w, cfg)
        deltas = {len(self.memory) - lag: delta for lag, delta in enumerate(cfg.deltas, start=1)}
        redundant_with = next((j for j, d in diffs if d < deltas[j]), None)  # eq. (9)
        if redundant_with is not None:
            return self.answer_of[redundant_with], redundant_with, diffs
        return next((i for i, a in enumerate(self.answers) if a.words == w), None), None, diffs

    def is_blocked(self, answer: str, cfg: STIEConfig) -> bool:
        """Whether eq. (13) blocks ``answer`` as the next round's: it has the words of a blocked answer, or its
        round would count for one (redundant with one of its rounds). Verdicts are kept until the next round."""
        w = words(answer)
        if not w:
            return False
        if w not in self.blocked_words:
            blocked = self.blocked(cfg.repeat_k)
            self.blocked_words[w] = (any(self.answers[i].words == w for i in blocked)
                                     or self._counted_for(w, cfg)[0] in blocked)
        return self.blocked_words[w]

    def _rank(self, candidates: list[int]) -> int:
        """The final pick's order: highest confidence, then lowest redundancy n(a), then the earlier."""
        return max(candidates, key=lambda i: (self.answers[i].best_conf, -len(self.answers[i].rounds), -i))

    def step(self, r: RoundInput, cfg: STIEConfig) -> STIEDecision:
        t = len(self.memory)
        w = words(r.answer)
        idx, redundant_with, diffs = self._counted_for(w, cfg) if w else (None, None, [])
        min_difference = min((d for _, d in diffs), default=None)  # eq. (8)
        mean_overlap = self._mean_recent_overlap(w) if w else None
        self.blocked_words.clear()

        # Eqs. (12)-(13): the round counts for the answer _counted_for names, otherwise it opens a new answer.
        if w:
            if idx is None:
                idx = len(self.answers)
                self.answers.append(_Answer(w, []))
            a = self.answers[idx]
            a.rounds.append(t)
            if r.answer not in a.surfaces:
                a.surfaces.append(r.answer)
            if r.confidence > a.best_conf:  # ties keep the earlier surface form
                a.best_conf, a.best_surface = r.confidence, r.answer
        self.memory.append((w, r.answer, r.confidence))
        self.answer_of.append(idx)

        shielded = self.shielded(cfg)
        valid = idx is not None and redundant_with is None and idx not in shielded  # eq. (9), and not in S
        candidates = [i for i in range(len(self.answers)) if i not in shielded]  # C_t, eq. (10)
        all_blocked = idx is not None and not candidates
        if valid:  # eq. (11): a new answer is accepted (in its most confident surface form)
            self.accepted_idx = idx
        elif idx is not None:  # eqs. (10)-(11): a redundant or shielded answer is replaced by a stronger rival
            pool = candidates or list(range(len(self.answers)))  # all shielded: the most confident is kept
            best = max(pool, key=lambda i: (self.answers[i].best_conf, -i))  # ties: the earlier
            if idx in candidates and self.answers[best].best_conf <= self.answers[idx].best_conf + cfg.margin:
                best = idx  # eq. (10) fails: no rival beats a_t's own answer by more than the margin
            self.accepted_idx = best
        # a round without an answer leaves the accepted answer as it was
        if cfg.final_pick == "confidence" and self.answers:  # the ranking step over C_t
            self.accepted_idx = self._rank(candidates or list(range(len(self.answers))))
        replaced = idx is not None and (self.accepted_idx != idx
                                        or (not valid and self.answers[idx].best_surface != r.answer))

        # Termination (prose of §2.2).
        new_docs = set(r.doc_ids) - self.seen_docs
        self.seen_docs |= set(r.doc_ids)
        new_share = len(new_docs) / len(set(r.doc_ids)) if r.doc_ids else 0.0
        reason = None
        if valid and mean_overlap is not None and mean_overlap < cfg.overlap_stop:
            reason = "new_answer"
        elif idx is not None and r.confidence >= cfg.confidence_ceiling and idx not in shielded:
            reason = "confident"
        elif t >= 1 and new_share < cfg.min_new_info:
            reason = "no_new_info"
        elif t + 1 >= cfg.max_rounds:
            reason = "max_rounds"
        return STIEDecision(t, self.accepted, redundant_with, self.surfaces(shielded), reason is not None, reason,
                            all_blocked, replaced, mean_overlap, min_difference,
                            self.surfaces(self.blocked(cfg.repeat_k)))


@dataclass
class STIEController:
    """Online controller: feed rounds one at a time (``observe``), per sample."""

    config: STIEConfig = field(default_factory=STIEConfig)

    def __post_init__(self):
        self._state: dict[int, _State] = {}

    def reset(self) -> None:
        self._state.clear()

    def step(self, sample: int, round_: RoundInput) -> STIEDecision:
        state = self._state.setdefault(sample, _State())
        return state.step(round_, self.config)

    def observe(self, sample: int, round_) -> tuple[bool, str | None]:
        """The rollout engine's hook: (stop, feedback for the next round)."""
        decision = self.step(sample, RoundInput(round_.answer, round_.confidence, round_.doc_ids))
        return decision.stop, None if decision.stop else feedback_text(decision, self._state[sample])

    def final_answer(self, sample: int) -> str | None:
        state = self._state.get(sample)
        return state.accepted if state else None

    def blocked_answers(self, sample: int) -> list[str]:
        """Eq. (13): the surface forms whose future generation is blocked for ``sample`` (n(a) ≥ K), sorted.
        Empty for a sample not seen yet."""
        state = self._state.get(sample)
        return state.surfaces(state.blocked(self.config.repeat_k)) if state else []

    def answer_block(self, sample: int) -> AnswerBlock | None:
        """The rollout engine's hook for eq. (13)'s generation block: the blocked surface forms (whose token
        paths the session bans) and a predicate true for any answer ``sample`` may not give in its next round
        (:meth:`_State.is_blocked`); None when nothing is blocked or ``block_generation`` is off. The predicate
        reads the sample's live state: ask again after each round."""
        state = self._state.get(sample)
        if not self.config.block_generation or state is None or not state.blocked(self.config.repeat_k):
            return None
        return AnswerBlock(tuple(self.blocked_answers(sample)), functools.partial(state.is_blocked, cfg=self.config))


def feedback_text(decision: STIEDecision, state: _State) -> str:
    """The controller's note to the model before its next round (appended as environment tokens); it names
    the answers eq. (13) blocks."""
    parts = [f"Answer memory: {', '.join(a for _, a, _ in state.memory if a) or 'no answer yet'}."]
    if decision.blocked:
        parts.append(f"Blocked (repeated too often): {', '.join(decision.blocked)}. Do not give these again.")
    parts.append("Verify with a new search that differs from earlier ones, then answer again.")
    return " ".join(parts)


def replay(rounds: Sequence[RoundInput], config: STIEConfig) -> tuple[str | None, int, list[STIEDecision]]:
    """Re-runs STIE on cached rounds: (final answer, rounds used, decisions). No generation."""
    state, decisions = _State(), []
    for r in rounds[: config.max_rounds]:
        decision = state.step(r, config)
        decisions.append(decision)
        if decision.stop:
            break
    return (decisions[-1].accepted if decisions else None), len(decisions), decisions
