"""STIE: Search-Think Iterative Enhancement, a controller over the agent's answer rounds (paper §3.1.2).

The paper gives the mechanism as memory → filter → confidence; its equations are reconstructed here
from the paper's description (numbers refer to the paper's eqs. 5–13):

* (5) answer memory  M_t = [(a_1, c_1), …, (a_{t-1}, c_{t-1})], c = exp(mean token log-prob).
* (6) overlap        O(a_t, a_j) = |W(a_t) ∩ W(a_j)| / |W(a_t) ∪ W(a_j)|, W = bag of normalised, stemmed words.
* (7) difference     D(a_t, a_j) = |W(a_t) \\ W(a_j)| / |W(a_t)|  (share of words a_t adds).
* (8) validity       a_t is *new* iff D(a_t, a_{t-k}) ≥ δ_k for every lag k = 1..3 that exists. The
  thresholds are asymmetric: repeating the last round is judged most strictly (δ1 ≥ δ2 ≥ δ3).
  An answer that is not new is *redundant* with the earlier answer it failed against.
* (9) repeat count   n(a) counts the rounds whose answer was a or redundant with it.
* (10) shielded set  S = {a : n(a) ≥ K}: an answer repeated K times is blocked (a reasoning loop).
* (11) candidate set C = distinct answers not in S, each with its best confidence (and the surface
  form that had it).
* (12) replacement    the accepted answer â is replaced by a_t when c_t > c(â) + margin, or when â is
  shielded; ties keep the incumbent. If every candidate is shielded, the most confident is kept
  (flag ``all_blocked``).
* (13) termination    stop after round t when (i) t ≥ 2 and a_t overlaps every earlier answer by less
  than ``overlap_stop`` (a genuinely new answer broke the loop), (ii) c_t ≥ ``confidence_ceiling``
  and a_t is not shielded, or (iii) the round retrieved a share of new documents below
  ``min_new_info`` (searching no longer brings information); and always at ``max_rounds``.

The controller is a pure function of the rounds, so :func:`replay` re-scores cached rounds with
other thresholds without regenerating (notebook 05).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from kunlunlab.eval.metrics import normalize_answer


@dataclass
class STIEConfig:
    delta1: float = 0.6   # minimum difference against the previous round
    delta2: float = 0.5   # … against two rounds back
    delta3: float = 0.4   # … against three rounds back
    repeat_k: int = 3     # K: rounds of one answer before it is shielded
    margin: float = 0.05  # confidence margin for replacement
    overlap_stop: float = 0.2
    confidence_ceiling: float = 0.9
    min_new_info: float = 0.1
    max_rounds: int = 3

    def __post_init__(self):
        if self.repeat_k < 1 or self.max_rounds < 1:
            raise ValueError("repeat_k and max_rounds must be at least 1")

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
    redundant_with: int | None  # index of the earlier round it repeats, if any
    shielded: list[str]
    stop: bool
    reason: str | None  # "new_answer", "confident", "no_new_info", "max_rounds"
    all_blocked: bool = False


STEM_CHARS = 5


def words(answer: str | None) -> frozenset[str]:
    """W(a): normalised words truncated to 5 characters (truncation stemming), so that surface
    variants such as "Russia" / "Russian" count as the same word."""
    return frozenset(w[:STEM_CHARS] for w in normalize_answer(answer).split()) if answer else frozenset()


def overlap(a: frozenset, b: frozenset) -> float:
    """Eq. (6): Jaccard overlap of two bags of words (two empty answers overlap fully)."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def difference(a: frozenset, b: frozenset) -> float:
    """Eq. (7): the share of a's words that b lacks (an empty answer adds nothing)."""
    return len(a - b) / len(a) if a else 0.0


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


class _State:
    def __init__(self):
        self.memory: list[tuple[frozenset, str | None, float]] = []  # eq. (5)
        self.cluster_of: list[int] = []  # round -> representative round of its answer cluster
        self.count: dict[int, int] = {}  # representative -> repeat count, eq. (9)
        self.best_conf: dict[int, float] = {}
        self.best_round: dict[int, int] = {}  # representative -> its most confident surface form
        self.seen_docs: set[str] = set()
        self.accepted_rep: int | None = None

    @property
    def accepted(self) -> str | None:
        return self.memory[self.best_round[self.accepted_rep]][1] if self.accepted_rep is not None else None

    def shielded(self, k: int) -> set[int]:
        return {rep for rep, n in self.count.items() if n >= k}  # eq. (10)

    def step(self, r: RoundInput, cfg: STIEConfig) -> STIEDecision:
        t = len(self.memory)
        w = words(r.answer)
        redundant_with = None
        for lag, delta in enumerate(cfg.deltas, start=1):  # eq. (8): last 1-3 rounds, asymmetric thresholds
            j = t - lag
            if j < 0 or not w:  # a round without an answer repeats nothing
                break
            if not self.memory[j][0]:
                continue
            if difference(w, self.memory[j][0]) < delta:
                redundant_with = j
                break
        rep = self.cluster_of[redundant_with] if redundant_with is not None else t
        self.memory.append((w, r.answer, r.confidence))
        self.cluster_of.append(rep)
        self.count[rep] = self.count.get(rep, 0) + 1
        if r.answer is not None and r.confidence > self.best_conf.get(rep, float("-inf")):
            self.best_conf[rep], self.best_round[rep] = r.confidence, t
        self.best_conf.setdefault(rep, float("-inf"))
        self.best_round.setdefault(rep, rep)

        # Eqs. (11)-(12): candidates outside the shielded set; replace on a clear confidence gain.
        shielded = self.shielded(cfg.repeat_k)
        answered = {c: self.best_conf[c] for c in self.count if self.best_conf[c] > float("-inf")}
        candidates = {c: v for c, v in answered.items() if c not in shielded}
        all_blocked = False
        if not candidates:
            pool = answered
            all_blocked = bool(pool)
            candidates = pool
        if candidates:
            best = max(candidates, key=lambda c: (candidates[c], -c))  # ties: the earlier answer
            incumbent = self.accepted_rep
            if incumbent is None or incumbent not in candidates:
                self.accepted_rep = best
            elif best != incumbent and candidates[best] > candidates[incumbent] + cfg.margin:
                self.accepted_rep = best

        # Eq. (13): three-way termination.
        new_docs = set(r.doc_ids) - self.seen_docs
        self.seen_docs |= set(r.doc_ids)
        reason = None
        if t >= 1 and r.answer is not None and all(overlap(w, m[0]) < cfg.overlap_stop for m in self.memory[:-1]):
            reason = "new_answer"
        elif r.answer is not None and r.confidence >= cfg.confidence_ceiling and rep not in shielded:
            reason = "confident"
        elif t >= 1 and (len(new_docs) / len(set(r.doc_ids)) if r.doc_ids else 0.0) < cfg.min_new_info:
            reason = "no_new_info"
        elif t + 1 >= cfg.max_rounds:
            reason = "max_rounds"
        return STIEDecision(t, self.accepted, redundant_with,
                            sorted({self.memory[c][1] or "" for c in shielded}), reason is not None, reason,
                            all_blocked)


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
