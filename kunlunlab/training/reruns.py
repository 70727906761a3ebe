"""Kept training results rerun by name: one config file per record, nanoGPT-style.

Every training record kept in ``experiments/results/<record>/`` has ``experiments/configs/runs/<name>.json``
(``name``: the record's path with ``/`` as ``.``, e.g. ``budget_192.flat_w05``). The file holds the record's
whole ``TrainConfig`` (``config``), the record folder it reproduces (``record``) and a one-line ``note``. A
run that started from another run's checkpoint names it as ``"model": "run:<name>/<stage>/final"``; the
rerun resolves that to the other run's folder and reruns the other run first when its checkpoint is missing.

    kunlunlab rerun budget_192.flat_w05              # runs/bgfacts_192_2wiki (SFT + DAPO), then runs/budget_192.flat_w05
    kunlunlab rerun budget_192.flat_w05 --dry-run    # the plan as one JSON line, nothing run
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kunlunlab.configs import apply_overrides, leaf_values, read_config_file
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.training.comparison import (Comparison, check_ledgers, read_ledger, recipe_differences,
                                           write_ledger)
from kunlunlab.training.config import PROCESS_ONLY_FIELDS, TrainConfig, config_from_dict
from kunlunlab.training.pipeline import RunFolderConflict, RunState, train

RUN_CONFIGS = PROJECT_ROOT / "experiments" / "configs" / "runs"
RUN_REFERENCE = "run:"  # "model": "run:<name>/<stage>/final"

# Fields added to TrainConfig after records were kept, with the value that reproduces a record trained before
# them (its train_config.json lacks the field); every run config states them, so a new default cannot move a rerun.
ADDED_SINCE_RECORDS = {"summary_share": 0.0, "eval.summary_questions": 0}


class SharedSFTNotReady(RunFolderConflict):
    """An RL variant's source run (whose SFT it shares) has not got as far as the variant needs: one line, exit 2."""


class UnknownRunError(ValueError):
    """A run name with no config file (the message lists the names there are)."""


@dataclass
class RunStep:
    name: str
    run_dir: Path
    config: TrainConfig
    record: str
    note: str
    done: bool          # its training_summary.json exists: a rerun reuses it

    def to_dict(self) -> dict:
        return {"name": self.name, "run_dir": str(self.run_dir), "record": self.record, "model": self.config.model,
                "done": self.done, "note": self.note}


def run_names(directory: Path = RUN_CONFIGS) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def read_run_config(name: str, directory: Path = RUN_CONFIGS) -> dict:
    path = directory / f"{name}.json"
    if not path.is_file():
        raise UnknownRunError(f"no run config {path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path}"
                              f"; known runs: {', '.join(run_names(directory)) or 'none'}")
    data = read_config_file(path, "run config")
    missing = [key for key in ("record", "config") if key not in data]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    return data


def rerun_plan(name: str, runs_root: Path, directory: Path = RUN_CONFIGS) -> list[RunStep]:
    """The runs to make, parents first: ``name`` and, recursively, each run whose checkpoint it starts from
    (already finished ones are in the plan with ``done``)."""
    plan: list[RunStep] = []
    seen: set[str] = set()

    def visit(run: str) -> None:
        if run in seen:
            raise ValueError(f"run config {run}: its model refers back to itself through {sorted(seen)}")
        seen.add(run)
        data = read_run_config(run, directory)
        config = dict(data["config"])
        model = config.get("model")
        if isinstance(model, str) and model.startswith(RUN_REFERENCE):
            parent, _, inside = model[len(RUN_REFERENCE):].partition("/")
            if not any(step.name == parent for step in plan):
                visit(parent)
            config["model"] = str(runs_root / parent / inside)
        run_dir = runs_root / run
        plan.append(RunStep(run, run_dir, config_from_dict(config, f"run config {run}"), data["record"],
                            data.get("note", ""), (run_dir / "training_summary.json").is_file()))

    visit(name)
    return plan


def rerun(name: str, runs_root: Path, smoke_overrides: dict | None = None,
          progress: Callable[[str], None] | None = None, directory: Path = RUN_CONFIGS) -> list[dict]:
    """Makes every unfinished run of :func:`rerun_plan` in order (``smoke_overrides``: the test suite's tiny
    sizes); returns each run's training summary (a finished one's as it was written)."""
    summaries = []
    for step in rerun_plan(name, runs_root, directory):
        if step.done:
            summaries.append(json.loads((step.run_dir / "training_summary.json").read_text()))
            continue
        cfg = step.config
        if smoke_overrides:
            cfg = config_from_dict(apply_overrides(cfg.to_dict(), smoke_overrides), f"run config {step.name}")
        if progress:
            progress(f"[rerun] {step.name} -> {step.run_dir} (record {step.record})")
        summaries.append(train(cfg, step.run_dir, progress=progress))
    return summaries


# The test suite's sizes that a comparison's arms share: SMOKE_OVERRIDES less the agent's own mechanisms (plan
# samples, STIE rounds, RDRA and STIE sizes), which are each recipe's and must not reach a peer's arm.
_RECIPE_KEYS = ("agent.", "mixing.plan_samples", "mixing.stie_feedback_share")


