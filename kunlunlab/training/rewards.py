"""Dual-mode rewards (paper §2.3, eqs. 17-18) and DAPO's overlong shaping, as TRL reward functions.

    R_short = w_f·r_format + w_l·r_length + w_a·r_accuracy                            (eq. 17)
    R_long  = w_f·r_format + w_l·r_length + w_a·r_accuracy + w_s·(r_structure - 1)    (eq. 18)

Every component lies in [0, 1]. The mode is the one the model chose (``<short_answer>`` or
``<long_answer>``); the structure term is undefined (``None``) for short answers, which TRL's
weighted ``nansum`` turns into eq. 17. Structure enters eq. 18 as a penalty (r_structure - 1), so a
well-structured long answer reaches exactly R_short's maximum: choosing the long mode can never
earn reward by itself (with a bonus, a box-only "long answer" out-scored a correct short one). Each component is its own TRL reward function, so
``GRPOConfig.reward_weights`` are the w's and TRL logs every component separately. On a summary-oriented
question (``QAExample.facts``) accuracy also scores the summary's coverage of the gold facts
(:func:`accuracy_score`), so the long mode is what earns its reward there.

A reward reads the trajectory's *parse record* (:func:`parse_completion`): the rollout engine passes
it through ``rollout_func``'s extra fields; plain completion text is parsed on the spot. Protocol
violations score as the parser defines them (see :mod:`kunlunlab.agent.protocol`):

================================  ============================================================
record                            r_format
================================  ============================================================
answer tag + ``\\boxed``, no issue  1
answer with issues                 0.5 minus 0.1 per further distinct issue (floor 0.1): missing box,
                                   text after the answer, unclosed/nested tags, empty query
no answer at all                   0
================================  ============================================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from kunlunlab.agent.protocol import ANSWER_TAGS, final_answer_block, parse_turn
from kunlunlab.agent.protocols import NamesView, reward_kinds, reward_owner
from kunlunlab.configs import choice, non_negative, positive, probability
from kunlunlab.eval.metrics import EXTRA_SEARCHES, exact_match, extra_searches, f1, fact_coverage, recall_by_search
from kunlunlab.training.peer_rewards import peer_reward_functions

_RESULT_BLOCK = re.compile(r"<result>.*?(?:</result>|$)", re.S)


BUDGET_EXTRA = EXTRA_SEARCHES  # RewardConfig.budget_extra: which searches the budget term charges
# RewardConfig.kind: this project's dual-mode reward, then every registered protocol's own (AgentProtocol.rewards and
# staged_rewards), read when a kind is checked
REWARD_KINDS = NamesView(lambda: ("kunlun", *reward_kinds()))


@dataclass
class RewardConfig:
    w_format: float = non_negative(0.2)
    w_length: float = non_negative(0.1)
    w_accuracy: float = non_negative(1.0)
    w_structure: float = non_negative(0.2)
    accuracy: str = choice("em", ("em", "f1"))  # "em" or "f1" against the gold aliases
    short_target_words: int = positive(6)  # a short answer of up to this many words gets full length credit
    long_min_words: int = positive(15)  # a long answer's summary should fall inside [min, max] words
    long_max_words: int = positive(120)
    overlong_max_tokens: int = positive(512)  # DAPO soft overlong punishment: model tokens allowed ...
    overlong_buffer: int = non_negative(128)  # ... with a linear penalty over the last `buffer` of them
    # False: the "R_short only" training ablation — every answer is scored by eq. 17, whatever tag it uses
    # (the long mode's summary length and structure terms of eq. 18 are not applied)
    dual_mode: bool = True
    # FrugalRAG's search budget (arXiv 2507.07634), see budget_score: 0 leaves it out of the reward
    w_budget: float = non_negative(0.0)
    budget_penalty: float = non_negative(0.25)  # per extra search
    # which searches are extra: "past_stop" (FrugalRAG's: after the optimal stop) or "redundant" (every
    # search that retrieved no gold evidence the trajectory did not already have); see budget_score
    budget_extra: str = choice("past_stop", BUDGET_EXTRA)
    # True: quoted evidence the agent was never shown counts as missing evidence in the budget term (see
    # budget_score and kunlunlab.agent.grounding), so a search skipped by quoting an unseen sentence is not paid
    budget_grounded: bool = False
    # Which reward the RL stage optimises: "kunlun", the dual-mode reward above (eqs. 17-18), or a protocol's own
    # (its module in kunlunlab.agent.protocols; kunlunlab.training.peer_rewards): "search_r1" (exact match),
    # "research" (F1 with a format check), "r1_searcher" (its two stages: stage 1 for the first stage1_share of the
    # steps, then stage 2), or one stage alone
    kind: str = choice("kunlun", REWARD_KINDS)
    stage1_share: float = probability(0.5)  # a staged kind ("r1_searcher"): the share of the RL steps under its first
    overlong_shaping: bool = True    # DAPO's soft overlong punishment (overlong_max_tokens, overlong_buffer) on or off

    def __post_init__(self):
        if self.accuracy not in ("em", "f1"):
            raise ValueError(f"accuracy must be 'em' or 'f1', got {self.accuracy!r}")
        if self.overlong_buffer < 0 or self.overlong_buffer > self.overlong_max_tokens:
            raise ValueError("overlong_buffer must lie in [0, overlong_max_tokens]")
        if self.budget_extra not in BUDGET_EXTRA:
            raise ValueError(f"budget_extra must be one of {BUDGET_EXTRA}, got {self.budget_extra!r}")

    @property
    def weights(self) -> list[float]:
        """In the order of :func:`reward_functions` (the budget term only when ``w_budget`` is set)."""
        if self.kind != "kunlun":  # a peer's reward alone (weight 1), then the overlong shaping when on
            return [1.0, 1.0] if self.overlong_shaping else [1.0]
        base = [self.w_format, self.w_length, self.w_accuracy, self.w_structure, 1.0 if self.overlong_shaping else 0.0]
        return base + [self.w_budget] if self.w_budget else base


@dataclass
class ParseRecord:
    """What the rewards need to know about one trajectory."""

    answer: str | None
    mode: str | None                 # "short" | "long" | None
    answer_body: str = ""            # text inside the answer tag
    issues: list[str] = field(default_factory=list)
    n_searches: int = 0
    model_tokens: int | None = None
    think_blocks: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "ParseRecord":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def parse_completion(text: str, model_tokens: int | None = None) -> ParseRecord:
    """Parses a whole trajectory text: result blocks are the environment's and are dropped; every model
    turn (the text between environment blocks, split again after each ``</search>``) is read with
    :func:`parse_turn`. With STIE (§2.2) an answer round can be followed by the controller's feedback block
    and further rounds: the answer is the last round's (the caller may put the controller's accepted answer
    in its place), and issues of every round count."""
    pieces = [p.replace("<|im_end|>", "") for p in _RESULT_BLOCK.split(text)]
    turns = [seg for piece in pieces for seg in re.split(r"(?<=</search>)", piece)]
    turns = [seg for seg in turns if seg.strip()]
    model_text = "".join(turns)
    issues: list[str] = []
    searches, final = 0, None
    for k, segment in enumerate(turns):
        turn = parse_turn(segment)
        issues.extend(i for i in turn.issues if i != "no_action" or k == len(turns) - 1)
        if turn.kind == "search":
            searches += 1
        elif turn.kind == "answer":
            final = turn
    body = final_answer_block(model_text)[1] if final is not None and final.answer_mode else ""
    return ParseRecord(answer=final.answer if final else None, mode=final.answer_mode if final else None,
                       answer_body=body, issues=sorted(set(issues)), n_searches=searches,
                       model_tokens=model_tokens, think_blocks=len(re.findall(r"<think>", model_text)))


# ---------------------------------------------------------------------------- components, each in [0, 1]
def format_score(rec: ParseRecord) -> float:
    if rec.answer is None:
        return 0.0
    if not rec.issues:
        return 1.0
    return max(0.1, 0.5 - 0.1 * (len(set(rec.issues)) - 1))


def _band(value: float, low: float, high: float) -> float:
    """1 inside [low, high], falling linearly to 0 at half of low and at twice high."""
    if value < low:
        return max(0.0, (value - low / 2) / (low / 2)) if low > 0 else 1.0
    if value > high:
        return max(0.0, 1.0 - (value - high) / high)
    return 1.0


def length_score(rec: ParseRecord, cfg: RewardConfig) -> float:
    """Short mode: the boxed answer is concise; long mode: the summary has a sensible length."""
    if rec.answer is None:
        return 0.0
    if rec.mode == "long" and cfg.dual_mode:
        summary = re.sub(r"\\boxed\{.*\}", " ", rec.answer_body, flags=re.S)
        return _band(len(summary.split()), cfg.long_min_words, cfg.long_max_words)
    return _band(len(rec.answer.split()), 0, cfg.short_target_words)


def accuracy_score(rec: ParseRecord, golds: list[str], cfg: RewardConfig, facts: list[str] | None = None) -> float:
    """The boxed answer against the gold aliases (EM or F1). A summary-oriented question (``facts``, the gold
    facts its summary should state) scores half the box and half :func:`~kunlunlab.data.answers.fact_coverage`
    of the answer's body. A departure: the paper scores long answers with its LLM judge (§3.2) and does not say
    how accuracy enters eq. 18 for them; without a coverage term a bare ``\\boxed{link}`` earns a summary
    question's full accuracy, and the long mode could never pay for itself in DAPO."""
    if rec.answer is None or not golds:
        return 0.0
    box = float(exact_match(rec.answer, golds)) if cfg.accuracy == "em" else f1(rec.answer, golds)
    if not facts:
        return box
    return 0.5 * box + 0.5 * fact_coverage(rec.answer_body, facts)


