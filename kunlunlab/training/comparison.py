"""A comparison of recipes under one budget the harness enforces (Table 2, notebook 08): the budget is stated once,
every arm runs under it, and what each arm actually used is written down and checked.

A comparison file (``experiments/configs/comparisons/<name>.json``) holds

* ``budget``: training-config keys (dotted, as ``--set`` takes them) every arm runs with: the base model, the data
  draw (seeds, question counts, the mixing schedule), SFT's size, RL's prompts, rollouts, steps and learning rate,
  retrieval's top-k, searches and result size, the tokens per turn and per question, and the evaluation's questions.
  Every key of :data:`BUDGET_KEYS` must be stated: a comparison that leaves one to each recipe is refused.
* ``arms``: name -> recipe config (a training config file: the agent method, its reward, its RL algorithm), or
  ``{"recipe": file, "set": {key: value}}`` for a variant of a recipe (e.g. its RL stage under GRPO); a variant
  may not touch a budget key.
* ``seeds``: the run seeds (data order and sampling); every arm runs under every seed.

An arm's config is its recipe with the budget on top. A recipe value the budget replaces is not silent: the arm's
``overridden`` list names it and the run logs it. What differs between arms is then only what their recipes define
(:func:`recipe_differences` lists it for the table's setting). Each run writes ``budget_ledger.json``
(:func:`budget_ledger`): the SFT samples it trained on (source and question, in order), the RL prompts TRL drew at
every rollout call and the rollouts generated (dynamic sampling's refills included); :func:`check_ledgers` holds the
arms of one seed to the same SFT questions, the same RL prompts and the rollout budget.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from kunlunlab.configs import apply_overrides, leaf_values, read_config_file
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.training.config import TrainConfig, config_from_dict

log = logging.getLogger(__name__)

COMPARISONS = PROJECT_ROOT / "experiments" / "configs" / "comparisons"
LEDGER_FILE = "budget_ledger.json"

# What a comparison's budget must state: every key that decides which data an arm sees, how much it trains and
# what it may spend per question. (Recipe keys: agent.method, rewards.*, the RL algorithm's dapo.loss_type, beta,
# epsilon*, temperature, top_p, dynamic_sampling, scale_rewards, and the mixing's mechanisms.)
BUDGET_KEYS = (
    "model", "world_passages", "world_seed", "train_questions", "summary_share", "question_seed", "heldout_seed",
    "hotpot", "hotpot_train_fraction", "index_kind", "embedder", "top_k", "max_searches", "max_result_chars",
    "mixing.epochs", "mixing.turning_epoch", "mixing.samples_per_epoch", "mixing.hq_share_start",
    "mixing.noise_start", "mixing.noise_end", "mixing.hotpot_share", "mixing.first_turn_samples",
    "sft.learning_rate", "sft.batch_size", "sft.max_steps", "sft.max_length", "sft.train_layers",
    "dapo.steps", "dapo.prompts_per_step", "dapo.num_generations", "dapo.updates_per_generation",
    "dapo.max_rollouts", "dapo.learning_rate", "dapo.max_turn_tokens", "dapo.max_total_tokens",
    "eval.world_questions", "eval.hotpot_questions", "eval.summary_questions", "eval.max_turn_tokens",
    "eval.max_total_tokens", "eval.before", "eval.after_sft",
)


@dataclass
class Arm:
    """One arm under one seed: its run name (``<comparison>.<arm>.s<seed>``), config and the recipe values the
    budget replaced (``key: recipe value -> budget value``)."""

    name: str
    arm: str
    seed: int
    recipe: str
    config: TrainConfig
    overridden: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    name: str
    budget: dict
    arms: dict[str, str | dict]
    seeds: list[int]
    note: str = ""

    def resized(self, changes: dict) -> "Comparison":
        """The same comparison with ``changes`` to its budget (every arm's alike; e.g. a notebook's smaller size),
        the rollout budget following the RL steps unless ``changes`` states it."""
        budget = {**self.budget, **changes}
        if "dapo.max_rollouts" not in changes:
            budget = rollout_budget(budget)
        check_budget(budget, f"comparison {self.name} resized")
        return Comparison(self.name, budget, dict(self.arms), list(self.seeds), self.note)

    def runs(self, arms: list[str] | None = None, seeds: list[int] | None = None) -> list[Arm]:
        """Every (arm, seed) run's config, arms in file order, seeds inner."""
        unknown = sorted(set(arms or ()) - set(self.arms))
        if unknown:
            raise ValueError(f"comparison {self.name}: no arm {unknown}; its arms: {', '.join(self.arms)}")
        chosen = [arm for arm in self.arms if arms is None or arm in arms]
        return [arm_config(self, arm, seed) for arm in chosen for seed in (seeds or self.seeds)]


