"""Keeps finished training runs' records under experiments/results (experiments/results/README.md): what
``compare-runs``, ``table2_report.py`` and notebook 08 read from a run folder, copied unchanged except that the
per-question trajectories lose their token ids and log-probabilities (text, steps, the mask that counts model
tokens, RDRA and STIE rounds stay), and every ``.jsonl`` is stored as ``.jsonl.gz`` (``gzip -n -9``: the same bytes
for the same records). No weights. An unfinished run (no ``training_summary.json``) is refused in one line. A
suite's folder (``records/`` of ``kunlunlab suite`` or ``table2_baselines.py``, no training) keeps its records and
their ``.config.json`` files the same way. A kept training run also gets its rerun config,
``experiments/configs/runs/<out folder under experiments/results, / as .>.<run name>.json`` (``kunlunlab rerun``):
its whole config, with a start from another kept run's checkpoint written as ``run:<that name>/<stage>/final``.

    python experiments/scripts/keep_runs.py runs experiments/results/table2_budget table2.kunlun.s0 table2.research.s0
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

from kunlunlab.paths import PROJECT_ROOT, read_jsonl
from kunlunlab.training.reruns import RUN_CONFIGS, RUN_REFERENCE

FILES = ("train_config.json", "state.json", "training_summary.json", "budget_ledger.json")
LOGS = ("sft_log.jsonl", "dapo_log.jsonl", "dapo_rollouts.jsonl")
RECORDS = tuple(f"eval_{stage}_{part}.jsonl" for stage in ("before", "sft", "after")
                for part in ("world", "hotpot", "summary"))
DROPPED = ("prompt_ids", "completion_ids", "logprobs")  # what no reader of a kept record uses


def _gzip(lines: list[str], target: Path) -> None:
    with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw,
                                                  mtime=0) as out:
        out.write("".join(lines).encode())


def slim(record: dict) -> dict:
    trajectory = record.get("trajectory")
    if isinstance(trajectory, dict):
        record = {**record, "trajectory": {k: v for k, v in trajectory.items() if k not in DROPPED}}
    return record


def _keep_records(source: Path, target: Path) -> None:
    """``source``'s per-question records, slimmed (:func:`slim`), as ``target`` (a ``.jsonl.gz``)."""
    _gzip([json.dumps(slim(record)) + "\n" for record in read_jsonl(source)], target)


def keep_suite(suite: Path, target: Path) -> list[str]:
    (target / "records").mkdir(parents=True, exist_ok=True)
    kept = []
    for path in sorted((suite / "records").iterdir()):
        name = f"records/{path.name}"
        if path.suffix == ".jsonl":
            _keep_records(path, target / f"{name}.gz")
            kept.append(f"{name}.gz")
        elif path.name.endswith(".config.json"):
            shutil.copyfile(path, target / name)
            kept.append(name)
    return kept


def keep(run: Path, target: Path) -> list[str]:
    if (run / "records").is_dir() and not (run / "train_config.json").is_file():
        return keep_suite(run, target)
    if not (run / "training_summary.json").is_file():
        raise SystemExit(f"keep_runs.py: {run} has not finished (no training_summary.json); nothing kept")
    target.mkdir(parents=True, exist_ok=True)
    kept = []
    for name in FILES:
        if (run / name).is_file():
            shutil.copyfile(run / name, target / name)
            kept.append(name)
    for name in LOGS:
        if (run / name).is_file():
            _gzip((run / name).read_text().splitlines(keepends=True), target / f"{name}.gz")
            kept.append(f"{name}.gz")
    for name in RECORDS:
        if (run / name).is_file():
            _keep_records(run / name, target / f"{name}.gz")
            kept.append(f"{name}.gz")
    return kept


def write_run_config(target: Path, note: str) -> Path | None:
    """The rerun config of a kept run folder ``target`` under experiments/results (None elsewhere)."""
    results = PROJECT_ROOT / "experiments" / "results"
    target = target.resolve()
    if not target.is_relative_to(results) or not (target / "train_config.json").is_file():
        return None
    record = target.relative_to(results)
    prefix = ".".join(record.parent.parts)
    config = json.loads((target / "train_config.json").read_text())
    model = config.get("model")
    if isinstance(model, str) and Path(model).parts[-2:] == ("sft", "final") and \
            (target.parent / Path(model).parts[-3]).is_dir():  # another run of the same kept folder
        config["model"] = f"{RUN_REFERENCE}{prefix}.{Path(model).parts[-3]}/sft/final"
    path = RUN_CONFIGS / f"{prefix}.{record.name}.json"
    path.write_text(json.dumps({"record": f"experiments/results/{record.as_posix()}", "note": note,
                                "config": config}, indent=1) + "\n")
    return path


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        raise SystemExit("usage: keep_runs.py RUNS_FOLDER OUT_FOLDER RUN_NAME [RUN_NAME ...]")
    runs, out = Path(argv[0]), Path(argv[1])
    kept = {name: keep(runs / name, out / name) for name in argv[2:]}
    for name in argv[2:]:
        write_run_config(out / name, f"{name}, kept by keep_runs.py from {runs / name}")
    print(json.dumps({"out": str(out), "kept": kept}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
