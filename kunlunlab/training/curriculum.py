"""A difficulty-aware retrieval curriculum during RL (UR2's, Li et al. 2025): which training questions are offered
retrieval, decided by how well the policy answers them without it. The curriculum itself is data on the protocol
(:class:`~kunlunlab.agent.protocols.base.RetrievalCurriculum`; UR2's: ``kunlunlab.agent.protocols.ur2``); this
module runs it inside :class:`~kunlunlab.training.dapo.SearchRollout`:

* the difficulty estimate: before a question is rolled out for the first time (scope ``"drawn"``; ``"pool"``: every
  training question at the first rollout call), the policy answers it ``samples`` times under the closed prompt,
  through the backend the rollouts use, with the rollouts' sampling and no search allowed (a search ends the answer,
  unanswered); the share of exact-match answers gives its level, once for the whole run (kept in memory: a resumed
  RL stage judges its questions again, by the policy it resumes with);
* the retrieval switch: each question draws one uniform number (seeded by the run seed and the question, as UR2 draws
  once per question when it builds its data set) and is offered retrieval in a stage whose probability for its level
  is above it; offered, it gets the protocol's prompt, else the curriculum's closed prompt. The rewards read the
  decision (``retrieval_offered``, the protocol's rewards' ``offered``);
* the schedule: stage 1 until ``rewards.stage1_share`` of the RL steps, stage 2 after, the same rule the staged reward
  switches by (:func:`kunlunlab.training.rewards.peer_rewards`), so every step's prompts and reward belong to one
  stage.

Every rollout call's record (``dapo_rollouts.jsonl``) carries ``curriculum_stage`` (1 or 2), ``retrieval_offered``
(the share of the call's trajectories offered retrieval) and ``difficulty_generated`` (the closed-book answers the
estimate generated in that call); :func:`offer_shares` reads the share per stage back.

The estimate's answers are recorded, not charged to the rollout budget (``dapo.max_rollouts``): the budget counts the
trajectories RL scores and learns from, which are the same for every arm of a comparison; the estimate is UR2's data
preparation (its levels are fixed before RL, offline), its answers are never trained on, and each is one closed-book
turn, not a multi-turn rollout. Charging them would cost UR2 whole rollout calls (Table 2's budget, 4 calls of 2
questions x 4 samples, is spent exactly by judging its 8 questions 4 times each), so the arm would not be UR2's
recipe. The comparison's ledger (:func:`kunlunlab.training.comparison.budget_ledger`) lists them per rollout call
beside the rollouts, so a table can state them as a cost.
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Iterable, Sequence

from kunlunlab.agent.backends import SamplingConfig, chat_prompt_ids
from kunlunlab.agent.protocols.base import AgentProtocol, RetrievalCurriculum
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.data.answers import exact_match

log = logging.getLogger(__name__)

_POOL_CHUNK = 32  # questions judged per batched call when the scope is the whole pool


class Curriculum:
    """The curriculum of one RL stage: the questions' levels and draws, the current stage, the estimate's cost."""

    def __init__(self, spec: RetrievalCurriculum, protocol: AgentProtocol, tokenizer, answers: dict[str, list[str]],
                 rollout: RolloutConfig, temperature: float = 1.0, top_p: float = 1.0, stage1_share: float = 0.5):
        self.spec, self.protocol, self.tokenizer, self.answers = spec, protocol, tokenizer, answers
        self.rollout, self.temperature, self.top_p, self.stage1_share = rollout, temperature, top_p, stage1_share
        self.shares: dict[str, float] = {}  # question -> share of its closed-book answers that were right
        self.levels: dict[str, str] = {}
        self.stage = 0
        self.seed = 0
        self.generated = 0  # closed-book answers generated so far (every call)
        self._generated_call = 0

    @classmethod
    def for_protocol(cls, protocol: AgentProtocol, tokenizer, answers: dict[str, list[str]], rollout: RolloutConfig,
                     dapo, rewards) -> "Curriculum | None":
        """The protocol's curriculum with the RL stage's sampling and stage switch; None for a protocol without."""
        if protocol.curriculum is None:
            return None
        return cls(protocol.curriculum, protocol, tokenizer, answers, rollout, dapo.temperature, dapo.top_p,
                   rewards.stage1_share)

    # ------------------------------------------------------------------ the schedule
    def stage_of(self, step: int, max_steps: int) -> int:
        """0 before ``stage1_share`` of the steps, 1 from there (a one-stage curriculum: always 0)."""
        second = max_steps > 0 and step >= self.stage1_share * max_steps
        return 1 if second and len(self.spec.stages) > 1 else 0

    def at_step(self, trainer) -> None:
        """A rollout call begins: its stage from TRL's state, the draws' seed from the run's."""
        state = trainer.state
        self.stage = self.stage_of(state.global_step, state.max_steps)
        self.seed = getattr(trainer.args, "seed", 0)
        self._generated_call = 0

    # ------------------------------------------------------------------ the retrieval switch
    def draw(self, question: str) -> float:
        return random.Random(f"curriculum:{self.seed}:{question}").random()

    def offered(self, question: str) -> bool:
        """Whether ``question`` is offered retrieval in the current stage (a question not judged yet: offered, as
        no level says otherwise; :meth:`prepare` judges every question before its rollout)."""
        level = self.levels.get(question)
        return level is None or self.draw(question) < self.spec.offer(self.stage, level)

    def closed_messages(self, question: str, background: str | None) -> list[dict]:
        return self.spec.closed_messages(question, background)

    # ------------------------------------------------------------------ the difficulty estimate
    def prepare(self, backend, search, questions: Sequence[str]) -> None:
        """Judges the questions not judged yet (scope ``"pool"``: every training question), through ``backend``."""
        scope = self.answers if self.spec.scope == "pool" else questions
        todo = [q for q in dict.fromkeys(scope) if q not in self.levels]
        size = _POOL_CHUNK if self.spec.scope == "pool" else max(1, len(todo))
        for start in range(0, len(todo), size):
            self.estimate(backend, search, todo[start:start + size])

    def estimate(self, backend, search, questions: Sequence[str]) -> dict[str, str]:
        """Each question answered ``samples`` times under the closed prompt, no search allowed (the rollout's limits
        otherwise, its sampling, a seed of the run's); its share of exact-match answers and its level recorded."""
        if not questions:
            return {}
        n = self.spec.samples
        batch = [q for q in questions for _ in range(n)]
        cfg = replace(self.rollout, max_searches=0,
                      sampling=SamplingConfig(temperature=self.temperature, top_p=self.top_p,
                                              seed=self.seed + 7919 * (len(self.levels) + 1)))
        prefix = self.protocol.assistant_prefix
        prompts = [chat_prompt_ids(self.tokenizer, self.closed_messages(q, None), prefix) for q in batch]
        trajs = RolloutEngine(backend, search, cfg, self.protocol).run(prompts, batch, None, [prefix] * len(batch))
        right: dict[str, int] = dict.fromkeys(questions, 0)
        for q, t in zip(batch, trajs):
            answer = t.answer or self.protocol.final_answer(t.text)
            right[q] += bool(self.answers.get(q)) and exact_match(answer, self.answers[q]) > 0
        self.generated += len(batch)
        self._generated_call += len(batch)
        for q in questions:
            self.shares[q] = right[q] / n
            self.levels[q] = self.spec.level(self.shares[q])
        log.info("curriculum: %d questions judged (%d closed-book answers): %s", len(questions), len(batch),
                 {lv: sum(self.levels[q] == lv for q in questions) for lv, _ in self.spec.levels})
        return {q: self.levels[q] for q in questions}

    # ------------------------------------------------------------------ what a rollout call records and returns
    def fields(self, questions: Sequence[str]) -> dict:
        """The rollout's column the rewards read: whether each trajectory's question was offered retrieval."""
        return {"retrieval_offered": [self.offered(q) for q in questions]}

    def call_stats(self, questions: Sequence[str]) -> dict:
        """The call's record: its stage (1-based), the share of its trajectories offered retrieval and the
        closed-book answers the estimate generated during it."""
        offered = [self.offered(q) for q in questions]
        return {"curriculum_stage": self.stage + 1, "retrieval_offered": sum(offered) / max(1, len(offered)),
                "difficulty_generated": self._generated_call}


def offer_shares(rows: Iterable[dict]) -> dict[int, float]:
    """Per curriculum stage, the share of the RL trajectories offered retrieval, from the records of a run's
    ``dapo_rollouts.jsonl`` (each call weighted by its rollouts; a step rolled out again after a resume: its last
    record)."""
    last = {row["step"]: row for row in rows if "curriculum_stage" in row}
    totals: dict[int, list[float]] = {}
    for row in last.values():
        t = totals.setdefault(int(round(row["curriculum_stage"])), [0.0, 0.0])
        t[0] += row["retrieval_offered"] * row["rollouts"]
        t[1] += row["rollouts"]
    return {stage: offered / n for stage, (offered, n) in sorted(totals.items()) if n}


__all__ = ["Curriculum", "offer_shares"]