def load_comparison(path: str | Path) -> Comparison:
    """A comparison file (a path, or a name under ``experiments/configs/comparisons``); one error line when it
    leaves a budget key out, states a key no config has, or names no arm."""
    path = Path(path)
    if not path.is_file() and (COMPARISONS / f"{path}.json").is_file():
        path = COMPARISONS / f"{path}.json"
    data = read_config_file(path, "comparison")
    if not data.get("arms"):
        raise ValueError(f"{path}: no arms")
    seeds = data.get("seeds") or [0]
    comparison = Comparison(data.get("name") or path.stem, dict(data.get("budget") or {}), dict(data["arms"]),
                            [int(s) for s in seeds], data.get("_comment", ""))
    check_budget(comparison.budget, str(path))
    return comparison


def check_budget(budget: dict, where: str) -> None:
    """One error line where ``budget`` leaves a key of :data:`BUDGET_KEYS` out, holds a bad value, or gives a
    rollout budget other than what its RL steps buy."""
    missing = [k for k in BUDGET_KEYS if k not in budget]
    if missing:
        raise ValueError(f"{where}: the budget must state {', '.join(missing)} (every arm runs with the same value)")
    rl = config_from_dict(apply_overrides({}, dict(budget)), f"{where} budget").dapo  # a bad key: one line
    calls = -(-rl.steps // rl.updates_per_generation)
    if rl.max_rollouts != calls * rl.prompts_per_step * rl.num_generations:
        raise ValueError(f"{where}: dapo.max_rollouts must be what dapo.steps buys ({calls} rollout calls of "
                         f"{rl.prompts_per_step} x {rl.num_generations} = "
                         f"{calls * rl.prompts_per_step * rl.num_generations}), got {rl.max_rollouts}")


def rollout_budget(budget: dict) -> dict:
    """``budget`` with ``dapo.max_rollouts`` set to what its RL steps buy (for a budget resized as a whole)."""
    rl = config_from_dict(apply_overrides({}, {k: v for k, v in budget.items() if k != "dapo.max_rollouts"})).dapo
    calls = -(-rl.steps // rl.updates_per_generation)
    return {**budget, "dapo.max_rollouts": calls * rl.prompts_per_step * rl.num_generations}


def arm_config(comparison: Comparison, arm: str, seed: int) -> Arm:
    """The arm's recipe with the comparison's budget and ``seed`` on top; the recipe values replaced are listed."""
    spec = comparison.arms[arm]
    recipe_path, variant = (spec, {}) if isinstance(spec, str) else (spec["recipe"], dict(spec.get("set") or {}))
    clash = sorted(set(variant) & set(BUDGET_KEYS))
    if clash:
        raise ValueError(f"comparison {comparison.name} arm {arm}: its 'set' changes budget keys {clash}; the budget "
                         "is every arm's")
    recipe = apply_overrides(read_config_file(_resolve(recipe_path), f"recipe of arm {arm}"), variant)
    stated = leaf_values(recipe)
    overridden = [f"{k}: {stated[k]!r} -> {v!r}" for k, v in comparison.budget.items()
                  if k in stated and stated[k] != v]
    config = config_from_dict(apply_overrides(recipe, {**comparison.budget, "seed": seed}),
                              f"{comparison.name} arm {arm}")
    if overridden:
        log.info("%s arm %s: the budget replaces the recipe's %s", comparison.name, arm, "; ".join(overridden))
    return Arm(f"{comparison.name}.{arm}.s{seed}", arm, seed, recipe_path, config, overridden)


def recipe_differences(arms: list[Arm]) -> dict[str, dict[str, object]]:
    """The config values that differ between the arms (key -> arm -> value): what their recipes define, for the
    table's setting line. Budget keys never appear (every arm has the budget's value)."""
    values = {a.arm: leaf_values(a.config.to_dict()) for a in arms}
    keys = sorted(set().union(*values.values())) if values else []
    return {k: {arm: v.get(k) for arm, v in values.items()} for k in keys
            if k != "seed" and len({json.dumps(v.get(k), sort_keys=True) for v in values.values()}) > 1}


def budget_ledger(cfg: TrainConfig, trajectories: list | None, rollout_log: Path | None) -> dict:
    """What a run used of its budget: its SFT samples (trajectories, not plan samples: source, question, first
    turn only or whole), in training order; its RL rollout calls (the prompts TRL drew, the rollouts generated,
    refills included, and the closed-book answers a retrieval curriculum's difficulty estimate generated, outside the
    rollout budget: :mod:`kunlunlab.training.curriculum` says why); and the per-question limits its rollouts ran
    under."""
    samples = [[t.source, t.question, t.partial] for t in trajectories or () if t.kind == "trajectory"]
    by_step = {}  # a step rolled out again after a resume: its last record counts
    if rollout_log is not None and rollout_log.is_file():
        for line in rollout_log.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by_step[row["step"]] = {"step": row["step"], "prompts": row.get("prompts"),
                                        "generated": row.get("generated", row["rollouts"]),
                                        "difficulty_generated": row.get("difficulty_generated", 0)}
    calls = [by_step[step] for step in sorted(by_step)]
    return {"sft_samples": samples, "rl_calls": calls, "rl_generated": sum(c["generated"] for c in calls),
            "rl_difficulty_generated": sum(c["difficulty_generated"] for c in calls),
            "limits": {"top_k": cfg.passages_per_search, "max_searches": cfg.search_limit(cfg.dapo.max_total_tokens),
                       "max_turn_tokens": cfg.dapo.max_turn_tokens, "max_total_tokens": cfg.dapo.max_total_tokens,
                       "max_rollouts": cfg.dapo.max_rollouts, "rollouts_per_call":
                       cfg.dapo.prompts_per_step * cfg.dapo.num_generations}}


def write_ledger(run_dir: Path, ledger: dict) -> None:
    (Path(run_dir) / LEDGER_FILE).write_text(json.dumps(ledger, indent=1))


def read_ledger(run_dir: str | Path) -> dict:
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no {LEDGER_FILE} (the run has not finished)")
    return json.loads(path.read_text())


def check_ledgers(ledgers: dict[str, dict]) -> list[str]:
    """Every way the arms of one seed (arm -> its ledger) did not run alike; empty when they did. Alike: the same
    SFT samples in the same order, the same per-question limits, the same RL prompts at every rollout call both
    made, at most the budget's rollouts each, and no arm leaving unused a budget that would pay for another call."""
    problems: list[str] = []
    if len(ledgers) < 2:
        return problems
    (first, reference), *others = ledgers.items()
    for arm, ledger in others:
        if ledger["sft_samples"] != reference["sft_samples"]:
            a, b = ledger["sft_samples"], reference["sft_samples"]
            where = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"{arm} trained on other SFT samples than {first} ({len(a)} vs {len(b)}; first "
                            f"difference at sample {where})")
        if ledger["limits"] != reference["limits"]:
            problems.append(f"{arm} ran under other limits than {first}: {ledger['limits']} vs {reference['limits']}")
        for call, (mine, theirs) in enumerate(zip(ledger["rl_calls"], reference["rl_calls"])):
            if mine["prompts"] != theirs["prompts"]:
                problems.append(f"{arm} drew other RL prompts than {first} at rollout call {call}")
                break
    for arm, ledger in ledgers.items():
        limits = ledger["limits"]
        budget, per_call = limits["max_rollouts"], limits["rollouts_per_call"]
        if budget is not None and ledger["rl_generated"] > budget:
            problems.append(f"{arm} generated {ledger['rl_generated']} rollouts, over the budget's {budget}")
        if budget is not None and ledger["rl_calls"] and budget - ledger["rl_generated"] >= per_call:
            problems.append(f"{arm} stopped with {budget - ledger['rl_generated']} of {budget} rollouts unused "
                            f"(a call costs {per_call})")
    return problems


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() or p.is_file() else PROJECT_ROOT / p


__all__ = ["Arm", "BUDGET_KEYS", "COMPARISONS", "Comparison", "LEDGER_FILE", "arm_config", "budget_ledger",
           "check_budget", "check_ledgers", "load_comparison", "read_ledger", "recipe_differences", "rollout_budget",
           "write_ledger"]
