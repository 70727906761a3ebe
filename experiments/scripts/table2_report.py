"""Table 2 from a comparison's runs (issue 51; docs/results.md, "Table 2 against the peers"): every arm of
``experiments/configs/comparisons/<comparison>.json`` after SFT and after RL over its seeds
(``<runs>/<comparison>.<arm>.s<seed>/eval_{sft,after}_{world,hotpot}.jsonl``), with RL's own effect and each arm
against kunlun paired over (seed, question), the answer-tag share (a collapsed row is compared with nothing), the
cost columns, the fairness check of the arms' ledgers, the clip ratios of every RL step and what REX-RAG's probing
and UR2's curriculum did; then the prompt baselines on the untrained backbone, where
``<runs>/<comparison>.suite/records`` holds them (experiments/scripts/table2_baselines.py). Prints the tables as markdown, then one JSON line.

    python experiments/scripts/table2_report.py runs [table2]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kunlunlab.eval.arms import arm_table, pairwise_table
from kunlunlab.eval.compare import table2
from kunlunlab.paths import jsonl_path, read_jsonl
from kunlunlab.runner import markdown_table
from kunlunlab.training.comparison import check_ledgers, load_comparison, read_ledger
from kunlunlab.training.records import recipe_mechanisms, training_logs

FILES = {"world": "world", "hotpotqa_distractor": "hotpot"}  # dataset -> the records' file part
STAGE_FILES = {"sft": "eval_sft_{}.jsonl", "rl": "eval_after_{}.jsonl"}
BASELINES = ("naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1")
REFERENCE = "kunlun"


def _records(folder: Path, name: str) -> list[dict] | None:
    path = jsonl_path(folder / name)
    return read_jsonl(path) if path.is_file() else None


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        raise SystemExit("usage: table2_report.py RUNS_FOLDER [COMPARISON]")
    root = Path(argv[0])
    comparison = load_comparison(argv[1] if len(argv) == 2 else "table2")
    runs = [r for r in comparison.runs() if (root / r.name).is_dir()]
    if not runs:
        raise SystemExit(f"table2_report.py: no run of comparison {comparison.name} in {root}")
    out: dict = {"comparison": comparison.name, "budget": comparison.budget}
    print(f"Budget ({comparison.name}, every arm): " + ", ".join(f"{k} {v}" for k, v in comparison.budget.items()))
    for dataset, part in FILES.items():
        records: dict[str, dict[int, dict[str, list[dict]]]] = {}
        for run in runs:
            for stage, pattern in STAGE_FILES.items():
                found = _records(root / run.name, pattern.format(part))
                if found is not None:
                    records.setdefault(run.arm, {}).setdefault(run.seed, {})[stage] = found
        if not records:
            continue
        header, rows, numbers = arm_table(records, REFERENCE)
        print(f"\n## Table 2, trained arms ({dataset}; EM %, mean over seeds with their range)\n")
        print("\n".join(markdown_table(header, rows)))
        out[f"arms {dataset}"] = {"header": header, "rows": rows, "numbers": numbers}
        header, rows, numbers = pairwise_table(records, REFERENCE)
        print(f"\n## Every arm against every other after RL ({dataset}; row − column, EM %, paired over seed and "
              "question)\n")
        print("\n".join(markdown_table(header, rows)))
        out[f"pairs {dataset}"] = {"header": header, "rows": rows, "numbers": numbers}
    fairness = {}
    for seed in comparison.seeds:
        ledgers = {r.arm: read_ledger(root / r.name) for r in runs
                   if r.seed == seed and (root / r.name / "budget_ledger.json").is_file()}
        fairness[seed] = {"arms": sorted(ledgers), "problems": check_ledgers(ledgers)}
    out["fairness"] = fairness
    print("\n## Fairness check (same SFT samples, RL prompts and rollout budget per seed)\n")
    for seed, seen in fairness.items():
        if len(seen["arms"]) < 2:
            verdict = f"{len(seen['arms'])} finished arm(s): nothing to compare yet"
        else:
            verdict = (f"the {len(seen['arms'])} arms ({', '.join(seen['arms'])}) ran alike" if not seen["problems"]
                       else "; ".join(seen["problems"]))
        print(f"- seed {seed}: {verdict}")
    clip = {}
    for run in runs:
        steps = [row for row in training_logs(root / run.name).get("dapo", []) if "loss" in row]
        clip[run.name] = [{k: row.get(k) for k in ("step", "clip_ratio/high_mean", "clip_ratio/low_mean",
                                                   "clip_ratio/region_mean")} for row in steps]
    out["clip_ratio"] = clip
    mechanisms = {run.name: seen for run in runs if (seen := recipe_mechanisms(root / run.name))}
    out["mechanisms"] = mechanisms
    if mechanisms:
        print("\n## The recipes' own mechanisms (REX-RAG's probing per RL step, UR2's retrieval offered per stage)\n")
        for name, seen in mechanisms.items():
            print(f"- {name}: {json.dumps(seen)}")
    suite = root / f"{comparison.name}.suite" / "records"
    reference = next((r for r in runs if r.arm == REFERENCE and r.seed == comparison.seeds[0]), None)
    if suite.is_dir() and reference is not None:
        per_method = {}
        for method in BASELINES:
            path = jsonl_path(suite / f"world.{method}.jsonl")
            if path.is_file():
                per_method[method] = read_jsonl(path)
        kunlun = _records(root / reference.name, STAGE_FILES["rl"].format("world"))
        if per_method and kunlun:
            per_method[REFERENCE] = kunlun
            header, rows = table2({"world": per_method}, REFERENCE, list(per_method)[:-1], n_resamples=10_000)
            print(f"\n## Prompt baselines on the untrained backbone against {reference.name} (world)\n")
            print("\n".join(markdown_table(header, rows)))
            out["baselines"] = {"header": header, "rows": rows}
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