def structure_score(rec: ParseRecord) -> float | None:
    """Long answers only: the summary holds text besides the box, the box closes the summary, the reasoning
    was written inside closed ``<think>`` blocks, and no tag is left unclosed or nested."""
    if rec.mode != "long":
        return None
    body = rec.answer_body.strip()
    box_at = body.rfind("\\boxed{")
    checks = [
        len(re.sub(r"\\boxed\{.*\}", "", body, flags=re.S).split()) >= 3,
        box_at != -1 and len(body[box_at:].split("}", 1)[-1].split()) <= 3,
        rec.think_blocks > 0 and not any(i.endswith(":think") for i in rec.issues),
        not any(i.startswith(("unclosed", "nested")) for i in rec.issues),
    ]
    return sum(checks) / len(checks)


def overlong_penalty(rec: ParseRecord, cfg: RewardConfig) -> float:
    """DAPO's soft overlong punishment on model tokens (0 down to -1)."""
    if rec.model_tokens is None:
        return 0.0
    start = cfg.overlong_max_tokens - cfg.overlong_buffer
    if rec.model_tokens <= start:
        return 0.0
    if rec.model_tokens > cfg.overlong_max_tokens or cfg.overlong_buffer == 0:
        return -1.0
    return (start - rec.model_tokens) / cfg.overlong_buffer


