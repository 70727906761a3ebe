"""REX-RAG's mixed sampling and policy correction (Jiang et al. 2025, arXiv 2508.08149) for a protocol whose
``exploration`` field is set (:class:`~kunlunlab.agent.protocols.base.ExplorationSpec`, the recipe's data; REX-RAG's
is :data:`kunlunlab.agent.protocols.rex_rag.EXPLORATION`). Read at github MiliLab/REX-RAG @d9dbbb4; the code is
written here.

Mixed sampling (:meth:`Explorer.explore`, called by :class:`~kunlunlab.training.dapo.SearchRollout` after a rollout
call's samples are scored). A group whose every sample is wrong is a dead end. Each of its samples that ended in an
answer is probed with probability ``probe_share`` (upstream ``search_r1/llm_agent/generation.py``
``execute_predictions``: ``random.randint(0, 100) < revision_prob``): its answer turn is cut where the spec's
``cut_pattern`` first matches (the match removed, the reasoning before it kept, ``_delete_contents``), a prompt of
the spec drawn uniformly is appended as model tokens (trained on: upstream's component 5 is put back into
``info_mask``), and the rollout continues from there with the same backend, the same search and what is left of the
sample's token and search budget (``clone_rollout``: the clone carries on in the same loop). Every probe rolled out
is counted in :meth:`SearchRollout.generated` (the comparison's ledger), and no more are rolled out than the budget
(``dapo.max_rollouts``) leaves after the call's own rollouts. The trajectory filter (``verl/trainer/ppo/
ray_trainer.py`` ``reorder_batch``) then keeps the ``ceil(N x keep_ratio)`` probes (N: the call's samples) whose
prompt tokens have the highest mean log-prob under the policy; ``keep_ratio`` starts at the spec's
``keep_ratio_start`` and after each call moves to ``(1 - s) keep_ratio + s x (accuracy of the kept probes, 0 with
none)``, ``s`` = ``keep_ratio_smoothing`` (upstream ``pd.Series(revision_accs).ewm(alpha=0.1, adjust=False)``).
A kept probe takes the place of the sample it was cut from, in its group.

Policy correction (``verl/workers/actor/dp_actor.py`` ``update_policy``, the block marked "Importance Sampling").
The batch is a mixture: a share ``alpha`` (the kept probes' share of the batch, upstream ``cloned_traj_ratio``) from
the probe policy ``mu``, the rest from the policy ``pi_old``. Upstream replaces every token's old log-prob by the
mixture's, ``log((1 - alpha) pi_old + alpha mu)``, so PPO's clipped ratio becomes ``pi_theta / ((1 - alpha) pi_old
+ alpha mu)`` with its usual clip (0.2 both sides in REX-RAG's GRPO). ``mu`` per token: 0 on the policy's own
samples; on a probe, for the ``j`` completion tokens before the prompt ``pi_old / e^(1/j)`` with ``e`` the call's
error rate (1 - accuracy of its samples: the prefix is drawn from the wrong samples, density ``pi_old / e`` spread
over its tokens), on the prompt's first token 1 and on each later prompt token the share of the spec's prompts
continuing the prompt's tokens so far with that token (``verl/workers/actor/exploration_distribution.py``
``PrefixIndex``: the prefix tree of the tokenised prompts, so the prompt's tokens together have probability 1 / its
count), and after the prompt ``pi_old`` (the continuation is the policy's). So the importance weight of a token,
``pi_old / ((1 - alpha) pi_old + alpha mu)``, is ``1 / (1 - alpha)`` on the policy's samples, ``1 / ((1 - alpha) +
alpha e^(-1/j))`` before a probe's prompt, ``pi_old / ((1 - alpha) pi_old + alpha f)`` on a prompt token of
frequency ``f``, and 1 after it.

TRL's ``GRPOTrainer`` takes no per-token weights, but its loss reads ``old_per_token_logps`` when the batch has it:
:class:`ExplorationGRPOTrainer` sets it to the mixture's log-prob, ``log(a x pi_old + b)`` with each token's ``a``
and ``b`` from the rollout (the extra fields :data:`SCALE` and :data:`FLOOR`), and TRL's own clipped objective does
the rest: the same equation as upstream's, computed where TRL computes its ratio.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

import torch

from kunlunlab.agent.backends import SamplingConfig, text_ids
from kunlunlab.agent.protocols.base import ExplorationSpec
from kunlunlab.agent.rollout import RolloutEngine, Trajectory
from kunlunlab.training.micro_batches import TrimmedGRPOTrainer

SCALE, FLOOR = "exploration_scale", "exploration_floor"  # the rollout's extra fields: q = SCALE x pi_old + FLOOR
MIN_TOKENS_LEFT = 16  # a probe needs room to continue after its prompt (the engine's own margin for a block)


class PromptTree:
    """The exploratory prompts' next-token frequencies (upstream ``PrefixIndex``): ``frequency(prefix, token)`` is
    the share of the prompts starting with ``prefix`` whose next token is ``token``; the first token has 1, as
    upstream sets it."""

    def __init__(self, token_lists: list[list[int]]):
        self.next: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for ids in token_lists:
            for k in range(1, len(ids)):
                self.next[tuple(ids[:k])][ids[k]] += 1

    def frequency(self, prefix: list[int], token: int) -> float:
        if not prefix:
            return 1.0
        counts = self.next.get(tuple(prefix))
        return counts[token] / sum(counts.values()) if counts else 0.0


@dataclass
class _Cut:
    base: int  # completion tokens before the answer turn
    text: str  # the answer turn with its action removed
    ids: list[int]
    logprobs: list[float]


@dataclass
class Probe:
    slot: int  # the batch slot of the sample it was cut from (and replaces when kept)
    group: int
    trajectory: Trajectory
    start: int  # completion position of the prompt's first token (j)
    prompt_ids: list[int]
    prompt_logps: list[float] = field(default_factory=list)  # pi_old of each prompt token
    signal: tuple = (0.0, None)  # (accuracy, budget score), as the rollout scores its samples


@dataclass
class ExplorationStep:
    """One rollout call's exploration: its log entries (``stats``) and, when probes were kept, the per-token terms
    of the behaviour distribution for the trainer (:meth:`fields`)."""

    stats: dict
    scale: list[list[float]] | None = None
    floor: list[list[float]] | None = None
    rolled: int = 0

    def fields(self, lengths: list[int]) -> dict:
        """The extra fields of the rollout's output, each row as long as its final completion (tokens the rollout
        appends after exploring, an EOS, get ``a`` 1 and ``b`` 0; they are out of the loss)."""
        if self.scale is None:
            return {}

        def fit(row: list[float], n: int, pad: float) -> list[float]:
            return row[:n] + [pad] * max(0, n - len(row))

        return {SCALE: [fit(r, n, 1.0) for r, n in zip(self.scale, lengths)],
                FLOOR: [fit(r, n, 0.0) for r, n in zip(self.floor, lengths)]}


class Explorer:
    """The state of one RL stage's exploration (the keep ratio's moving average) and its step."""

    def __init__(self, spec: ExplorationSpec):
        self.spec = spec
        self.keep_ratio = spec.keep_ratio_start
        self._prompt_ids: list[list[int]] | None = None
        self._tree: PromptTree | None = None

    @classmethod
    def for_protocol(cls, protocol) -> "Explorer | None":
        spec = getattr(protocol, "exploration", None)
        return None if spec is None else cls(spec)

    def prompt_ids(self, tokenizer) -> list[list[int]]:
        if self._prompt_ids is None:  # tokenised alone, as upstream tokenises the appended observation
            self._prompt_ids = [text_ids(tokenizer, p) for p in self.spec.prompts]
            self._tree = PromptTree(self._prompt_ids)
        return self._prompt_ids

    def explore(self, rollout, backend, model, questions: list[str], trajs: list[Trajectory], signals: list[tuple],
                groups: list[list[int]], seed: int, spent: int = 0, processes: int = 1) -> ExplorationStep:
        """Probes this call's dead-end groups and replaces ``trajs``/``signals`` slots by the kept probes, in
        place. ``rollout``: the :class:`~kunlunlab.training.dapo.SearchRollout` (its search, settings, protocol,
        budget); ``model``: the policy, which scores the prompts' tokens; ``spent``: rollouts this call drew already
        (every process's), for the budget's room."""
        tokenizer, spec = rollout.tokenizer, self.spec
        prompt_ids = self.prompt_ids(tokenizer)
        rng = random.Random(seed + 104729)
        n = len(trajs)
        wrong = [s[0] < 1.0 for s in signals]
        error_rate = sum(wrong) / n if n else 0.0
        dead = [g for g, members in enumerate(groups) if members and all(wrong[i] for i in members)]
        room = None
        if rollout.dapo.max_rollouts is not None:
            room = max(0, (rollout.dapo.max_rollouts - rollout.generated() - spent) // max(1, processes))
        candidates = []
        for g in dead:
            for i in groups[g]:
                if trajs[i].finish != "answer" or rng.random() >= spec.probe_share:
                    continue
                k = rng.randrange(len(spec.prompts))
                cut = self._cut(tokenizer, trajs[i])
                if cut is not None and rollout.rollout.max_total_tokens - cut.base - len(cut.ids) - \
                        len(prompt_ids[k]) >= MIN_TOKENS_LEFT:
                    candidates.append((g, i, cut, k))
        if room is not None:
            candidates = candidates[:room]
        probes = self._continue(rollout, backend, questions, trajs, candidates, seed)
        for p in probes:
            p.signal = rollout._signals([questions[p.slot]], [p.trajectory])[0]
        self._score_prompts(model, trajs, probes)
        keep_n = min(len(probes), math.ceil(n * self.keep_ratio)) if probes else 0
        kept = sorted(probes, key=lambda p: -sum(p.prompt_logps) / max(1, len(p.prompt_logps)))[:keep_n]
        alpha = len(kept) / n if n else 0.0
        for p in kept:
            trajs[p.slot] = p.trajectory
            signals[p.slot] = p.signal
        used_ratio = self.keep_ratio
        probe_accuracy = sum(p.signal[0] for p in kept) / len(kept) if kept else 0.0
        self.keep_ratio = (1 - spec.keep_ratio_smoothing) * self.keep_ratio + spec.keep_ratio_smoothing * probe_accuracy
        step = ExplorationStep(stats={
            "dead_end_groups": len(dead), "probe_groups": len({g for g, *_ in candidates}),
            "probe_group_share": len({g for g, *_ in candidates}) / len(groups) if groups else 0.0,
            "probes_rolled": len(probes), "probes_kept": len(kept), "probe_accuracy": probe_accuracy,
            "mix_alpha": alpha, "error_rate": error_rate, "keep_ratio": used_ratio}, rolled=len(probes))
        if kept:
            step.scale, step.floor = self._terms(trajs, {p.slot: p for p in kept}, alpha, error_rate)
        step.stats.update(self._weights(trajs, step, {p.slot: p for p in kept}))
        return step

    def _cut(self, tokenizer, t: Trajectory) -> _Cut | None:
        """The answer turn (the trailing model tokens) with its action removed, re-tokenised as upstream does; its
        tokens keep their sampled log-probs when they are the turn's own first tokens."""
        last = t.steps[-1] if t.steps else None
        n_last = len(t.mask) - next((k + 1 for k in range(len(t.mask) - 1, -1, -1) if not t.mask[k]), 0)
        if last is None or last.get("kind") != "model" or n_last == 0:
            return None
        m = re.search(self.spec.cut_pattern, last["text"], re.S)
        if m is None:
            return None
        text = last["text"][:m.start()] + last["text"][m.end():]
        ids = text_ids(tokenizer, text) if text else []
        base = len(t.completion_ids) - n_last
        same = t.completion_ids[base:base + len(ids)] == ids
        return _Cut(base, text, ids, list(t.logprobs[base:base + len(ids)]) if same else [0.0] * len(ids))

    def _continue(self, rollout, backend, questions: list[str], trajs: list[Trajectory], candidates: list,
                  seed: int) -> list[Probe]:
        """Each candidate's rollout continued after its prompt; candidates with the same search and the same budget
        left run as one batch."""
        batches: dict[tuple, list] = {}
        for g, i, cut, k in candidates:
            t, p_ids = trajs[i], self._prompt_ids[k]
            head = t.completion_ids[:cut.base] + cut.ids + p_ids
            search = rollout.routes.get(questions[i], rollout.search)
            key = (id(search), rollout.rollout.max_total_tokens - len(head),
                   max(0, rollout.rollout.max_searches - t.n_searches))
            batches.setdefault(key, (search, []))[1].append((g, i, cut, k, head))
        probes = []
        for b, ((_, tokens_left, searches_left), (search, members)) in enumerate(batches.items()):
            cfg = replace(rollout.rollout, max_total_tokens=tokens_left, max_searches=searches_left,
                          sampling=SamplingConfig(temperature=rollout.dapo.temperature, top_p=rollout.dapo.top_p,
                                                  seed=seed + 7919 * (b + 1)))
            prompts = [trajs[i].prompt_ids + head for _, i, _, _, head in members]
            texts = [self.spec.prompts[k] for _, _, _, k, _ in members]
            conts = RolloutEngine(backend, search, cfg, rollout.protocol).run(
                prompts, [questions[i] for _, i, _, _, _ in members], None, texts)
            for (g, i, cut, k, head), c in zip(members, conts):
                probes.append(Probe(i, g, _merge(trajs[i], cut, self.spec.prompts[k], self._prompt_ids[k], c),
                                    len(head) - len(self._prompt_ids[k]), list(self._prompt_ids[k])))
        return probes

    @torch.no_grad()
    def _score_prompts(self, model, trajs: list[Trajectory], probes: list[Probe]) -> None:
        """pi_old of each probe's prompt tokens: the policy (in the dtype the loss sees it) over the prompt, the
        completion before the probe's prompt and the prompt."""
        if not probes:
            return
        device = next(model.parameters()).device
        for p in probes:
            t = p.trajectory
            ids = t.prompt_ids + t.completion_ids[:p.start + len(p.prompt_ids)]
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
            first = len(t.prompt_ids) + p.start
            logps = torch.log_softmax(logits[first - 1:first - 1 + len(p.prompt_ids)], dim=-1)
            p.prompt_logps = logps.gather(1, torch.tensor(p.prompt_ids, device=device)[:, None])[:, 0].tolist()

    def _terms(self, trajs: list[Trajectory], kept: dict[int, Probe], alpha: float,
               error_rate: float) -> tuple[list[list[float]], list[list[float]]]:
        """Per token, ``a`` and ``b`` of the behaviour distribution ``q = a pi_old + b = (1 - alpha) pi_old + alpha
        mu`` (module docstring)."""
        scale, floor = [], []
        for i, t in enumerate(trajs):
            n = len(t.completion_ids)
            p = kept.get(i)
            if p is None:
                scale.append([1.0 - alpha] * n)
                floor.append([0.0] * n)
                continue
            j, m = p.start, len(p.prompt_ids)
            before = (1.0 - alpha) + alpha * error_rate ** (-1.0 / j) if j else 1.0
            freqs = [self._tree.frequency(p.prompt_ids[:k], p.prompt_ids[k]) for k in range(m)]
            scale.append([before] * j + [1.0 - alpha] * m + [1.0] * (n - j - m))
            floor.append([0.0] * j + [alpha * f for f in freqs] + [0.0] * (n - j - m))
        return scale, floor

    def _weights(self, trajs: list[Trajectory], step: ExplorationStep, kept: dict[int, Probe]) -> dict:
        """The importance weights pi_old / q of the call's model tokens (what the loss multiplies a token's ratio
        by at the first update), with pi_old of the prompt tokens as scored here: their mean over every model
        token and over the probes' model tokens."""
        if step.scale is None:
            return {"importance_weight_mean": 1.0, "probe_weight_mean": None}
        every, probe = [], []
        for i, t in enumerate(trajs):
            p = kept.get(i)
            pi = {p.start + k: math.exp(lp) for k, lp in enumerate(p.prompt_logps)} if p else {}
            for k, m in enumerate(t.mask):
                if not m:
                    continue
                a, b = step.scale[i][k], step.floor[i][k]
                w = 1.0 / a if b == 0.0 else pi.get(k, 0.0) / (a * pi.get(k, 0.0) + b)
                every.append(w)
                if p is not None:
                    probe.append(w)
        return {"importance_weight_mean": sum(every) / len(every) if every else 1.0,
                "probe_weight_mean": sum(probe) / len(probe) if probe else None}


def _merge(t: Trajectory, cut: _Cut, prompt: str, prompt_ids: list[int], c: Trajectory) -> Trajectory:
    """The probe as one trajectory: the sample up to its answer turn, the turn without its action, the prompt
    (model tokens), then the continuation."""
    p = Trajectory(t.question, list(t.prompt_ids))
    p.completion_ids = t.completion_ids[:cut.base] + cut.ids + list(prompt_ids) + c.completion_ids
    p.mask = t.mask[:cut.base] + [1] * (len(cut.ids) + len(prompt_ids)) + c.mask
    p.logprobs = t.logprobs[:cut.base] + cut.logprobs + [0.0] * len(prompt_ids) + c.logprobs
    p.steps = t.steps[:-1] + ([{"kind": "model", "text": cut.text}] if cut.text else []) + \
        [{"kind": "probe", "text": prompt}] + [s for s in c.steps if s.get("kind") != "prefix"]
    p.queries, p.doc_ids = t.queries + c.queries, t.doc_ids + c.doc_ids
    p.rounds = t.rounds[:-1] + c.rounds
    p.answer, p.answer_mode, p.finish, p.final_answer = c.answer, c.answer_mode, c.finish, c.answer
    p.issues = t.issues + ["probe"] + c.issues
    p.search_errors = t.search_errors + c.search_errors
    p.seconds, p.retrieval_seconds = t.seconds + c.seconds, t.retrieval_seconds + c.retrieval_seconds
    return p


class ExplorationGRPOTrainer(TrimmedGRPOTrainer):
    """``GRPOTrainer`` (micro-batches trimmed of padding) with REX-RAG's policy correction: where the rollout
    returned the behaviour distribution's terms (:data:`SCALE`, :data:`FLOOR`), every token's old log-prob becomes
    ``log(a x pi_old + b)``, the mixture's, so TRL's clipped ratio is ``pi_theta / ((1 - alpha) pi_old + alpha mu)``
    as in upstream's ``update_policy``. ``pi_old`` is TRL's own old log-prob when it computes one, else one forward
    pass of the policy here (TRL skips it when the batch is used on-policy). The mean weight ``pi_old / q`` of the
    batch's loss tokens is logged as ``exploration/importance_weight``."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        scale = [x.get(SCALE) for x in inputs]
        if all(s is None for s in scale):
            return output
        floor = [x.get(FLOOR) for x in inputs]
        completion_ids = output["completion_ids"]
        rows, width = completion_ids.shape
        a = torch.ones(rows, width, dtype=torch.float32)
        b = torch.zeros(rows, width, dtype=torch.float32)
        for i, (sa, sb) in enumerate(zip(scale, floor)):
            if sa is not None:
                k = min(width, len(sa))
                a[i, :k], b[i, :k] = torch.tensor(sa[:k]), torch.tensor(sb[:k])
        old = output.get("old_per_token_logps")
        if old is None:
            mode = "train" if self.model.training else "eval"
            with torch.no_grad():
                old, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([output["prompt_ids"], completion_ids], dim=1),
                    torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1), width,
                    batch_size=self.args.per_device_train_batch_size if mode == "train"
                    else self.args.per_device_eval_batch_size)
        a, b = a.to(old.device), b.to(old.device)
        mixture = torch.log(old.float().exp() * a + b)
        output["old_per_token_logps"] = mixture.to(old.dtype)
        mask = output["completion_mask"] * output.get("tool_mask", torch.ones_like(output["completion_mask"]))
        weights = (old.float() - mixture).exp()
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["exploration/importance_weight"].append(
            ((weights * mask).sum() / mask.sum().clamp(min=1)).item())
        return output


def trainer_class(rollout_func) -> type[TrimmedGRPOTrainer]:
    """The trainer a rollout function needs: with an explorer, :class:`ExplorationGRPOTrainer`, else TRL's
    ``GRPOTrainer`` with its micro-batches trimmed of padding."""
    return ExplorationGRPOTrainer if getattr(rollout_func, "explorer", None) is not None else TrimmedGRPOTrainer
