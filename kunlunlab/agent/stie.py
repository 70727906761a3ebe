"""STIE: Search-Think Iterative Enhancement, a controller over the agent's answer rounds.

Source: arXiv 2506.19466 (KunLunBaizeRAG), §2.2, equations 5–13: a three-tier "memory – filter –
confidence" framework. What we could read of the paper (its abstract, and a secondary summary of
§2.2 whose text kept the prose but dropped the typeset mathematics) fixes the structure: a memory of
earlier answers; a lexical overlap O and a difference D between a new answer and that history; a
validity test against the last three rounds with asymmetric thresholds δ1..δ3; replacement of an
answer that fails it by a more confident candidate that is not blocked; a blocklist of answers
generated K or more times; and termination when the overlap with earlier answers is low, when
confidence plateaus, or when the information changes little between rounds. **The exact formulas
below are our reconstruction of that prose**, numbered as the paper numbers them.

* (5) answer memory   M_t = [(a_1, c_1), …, (a_{t-1}, c_{t-1})], c = exp(mean token log-prob).
* (6) overlap         O(a, b) = |W(a) ∩ W(b)| / |W(a) ∪ W(b)|, W = set of normalised, stemmed words.
* (7) difference      D(a, b) = 1 − O(a, b).
* (8) validity        a_t is *valid* (new) iff D(a_t, a_{t-k}) ≥ δ_k for every lag k = 1..3 whose
  round gave an answer. The thresholds are asymmetric: repeating the last round is judged most
  strictly (δ1 ≥ δ2 ≥ δ3). An answer that fails is *redundant* with the round it failed against.
* (9) repeat count    n(a) counts the rounds whose answer was a (the same words) or redundant with it.
* (10) shielded set   S = {a : n(a) ≥ K}: an answer repeated K times is blocked (a reasoning loop).
* (11) candidate set  C = answers in the memory that are not in S, each with its best confidence
  (and the surface form that had it).
* (12) replacement    a valid, unshielded a_t is accepted as the current answer, even when it is less
  confident than earlier ones (it carries what the latest search found). A redundant (or shielded)
  a_t is replaced by argmax_{a ∈ C} c(a); its own answer, if still in C, is kept unless another
  candidate beats it by more than ``margin`` (0 by default, i.e. the paper's "higher confidence").
  If every candidate is shielded, the most confident answer is kept and ``all_blocked`` is set.
* (13) termination    stop after round t when (i) a_t is valid and its *mean* overlap with the last
  up-to-3 answered rounds (the δ1..δ3 lags) is below ``overlap_stop``: a genuinely new answer broke
  the loop; (ii) c_t ≥ ``confidence_ceiling`` and a_t is not shielded; (iii) the round retrieved a
  share of new documents below ``min_new_info`` (searching no longer brings information); and
  always at ``max_rounds``.

Choices of ours, not the paper's: W truncates words to 5 characters (so "Russia"/"Russian" match);
the mean in (13i) runs over the same three lags as (8); criterion (i) requires a_t to be valid (a
low mean can hide a high overlap with the last round); "confidence plateaus" is read as a ceiling
(13ii); "information changes little" as the share of newly retrieved documents (13iii); ``margin``
exists as a knob (0 reproduces the paper's rule).

The controller is a pure function of the rounds, so :func:`replay` re-scores cached rounds with
other thresholds without regenerating (notebook 05).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from kunlunlab.data.answers import normalize_answer

Difference = Literal["complement", "added_share"]
LAGS = 3  # eq. (8): δ1..δ3; eq. (13i) averages over the same lags


@dataclass
class STIEConfig:
    delta1: float = 0.6   # minimum difference against the previous round, eq. (8)
    delta2: float = 0.5   # … against two rounds back
    delta3: float = 0.4   # … against three rounds back
    repeat_k: int = 3     # K: rounds of one answer before it is shielded, eq. (10)
    margin: float = 0.0   # confidence a rival needs over a redundant answer's own, eq. (12)
    overlap_stop: float = 0.2  # eq. (13i): mean overlap with recent rounds below this ends the loop
    confidence_ceiling: float = 0.9  # eq. (13ii)
    min_new_info: float = 0.1  # eq. (13iii): share of new documents in the round
    # K + 2: after the K-th repeat is shielded, the model gets the blocked-answer feedback for two more
    # rounds (one may still echo the loop, as in the paper's Russia/France example of five rounds).
    # With max_rounds <= K blocking could never change an answer.
    max_rounds: int = 5
    difference: Difference = "complement"  # eq. (7); "added_share" is the earlier variant, see difference()

    def __post_init__(self):
        if self.repeat_k < 1 or self.max_rounds < 1:
            raise ValueError("repeat_k and max_rounds must be at least 1")
        if self.difference not in ("complement", "added_share"):
            raise ValueError(f"unknown difference measure {self.difference!r}")

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
    redundant_with: int | None  # index of the earlier round it repeats, if any (eq. 8)
    shielded: list[str]         # surface forms of every shielded answer (eq. 10)
    stop: bool
    reason: str | None  # "new_answer", "confident", "no_new_info", "max_rounds"
    all_blocked: bool = False
    replaced: bool = False      # eq. (12) put another candidate in place of a_t
    mean_overlap: float | None = None  # eq. (13i), over the answered rounds among the last 3


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
    count: int = 0                         # n(a), eq. (9)
    best_conf: float = float("-inf")
    best_surface: str = ""


class _State:
    def __init__(self):
        self.memory: list[tuple[frozenset, str | None, float]] = []  # eq. (5)
        self.answer_of: list[int | None] = []  # round -> index into answers (None: no answer)
        self.answers: list[_Answer] = []  # in order of first appearance (ties go to the earlier)
        self.seen_docs: set[str] = set()
        self.accepted_idx: int | None = None

    @property
    def accepted(self) -> str | None:
        return self.answers[self.accepted_idx].best_surface if self.accepted_idx is not None else None

    def shielded(self, k: int) -> set[int]:
        return {i for i, a in enumerate(self.answers) if a.count >= k}  # eq. (10)

    def _redundant_with(self, w: frozenset, cfg: STIEConfig) -> int | None:
        """Eq. (8): the first lag k = 1..3 whose answer a_t does not differ from by δ_k."""
        t = len(self.memory)
        for lag, delta in enumerate(cfg.deltas, start=1):
            j = t - lag
            if j < 0:
                break
            if not self.memory[j][0]:  # that round gave no answer: nothing to repeat
                continue
            if difference(w, self.memory[j][0], cfg.difference) < delta:
                return j
        return None

    def _mean_recent_overlap(self, w: frozenset) -> float | None:
        """Eq. (13i): mean O(a_t, a_{t-k}) over the answered rounds among the last three."""
        recent = [m[0] for m in self.memory[-LAGS:] if m[0]]
        return sum(overlap(w, m) for m in recent) / len(recent) if recent else None

    def step(self, r: RoundInput, cfg: STIEConfig) -> STIEDecision:
        t = len(self.memory)
        w = words(r.answer)
        redundant_with = self._redundant_with(w, cfg) if w else None
        mean_overlap = self._mean_recent_overlap(w) if w else None

        # Eq. (9): a redundant round counts for the answer it repeats; a valid one for the identical
        # answer further back if there is one (the same words), otherwise it opens a new answer.
        idx = None
        if w:
            if redundant_with is not None:
                idx = self.answer_of[redundant_with]
            else:
                idx = next((i for i, a in enumerate(self.answers) if a.words == w), None)
            if idx is None:
                idx = len(self.answers)
                self.answers.append(_Answer(w, []))
            a = self.answers[idx]
            a.count += 1
            if r.answer not in a.surfaces:
                a.surfaces.append(r.answer)
            if r.confidence > a.best_conf:  # ties keep the earlier surface form
                a.best_conf, a.best_surface = r.confidence, r.answer
        self.memory.append((w, r.answer, r.confidence))
        self.answer_of.append(idx)

        shielded = self.shielded(cfg.repeat_k)
        valid = idx is not None and redundant_with is None and idx not in shielded  # eq. (8), and not in S
        all_blocked = replaced = False
        if valid:  # eq. (12): a new answer is accepted (in its most confident surface form)
            self.accepted_idx = idx
        elif idx is not None:  # eqs. (11)-(12): a redundant or shielded answer is replaced
            candidates = [i for i in range(len(self.answers)) if i not in shielded]  # eq. (11)
            if not candidates:  # everything is blocked: keep the most confident answer
                candidates, all_blocked = list(range(len(self.answers))), True
            best = max(candidates, key=lambda i: (self.answers[i].best_conf, -i))  # ties: the earlier
            if idx in candidates and self.answers[best].best_conf <= self.answers[idx].best_conf + cfg.margin:
                best = idx
            self.accepted_idx = best
            replaced = best != idx or self.answers[idx].best_surface != r.answer
        # a round without an answer leaves the accepted answer as it was

        # Eq. (13): termination.
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
        blocked = sorted(s for i in shielded for s in self.answers[i].surfaces)
        return STIEDecision(t, self.accepted, redundant_with, blocked, reason is not None, reason,
                            all_blocked, replaced, mean_overlap)


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


def feedback_text(decision: STIEDecision, state: _State) -> str:
    """The controller's note to the model before its next round (appended as environment tokens)."""
    parts = [f"Answer memory: {', '.join(a for _, a, _ in state.memory if a) or 'no answer yet'}."]
    if decision.shielded:
        parts.append(f"Blocked (repeated too often): {', '.join(decision.shielded)}. Do not give these again.")
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