@dataclass
class RewardBreakdown:
    format: float
    length: float
    accuracy: float
    structure: float | None
    overlong: float
    total: float
    mode: str | None
    budget: float | None = None


def budget_score(search_doc_ids: list[list[str]], gold_ids: list[str], background_ids: list[str] | None = None,
                 penalty: float = 0.25, extra: str = "past_stop", ungrounded_share: float = 0.0) -> float | None:
    """FrugalRAG's search-budget reward (arXiv 2507.07634), as the workbench reads it: the *optimal stop* of a
    trajectory is the first search after which its recall of the gold supporting passages reaches its
    maximum (search 0 is the RDRA background, when there is one). Stopping there earns 1; each extra search
    costs ``penalty``; a trajectory that stopped without all the gold evidence (early, or never finding
    it) loses its missing recall and earns nothing positive:

        complete (max recall = 1):   1 − λ·e
        incomplete:                  −(1 − max recall) − λ·e          floored at −1

    ``extra="past_stop"`` (FrugalRAG's shape): e = n − k*, the searches after the optimal stop.
    ``extra="redundant"`` (a departure): e = the searches that raised the recall of no gold passage, before
    the optimal stop as well as after it. Why: with RDRA's background the agent re-searches what the
    background already shows: on make run's held-out world questions 1.00 search per question of 2.83 (35 %)
    returned only background passages (SFT checkpoint of 2026-11-25), and such a search sits *before* the
    optimal stop whenever a later search completes the evidence, so FrugalRAG's term never sees it.

    ``ungrounded_share`` (a departure, ``RewardConfig.budget_grounded``): the share of the trajectory's quoted
    evidence sentences it was never shown (:func:`kunlunlab.agent.grounding.quote_grounding`); it counts as
    missing evidence, ``missing = (1 − max recall) + ungrounded_share`` (capped at 1), so a trajectory that
    saved a search by stating a hop it never read earns no completion bonus. Why: the quoted reader under the
    budget reward (G192, 2026-11-26) quoted unseen sentences in 27 of 100 answers (13 without the budget),
    15 of them wrong, and lost 9 EM points; recall counts the passages retrieved, not what the reader says.
    Measured effect (same SFT checkpoint, seeds and 8 steps, w 0.5, ``budget_extra="redundant"``, flatness on
    accuracy and budget; n = 100 held-out world questions): unseen quotes back to 13 answers, EM 70.0 (+5
    [−2, +12] against the ungrounded budget, −4 [−10, +2] against DAPO without budget, 74.0) — but the saving
    went with them: the policy states a hop from the background on 36 questions (64 without budget) and makes
    2.43 searches per question (2.14 without budget, 1.83 ungrounded). With ``penalty`` 0.5: 74.0 EM at 2.56
    searches. So grounding stops the invention, and the budget then buys no frugality at this scale; off by
    default (README, "Teaching the reader to quote").

    None (left out of the reward) for questions without gold passage ids, e.g. open-corpus ones. The
    paper's exact formula is not reproduced here; this is the shape its text describes."""
    if extra not in BUDGET_EXTRA:
        raise ValueError(f"extra must be one of {BUDGET_EXTRA}, got {extra!r}")
    recall = recall_by_search(search_doc_ids, gold_ids, background_ids or ())
    if recall is None:
        return None
    if not 0.0 <= ungrounded_share <= 1.0:
        raise ValueError(f"ungrounded_share must lie in [0, 1], got {ungrounded_share}")
    missing = min(1.0, (1.0 - max(recall)) + ungrounded_share)
    value = (1.0 if missing <= 0.0 else -missing) - penalty * extra_searches(recall, extra)
    return max(-1.0, value)