def comparison_smoke_overrides(smoke_overrides: dict) -> dict:
    """The smoke sizes every arm of a comparison takes alike (the rollout budget what their RL steps buy)."""
    shared = {k: v for k, v in smoke_overrides.items() if not k.startswith(_RECIPE_KEYS)}
    dapo = {k.split(".", 1)[1]: v for k, v in shared.items() if k.startswith("dapo.")}
    calls = -(-dapo.get("steps", 1) // dapo.get("updates_per_generation", 1))
    shared["dapo.max_rollouts"] = calls * dapo.get("prompts_per_step", 1) * dapo.get("num_generations", 2)
    return shared


# Config keys that act after SFT only: two arms of one seed equal in every other key share one SFT checkpoint
RL_SIDE = ("dapo.", "rewards.", "eval.", "prl.", "report_to")


def sft_fingerprint(cfg: TrainConfig) -> str:
    """What decides an arm's SFT model: every config value but the RL stage's, its reward's, its evaluation's and
    those that say only how the run uses the machine (which process trains, how often it saves)."""
    values = {k: v for k, v in leaf_values(cfg.to_dict()).items()
              if not k.startswith(RL_SIDE) and k not in PROCESS_ONLY_FIELDS}
    return json.dumps(values, sort_keys=True, default=str)


def run_comparison(comparison: Comparison, runs_root: Path, arms: list[str] | None = None,
                   seeds: list[int] | None = None, overrides: dict | None = None,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Trains (or resumes, or reuses) every arm of ``comparison`` under every seed in ``runs_root/<run name>``,
    then holds the arms of each seed to one another (:func:`~kunlunlab.training.comparison.check_ledgers`).
    ``overrides``: settings every arm takes alike on top of the budget (a device, the smoke sizes of
    :func:`comparison_smoke_overrides`). Arms of one seed whose configs differ only after SFT (a recipe's RL
    variant) share the SFT checkpoint of the comparison's first such arm, also when that arm runs in another
    invocation (``--arms`` lanes side by side): the variant's RL starts from it (its KL reference), its ledger
    takes that SFT's samples and its after-SFT evaluation is that one's. A variant whose source is not in this
    invocation waits for nothing: it refuses (:class:`SharedSFTNotReady`, one line) until the source's SFT has
    finished, and takes the source's after-SFT evaluation once that is complete. Returns ``{"runs": {run name:
    training summary}, "problems": {seed: [...]}, "overridden": {arm: [...]}, "sft_from": {run: run},
    "differences": ...}`` and writes it to ``runs_root/<comparison>.fairness.json``."""
    runs = comparison.runs(arms, seeds)
    selected = {run.name for run in runs}
    summaries, overridden, sft_from = {}, {}, {}
    configs = {run.name: _with_overrides(run, comparison, overrides) for run in comparison.runs(None, seeds)}
    first_sft = _sft_sources(configs)
    for run in runs:
        cfg = configs[run.name]
        run_dir = runs_root / run.name
        overridden[run.arm] = run.overridden
        source = first_sft.get(sft_fingerprint(cfg), run.name) if cfg.sft.enabled else run.name
        if source != run.name and source not in selected and not RunState(runs_root / source).get("sft_done"):
            raise SharedSFTNotReady(f"arm {run.arm} trains from the SFT of {source}, which has not finished its SFT "
                                    f"in {runs_root}: run its arm first (or in the same command)")
        if source != run.name:
            sft_from[run.name] = source
            cfg = config_from_dict(apply_overrides(cfg.to_dict(), {
                "model": str((runs_root / source / "sft" / "final").resolve()), "sft.enabled": False}))
        if (run_dir / "training_summary.json").is_file():
            summaries[run.name] = json.loads((run_dir / "training_summary.json").read_text())
        else:
            if progress:
                progress(f"[comparison] {run.name} -> {run_dir} (recipe {run.recipe}"
                         + (f", SFT of {source})" if source != run.name else ")"))
            summaries[run.name] = train(cfg, run_dir, progress=progress)
        if source != run.name and read_ledger(run_dir).get("sft_from") != source:
            _take_sft(runs_root / source, run_dir)
    problems = {}
    for seed in sorted({run.seed for run in runs}):
        ledgers = {run.arm: read_ledger(runs_root / run.name) for run in runs if run.seed == seed}
        problems[str(seed)] = check_ledgers(ledgers)
    result = {"comparison": comparison.name, "runs": summaries, "problems": problems, "overridden": overridden,
              "sft_from": sft_from, "differences": recipe_differences(runs)}
    runs_root.mkdir(parents=True, exist_ok=True)
    (runs_root / f"{comparison.name}.fairness.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def _with_overrides(run, comparison: Comparison, overrides: dict | None) -> TrainConfig:
    if not overrides:
        return run.config
    return config_from_dict(apply_overrides(run.config.to_dict(), dict(overrides)),
                            f"comparison {comparison.name} arm {run.arm}")


def _sft_sources(configs: dict[str, TrainConfig]) -> dict[str, str]:
    """SFT fingerprint -> the run that trains it: of the comparison's runs (``configs``, in the comparison's own
    order, whatever ``--arms`` selects), the first whose SFT-side config is that one."""
    sources = {}
    for name, cfg in configs.items():
        if cfg.sft.enabled:
            sources.setdefault(sft_fingerprint(cfg), name)
    return sources


def _take_sft(source: Path, run_dir: Path) -> None:
    """A variant's record of the SFT it started from: that run's SFT samples in its ledger, its after-SFT
    evaluation records beside the variant's own after RL. The source's after-SFT evaluation must be complete
    (its ``state.json`` says so), else the variant would keep a part of it."""
    if RunState(source).get("eval_sft") is None:
        raise SharedSFTNotReady(f"{source.name} has not finished its after-SFT evaluation, which {run_dir.name} "
                                "shares: rerun this command once it has (the trained variant is reused)")
    ledger, theirs = read_ledger(run_dir), read_ledger(source)
    ledger.update(sft_samples=theirs["sft_samples"], sft_from=source.name)
    write_ledger(run_dir, ledger)
    for records in source.glob("eval_sft_*.jsonl*"):
        shutil.copyfile(records, run_dir / records.name)
