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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kunlunlab.configs import apply_overrides, read_config_file
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.training.config import TrainConfig, config_from_dict
from kunlunlab.training.pipeline import train

RUN_CONFIGS = PROJECT_ROOT / "experiments" / "configs" / "runs"
RUN_REFERENCE = "run:"  # "model": "run:<name>/<stage>/final"
# Fields added to TrainConfig after records were kept, with the value that reproduces a record trained before
# them (its train_config.json lacks the field); every run config states them, so a new default cannot move a rerun.
ADDED_SINCE_RECORDS = {"summary_share": 0.0, "eval.summary_questions": 0}


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
