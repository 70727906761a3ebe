"""Progressive noisy / high-quality data mixing (paper §2.3, eqs. 14-16).

Trajectories are written in the search-think protocol, turn by turn, with the *real* retriever's
results in every ``<result>`` block (formatted by the same function the rollout engine uses), so
supervised fine-tuning sees exactly what inference will append.

* **High quality**: the synthetic world's gold chains (think → search the sub-question → result →
  state the hop's answer → … → ``\\boxed{}``; parallel hops go into one multi-query search) and
  HotpotQA questions walked along their supporting-fact titles. The gold passage is always among
  the results (it replaces the last hit when the retriever missed it).
* **Evidence quoting** (``quote_evidence``, off by default): each think turn states a hop's answer
  after quoting the result sentence that holds it (``Q? "She was married to Ivo Drirthia." So: Ivo
  Drirthia.``). Meant to teach "find the sentence about the asked relation, copy from it"; with the
  embedded 135M model it measured worse at make-run size (held-out EM 7.5 vs 10.0, format 62.5 % vs
  87.5 %). With ``background_facts`` at G192 (2026-11-26, n = 100; README, "Teaching the reader to quote")
  it mends reading from the background (inference questions read from it: 14/19 right, 8/19 unquoted) and
  gives world EM 74.0 at 2.14 searches per question against 75.0 at 2.75 unquoted (−1.0 [−10, +8]); quoted
  turns run longer, so give them a turn budget of 192 tokens. Re-measured at make run's size with
  ``background_facts`` 0.5 (notebook 07, n = 40, 2026-11-26): DAPO 35.0 at 2.40 searches against 40.0 at
  1.93 unquoted (−5.0 [−22.5, +12.5]); the 76-step SFT does not learn to read the background while
  quoting. Off by default.
* **First-turn samples** (optional, ``first_turn_samples``): the prompt and the first turn of a gold
  chain only, a cheap way to practise decomposing a question into its first search.
* **The whole agent** (``rdra_background``, ``plan_samples``, ``stie_feedback_share``): trajectories are
  written as the ``kunlun`` method will run them. The prompt carries RDRA's ``<background>`` block (§2.1,
  eqs. 1-4: a teacher plan naming the first stage's sub-questions, then the joint context D_1 ∪ D_2 of
  real retrieval, composed by the same :func:`~kunlunlab.agent.rdra.joint_context` /
  :func:`~kunlunlab.agent.rdra.background_text` as inference); plan samples teach eq. 2's planning turn
  itself (the planning prompt with D_1, then the plan and EOS); and a share of trajectories continue after
  their answer with STIE's feedback block (§2.2, the exact text the controller appends, masked out of the
  loss like a result block), a verification search and the answer again. Half of those (``stie_wrong_first``)
  first give a wrong answer (masked) that the verification corrects. All three are on by default, as the
  ``kunlun`` method (the training config's default agent) runs them; the plain-agent ablation turns them off.
  With plan-free RDRA (``RDRAConfig.use_plan=False``) the background is D_1 alone without a plan line and
  no plan samples are written, as that form never runs eq. 2.
* **Reading the background** (``background_facts``, with ``rdra_background``): by default the teacher
  searches every hop even when the background block already shows its passage, so a model trained that way
  learns "search every hop" and gains nothing from RDRA but a longer prompt. With this option a stage
  whose gold passages (answer visible in the clipped text) are all in the background is stated from it
  (``From the background: Q? A.``) and not searched; a question the background answers entirely is
  answered at once. This is what §2.1 builds the background for (the first retrieval guides the reasoning,
  so fewer rounds are needed); an untrained model given a background already tries it and loses count of
  its hops (A192 checkpoint: it skips hop 1, then searches one hop past the answer). Measured 2026-11-25
  (G192 recipe on one GPU, 200 held-out world questions, paired; experiments/results/gpu_g192): world EM
  48.5 with it and without it (Δ +0.0 [−10, +10]) with a fifth of the agent's own searches (0.40 vs 1.98
  per question); comparisons recover (61 % vs 11 %) but compositional questions collapse (11 % vs 86 %:
  a hop is 'read' from a background that shows the wrong passage). Off by default. A share between 0 and 1
  applies it to that share of the questions (chosen by a hash of the question text, so the same questions
  in every epoch and no draw of the mixing's random stream): the SFT data then hold both behaviours, what
  a search-budget reward in DAPO can choose between (FrugalRAG's two stages, notebook 07).
* **Summary-oriented questions** (``QAExample.facts``, ``TrainConfig.summary_share`` of the world's training
  questions): their chain is searched as any other, and the answer turn is the long-answer mode of §2.3
  (``<long_answer>`` the chain's facts and the link they make, closed by ``\\boxed{link}``); every other
  trajectory answers in ``<short_answer>``. Their STIE rounds answer in the long form again and never start
  with a wrong answer (the summary's facts would contradict it).
* **Noisy** (in the ReSearch / ZeroSearch spirit), each hop corrupted with probability ρ (the noise
  ratio): *distractor* results (the gold passage is withheld; the model notices and searches the
  entity's page), a *wrong hop* (a wrong intermediate answer is pursued, then corrected; the wrong
  turn is masked out of the loss so the model learns the correction, not the error) and an
  *irrelevant background* block in the prompt. Every noisy trajectory still ends at the gold answer.

The schedule, per epoch e with turning epoch T:

    p_hq(0) = p0                                   (eq. 14; p0 = 0.5: noisy : high quality = 1 : 1)
    p_hq(e) = p0 + (1 - p0) · min(1, e/T)^γ        (eq. 15; the high-quality share reaches 1 at T)
    ρ(e)    = ρ0 + (ρ_max - ρ0) · min(1, e/T)      (eq. 16; noisy samples get noisier until T)
"""
from __future__ import annotations