def structure_term(structure: float | None) -> float | None:
    """The structure component as it enters eq. 18: a penalty ``r_structure - 1`` (None for short answers)."""
    return None if structure is None else structure - 1.0


def score(record: ParseRecord | str, golds: list[str], cfg: RewardConfig | None = None,
          budget: float | None = None, facts: list[str] | None = None) -> RewardBreakdown:
    """Every component and the total of eq. 17 (short) or eq. 18 (long); plus ``w_budget`` times the
    search-budget term when one is given (:func:`budget_score`). ``facts``: a summary question's gold facts
    (:func:`accuracy_score`)."""
    cfg = cfg or RewardConfig()
    rec = parse_completion(record) if isinstance(record, str) else record
    parts = (format_score(rec), length_score(rec, cfg), accuracy_score(rec, golds, cfg, facts),
             structure_score(rec) if cfg.dual_mode else None, overlong_penalty(rec, cfg))
    terms = parts[:3] + (structure_term(parts[3]), parts[4])
    total = sum(w * p for w, p in zip(cfg.weights, terms) if p is not None)
    if cfg.w_budget and budget is not None:
        total += cfg.w_budget * budget
    return RewardBreakdown(*parts, total=total, mode=rec.mode, budget=budget)


# ---------------------------------------------------------------------------- TRL adapters
def _records(completions, parse=None, **_) -> list[ParseRecord]:
    if parse is not None:
        return [p if isinstance(p, ParseRecord) else ParseRecord.from_dict(p) for p in parse]
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [parse_completion(t) for t in texts]


def reward_functions(cfg: RewardConfig | None = None) -> list:
    """TRL reward functions (``f(prompts, completions, **columns) -> list[float | None]``), in the order of
    ``cfg.weights``. They read the dataset's ``answers`` column and the rollout's ``parse`` records."""
    cfg = cfg or RewardConfig()

    def format_reward(prompts, completions, **kw):
        return [format_score(r) for r in _records(completions, **kw)]

    def length_reward(prompts, completions, **kw):
        return [length_score(r, cfg) for r in _records(completions, **kw)]

    def accuracy_reward(prompts, completions, answers, facts=None, **kw):  # facts: summary questions' gold facts
        facts = facts if facts is not None else [None] * len(answers)
        return [accuracy_score(r, g, cfg, f) for r, g, f in zip(_records(completions, **kw), answers, facts)]

    def structure_reward(prompts, completions, **kw):  # eq. 18's penalty term; None (left out) for short answers
        records = _records(completions, **kw)
        if not cfg.dual_mode:  # R_short only: eq. 17 for every answer
            return [None] * len(records)
        return [structure_term(structure_score(r)) for r in records]

    def overlong_reward(prompts, completions, **kw):
        return [overlong_penalty(r, cfg) for r in _records(completions, **kw)]

    def budget_reward(prompts, completions, budget=None, **kw):  # the rollout's budget_score per trajectory
        return list(budget) if budget is not None else [None] * len(completions)

    if cfg.kind != "kunlun":  # a peer's own reward (the overlong shaping after it, when on)
        return peer_rewards(cfg) + ([overlong_reward] if cfg.overlong_shaping else [])
    functions = [format_reward, length_reward, accuracy_reward, structure_reward, overlong_reward]
    return functions + [budget_reward] if cfg.w_budget else functions


def peer_rewards(cfg: RewardConfig) -> list:
    """The protocol reward of ``cfg.kind`` as one TRL reward function. A staged kind (``AgentProtocol.staged_rewards``;
    ``r1_searcher``: R1-Searcher's two stages in one RL stage) runs its first reward (stage 1: retrieval invocation
    and format) for the first ``stage1_share`` of the steps and its second (stage 2: answer F1 and format) after,
    read off TRL's ``trainer_state`` (R1-Searcher runs them as two trainings; one stage here keeps the step budget
    the other recipes get)."""
    stages = reward_owner(cfg.kind).staged_rewards.get(cfg.kind)
    if stages is None:
        return peer_reward_functions(cfg.kind)
    (stage1,), (stage2,) = (peer_reward_functions(stage) for stage in stages)

    def staged_reward(prompts, completions, trainer_state=None, **kw):
        in_stage2 = trainer_state is not None and trainer_state.max_steps > 0 and \
            trainer_state.global_step >= cfg.stage1_share * trainer_state.max_steps
        return (stage2 if in_stage2 else stage1)(prompts, completions, **kw)

    staged_reward.__name__ = f"{cfg.kind}_reward"
    return [staged_reward]


def format_compliant(record: ParseRecord) -> bool:
    """The protocol was followed end to end: an answer tag with a box and no issue on the way."""
    return record.answer is not None and record.mode is not None and not record.issues


__all__ = ["ANSWER_TAGS", "BUDGET_EXTRA", "ParseRecord", "RewardBreakdown", "RewardConfig", "accuracy_score",
           "budget_score", "format_compliant", "format_score", "length_score", "overlong_penalty", "parse_completion",
           "reward_functions", "score", "structure_score", "structure_term"]