import random
import re
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from kunlunlab.agent.backends import chat_prompt_ids, text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE, SYSTEM_PROMPT, build_messages
from kunlunlab.agent.rdra import (RDRAConfig, background_text, clip_doc, joint_context, plan_prompt_messages,
                                  plan_queries)
from kunlunlab.agent.rollout import result_block
from kunlunlab.agent.stie import STIEConfig, STIEController
from kunlunlab.configs import choice, non_negative, positive, probability
from kunlunlab.data.types import Passage, QAExample
from kunlunlab.retrieval.retriever import Hit


SearchFn = Callable[[list[str], int], list[list]]
NOISE_KINDS = ("distractor", "wrong_hop", "background")


@dataclass
class MixingConfig:
    epochs: int = positive(3)
    turning_epoch: int = non_negative(2)  # T: from this epoch on, only high-quality data
    hq_share_start: float = probability(0.5)  # p0, eq. 14 (1:1 noisy to high quality)
    hq_shape: float = positive(1.0)  # γ, eq. 15 (1 = linear)
    noise_start: float = probability(0.3)  # ρ0, eq. 16
    noise_end: float = probability(0.7)  # ρ_max, eq. 16
    samples_per_epoch: int = positive(64)
    hotpot_share: float = probability(0.25)  # of each epoch's samples, taken from HotpotQA (when given)
    twowiki_share: float = probability(0.0)  # ... from 2Wiki questions with silver evidence chains (when given)
    first_turn_samples: int = non_negative(0)  # extra per epoch: prompt + the first turn only (cheap decomposition practice)
    noise_kinds: tuple[str, ...] = choice(NOISE_KINDS, NOISE_KINDS)
    quote_evidence: bool = False     # think turns quote the result sentence that holds each hop's answer
    # The whole agent's parts (the `kunlun` method, TrainConfig.agent.method's default, runs all three); the
    # plain-agent ablation turns them off (rdra_background false, plan_samples 0, stie_feedback_share 0).
    rdra_background: bool = True     # prompts carry RDRA's background block (plan + joint context), as `kunlun` runs
    background_facts: float | bool = probability(0.0)  # ... and (share of questions) a stage it shows is read from it, not searched
    plan_samples: int = non_negative(12)  # extra per epoch: RDRA planning prompt -> teacher plan (eq. 2); none are
                                     # written with plan-free RDRA. 12: experiments/results/planned_makerun
    stie_feedback_share: float = probability(0.25)  # trajectories that continue after the answer with STIE feedback (§2.2)
    stie_wrong_first: float = probability(0.5)  # ... of which the first answer is wrong (masked) and corrected after feedback

    def __post_init__(self):
        if self.epochs < 1 or self.turning_epoch < 0 or self.samples_per_epoch < 1 or self.first_turn_samples < 0:
            raise ValueError(f"invalid mixing sizes: {self}")
        self.background_facts = float(self.background_facts)  # true / false in older configs: 1 / 0
        if self.plan_samples < 0:
            raise ValueError(f"plan_samples must be >= 0, got {self.plan_samples}")
        for name in ("hq_share_start", "noise_start", "noise_end", "hotpot_share", "twowiki_share", "stie_feedback_share",
                     "stie_wrong_first", "background_facts"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.hq_shape <= 0:
            raise ValueError("hq_shape must be positive")
        self.noise_kinds = tuple(self.noise_kinds)
        unknown = set(self.noise_kinds) - set(NOISE_KINDS)
        if unknown or not self.noise_kinds:
            raise ValueError(f"noise_kinds must be a non-empty subset of {NOISE_KINDS}, got {self.noise_kinds}")


def _progress(epoch: int, cfg: MixingConfig) -> float:
    return 1.0 if cfg.turning_epoch == 0 else min(1.0, epoch / cfg.turning_epoch)


def hq_share(epoch: int, cfg: MixingConfig) -> float:
    """Eqs. 14-15."""
    return cfg.hq_share_start + (1.0 - cfg.hq_share_start) * _progress(epoch, cfg) ** cfg.hq_shape


def noise_ratio(epoch: int, cfg: MixingConfig) -> float:
    """Eq. 16."""
    return cfg.noise_start + (cfg.noise_end - cfg.noise_start) * _progress(epoch, cfg)


def schedule(cfg: MixingConfig) -> list[dict]:
    return [{"epoch": e, "hq_share": hq_share(e, cfg), "noise_ratio": noise_ratio(e, cfg),
             "n_hq": round(hq_share(e, cfg) * cfg.samples_per_epoch),
             "n_noisy": cfg.samples_per_epoch - round(hq_share(e, cfg) * cfg.samples_per_epoch)}
            for e in range(cfg.epochs)]


# ---------------------------------------------------------------------------- trajectories
@dataclass
class TrajectoryExample:
    """One training trajectory: the prompt's parts and the assistant's turns.

    ``segments`` alternate between the model (``train`` True/False) and the environment (results);
    the first model segment continues the assistant prefix ``<think>``."""
    question: str
    answers: list[str]
    segments: list[dict]             # {"role": "model"|"env", "text": str, "train": bool}
    background: str | None = None
    source: str = "world"            # "world" | "hotpotqa"
    quality: str = "hq"              # "hq" | "noisy"
    noise: list[str] = field(default_factory=list)
    hops: int = 0
    qtype: str | None = None
    epoch: int = 0
    partial: bool = False            # only the first turn (a decomposition sample), not a whole trajectory
    kind: str = "trajectory"         # "trajectory" | "plan" (an RDRA planning sample, eq. 2)
    prompt_messages: list[dict] | None = None  # a prompt other than the search-think one (plan samples)
    prefix: str = "<think>"          # how the assistant's reply starts (part of the prompt tokens)
    end_with_eos: bool = False       # the reply ends with the tokenizer's EOS (plans end there; turns end at tags)
    stie_rounds: int = 0             # STIE feedback rounds in this trajectory

    @property
    def searches(self) -> int:
        return sum(1 for s in self.segments if s["role"] == "env" and not s.get("feedback"))

    @property
    def text(self) -> str:
        return self.prefix + "".join(s["text"] for s in self.segments)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(searches=self.searches)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrajectoryExample":
        """What :meth:`to_dict` wrote (``searches`` is derived, not stored)."""
        return cls(**{k: v for k, v in d.items() if k != "searches"})


def _search_turn(think: str, queries: list[str]) -> str:
    body = " ".join(f"<query>{q}</query>" for q in queries)
    return f"{think}</think>\n<search> {body} </search>"


def _answer_turn(think: str, answer: str, summary: str | None = None) -> str:
    """The answer turn: ``<short_answer>`` with the box, or with a ``summary`` the long-answer mode (§2.3),
    the summary closed by the box."""
    if summary is not None:
        return f"{think}</think>\n<long_answer>{summary} \\boxed{{{answer}}}</long_answer>"
    return f"{think}</think>\n<short_answer>\\boxed{{{answer}}}</short_answer>"


def summary_text(ex: QAExample) -> str | None:
    """What a summary-oriented question's long answer says before its box: the chain's facts and the link they
    make (None for a factoid question)."""
    if not ex.summary:
        return None
    start, end = ex.question.removeprefix("Describe how ").removesuffix(".").split(" is connected to ", 1) \
        if " is connected to " in ex.question else (ex.question, "")
    link = f" So {start} is connected to {end} through {ex.answers[0]}." if end else ""
    return " ".join(ex.facts) + link


_SENTENCE = re.compile(r"[^.!?\n]*?[^\s.!?\n][^.!?\n]*[.!?]")


def evidence_sentence(result_text: str, answer: str) -> str | None:
    """The first sentence of a ``<result>`` block that contains ``answer`` (None when no shown sentence
    does, e.g. the passage was cut at ``max_result_chars``; yes/no answers are never quoted). Quoting it
    before stating a hop's answer turns "pick the right name" into "copy the sentence about this
    relation"; see the module docstring for how that measured."""
    if not answer or answer.lower() in ("yes", "no"):
        return None
    word = re.compile(r"(?<!\w)" + re.escape(answer) + r"(?!\w)")
    for line in result_text.splitlines():
        for m in _SENTENCE.finditer(line):
            if word.search(m.group(0)):
                return m.group(0).strip()
    return None


@dataclass
class _Round:
    """What the STIE controller reads of an answer round (the rollout engine passes an ``AnswerRound``)."""
    answer: str | None
    confidence: float
    doc_ids: list[str]


class TrajectoryBuilder:
    """Writes trajectories with real retrieval; ``passages_by_id`` lets it insert a gold passage the
    retriever missed and draw irrelevant ones for noise."""
    def __init__(self, search: SearchFn, passages: Sequence[Passage], cfg: MixingConfig, rdra=None, *,
                 top_k: int, max_result_chars: int):

        self.search, self.cfg = search, cfg
        # the run's retrieval sizes (TrainConfig.top_k / max_result_chars), the ones its rollouts use
        self.top_k, self.max_result_chars = top_k, max_result_chars
        self.rdra = rdra or RDRAConfig()
        self.passages = list(passages)
        self.by_id = {p.id: p for p in self.passages}
        self.by_title: dict[str, Passage] = {}
        for p in self.passages:
            self.by_title.setdefault(p.title, p)
        self._block = result_block

    # -- results
    def _hits(self, queries: list[str], golds: list[str | None], withhold: set[str] = frozenset()) -> list[list]:

        k = self.top_k
        results = self.search(queries, k + len(withhold) + 1)
        out = []
        for hits, gold in zip(results, golds):
            hits = [h for h in hits if h.id not in withhold][:k]
            if gold and gold not in withhold and gold not in {h.id for h in hits} and gold in self.by_id:
                p = self.by_id[gold]
                hits = hits[:k - 1] + [Hit(p.id, p.contents, 0.0, p.title)]
            out.append(hits)
        return out

    def _env(self, queries: list[str], golds: list[str | None], withhold: set[str] = frozenset()) -> dict:
        hits = self._hits(queries, golds, withhold)
        # docs and queries too: kunlunlab.training.peer_data writes the same search in another protocol
        return {"role": "env", "text": self._block(hits, queries, self.max_result_chars), "train": False,
                "docs": [[h.contents for h in row] for row in hits], "queries": list(queries)}

    # -- the whole agent: RDRA background and plans (§2.1), STIE feedback rounds (§2.2)
    def teacher_plan(self, ex: QAExample) -> str:
        """The plan a good planner writes before searching: the sub-questions of the first stage (later
        hops depend on answers not yet known), or the supporting pages of a HotpotQA question."""
        if ex.chain:
            return "\n".join(ex.chain[i].question for i in ex.stage_groups()[0])
        titles = [t for t in ex.supporting_titles if t in self.by_title][:2]
        return "\n".join(f"About {t}" for t in titles) or ex.question

    def rdra_background(self, question: str, plan: str, irrelevant: int = 0,
                        rng: random.Random | None = None) -> str:
        """Eqs. 1, 3, 4 with real retrieval: D_1 for the question, D_2 for the plan's queries, joined as
        inference joins them; ``irrelevant`` passages replace the last ones (the background noise kind)."""
        return self.rdra_context(question, plan, irrelevant, rng)[0]

    def rdra_context(self, question: str, plan: str, irrelevant: int = 0,
                     rng: random.Random | None = None) -> tuple[str, dict[str, str]]:
        """:meth:`rdra_background` and each shown passage's text as the block shows it (clipped), by id."""
        first = self.search([question], self.rdra.background_k)[0]
        if not self.rdra.use_plan:  # plan-free RDRA: D_1 alone and no plan line, as inference writes it
            plan, second = "", []
        else:
            queries = plan_queries(plan, question, self.rdra.max_plan_queries, self.rdra.query_whole_plan)
            second = [h for hits in self.search(queries, self.rdra.plan_k) for h in hits]
        docs = joint_context(first, second, self.rdra)
        if irrelevant:

            picks = (rng or random.Random(0)).sample(self.passages, irrelevant)
            docs = docs[:max(0, len(docs) - irrelevant)] + [Hit(p.id, p.contents, 0.0, p.title) for p in picks]
        shown = {h.id: clip_doc(h.contents, self.rdra.max_doc_chars) for h in docs}
        return background_text(plan, docs, self.rdra), shown

    def plan_sample(self, ex: QAExample, source: str = "world") -> TrajectoryExample:
        """Eq. 2's planning turn as an SFT sample: the planning prompt with D_1, then the plan and EOS."""
        first = self.search([ex.question], self.rdra.background_k)[0]
        plan = self.teacher_plan(ex)
        return TrajectoryExample(ex.question, list(ex.answers), [{"role": "model", "text": plan, "train": True}],
                                 source=source, hops=len(ex.chain), qtype=ex.type, kind="plan",
                                 prompt_messages=plan_prompt_messages(ex.question, first, self.rdra), prefix="",
                                 end_with_eos=True)

    def add_stie_round(self, t: TrajectoryExample, ex: QAExample, wrong_first: bool,
                       rng: random.Random) -> TrajectoryExample:
        """Continues a finished trajectory as STIE makes the agent continue: the feedback block the controller
        appends after an answer round (environment tokens), a verification search for the last hop with the
        answer in the query (a different query, so repeat blocking lets it through), its result, and the
        answer again. With ``wrong_first`` the answer before the feedback is a wrong one (kept out of the
        loss) and the verified answer corrects it."""
        answer = ex.answers[0]
        wrong_first = wrong_first and not ex.summary  # a summary's facts would contradict a wrong box
        first = self._wrong_answer(answer, rng) if wrong_first else answer
        if wrong_first:
            t.segments[-1] = {"role": "model", "train": False,
                              "text": _answer_turn(t.segments[-1]["text"].split("</think>")[0], first)}
        # The controller's own feedback for this round (termination switched off so it always continues).
        controller = STIEController(STIEConfig(confidence_ceiling=2.0, max_rounds=10))
        _, feedback = controller.observe(0, _Round(first, 0.5, []))
        t.segments.append({"role": "env", "text": RESULT_TEMPLATE.format(results=feedback), "train": False,
                           "feedback": True})
        if ex.chain:
            last = ex.chain[-1]
            query, gold, fact_q = f"{last.question} {answer}", last.passage_id, last.question
        else:
            title = next((x for x in reversed(ex.supporting_titles) if x in self.by_title), None)
            query = f"{title or ex.question} {answer}"
            gold, fact_q = (self.by_title[title].id if title else None), ex.question
        lead = f"<think>I will verify {first}." if not wrong_first else f"<think>I will check {first} again."
        t.segments.append({"role": "model", "text": _search_turn(lead, [query]), "train": True})
        t.segments.append(self._env([query], [gold]))
        verdict = f"{fact_q} {answer}." if ex.chain else f"The result confirms {answer}."
        if wrong_first:
            verdict += f" Not {first}."
        t.segments.append({"role": "model", "text": _answer_turn("<think>" + verdict, answer, summary_text(ex)),
                           "train": True})
        t.stie_rounds += 1
        if wrong_first and "stie_correction" not in t.noise:
            t.noise.append("stie_correction")
            t.quality = "noisy"
        return t

    # -- gold-chain trajectories
    def _reads_background(self, question: str) -> bool:
        """Whether this question's trajectory states the hops the background shows (``background_facts``,
        a share of questions picked by a hash of the text: the same ones in every epoch)."""
        share = self.cfg.background_facts
        if not self.cfg.rdra_background or share <= 0.0:
            return False
        return share >= 1.0 or zlib.crc32(question.encode()) / 2 ** 32 < share

    def world(self, ex: QAExample, rho: float = 0.0, rng: random.Random | None = None,
              kinds: Sequence[str] = ()) -> TrajectoryExample:
        """A gold-chain trajectory; with ``rho > 0`` each stage is corrupted with probability ``rho``."""
        rng = rng or random.Random(0)
        segs: list[dict] = []
        noise: list[str] = []
        facts = ""  # what the last turn learned; the next turn's think block states it
        stages = ex.stage_groups()
        known: dict[str, str] = {}  # passage id -> its text as the background shows it (background_facts)
        background = None
        reads_background = self._reads_background(ex.question)
        if reads_background:
            # Built first here (the default builds it after the turns; same draws, other order) because the
            # turns depend on what it shows.
            background, known = self._world_background(ex, rho, rng, kinds, noise)

        def model(text: str, train: bool = True) -> None:
            segs.append({"role": "model", "text": text, "train": train})

        for s, stage in enumerate(stages):
            hops = [ex.chain[i] for i in stage]
            queries = [h.question for h in hops]
            golds = [h.passage_id for h in hops]
            kind = rng.choice(list(kinds)) if kinds and rng.random() < rho else None
            if kind is None and known and all(h.answer in known.get(h.passage_id, "") for h in hops):
                read = " ".join(self._fact(h.question, h.answer, known[h.passage_id]) for h in hops)
                facts = (facts + " " if facts else "") + "From the background: " + read
                continue
            # The first turn continues the assistant prefix "<think>"; later turns open their own.
            lead = ("<think>" if segs else "") + (facts + " " if facts else "") + \
                ("I need: " if s == 0 else "Next: ") + " ".join(queries)
            model(_search_turn(lead, queries))
            if kind == "distractor":
                # The results miss the fact; the model says so and searches the entity's own page.
                segs.append(self._env(queries, [None] * len(queries), withhold={g for g in golds if g}))
                titles = [self.by_id[g].title for g in golds if g in self.by_id]
                retry = titles or [q + " facts" for q in queries]
                model(_search_turn("<think>The results do not answer this. I will search the page itself.", retry))
                segs.append(self._env(retry, golds))
                noise.append("distractor")
            elif kind == "wrong_hop" and s + 1 < len(stages) and len(stage) == 1:
                # A wrong intermediate answer is pursued (kept out of the loss), then corrected (trained).
                segs.append(self._env(queries, golds))
                gold_result = segs[-1]["text"]
                wrong = self._wrong_answer(hops[0].answer, rng)
                nxt = ex.chain[stages[s + 1][0]]
                wrong_q = nxt.question.replace(hops[0].answer, wrong)
                if wrong_q == nxt.question:
                    wrong_q = f"{nxt.question} {wrong}"
                model(_search_turn(f"<think>{hops[0].question} {wrong}. Next: {wrong_q}", [wrong_q]), train=False)
                segs.append(self._env([wrong_q], [None]))
                facts = f"Correction: {self._fact(hops[0].question, hops[0].answer, gold_result)} Not {wrong}."
                noise.append("wrong_hop")
                continue
            else:
                segs.append(self._env(queries, golds))
            facts = " ".join(self._fact(h.question, h.answer, segs[-1]["text"]) for h in hops)
        if ex.type in ("comparison", "bridge_comparison"):
            facts += f" So the answer is {ex.answers[0]}."
        model(_answer_turn(("<think>" if segs else "") + facts.strip(), ex.answers[0], summary_text(ex)))
        if not reads_background:
            background, _ = self._world_background(ex, rho, rng, kinds, noise)
        return TrajectoryExample(ex.question, list(ex.answers), segs, background, "world",
                                 "noisy" if noise else "hq", noise, len(ex.chain), ex.type)

    def _world_background(self, ex: QAExample, rho: float, rng: random.Random, kinds: Sequence[str],
                          noise: list[str]) -> tuple[str | None, dict[str, str]]:
        """The prompt's background block (RDRA's, or irrelevant passages as noise) and what it shows of each
        passage, by id."""
        noisy_background = bool(kinds and "background" in kinds and rng.random() < rho)
        if noisy_background:
            noise.append("background")
        if self.cfg.rdra_background:
            return self.rdra_context(ex.question, self.teacher_plan(ex), 2 if noisy_background else 0, rng)
        if noisy_background:
            return "\n".join(p.contents for p in rng.sample(self.passages, 2)), {}
        return None, {}

    def _fact(self, question: str, answer: str, result_text: str) -> str:
        """How a think turn states a hop's answer: ``Q? "evidence sentence" So: A.`` (or ``Q? A.``)."""
        quote = evidence_sentence(result_text, answer) if self.cfg.quote_evidence else None
        return f'{question} "{quote}" So: {answer}.' if quote else f"{question} {answer}."

    def _wrong_answer(self, answer: str, rng: random.Random) -> str:
        for _ in range(20):
            p = rng.choice(self.passages)
            if p.title != answer and p.title.split(" (")[0] != answer:
                return p.title.split(" (")[0]
        return answer + " Jr."

    def hotpot(self, ex: QAExample, source: str = "hotpotqa") -> TrajectoryExample:
        """A real question walked along its supporting titles (comparisons search both at once): HotpotQA's
        supporting facts, or a silver chain of :mod:`kunlunlab.data.evidence` (2Wiki)."""
        titles = [t for t in ex.supporting_titles if t in self.by_title][:2]
        if not titles:
            raise ValueError(f"{source} example {ex.id}: no supporting title is in the corpus")
        golds = [self.by_title[t].id for t in titles]
        segs: list[dict] = []
        stages = [titles] if ex.type == "comparison" else [[t] for t in titles]
        gold_of = dict(zip(titles, golds))
        background, known = None, {}
        if self.cfg.rdra_background:
            background, known = self.rdra_context(ex.question, self.teacher_plan(ex))
        if not self._reads_background(ex.question):
            known = {}
        read = [t for t in titles if gold_of[t] in known]  # pages the background shows (background_facts)
        for stage in stages:
            stage = [t for t in stage if t not in read]
            if not stage:
                continue
            lead = ("<think>" if segs else "") + (f"From the background: {' and '.join(read)}. " if read and not segs
                                                   else "") + ("I need: " if not (segs or read) else "Next: ") + " and ".join(stage)
            segs.append({"role": "model", "text": _search_turn(lead, list(stage)), "train": True})
            segs.append(self._env(list(stage), [gold_of[t] for t in stage]))
        shown = "".join(seg["text"] for seg in segs if seg["role"] == "env") + "".join(known[gold_of[t]] for t in read)
        quote = evidence_sentence(shown, ex.answers[0]) if self.cfg.quote_evidence else None
        said = f' "{quote}"' if quote else ""
        segs.append({"role": "model", "train": True, "text": _answer_turn(
            f"{'<think>' if segs else ''}From {' and '.join(titles)}:{said} the answer is {ex.answers[0]}.",
            ex.answers[0])})
        return TrajectoryExample(ex.question, list(ex.answers), segs, background, source, "hq", [], len(titles),
                                 ex.type)


@dataclass
class RealSource:
    """Real questions with evidence in their own corpus (HotpotQA supporting facts, 2Wiki silver chains): each
    epoch takes ``share`` of its samples from them, as high-quality trajectories written by ``builder``."""
    name: str
    builder: TrajectoryBuilder
    questions: Sequence[QAExample]
    share: float


def mix(builder: TrajectoryBuilder, world_questions: Sequence[QAExample], cfg: MixingConfig,
        real_sources: Sequence[RealSource] = (), *, seed: int) -> list[TrajectoryExample]:
    """All epochs of the schedule, in order (epoch 0 first): each epoch draws ``samples_per_epoch``
    questions, ``n_hq`` of them high quality and the rest noisy at that epoch's noise ratio; the real sources'
    samples count among the high-quality ones. ``seed``: the run's (``TrainConfig.seed``).

    Which questions are drawn, which slots are noisy and the order of the drawn samples come from one stream
    (``seed``) that no mechanism touches, so every arm of a comparison trains on the same questions in the same
    order whatever its own mechanisms draw: a sample's corruption and STIE round draw from the sample's own
    stream (seed, epoch, slot), plan samples from theirs, and they are inserted into the shuffled epoch at
    positions of their own stream. (One stream for everything gave kunlun's arm another draw of questions than
    the peers': its background and feedback draws moved every later pick.)"""
    draws = random.Random(seed)
    extras = random.Random(f"{seed}:extras")
    out: list[TrajectoryExample] = []
    sources = [s for s in real_sources if s.questions and s.share > 0]
    for row in schedule(cfg):
        n_real, room = [], row["n_hq"]
        for source in sources:
            n_real.append(min(round(source.share * cfg.samples_per_epoch), room, len(source.questions)))
            room -= n_real[-1]
        n_world = cfg.samples_per_epoch - sum(n_real)
        picks = draws.sample(list(world_questions), min(n_world, len(world_questions)))
        noisy_slots = set(draws.sample(range(len(picks)), min(row["n_noisy"], len(picks))))
        epoch = []
        for j, ex in enumerate(picks):
            own = random.Random(f"{seed}:{row['epoch']}:{j}")  # this sample's corruption and feedback draws
            if j in noisy_slots:
                # A noisy sample has at least one corrupted stage: retry with fresh draws a few times.
                for _ in range(8):
                    t = builder.world(ex, row["noise_ratio"], own, cfg.noise_kinds)
                    if t.noise:
                        break
            else:
                t = builder.world(ex)
            if cfg.stie_feedback_share and own.random() < cfg.stie_feedback_share:
                builder.add_stie_round(t, ex, own.random() < cfg.stie_wrong_first, own)
            t.epoch = row["epoch"]
            epoch.append(t)
        for source, n in zip(sources, n_real):
            for ex in draws.sample(list(source.questions), n):
                t = source.builder.hotpot(ex, source.name)
                t.epoch = row["epoch"]
                epoch.append(t)
        rest = [q for q in world_questions if q not in picks]
        for ex in draws.sample(rest, min(cfg.first_turn_samples, len(rest))):
            t = builder.world(ex)
            t.segments, t.partial, t.epoch = t.segments[:1], True, row["epoch"]
            epoch.append(t)
        draws.shuffle(epoch)
        # plan samples teach eq. 2's planning turn, which plan-free RDRA never runs: none are written then
        n_plans = cfg.plan_samples if builder.rdra.use_plan else 0
        for ex in extras.sample(list(world_questions), min(n_plans, len(world_questions))):
            t = builder.plan_sample(ex)
            t.epoch = row["epoch"]
            epoch.insert(extras.randrange(len(epoch) + 1), t)
        out.extend(epoch)
    return out


def data_stats(trajectories: Sequence[TrajectoryExample], tokenizer=None) -> list[dict]:
    """One row per trajectory for plots: epoch, quality, source, hops, searches, characters (tokens)."""
    rows = []
    for t in trajectories:
        row = {"epoch": t.epoch, "quality": t.quality, "source": t.source, "type": t.qtype, "hops": t.hops,
               "partial": t.partial, "kind": t.kind, "stie_rounds": t.stie_rounds,
               "searches": t.searches, "chars": len(t.text), "noise": "+".join(t.noise) or "none"}
        if tokenizer is not None:
            row["tokens"] = len(tokenizer(t.text, add_special_tokens=False)["input_ids"])
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- tokenisation for SFT
def tokenize_trajectory(tokenizer, t: TrajectoryExample, system_prompt: str | None = None,
                        assistant_prefix: str = "<think>") -> dict:
    """``input_ids`` and ``completion_mask`` (1 = model token in the loss; 0 = prompt, retrieved results and
    masked noise turns). Each segment is tokenised on its own, as the rollout engine appends it."""
    messages = t.prompt_messages or build_messages(t.question, t.background, system_prompt or SYSTEM_PROMPT)
    prompt = chat_prompt_ids(tokenizer, messages, t.prefix if t.prompt_messages else assistant_prefix)
    ids, mask = list(prompt), [0] * len(prompt)
    for seg in t.segments:
        seg_ids = text_ids(tokenizer, seg["text"])
        ids.extend(seg_ids)
        mask.extend([1 if seg["role"] == "model" and seg["train"] else 0] * len(seg_ids))
    if t.end_with_eos:
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return {"input_ids": ids, "completion_mask": mask}

